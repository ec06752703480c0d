//! [contract §3.1](idem_core::contract#guarantee-1): concurrent claims from separate handles: exactly one winner, for every record a
//! claim can rewrite (absent, expired, `failed_retryable`, stale under takeover) and while the
//! holder completes or releases.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::{
    ClaimAnswer, ClaimKind, CompleteAnswer, Executor, Policy, RecordState, ReleaseAnswer,
    Timestamp, Token,
};
use tokio::sync::Barrier;

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

/// 64 claims of one key, released together through a barrier across 8 handles: exactly one
/// `Claimed`, every other `InFlight`, and the record holds the winner's token.
pub async fn concurrency_64_claims_one_key_one_winner(h: Harness) {
    const CLAIMS: usize = 64;
    let stores = handles(&h).await;
    let (scope, key, now) = (h.scope("race"), h.key("wf-1:step-1:create_ticket"), h.now());
    let gate = Arc::new(Barrier::new(CLAIMS));
    let mut tasks = Vec::new();
    for i in 0..CLAIMS {
        let (store, gate) = (stores[i % HANDLES].clone(), gate.clone());
        let (scope, key) = (scope.clone(), key.clone());
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            store
                .claim(&scope, &key, &fp("a"), &policy(), now)
                .await
                .unwrap()
        }));
    }
    let mut winners = Vec::new();
    for task in tasks {
        match task.await.unwrap() {
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
    let gate = Arc::new(Barrier::new(KEYS * PER_KEY));
    let mut tasks = Vec::new();
    for k in 0..KEYS {
        for c in 0..PER_KEY {
            let (store, gate) = (stores[(k * PER_KEY + c) % HANDLES].clone(), gate.clone());
            let (scope, key) = (scope.clone(), h.key(&format!("key-{k}")));
            tasks.push(tokio::spawn(async move {
                gate.wait().await;
                let answer = store
                    .claim(&scope, &key, &fp("a"), &policy(), now)
                    .await
                    .unwrap();
                (k, answer)
            }));
        }
    }
    let mut wins = vec![0usize; KEYS];
    for task in tasks {
        match task.await.unwrap() {
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
    let gate = Arc::new(Barrier::new(CALLERS));
    let mut tasks = Vec::new();
    for i in 0..CALLERS {
        let executor = Executor::from_arc(stores[i % stores.len()].clone())
            .with_policy(policy())
            .with_clock(h.clock().clone());
        let (scope, key, effects, gate) =
            (scope.clone(), key.clone(), effects.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            executor
                .run(&scope, &key, &fp("charge"), |_| async move {
                    effects.fetch_add(1, Ordering::SeqCst);
                    ok(ticket)
                })
                .await
        }));
    }
    let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
    for task in tasks {
        match task.await.unwrap() {
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

/// `n` claims of (scope, key) at `now`, spread over `stores`, released together by a barrier.
async fn race_claims(
    stores: &[Arc<dyn KeyStore>],
    scope: &idem_core::Scope,
    key: &idem_core::IdempotencyKey,
    policy: &Policy,
    now: Timestamp,
    n: usize,
) -> Vec<ClaimAnswer> {
    let gate = Arc::new(Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for i in 0..n {
        let (store, gate) = (stores[i % stores.len()].clone(), gate.clone());
        let (scope, key, policy) = (scope.clone(), key.clone(), *policy);
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            store
                .claim(&scope, &key, &fp("a"), &policy, now)
                .await
                .unwrap()
        }));
    }
    let mut answers = Vec::with_capacity(n);
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    answers
}

/// Checks one round of a rewrite race on a record whose token was `old`: exactly one `Claimed`
/// of the expected kind and attempt, every other claim `InFlight` on the winner's running lease,
/// the stored record the winner's; the old holder is fenced and the winner completes.
#[allow(clippy::too_many_arguments)]
async fn assert_one_winner(
    what: &str,
    stores: &[Arc<dyn KeyStore>],
    scope: &idem_core::Scope,
    key: &idem_core::IdempotencyKey,
    answers: &[ClaimAnswer],
    old: Token,
    expected: (ClaimKind, u32),
    now: Timestamp,
) {
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

/// [`CONTENDERS`] claims race on an expired record (completed in some rounds, abandoned
/// `processing` in others), at exactly its `expires_at`, over [`ROUNDS`] rounds: exactly one
/// replaces it (`ExpiredReplaced`, attempt 1, the token continuing upward), the others see the
/// winner's lease.
pub async fn concurrency_claims_race_on_an_expired_record(h: Harness) {
    let stores = handles(&h).await;
    let scope = h.scope("race");
    for round in 0..ROUNDS {
        let key = h.key(&format!("expired-{round}"));
        let t0 = h.now();
        let old = claim_new(&stores[0], &scope, &key, &fp("a"), &policy(), t0).await;
        if round % 2 == 0 {
            stores[0]
                .complete(&scope, &key, old, &ok("old"), &policy(), t0)
                .await
                .unwrap();
        }
        let at = t0 + TTL;
        let answers = race_claims(&stores, &scope, &key, &policy(), at, CONTENDERS).await;
        let what = format!("round {round}, expired record");
        assert_one_winner(
            &what,
            &stores,
            &scope,
            &key,
            &answers,
            old,
            (ClaimKind::ExpiredReplaced, 1),
            at,
        )
        .await;
    }
}

/// [`CONTENDERS`] claims race on a `failed_retryable` record (a retryable outcome in some
/// rounds, a release in others) over [`ROUNDS`] rounds: exactly one claims it again (`Retry`,
/// attempt 2), the others see the winner's lease. The most common retry pattern there is.
pub async fn concurrency_claims_race_on_a_failed_retryable_record(h: Harness) {
    let stores = handles(&h).await;
    let scope = h.scope("race");
    let now = h.now();
    for round in 0..ROUNDS {
        let key = h.key(&format!("retryable-{round}"));
        let old = claim_new(&stores[0], &scope, &key, &fp("a"), &policy(), now).await;
        if round % 2 == 0 {
            let a = stores[0]
                .complete(&scope, &key, old, &retryable(), &policy(), now)
                .await
                .unwrap();
            assert_eq!(a, CompleteAnswer::MarkedRetryable);
        } else {
            let a = stores[0].release(&scope, &key, old, now).await.unwrap();
            assert_eq!(a, ReleaseAnswer::Released);
        }
        let answers = race_claims(&stores, &scope, &key, &policy(), now, CONTENDERS).await;
        let what = format!("round {round}, failed_retryable record");
        assert_one_winner(
            &what,
            &stores,
            &scope,
            &key,
            &answers,
            old,
            (ClaimKind::Retry, 2),
            now,
        )
        .await;
    }
}

/// [`CONTENDERS`] claims under `Takeover` race on a `processing` record whose lease elapsed,
/// over [`ROUNDS`] rounds: exactly one takes it over (`TakenOver`, attempt 2), the others see
/// the winner's lease, and the old holder is fenced.
pub async fn concurrency_claims_race_on_a_stale_record_under_takeover(h: Harness) {
    let stores = handles(&h).await;
    let scope = h.scope("race");
    for round in 0..ROUNDS {
        let key = h.key(&format!("stale-{round}"));
        let t0 = h.now();
        let old = claim_new(&stores[0], &scope, &key, &fp("a"), &takeover(), t0).await;
        let at = t0 + LEASE + Duration::from_millis(round as u64);
        let answers = race_claims(&stores, &scope, &key, &takeover(), at, CONTENDERS).await;
        let what = format!("round {round}, stale record under Takeover");
        assert_one_winner(
            &what,
            &stores,
            &scope,
            &key,
            &answers,
            old,
            (ClaimKind::TakenOver, 2),
            at,
        )
        .await;
    }
}

/// The holder completes while [`CONTENDERS`] claims arrive, over [`ROUNDS`] rounds: no claim
/// wins, each sees the holder in flight or replays its outcome, the completion stands.
pub async fn concurrency_claims_racing_a_completion_never_win(h: Harness) {
    let stores = handles(&h).await;
    let scope = h.scope("race");
    let now = h.now();
    for round in 0..ROUNDS {
        let key = h.key(&format!("completing-{round}"));
        let holder = claim_new(&stores[0], &scope, &key, &fp("a"), &policy(), now).await;
        let done = ok(&format!("done-{round}"));
        let gate = Arc::new(Barrier::new(CONTENDERS + 1));
        let completion = {
            let (store, gate) = (stores[0].clone(), gate.clone());
            let (scope, key, done) = (scope.clone(), key.clone(), done.clone());
            tokio::spawn(async move {
                gate.wait().await;
                store
                    .complete(&scope, &key, holder, &done, &policy(), now)
                    .await
                    .unwrap()
            })
        };
        let mut tasks = Vec::new();
        for i in 0..CONTENDERS {
            let (store, gate) = (stores[1 + i % (HANDLES - 1)].clone(), gate.clone());
            let (scope, key) = (scope.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                gate.wait().await;
                store
                    .claim(&scope, &key, &fp("a"), &policy(), now)
                    .await
                    .unwrap()
            }));
        }
        for task in tasks {
            let answer = task.await.unwrap();
            assert!(
                matches!(&answer, ClaimAnswer::InFlight { stale: false, .. })
                    || answer == ClaimAnswer::Replay(done.clone()),
                "round {round}: a claim racing the holder's completion must see it in flight or \
                 replay its outcome, got {answer:?}"
            );
        }
        assert_eq!(completion.await.unwrap(), CompleteAnswer::Completed);
        let r = stores[HANDLES - 1]
            .get(&scope, &key, now)
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
    let stores = handles(&h).await;
    let scope = h.scope("race");
    let now = h.now();
    for round in 0..ROUNDS {
        let key = h.key(&format!("releasing-{round}"));
        let holder = claim_new(&stores[0], &scope, &key, &fp("a"), &policy(), now).await;
        let gate = Arc::new(Barrier::new(CONTENDERS + 1));
        let release = {
            let (store, gate) = (stores[0].clone(), gate.clone());
            let (scope, key) = (scope.clone(), key.clone());
            tokio::spawn(async move {
                gate.wait().await;
                store.release(&scope, &key, holder, now).await.unwrap()
            })
        };
        let mut tasks = Vec::new();
        for i in 0..CONTENDERS {
            let (store, gate) = (stores[1 + i % (HANDLES - 1)].clone(), gate.clone());
            let (scope, key) = (scope.clone(), key.clone());
            tasks.push(tokio::spawn(async move {
                gate.wait().await;
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
            }));
        }
        let mut answers = Vec::new();
        for task in tasks {
            answers.push(task.await.unwrap());
        }
        assert_eq!(release.await.unwrap(), ReleaseAnswer::Released);
        let what = format!("round {round}, claims racing a release");
        assert_one_winner(
            &what,
            &stores,
            &scope,
            &key,
            &answers,
            holder,
            (ClaimKind::Retry, 2),
            now,
        )
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
