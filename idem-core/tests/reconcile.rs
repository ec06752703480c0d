//! Reconciliation settles stale claims by asking the downstream system; purge empties expired
//! records in batches. Effects are counted downstream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_conformance::kit::{FaultStore, Op};
use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::reconcile::{
    Finding, Probe, PurgePace, Reconciler, purge_expired_all, purge_expired_paced,
};
use idem_core::{
    Clock, Executor, Fingerprint, IdempotencyKey, KeyStore, ManualClock, MemoryStore, Outcome,
    Policy, Record, RecordId, RecordState, Scope, StalePolicy, Timestamp, async_trait,
    downstream_key,
};
use serde_json::json;

/// The downstream system: tickets by their external (downstream) key.
#[derive(Default, Clone)]
struct Helpdesk {
    tickets: Arc<Mutex<HashMap<String, String>>>,
    reachable: Arc<Mutex<bool>>,
}

#[async_trait]
impl Probe for Helpdesk {
    async fn probe(&self, record: &Record) -> Finding {
        if !*self.reachable.lock().unwrap() {
            return Finding::Unknown;
        }
        let external = downstream_key(&record.scope, &record.key, "helpdesk");
        match self.tickets.lock().unwrap().get(&external) {
            Some(id) => {
                Finding::Happened(Outcome::definitive(201, &json!({"ticket_id": id})).unwrap())
            }
            None => Finding::NotHappened,
        }
    }
}

struct World {
    store: MemoryStore,
    clock: ManualClock,
    policy: Policy,
    helpdesk: Helpdesk,
    scope: Scope,
    fp: Fingerprint,
}

fn world() -> World {
    let helpdesk = Helpdesk::default();
    *helpdesk.reachable.lock().unwrap() = true;
    World {
        store: MemoryStore::new(),
        clock: ManualClock::new(Timestamp::from_millis(1_700_000_000_000)),
        policy: Policy::builder()
            .lease(Duration::from_secs(30))
            .build()
            .unwrap(),
        helpdesk,
        scope: Scope::new("tenant/create_ticket").unwrap(),
        fp: Fingerprint::of("create_ticket", &json!({"title": "x"})).unwrap(),
    }
}

impl World {
    /// The record of `key` now (it must exist).
    async fn record(&self, key: &IdempotencyKey) -> Record {
        self.store
            .get(
                &RecordId::new(self.scope.clone(), key.clone()),
                self.clock.now(),
            )
            .await
            .unwrap()
            .unwrap()
    }

    fn reconciler(&self) -> Reconciler<Helpdesk> {
        Reconciler::new(
            Arc::new(self.store.clone()),
            Arc::new(self.clock.clone()),
            self.policy,
            self.helpdesk.clone(),
        )
    }

    /// A holder that claims `key`, maybe does the effect downstream, and then dies.
    async fn crashed_holder(
        &self,
        key: &str,
        did_effect: bool,
    ) -> (IdempotencyKey, idem_core::Token) {
        let key = IdempotencyKey::new(key).unwrap();
        let ClaimAnswer::Claimed { token, .. } = self
            .store
            .claim(
                &RecordId::new(self.scope.clone(), key.clone()),
                &self.fp,
                &self.policy,
                self.clock.now(),
            )
            .await
            .unwrap()
        else {
            panic!("claim")
        };
        if did_effect {
            let external = downstream_key(&self.scope, &key, "helpdesk");
            self.helpdesk
                .tickets
                .lock()
                .unwrap()
                .insert(external, "T-1".into());
        }
        (key, token)
    }

    fn executor(&self) -> Executor {
        Executor::new(self.store.clone())
            .with_policy(self.policy)
            .with_clock(self.clock.clone())
    }

    fn effects(&self) -> usize {
        self.helpdesk.tickets.lock().unwrap().len()
    }
}

#[tokio::test]
async fn an_effect_that_happened_is_completed_and_replays() {
    let w = world();
    let (key, old) = w.crashed_holder("k-happened", true).await;
    // Before the lease ends there is nothing to reconcile.
    assert_eq!(w.reconciler().run_once().await.unwrap().examined, 0);
    w.clock.advance(Duration::from_secs(31));
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!((report.examined, report.completed), (1, 1));
    let r = w.record(&key).await;
    assert_eq!(r.state, RecordState::Completed);
    // The retry replays the reconciled answer; no second ticket.
    let again = w
        .executor()
        .run(&w.scope, &key, &w.fp, |_| async {
            unreachable!("replayed")
        })
        .await
        .unwrap();
    assert!(again.is_replay());
    assert_eq!(again.outcome().body_json()["ticket_id"], "T-1");
    assert_eq!(w.effects(), 1);
    // The original holder, waking up late, is fenced.
    let late = Outcome::definitive(201, &json!({"ticket_id": "T-late"})).unwrap();
    assert_eq!(
        w.store
            .complete(
                &RecordId::new(w.scope.clone(), key.clone()),
                old,
                &late,
                &w.policy,
                w.clock.now()
            )
            .await
            .unwrap(),
        CompleteAnswer::Fenced
    );
}

/// A probe that keeps the token of each record it was shown, and finds the effect done.
struct Tokens(Arc<Mutex<Vec<idem_core::Token>>>);

#[async_trait]
impl Probe for Tokens {
    async fn probe(&self, record: &Record) -> Finding {
        self.0.lock().unwrap().push(record.token);
        Finding::Happened(Outcome::definitive(201, &json!({"ticket_id": "T-1"})).unwrap())
    }
}

/// The probe is shown the record as the reconciler took it over: with the token the finding is
/// then written with, not the stale holder's.
#[tokio::test]
async fn the_probe_sees_the_record_under_the_reconcilers_token() {
    let w = world();
    let (key, stale) = w.crashed_holder("k-token", true).await;
    w.clock.advance(Duration::from_secs(31));
    let shown = Arc::new(Mutex::new(Vec::new()));
    let report = Reconciler::new(
        Arc::new(w.store.clone()),
        Arc::new(w.clock.clone()),
        w.policy,
        Tokens(shown.clone()),
    )
    .run_once()
    .await
    .unwrap();
    assert_eq!(report.completed, 1);
    let settled = w.record(&key).await;
    assert_eq!(settled.state, RecordState::Completed);
    assert_ne!(settled.token, stale);
    assert_eq!(*shown.lock().unwrap(), vec![settled.token]);
}

#[tokio::test]
async fn an_effect_that_did_not_happen_is_released_and_runs_once_on_retry() {
    let w = world();
    let (key, _) = w.crashed_holder("k-not", false).await;
    w.clock.advance(Duration::from_secs(31));
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!((report.examined, report.released), (1, 1));
    assert_eq!(w.record(&key).await.state, RecordState::FailedRetryable);
    let helpdesk = w.helpdesk.clone();
    let (scope, k2) = (w.scope.clone(), key.clone());
    let run = w
        .executor()
        .run(&w.scope, &key, &w.fp, |_| async move {
            helpdesk
                .tickets
                .lock()
                .unwrap()
                .insert(downstream_key(&scope, &k2, "helpdesk"), "T-2".into());
            Outcome::definitive(201, &json!({"ticket_id": "T-2"})).unwrap()
        })
        .await
        .unwrap();
    assert!(!run.is_replay());
    assert_eq!(w.effects(), 1, "exactly one ticket");
}

/// `stale_for` holds a record back until its lease has been over that long: a claim whose lease
/// ended 5 s ago is left to its holder (nothing probed, nothing written), one whose lease ended
/// 15 s ago is settled.
#[tokio::test]
async fn stale_for_leaves_a_claim_whose_lease_ended_more_recently() {
    let w = world();
    let (early, early_token) = w.crashed_holder("k-early", false).await;
    w.clock.advance(Duration::from_secs(10));
    let (late, late_token) = w.crashed_holder("k-late", false).await;
    // `k-early`'s lease ended 15 s ago, `k-late`'s 5 s ago.
    w.clock.advance(Duration::from_secs(35));
    let report = w
        .reconciler()
        .stale_for(Duration::from_secs(10))
        .run_once()
        .await
        .unwrap();
    assert_eq!((report.examined, report.released), (1, 1));
    let (early, late) = (w.record(&early).await, w.record(&late).await);
    assert_eq!(early.state, RecordState::FailedRetryable);
    assert_ne!(early.token, early_token, "taken over to be released");
    assert_eq!(
        (late.state, late.token),
        (RecordState::Processing, late_token),
        "left to its holder"
    );
}

#[tokio::test]
async fn unknown_is_left_and_reported_with_the_original_holder_fenced() {
    let w = world();
    *w.helpdesk.reachable.lock().unwrap() = false;
    let (key, old) = w.crashed_holder("k-unknown", true).await;
    w.clock.advance(Duration::from_secs(31));
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!(report.unknown.len(), 1);
    assert_eq!(report.unknown[0].key, key);
    let r = w.record(&key).await;
    assert_eq!(r.state, RecordState::Processing, "left processing");
    assert_ne!(r.token, old, "taken over: the original holder is fenced");
    // A retry meanwhile is in flight, not a second effect.
    let err = w
        .executor()
        .run(&w.scope, &key, &w.fp, |_| async { unreachable!() })
        .await
        .unwrap_err();
    assert!(matches!(err, idem_core::Error::InFlight { .. }));
    // Once the helpdesk answers, the next pass (after the reconciler's own lease) settles it.
    *w.helpdesk.reachable.lock().unwrap() = true;
    w.clock.advance(Duration::from_secs(31));
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!(report.completed, 1);
    assert_eq!(w.effects(), 1);
}

#[tokio::test]
async fn a_claim_taken_over_elsewhere_is_not_reconciled() {
    let w = world();
    let (key, _) = w.crashed_holder("k-moved", false).await;
    w.clock.advance(Duration::from_secs(31));
    // Another process took it over first: its lease runs, so the record is not stale.
    let takeover = w
        .policy
        .to_builder()
        .stale(StalePolicy::Takeover)
        .build()
        .unwrap();
    let answer = w
        .store
        .claim(
            &RecordId::new(w.scope.clone(), key.clone()),
            &w.fp,
            &takeover,
            w.clock.now(),
        )
        .await
        .unwrap();
    assert!(matches!(answer, ClaimAnswer::Claimed { .. }));
    let report = w.reconciler().run_once().await.unwrap();
    assert_eq!(
        (
            report.examined,
            report.completed,
            report.released,
            report.skipped
        ),
        (0, 0, 0, 0),
        "a running lease is left alone"
    );
    assert!(report.unknown.is_empty() && report.failed.is_empty());
}

#[tokio::test]
async fn purge_runs_batches_until_none_are_left_and_keeps_live_records() {
    let w = world();
    let short = Policy::builder()
        .lease(Duration::from_secs(1))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    for i in 0..5 {
        let key = IdempotencyKey::new(format!("old-{i}")).unwrap();
        w.store
            .claim(
                &RecordId::new(w.scope.clone(), key.clone()),
                &w.fp,
                &short,
                w.clock.now(),
            )
            .await
            .unwrap();
    }
    w.clock.advance(Duration::from_secs(61));
    for i in 0..2 {
        let key = IdempotencyKey::new(format!("live-{i}")).unwrap();
        w.store
            .claim(
                &RecordId::new(w.scope.clone(), key.clone()),
                &w.fp,
                &short,
                w.clock.now(),
            )
            .await
            .unwrap();
    }
    let mut seen = Vec::new();
    let report = purge_expired_all(&w.store, &w.clock, 2, None, |r| seen.push(r.deleted))
        .await
        .unwrap();
    assert_eq!(
        (report.deleted, report.batches, report.stopped_at_deadline),
        (5, 3, false)
    );
    assert_eq!(seen, [2, 4, 5], "progress after each batch");
    assert_eq!(w.store.len(), 2, "live records stay");
    // A deadline already passed stops before deleting anything.
    let stopped = purge_expired_all(&w.store, &w.clock, 2, Some(w.clock.now()), |_| {})
        .await
        .unwrap();
    assert!(stopped.stopped_at_deadline);
    assert_eq!(stopped.deleted, 0);
}

/// `n` records claimed under a one-minute ttl, then the clock moved past it.
async fn expired_records(w: &World, store: &dyn KeyStore, n: usize) {
    let short = Policy::builder()
        .lease(Duration::from_secs(1))
        .ttl(Duration::from_secs(60))
        .build()
        .unwrap();
    for i in 0..n {
        let key = IdempotencyKey::new(format!("old-{i}")).unwrap();
        store
            .claim(
                &RecordId::new(w.scope.clone(), key.clone()),
                &w.fp,
                &short,
                w.clock.now(),
            )
            .await
            .unwrap();
    }
    w.clock.advance(Duration::from_secs(61));
}

#[tokio::test]
async fn a_paced_purge_rests_after_each_full_batch_at_least_as_long_as_the_duty_cycle_asks() {
    let w = world();
    // Each batch takes at least 5 ms in the store.
    let store = FaultStore::new(w.store.clone());
    store.before(Op::PurgeExpired, |_| async {
        tokio::time::sleep(Duration::from_millis(5)).await;
        Ok(())
    });
    expired_records(&w, &store, 7).await;
    // Each rest, and the instants that bound the batch before it: it started after the call (or
    // the rest before it) and had ended when `on_batch` saw it.
    let rests = Mutex::new(Vec::new());
    let starts = Mutex::new(vec![std::time::Instant::now()]);
    let mut ends = Vec::new();
    let sleep = |d: Duration| {
        rests.lock().unwrap().push(d);
        starts.lock().unwrap().push(std::time::Instant::now());
        std::future::ready(())
    };
    // Duty 1/3: rest twice as long as each batch took.
    let pace = PurgePace::new(3).duty(1.0 / 3.0).unwrap();
    let report = purge_expired_paced(&store, &w.clock, pace, sleep, |_| {
        ends.push(std::time::Instant::now())
    })
    .await
    .unwrap();
    assert_eq!((report.deleted, report.batches), (7, 3));
    assert_eq!(w.store.len(), 0, "every expired record is gone");
    let rests = rests.into_inner().unwrap();
    assert_eq!(
        rests.len(),
        2,
        "a rest after each full batch, none after the short last one"
    );
    let starts = starts.into_inner().unwrap();
    for (k, rest) in rests.into_iter().enumerate() {
        assert!(
            rest >= Duration::from_millis(10),
            "rest {rest:?} < 2 × 5 ms"
        );
        // And no longer than twice the batch (at most the time between its bounds).
        let at_most = ends[k] - starts[k];
        assert!(
            rest <= at_most * 2 + Duration::from_micros(1),
            "rest {rest:?} > 2 × {at_most:?}"
        );
    }
}

#[tokio::test]
async fn an_unpaced_purge_never_sleeps_and_a_deadline_stops_a_paced_one_before_a_batch() {
    let w = world();
    expired_records(&w, &w.store, 4).await;
    let slept = Mutex::new(0);
    let sleep = |_| {
        *slept.lock().unwrap() += 1;
        std::future::ready(())
    };
    let stopped = purge_expired_paced(
        &w.store,
        &w.clock,
        PurgePace::new(2).duty(0.5).unwrap().deadline(w.clock.now()),
        sleep,
        |_| {},
    )
    .await
    .unwrap();
    assert!(stopped.stopped_at_deadline);
    assert_eq!((stopped.deleted, w.store.len()), (0, 4), "nothing deleted");
    let report = purge_expired_paced(&w.store, &w.clock, PurgePace::new(2), sleep, |_| {})
        .await
        .unwrap();
    assert_eq!((report.deleted, report.batches), (4, 3));
    assert_eq!(*slept.lock().unwrap(), 0, "duty cycle 1 runs flat out");
}

#[test]
fn a_duty_cycle_outside_zero_to_one_is_refused() {
    for bad in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
        let error = PurgePace::new(10).duty(bad).unwrap_err();
        assert!(
            error.to_string().contains("greater than 0 and at most 1"),
            "{error}"
        );
    }
    let pace = PurgePace::new(0).duty(1.0).unwrap();
    assert_eq!(
        (pace.batch_size(), pace.duty_cycle()),
        (1, 1.0),
        "a batch holds a record at least"
    );
    // What `idem purge` reports of its pace reads back as given.
    let pace = PurgePace::new(250).duty(0.25).unwrap();
    assert_eq!((pace.batch_size(), pace.duty_cycle()), (250, 0.25));
}

/// The log lines written while it lives (this thread's, so a current-thread runtime's tasks too).
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<u8>>>);

impl std::io::Write for Log {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Log {
    /// Captures this thread's `idem_core` info lines until the guard is dropped.
    fn capture() -> (Log, tracing::subscriber::DefaultGuard) {
        let log = Log::default();
        let writer = log.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new("idem_core=info"))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        (log, tracing::subscriber::set_default(subscriber))
    }

    /// The lines that contain `needle`.
    fn lines_with(&self, needle: &str) -> Vec<String> {
        let text = String::from_utf8(self.0.lock().unwrap().clone()).unwrap();
        text.lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

/// `run_periodically` runs a pass, then sleeps `interval` (through the sleep it is given), then
/// runs the next: a claim that goes stale between two passes is settled by the second, and a
/// pass that finds nothing still sleeps and goes on. A pass that settled something logs one line
/// with its counts; a pass that found nothing logs nothing (an idle server's log stays quiet).
#[tokio::test]
async fn run_periodically_settles_each_pass_and_sleeps_the_interval_between() {
    let (log, _guard) = Log::capture();
    let w = world();
    let (happened, _) = w.crashed_holder("k-periodic-1", true).await;
    w.clock.advance(Duration::from_secs(31));

    let (slept_tx, mut slept) = tokio::sync::mpsc::unbounded_channel();
    let wake = Arc::new(tokio::sync::Semaphore::new(0));
    let reconciler = w.reconciler();
    let gate = wake.clone();
    let task = tokio::spawn(async move {
        reconciler
            .run_periodically(Duration::from_secs(60), move |interval| {
                slept_tx.send(interval).unwrap();
                let gate = gate.clone();
                async move { gate.acquire().await.unwrap().forget() }
            })
            .await
    });

    // The first pass ran before the first sleep.
    assert_eq!(slept.recv().await, Some(Duration::from_secs(60)));
    assert_eq!(w.record(&happened).await.state, RecordState::Completed);

    // A claim that goes stale while the reconciler sleeps is settled by the next pass.
    let (not_happened, _) = w.crashed_holder("k-periodic-2", false).await;
    w.clock.advance(Duration::from_secs(31));
    wake.add_permits(1);
    assert_eq!(slept.recv().await, Some(Duration::from_secs(60)));
    assert_eq!(
        w.record(&not_happened).await.state,
        RecordState::FailedRetryable
    );

    // A pass with nothing to settle sleeps again.
    wake.add_permits(1);
    assert_eq!(slept.recv().await, Some(Duration::from_secs(60)));
    assert_eq!(w.effects(), 1);
    task.abort();
    let passes = log.lines_with("reconciliation pass");
    assert_eq!(passes.len(), 2, "{passes:#?}");
    assert!(
        passes[0].contains("examined=1 completed=1") && passes[1].contains("released=1"),
        "{passes:#?}"
    );
}

/// A reconciler in a log line says what it settles and how: its store, its batch and its grace.
#[test]
fn debug_says_the_store_the_batch_and_the_grace() {
    let w = world();
    let shown = format!("{:?}", w.reconciler().stale_for(Duration::from_secs(10)));
    assert!(shown.starts_with("Reconciler {"), "{shown}");
    for part in ["store: MemoryStore", "batch: ", "stale_for: 10s"] {
        assert!(shown.contains(part), "{part} in {shown}");
    }
}
