//! A real failover (needs real time: servers die and are promoted): concurrent callers run the
//! executor against a 3-master, 3-replica cluster (`scripts/services/redis-failover.sh`) while a
//! master is lost and its replica promoted, effects counted at an in-process sink
//! (`idem_conformance::failover`).
//!
//! The fault models a partition followed by a crash: the replica's replication link is cut
//! (`CLIENT KILL TYPE master` on the replica; it reconnects within a second), 150 ms later the
//! master is killed with `kill -9`, and the replica takes over its slots
//! (`CLUSTER FAILOVER TAKEOVER`). Writes the master acknowledged in that window never reached the
//! replica. Then the dead node is replaced (started again, empty, it rejoins as the new master's
//! replica), which is when a shard whose writes wait for a replica can take writes again.
//!
//! - With `with_wait_for_replicas(1, 500 ms)`: zero double effects, every key accounted for,
//!   callers see `Unavailable` during the failover and succeed after it (asserted).
//! - Without: the double effects are counted and printed, not asserted.
//!
//! The two runs share the cluster and each kills a master, so they run one at a time.

mod common;

use std::sync::Mutex;
use std::time::Duration;

use idem_conformance::failover::{self, FailoverReport, FailoverRun};
use idem_core::{Executor, Policy, Scope};
use idem_store_redis::RedisStore;
use idem_store_redis::redis;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// One shard of the cluster: its master and the master's online replica.
struct Shard {
    master: String,
    master_pid: u32,
    replica: String,
    replica_pid: u32,
    /// The master's command line, to start it again (as a replica) after the run.
    restart: Vec<String>,
}

async fn conn(url: &str) -> redis::aio::MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap()
}

async fn info(c: &mut redis::aio::MultiplexedConnection, section: &str) -> String {
    redis::cmd("INFO")
        .arg(section)
        .query_async(c)
        .await
        .unwrap()
}

fn info_field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(str::trim)
}

async fn config(c: &mut redis::aio::MultiplexedConnection, name: &str) -> String {
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(c)
        .await
        .unwrap();
    v.get(1).cloned().unwrap_or_default()
}

/// Every master with an online replica (waiting up to 30 s for replicas still syncing); the
/// first is the victim.
async fn healthy_shards(urls: &[String]) -> Vec<Shard> {
    for _ in 0..300 {
        let mut shards = Vec::new();
        let mut masters = 0;
        for url in urls {
            let Ok(client) = redis::Client::open(url.as_str()) else {
                continue;
            };
            let Ok(mut c) = client.get_multiplexed_async_connection().await else {
                continue;
            };
            let repl = info(&mut c, "replication").await;
            if info_field(&repl, "role") != Some("master") {
                continue;
            }
            masters += 1;
            let Some(line) = info_field(&repl, "slave0").filter(|l| l.contains("state=online"))
            else {
                continue;
            };
            let field = |name: &str| {
                line.split(',')
                    .find_map(|kv| kv.strip_prefix(&format!("{name}=")))
                    .unwrap()
                    .to_owned()
            };
            let replica = format!("redis://{}:{}", field("ip"), field("port"));
            let mut r = conn(&replica).await;
            let pid = |i: &str| info_field(i, "process_id").unwrap().parse().unwrap();
            let master_pid = pid(&info(&mut c, "server").await);
            let replica_pid = pid(&info(&mut r, "server").await);
            let mut restart = vec!["--port".into(), config(&mut c, "port").await];
            for name in [
                "bind",
                "dir",
                "pidfile",
                "logfile",
                "cluster-config-file",
                "cluster-node-timeout",
                "repl-diskless-sync-delay",
            ] {
                restart.push(format!("--{name}"));
                restart.push(config(&mut c, name).await);
            }
            restart.extend(
                [
                    "--cluster-enabled",
                    "yes",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]
                .map(String::from),
            );
            shards.push(Shard {
                master: url.clone(),
                master_pid,
                replica,
                replica_pid,
                restart,
            });
        }
        if masters == 3 && shards.len() == 3 {
            return shards;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the failover cluster does not have 3 masters with an online replica each");
}

fn signal(sig: &str, pid: u32) {
    let status = std::process::Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// A partition, then a crash: the replica stops hearing from its master (the replica is frozen
/// with SIGSTOP and the master drops it, so it cannot reconnect), the master acknowledges writes
/// alone for 150 ms and dies (kill -9), then the replica wakes and takes over its slots, and the
/// dead node is started again as its replica.
async fn fail_over(shard: &Shard) -> Option<Executor> {
    let mut m = conn(&shard.master).await;
    signal("-STOP", shard.replica_pid);
    let _: redis::Value = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("replica")
        .query_async(&mut m)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(150)).await;
    signal("-9", shard.master_pid);
    signal("-CONT", shard.replica_pid);
    let mut r = conn(&shard.replica).await;
    let _: redis::Value = redis::cmd("CLUSTER")
        .arg("FAILOVER")
        .arg("TAKEOVER")
        .query_async(&mut r)
        .await
        .unwrap();
    let mut promoted = false;
    for _ in 0..200 {
        if info_field(&info(&mut r, "replication").await, "role") == Some("master") {
            promoted = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(promoted, "{} did not become a master", shard.replica);
    // The operator replaces the dead node: it comes back empty and rejoins as the new master's
    // replica. Until it is online the shard has no replica, and with WAIT its writes fail.
    restore(shard);
    for _ in 0..600 {
        let repl = info(&mut r, "replication").await;
        if info_field(&repl, "slave0").is_some_and(|l| l.contains("state=online")) {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never got its replica back", shard.replica);
}

/// Starts the killed master again: it rejoins as a replica of the promoted one.
fn restore(shard: &Shard) {
    let status = std::process::Command::new("redis-server")
        .args(&shard.restart)
        .args(["--daemonize", "yes"])
        .status()
        .unwrap();
    assert!(status.success(), "restarting {}", shard.master);
}

async fn run(wait: bool) -> Option<FailoverReport> {
    let urls = common::failover_urls()?;
    let victim = healthy_shards(&urls).await.swap_remove(0);
    let mut store = RedisStore::connect_cluster(&urls)
        .await
        .unwrap()
        .with_prefix(&common::unique("fo"))
        .unwrap();
    if wait {
        store = store
            .with_wait_for_replicas(1, Duration::from_millis(500))
            .unwrap();
    }
    let policy = Policy::builder()
        .lease(Duration::from_secs(2))
        .build()
        .unwrap();
    let executor = Executor::new(store).with_policy(policy);
    let scope = Scope::new(common::unique(if wait { "wait" } else { "nowait" })).unwrap();
    let report = failover::run(executor, FailoverRun::new(scope), move || async move {
        fail_over(&victim).await
    })
    .await;
    let line = format!(
        "redis cluster failover, {}: {report}",
        if wait { "WAIT 1 500ms" } else { "no WAIT" }
    );
    eprintln!("{line}");
    append_figures(&line);
    Some(report)
}

/// The figures also go to `target/tmp/failover-figures.txt` (test output is captured).
fn append_figures(line: &str) {
    use std::io::Write;
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("failover-figures.txt");
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
    {
        let _ = writeln!(f, "{line}");
    }
}

fn one_at_a_time(wait: bool) -> Option<FailoverReport> {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(run(wait))
}

/// Runs of the scenario with WAIT before giving up on seeing callers meet the failover.
const WAIT_RUNS: usize = 3;

#[test]
fn failover_with_wait_loses_no_claim() {
    // Safety holds on every run. Whether a caller's write lands on the failing shard inside the
    // fault's window depends on scheduling (on a loaded 2-core machine the callers can be done
    // with that shard before it fails), so the scenario runs again, up to WAIT_RUNS times, until
    // callers have met the failover: seen Unavailable, then recovered.
    for run in 1..=WAIT_RUNS {
        let Some(r) = one_at_a_time(true) else { return };
        r.assert_no_claim_lost();
        if r.unavailable > 0 {
            assert!(r.succeeded_after_fault > 0, "callers did not recover: {r}");
            return;
        }
        eprintln!("run {run}: callers never met the failover; running the scenario again");
    }
    panic!("in {WAIT_RUNS} runs, callers never saw Unavailable during the failover");
}

#[test]
fn failover_without_wait_is_measured() {
    let Some(r) = one_at_a_time(false) else {
        return;
    };
    // The double effects are measured, not asserted: they are what the option prevents.
    assert!(r.errors.is_empty() && r.unsettled == 0, "{r}");
}
