//! Batching (the default): claims and completions that arrive together on one store handle
//! share statements, and each still gets the answer, the token and the record it would get alone.
//! Many concurrent requests on one handle, checked at the table and by completing with the
//! tokens the claims answered. Skips (or fails under `CI`) without `IDEM_TEST_POSTGRES_URL`.

mod common;

use std::collections::HashSet;
use std::sync::Arc;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    ClaimKind, Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState,
    Scope, Timestamp, Token,
};
use idem_store_postgres::PostgresStore;
use tokio::sync::Barrier;

const N: usize = 48;

fn t0() -> Timestamp {
    Timestamp::from_millis(946_684_800_000)
}

fn fp(n: usize) -> Fingerprint {
    Fingerprint::of("create_ticket", &serde_json::json!({ "n": n })).unwrap()
}

fn ids(scope: &Scope, n: usize) -> Vec<RecordId> {
    (0..n)
        .map(|i| {
            RecordId::new(
                scope.clone(),
                IdempotencyKey::new(format!("k{i:03}")).unwrap(),
            )
        })
        .collect()
}

/// A store whose pool lets many claims read at once, so that their inserts meet in the lane
/// (a claim alone at its insert runs it on its own connection).
async fn store(url: &str, name: &str) -> PostgresStore {
    common::sized_store(url, name, 16).await
}

/// Runs `f(i)` for each `i` at once, released together by a barrier; the answers in order.
async fn all_at_once<T, F, Fut>(n: usize, f: F) -> Vec<T>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
{
    let barrier = Arc::new(Barrier::new(n));
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, call) = (barrier.clone(), f(i));
            tokio::spawn(async move {
                barrier.wait().await;
                call.await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(n);
    for task in tasks {
        out.push(task.await.unwrap());
    }
    out
}

/// Claims every key of `ids` at once (key `i` with the arguments `fp(i)`), default policy.
async fn claim_each(store: &PostgresStore, ids: &[RecordId]) -> Vec<ClaimAnswer> {
    all_at_once(ids.len(), |i| {
        let (store, id) = (store.clone(), ids[i].clone());
        async move {
            let policy = Policy::default();
            store.claim(&id, &fp(i), &policy, t0()).await.unwrap()
        }
    })
    .await
}

fn claimed(answer: &ClaimAnswer) -> Token {
    match answer {
        ClaimAnswer::Claimed {
            token,
            attempt: 1,
            kind: ClaimKind::New,
        } => *token,
        other => panic!("a new key must be claimed, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn claims_that_arrive_together_each_hold_their_own_claim() {
    let Some(url) = common::url() else { return };
    let store = store(&url, "idem-test-batch-claims").await;
    let scope = Scope::new(common::unique("batch-claims")).unwrap();
    let ids = ids(&scope, N);
    let policy = Policy::default();
    let answers = claim_each(&store, &ids).await;
    assert!(
        store.batched_requests() > 0,
        "{N} claims at once on one handle: some must have shared a batch"
    );
    let tokens: Vec<Token> = answers.iter().map(claimed).collect();
    assert_eq!(
        tokens.iter().collect::<HashSet<_>>().len(),
        N,
        "every claim its own token"
    );
    // The table holds each key once, under the token its claim answered.
    for (i, id) in ids.iter().enumerate() {
        let record = store.get(id, t0()).await.unwrap().expect("claimed record");
        assert_eq!(record.state, RecordState::Processing);
        assert_eq!(
            record.token, tokens[i],
            "{id:?}: the stored token is the one answered"
        );
        assert_eq!(record.fingerprint, fp(i));
    }
    // Each completes with its token, at once (a completion batch), and replays its own outcome.
    let before = store.batched_requests();
    let completed = all_at_once(N, |i| {
        let (store, id, token) = (store.clone(), ids[i].clone(), tokens[i]);
        async move {
            let outcome = Outcome::definitive(201, &serde_json::json!({ "ticket": i })).unwrap();
            store
                .complete(&id, token, &outcome, &policy, t0())
                .await
                .unwrap()
        }
    })
    .await;
    assert!(
        completed.iter().all(|a| *a == CompleteAnswer::Completed),
        "{completed:?}"
    );
    assert!(
        store.batched_requests() > before,
        "completions shared a batch"
    );
    let replays = claim_each(&store, &ids).await;
    for (i, answer) in replays.iter().enumerate() {
        let ClaimAnswer::Replay(outcome) = answer else {
            panic!("{i}: a completed key replays, got {answer:?}")
        };
        assert_eq!(outcome.body_json(), serde_json::json!({ "ticket": i }));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn identical_calls_in_one_batch_claim_once() {
    let Some(url) = common::url() else { return };
    let store = store(&url, "idem-test-batch-same").await;
    let scope = Scope::new(common::unique("batch-same")).unwrap();
    let id = ids(&scope, 1).remove(0);
    let policy = Policy::default();
    // The same call N times at once (a framework's parallel tool calls), and one with other
    // arguments under the same key.
    let answers = all_at_once(N + 1, |i| {
        let (store, id) = (store.clone(), id.clone());
        let fingerprint = if i == N { fp(1) } else { fp(0) };
        async move { store.claim(&id, &fingerprint, &policy, t0()).await.unwrap() }
    })
    .await;
    let won: Vec<usize> = (0..=N)
        .filter(|&i| matches!(answers[i], ClaimAnswer::Claimed { .. }))
        .collect();
    assert_eq!(won.len(), 1, "exactly one claim wins: {answers:?}");
    let winner = won[0];
    let same_call = |i: usize| (i == N) == (winner == N);
    for (i, answer) in answers.iter().enumerate() {
        match answer {
            ClaimAnswer::Claimed { .. } => assert_eq!(i, winner),
            ClaimAnswer::InFlight { .. } => assert!(same_call(i), "{i}: in flight"),
            ClaimAnswer::FingerprintMismatch => assert!(!same_call(i), "{i}: mismatch"),
            other => panic!("{i}: {other:?}"),
        }
    }
    let record = store.get(&id, t0()).await.unwrap().unwrap();
    assert_eq!(
        record.token,
        claimed(&answers[winner]),
        "the record is the winner's"
    );
    assert_eq!(record.fingerprint, if winner == N { fp(1) } else { fp(0) });
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn completions_in_one_batch_are_fenced_one_by_one() {
    let Some(url) = common::url() else { return };
    let store = store(&url, "idem-test-batch-fenced").await;
    let scope = Scope::new(common::unique("batch-fenced")).unwrap();
    let ids = ids(&scope, N);
    let policy = Policy::default();
    let mut tokens = Vec::new();
    for (i, id) in ids.iter().enumerate() {
        tokens.push(claimed(
            &store.claim(id, &fp(i), &policy, t0()).await.unwrap(),
        ));
    }
    // Every other completion names a token that does not hold the claim.
    let answers = all_at_once(N, |i| {
        let (store, id) = (store.clone(), ids[i].clone());
        let token = if i % 2 == 0 {
            tokens[i]
        } else {
            Token::with_id(tokens[i].seq, tokens[i].id ^ 1)
        };
        let outcome = if i % 4 == 0 {
            Outcome::retryable(503, &serde_json::json!({ "busy": i })).unwrap()
        } else {
            Outcome::definitive(200, &serde_json::json!({ "ok": i })).unwrap()
        };
        async move {
            store
                .complete(&id, token, &outcome, &policy, t0())
                .await
                .unwrap()
        }
    })
    .await;
    for (i, (id, answer)) in ids.iter().zip(&answers).enumerate() {
        let record = store.get(id, t0()).await.unwrap().unwrap();
        match i % 4 {
            0 => {
                assert_eq!(*answer, CompleteAnswer::MarkedRetryable, "{i}");
                assert_eq!(record.state, RecordState::FailedRetryable);
            }
            2 => {
                assert_eq!(*answer, CompleteAnswer::Completed, "{i}");
                assert_eq!(record.state, RecordState::Completed);
                let outcome = record.outcome.expect("stored outcome");
                assert_eq!(outcome.body_json(), serde_json::json!({ "ok": i }));
            }
            _ => {
                assert_eq!(*answer, CompleteAnswer::Fenced, "{i}");
                assert_eq!(
                    record.state,
                    RecordState::Processing,
                    "{i}: nothing written"
                );
                assert!(record.outcome.is_none());
                assert_eq!(record.token, tokens[i]);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_batch_of_replays_new_keys_and_repeats_answers_each() {
    let Some(url) = common::url() else { return };
    let store = store(&url, "idem-test-batch-mixed").await;
    let scope = Scope::new(common::unique("batch-mixed")).unwrap();
    let ids = ids(&scope, N);
    let policy = Policy::default();
    // The first half completed before, the second half new; each key asked for twice at once.
    for (i, id) in ids.iter().enumerate().take(N / 2) {
        let token = claimed(&store.claim(id, &fp(i), &policy, t0()).await.unwrap());
        let outcome = Outcome::definitive(200, &serde_json::json!({ "done": i })).unwrap();
        store
            .complete(id, token, &outcome, &policy, t0())
            .await
            .unwrap();
    }
    let answers = all_at_once(2 * N, |j| {
        let (store, i) = (store.clone(), j % N);
        let id = ids[i].clone();
        async move { (i, store.claim(&id, &fp(i), &policy, t0()).await.unwrap()) }
    })
    .await;
    let mut won = vec![0; N];
    for (i, answer) in answers {
        match answer {
            ClaimAnswer::Replay(outcome) => {
                assert!(i < N / 2, "{i}: only a completed key replays");
                assert_eq!(outcome.body_json(), serde_json::json!({ "done": i }));
            }
            ClaimAnswer::Claimed { token, .. } => {
                assert!(i >= N / 2, "{i}: a completed key is never claimed again");
                won[i] += 1;
                assert_eq!(
                    store.get(&ids[i], t0()).await.unwrap().unwrap().token,
                    token
                );
            }
            ClaimAnswer::InFlight { .. } => assert!(i >= N / 2),
            other => panic!("{i}: {other:?}"),
        }
    }
    assert!(
        won[N / 2..].iter().all(|&w| w == 1),
        "each new key claimed once: {won:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_batching_no_request_shares_a_batch() {
    let Some(url) = common::url() else { return };
    let store = store(&url, "idem-test-batch-off")
        .await
        .with_batching(false);
    let scope = Scope::new(common::unique("batch-off")).unwrap();
    let ids = ids(&scope, N);
    let answers = claim_each(&store, &ids).await;
    answers.iter().for_each(|a| {
        claimed(a);
    });
    assert_eq!(store.batched_requests(), 0);
}
