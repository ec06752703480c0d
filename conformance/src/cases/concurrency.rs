//! [contract §3.1](idem_core::contract#guarantee-1): concurrent claims from separate handles:
//! exactly one winner, for every record a claim can rewrite (absent, expired, `failed_retryable`,
//! stale under takeover) and while the holder completes or releases; a takeover racing the old
//! holder's completion, release or extension.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::machine::ClaimAnswer;
use idem_core::{Executor, Policy, Scope, Timestamp};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

use super::*;
use crate::harness::Harness;

mod holder;
mod records;

pub(crate) use holder::{
    concurrency_takeover_racing_the_holders_completion,
    concurrency_takeover_racing_the_holders_extension,
    concurrency_takeover_racing_the_holders_release,
};

pub(crate) use records::{
    concurrency_claims_race_on_a_failed_retryable_record,
    concurrency_claims_race_on_a_stale_record_under_takeover,
    concurrency_claims_race_on_an_expired_record, concurrency_claims_racing_a_completion_never_win,
    concurrency_claims_racing_a_release_one_winner,
};

/// Separate handles (separate connections for a real backend) the concurrency cases spread
/// their calls over.
const HANDLES: usize = 8;

async fn handles(h: &Harness) -> Vec<Arc<dyn KeyStore>> {
    let mut v = Vec::with_capacity(HANDLES);
    for _ in 0..HANDLES {
        v.push(h.store().await);
    }
    v
}

/// A start line: the tasks spawned through it start together, once as many as it was made for
/// wait at it.
struct Gate(Arc<Barrier>);

impl Gate {
    fn new(n: usize) -> Self {
        Self(Arc::new(Barrier::new(n)))
    }

    /// Spawns `task`, to start at the gate.
    fn spawn<T: Send + 'static>(
        &self,
        task: impl Future<Output = T> + Send + 'static,
    ) -> JoinHandle<T> {
        let gate = self.0.clone();
        tokio::spawn(async move {
            gate.wait().await;
            task.await
        })
    }
}

/// `n` tasks, `task(i)` for each `i`, started together at `gate`; their answers, in order.
async fn race<T, Fut>(gate: &Gate, n: usize, task: impl Fn(usize) -> Fut) -> Vec<T>
where
    T: Send + 'static,
    Fut: Future<Output = T> + Send + 'static,
{
    let tasks: Vec<_> = (0..n).map(|i| gate.spawn(task(i))).collect();
    let mut answers = Vec::with_capacity(n);
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// A claim of `id` at `now` with the request `a`, owning what it needs to be spawned.
fn claim_of(
    store: &Arc<dyn KeyStore>,
    id: &RecordId,
    policy: &Policy,
    now: Timestamp,
) -> impl Future<Output = ClaimAnswer> + Send + use<> {
    let (store, id, policy) = (store.clone(), id.clone(), *policy);
    async move { store.claim(&id, &fp("a"), &policy, now).await.unwrap() }
}

/// 64 claims of one key, released together through a barrier across 8 handles: exactly one
/// `Claimed`, every other `InFlight`, and the record holds the winner's token.
pub(crate) async fn concurrency_64_claims_one_key_one_winner(h: Harness) {
    const CLAIMS: usize = 64;
    let stores = handles(&h).await;
    let (id, now) = (h.id("race", "wf-1:step-1:create_ticket"), h.now());
    let answers = race(&Gate::new(CLAIMS), CLAIMS, |i| {
        claim_of(&stores[i % HANDLES], &id, &policy(), now)
    })
    .await;
    let mut winners = Vec::new();
    for answer in answers {
        match answer {
            ClaimAnswer::Claimed { token, .. } => winners.push(token),
            ClaimAnswer::InFlight { stale: false, .. } => {}
            other => panic!("a concurrent claim answered {other:?}"),
        }
    }
    assert_eq!(
        winners.len(),
        1,
        "exactly one of {CLAIMS} concurrent claims wins: {winners:?}"
    );
    let r = stores[1].get(&id, now).await.unwrap().unwrap();
    assert_eq!(r.token, winners[0], "the stored token is the winner's");
}

/// 200 distinct keys, 4 concurrent claims each, all released at once: exactly one winner per key.
pub(crate) async fn concurrency_200_keys_one_winner_each(h: Harness) {
    const KEYS: usize = 200;
    const PER_KEY: usize = 4;
    let stores = handles(&h).await;
    let (scope, now) = (h.scope("race"), h.now());
    // Claim `i` is the `i % PER_KEY`th of key `i / PER_KEY`.
    let answers = race(&Gate::new(KEYS * PER_KEY), KEYS * PER_KEY, |i| {
        let k = i / PER_KEY;
        let id = RecordId::new(scope.clone(), h.key(&format!("key-{k}")));
        let claim = claim_of(&stores[i % HANDLES], &id, &policy(), now);
        async move { (k, claim.await) }
    })
    .await;
    let mut wins = vec![0usize; KEYS];
    for answer in answers {
        match answer {
            (k, ClaimAnswer::Claimed { .. }) => wins[k] += 1,
            (_, ClaimAnswer::InFlight { .. }) => {}
            (k, other) => panic!("key-{k}: a concurrent claim answered {other:?}"),
        }
    }
    let wrong: Vec<_> = wins.iter().enumerate().filter(|(_, n)| **n != 1).collect();
    assert!(
        wrong.is_empty(),
        "keys without exactly one winner (key, winners): {wrong:?}"
    );
}

/// 16 executors on separate handles run the same call at once: the operation runs exactly once
/// (counted at the sink), and every other caller is told it is in flight or gets the replay.
pub(crate) async fn concurrency_executor_runs_once(h: Harness) {
    let stores = handles(&h).await;
    let (scope, key) = (h.scope("race"), h.key("wf-9:step-1:charge"));
    executors_race_once(&h, &stores, &scope, &key, "CH-1", "the effect").await;
}

/// Starts 16 executors on the given handles at once, each running the same call whose effect
/// answers `ticket`: the effect happens exactly once (counted at the sink), one caller executes
/// it, and every other is told it is in flight or gets the replay of `ticket`.
async fn executors_race_once(
    h: &Harness,
    stores: &[Arc<dyn KeyStore>],
    scope: &idem_core::Scope,
    key: &idem_core::IdempotencyKey,
    ticket: &'static str,
    what: &str,
) {
    const CALLERS: usize = 16;
    let effects = Arc::new(AtomicUsize::new(0));
    let answers = race(&Gate::new(CALLERS), CALLERS, |i| {
        let executor = Executor::from_arc(stores[i % stores.len()].clone())
            .with_policy(policy())
            .with_clock(h.clock().clone());
        let (scope, key, effects) = (scope.clone(), key.clone(), effects.clone());
        async move {
            executor
                .run(&scope, &key, &fp("charge"), |_| async move {
                    effects.fetch_add(1, Ordering::SeqCst);
                    ok(ticket)
                })
                .await
        }
    })
    .await;
    let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
    for answer in answers {
        match answer {
            Ok(e) if !e.is_replay() => executed += 1,
            Ok(e) => {
                assert_eq!(e.outcome(), &ok(ticket));
                replayed += 1;
            }
            Err(idem_core::Error::InFlight { .. }) => in_flight += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "{what} happened exactly once"
    );
    assert_eq!(executed, 1);
    assert_eq!(executed + replayed + in_flight, CALLERS);
}

/// A first attempt fails with a retryable outcome; then 16 executors on separate handles retry
/// the same call at once: the operation runs exactly once more (counted at the sink), and every
/// other caller is told it is in flight or gets the replay.
pub(crate) async fn concurrency_executor_retry_runs_once(h: Harness) {
    let stores = handles(&h).await;
    let (scope, key) = (h.scope("race"), h.key("wf-9:step-2:charge"));
    let first = Executor::from_arc(stores[0].clone())
        .with_policy(policy())
        .with_clock(h.clock().clone())
        .run(&scope, &key, &fp("charge"), |_| async { retryable() })
        .await;
    assert!(
        matches!(&first, Ok(e) if !e.is_replay()),
        "the first attempt runs: {first:?}"
    );
    executors_race_once(&h, &stores, &scope, &key, "CH-2", "the retry's effect").await;
}
