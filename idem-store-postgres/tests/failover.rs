//! A real failover (needs real time: servers die and are promoted): concurrent callers run the
//! executor against a primary with a streaming standby, both started here on free loopback ports
//! (`IDEM_TEST_PG_BINDIR` from `scripts/services/postgres-standby.sh`), while the primary is lost
//! and the standby promoted; effects are counted at an in-process sink
//! (`idem_conformance::failover`). The shared server is never touched.
//!
//! The fault models a partition followed by a crash: the standby loses its primary (its
//! `primary_conninfo` is pointed at a closed port and reloaded, so its WAL receiver cannot
//! reconnect), the primary runs alone until the server shows it did (asynchronous: it
//! acknowledged 8 more completions; synchronous: a commit waits for the standby) and is stopped
//! with `pg_ctl stop -m immediate`, the standby is promoted (`pg_ctl promote`), and the callers
//! reconnect to it.
//!
//! - `synchronous_standby_names = 'standby1'`, `synchronous_commit = on`: a commit returns only
//!   once the standby flushed it, so zero double effects (asserted).
//! - `synchronous_standby_names = ''` (asynchronous): the double effects are counted and printed,
//!   not asserted.
//!
//! The servers run with `fsync = off` (the disks are not what fails here, and the machine is
//! shared).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use idem_conformance::failover::{self, FailoverReport, FailoverRun};
use idem_conformance::kit;
use idem_core::{Executor, Policy, Scope};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::{self, Connection, PgConnection};

fn bindir() -> Option<PathBuf> {
    kit::env_url("IDEM_TEST_PG_BINDIR", "the PostgreSQL binaries' directory").map(PathBuf::from)
}

/// A primary and its streaming standby, stopped and removed on drop.
struct Pair {
    bin: PathBuf,
    dir: PathBuf,
    as_postgres: bool,
    primary_port: u16,
    standby_port: u16,
}

impl Pair {
    fn run(&self, program: &str, args: &[&str]) {
        let path = self.bin.join(program);
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&path);
            c
        } else {
            Command::new(&path)
        };
        let out = cmd.args(args).output().unwrap();
        assert!(
            out.status.success(),
            "{program} {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn data(&self, which: &str) -> String {
        self.dir.join(which).display().to_string()
    }

    fn url(port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/postgres")
    }

    fn start(&self, which: &str, port: u16) {
        let data = self.data(which);
        let log = self.dir.join(format!("{which}.log")).display().to_string();
        let opts = format!("-p {port} -k {}", self.dir.display());
        self.run(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-o", &opts, "-w", "-t", "60", "start",
            ],
        );
    }

    /// initdb, start the primary, pg_basebackup the standby, start it, wait until it streams.
    async fn new(bin: PathBuf, synchronous: bool) -> Self {
        let dir = std::env::temp_dir().join(kit::unique("idem-pg-failover"));
        std::fs::create_dir_all(&dir).unwrap();
        let as_postgres = Command::new("id")
            .arg("-u")
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
            .unwrap_or(false);
        if as_postgres {
            let ok = Command::new("chown")
                .args(["postgres", &dir.display().to_string()])
                .status()
                .unwrap();
            assert!(ok.success());
        }
        let pair = Pair {
            bin,
            dir,
            as_postgres,
            primary_port: kit::free_port(),
            standby_port: kit::free_port(),
        };
        let primary = pair.data("primary");
        pair.run(
            "initdb",
            &[
                "-D",
                &primary,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
            ],
        );
        let sync_names = if synchronous { "standby1" } else { "" };
        append(
            &Path::new(&primary).join("postgresql.conf"),
            &format!(
                "listen_addresses = '127.0.0.1'\nfsync = off\nmax_wal_senders = 4\n\
                 synchronous_commit = on\nsynchronous_standby_names = '{sync_names}'\n"
            ),
        );
        pair.start("primary", pair.primary_port);
        let standby = pair.data("standby");
        let port = pair.primary_port.to_string();
        pair.run(
            "pg_basebackup",
            &[
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "postgres",
                "-D",
                &standby,
                "-R",
                "-X",
                "stream",
            ],
        );
        // Its own name (what synchronous_standby_names matches), and no synchronous standby of
        // its own once promoted (it will have none).
        append(
            &Path::new(&standby).join("postgresql.auto.conf"),
            &format!(
                "primary_conninfo = 'host=127.0.0.1 port={port} user=postgres application_name=standby1'\n\
                 synchronous_standby_names = ''\n"
            ),
        );
        pair.start("standby", pair.standby_port);
        let mut c = pair.connect(pair.primary_port).await;
        let want = if synchronous { "sync" } else { "async" };
        for _ in 0..600 {
            let row: Option<(String, String)> = sqlx::query_as(
                "SELECT state, sync_state FROM pg_stat_replication WHERE application_name = 'standby1'",
            )
            .fetch_optional(&mut c)
            .await
            .unwrap();
            if row
                .as_ref()
                .is_some_and(|(s, ss)| s == "streaming" && ss == want)
            {
                return pair;
            }
            tokio::time::sleep(Duration::from_millis(50)).await; // pacing the poll only
        }
        panic!("the standby never streamed ({want})");
    }

    async fn connect(&self, port: u16) -> PgConnection {
        PgConnection::connect(&Self::url(port)).await.unwrap()
    }

    /// The partition, the crash, the promotion; returns an executor on the promoted standby.
    async fn fail_over(&self, policy: Policy) -> Option<Executor> {
        // The standby loses its primary: pointed at a closed port, it cannot reconnect.
        let mut standby = self.connect(self.standby_port).await;
        sqlx::query(
            "ALTER SYSTEM SET primary_conninfo = 'host=127.0.0.1 port=1 user=postgres application_name=standby1'",
        )
        .execute(&mut standby)
        .await
        .unwrap();
        sqlx::query("SELECT pg_reload_conf()")
            .execute(&mut standby)
            .await
            .unwrap();
        let mut primary = self.connect(self.primary_port).await;
        for _ in 0..600 {
            let n: i64 = sqlx::query_scalar("SELECT count(*) FROM pg_stat_replication")
                .fetch_one(&mut primary)
                .await
                .unwrap();
            if n == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await; // pacing the poll only
        }
        // The primary runs alone until it shows it: a commit waits for the standby it lost
        // (synchronous), or it acknowledged completions the standby never received
        // (asynchronous). An event of the server's, not a time.
        let completed = "SELECT count(*) FROM public.idem_records WHERE state = 'completed'";
        let before: i64 = sqlx::query_scalar(completed)
            .fetch_one(&mut primary)
            .await
            .unwrap();
        loop {
            let waiting: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'",
            )
            .fetch_one(&mut primary)
            .await
            .unwrap();
            let now: i64 = sqlx::query_scalar(completed)
                .fetch_one(&mut primary)
                .await
                .unwrap();
            if waiting > 0 || now >= before + 8 {
                break;
            }
            tokio::task::yield_now().await;
        }
        tokio::task::block_in_place(|| {
            self.run(
                "pg_ctl",
                &["-D", &self.data("primary"), "-m", "immediate", "-w", "stop"],
            );
            self.run(
                "pg_ctl",
                &["-D", &self.data("standby"), "-w", "-t", "60", "promote"],
            );
        });
        let store = PostgresStore::connect(&Self::url(self.standby_port))
            .await
            .unwrap();
        Some(Executor::new(store).with_policy(policy))
    }
}

impl Drop for Pair {
    fn drop(&mut self) {
        for which in ["primary", "standby"] {
            let data = self.data(which);
            let path = self.bin.join("pg_ctl");
            let mut cmd = if self.as_postgres {
                let mut c = Command::new("runuser");
                c.args(["-u", "postgres", "--"]).arg(&path);
                c
            } else {
                Command::new(&path)
            };
            let _ = cmd
                .args(["-D", &data, "-m", "immediate", "-w", "stop"])
                .output();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn append(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().append(true).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

async fn run(synchronous: bool) -> Option<FailoverReport> {
    let bin = bindir()?;
    let pair = Pair::new(bin, synchronous).await;
    let store = PostgresStore::connect(&Pair::url(pair.primary_port))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    let policy = Policy::builder()
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let executor = Executor::new(store).with_policy(policy);
    let scope = Scope::new(if synchronous { "sync" } else { "async" }).unwrap();
    let pair = std::sync::Arc::new(pair);
    let p = pair.clone();
    let mut shape = FailoverRun::new(scope);
    shape.fault_after = 60;
    let report = failover::run(
        executor,
        shape,
        move || async move { p.fail_over(policy).await },
    )
    .await;
    let line = format!(
        "postgresql failover, {}: {report}",
        if synchronous {
            "synchronous_standby_names = 'standby1'"
        } else {
            "asynchronous standby"
        }
    );
    eprintln!("{line}");
    append_figures(&line);
    drop(pair);
    Some(report)
}

/// The figures also go to `target/tmp/failover-figures.txt` (test output is captured).
fn append_figures(line: &str) {
    use std::io::Write;
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("failover-figures.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_synchronous_standby_loses_no_claim() {
    let Some(r) = run(true).await else { return };
    r.assert_no_claim_lost();
    assert!(r.unavailable > 0, "callers never saw Unavailable: {r}");
    assert!(r.succeeded_after_fault > 0, "callers did not recover: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failover_with_asynchronous_standby_is_measured() {
    let Some(r) = run(false).await else { return };
    // The double effects are measured, not asserted: they are what synchronous replication
    // prevents.
    assert!(r.errors.is_empty() && r.unsettled == 0, "{r}");
}
