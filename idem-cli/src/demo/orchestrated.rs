//! `idem demo`: simulated agents retrying a real tool under injected faults, effects counted at
//! the sink.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::IdempotencyKey;
use idem_http::client::{ClientError, DeadlineExceeded, RetryPolicy, ToolClient};
use serde_json::json;
use tokio::sync::Semaphore;

pub use super::report::{AnswerTimes, DemoReport, table};
use crate::exit::Failure;
use crate::serve::{
    Backend, BoxError, DEMO_FAULT_HEADER, ServeOptions, TENANT_HEADER, router, router_without_idem,
};
use idemkit::StoreUrl;

/// How the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Where records and tickets live.
    pub store: StoreUrl,
    /// How many operations the agents perform.
    pub operations: usize,
    /// How many operations run at once.
    pub concurrency: usize,
    /// How long the tool works.
    pub tool_latency: Duration,
    /// Print progress to stderr.
    pub progress: bool,
    /// Retries ask the tool to wait for an in-flight answer (`Prefer: wait`, the client's
    /// default); `false`: they are answered 409 and retry after `Retry-After` (`--no-wait`).
    pub wait: bool,
}

/// The faults, one per operation in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// Answered, then "the model decides to call again" with the same arguments.
    CallAgain,
    /// Per-attempt deadline shorter than the tool's latency: every attempt times out until the
    /// first execution has finished.
    ShortDeadline,
    /// The orchestrator sends the call twice at once.
    DuplicateSend,
    /// The first holder crashes mid-flight (hangs before its effect); the retry resolves it.
    CrashedHolder,
}

impl Fault {
    /// The answer times besides the overall ones that an operation of this fault counts in.
    fn times(self) -> Option<usize> {
        match self {
            Self::CallAgain => None,
            Self::ShortDeadline => Some(TIMED_OUT),
            Self::DuplicateSend => Some(SENT_TWICE),
            Self::CrashedHolder => Some(HUNG),
        }
    }

    fn of(i: usize) -> Self {
        match i % 8 {
            0 | 4 => Self::CallAgain,
            1 | 5 => Self::ShortDeadline,
            2 | 6 => Self::DuplicateSend,
            3 => Self::CrashedHolder,
            _ => Self::CallAgain,
        }
    }
}

/// Indexes of [`Counters::answer_ms`]: every operation, then each fault timed on its own.
const ALL: usize = 0;
const TIMED_OUT: usize = 1;
const SENT_TWICE: usize = 2;
const HUNG: usize = 3;

#[derive(Default)]
struct Counters {
    attempts: AtomicUsize,
    executed: AtomicUsize,
    replays: AtomicUsize,
    conflicts: AtomicUsize,
    /// Per kind of operation ([`TIMED_OUT`], …; [`ALL`] unused), the 409s its calls got.
    conflicts_by: [AtomicUsize; 4],
    unanswered: AtomicUsize,
    done: AtomicUsize,
    /// Per kind of operation ([`ALL`], [`TIMED_OUT`], …), the answer times in milliseconds.
    answer_ms: std::sync::Mutex<[Vec<u64>; 4]>,
}

impl Counters {
    /// An operation of `fault` sent first at `since` is answered.
    fn answered(&self, fault: Fault, since: std::time::Instant) {
        let ms = since.elapsed().as_millis() as u64;
        let mut times = self.answer_ms.lock().unwrap_or_else(|e| e.into_inner());
        times[ALL].push(ms);
        if let Some(kind) = fault.times() {
            times[kind].push(ms);
        }
    }

    /// The answer times of the operations of kind `kind`.
    fn times(&self, kinds: &[usize]) -> AnswerTimes {
        let times = self.answer_ms.lock().unwrap_or_else(|e| e.into_inner());
        let ms: Vec<u64> = kinds.iter().flat_map(|&k| times[k].clone()).collect();
        AnswerTimes::of(&ms)
    }

    fn record(&self, fault: Fault, answer: &Result<idem_http::client::ToolAnswer, ClientError>) {
        match answer {
            Ok(a) => {
                self.attempts
                    .fetch_add(a.attempts as usize, Ordering::Relaxed);
                self.conflicts
                    .fetch_add(a.in_flight as usize, Ordering::Relaxed);
                if let Some(kind) = fault.times() {
                    self.conflicts_by[kind].fetch_add(a.in_flight as usize, Ordering::Relaxed);
                }
                if a.replayed {
                    self.replays.fetch_add(1, Ordering::Relaxed);
                } else {
                    self.executed.fetch_add(1, Ordering::Relaxed);
                }
            }
            Err(ClientError::DeadlineExceeded(DeadlineExceeded { attempts, .. })) => {
                self.attempts
                    .fetch_add(*attempts as usize, Ordering::Relaxed);
                self.unanswered.fetch_add(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.attempts.fetch_add(1, Ordering::Relaxed);
                self.unanswered.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

/// Runs the agents' traffic against the tool — behind idem (`with_idem`) or bare — and counts.
pub async fn run(options: &DemoOptions, with_idem: bool) -> Result<DemoReport, BoxError> {
    let backend = Backend::open(&options.store).await?;
    let serve = ServeOptions {
        tool_latency: options.tool_latency,
        demo_faults: true,
        ..ServeOptions::default()
    };
    let min_deadline = serve.min_client_deadline();
    let app = if with_idem {
        router(backend.clone(), serve)?
    } else {
        router_without_idem(backend.clone(), serve)
    };
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let tenant = format!("demo-{:016x}", rand::random::<u64>());
    let run_id = format!("run-{:08x}", rand::random::<u32>());
    let url = format!("{base}/tools/create_ticket");
    let patient = RetryPolicy {
        attempt_timeout: min_deadline + Duration::from_millis(500),
        // Room for a crashed holder: its lease, then a takeover or a reconciliation, then a run.
        overall_deadline: min_deadline * 4,
        initial_backoff: Duration::from_millis(50),
        max_backoff: Duration::from_millis(500),
        allow_short_attempts: false,
    };
    // Read the tool's published minimum deadline, as an agent runtime would.
    let client = ToolClient::discover(
        &format!("{base}/tools"),
        "create_ticket",
        url.clone(),
        patient,
    )
    .await?;
    let hasty = ToolClient::new(
        url.clone(),
        RetryPolicy {
            attempt_timeout: options.tool_latency / 2,
            allow_short_attempts: true, // the fault under test
            ..patient
        },
        client.min_client_deadline(),
    )?;
    let crashing = ToolClient::new(url.clone(), patient, None)?
        .with_header(DEMO_FAULT_HEADER, "hang")
        .with_header(TENANT_HEADER, &tenant);
    let (client, hasty) = (
        client.with_header(TENANT_HEADER, &tenant),
        hasty.with_header(TENANT_HEADER, &tenant),
    );
    let (client, hasty, crashing) = match options.wait {
        true => (client, hasty, crashing),
        false => (
            client.without_wait(),
            hasty.without_wait(),
            crashing.without_wait(),
        ),
    };

    let progress = Progress::new(options.progress, options.operations);
    let counters = Arc::new(Counters::default());
    let slots = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..options.operations {
        let permit = slots.clone().acquire_owned().await?;
        let (client, hasty, crashing) = (client.clone(), hasty.clone(), crashing.clone());
        let shared = counters.clone();
        let key = IdempotencyKey::for_step(&run_id, &format!("step-{i}"), "create_ticket")?;
        let args = json!({"title": format!("Ticket {i}"), "account_id": format!("A-{}", i % 17)});
        tasks.spawn(async move {
            let _permit = permit;
            let counters = shared;
            let sent = std::time::Instant::now();
            let fault = Fault::of(i);
            match fault {
                Fault::CallAgain => {
                    counters.record(fault, &client.call(&key, &args).await);
                    counters.answered(fault, sent);
                    counters.record(fault, &client.call(&key, &args).await);
                }
                Fault::ShortDeadline => counters.record(fault, &hasty.call(&key, &args).await),
                Fault::DuplicateSend => {
                    let (a, b) = tokio::join!(client.call(&key, &args), client.call(&key, &args));
                    counters.record(fault, &a);
                    counters.record(fault, &b);
                }
                Fault::CrashedHolder => counters.record(fault, &crashing.call(&key, &args).await),
            }
            if fault != Fault::CallAgain {
                counters.answered(fault, sent);
            }
            counters.done.fetch_add(1, Ordering::Relaxed);
        });
        progress.show(counters.done.load(Ordering::Relaxed));
    }
    while tasks.join_next().await.is_some() {
        progress.show(counters.done.load(Ordering::Relaxed));
    }
    progress.finish();
    server.abort();
    Ok(DemoReport {
        operations: options.operations,
        attempts: counters.attempts.load(Ordering::Relaxed),
        executed: counters.executed.load(Ordering::Relaxed),
        replays: counters.replays.load(Ordering::Relaxed),
        conflicts: counters.conflicts.load(Ordering::Relaxed),
        conflicts_timed_out: counters.conflicts_by[TIMED_OUT].load(Ordering::Relaxed),
        conflicts_sent_twice: counters.conflicts_by[SENT_TWICE].load(Ordering::Relaxed),
        conflicts_hung: counters.conflicts_by[HUNG].load(Ordering::Relaxed),
        unanswered: counters.unanswered.load(Ordering::Relaxed),
        tickets: backend.ticket_count(&tenant).await?,
        double_effects: backend.double_effects(&tenant).await?,
        answer_p50_ms: counters.times(&[ALL]).p50_ms,
        answer_p99_ms: counters.times(&[ALL]).p99_ms,
        retried_while_running: counters.times(&[TIMED_OUT, SENT_TWICE]),
        attempt_timed_out: counters.times(&[TIMED_OUT]),
        sent_twice: counters.times(&[SENT_TWICE]),
        holder_hung: counters.times(&[HUNG]),
    })
}

/// Progress on stderr: an `indicatif` bar on a terminal; elsewhere (a pipe, a log file) a plain
/// line per 10%, never a carriage return.
struct Progress {
    bar: Option<indicatif::ProgressBar>,
    lines: bool,
    total: usize,
    shown: AtomicUsize,
}

impl Progress {
    fn new(on: bool, total: usize) -> Self {
        use std::io::IsTerminal;
        let terminal = on && std::io::stderr().is_terminal();
        let bar = terminal.then(|| {
            let bar = indicatif::ProgressBar::new(total as u64);
            if let Ok(style) =
                indicatif::ProgressStyle::with_template("  [{bar:30}] {pos}/{len} operations")
            {
                bar.set_style(style.progress_chars("#> "));
            }
            bar
        });
        Self {
            bar,
            lines: on && !terminal,
            total,
            shown: AtomicUsize::new(usize::MAX),
        }
    }

    fn show(&self, done: usize) {
        if let Some(bar) = &self.bar {
            bar.set_position(done as u64);
        } else if self.lines
            && self.shown.swap(done, Ordering::Relaxed) != done
            && (done.is_multiple_of((self.total / 10).max(1)) || done == self.total)
        {
            eprintln!("  {done}/{} operations", self.total);
        }
    }

    fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}

/// `idem demo`: runs the demo on `store` (a fresh SQLite file in a temp directory, removed
/// afterwards, when `None`) with the options `options` makes for it, prints the closing table
/// (and the same traffic without idem when `without_idem`), and fails if any operation produced
/// two tickets.
pub async fn run_cli(
    store: Option<StoreUrl>,
    options: impl FnOnce(StoreUrl) -> DemoOptions,
    without_idem: bool,
) -> Result<(), Failure> {
    let _temp;
    let store = match store {
        Some(store) => store,
        None => {
            let dir = std::env::temp_dir().join(format!("idem-demo-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(Failure::other)?;
            _temp = RemoveOnDrop(dir.clone());
            format!("sqlite://{}", dir.join("demo.db").display()).parse()?
        }
    };
    let options = options(store);
    println!(
        "idem demo: {} operations, {} at a time, tool latency {} ms, store {}",
        options.operations,
        options.concurrency,
        options.tool_latency.as_millis(),
        options.store
    );
    println!(
        "faults: attempt deadlines shorter than the tool, duplicate concurrent sends, a repeat after success, holders that crash mid-flight"
    );
    println!(
        "retries {} (answer = time from an operation's first send to its answer)",
        match options.wait {
            true =>
                "wait for an in-flight answer (Prefer: wait; --no-wait for 409 and Retry-After)",
            false => "are answered 409 while the first runs (--no-wait)",
        }
    );
    let with = run(&options, true).await.map_err(demo_failure)?;
    let without = if without_idem {
        eprintln!("the same traffic without idem:");
        Some(run(&options, false).await.map_err(demo_failure)?)
    } else {
        None
    };
    println!();
    print!("{}", table(&with, without.as_ref()));
    if with.double_effects > 0 {
        return Err(Failure::suite_failed(format!(
            "{} operations produced two tickets",
            with.double_effects
        )));
    }
    if let Some(w) = without {
        println!(
            "\nwithout idem the same traffic produced {} duplicate tickets over {} operations.",
            w.tickets - w.operations as i64,
            w.double_effects
        );
    }
    Ok(())
}

/// A store that cannot be opened keeps its exit code (usage or store unavailable).
pub(crate) fn demo_failure(e: BoxError) -> Failure {
    match e.downcast::<idemkit::OpenError>() {
        Ok(e) => Failure::from(*e),
        Err(e) => Failure::other(e),
    }
}

/// Removes a directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
