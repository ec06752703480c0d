//! SPEC §3.1: concurrent claims from separate handles: exactly one winner.

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::{ClaimAnswer, Executor};
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
    const CALLERS: usize = 16;
    let stores = handles(&h).await;
    let (scope, key) = (h.scope("race"), h.key("wf-9:step-1:charge"));
    let effects = Arc::new(AtomicUsize::new(0));
    let gate = Arc::new(Barrier::new(CALLERS));
    let mut tasks = Vec::new();
    for i in 0..CALLERS {
        let executor = Executor::from_arc(stores[i % HANDLES].clone())
            .with_policy(policy())
            .with_clock(h.clock().clone());
        let (scope, key, effects, gate) =
            (scope.clone(), key.clone(), effects.clone(), gate.clone());
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            executor
                .run(&scope, &key, &fp("charge"), |_| async move {
                    effects.fetch_add(1, Ordering::SeqCst);
                    ok("CH-1")
                })
                .await
        }));
    }
    let (mut executed, mut replayed, mut in_flight) = (0, 0, 0);
    for task in tasks {
        match task.await.unwrap() {
            Ok(e) if !e.is_replay() => executed += 1,
            Ok(e) => {
                assert_eq!(e.outcome(), &ok("CH-1"));
                replayed += 1;
            }
            Err(idem_core::Error::InFlight { .. }) => in_flight += 1,
            Err(e) => panic!("unexpected error: {e}"),
        }
    }
    assert_eq!(
        effects.load(Ordering::SeqCst),
        1,
        "the effect happened exactly once"
    );
    assert_eq!(executed, 1);
    assert_eq!(executed + replayed + in_flight, CALLERS);
}
