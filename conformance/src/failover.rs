//! A failover workload for stores that replicate: concurrent callers run the [`Executor`] while a
//! fault the caller supplies (kill a primary, promote its replica) happens mid-run, and every
//! effect is counted at a sink outside the store.
//!
//! [`run`] drives it in three phases and returns a [`FailoverReport`]:
//!
//! 1. `callers` tasks settle `keys` keys between them (each key retried until it completes,
//!    replays, is fenced or is stale); once `fault_after` keys are settled the fault runs, and may
//!    hand over a new executor (a store connected to the promoted server).
//! 2. Every key is run once more, as a client that never got the first answer would: a lost
//!    record turns this repeat into a second execution, counted as a double effect.
//! 3. After one lease, each key's record is read and `list_in_flight` asked: every key must end
//!    `completed`, `failed_retryable`, or `processing` and listed for reconciliation.
//!
//! Real time and real servers: the tool sleeps `tool_latency`, callers back off 50 ms on
//! `Unavailable`. The caller asserts on the report (zero double effects where the store waits
//! for its replicas) or only prints it (where it does not).
//!
//! **Not a stable API.** The knobs of [`FailoverRun`] and the counts of [`FailoverReport`] follow
//! the failover tests of idem's own stores and may change in a minor release; the guarantee
//! [`FailoverReport::assert_no_claim_lost`] checks does not.

use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use idem_core::{
    Error, Executor, Fingerprint, IdempotencyKey, KeyStore, Outcome, RecordId, RecordState, Scope,
};

/// The shape of one run.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct FailoverRun {
    /// The scope every key lives in (make it unique per run).
    pub scope: Scope,
    /// How many keys (logical operations).
    pub keys: usize,
    /// How many concurrent callers share them.
    pub callers: usize,
    /// How long the tool takes per execution.
    pub tool_latency: Duration,
    /// The fault runs once this many keys are settled.
    pub fault_after: usize,
    /// Calls still failing this long after the run started give their key up (counted
    /// `unsettled`): bounds the run when the store does not recover.
    pub settle_timeout: Duration,
}

impl FailoverRun {
    /// 300 keys, 8 callers, a 10 ms tool, the fault after 100 keys, 30 s to settle them all.
    pub fn new(scope: Scope) -> Self {
        Self {
            scope,
            keys: 300,
            callers: 8,
            tool_latency: Duration::from_millis(10),
            fault_after: 100,
            settle_timeout: Duration::from_secs(30),
        }
    }
}

/// What a run counted. Every figure is from the sink or from the store after the run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FailoverReport {
    /// Keys run.
    pub keys: usize,
    /// Times the tool ran, over all keys.
    pub executions: u64,
    /// Keys whose tool ran more than once.
    pub double_effects: usize,
    /// Keys whose tool never ran.
    pub never_ran: usize,
    /// Calls answered `StoreError::Unavailable` (or `NotRecorded` with an unavailable store).
    pub unavailable: usize,
    /// Calls answered `Unavailable` after the fault had finished, before the first success.
    pub unavailable_after_fault: usize,
    /// Calls after the fault that succeeded (the callers recovered).
    pub succeeded_after_fault: usize,
    /// Calls whose tool ran but whose outcome was not recorded.
    pub not_recorded: usize,
    /// Keys ending `completed`.
    pub completed: usize,
    /// Keys ending `failed_retryable`.
    pub retryable: usize,
    /// Keys ending `processing` and listed by `list_in_flight` (for reconciliation).
    pub for_reconciliation: usize,
    /// Keys ending `processing` but not listed (a defect).
    pub unlisted: usize,
    /// Keys with no record at the end (a defect: the repeat would have made one).
    pub absent: usize,
    /// Keys a caller gave up on (still failing after `settle_timeout`).
    pub unsettled: usize,
    /// Other errors, as text (a defect).
    pub errors: Vec<String>,
    /// How long the fault took.
    pub fault_ms: u128,
    /// Whole run, milliseconds.
    pub total_ms: u128,
}

impl FailoverReport {
    /// Whether every key ended completed, retryable or listed for reconciliation, and nothing
    /// else went wrong (double effects are judged by the caller).
    pub fn all_accounted_for(&self) -> bool {
        self.unlisted == 0 && self.absent == 0 && self.unsettled == 0 && self.errors.is_empty()
    }

    /// Panics (printing the report) unless the run kept the guarantee: no key's tool ran twice,
    /// every key is [accounted for](FailoverReport::all_accounted_for), and every key ended
    /// completed, retryable or listed for reconciliation.
    #[track_caller]
    pub fn assert_no_claim_lost(&self) {
        assert_eq!(self.double_effects, 0, "{self}");
        assert!(self.all_accounted_for(), "{self}");
        assert_eq!(
            self.completed + self.retryable + self.for_reconciliation,
            self.keys,
            "{self}"
        );
    }
}

impl fmt::Display for FailoverReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "keys {} | executions {} | double effects {} | never ran {} | unavailable answers {} \
             (after the fault {}, then {} successes) | not recorded {} | end: completed {}, \
             retryable {}, for reconciliation {}, unlisted {}, absent {}, unsettled {} | \
             errors {} | fault {} ms | run {} ms",
            self.keys,
            self.executions,
            self.double_effects,
            self.never_ran,
            self.unavailable,
            self.unavailable_after_fault,
            self.succeeded_after_fault,
            self.not_recorded,
            self.completed,
            self.retryable,
            self.for_reconciliation,
            self.unlisted,
            self.absent,
            self.unsettled,
            self.errors.len(),
            self.fault_ms,
            self.total_ms
        )
    }
}

enum Settled {
    Done,
    Stale,
    Gave,
    Failed(String),
}

struct Shared {
    executor: RwLock<Arc<Executor>>,
    effects: Vec<AtomicU32>,
    settled: AtomicUsize,
    fault_done: std::sync::atomic::AtomicBool,
    recovered: std::sync::atomic::AtomicBool,
    unavailable: AtomicUsize,
    unavailable_after_fault: AtomicUsize,
    succeeded_after_fault: AtomicUsize,
    not_recorded: AtomicUsize,
    last_error: std::sync::Mutex<String>,
    started: Instant,
    run: FailoverRun,
}

fn key(i: usize) -> IdempotencyKey {
    IdempotencyKey::new(format!("op-{i:05}")).expect("a valid key")
}

fn fingerprint(i: usize) -> Fingerprint {
    Fingerprint::of("failover", &serde_json::json!({ "i": i })).expect("a fingerprint")
}

impl Shared {
    fn executor(&self) -> Arc<Executor> {
        self.executor
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn unavailable(&self) {
        self.unavailable.fetch_add(1, Ordering::Relaxed);
        if self.fault_done.load(Ordering::SeqCst) && !self.recovered.load(Ordering::SeqCst) {
            self.unavailable_after_fault.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn success(&self) {
        if self.fault_done.load(Ordering::SeqCst) {
            self.recovered.store(true, Ordering::SeqCst);
            self.succeeded_after_fault.fetch_add(1, Ordering::Relaxed);
        }
    }

    async fn settle(self: &Arc<Self>, i: usize) -> Settled {
        let deadline = self.started + self.run.settle_timeout;
        let (k, fp) = (key(i), fingerprint(i));
        loop {
            if Instant::now() >= deadline {
                return Settled::Gave;
            }
            let executor = self.executor();
            let sink = self.clone();
            let answer = executor
                .run(&self.run.scope, &k, &fp, |_attempt| async move {
                    sink.effects[i].fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(sink.run.tool_latency).await;
                    Outcome::definitive(200, &serde_json::json!({ "op": i })).expect("an outcome")
                })
                .await;
            match answer {
                Ok(_) | Err(Error::Fenced { .. }) => {
                    self.success();
                    return Settled::Done;
                }
                Err(Error::InFlight { stale: true, .. }) => return Settled::Stale,
                Err(Error::InFlight { retry_after, .. }) => {
                    tokio::time::sleep(retry_after.min(Duration::from_millis(100))).await;
                }
                Err(Error::Store(e)) if e.is_unavailable() => {
                    *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = format!("{e:?}");
                    self.unavailable();
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(Error::NotRecorded { source, .. }) => {
                    self.not_recorded.fetch_add(1, Ordering::Relaxed);
                    if source.is_unavailable() {
                        self.unavailable();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(other) => return Settled::Failed(format!("{}: {other}", k.as_str())),
            }
        }
    }
}

/// Runs the workload on `executor`, running `fault` mid-run; a fault that returns an executor
/// hands the remaining calls to it (e.g. a store connected to the promoted server).
pub async fn run<F, Fut>(executor: Executor, run: FailoverRun, fault: F) -> FailoverReport
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = Option<Executor>> + Send + 'static,
{
    let started = Instant::now();
    let shared = Arc::new(Shared {
        executor: RwLock::new(Arc::new(executor)),
        effects: (0..run.keys).map(|_| AtomicU32::new(0)).collect(),
        settled: AtomicUsize::new(0),
        fault_done: Default::default(),
        recovered: Default::default(),
        unavailable: AtomicUsize::new(0),
        unavailable_after_fault: AtomicUsize::new(0),
        succeeded_after_fault: AtomicUsize::new(0),
        not_recorded: AtomicUsize::new(0),
        last_error: Default::default(),
        started,
        run: run.clone(),
    });
    let mut report = FailoverReport {
        keys: run.keys,
        ..FailoverReport::default()
    };

    let mut fault_task = Some({
        let shared = shared.clone();
        tokio::spawn(async move {
            while shared.settled.load(Ordering::SeqCst)
                < shared.run.fault_after.min(shared.run.keys)
            {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            let t0 = Instant::now();
            if let Some(next) = fault().await {
                *shared.executor.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(next);
            }
            shared.fault_done.store(true, Ordering::SeqCst);
            t0.elapsed().as_millis()
        })
    });

    let progress = {
        let shared = shared.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(2)).await;
                eprintln!(
                    "failover run: {} settled, {} unavailable, last error {}",
                    shared.settled.load(Ordering::SeqCst),
                    shared.unavailable.load(Ordering::SeqCst),
                    shared.last_error.lock().unwrap_or_else(|e| e.into_inner())
                );
            }
        })
    };

    // Phases 1 and 2: each caller settles its share of the keys, twice.
    for phase in 0..2 {
        let mut callers = Vec::new();
        for c in 0..run.callers.max(1) {
            let shared = shared.clone();
            callers.push(tokio::spawn(async move {
                let mut failures = Vec::new();
                let mut gave = 0;
                for i in (c..shared.run.keys).step_by(shared.run.callers.max(1)) {
                    match shared.settle(i).await {
                        Settled::Done | Settled::Stale => {}
                        Settled::Gave => gave += 1,
                        Settled::Failed(e) => failures.push(e),
                    }
                    shared.settled.fetch_add(1, Ordering::SeqCst);
                }
                (failures, gave)
            }));
        }
        for caller in callers {
            let (failures, gave) = caller.await.expect("a caller panicked");
            report.errors.extend(failures);
            if phase == 1 {
                report.unsettled += gave;
            }
        }
        if let Some(task) = fault_task.take() {
            // The fault must have happened before the repeat.
            report.fault_ms = task.await.expect("the fault panicked");
        }
    }

    progress.abort();
    // Phase 3: once a lease has passed, every processing record must be listed as stale.
    let executor = shared.executor();
    tokio::time::sleep(executor.policy().lease() + Duration::from_millis(100)).await;
    let store: &Arc<dyn KeyStore> = executor.store();
    let now = executor.clock().now();
    let listed: HashSet<String> = match store.list_in_flight(now, run.keys * 2 + 16).await {
        Ok(records) => records
            .into_iter()
            .filter(|r| r.scope == run.scope)
            .map(|r| r.key.as_str().to_owned())
            .collect(),
        Err(e) => {
            report.errors.push(format!("list_in_flight: {e}"));
            HashSet::new()
        }
    };
    for (i, effects) in shared.effects.iter().enumerate() {
        let n = effects.load(Ordering::SeqCst);
        report.executions += u64::from(n);
        if n >= 2 {
            report.double_effects += 1;
        }
        if n == 0 {
            report.never_ran += 1;
        }
        match store
            .get(&RecordId::new(run.scope.clone(), key(i)), now)
            .await
        {
            Ok(Some(r)) => match r.state {
                RecordState::Completed => report.completed += 1,
                RecordState::FailedRetryable => report.retryable += 1,
                RecordState::Processing if listed.contains(key(i).as_str()) => {
                    report.for_reconciliation += 1
                }
                RecordState::Processing => report.unlisted += 1,
            },
            Ok(None) => report.absent += 1,
            Err(e) => report.errors.push(format!("get {}: {e}", key(i).as_str())),
        }
    }
    report.unavailable = shared.unavailable.load(Ordering::SeqCst);
    report.unavailable_after_fault = shared.unavailable_after_fault.load(Ordering::SeqCst);
    report.succeeded_after_fault = shared.succeeded_after_fault.load(Ordering::SeqCst);
    report.not_recorded = shared.not_recorded.load(Ordering::SeqCst);
    report.total_ms = started.elapsed().as_millis();
    report
}
