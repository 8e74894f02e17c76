//! The one process supervisor of the simulator, the benchmarks and the end-to-end tests: start,
//! SIGKILL, SIGSTOP/SIGCONT, SIGTERM with a grace, wait for an exit, of real server processes, each
//! with its own log file, and nothing left running afterwards.
//!
//! Every process is killed when the [`Supervisor`] is dropped (normal end, error, panic unwinding,
//! Ctrl-C dropping the run). A stopped process is sent SIGCONT after SIGKILL so that it is reaped
//! at once. As a last resort each child gets `PR_SET_PDEATHSIG = SIGKILL`, so even a SIGKILL of
//! the owner leaves no orphans. (That signal fires when the *thread* that spawned the child
//! exits: spawn children from threads that live as long as they should, e.g. the main thread or
//! the runtime's workers.)
//!
//! Deliberately left out: containers, cgroups and remote hosts; everything is on loopback.

pub use nix::sys::signal::Signal;
use nix::sys::signal::kill;
use nix::unistd::Pid;
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

/// Finds a server binary: `--bin-dir` if given, else next to the running executable, else
/// `target/release` then `target/debug` under the current directory.
pub fn find_binary(name: &str, bin_dir: Option<&Path>) -> io::Result<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(d) = bin_dir {
        candidates.push(d.join(name));
    } else {
        if let Ok(exe) = std::env::current_exe()
            && let Some(dir) = exe.parent()
        {
            candidates.push(dir.join(name));
            // `cargo test` puts test executables one level down, in deps/.
            if let Some(up) = dir.parent() {
                candidates.push(up.join(name));
            }
        }
        candidates.push(PathBuf::from("target/release").join(name));
        candidates.push(PathBuf::from("target/debug").join(name));
    }
    candidates.into_iter().find(|p| p.is_file()).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!("binary {name} not found (build it, or pass --bin-dir)"),
        )
    })
}

/// Opens the line written into a log at each start (skipped by the panic scan).
pub const START_MARKER: &str = "=== supervisor: start";

/// How to start one process; kept so that a killed process can be restarted the same way.
#[derive(Clone, Debug)]
pub struct ProcSpec {
    pub name: String,
    pub bin: PathBuf,
    pub args: Vec<String>,
    /// Added to `args` on the first start only (e.g. StoreSvr's `--new-replica`: a restart after a
    /// kill keeps its data dir and must come back as the same replica).
    pub first_args: Vec<String>,
    /// Environment variables set for the process (on top of the inherited ones).
    pub env: Vec<(String, String)>,
    /// Working directory, if not the current one.
    pub cwd: Option<PathBuf>,
}

impl ProcSpec {
    /// A process `name` running `bin args…`.
    pub fn new(
        name: impl Into<String>,
        bin: impl Into<PathBuf>,
        args: impl IntoIterator<Item = impl Into<String>>,
    ) -> Self {
        Self {
            name: name.into(),
            bin: bin.into(),
            args: args.into_iter().map(Into::into).collect(),
            first_args: Vec::new(),
            env: Vec::new(),
            cwd: None,
        }
    }
}

struct Proc {
    spec: ProcSpec,
    child: Option<Child>,
    stopped: bool,
    starts: u32,
    log: PathBuf,
    /// Exits the simulator did not cause (crashes), as exit-status text.
    unexpected: Vec<String>,
}

/// The processes of one run, by name.
pub struct Supervisor {
    procs: BTreeMap<String, Proc>,
    log_dir: PathBuf,
}

/// A line of a process log that shows a panic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PanicLine {
    pub process: String,
    pub line: String,
}

impl Supervisor {
    /// Logs go to `log_dir/NAME.log` (appended across restarts, one marker line per start).
    pub fn new(log_dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(log_dir)?;
        Ok(Self {
            procs: BTreeMap::new(),
            log_dir: log_dir.to_path_buf(),
        })
    }

    /// Registers and starts a process (again, with a new spec, if one of that name has exited or
    /// was killed; a running one is refused).
    pub fn spawn(&mut self, spec: ProcSpec) -> io::Result<u32> {
        let name = spec.name.clone();
        if self.is_running(&name) {
            return Err(io::Error::other(format!("{name} is already running")));
        }
        let starts = self.procs.get(&name).map_or(0, |p| p.starts);
        let log = self.log_dir.join(format!("{name}.log"));
        self.procs.insert(
            name.clone(),
            Proc {
                spec,
                child: None,
                stopped: false,
                starts,
                log,
                unexpected: Vec::new(),
            },
        );
        self.start(&name)
    }

    /// (Re)starts a registered process that is not running. Returns its pid.
    pub fn start(&mut self, name: &str) -> io::Result<u32> {
        let p = self.get_mut(name)?;
        if p.child.is_some() {
            return Err(io::Error::other(format!("{name} is already running")));
        }
        p.starts += 1;
        let mut log = OpenOptions::new().create(true).append(true).open(&p.log)?;
        let mut args = p.spec.args.clone();
        if p.starts == 1 {
            args.extend(p.spec.first_args.iter().cloned());
        }
        writeln!(
            log,
            "{START_MARKER} #{} of {}: {:?} {:?}",
            p.starts, name, p.spec.bin, args
        )?;
        let err = log.try_clone()?;
        let mut cmd = Command::new(&p.spec.bin);
        cmd.args(&args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log))
            .stderr(Stdio::from(err))
            .env("RUST_BACKTRACE", "1")
            .envs(p.spec.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let Some(dir) = &p.spec.cwd {
            cmd.current_dir(dir);
        }
        // SAFETY: `set_pdeathsig` is one async-signal-safe prctl(2) call; nothing else runs
        // between fork and exec.
        unsafe {
            cmd.pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from));
        }
        let child = cmd.spawn()?;
        let pid = child.id();
        p.child = Some(child);
        p.stopped = false;
        tracing::info!(process = name, pid, "started");
        Ok(pid)
    }

    /// SIGKILL and reap. A process that is not running is left alone.
    pub fn kill(&mut self, name: &str) -> io::Result<()> {
        let p = self.get_mut(name)?;
        if let Some(mut child) = p.child.take() {
            signal(&child, Signal::SIGKILL);
            if p.stopped {
                signal(&child, Signal::SIGCONT);
            }
            child.wait()?;
            p.stopped = false;
            tracing::info!(process = name, "killed");
        }
        Ok(())
    }

    /// SIGSTOP: the process freezes with its sockets open (a long GC pause, a VM stall).
    pub fn pause(&mut self, name: &str) -> io::Result<()> {
        let p = self.get_mut(name)?;
        if let Some(child) = &p.child {
            signal(child, Signal::SIGSTOP);
            p.stopped = true;
        }
        Ok(())
    }

    /// SIGCONT after [`Supervisor::pause`].
    pub fn resume(&mut self, name: &str) -> io::Result<()> {
        let p = self.get_mut(name)?;
        if let Some(child) = &p.child {
            signal(child, Signal::SIGCONT);
            p.stopped = false;
        }
        Ok(())
    }

    /// SIGTERM, then wait up to `grace` for a clean exit, then SIGKILL. Returns true when the
    /// process exited by itself within the grace period.
    pub async fn terminate(&mut self, name: &str, grace: Duration) -> io::Result<bool> {
        let deadline = tokio::time::Instant::now() + grace;
        {
            let p = self.get_mut(name)?;
            let Some(child) = &p.child else { return Ok(true) };
            if p.stopped {
                signal(child, Signal::SIGCONT);
                p.stopped = false;
            }
            signal(child, Signal::SIGTERM);
        }
        loop {
            let p = self.get_mut(name)?;
            let Some(child) = p.child.as_mut() else { return Ok(true) };
            if child.try_wait()?.is_some() {
                p.child = None;
                tracing::info!(process = name, "exited after SIGTERM");
                return Ok(true);
            }
            if tokio::time::Instant::now() >= deadline {
                self.kill(name)?;
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The exit status of a process that has exited by itself (and forgets it), without waiting;
    /// `None` while it runs or when it is not started.
    pub fn try_exit(&mut self, name: &str) -> io::Result<Option<ExitStatus>> {
        let p = self.get_mut(name)?;
        let Some(child) = p.child.as_mut() else { return Ok(None) };
        let status = child.try_wait()?;
        if status.is_some() {
            p.child = None;
        }
        Ok(status)
    }

    /// Names of the processes that are running now (stopped ones count).
    pub fn running(&mut self) -> Vec<String> {
        let names: Vec<String> = self.procs.keys().cloned().collect();
        names.into_iter().filter(|n| self.is_running(n)).collect()
    }

    /// Waits up to `within` for the process to exit by itself (after a signal sent by someone else,
    /// or on its own); its exit status, or `None` when it is still running (or was never started).
    pub async fn wait_exit(&mut self, name: &str, within: Duration) -> io::Result<Option<ExitStatus>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.get_mut(name)?.child.is_none() {
                return Ok(None);
            }
            if let Some(status) = self.try_exit(name)? {
                return Ok(Some(status));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends `sig` to a running process (SIGTERM to test a clean shutdown, say).
    pub fn signal(&mut self, name: &str, sig: Signal) -> io::Result<()> {
        let p = self.get_mut(name)?;
        if let Some(child) = &p.child {
            signal(child, sig);
        }
        Ok(())
    }

    /// True when the process was started and has not exited (a stopped process counts). An exit
    /// found here was not caused by the supervisor and is remembered as a crash.
    pub fn is_running(&mut self, name: &str) -> bool {
        let Ok(p) = self.get_mut(name) else { return false };
        let Some(child) = p.child.as_mut() else { return false };
        match child.try_wait() {
            Ok(None) => true,
            Ok(Some(status)) => {
                p.unexpected.push(status.to_string());
                p.child = None;
                false
            }
            Err(e) => {
                p.unexpected.push(format!("wait failed: {e}"));
                p.child = None;
                false
            }
        }
    }

    /// Polls every process and returns (and forgets) the exits the supervisor did not cause.
    pub fn take_unexpected_exits(&mut self) -> Vec<(String, String)> {
        let names: Vec<String> = self.procs.keys().cloned().collect();
        let mut out = Vec::new();
        for n in names {
            self.is_running(&n);
            if let Some(p) = self.procs.get_mut(&n) {
                out.extend(p.unexpected.drain(..).map(|s| (n.clone(), s)));
            }
        }
        out
    }

    pub fn pid(&self, name: &str) -> Option<u32> {
        self.procs.get(name)?.child.as_ref().map(|c| c.id())
    }

    pub fn log_path(&self, name: &str) -> Option<&Path> {
        self.procs.get(name).map(|p| p.log.as_path())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.procs.keys().map(String::as_str)
    }

    /// Lines containing "panicked" in every process log.
    pub fn scan_panics(&self) -> io::Result<Vec<PanicLine>> {
        let mut out = Vec::new();
        for (name, p) in &self.procs {
            let Ok(f) = File::open(&p.log) else { continue };
            for line in BufReader::new(f).lines() {
                let line = line?;
                if line.contains("panicked") && !line.starts_with(START_MARKER) {
                    out.push(PanicLine {
                        process: name.clone(),
                        line,
                    });
                }
            }
        }
        Ok(out)
    }

    /// Kills every process (also the stopped ones). Idempotent.
    pub fn kill_all(&mut self) {
        let names: Vec<String> = self.procs.keys().cloned().collect();
        for n in names {
            if let Err(e) = self.kill(&n) {
                tracing::warn!(process = n, error = %e, "kill failed");
            }
        }
    }

    fn get_mut(&mut self, name: &str) -> io::Result<&mut Proc> {
        self.procs
            .get_mut(name)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no process {name}")))
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.kill_all();
    }
}

fn signal(child: &Child, sig: Signal) {
    // ESRCH (already gone, not yet reaped) is fine: wait() reaps it.
    let _ = kill(Pid::from_raw(child.id() as i32), sig);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sleeper(name: &str) -> ProcSpec {
        ProcSpec {
            name: name.into(),
            bin: "/bin/sh".into(),
            args: vec!["-c".into(), "echo up; exec sleep 60".into()],
            first_args: vec![],
            env: vec![],
            cwd: None,
        }
    }

    fn log_lines_equal(log: &Path, text: &str) -> usize {
        std::fs::read_to_string(log)
            .unwrap()
            .lines()
            .filter(|l| *l == text)
            .count()
    }

    fn alive(pid: u32) -> bool {
        // Signal 0 probes existence; a zombie still exists, so callers reap first.
        kill(Pid::from_raw(pid as i32), None).is_ok()
    }

    fn proc_state(pid: u32) -> Option<char> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        stat.rsplit(')').next()?.trim().chars().next()
    }

    async fn eventually(mut f: impl FnMut() -> bool) -> bool {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline {
            if f() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        false
    }

    #[tokio::test]
    async fn kill_and_restart_appends_to_one_log() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Supervisor::new(dir.path()).unwrap();
        let pid1 = c.spawn(sleeper("a")).unwrap();
        assert!(c.is_running("a"));
        let log = c.log_path("a").unwrap().to_path_buf();
        assert!(eventually(|| log_lines_equal(&log, "up") == 1).await);
        c.kill("a").unwrap();
        assert!(!c.is_running("a"));
        assert!(
            c.take_unexpected_exits().is_empty(),
            "a kill by the supervisor is not a crash"
        );
        assert!(!alive(pid1));
        let pid2 = c.start("a").unwrap();
        assert_ne!(pid1, pid2);
        assert!(eventually(|| log_lines_equal(&log, "up") == 2).await);
        assert_eq!(std::fs::read_to_string(&log).unwrap().matches(START_MARKER).count(), 2);
    }

    #[tokio::test]
    async fn pause_and_resume_change_the_process_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Supervisor::new(dir.path()).unwrap();
        let pid = c.spawn(sleeper("a")).unwrap();
        c.pause("a").unwrap();
        assert!(eventually(|| proc_state(pid) == Some('T')).await, "not stopped");
        c.resume("a").unwrap();
        assert!(eventually(|| proc_state(pid) == Some('S')).await, "not resumed");
    }

    #[tokio::test]
    async fn drop_kills_every_process_including_stopped_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Supervisor::new(dir.path()).unwrap();
        let a = c.spawn(sleeper("a")).unwrap();
        let b = c.spawn(sleeper("b")).unwrap();
        c.pause("b").unwrap();
        drop(c);
        assert!(!alive(a) && !alive(b), "orphans left behind");
    }

    #[tokio::test]
    async fn terminate_waits_for_a_clean_exit_then_kills() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Supervisor::new(dir.path()).unwrap();
        c.spawn(sleeper("polite")).unwrap();
        assert!(c.terminate("polite", Duration::from_secs(5)).await.unwrap());
        let stubborn = ProcSpec {
            name: "stubborn".into(),
            bin: "/bin/sh".into(),
            args: vec![
                "-c".into(),
                "trap '' TERM; echo ready; while true; do sleep 0.05; done".into(),
            ],
            first_args: vec![],
            env: vec![],
            cwd: None,
        };
        let pid = c.spawn(stubborn).unwrap();
        let log = c.log_path("stubborn").unwrap().to_path_buf();
        assert!(eventually(|| log_lines_equal(&log, "ready") == 1).await);
        assert!(!c.terminate("stubborn", Duration::from_millis(200)).await.unwrap());
        assert!(!alive(pid));
    }

    #[tokio::test]
    async fn panics_in_logs_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Supervisor::new(dir.path()).unwrap();
        let spec = ProcSpec {
            name: "p".into(),
            bin: "/bin/sh".into(),
            args: vec!["-c".into(), "echo \"thread 'main' panicked at src/x.rs:1\" >&2".into()],
            first_args: vec![],
            env: vec![],
            cwd: None,
        };
        c.spawn(spec).unwrap();
        assert!(eventually(|| !c.is_running("p")).await);
        let found = c.scan_panics().unwrap();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].process, "p");
        let exits = c.take_unexpected_exits();
        assert_eq!(exits.len(), 1, "{exits:?}");
        assert!(c.take_unexpected_exits().is_empty(), "reported once");
    }

    #[test]
    fn missing_binary_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        assert!(find_binary("no-such-binary", Some(dir.path())).is_err());
        std::fs::write(dir.path().join("x"), b"").unwrap();
        assert_eq!(find_binary("x", Some(dir.path())).unwrap(), dir.path().join("x"));
    }
}
