//! An in-memory [`Calls`]: every uid and key its own counter from 0, ids from a counter, and an
//! error or a delay to answer with on demand. It counts every number it hands out, so that a
//! test can check that bad input took nothing.

#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use seqsvr_frontends::calls::{CallError, Calls, Taken, Who};
use seqsvr_proto::id_layout::IdLayout;

#[derive(Default)]
pub struct Fake {
    values: Mutex<HashMap<String, u64>>,
    next_id: AtomicU64,
    /// Numbers handed out, over every uid and key.
    pub taken: AtomicU64,
    /// The answer of every call while set.
    pub fail: Mutex<Option<CallError>>,
    /// How long every call takes.
    pub delay: Mutex<Option<Duration>>,
    /// Calls of `current`, one name each.
    pub current_calls: AtomicU64,
    /// Calls of `current_many`, and the names they asked for in all.
    pub many_calls: AtomicU64,
    pub many_names: AtomicU64,
    /// What `id_decoding` answers: no layout until a test sets one.
    pub decoding: Mutex<Option<(IdLayout, u64)>>,
}

fn name(who: Who<'_>) -> String {
    match who {
        Who::Uid(u) => format!("uid {u}"),
        Who::Key(k) => format!("key {k}"),
    }
}

impl Fake {
    pub fn taken(&self) -> u64 {
        self.taken.load(Ordering::SeqCst)
    }

    /// Sets a counter's last value, as if that many had been taken (`name` as [`name`] writes it).
    pub fn set(&self, name: &str, value: u64) {
        self.values.lock().unwrap().insert(name.to_string(), value);
    }

    pub fn fail_with(&self, e: Option<CallError>) {
        *self.fail.lock().unwrap() = e;
    }

    async fn before(&self) -> Result<(), CallError> {
        let delay = *self.delay.lock().unwrap();
        if let Some(d) = delay {
            tokio::time::sleep(d).await;
        }
        match self.fail.lock().unwrap().clone() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn take_now(&self, who: Who<'_>, count: u32) -> u64 {
        let mut values = self.values.lock().unwrap();
        let v = values.entry(name(who)).or_default();
        let first = *v + 1;
        *v += u64::from(count);
        self.taken.fetch_add(u64::from(count), Ordering::SeqCst);
        first
    }
}

impl Calls for Fake {
    async fn take(&self, who: Who<'_>, count: u32) -> Result<Taken, CallError> {
        self.before().await?;
        Ok(Taken::anonymous(self.take_now(who, count)))
    }

    async fn current(&self, who: Who<'_>) -> Result<Taken, CallError> {
        self.current_calls.fetch_add(1, Ordering::SeqCst);
        self.before().await?;
        let v = self.values.lock().unwrap().get(&name(who)).copied().unwrap_or(0);
        Ok(Taken::anonymous(v))
    }

    async fn current_many(&self, whos: &[Who<'_>]) -> Result<Vec<Result<Taken, CallError>>, CallError> {
        self.many_calls.fetch_add(1, Ordering::SeqCst);
        self.many_names.fetch_add(whos.len() as u64, Ordering::SeqCst);
        self.before().await?;
        let values = self.values.lock().unwrap();
        Ok(whos
            .iter()
            .map(|&w| Ok(Taken::anonymous(values.get(&name(w)).copied().unwrap_or(0))))
            .collect())
    }

    async fn batch(&self, uids: &[u64]) -> Result<Vec<Result<Taken, CallError>>, CallError> {
        self.before().await?;
        Ok(uids
            .iter()
            .map(|&u| Ok(Taken::anonymous(self.take_now(Who::Uid(u), 1))))
            .collect())
    }

    async fn ids(&self, count: u32) -> Result<Vec<u64>, CallError> {
        self.before().await?;
        let first = self.next_id.fetch_add(u64::from(count), Ordering::SeqCst) + 1;
        Ok((first..first + u64::from(count)).collect())
    }

    fn id_decoding(&self) -> Option<(IdLayout, u64)> {
        *self.decoding.lock().unwrap()
    }
}

/// A Redis command as every client sends it: an array of bulk strings.
pub fn resp_command<A: AsRef<[u8]>>(args: &[A]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        let a = a.as_ref();
        out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}
