//! [contract §6.1](idem_core::contract#checkpoints) and [§3.10](idem_core::contract#guarantee-10):
//! checkpoints are fenced like `complete`, kept through a release, a retryable outcome and a
//! takeover, in order and byte for byte, and end with the operation (completion, expiry, purge);
//! one over the limit is refused before anything is written.
//!
//! A store that is no [`CheckpointStore`] ([`KeyStore::as_checkpoint_store`] is `None`) cannot
//! be asked for a checkpoint: these cases pass for it and report it as not supporting
//! checkpoints.
//!
//! `checkpoint_gone_after_expiry_and_purge` purges in the window 1975–1976 (see
//! [`expiry`]).

use idem_core::machine::CheckpointAnswer;
use idem_core::machine::{CompleteAnswer, ReleaseAnswer};
use idem_core::store::CheckpointStore;
use idem_core::{Checkpoint, RecordState};

use super::*;
use crate::harness::Harness;

mod race;

pub(crate) use race::{
    checkpoint_kept_by_a_racing_reconciler_takeover, checkpoint_kept_by_a_racing_takeover,
};

/// The store, if it keeps checkpoints; otherwise notes on the harness that it does not, and
/// returns `None` (the case then passes as "not supported").
async fn supporting(h: &Harness) -> Option<Arc<dyn KeyStore>> {
    let store = h.store().await;
    if store.as_checkpoint_store().is_some() {
        return Some(store);
    }
    h.not_supported("checkpoints");
    None
}

/// The checkpoints of a store [`supporting`] returned.
fn checkpoints(store: &Arc<dyn KeyStore>) -> &dyn CheckpointStore {
    store
        .as_checkpoint_store()
        .expect("a store `supporting` returned keeps checkpoints")
}

/// A checkpoint `name` whose value mentions `n`, with unicode, escapes and odd spacing that must
/// come back byte for byte.
fn step(name: &str, n: u32, at: Timestamp) -> Checkpoint {
    let value = format!("{{ \"n\": {n},\n \"note\": \"é 😀 \\\"q\\\" \\u00e9\", \"x\": 1.50 }}");
    Checkpoint::new(name, value, at).expect("JSON value")
}

async fn save(
    store: &Arc<dyn KeyStore>,
    id: &RecordId,
    token: Token,
    checkpoint: &Checkpoint,
) -> CheckpointAnswer {
    checkpoints(store)
        .checkpoint(id, token, checkpoint, &policy())
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
    let id = h.id("s", "k");
    let token = claim_new(&store, &id, &fp("a"), &policy(), h.now()).await;
    let claimed = read_back(&h, &id).await;
    let mut want = Vec::new();
    for (i, name) in ["charged", "émail \"sent\"", "charged"]
        .into_iter()
        .enumerate()
    {
        h.advance(Duration::from_millis(7));
        let c = step(name, i as u32, h.now());
        assert_eq!(save(&store, &id, token, &c).await, CheckpointAnswer::Saved);
        want.push((c.name().to_owned(), c.value().to_owned(), c.saved_at()));
    }
    let r = read_back(&h, &id).await;
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
    let id = h.id("s", "k");
    let old = claim_new(&store, &id, &fp("a"), &takeover(), h.now()).await;
    let charged = step("charged", 1, h.now());
    assert_eq!(
        save(&store, &id, old, &charged).await,
        CheckpointAnswer::Saved
    );
    h.advance(LEASE + Duration::from_millis(1));
    let (new, attempt, kind) = won(
        &h.store()
            .await
            .claim(&id, &fp("a"), &takeover(), h.now())
            .await
            .unwrap(),
        "takeover",
    );
    assert_eq!((attempt, kind), (2, ClaimKind::TakenOver));
    let taken = read_back(&h, &id).await;
    assert_eq!(
        taken.checkpoints,
        vec![charged.clone()],
        "a takeover keeps them"
    );
    let late = step("emailed", 2, h.now());
    assert_eq!(
        save(&store, &id, old, &late).await,
        CheckpointAnswer::Fenced
    );
    assert_eq!(read_back(&h, &id).await, taken, "nothing written");
    let mine = step("emailed", 3, h.now());
    assert_eq!(save(&store, &id, new, &mine).await, CheckpointAnswer::Saved);
    assert_eq!(read_back(&h, &id).await.checkpoints, vec![charged, mine]);
}

/// No record, a token never handed out, a completed record, a released one: `Fenced`, nothing
/// written. A holder whose lease elapsed, with nobody taking over, still saves.
pub(crate) async fn checkpoint_fenced_like_complete(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let (scope, key) = (h.scope("s"), h.key("k"));
    let id = RecordId::new(scope.clone(), key.clone());
    let c = step("charged", 1, h.now());
    let never = Token::with_id(1, 0xdead);
    assert_eq!(save(&store, &id, never, &c).await, CheckpointAnswer::Fenced);
    assert!(store.get(&id, h.now()).await.unwrap().is_none());

    let token = claim_new(&store, &id, &fp("a"), &policy(), h.now()).await;
    let forged = Token::with_id(token.seq, token.id ^ 1);
    let before = read_back(&h, &id).await;
    assert_eq!(
        save(&store, &id, forged, &c).await,
        CheckpointAnswer::Fenced
    );
    assert_eq!(read_back(&h, &id).await, before);

    h.advance(LEASE + Duration::from_secs(1));
    let late = step("late", 2, h.now());
    assert_eq!(
        save(&store, &id, token, &late).await,
        CheckpointAnswer::Saved,
        "a lease ends a claim only by a takeover"
    );

    let released = h.key("released");
    let id = RecordId::new(scope.clone(), released.clone());
    let t2 = claim_new(&store, &id, &fp("a"), &policy(), h.now()).await;
    assert_eq!(
        store.release(&id, t2, h.now()).await.unwrap(),
        ReleaseAnswer::Released
    );
    let before = read_back(&h, &id).await;
    assert_eq!(save(&store, &id, t2, &c).await, CheckpointAnswer::Fenced);
    assert_eq!(read_back(&h, &id).await, before);

    let done = h.key("done");
    let id = RecordId::new(scope.clone(), done.clone());
    let t3 = claim_new(&store, &id, &fp("a"), &policy(), h.now()).await;
    store
        .complete(&id, t3, &ok("T"), &policy(), h.now())
        .await
        .unwrap();
    let before = read_back(&h, &id).await;
    assert_eq!(save(&store, &id, t3, &c).await, CheckpointAnswer::Fenced);
    assert_eq!(read_back(&h, &id).await, before);
}

/// A release and a retryable outcome keep the checkpoints; the retry's claim starts with them.
pub(crate) async fn checkpoint_kept_across_release_and_retryable_outcome(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let id = h.id("s", "k");
    let first = claim_new(&store, &id, &fp("a"), &policy(), h.now()).await;
    let a = step("a", 1, h.now());
    save(&store, &id, first, &a).await;
    store.release(&id, first, h.now()).await.unwrap();
    let r = read_back(&h, &id).await;
    assert_eq!(r.state, RecordState::FailedRetryable);
    assert_eq!(r.checkpoints, vec![a.clone()], "a release keeps them");

    let (second, ..) = won(
        &store
            .claim(&id, &fp("a"), &policy(), h.now())
            .await
            .unwrap(),
        "retry after release",
    );
    assert_eq!(read_back(&h, &id).await.checkpoints, vec![a.clone()]);
    let b = step("b", 2, h.now());
    save(&store, &id, second, &b).await;
    assert_eq!(
        store
            .complete(&id, second, &retryable(), &policy(), h.now())
            .await
            .unwrap(),
        CompleteAnswer::MarkedRetryable
    );
    assert_eq!(
        read_back(&h, &id).await.checkpoints,
        vec![a.clone(), b.clone()],
        "a retryable outcome keeps them"
    );
    won(
        &store
            .claim(&id, &fp("a"), &policy(), h.now())
            .await
            .unwrap(),
        "retry after a retryable outcome",
    );
    assert_eq!(read_back(&h, &id).await.checkpoints, vec![a, b]);
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
        let id = RecordId::new(h.scope(name), h.key("k"));
        let token = claim_new(&store, &id, &fp("a"), &p, h.now()).await;
        save(&store, &id, token, &step("a", 1, h.now())).await;
        assert_eq!(
            store
                .complete(&id, token, &outcome, &p, h.now())
                .await
                .unwrap(),
            CompleteAnswer::Completed
        );
        let r = read_back(&h, &id).await;
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
    let (replaced, id) = (h.id("s", "replaced"), h.id("s", "k"));
    let base = ancient(1975, 1976);
    for (round, id) in [&replaced, &id].into_iter().enumerate() {
        let token = claim_new(&store, id, &fp("a"), &policy(), base).await;
        let c = step("a", round as u32, base);
        assert_eq!(save(&store, id, token, &c).await, CheckpointAnswer::Saved);
    }
    let later = base + TTL + Duration::from_secs(1);
    // Replaced: the new record has none.
    let long = policy()
        .to_builder()
        .ttl(Duration::from_secs(200 * 365 * 24 * 3600))
        .build()
        .unwrap();
    let (new, attempt, kind) = won(
        &store
            .claim(&replaced, &fp("a"), &long, later)
            .await
            .unwrap(),
        "claim of an expired record",
    );
    if kind == ClaimKind::ExpiredReplaced {
        assert_eq!(attempt, 1);
    }
    let r = store.get(&replaced, later).await.unwrap().unwrap();
    assert!(r.checkpoints.is_empty(), "{:?}", r.checkpoints);
    // Purged: gone with the record (a concurrent purge of a later window may hold it a moment).
    let mut rounds = 0;
    while store.purge_expired(later, 1000).await.unwrap() == 1000
        || store.get(&id, base).await.unwrap().is_some()
    {
        rounds += 1;
        assert!(rounds < 1000, "the expired record is still stored");
        tokio::task::yield_now().await;
    }
    let token = claim_new(&store, &id, &fp("a"), &long, later).await;
    let r = store.get(&id, later).await.unwrap().unwrap();
    assert!(r.checkpoints.is_empty(), "{:?}", r.checkpoints);
    // Leave nothing stale for other cases' lists.
    for (id, t) in [(&replaced, new), (&id, token)] {
        store.complete(id, t, &ok("T"), &long, later).await.unwrap();
    }
}

/// A checkpoint of exactly the limit is saved; one byte over is `CheckpointTooLarge`, before
/// anything is written.
pub(crate) async fn checkpoint_over_the_limit_is_refused_and_nothing_written(h: Harness) {
    let Some(store) = supporting(&h).await else {
        return;
    };
    let id = h.id("s", "k");
    let small = policy()
        .to_builder()
        .max_checkpoint_bytes(64)
        .build()
        .unwrap();
    let token = claim_new(&store, &id, &fp("a"), &small, h.now()).await;
    let fits = Checkpoint::new("name", format!("\"{}\"", "x".repeat(58)), h.now()).unwrap();
    assert_eq!(fits.size(), 64);
    let over = Checkpoint::new("name", format!("\"{}\"", "x".repeat(59)), h.now()).unwrap();
    let before = read_back(&h, &id).await;
    match checkpoints(&store)
        .checkpoint(&id, token, &over, &small)
        .await
    {
        Err(idem_core::StoreError::CheckpointTooLarge(e)) => {
            assert_eq!((e.size, e.limit), (65, 64))
        }
        other => panic!("expected CheckpointTooLarge, got {other:?}"),
    }
    assert_eq!(read_back(&h, &id).await, before, "nothing written");
    assert_eq!(
        checkpoints(&store)
            .checkpoint(&id, token, &fits, &small)
            .await
            .unwrap(),
        CheckpointAnswer::Saved
    );
    assert_eq!(read_back(&h, &id).await.checkpoints, vec![fits]);
}
