//! [contract §3.1](idem_core::contract#guarantee-1): concurrent claims from separate handles: exactly one winner, for every record a
//! claim can rewrite (absent, expired, `failed_retryable`, stale under takeover) and while the
//! holder completes or releases.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::{
    ClaimAnswer, ClaimKind, CompleteAnswer, Executor, IdempotencyKey, Policy, RecordState,
    ReleaseAnswer, Scope, Timestamp, Token,
};
use tokio::sync::Barrier;
use tokio::task::JoinHandle;

use super::*;
use crate::Harness;

/// Separate handles (separate connections for a real backend) the concurrency cases spread
/// their calls over.
pub const HANDLES: usize = 8;

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

/// A claim of (scope, key) at `now` with the request `a`, owning what it needs to be spawned.
fn claim_of(
    store: &Arc<dyn KeyStore>,
    scope: &Scope,
    key: &IdempotencyKey,
    policy: &Policy,
    now: Timestamp,
) -> impl Future<Output = ClaimAnswer> + Send + use<> {
    let (store, scope, key, policy) = (store.clone(), scope.clone(), key.clone(), *policy);
    async move {
        store
            .claim(&scope, &key, &fp("a"), &policy, now)
            .await
            .unwrap()
    }
}

/// 64 claims of one key, released together through a barrier across 8 handles: exactly one
/// `Claimed`, every other `InFlight`, and the record holds the winner's token.
pub async fn concurrency_64_claims_one_key_one_winner(h: Harness) {
    const CLAIMS: usize = 64;
    let stores = handles(&h).await;
    let (scope, key, now) = (h.scope("race"), h.key("wf-1:step-1:create_ticket"), h.now());
    let answers = race(&Gate::new(CLAIMS), CLAIMS, |i| {
        claim_of(&stores[i % HANDLES], &scope, &key, &policy(), now)
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
    let r = stores[1].get(&scope, &key, now).await.unwrap().unwrap();
    assert_eq!(r.token, winners[0], "the stored token is the winner's");
}

/// 200 distinct keys, 4 concurrent claims each, all released at once: exactly one winner per key.
pub async fn concurrency_200_keys_one_winner_each(h: Harness) {
    const KEYS: usize = 200;
    const PER_KEY: usize = 4;
    let stores = handles(&h).await;
    let (scope, now) = (h.scope("race"), h.now());
    // Claim `i` is the `i % PER_KEY`th of key `i / PER_KEY`.
    let answers = race(&Gate::new(KEYS * PER_KEY), KEYS * PER_KEY, |i| {
        let k = i / PER_KEY;
        let key = h.key(&format!("key-{k}"));
        let claim = claim_of(&stores[i % HANDLES], &scope, &key, &policy(), now);
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
pub async fn concurrency_executor_runs_once(h: Harness) {
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

/// Rounds each rewrite race runs, each on a key of its own: a store that reads, awaits, then
/// writes loses at least one of them.
pub const ROUNDS: usize = 4;
/// Concurrent claims per round of a rewrite race.
pub const CONTENDERS: usize = 24;

/// The handles a rewrite race spreads its claims over, and its scope; each round races on a key
/// of its own.
struct Arena {
    stores: Vec<Arc<dyn KeyStore>>,
    scope: Scope,
}

impl Arena {
    async fn new(h: &Harness) -> Self {
        Self {
            stores: handles(h).await,
            scope: h.scope("race"),
        }
    }

    /// Round `round`'s key (`{name}-{round}`), claimed at `now` by a first holder: the key and
    /// the holder's token.
    async fn held(
        &self,
        h: &Harness,
        name: &str,
        round: usize,
        policy: &Policy,
        now: Timestamp,
    ) -> (IdempotencyKey, Token) {
        let key = h.key(&format!("{name}-{round}"));
        let old = claim_new(&self.stores[0], &self.scope, &key, &fp("a"), policy, now).await;
        (key, old)
    }

    /// [`CONTENDERS`] claims of `key` at `now`, spread over the handles, started together; then
    /// [`Arena::assert_one_winner`] checks the round.
    async fn claims_race(
        &self,
        what: &str,
        key: &IdempotencyKey,
        policy: &Policy,
        old: Token,
        expected: (ClaimKind, u32),
        now: Timestamp,
    ) {
        let (stores, scope) = (&self.stores, &self.scope);
        let answers = race(&Gate::new(CONTENDERS), CONTENDERS, |i| {
            claim_of(&stores[i % stores.len()], scope, key, policy, now)
        })
        .await;
        self.assert_one_winner(what, key, &answers, old, expected, now)
            .await;
    }

    /// Checks one round of a rewrite race on a record whose token was `old`: exactly one
    /// `Claimed` of the expected kind and attempt, every other claim `InFlight` on the winner's
    /// running lease, the stored record the winner's; the old holder is fenced and the winner
    /// completes.
    async fn assert_one_winner(
        &self,
        what: &str,
        key: &IdempotencyKey,
        answers: &[ClaimAnswer],
        old: Token,
        expected: (ClaimKind, u32),
        now: Timestamp,
    ) {
        let (stores, scope) = (&self.stores, &self.scope);
        let winners: Vec<_> = answers
            .iter()
            .filter_map(|a| match a {
                ClaimAnswer::Claimed {
                    token,
                    attempt,
                    kind,
                } => Some((*token, *attempt, *kind)),
                _ => None,
            })
            .collect();
        assert_eq!(
            winners.len(),
            1,
            "{what}: exactly one of {} concurrent claims wins, got {} winners: {winners:?}",
            answers.len(),
            winners.len()
        );
        let (token, attempt, kind) = winners[0];
        assert_eq!(
            (kind, attempt),
            expected,
            "{what}: the winner's kind and attempt"
        );
        assert_eq!(
            token.seq,
            old.seq + 1,
            "{what}: the winner's token continues upward from {old:?}: {token:?}"
        );
        for answer in answers {
            assert!(
                matches!(
                    answer,
                    ClaimAnswer::Claimed { .. } | ClaimAnswer::InFlight { stale: false, .. }
                ),
                "{what}: a losing claim must see the winner's running lease (InFlight, not stale), \
                 got {answer:?}"
            );
        }
        let r = stores[stores.len() - 1]
            .get(scope, key, now)
            .await
            .unwrap()
            .expect("the winner's record");
        assert_eq!(
            (r.state, r.token, r.attempt, r.lease_until),
            (RecordState::Processing, token, attempt, now + LEASE),
            "{what}: the stored record is the winner's"
        );
        assert_all_fenced(&stores[0], scope, key, old, now).await;
        assert_eq!(
            stores[1]
                .complete(scope, key, token, &ok("won"), &policy(), now)
                .await
                .unwrap(),
            CompleteAnswer::Completed,
            "{what}: the winner completes"
        );
        assert_eq!(
            stores[2]
                .claim(scope, key, &fp("a"), &policy(), now)
                .await
                .unwrap(),
            ClaimAnswer::Replay(ok("won")),
            "{what}: the winner's outcome replays"
        );
    }
}

/// [`CONTENDERS`] claims race on an expired record (completed in some rounds, abandoned
/// `processing` in others), at exactly its `expires_at`, over [`ROUNDS`] rounds: exactly one
/// replaces it (`ExpiredReplaced`, attempt 1, the token continuing upward), the others see the
/// winner's lease.
pub async fn concurrency_claims_race_on_an_expired_record(h: Harness) {
    let arena = Arena::new(&h).await;
    let (store, scope) = (&arena.stores[0], &arena.scope);
    for round in 0..ROUNDS {
        let t0 = h.now();
        let (key, old) = arena.held(&h, "expired", round, &policy(), t0).await;
        if round % 2 == 0 {
            store
                .complete(scope, &key, old, &ok("old"), &policy(), t0)
                .await
                .unwrap();
        }
        let what = format!("round {round}, expired record");
        let expected = (ClaimKind::ExpiredReplaced, 1);
        arena
            .claims_race(&what, &key, &policy(), old, expected, t0 + TTL)
            .await;
    }
}

/// [`CONTENDERS`] claims race on a `failed_retryable` record (a retryable outcome in some
/// rounds, a release in others) over [`ROUNDS`] rounds: exactly one claims it again (`Retry`,
/// attempt 2), the others see the winner's lease. The most common retry pattern there is.
pub async fn concurrency_claims_race_on_a_failed_retryable_record(h: Harness) {
    let arena = Arena::new(&h).await;
    let (store, scope) = (&arena.stores[0], &arena.scope);
    let now = h.now();
    for round in 0..ROUNDS {
        let (key, old) = arena.held(&h, "retryable", round, &policy(), now).await;
        if round % 2 == 0 {
            let a = store
                .complete(scope, &key, old, &retryable(), &policy(), now)
                .await
                .unwrap();
            assert_eq!(a, CompleteAnswer::MarkedRetryable);
        } else {
            let a = store.release(scope, &key, old, now).await.unwrap();
            assert_eq!(a, ReleaseAnswer::Released);
        }
        let what = format!("round {round}, failed_retryable record");
        let expected = (ClaimKind::Retry, 2);
        arena
            .claims_race(&what, &key, &policy(), old, expected, now)
            .await;
    }
}

/// [`CONTENDERS`] claims under `Takeover` race on a `processing` record whose lease elapsed,
/// over [`ROUNDS`] rounds: exactly one takes it over (`TakenOver`, attempt 2), the others see
/// the winner's lease, and the old holder is fenced.
pub async fn concurrency_claims_race_on_a_stale_record_under_takeover(h: Harness) {
    let arena = Arena::new(&h).await;
    for round in 0..ROUNDS {
        let t0 = h.now();
        let (key, old) = arena.held(&h, "stale", round, &takeover(), t0).await;
        let at = t0 + LEASE + Duration::from_millis(round as u64);
        let what = format!("round {round}, stale record under Takeover");
        let expected = (ClaimKind::TakenOver, 2);
        arena
            .claims_race(&what, &key, &takeover(), old, expected, at)
            .await;
    }
}

/// The holder completes while [`CONTENDERS`] claims arrive, over [`ROUNDS`] rounds: no claim
/// wins, each sees the holder in flight or replays its outcome, the completion stands.
pub async fn concurrency_claims_racing_a_completion_never_win(h: Harness) {
    let arena = Arena::new(&h).await;
    let (stores, scope) = (&arena.stores, &arena.scope);
    let now = h.now();
    for round in 0..ROUNDS {
        let (key, holder) = arena.held(&h, "completing", round, &policy(), now).await;
        let done = ok(&format!("done-{round}"));
        let gate = Gate::new(CONTENDERS + 1);
        let completion = {
            let store = stores[0].clone();
            let (scope, key, done) = (scope.clone(), key.clone(), done.clone());
            gate.spawn(async move {
                store
                    .complete(&scope, &key, holder, &done, &policy(), now)
                    .await
                    .unwrap()
            })
        };
        let answers = race(&gate, CONTENDERS, |i| {
            claim_of(&stores[1 + i % (HANDLES - 1)], scope, &key, &policy(), now)
        })
        .await;
        for answer in answers {
            assert!(
                matches!(&answer, ClaimAnswer::InFlight { stale: false, .. })
                    || answer == ClaimAnswer::Replay(done.clone()),
                "round {round}: a claim racing the holder's completion must see it in flight or \
                 replay its outcome, got {answer:?}"
            );
        }
        assert_eq!(completion.await.unwrap(), CompleteAnswer::Completed);
        let r = stores[HANDLES - 1]
            .get(scope, &key, now)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (r.state, r.token, r.attempt, r.outcome),
            (RecordState::Completed, holder, 1, Some(done)),
            "round {round}: the holder's completion stands"
        );
    }
}

/// The holder releases while [`CONTENDERS`] callers keep claiming until the record is no longer
/// the holder's, over [`ROUNDS`] rounds: exactly one claims it (`Retry`, attempt 2), every other
/// caller last saw it in flight, and the stored record is the winner's.
pub async fn concurrency_claims_racing_a_release_one_winner(h: Harness) {
    let arena = Arena::new(&h).await;
    let (stores, scope) = (&arena.stores, &arena.scope);
    let now = h.now();
    for round in 0..ROUNDS {
        let (key, holder) = arena.held(&h, "releasing", round, &policy(), now).await;
        let gate = Gate::new(CONTENDERS + 1);
        let release = {
            let store = stores[0].clone();
            let (scope, key) = (scope.clone(), key.clone());
            gate.spawn(async move { store.release(&scope, &key, holder, now).await.unwrap() })
        };
        let answers = race(&gate, CONTENDERS, |i| {
            let store = stores[1 + i % (HANDLES - 1)].clone();
            let (scope, key) = (scope.clone(), key.clone());
            async move {
                // Claim until the record is no longer the holder's: then someone won.
                for _ in 0..100_000 {
                    let answer = store
                        .claim(&scope, &key, &fp("a"), &policy(), now)
                        .await
                        .unwrap();
                    match answer {
                        ClaimAnswer::Claimed { .. } => return answer,
                        ClaimAnswer::InFlight { stale: false, .. } => {
                            let r = store.get(&scope, &key, now).await.unwrap().unwrap();
                            if r.token != holder {
                                return answer;
                            }
                        }
                        other => panic!(
                            "a claim racing the holder's release must be Claimed or InFlight, \
                             got {other:?}"
                        ),
                    }
                    tokio::task::yield_now().await;
                }
                panic!("the holder's release never became visible");
            }
        })
        .await;
        assert_eq!(release.await.unwrap(), ReleaseAnswer::Released);
        let what = format!("round {round}, claims racing a release");
        let expected = (ClaimKind::Retry, 2);
        arena
            .assert_one_winner(&what, &key, &answers, holder, expected, now)
            .await;
    }
}

/// A first attempt fails with a retryable outcome; then 16 executors on separate handles retry
/// the same call at once: the operation runs exactly once more (counted at the sink), and every
/// other caller is told it is in flight or gets the replay.
pub async fn concurrency_executor_retry_runs_once(h: Harness) {
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
