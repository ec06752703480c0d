//! Waiting for an in-flight answer ([contract §5.2](idem_core::contract#waiting)): a repeat that
//! waits is woken by the completion, the release and the takeover of the record it waits on
//! (through [`KeyStore::wait_for_change`], native or polling), and answers `InFlight` when its
//! bound passes, having written nothing. The waiter uses its own store handle, as another process
//! would; these cases take real time (a few milliseconds when the store wakes its waiters).

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::machine::{CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::store::ListFilter;
use idem_core::{Clock, Error, Executor, RecordState, Timer, async_trait};
use tokio::sync::{Notify, oneshot};

use super::*;
use crate::harness::Harness;

/// How long a waiter asks to wait.
const WAIT: Duration = Duration::from_secs(5);
/// How soon after the change a woken waiter answers, at the latest (polling takes up to 250 ms).
const WOKEN: Duration = Duration::from_secs(2);

/// Panics unless `since` is within [`WOKEN`].
#[track_caller]
fn woken_in_time(since: std::time::Instant, by: &str) {
    let took = since.elapsed();
    assert!(
        took < WOKEN,
        "the waiter answered {took:?} after the {by}: it was not woken (only its bound ended the wait)"
    );
}

/// Tickets created at the sink.
#[derive(Debug, Default)]
struct Sink(Mutex<Vec<String>>);

impl Sink {
    fn create_ticket(&self) -> Outcome {
        let mut tickets = self.0.lock().unwrap();
        let id = format!("T-{}", tickets.len() + 1);
        tickets.push(id.clone());
        ok(&id)
    }
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

/// The store under test, telling the case each time a wait on it starts.
#[derive(Debug, Clone)]
struct Watched {
    inner: Arc<dyn KeyStore>,
    waits: Arc<(AtomicUsize, Notify)>,
}

impl Watched {
    fn new(inner: Arc<dyn KeyStore>) -> Self {
        Self {
            inner,
            waits: Arc::default(),
        }
    }

    /// Returns once `n` waits have started; panics with `what` after [`WAIT`].
    async fn started(&self, n: usize, what: &str) {
        let started = async {
            loop {
                let notified = self.waits.1.notified();
                if self.waits.0.load(Ordering::SeqCst) >= n {
                    return;
                }
                notified.await;
            }
        };
        if tokio::time::timeout(WAIT, started).await.is_err() {
            panic!("{what}");
        }
    }
}

#[async_trait]
impl KeyStore for Watched {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, idem_core::StoreError> {
        self.inner.claim(id, fingerprint, policy, now).await
    }
    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, idem_core::StoreError> {
        self.inner.complete(id, token, outcome, policy, now).await
    }
    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, idem_core::StoreError> {
        self.inner.release(id, token, now).await
    }
    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, idem_core::StoreError> {
        self.inner.extend(id, token, lease, now).await
    }
    async fn get(
        &self,
        id: &RecordId,
        now: Timestamp,
    ) -> Result<Option<Record>, idem_core::StoreError> {
        self.inner.get(id, now).await
    }
    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, idem_core::StoreError> {
        self.inner.list_in_flight(older_than, limit).await
    }
    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, idem_core::StoreError> {
        self.inner.list(filter, now, limit).await
    }
    async fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<usize, idem_core::StoreError> {
        self.inner.purge_expired(now, limit).await
    }
    fn backend(&self) -> &'static str {
        self.inner.backend()
    }
    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn Clock,
        timer: &Timer,
    ) -> Result<(), idem_core::StoreError> {
        self.waits.0.fetch_add(1, Ordering::SeqCst);
        self.waits.1.notify_waiters();
        self.inner.wait_for_change(seen, clock, timer).await
    }
}

/// The waiter: its own store handle (watched), the harness's clock, `p`, asking to wait `wait`.
async fn waiter(h: &Harness, p: Policy, wait: Duration) -> (Executor, Watched) {
    let watched = Watched::new(h.store().await);
    let exec = Executor::from_arc(Arc::new(watched.clone()))
        .with_policy(p)
        .with_clock(h.clock().clone())
        .waiting(wait);
    (exec, watched)
}

/// Runs a repeat of the request `a` on `exec` in a task; its operation creates a ticket.
fn repeat(
    exec: &Executor,
    h: &Harness,
    sink: &Arc<Sink>,
) -> tokio::task::JoinHandle<Result<idem_core::Execution, Error>> {
    let (exec, sink) = (exec.clone(), sink.clone());
    let (scope, key) = (h.scope("s"), h.key("wf-1:step-1:create_ticket"));
    tokio::spawn(async move {
        exec.run(
            &scope,
            &key,
            &fp("a"),
            |_| async move { sink.create_ticket() },
        )
        .await
    })
}

/// A first attempt running in another process completes while the repeat waits: the repeat
/// replays its outcome, and the sink has one ticket.
pub(crate) async fn wait_wakes_on_completion(h: Harness) {
    let sink = Arc::new(Sink::default());
    let first = Executor::from_arc(h.store().await)
        .with_policy(policy())
        .with_clock(h.clock().clone());
    let (finish, go) = oneshot::channel::<()>();
    let (started_tx, started) = oneshot::channel();
    let holder = {
        let (sink, scope, key) = (
            sink.clone(),
            h.scope("s"),
            h.key("wf-1:step-1:create_ticket"),
        );
        tokio::spawn(async move {
            first
                .run(&scope, &key, &fp("a"), |_| async move {
                    started_tx.send(()).unwrap();
                    go.await.unwrap();
                    sink.create_ticket()
                })
                .await
        })
    };
    started.await.unwrap();
    let (exec, watched) = waiter(&h, policy(), WAIT).await;
    let again = repeat(&exec, &h, &sink);
    watched.started(1, "the repeat never started waiting").await;
    finish.send(()).unwrap();
    let first = holder.await.unwrap().expect("the first attempt completes");
    let at = std::time::Instant::now();
    let again = again
        .await
        .unwrap()
        .expect("the waiter is woken by the completion");
    woken_in_time(at, "completion");
    assert!(again.is_replay(), "the waiter replays: {again:?}");
    assert_eq!(
        again.outcome(),
        first.outcome(),
        "the first attempt's outcome"
    );
    assert_eq!(sink.count(), 1, "one ticket at the sink");
}

/// The holder gives its claim up while the repeat waits: the repeat claims the record and runs
/// (attempt 2), once.
pub(crate) async fn wait_wakes_on_release(h: Harness) {
    let sink = Arc::new(Sink::default());
    let (store, id, token) = one_claimed(&h, &policy()).await;
    let (exec, watched) = waiter(&h, policy(), WAIT).await;
    let again = repeat(&exec, &h, &sink);
    watched.started(1, "the repeat never started waiting").await;
    let released = store.release(&id, token, h.now()).await.unwrap();
    assert_eq!(released, ReleaseAnswer::Released);
    let at = std::time::Instant::now();
    let ran = again
        .await
        .unwrap()
        .expect("the waiter is woken by the release");
    woken_in_time(at, "release");
    match ran {
        idem_core::Execution::Executed { attempt, .. } => assert_eq!(attempt, 2),
        other => panic!("the waiter should have claimed and run, got {other:?}"),
    }
    assert_eq!(sink.count(), 1, "the waiter's ticket, once");
    let record = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed);
}

/// Another caller takes the stale claim over while the repeat waits: the repeat wakes, waits on
/// the new holder, and replays the new holder's outcome; nothing runs in the waiter.
pub(crate) async fn wait_wakes_on_takeover(h: Harness) {
    let sink = Arc::new(Sink::default());
    let (store, id, _old) = one_claimed(&h, &takeover()).await;
    let (exec, watched) = waiter(&h, takeover(), WAIT).await;
    let again = repeat(&exec, &h, &sink);
    watched.started(1, "the repeat never started waiting").await;
    h.advance(LEASE + Duration::from_secs(1));
    let taken = store
        .claim(&id, &fp("a"), &takeover(), h.now())
        .await
        .unwrap();
    let (token, _, kind) = won(&taken, "takeover");
    assert_eq!(kind, ClaimKind::TakenOver);
    watched
        .started(2, "the waiter was not woken by the takeover")
        .await;
    let done = store
        .complete(&id, token, &ok("T-B"), &takeover(), h.now())
        .await
        .unwrap();
    assert_eq!(done, CompleteAnswer::Completed);
    let at = std::time::Instant::now();
    let again = again
        .await
        .unwrap()
        .expect("the waiter is woken by the completion");
    woken_in_time(at, "completion");
    assert!(again.is_replay(), "the waiter replays: {again:?}");
    assert_eq!(again.outcome(), &ok("T-B"), "the new holder's outcome");
    assert_eq!(sink.count(), 0, "nothing ran in the waiter");
}

/// Nothing happens to the record: the repeat waits its bound (a short real wait, 300 ms), then
/// answers `InFlight`, and the record is as it was.
pub(crate) async fn wait_bound_passes_after_a_short_real_wait(h: Harness) {
    let sink = Arc::new(Sink::default());
    let (store, id, _token) = one_claimed(&h, &policy()).await;
    let before = store.get(&id, h.now()).await.unwrap();
    let bound = Duration::from_millis(300);
    let (exec, _) = waiter(&h, policy(), bound).await;
    let started = std::time::Instant::now();
    let err = repeat(&exec, &h, &sink)
        .await
        .unwrap()
        .expect_err("in flight");
    assert!(
        matches!(err, Error::InFlight { stale: false, .. }),
        "{err:?}"
    );
    assert!(
        started.elapsed() >= bound,
        "answered after {:?}, before its bound",
        started.elapsed()
    );
    let after = store.get(&id, h.now()).await.unwrap();
    assert_eq!(before, after, "the waiter wrote nothing");
    assert_eq!(sink.count(), 0);
}
