//! [contract §6.1](idem_core::contract#checkpoints) and [§3.10](idem_core::contract#guarantee-10):
//! checkpoints are fenced like `complete`, kept through a release, a retryable outcome and a
//! takeover, in order and byte for byte, and end with the operation (completion, expiry, purge);
//! one over the limit is refused before anything is written.
//!
//! A store whose [`KeyStore::supports_checkpoints`] is false is not failed by these cases: each
//! checks that it refuses a checkpoint with [`StoreError::CheckpointsUnsupported`] (never a
//! silent "saved") and reports it as not supporting checkpoints.
//!
//! `checkpoint_gone_after_expiry_and_purge` purges in the window 1975–1976 (see
//! [`expiry`]).

use idem_core::machine::CheckpointAnswer;
use idem_core::machine::{CompleteAnswer, ReleaseAnswer};
use idem_core::{Checkpoint, RecordState, StoreError};

use super::*;
use crate::harness::Harness;

mod race;

pub(crate) use race::{
    checkpoint_kept_by_a_racing_reconciler_takeover, checkpoint_kept_by_a_racing_takeover,
};

/// The store, if it claims checkpoints; otherwise checks that it refuses one with the typed
/// error, notes it on the harness, and returns `None` (the case then passes as "not supported").
async fn supporting(h: &Harness) -> Option<Arc<dyn KeyStore>> {
    let store = h.store().await;
    if store.supports_checkpoints() {
        return Some(store);
    }
    let (scope, key) = (h.scope("unsupported"), h.key("k"));
    let token = claim_new(&store, &scope, &key, &fp("a"), &policy(), h.now()).await;
    let before = read_back(h, &scope, &key).await;
    let got = store
        .checkpoint(&scope, &key, token, &step("a", 1, h.now()), &policy())
        .await;
    assert!(
        matches!(got, Err(StoreError::CheckpointsUnsupported { .. })),
        "a store that does not support checkpoints must refuse them with \
         StoreError::CheckpointsUnsupported, never drop them silently: got {got:?}"
    );
    assert_eq!(read_back(h, &scope, &key).await, before, "nothing written");
    h.not_supported("checkpoints");
    None
}

/// A checkpoint `name` whose value mentions `n`, with unicode, escapes and odd spacing that must
/// come back byte for byte.
fn step(name: &str, n: u32, at: Timestamp) -> Checkpoint {
    let value = format!("{{ \"n\": {n},\n \"note\": \"é 😀 \\\"q\\\" \\u00e9\", \"x\": 1.50 }}");
    Checkpoint::new(name, value, at).expect("JSON value")
}

async fn save(
    store: &Arc<dyn KeyStore>,
    scope: &Scope,
    key: &IdempotencyKey,
    token: Token,
    checkpoint: &Checkpoint,
) -> CheckpointAnswer {
    store
        .checkpoint(scope, key, token, checkpoint, &policy())
        .await
        .unwrap()
}

/// The names and values of a record's checkpoints.
fn steps(r: &Record) -> Vec<(String, String, Timestamp)> {
    r.checkpoints
        .iter()
        .map(|c| (c.name().to_owned(), c.value().to_owned(), c.saved_at()))
        .collect()
}

/// The holder's checkpoints are saved in order, byte for byte, with their times; nothing else
/// of the record changes but `updated_at`.
pub(crate) async fn checkpoint_saved_in_order_byte_for_byte(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let (scope, key) = (h.scope("s"), h.key("k"));
    let token = claim_new(&store, &scope, &key, &fp("a"), &policy(), h.now()).await;
    let claimed = read_back(&h, &scope, &key).await;
    let mut want = Vec::new();
    for (i, name) in ["charged", "émail \"sent\"", "charged"]
        .into_iter()
        .enumerate()
    {
        h.advance(Duration::from_millis(7));
        let c = step(name, i as u32, h.now());
        assert_eq!(
            save(&store, &scope, &key, token, &c).await,
            CheckpointAnswer::Saved
        );
        want.push((c.name().to_owned(), c.value().to_owned(), c.saved_at()));
    }
    let r = read_back(&h, &scope, &key).await;
    assert_eq!(steps(&r), want, "in order, byte for byte, with their times");
    assert_eq!(
        Record {
            checkpoints: Vec::new(),
            updated_at: claimed.updated_at,
            ..r.clone()
        },
        claimed,
        "only the checkpoints and updated_at change"
    );
    assert_eq!(r.updated_at, h.now());
}

/// After a takeover the stale holder's checkpoint is `Fenced` and writes nothing; the new
/// holder starts with the old holder's steps and adds its own.
pub(crate) async fn checkpoint_stale_holder_is_fenced_after_takeover(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let (scope, key) = (h.scope("s"), h.key("k"));
    let old = claim_new(&store, &scope, &key, &fp("a"), &takeover(), h.now()).await;
    let charged = step("charged", 1, h.now());
    assert_eq!(
        save(&store, &scope, &key, old, &charged).await,
        CheckpointAnswer::Saved
    );
    h.advance(LEASE + Duration::from_millis(1));
    let (new, attempt, kind) = won(
        &h.store()
            .await
            .claim(&scope, &key, &fp("a"), &takeover(), h.now())
            .await
            .unwrap(),
        "takeover",
    );
    assert_eq!((attempt, kind), (2, ClaimKind::TakenOver));
    let taken = read_back(&h, &scope, &key).await;
    assert_eq!(
        taken.checkpoints,
        vec![charged.clone()],
        "a takeover keeps them"
    );
    let late = step("emailed", 2, h.now());
    assert_eq!(
        save(&store, &scope, &key, old, &late).await,
        CheckpointAnswer::Fenced
    );
    assert_eq!(read_back(&h, &scope, &key).await, taken, "nothing written");
    let mine = step("emailed", 3, h.now());
    assert_eq!(
        save(&store, &scope, &key, new, &mine).await,
        CheckpointAnswer::Saved
    );
    assert_eq!(
        read_back(&h, &scope, &key).await.checkpoints,
        vec![charged, mine]
    );
}

/// No record, a token never handed out, a completed record, a released one: `Fenced`, nothing
/// written. A holder whose lease elapsed, with nobody taking over, still saves.
pub(crate) async fn checkpoint_fenced_like_complete(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let (scope, key) = (h.scope("s"), h.key("k"));
    let c = step("charged", 1, h.now());
    let never = Token::with_id(1, 0xdead);
    assert_eq!(
        save(&store, &scope, &key, never, &c).await,
        CheckpointAnswer::Fenced
    );
    assert!(store.get(&scope, &key, h.now()).await.unwrap().is_none());

    let token = claim_new(&store, &scope, &key, &fp("a"), &policy(), h.now()).await;
    let forged = Token::with_id(token.seq, token.id ^ 1);
    let before = read_back(&h, &scope, &key).await;
    assert_eq!(
        save(&store, &scope, &key, forged, &c).await,
        CheckpointAnswer::Fenced
    );
    assert_eq!(read_back(&h, &scope, &key).await, before);

    h.advance(LEASE + Duration::from_secs(1));
    let late = step("late", 2, h.now());
    assert_eq!(
        save(&store, &scope, &key, token, &late).await,
        CheckpointAnswer::Saved,
        "a lease ends a claim only by a takeover"
    );

    let released = h.key("released");
    let t2 = claim_new(&store, &scope, &released, &fp("a"), &policy(), h.now()).await;
    assert_eq!(
        store.release(&scope, &released, t2, h.now()).await.unwrap(),
        ReleaseAnswer::Released
    );
    let before = read_back(&h, &scope, &released).await;
    assert_eq!(
        save(&store, &scope, &released, t2, &c).await,
        CheckpointAnswer::Fenced
    );
    assert_eq!(read_back(&h, &scope, &released).await, before);

    let done = h.key("done");
    let t3 = claim_new(&store, &scope, &done, &fp("a"), &policy(), h.now()).await;
    store
        .complete(&scope, &done, t3, &ok("T"), &policy(), h.now())
        .await
        .unwrap();
    let before = read_back(&h, &scope, &done).await;
    assert_eq!(
        save(&store, &scope, &done, t3, &c).await,
        CheckpointAnswer::Fenced
    );
    assert_eq!(read_back(&h, &scope, &done).await, before);
}

/// A release and a retryable outcome keep the checkpoints; the retry's claim starts with them.
pub(crate) async fn checkpoint_kept_across_release_and_retryable_outcome(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let (scope, key) = (h.scope("s"), h.key("k"));
    let first = claim_new(&store, &scope, &key, &fp("a"), &policy(), h.now()).await;
    let a = step("a", 1, h.now());
    save(&store, &scope, &key, first, &a).await;
    store.release(&scope, &key, first, h.now()).await.unwrap();
    let r = read_back(&h, &scope, &key).await;
    assert_eq!(r.state, RecordState::FailedRetryable);
    assert_eq!(r.checkpoints, vec![a.clone()], "a release keeps them");

    let (second, ..) = won(
        &store
            .claim(&scope, &key, &fp("a"), &policy(), h.now())
            .await
            .unwrap(),
        "retry after release",
    );
    assert_eq!(
        read_back(&h, &scope, &key).await.checkpoints,
        vec![a.clone()]
    );
    let b = step("b", 2, h.now());
    save(&store, &scope, &key, second, &b).await;
    assert_eq!(
        store
            .complete(&scope, &key, second, &retryable(), &policy(), h.now())
            .await
            .unwrap(),
        CompleteAnswer::MarkedRetryable
    );
    assert_eq!(
        read_back(&h, &scope, &key).await.checkpoints,
        vec![a.clone(), b.clone()],
        "a retryable outcome keeps them"
    );
    won(
        &store
            .claim(&scope, &key, &fp("a"), &policy(), h.now())
            .await
            .unwrap(),
        "retry after a retryable outcome",
    );
    assert_eq!(read_back(&h, &scope, &key).await.checkpoints, vec![a, b]);
}

/// A completion ends them: the completed record has none (under `CacheAll`, a retryable outcome
/// that completes too).
pub(crate) async fn checkpoint_gone_after_completion(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let all = policy()
        .to_builder()
        .cache(idem_core::CachePolicy::CacheAll)
        .build()
        .unwrap();
    for (name, outcome, p) in [
        ("definitive", ok("T"), policy()),
        ("cache-all", retryable(), all),
    ] {
        let (scope, key) = (h.scope(name), h.key("k"));
        let token = claim_new(&store, &scope, &key, &fp("a"), &p, h.now()).await;
        save(&store, &scope, &key, token, &step("a", 1, h.now())).await;
        assert_eq!(
            store
                .complete(&scope, &key, token, &outcome, &p, h.now())
                .await
                .unwrap(),
            CompleteAnswer::Completed
        );
        let r = read_back(&h, &scope, &key).await;
        assert_eq!(r.state, RecordState::Completed);
        assert!(r.checkpoints.is_empty(), "{name}: {:?}", r.checkpoints);
    }
}

/// Expiry ends them: the record that replaces an expired one starts with none, and a purge
/// deletes them with their record.
pub(crate) async fn checkpoint_gone_after_expiry_and_purge(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let (scope, key) = (h.scope("s"), h.key("k"));
    let base = ancient(1975, 1976);
    for (round, k) in [h.key("replaced"), key.clone()].iter().enumerate() {
        let token = claim_new(&store, &scope, k, &fp("a"), &policy(), base).await;
        let c = step("a", round as u32, base);
        assert_eq!(
            store
                .checkpoint(&scope, k, token, &c, &policy())
                .await
                .unwrap(),
            CheckpointAnswer::Saved
        );
    }
    let later = base + TTL + Duration::from_secs(1);
    // Replaced: the new record has none.
    let replaced = h.key("replaced");
    let long = policy()
        .to_builder()
        .ttl(Duration::from_secs(200 * 365 * 24 * 3600))
        .build()
        .unwrap();
    let (new, attempt, kind) = won(
        &store
            .claim(&scope, &replaced, &fp("a"), &long, later)
            .await
            .unwrap(),
        "claim of an expired record",
    );
    if kind == ClaimKind::ExpiredReplaced {
        assert_eq!(attempt, 1);
    }
    let r = store.get(&scope, &replaced, later).await.unwrap().unwrap();
    assert!(r.checkpoints.is_empty(), "{:?}", r.checkpoints);
    // Purged: gone with the record (a concurrent purge of a later window may hold it a moment).
    let mut rounds = 0;
    while store.purge_expired(later, 1000).await.unwrap() == 1000
        || store.get(&scope, &key, base).await.unwrap().is_some()
    {
        rounds += 1;
        assert!(rounds < 1000, "the expired record is still stored");
        tokio::task::yield_now().await;
    }
    let token = claim_new(&store, &scope, &key, &fp("a"), &long, later).await;
    let r = store.get(&scope, &key, later).await.unwrap().unwrap();
    assert!(r.checkpoints.is_empty(), "{:?}", r.checkpoints);
    // Leave nothing stale for other cases' lists.
    for (k, t) in [(&replaced, new), (&key, token)] {
        store
            .complete(&scope, k, t, &ok("T"), &long, later)
            .await
            .unwrap();
    }
}

/// A checkpoint of exactly the limit is saved; one byte over is `CheckpointTooLarge`, before
/// anything is written.
pub(crate) async fn checkpoint_over_the_limit_is_refused_and_nothing_written(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let (scope, key) = (h.scope("s"), h.key("k"));
    let small = policy()
        .to_builder()
        .max_checkpoint_bytes(64)
        .build()
        .unwrap();
    let token = claim_new(&store, &scope, &key, &fp("a"), &small, h.now()).await;
    let fits = Checkpoint::new("name", format!("\"{}\"", "x".repeat(58)), h.now()).unwrap();
    assert_eq!(fits.size(), 64);
    let over = Checkpoint::new("name", format!("\"{}\"", "x".repeat(59)), h.now()).unwrap();
    let before = read_back(&h, &scope, &key).await;
    match store.checkpoint(&scope, &key, token, &over, &small).await {
        Err(StoreError::CheckpointTooLarge(e)) => assert_eq!((e.size, e.limit), (65, 64)),
        other => panic!("expected CheckpointTooLarge, got {other:?}"),
    }
    assert_eq!(read_back(&h, &scope, &key).await, before, "nothing written");
    assert_eq!(
        store
            .checkpoint(&scope, &key, token, &fits, &small)
            .await
            .unwrap(),
        CheckpointAnswer::Saved
    );
    assert_eq!(read_back(&h, &scope, &key).await.checkpoints, vec![fits]);
}
