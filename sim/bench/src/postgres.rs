//! PostgreSQL as the peer of `ledger-bench`: what applications do today for consecutive invoice
//! numbers, measured on the same machine, in the same run, through the same closed-loop driver
//! ([`crate::load`]) as the ledger.
//!
//! The server comes from the system packages (Debian `postgresql`): `initdb` makes a fresh cluster
//! in the run's temp dir and `postgres` serves it on a loopback port (no Unix socket outside the
//! dir), started through the run's [`Supervisor`] and stopped by its pid. PostgreSQL refuses to run
//! as root, so as root both run as the `postgres` user through `setpriv`, which execs in place: the
//! pid the supervisor holds is the postmaster's own. Durability is PostgreSQL's default, spelled
//! out on the command line: `fsync=on`, `synchronous_commit=on` (a commit is answered after its WAL
//! is flushed), the promise a ledger's committed Raft entry makes.
//!
//! The app pattern is one row per series and one transaction per pair: `BEGIN; UPDATE series SET
//! next = next + 1 WHERE name = $1 RETURNING next; INSERT INTO invoices (series, number, reference)
//! VALUES (…); COMMIT` — the row lock is held from the UPDATE to the COMMIT, so callers of one
//! series queue behind each other's fsync. One connection per caller (a connection runs one
//! transaction at a time), prepared statements.
//!
//! Deliberately left out: tuning (`commit_delay`, `wal_sync_method`, shared buffers): the default
//! is what an application gets; replication (a standby would add a network round trip per commit
//! with `synchronous_standby_names`, which a seqsvr set already pays for its three replicas); and a
//! connection pool in front (one connection per caller is the pool's best case).

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use seqsvr_harness::{ProcSpec, Supervisor};
use tokio::sync::Mutex;
use tokio_postgres::{Client, NoTls, Statement};

use crate::ledgers::Numbers;
use crate::load::{Answer, Pids, Sample, Window, drive};

/// The install line every "not found" message carries.
pub const INSTALL: &str = "apt-get install -y postgresql";
/// The database role the benchmark creates with `initdb` and connects as.
const ROLE: &str = "bench";
/// Longest `initdb` may take.
const INITDB_LIMIT: Duration = Duration::from_secs(120);
/// Longest wait for the server to accept a connection.
const START_LIMIT: Duration = Duration::from_secs(30);
/// Connections the server allows: the most callers (256) and a few for setup and checks.
const MAX_CONNECTIONS: usize = 300;

/// `initdb` and `postgres` of one installed version.
#[derive(Debug, Clone)]
pub struct PgBinaries {
    pub initdb: PathBuf,
    pub postgres: PathBuf,
}

/// The newest `/usr/lib/postgresql/N/bin` that has both binaries, else both on `PATH`; the error
/// names the install line.
pub fn binaries() -> Result<PgBinaries, String> {
    let mut versioned: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| Some((e.file_name().to_str()?.parse().ok()?, e.path().join("bin"))))
        .collect();
    versioned.sort();
    let path_dirs = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default();
    let candidates = versioned.into_iter().rev().map(|(_, d)| d).chain(path_dirs);
    for dir in candidates {
        let (initdb, postgres) = (dir.join("initdb"), dir.join("postgres"));
        if initdb.is_file() && postgres.is_file() {
            return Ok(PgBinaries { initdb, postgres });
        }
    }
    Err(format!(
        "PostgreSQL not found: no initdb and postgres in /usr/lib/postgresql/*/bin or on PATH; install it: {INSTALL}"
    ))
}

/// A running PostgreSQL.
pub struct PgServer {
    /// `host=127.0.0.1 port=… user=bench dbname=postgres`.
    pub conninfo: String,
    pub pid: u32,
    /// `PostgreSQL 15.x …` as `SELECT version()` says.
    pub version: String,
}

/// The supervisor's name of the server process (what [`stop`] terminates).
pub const PROC_NAME: &str = "postgres";

/// How a PostgreSQL binary is run: directly, or as `postgres` through `setpriv` when we are root.
struct Runner {
    /// `(uid, gid)` of the `postgres` user when we are root.
    drop_to: Option<(u32, u32)>,
}

impl Runner {
    fn new() -> Result<Runner, String> {
        let euid = std::fs::metadata("/proc/self")
            .map_err(|e| format!("cannot read /proc/self: {e}"))?
            .uid();
        if euid != 0 {
            return Ok(Runner { drop_to: None });
        }
        let ids = passwd_ids("postgres").ok_or_else(|| {
            format!("running as root and there is no postgres user to run PostgreSQL as; install it: {INSTALL}")
        })?;
        Ok(Runner { drop_to: Some(ids) })
    }

    /// The program and arguments that run `bin args…` as the right user.
    fn command(&self, bin: &Path, args: Vec<String>) -> (PathBuf, Vec<String>) {
        match self.drop_to {
            None => (bin.to_path_buf(), args),
            Some((uid, gid)) => {
                let mut all = vec![
                    format!("--reuid={uid}"),
                    format!("--regid={gid}"),
                    "--init-groups".into(),
                    "--".into(),
                    bin.display().to_string(),
                ];
                all.extend(args);
                (PathBuf::from("setpriv"), all)
            }
        }
    }

    /// Makes `dir` (inside the run's dir) the server's own.
    fn own(&self, run_dir: &Path, dir: &Path) -> Result<(), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        if let Some((uid, gid)) = self.drop_to {
            // The run's temp dir is root's and 0700: the postgres user must pass through it.
            std::fs::set_permissions(run_dir, std::fs::Permissions::from_mode(0o711))
                .map_err(|e| format!("cannot open {} to the postgres user: {e}", run_dir.display()))?;
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))
                .map_err(|e| format!("cannot give {} to the postgres user: {e}", dir.display()))?;
        }
        Ok(())
    }
}

/// The uid and gid of `user` from `/etc/passwd`.
fn passwd_ids(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|line| {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 4 || f[0] != user {
            return None;
        }
        Some((f[2].parse().ok()?, f[3].parse().ok()?))
    })
}

/// Makes a fresh cluster in `run_dir/pg`, starts it on a free loopback port and waits until it
/// accepts a connection; then creates the tables with `series` rows `inv:0..series`.
pub async fn start(
    procs: &mut Supervisor,
    run_dir: &Path,
    bins: &PgBinaries,
    series: usize,
) -> Result<PgServer, String> {
    let runner = Runner::new()?;
    let data = run_dir.join("pg");
    runner.own(run_dir, &data)?;
    init_cluster(&runner, bins, &data).await?;
    let data_s = data.display().to_string();
    let addr = seqsvr_harness::free_addr();
    let port = addr.rsplit(':').next().unwrap_or_default().to_string();
    let mut serve: Vec<String> = vec!["-D".into(), data_s.clone(), "-h".into(), "127.0.0.1".into()];
    // The Unix socket stays in the data dir: nothing outside the run is touched.
    serve.extend(["-p".into(), port.clone(), "-k".into(), data_s]);
    for setting in [
        format!("max_connections={MAX_CONNECTIONS}"),
        "fsync=on".into(),
        "synchronous_commit=on".into(),
    ] {
        serve.extend(["-c".into(), setting]);
    }
    let (prog, args) = runner.command(&bins.postgres, serve);
    let pid = procs
        .spawn(ProcSpec::new(PROC_NAME, prog, args))
        .map_err(|e| format!("cannot start postgres: {e}"))?;
    let conninfo = format!("host=127.0.0.1 port={port} user={ROLE} dbname=postgres connect_timeout=2");
    let client = seqsvr_harness::poll_until(START_LIMIT, || async { connect(&conninfo).await.ok() })
        .await
        .ok_or_else(|| {
            format!("postgres did not accept a connection within {START_LIMIT:?} (see logs/postgres.log)")
        })?;
    let version: String = client
        .query_one("SELECT version()", &[])
        .await
        .map_err(|e| format!("SELECT version(): {e}"))?
        .get(0);
    create_tables(&client, series).await?;
    Ok(PgServer {
        conninfo,
        pid,
        version: version.split(" on ").next().unwrap_or(&version).to_string(),
    })
}

/// `initdb` of a fresh cluster in `data`, with the benchmark's role trusted on loopback.
async fn init_cluster(runner: &Runner, bins: &PgBinaries, data: &Path) -> Result<(), String> {
    // `--no-sync`: only initdb's own final flush of the fresh files; the server's durability is
    // its `-c` settings.
    let init = [
        "-D",
        &data.display().to_string(),
        "-U",
        ROLE,
        "--auth=trust",
        "-E",
        "UTF8",
        "--no-sync",
    ]
    .map(String::from)
    .to_vec();
    let (prog, args) = runner.command(&bins.initdb, init);
    let mut cmd = tokio::process::Command::new(&prog);
    cmd.args(&args).kill_on_drop(true);
    let out = tokio::time::timeout(INITDB_LIMIT, cmd.output())
        .await
        .map_err(|_| format!("initdb ran past {INITDB_LIMIT:?}"))?
        .map_err(|e| format!("cannot run {}: {e}", prog.display()))?;
    if !out.status.success() {
        return Err(format!(
            "initdb failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// The app's two tables, and `series` rows `inv:0..series` starting at 0 (the first number is 1,
/// as a ledger's).
async fn create_tables(client: &Client, series: usize) -> Result<(), String> {
    client
        .batch_execute(
            "CREATE TABLE series (name text PRIMARY KEY, next bigint NOT NULL);
             CREATE TABLE invoices (series text NOT NULL, number bigint NOT NULL,
                                    reference text NOT NULL, PRIMARY KEY (series, number));",
        )
        .await
        .map_err(|e| format!("creating the tables: {e}"))?;
    client
        .execute(
            "INSERT INTO series SELECT 'inv:' || i, 0 FROM generate_series(0, $1::int - 1) AS i",
            &[&(series as i32)],
        )
        .await
        .map_err(|e| format!("creating the series rows: {e}"))?;
    Ok(())
}

/// Stops the server by its pid (SIGTERM: PostgreSQL's smart shutdown, once every client is gone;
/// killed after 10 s).
pub async fn stop(procs: &mut Supervisor) -> Result<(), String> {
    procs
        .terminate(PROC_NAME, Duration::from_secs(10))
        .await
        .map(|_| ())
        .map_err(|e| format!("stopping postgres: {e}"))
}

/// A connection, its driver task spawned (it ends when the client is dropped).
async fn connect(conninfo: &str) -> Result<Client, String> {
    let (client, conn) = tokio_postgres::connect(conninfo, NoTls)
        .await
        .map_err(|e| format!("postgres connect: {e}"))?;
    tokio::spawn(conn);
    Ok(client)
}

/// One caller's connection with the pair's two statements prepared.
struct Conn {
    client: Client,
    update: Statement,
    insert: Statement,
}

impl Conn {
    async fn open(conninfo: &str) -> Result<Conn, String> {
        let client = connect(conninfo).await?;
        let update = client
            .prepare("UPDATE series SET next = next + 1 WHERE name = $1 RETURNING next")
            .await
            .map_err(|e| format!("prepare: {e}"))?;
        let insert = client
            .prepare("INSERT INTO invoices (series, number, reference) VALUES ($1, $2, $3)")
            .await
            .map_err(|e| format!("prepare: {e}"))?;
        Ok(Conn { client, update, insert })
    }

    /// One pair: the number the transaction committed.
    async fn pair(&mut self, series: &str, reference: &str) -> Result<u64, tokio_postgres::Error> {
        let tx = self.client.transaction().await?;
        let n: i64 = tx.query_one(&self.update, &[&series]).await?.get(0);
        tx.execute(&self.insert, &[&series, &n, &reference]).await?;
        tx.commit().await?;
        Ok(n as u64)
    }
}

/// Reserve+confirm pairs as PostgreSQL transactions: caller `t` numbers invoices of series
/// `inv:{t % series}`; every committed number is recorded in `numbers`.
pub async fn pair_load(
    conninfo: &str,
    concurrency: usize,
    series: usize,
    numbers: Arc<Numbers>,
    window: Window,
    server: u32,
    ours: &[u32],
) -> Result<Sample, String> {
    // A connection is taken out of its slot for the pair and put back only when the pair ended: a
    // pair cut off by the driver's deadline leaves an empty slot (the server rolls the transaction
    // back when the connection closes), and the next call connects anew.
    let mut slots = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        slots.push(Mutex::new(Some(Conn::open(conninfo).await?)));
    }
    let slots = Arc::new(slots);
    // The work is done by the postmaster's children (one backend per connection, the WAL writer,
    // the checkpointer): their CPU is the server's, not foreign load.
    let children = children(server);
    let mut all_ours = ours.to_vec();
    all_ours.extend(&children);
    let pids = Pids {
        server,
        others: &children,
        ours: &all_ours,
    };
    let conninfo: Arc<str> = conninfo.into();
    Ok(drive(concurrency, window, pids, move |t, seed| {
        let (slots, conninfo, numbers) = (slots.clone(), conninfo.clone(), numbers.clone());
        async move {
            let mut slot = slots[t].lock().await;
            let mut conn = match slot.take() {
                Some(c) => c,
                None => match Conn::open(&conninfo).await {
                    Ok(c) => c,
                    Err(_) => return Answer::Failed,
                },
            };
            let key = t % series;
            let name = crate::ledgers::key_name(key);
            match conn.pair(&name, &format!("inv-{seed:016x}")).await {
                Ok(n) => {
                    *slot = Some(conn);
                    numbers.record(t, key, n);
                    Answer::Served { ok: 1, not_ok: 0 }
                }
                Err(_) => Answer::Failed,
            }
        }
    })
    .await)
}

/// The pids whose parent is `pid` (from `/proc/*/stat`).
fn children(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat")).is_ok_and(|stat| {
                // `pid (comm) state ppid …`; the name may hold spaces and parentheses.
                stat.rfind(')')
                    .and_then(|i| stat[i + 1..].split_whitespace().nth(1)?.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}

/// What the tables say of one series at the end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeriesTally {
    /// `series.next`: the highest number handed out by a committed transaction.
    pub next: u64,
    /// Invoice rows of the series.
    pub invoices: u64,
    /// Distinct invoice numbers among them.
    pub distinct: u64,
}

/// [`SeriesTally`] of series `inv:0..`, in their order.
pub async fn tally(conninfo: &str) -> Result<Vec<SeriesTally>, String> {
    let client = connect(conninfo).await?;
    let rows = client
        .query(
            "SELECT s.name, s.next, count(i.number), count(DISTINCT i.number)
             FROM series s LEFT JOIN invoices i ON i.series = s.name GROUP BY s.name, s.next",
            &[],
        )
        .await
        .map_err(|e| format!("tallying the invoices: {e}"))?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let name: String = r.get(0);
        let idx: usize = name
            .strip_prefix("inv:")
            .and_then(|i| i.parse().ok())
            .ok_or_else(|| format!("unexpected series {name:?}"))?;
        let (next, count, distinct): (i64, i64, i64) = (r.get(1), r.get(2), r.get(3));
        let t = SeriesTally {
            next: next as u64,
            invoices: count as u64,
            distinct: distinct as u64,
        };
        out.push((idx, t));
    }
    out.sort_by_key(|(i, _)| *i);
    Ok(out.into_iter().map(|(_, t)| t).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_finds_a_child_of_this_process() {
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("sleep");
        let found = children(std::process::id()).contains(&child.id());
        child.kill().expect("kill sleep");
        child.wait().expect("reap sleep");
        assert!(found, "the sleep child was not found");
    }

    #[test]
    fn passwd_ids_reads_the_named_user_only() {
        // /etc/passwd always has root; a name nobody has is None, not a neighbour's ids.
        assert_eq!(passwd_ids("root"), Some((0, 0)));
        assert_eq!(passwd_ids("no-such-user-ledger-bench"), None);
    }
}
