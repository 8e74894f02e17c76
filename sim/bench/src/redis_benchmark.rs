//! What `front-bench` and `cluster-bench` read from `redis-benchmark --csv`: the `INCR` line's
//! requests per second and p50.
//!
//! Deliberately left out: running the tool (each benchmark has its own targets and timeouts).

/// One `redis-benchmark -t incr` result.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct IncrPoint {
    pub rps: f64,
    pub p50_ms: f64,
}

/// The `INCR` line of `redis-benchmark --csv` output; the error says what was missing.
pub fn incr_point(csv: &str) -> Result<IncrPoint, String> {
    // "INCR","85397.09","0.463","0.104","0.455",...: test, rps, avg, min, p50 (ms).
    let line = csv
        .lines()
        .find(|l| l.starts_with("\"INCR\""))
        .ok_or_else(|| format!("no INCR line from redis-benchmark: {csv}"))?;
    let cols: Vec<f64> = line
        .split(',')
        .skip(1)
        .map(|c| c.trim_matches('"').parse().unwrap_or(f64::NAN))
        .collect();
    match cols.as_slice() {
        [rps, _, _, p50, ..] => Ok(IncrPoint {
            rps: *rps,
            p50_ms: *p50,
        }),
        _ => Err(format!("a short INCR line from redis-benchmark: {line}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_incr_line_gives_rps_and_p50_and_a_short_or_missing_one_is_an_error() {
        let csv = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\"\n\
                   \"INCR\",\"85397.09\",\"0.463\",\"0.104\",\"0.455\",\"0.9\"\n";
        assert_eq!(
            incr_point(csv),
            Ok(IncrPoint {
                rps: 85397.09,
                p50_ms: 0.455
            })
        );
        assert!(incr_point("\"INCR\",\"1\"").unwrap_err().contains("short"));
        assert!(incr_point("nothing").unwrap_err().contains("no INCR line"));
    }
}
