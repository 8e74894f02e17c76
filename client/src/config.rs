//! Client configuration: where to start and how long to try.
//!
//! Every call is bounded twice: by `deadline` overall and by `attempt_timeout` per RPC, and the retry
//! loop by `max_attempts`. Validation happens once, in [`ClientConfig::validate`], so the call paths
//! never have to second-guess a value.

use std::time::Duration;

use crate::error::{ClientError, FailureKind};

/// How a [`crate::Client`] finds the cluster and how hard it tries.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// AllocSvr data-plane addresses (`host:port`) used to learn the route table and as a fallback
    /// target while a uid's section has no known owner.
    pub seeds: Vec<String>,
    /// Upper bound on one call, retries and backoff included.
    pub deadline: Duration,
    /// Upper bound on one RPC; also sent to the server as the gRPC timeout.
    pub attempt_timeout: Duration,
    /// First backoff delay after NOT_READY or an unreachable server; doubled per retry.
    pub backoff_base: Duration,
    /// Largest backoff delay, before jitter.
    pub backoff_max: Duration,
    /// Upper bound on RPC rounds per call, whatever the deadline says.
    pub max_attempts: u32,
    /// TCP connect timeout of each channel. Keep it below `attempt_timeout`: a connection that fails
    /// to open within it is reported as "never sent" (a failure), while an attempt that runs out of
    /// time first is an unknown outcome.
    pub connect_timeout: Duration,
    /// Mutual TLS to every AllocSvr (a `client` or `admin` certificate); plaintext when unset.
    pub tls: Option<std::sync::Arc<seqsvr_auth::Tls>>,
}

impl Default for ClientConfig {
    fn default() -> Self {
        Self {
            seeds: Vec::new(),
            deadline: Duration::from_secs(5),
            attempt_timeout: Duration::from_secs(1),
            backoff_base: Duration::from_millis(10),
            backoff_max: Duration::from_millis(500),
            max_attempts: 64,
            connect_timeout: Duration::from_millis(500),
            tls: None,
        }
    }
}

impl ClientConfig {
    /// Defaults with the given seeds.
    pub fn new<S: Into<String>>(seeds: impl IntoIterator<Item = S>) -> Self {
        Self {
            seeds: seeds.into_iter().map(Into::into).collect(),
            ..Self::default()
        }
    }

    /// Refuses configurations that would make every call fail or never end.
    pub fn validate(&self) -> Result<(), ClientError> {
        let bad = |msg: String| Err(ClientError::failed(FailureKind::BadConfig, msg));
        if self.seeds.is_empty() {
            return bad("no seed addresses".into());
        }
        if let Some(s) = self.seeds.iter().find(|s| s.trim().is_empty() || s.contains('/')) {
            return bad(format!("seed {s:?} is not host:port"));
        }
        if self.deadline.is_zero() || self.attempt_timeout.is_zero() || self.connect_timeout.is_zero() {
            return bad("deadline, attempt_timeout and connect_timeout must be positive".into());
        }
        if self.backoff_base.is_zero() || self.backoff_base > self.backoff_max {
            return bad("backoff_base must be positive and at most backoff_max".into());
        }
        if self.max_attempts == 0 || self.max_attempts > 10_000 {
            return bad("max_attempts must be in 1..=10000".into());
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_with_a_seed_are_valid_and_bad_values_are_refused() {
        assert!(ClientConfig::new(["127.0.0.1:1"]).validate().is_ok());
        let ok = ClientConfig::new(["127.0.0.1:1"]);
        let cases: Vec<(ClientConfig, &str)> = vec![
            (ClientConfig::default(), "no seeds"),
            (ClientConfig::new([""]), "empty seed"),
            (ClientConfig::new(["http://a:1"]), "scheme in seed"),
            (
                ClientConfig {
                    deadline: Duration::ZERO,
                    ..ok.clone()
                },
                "zero deadline",
            ),
            (
                ClientConfig {
                    attempt_timeout: Duration::ZERO,
                    ..ok.clone()
                },
                "zero attempt",
            ),
            (
                ClientConfig {
                    backoff_base: Duration::from_secs(1),
                    ..ok.clone()
                },
                "base > max",
            ),
            (
                ClientConfig {
                    max_attempts: 0,
                    ..ok.clone()
                },
                "zero attempts",
            ),
        ];
        for (cfg, what) in cases {
            let err = cfg.validate().expect_err(what);
            assert_eq!(err.failure_kind(), Some(FailureKind::BadConfig), "{what}");
        }
    }
}
