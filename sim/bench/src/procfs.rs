//! What the benchmarks read about processes and servers: RSS and CPU time from `/proc`, the
//! machine's busy time (to measure foreign load), its cores, CPU model and load average (for the
//! header of a run), and a Prometheus metric over HTTP.
//!
//! Deliberately left out: starting processes (`seqsvr-harness`).

use std::io::{Read, Write};
use std::time::Duration;

/// Resident set size of `pid` in bytes (`VmRSS` of `/proc/PID/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// CPU time (user + system) used so far by `pid`, in seconds; `None` when it is gone.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces; fields after it are space-separated.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of the whole line, 12 and 13 after `state`.
    let ticks: u64 = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // /proc reports clock ticks in USER_HZ, which Linux fixes at 100 for user space.
    Some(ticks as f64 / 100.0)
}

/// CPU time (user + system) of this process's children that have ended and been waited for,
/// in seconds: around one child's run (and no other child ending meanwhile), that child's CPU.
pub fn ended_children_cpu_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // cutime and cstime are fields 16 and 17 of the whole line, 14 and 15 after `state`.
    let ticks: u64 = fields.get(13)?.parse::<u64>().ok()? + fields.get(14)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// CPU time used from a start on by some processes and by this process's children that ended
/// meanwhile (a load tool run to its end), with the wall time: where one load run's CPU went.
pub struct CpuSince {
    pids: Vec<u32>,
    pids_at: Vec<f64>,
    children_at: f64,
    started: std::time::Instant,
}

/// What [`CpuSince::end`] measured, in seconds.
pub struct CpuUsed {
    /// Each process's CPU time, in the order of the pids given.
    pub pids: Vec<f64>,
    /// The ended children's CPU time.
    pub children: f64,
    pub wall: f64,
}

impl CpuSince {
    /// Starts counting for `pids`; an error names a process that is gone.
    pub fn start(pids: &[u32]) -> Result<Self, String> {
        Ok(Self {
            pids: pids.to_vec(),
            pids_at: pids.iter().map(|&pid| cpu_of(pid)).collect::<Result<_, _>>()?,
            children_at: children_cpu()?,
            started: std::time::Instant::now(),
        })
    }

    /// The CPU used since [`Self::start`].
    pub fn end(&self) -> Result<CpuUsed, String> {
        let wall = self.started.elapsed().as_secs_f64();
        let mut pids = Vec::with_capacity(self.pids.len());
        for (&pid, at) in self.pids.iter().zip(&self.pids_at) {
            pids.push(cpu_of(pid)? - at);
        }
        Ok(CpuUsed {
            pids,
            children: children_cpu()? - self.children_at,
            wall,
        })
    }
}

fn cpu_of(pid: u32) -> Result<f64, String> {
    cpu_seconds(pid).ok_or_else(|| format!("no CPU time of pid {pid}"))
}

fn children_cpu() -> Result<f64, String> {
    ended_children_cpu_seconds().ok_or_else(|| "no CPU time of ended children".to_string())
}

/// Busy CPU time of the whole machine so far (every state but idle and iowait), in seconds.
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let cpu = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = cpu.split_whitespace().skip(1).filter_map(|x| x.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is already inside user).
    let busy: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|i| v.get(*i)).sum();
    Some(busy as f64 / 100.0)
}

/// Sum of the samples of `metric` whose labels contain `label` (all when `None`) on a Prometheus
/// endpoint; `None` if unreachable.
pub fn scrape(addr: &str, metric: &str, label: Option<&str>) -> Option<f64> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    if !body.starts_with("HTTP/1.1 200") {
        return None;
    }
    let mut sum = None;
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        if &line[..name_end] != metric || label.is_some_and(|l| !line.contains(l)) {
            continue;
        }
        if let Some(v) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *sum.get_or_insert(0.0) += v;
        }
    }
    // A counter that was never incremented is not exported yet: that is 0, not unreachable.
    Some(sum.unwrap_or(0.0))
}

/// The CPU's model name from `/proc/cpuinfo`, for the machine line the benchmarks print.
pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown cpu".into())
}

/// `N cores (model)`: the machine line's description of this machine.
pub fn machine() -> String {
    format!(
        "{} cores ({})",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        cpu_model()
    )
}

/// The 1, 5 and 15 minute load averages from `/proc/loadavg`: how busy the shared machine was.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}
