//! Rewrite races: concurrent claims on every record a claim can rewrite (expired,
//! `failed_retryable`, stale under takeover) and racing the holder's completion or release.

use idem_core::machine::{CompleteAnswer, ReleaseAnswer};
use idem_core::{ClaimKind, RecordState, Token};

use super::*;

/// Rounds each rewrite race runs, each on a key of its own: a store that reads, awaits, then
/// writes loses at least one of them.
const ROUNDS: usize = 4;
/// Concurrent claims per round of a rewrite race.
const CONTENDERS: usize = 24;

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

    /// Round `round`'s record (key `{name}-{round}`), claimed at `now` by a first holder: the
    /// record and the holder's token.
    async fn held(
        &self,
        h: &Harness,
        name: &str,
        round: usize,
        policy: &Policy,
        now: Timestamp,
    ) -> (RecordId, Token) {
        let id = RecordId::new(self.scope.clone(), h.key(&format!("{name}-{round}")));
        let old = claim_new(&self.stores[0], &id, &fp("a"), policy, now).await;
        (id, old)
    }

    /// [`CONTENDERS`] claims of `key` at `now`, spread over the handles, started together; then
    /// [`Arena::assert_one_winner`] checks the round.
    async fn claims_race(
        &self,
        what: &str,
        id: &RecordId,
        policy: &Policy,
        old: Token,
        expected: (ClaimKind, u32),
        now: Timestamp,
    ) {
        let stores = &self.stores;
        let answers = race(&Gate::new(CONTENDERS), CONTENDERS, |i| {
            claim_of(&stores[i % stores.len()], id, policy, now)
        })
        .await;
        self.assert_one_winner(what, id, &answers, old, expected, now)
            .await;
    }

    /// Checks one round of a rewrite race on a record whose token was `old`: exactly one
    /// `Claimed` of the expected kind and attempt, every other claim `InFlight` on the winner's
    /// running lease, the stored record the winner's; the old holder is fenced and the winner
    /// completes.
    async fn assert_one_winner(
        &self,
        what: &str,
        id: &RecordId,
        answers: &[ClaimAnswer],
        old: Token,
        expected: (ClaimKind, u32),
        now: Timestamp,
    ) {
        let stores = &self.stores;
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
            .get(id, now)
            .await
            .unwrap()
            .expect("the winner's record");
        assert_eq!(
            (r.state, r.token, r.attempt, r.lease_until),
            (RecordState::Processing, token, attempt, now + LEASE),
            "{what}: the stored record is the winner's"
        );
        assert_all_fenced(&stores[0], id, old, now).await;
        assert_eq!(
            stores[1]
                .complete(id, token, &ok("won"), &policy(), now)
                .await
                .unwrap(),
            CompleteAnswer::Completed,
            "{what}: the winner completes"
        );
        assert_eq!(
            stores[2].claim(id, &fp("a"), &policy(), now).await.unwrap(),
            ClaimAnswer::Replay(ok("won")),
            "{what}: the winner's outcome replays"
        );
    }
}

/// [`CONTENDERS`] claims race on an expired record (completed in some rounds, abandoned
/// `processing` in others), at exactly its `expires_at`, over [`ROUNDS`] rounds: exactly one
/// replaces it (`ExpiredReplaced`, attempt 1, the token continuing upward), the others see the
/// winner's lease.
pub(crate) async fn concurrency_claims_race_on_an_expired_record(h: Harness) {
    let arena = Arena::new(&h).await;
    let store = &arena.stores[0];
    for round in 0..ROUNDS {
        let t0 = h.now();
        let (id, old) = arena.held(&h, "expired", round, &policy(), t0).await;
        if round % 2 == 0 {
            store
                .complete(&id, old, &ok("old"), &policy(), t0)
                .await
                .unwrap();
        }
        let what = format!("round {round}, expired record");
        let expected = (ClaimKind::ExpiredReplaced, 1);
        arena
            .claims_race(&what, &id, &policy(), old, expected, t0 + TTL)
            .await;
    }
}

/// [`CONTENDERS`] claims race on a `failed_retryable` record (a retryable outcome in some
/// rounds, a release in others) over [`ROUNDS`] rounds: exactly one claims it again (`Retry`,
/// attempt 2), the others see the winner's lease. The most common retry pattern there is.
pub(crate) async fn concurrency_claims_race_on_a_failed_retryable_record(h: Harness) {
    let arena = Arena::new(&h).await;
    let store = &arena.stores[0];
    let now = h.now();
    for round in 0..ROUNDS {
        let (id, old) = arena.held(&h, "retryable", round, &policy(), now).await;
        if round % 2 == 0 {
            let a = store
                .complete(&id, old, &retryable(), &policy(), now)
                .await
                .unwrap();
            assert_eq!(a, CompleteAnswer::MarkedRetryable);
        } else {
            let a = store.release(&id, old, now).await.unwrap();
            assert_eq!(a, ReleaseAnswer::Released);
        }
        let what = format!("round {round}, failed_retryable record");
        let expected = (ClaimKind::Retry, 2);
        arena
            .claims_race(&what, &id, &policy(), old, expected, now)
            .await;
    }
}

/// [`CONTENDERS`] claims under `Takeover` race on a `processing` record whose lease elapsed,
/// over [`ROUNDS`] rounds: exactly one takes it over (`TakenOver`, attempt 2), the others see
/// the winner's lease, and the old holder is fenced.
pub(crate) async fn concurrency_claims_race_on_a_stale_record_under_takeover(h: Harness) {
    let arena = Arena::new(&h).await;
    for round in 0..ROUNDS {
        let t0 = h.now();
        let (id, old) = arena.held(&h, "stale", round, &takeover(), t0).await;
        let at = t0 + LEASE + Duration::from_millis(round as u64);
        let what = format!("round {round}, stale record under Takeover");
        let expected = (ClaimKind::TakenOver, 2);
        arena
            .claims_race(&what, &id, &takeover(), old, expected, at)
            .await;
    }
}

/// The holder completes while [`CONTENDERS`] claims arrive, over [`ROUNDS`] rounds: no claim
/// wins, each sees the holder in flight or replays its outcome, the completion stands.
pub(crate) async fn concurrency_claims_racing_a_completion_never_win(h: Harness) {
    let arena = Arena::new(&h).await;
    let stores = &arena.stores;
    let now = h.now();
    for round in 0..ROUNDS {
        let (id, holder) = arena.held(&h, "completing", round, &policy(), now).await;
        let done = ok(&format!("done-{round}"));
        let gate = Gate::new(CONTENDERS + 1);
        let completion = {
            let store = stores[0].clone();
            let (id, done) = (id.clone(), done.clone());
            gate.spawn(async move {
                store
                    .complete(&id, holder, &done, &policy(), now)
                    .await
                    .unwrap()
            })
        };
        let answers = race(&gate, CONTENDERS, |i| {
            claim_of(&stores[1 + i % (HANDLES - 1)], &id, &policy(), now)
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
        let r = stores[HANDLES - 1].get(&id, now).await.unwrap().unwrap();
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
pub(crate) async fn concurrency_claims_racing_a_release_one_winner(h: Harness) {
    let arena = Arena::new(&h).await;
    let stores = &arena.stores;
    let now = h.now();
    for round in 0..ROUNDS {
        let (id, holder) = arena.held(&h, "releasing", round, &policy(), now).await;
        let gate = Gate::new(CONTENDERS + 1);
        let release = {
            let store = stores[0].clone();
            let id = id.clone();
            gate.spawn(async move { store.release(&id, holder, now).await.unwrap() })
        };
        let answers = race(&gate, CONTENDERS, |i| {
            let store = stores[1 + i % (HANDLES - 1)].clone();
            let id = id.clone();
            async move {
                // Claim until the record is no longer the holder's: then someone won.
                for _ in 0..100_000 {
                    let answer = store.claim(&id, &fp("a"), &policy(), now).await.unwrap();
                    match answer {
                        ClaimAnswer::Claimed { .. } => return answer,
                        ClaimAnswer::InFlight { stale: false, .. } => {
                            let r = store.get(&id, now).await.unwrap().unwrap();
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
            .assert_one_winner(&what, &id, &answers, holder, expected, now)
            .await;
    }
}
