//! Two worker processes run the same orders, each three effects (pay, ship, email) with a
//! checkpoint after the first two, under a 50 ms lease (shorter than the work, so live holders
//! are taken over too) and `StalePolicy::Takeover`, while one worker is killed (SIGKILL) every
//! 0.2–0.8 s and started again. Every checkpoint an attempt was told is saved must be among the
//! checkpoints the next attempt starts with ([contract §6.1](idemkit::contract#checkpoints): "a
//! takeover keeps them").
//!
//! The workers write what they do to one log, a line per event, each with one `write` to a file
//! opened for appending (a killed worker loses no line it wrote):
//!
//! ```text
//! ATTEMPT <order> <attempt> <kind> <checkpoints it started with, comma-separated>
//! EFFECT <order> <attempt> <pay|ship|email>
//! CKPT <order> <attempt> <paid|shipped>        (the store answered "saved")
//! COMPLETED <order> <attempt>                  (the store took the attempt's outcome)
//! ```
//!
//! The check: for every `CKPT o n c` and every later attempt `m > n` of order `o` whose view of
//! the record is known to be its own, `c` is among the checkpoints `m` started with. An attempt's
//! view is its own when it later saved a checkpoint or completed: the executor reads the
//! checkpoints right after the claim and gives none if a newer attempt already took the claim
//! (that attempt is fenced at its next write, so its view proves nothing). Effects that run
//! twice are counted, not failed: a lease shorter than the work makes a takeover of a live holder,
//! whose effect in progress then runs again (contract §7).
//!
//! ```text
//! cargo run -p idemkit --example takeover_chaos --features sqlite,postgres,redis,dynamodb -- 200
//! ```
//!
//! runs 200 orders (30 without the argument) on SQLite (a temporary file), and on PostgreSQL and
//! Redis and DynamoDB when `IDEM_TEST_POSTGRES_URL`, `IDEM_TEST_REDIS_URL` and
//! `IDEM_TEST_DYNAMODB_URL` are set.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Arc;
use std::time::{Duration, Instant};

use idemkit::{
    Attempt, CheckpointError, Error, Executor, Fingerprint, IdempotencyKey, OpenOptions, Outcome,
    Policy, RecordId, Scope, StalePolicy,
};
use serde_json::json;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The lease: shorter than an order's work (three steps of 10–30 ms each).
const LEASE: Duration = Duration::from_millis(50);
/// Set in a worker process: the store URL, the run, the worker's number, the orders, the log.
const WORKER_ENV: &str = "IDEM_CHAOS_WORKER";
/// The steps of an order: the effect, and the checkpoint saved after it (none after the last).
const STEPS: [(&str, Option<&str>); 3] = [
    ("pay", Some("paid")),
    ("ship", Some("shipped")),
    ("email", None),
];

fn policy() -> Result<Policy, BoxError> {
    Ok(Policy::builder()
        .lease(LEASE)
        .stale(StalePolicy::Takeover)
        .build()?)
}

fn names(run: &str, order: usize) -> Result<(Scope, IdempotencyKey, Fingerprint), BoxError> {
    Ok((
        Scope::new(format!("chaos/{run}"))?,
        IdempotencyKey::new(format!("order-{order}"))?,
        Fingerprint::of("order", &json!({ "order": order }))?,
    ))
}

/// The log the workers append to, one line per `write`.
#[derive(Clone)]
struct Log(Arc<std::fs::File>);

impl Log {
    fn open(path: &Path) -> std::io::Result<Self> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)?;
        Ok(Self(Arc::new(file)))
    }

    /// Appends `line`; a worker that cannot exits non-zero (the run counts a crash and starts it
    /// again) rather than leave a gap the check would misread.
    fn line(&self, line: fmt::Arguments<'_>) {
        if let Err(e) = (&*self.0).write_all(format!("{line}\n").as_bytes()) {
            eprintln!("takeover_chaos worker: cannot write the log: {e}");
            std::process::exit(2);
        }
    }
}

/// Some work: 10–30 ms.
async fn work() {
    let ms = 10 + rand_below(21);
    tokio::time::sleep(Duration::from_millis(ms)).await;
}

/// A number below `n`, from the clock's nanoseconds (good enough to spread timings).
fn rand_below(n: u64) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    u64::from(nanos / 1000) % n
}

/// The order's tool: each step not yet checkpointed, then its checkpoint.
async fn order_tool(attempt: Attempt, log: Log, order: usize) -> Outcome {
    let n = attempt.number();
    let seen: Vec<&str> = attempt.checkpoints().iter().map(|c| c.name()).collect();
    log.line(format_args!(
        "ATTEMPT {order} {n} {:?} {}",
        attempt.kind(),
        seen.join(",")
    ));
    let done = |checkpoint: &str| seen.contains(&checkpoint);
    // Steps up to the last one checkpointed are done.
    let first = STEPS
        .iter()
        .rposition(|(_, c)| c.is_some_and(done))
        .map_or(0, |i| i + 1);
    for (effect, checkpoint) in &STEPS[first..] {
        log.line(format_args!("EFFECT {order} {n} {effect}"));
        work().await;
        if let Some(checkpoint) = checkpoint {
            match attempt.checkpoint(checkpoint, effect).await {
                Ok(()) => log.line(format_args!("CKPT {order} {n} {checkpoint}")),
                Err(CheckpointError::Fenced) => break, // taken over: stop here
                Err(e) => panic!("checkpoint {checkpoint} of order {order}: {e}"),
            }
        }
    }
    Outcome::definitive_json(200, json!({ "order": order }))
}

/// Whether this process is a worker.
pub fn is_worker() -> bool {
    std::env::var_os(WORKER_ENV).is_some()
}

/// A worker: runs every order in turn until each is done (executed here or replayed). It exits
/// non-zero, saying why, if it cannot start.
pub fn worker_main() {
    if let Err(e) = worker() {
        eprintln!("takeover_chaos worker: {e}");
        std::process::exit(1);
    }
}

fn worker() -> Result<(), BoxError> {
    let spec = std::env::var(WORKER_ENV)?;
    let v: Vec<&str> = spec.lines().collect();
    let [url, run, _worker, orders, log] = v[..] else {
        return Err(format!("{WORKER_ENV}: five lines, not {spec:?}").into());
    };
    let (orders, log): (usize, _) = (orders.parse()?, Log::open(Path::new(log))?);
    tokio::runtime::Runtime::new()?.block_on(async {
        let store = OpenOptions::new().open(url).await?.into_store();
        let executor = Executor::from_arc(store).with_policy(policy()?);
        for order in 0..orders {
            let (scope, key, fp) = names(run, order)?;
            loop {
                let number = Arc::new(std::sync::atomic::AtomicU32::new(0));
                let answer = executor
                    .run(&scope, &key, &fp, |attempt| {
                        number.store(attempt.number(), std::sync::atomic::Ordering::SeqCst);
                        order_tool(attempt, log.clone(), order)
                    })
                    .await;
                match answer {
                    Ok(e) => {
                        if !e.is_replay() {
                            let n = number.load(std::sync::atomic::Ordering::SeqCst);
                            log.line(format_args!("COMPLETED {order} {n}"));
                        }
                        break;
                    }
                    // Someone holds it (or held it: fenced); look again shortly.
                    Err(Error::InFlight { .. } | Error::Fenced { .. }) => {}
                    Err(e) => eprintln!("order {order}: {e}; trying again"),
                }
                tokio::time::sleep(Duration::from_millis(2 + rand_below(5))).await;
            }
        }
        Ok(())
    })
}

/// What a run did, from its log.
#[derive(Debug, Default)]
pub struct Figures {
    /// Orders run.
    pub orders: usize,
    /// Workers killed.
    pub kills: usize,
    /// Attempts started.
    pub attempts: usize,
    /// Attempts that were takeovers.
    pub takeovers: usize,
    /// Checkpoints saved.
    pub checkpoints: usize,
    /// Effects that ran more than once (a takeover of a live holder, or of one killed after its
    /// effect and before its checkpoint).
    pub repeated_effects: usize,
    /// Saved checkpoints a later attempt did not start with: each one a lost checkpoint.
    pub lost: Vec<String>,
    /// Orders not completed in the store at the end.
    pub unfinished: usize,
    /// Workers that died of something else than a kill (each started again).
    pub crashes: usize,
}

impl fmt::Display for Figures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} orders, {} kills, {} attempts ({} takeovers), {} checkpoints saved, {} lost, \
             {} effects repeated, {} unfinished, {} crashes",
            self.orders,
            self.kills,
            self.attempts,
            self.takeovers,
            self.checkpoints,
            self.lost.len(),
            self.repeated_effects,
            self.unfinished,
            self.crashes
        )
    }
}

/// One attempt of one order, as its log lines tell it.
#[derive(Default)]
struct AttemptLog {
    seen: BTreeSet<String>,
    saved: Vec<String>,
    completed: bool,
    takeover: bool,
}

/// Reads the log of a run of `orders` orders and checks it; see the module docs.
fn check(log: &str, orders: usize, kills: usize) -> Figures {
    let mut attempts: BTreeMap<(usize, u32), AttemptLog> = BTreeMap::new();
    let mut effects: BTreeMap<(usize, String), usize> = BTreeMap::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        let (Some(order), Some(n)) = (
            f.get(1).and_then(|s| s.parse().ok()),
            f.get(2).and_then(|s| s.parse().ok()),
        ) else {
            continue; // a line cut by a kill
        };
        let a = attempts.entry((order, n)).or_default();
        match f[0] {
            "ATTEMPT" => {
                a.takeover = f.get(3) == Some(&"TakenOver");
                let seen = f.get(4).copied().unwrap_or("");
                a.seen = seen
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned)
                    .collect();
            }
            "CKPT" => a.saved.push(f[3].to_owned()),
            "COMPLETED" => a.completed = true,
            "EFFECT" => *effects.entry((order, f[3].to_owned())).or_default() += 1,
            _ => {}
        }
    }
    let mut figures = Figures {
        orders,
        kills,
        attempts: attempts.len(),
        takeovers: attempts.values().filter(|a| a.takeover).count(),
        checkpoints: attempts.values().map(|a| a.saved.len()).sum(),
        repeated_effects: effects.values().map(|n| n.saturating_sub(1)).sum(),
        ..Figures::default()
    };
    for ((order, n), a) in &attempts {
        for saved in &a.saved {
            for ((_, m), later) in attempts.range((*order, n + 1)..=(*order, u32::MAX)) {
                let own_view = !later.saved.is_empty() || later.completed;
                if own_view && !later.seen.contains(saved) {
                    figures.lost.push(format!(
                        "order {order}: attempt {n} saved {saved}; attempt {m} started with {:?}",
                        later.seen
                    ));
                }
            }
        }
    }
    figures
}

/// Runs `orders` orders on the store at `url` (its schema is made first) with two workers
/// (this executable again, `worker_args` before the worker's environment), one of them killed
/// every 0.2–0.8 s until both have finished; the figures of the run, from its log.
pub async fn chaos(url: &str, worker_args: &[&str], orders: usize) -> Result<Figures, BoxError> {
    OpenOptions::new().migrate(true).open(url).await?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos();
    let run = format!("{}-{nanos}", std::process::id());
    let dir = std::env::temp_dir().join(format!("idem-chaos-{run}"));
    std::fs::create_dir_all(&dir)?;
    let log = dir.join("events.log");
    let exe = std::env::current_exe()?;
    let spawn = |worker: usize| -> std::io::Result<Child> {
        Command::new(&exe)
            .args(worker_args)
            .env(
                WORKER_ENV,
                format!("{url}\n{run}\n{worker}\n{orders}\n{}", log.display()),
            )
            .spawn()
    };
    let mut workers: Vec<Option<Child>> = vec![Some(spawn(0)?), Some(spawn(1)?)];
    let (mut kills, mut crashes) = (0, 0);
    // Past this, nobody is killed any more: the workers finish on their own.
    let deadline = Instant::now() + Duration::from_millis(200 * orders as u64 + 10_000);
    loop {
        let pause = 200 + rand_below(601);
        tokio::time::sleep(Duration::from_millis(pause)).await;
        for (w, slot) in workers.iter_mut().enumerate() {
            if let Some(child) = slot
                && let Some(status) = child.try_wait()?
            {
                *slot = None;
                if !status.success() {
                    // A store error the worker did not survive: counted, and started again.
                    crashes += 1;
                    assert!(crashes < 20, "the workers keep failing: {status}");
                    *slot = Some(spawn(w)?);
                }
            }
        }
        let live: Vec<usize> = (0..2).filter(|w| workers[*w].is_some()).collect();
        if live.is_empty() {
            break;
        }
        if Instant::now() < deadline {
            let w = live[rand_below(live.len() as u64) as usize];
            if let Some(mut child) = workers[w].take() {
                child.kill()?; // SIGKILL: no release, the claim stays `processing`
                child.wait()?;
                kills += 1;
            }
            workers[w] = Some(spawn(w)?);
        }
    }
    let text = std::fs::read_to_string(&log)?;
    std::fs::remove_dir_all(&dir).ok();
    let mut figures = check(&text, orders, kills);
    figures.crashes = crashes;
    // Finished means completed in the store (a worker killed after completing an order may not
    // have logged it).
    let store = OpenOptions::new().open(url).await?.into_store();
    figures.unfinished = 0;
    for order in 0..orders {
        let (scope, key, _) = names(&run, order)?;
        let id = RecordId::new(scope.clone(), key.clone());
        let now = idemkit::Timestamp::now();
        let record = store.get(&id, now).await?;
        if record.is_none_or(|r| r.state != idemkit::RecordState::Completed) {
            figures.unfinished += 1;
        }
    }
    Ok(figures)
}

/// The store URLs to run on: SQLite in `dir`, and the servers whose variables are set.
pub fn backends(dir: &Path) -> Vec<(&'static str, String)> {
    let sqlite: PathBuf = dir.join("chaos.db");
    let mut backends = vec![("sqlite", format!("sqlite://{}", sqlite.display()))];
    for (name, var) in [
        ("postgres", "IDEM_TEST_POSTGRES_URL"),
        ("redis", "IDEM_TEST_REDIS_URL"),
        ("dynamodb", "IDEM_TEST_DYNAMODB_URL"),
    ] {
        match std::env::var(var) {
            Ok(url) => backends.push((name, url)),
            Err(_) => println!("{name}: skipped ({var} is not set)"),
        }
    }
    backends
}

fn main() -> Result<(), BoxError> {
    if is_worker() {
        worker_main();
        return Ok(());
    }
    let orders = match std::env::args().nth(1) {
        Some(n) => n
            .parse()
            .map_err(|e| format!("{n:?} is not a number of orders: {e}"))?,
        None => 30,
    };
    let dir = std::env::temp_dir().join(format!("idem-chaos-db-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let runtime = tokio::runtime::Runtime::new()?;
    let mut failed = false;
    for (name, url) in backends(&dir) {
        let figures = runtime.block_on(chaos(&url, &[], orders))?;
        println!("{name}: {figures}");
        for lost in &figures.lost {
            println!("  lost: {lost}");
        }
        failed |= !figures.lost.is_empty() || figures.unfinished > 0;
    }
    std::fs::remove_dir_all(&dir).ok();
    assert!(!failed, "a checkpoint was lost or an order never finished");
    Ok(())
}
