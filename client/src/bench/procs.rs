//! Processes of `alloc-bench` and what it reads about them from `/proc` and HTTP.
//!
//! Every child is registered in [`Procs`], which kills and reaps all of them when dropped — on a
//! normal return and on a panic that unwinds through `main`. Children are also started with
//! `PR_SET_PDEATHSIG = SIGKILL`, so a benchmark killed with SIGKILL takes them along. The
//! parent-death signal fires when the *thread* that forked exits, so children must be spawned from
//! the main thread (the `block_on` future), never from a spawned task.
//!
//! Deliberately left out: restarting children; a child that dies makes the benchmark fail.

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// Owns every child process; kills them all when dropped.
#[derive(Default)]
pub struct Procs {
    children: Vec<(String, Child)>,
}

impl Procs {
    /// Starts `cmd` as a child named `name`; returns its pid.
    pub fn spawn(&mut self, name: &str, mut cmd: Command) -> std::io::Result<u32> {
        // SAFETY: the closure runs in the forked child before exec and only makes one syscall.
        unsafe {
            cmd.pre_exec(|| {
                nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL).map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn()?;
        let pid = child.id();
        self.children.push((name.to_string(), child));
        Ok(pid)
    }

    /// Names of children that have exited already (a crash in the middle of a measurement).
    pub fn exited(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        for (name, child) in &mut self.children {
            if !matches!(child.try_wait(), Ok(None)) {
                out.push(name.clone());
            }
        }
        out
    }

    /// Kills and reaps the child named `name`, if it is ours.
    pub fn kill(&mut self, name: &str) {
        if let Some(i) = self.children.iter().position(|(n, _)| n == name) {
            let (_, mut c) = self.children.remove(i);
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A free loopback port, as `127.0.0.1:PORT`.
pub fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").to_string()
}

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

/// Waits until `addr` accepts TCP connections, at most `limit`.
pub async fn wait_listening(addr: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    false
}
