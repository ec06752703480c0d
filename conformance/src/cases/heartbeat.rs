//! Heartbeats through the executor ([contract §2](idem_core::contract#extend),
//! [§7](idem_core::contract#traps)): a holder whose work is twice its lease, renewed by the
//! executor's heartbeat, is not taken over while alive, and its effect lands once; without
//! heartbeats the same holder is taken over when its lease ends and the effect lands twice; a
//! holder whose renewal comes too late learns that it lost the claim, and stops renewing.
//!
//! Time is the harness's clock. The heartbeat sleeps on a [`Beats`] timer that the case fires by
//! that clock, so no case sleeps for real; a second caller under `Takeover`, on its own handle as
//! another process would be, tries to take the claim over at every step.

use std::sync::Mutex;

use idem_core::{Attempt, Clock, Error, Execution, Executor, ManualClock, RecordState, Timer};
use tokio::sync::{oneshot, watch};

use super::*;
use crate::harness::Harness;

/// A guard against a hang, never a measure: each step takes a store call or two.
const HANG: Duration = Duration::from_secs(20);
/// How far the clock moves per step: a sixth of the lease (the heartbeat beats every third).
const STEP: Duration = Duration::from_secs(5);
/// Steps that make twice the lease.
const STEPS: u32 = 12;

/// A sleep asked for: when it is due, and what ends it.
type Sleeper = (Timestamp, oneshot::Sender<()>);

/// A timer whose sleeps end when the case fires them, by the harness's clock.
#[derive(Clone)]
struct Beats {
    clock: ManualClock,
    /// The sleeps not ended yet.
    asleep: Arc<Mutex<Vec<Sleeper>>>,
    /// How many sleeps were asked for, ever.
    asked: watch::Sender<usize>,
}

impl Beats {
    fn new(clock: ManualClock) -> Self {
        Self {
            clock,
            asleep: Arc::default(),
            asked: watch::Sender::new(0),
        }
    }

    fn timer(&self) -> Timer {
        let this = self.clone();
        Timer::new(move |duration| {
            let (wake, woken) = oneshot::channel();
            let due = this.clock.now() + duration;
            this.asleep.lock().unwrap().push((due, wake));
            this.asked.send_modify(|n| *n += 1);
            Box::pin(async move {
                let _ = woken.await;
            })
        })
    }

    fn asked(&self) -> usize {
        *self.asked.borrow()
    }

    /// Waits until `n` sleeps were asked for in all (a heartbeat asks for its next sleep once
    /// its renewal is done).
    async fn until_asked(&self, n: usize) {
        let mut asked = self.asked.subscribe();
        tokio::time::timeout(HANG, asked.wait_for(|&asked| asked >= n))
            .await
            .expect("the heartbeat went back to sleep")
            .expect("the timer lives");
    }

    /// Ends the sleeps that are due by the clock, and waits until as many were asked for again
    /// (each woken heartbeat renewed and went back to sleep); the number woken.
    async fn beat(&self) -> usize {
        let before = self.asked();
        let now = self.clock.now();
        let due: Vec<_> = {
            let mut asleep = self.asleep.lock().unwrap();
            let (due, later) = asleep.drain(..).partition(|(at, _)| *at <= now);
            *asleep = later;
            due
        };
        let woken = due
            .into_iter()
            .filter_map(|(_, wake)| wake.send(()).ok())
            .count();
        self.until_asked(before + woken).await;
        woken
    }
}

/// Tickets created at the sink.
#[derive(Debug, Default)]
struct Sink(Mutex<usize>);

impl Sink {
    fn create_ticket(&self, by: &str) -> Outcome {
        *self.0.lock().unwrap() += 1;
        ok(by)
    }

    fn count(&self) -> usize {
        *self.0.lock().unwrap()
    }
}

type Holder = tokio::task::JoinHandle<Result<Execution, Error>>;

/// Starts the holder on its own handle: its work runs until `finish` is sent (or, if
/// `stop_when_lost`, until it learns it lost the claim: then it returns without its effect),
/// then creates a ticket. Returns once the work started and the heartbeat (if any) is asleep.
async fn hold(
    h: &Harness,
    beats: &Beats,
    heartbeat: bool,
    sink: &Arc<Sink>,
    stop_when_lost: bool,
) -> (Attempt, oneshot::Sender<()>, Holder) {
    let mut exec = Executor::from_arc(h.store().await)
        .with_policy(takeover())
        .with_clock(h.clock().clone())
        .with_timer(beats.timer());
    if !heartbeat {
        exec = exec.with_heartbeat(None);
    }
    let (scope, key, sink) = (h.scope("tool"), h.key("k"), sink.clone());
    let (started_tx, started) = oneshot::channel();
    let (finish, finished) = oneshot::channel::<()>();
    let holder = tokio::spawn(async move {
        exec.run(&scope, &key, &fp("a"), |attempt| async move {
            started_tx.send(attempt.clone()).unwrap();
            if stop_when_lost {
                tokio::select! {
                    _ = finished => {}
                    () = attempt.lost() => {
                        return Outcome::retryable(503, &serde_json::json!({"stopped": "lost"}))
                            .unwrap();
                    }
                }
            } else {
                let _ = finished.await;
            }
            sink.create_ticket("from-holder")
        })
        .await
    });
    let attempt = started.await.expect("the holder started");
    if heartbeat {
        beats.until_asked(1).await;
    }
    (attempt, finish, holder)
}

/// The second caller: `Takeover`, no heartbeat, its own handle; its operation creates a ticket.
async fn taker(h: &Harness) -> Executor {
    Executor::from_arc(h.store().await)
        .with_policy(takeover())
        .with_clock(h.clock().clone())
        .with_heartbeat(None)
}

/// The taker's try: `true` if it took the claim over and ran, `false` if the holder's lease
/// still runs.
async fn try_to_take_over(h: &Harness, taker: &Executor, sink: &Sink, step: u32) -> bool {
    let ran = taker
        .run(&h.scope("tool"), &h.key("k"), &fp("a"), |_| async {
            sink.create_ticket("from-taker")
        })
        .await;
    match ran {
        Ok(Execution::Executed { attempt: 2, .. }) => true,
        Err(Error::InFlight { stale: false, .. }) => false,
        other => panic!("step {step}: unexpected answer to the taker: {other:?}"),
    }
}

/// The holder's work takes twice its lease; the heartbeat renews the lease every third of it;
/// the taker tries at every sixth: it never takes over, the attempt's deadline is the record's,
/// and one ticket lands at the sink.
pub(crate) async fn heartbeat_keeps_a_holder_twice_its_lease(h: Harness) {
    let (beats, sink) = (Beats::new(h.clock().clone()), Arc::new(Sink::default()));
    let (attempt, finish, holder) = hold(&h, &beats, true, &sink, false).await;
    assert_eq!(attempt.lease_until(), h.now() + LEASE, "the claim's lease");
    let taker = taker(&h).await;
    let mut beaten = 0;
    for step in 1..=STEPS {
        h.advance(STEP);
        beaten += beats.beat().await;
        let stored = taker
            .store()
            .get(&h.id("tool", "k"), h.now())
            .await
            .unwrap()
            .expect("the record");
        assert_eq!(stored.lease_until, attempt.lease_until(), "step {step}");
        assert!(stored.lease_until > h.now(), "step {step}: the lease runs");
        assert!(
            !try_to_take_over(&h, &taker, &sink, step).await,
            "step {step}: taken over while alive"
        );
    }
    assert_eq!(beaten, 6, "a beat every third of the lease");
    finish.send(()).unwrap();
    let ran = holder.await.unwrap().expect("the holder completes");
    assert_eq!(ran.outcome(), &ok("from-holder"));
    assert_eq!(sink.count(), 1, "one ticket at the sink");
    let stored = read_back(&h, &h.id("tool", "k")).await;
    assert_eq!(stored.state, RecordState::Completed);
    assert_eq!(stored.attempt, 1, "never taken over");
}

/// The same holder without heartbeats is taken over when its lease ends, and the effect lands
/// twice: what the heartbeat prevents (and proof that the case above can fail).
pub(crate) async fn heartbeat_off_the_holder_is_taken_over(h: Harness) {
    let (beats, sink) = (Beats::new(h.clock().clone()), Arc::new(Sink::default()));
    let (attempt, finish, holder) = hold(&h, &beats, false, &sink, false).await;
    let claimed = attempt.lease_until();
    let taker = taker(&h).await;
    let mut taken = Vec::new();
    for step in 1..=STEPS {
        h.advance(STEP);
        if taken.is_empty() && try_to_take_over(&h, &taker, &sink, step).await {
            taken.push(step);
        }
    }
    assert_eq!(taken, [6], "taken over when the lease ended");
    assert_eq!(beats.asked(), 0, "no heartbeat");
    assert_eq!(attempt.lease_until(), claimed, "never renewed");
    finish.send(()).unwrap();
    match holder.await.unwrap() {
        Err(Error::Fenced { .. }) => {}
        other => panic!("the holder is fenced at its completion: {other:?}"),
    }
    assert_eq!(sink.count(), 2, "two tickets: the double effect");
}

/// The holder's heartbeat comes late (its process paused past the lease), the taker takes over
/// meanwhile; the late renewal is fenced: the holder learns it lost the claim, stops before its
/// effect, and its heartbeat stops.
pub(crate) async fn heartbeat_late_renewal_tells_the_holder_it_lost(h: Harness) {
    let (beats, sink) = (Beats::new(h.clock().clone()), Arc::new(Sink::default()));
    let (attempt, _finish, holder) = hold(&h, &beats, true, &sink, true).await;
    h.advance(LEASE + STEP);
    let taker = taker(&h).await;
    assert!(try_to_take_over(&h, &taker, &sink, 0).await, "taken over");
    assert!(!attempt.is_lost(), "not known yet");
    // The late beat: fenced, so the heartbeat does not go back to sleep.
    let due: Vec<_> = std::mem::take(&mut *beats.asleep.lock().unwrap());
    assert_eq!(due.len(), 1, "one heartbeat asleep");
    for (_, wake) in due {
        wake.send(()).unwrap();
    }
    match tokio::time::timeout(HANG, holder)
        .await
        .expect("the holder stops")
    {
        Ok(Err(Error::Fenced { .. })) => {}
        other => panic!("the holder's completion is fenced: {other:?}"),
    }
    assert!(attempt.is_lost(), "the holder learned it lost the claim");
    assert_eq!(beats.asked(), 1, "the heartbeat stopped at the fence");
    assert_eq!(sink.count(), 1, "only the taker's ticket");
    let stored = read_back(&h, &h.id("tool", "k")).await;
    assert_eq!(
        (stored.state, stored.outcome),
        (RecordState::Completed, Some(ok("from-taker")))
    );
}
