//! What the rules write, seen through a store ([contract §2](idem_core::contract#states)): the
//! fields an operator and a waiter read back (`updated_at`, the last write, which `idem keys ls
//! --older-than` selects on and a waiter wakes on). Each test names the rule it pins; they were
//! written against the mutants `scripts/mutants` found no test for (docs/mutants.md).

use idem_core::store::CheckpointStore;
use std::time::Duration;

use idem_core::machine::{
    CheckpointAnswer, ClaimAnswer, ClaimKind, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::store::ListFilter;
use idem_core::{
    Checkpoint, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, Outcome, Policy, RecordId,
    RecordState, Scope, StalePolicy, StoreError, Timestamp, Token,
};

const LEASE: Duration = Duration::from_secs(30);

fn t(secs: u64) -> Timestamp {
    Timestamp::from_millis(1_700_000_000_000 + secs * 1000)
}

struct World {
    store: MemoryStore,
    scope: Scope,
    key: IdempotencyKey,
    fp: Fingerprint,
}

fn world() -> World {
    World {
        store: MemoryStore::new(),
        scope: Scope::new("records/test").unwrap(),
        key: IdempotencyKey::new("k-1").unwrap(),
        fp: Fingerprint::of_bytes(b"request"),
    }
}

fn policy(stale: StalePolicy) -> Policy {
    Policy::builder().lease(LEASE).stale(stale).build().unwrap()
}

impl World {
    async fn claim(&self, policy: &Policy, now: Timestamp) -> ClaimAnswer {
        self.store
            .claim(
                &RecordId::new(self.scope.clone(), self.key.clone()),
                &self.fp,
                policy,
                now,
            )
            .await
            .unwrap()
    }

    async fn claimed(&self, policy: &Policy, now: Timestamp) -> (Token, ClaimKind) {
        match self.claim(policy, now).await {
            ClaimAnswer::Claimed { token, kind, .. } => (token, kind),
            other => panic!("expected a claim, got {other:?}"),
        }
    }

    /// The keys an operator lists as last written at or before `before`.
    async fn written_by(&self, before: Timestamp, now: Timestamp) -> usize {
        let filter = ListFilter {
            updated_before: Some(before),
            ..ListFilter::default()
        };
        self.store.list(&filter, now, 10).await.unwrap().len()
    }
}

/// A retry of a `failed_retryable` record and a takeover of a stale claim are writes: the record
/// says when, and an operator listing what was last written before them no longer finds it.
#[tokio::test]
async fn a_retry_and_a_takeover_are_the_records_last_write() {
    for (stale, kind) in [
        (StalePolicy::Reconcile, ClaimKind::Retry),
        (StalePolicy::Takeover, ClaimKind::TakenOver),
    ] {
        let w = world();
        let p = policy(stale);
        let (token, _) = w.claimed(&p, t(0)).await;
        if kind == ClaimKind::Retry {
            let released = w
                .store
                .release(&RecordId::new(w.scope.clone(), w.key.clone()), token, t(1))
                .await;
            assert_eq!(released.unwrap(), ReleaseAnswer::Released);
        }
        let again = t(100); // after the first lease ended
        assert_eq!(w.claimed(&p, again).await.1, kind);

        let record = w
            .store
            .get(&RecordId::new(w.scope.clone(), w.key.clone()), again)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(record.state, RecordState::Processing);
        assert_eq!(record.updated_at, again, "{kind:?}");
        assert_eq!(record.created_at, t(0));
        assert_eq!(w.written_by(t(50), again).await, 0, "{kind:?}");
        assert_eq!(w.written_by(again, again).await, 1, "{kind:?}");
    }
}

/// A retry or a takeover starts a fresh ttl: a claim made just before the record would have
/// expired is not lost to that expiry, and a caller arriving after it finds the operation in
/// flight, not a key free to claim again (which would run the operation twice).
#[tokio::test]
async fn a_retry_and_a_takeover_start_a_fresh_ttl() {
    const TTL: Duration = Duration::from_secs(3600);
    for (stale, kind) in [
        (StalePolicy::Reconcile, ClaimKind::Retry),
        (StalePolicy::Takeover, ClaimKind::TakenOver),
    ] {
        let w = world();
        let p = policy(stale).to_builder().ttl(TTL).build().unwrap();
        let (token, _) = w.claimed(&p, t(0)).await;
        if kind == ClaimKind::Retry {
            let released = w
                .store
                .release(&RecordId::new(w.scope.clone(), w.key.clone()), token, t(1))
                .await;
            assert_eq!(released.unwrap(), ReleaseAnswer::Released);
        }
        let late = t(TTL.as_secs() - 10);
        let (holder, won) = w.claimed(&p, late).await;
        assert_eq!(won, kind);

        let after_first_ttl = t(TTL.as_secs() + 5);
        let record = w
            .store
            .get(
                &RecordId::new(w.scope.clone(), w.key.clone()),
                after_first_ttl,
            )
            .await
            .unwrap();
        let record = record.expect("the claim made before the first ttl ended is still there");
        assert_eq!((record.token, record.expires_at), (holder, late + TTL));
        assert!(
            matches!(
                w.claim(&p, after_first_ttl).await,
                ClaimAnswer::InFlight { stale: false, .. }
            ),
            "{kind:?}"
        );
    }
}

/// Every write of the holder is the record's last write: a checkpoint, an extend, a release and a
/// completion (definitive, or retryable and kept as `failed_retryable`) each set `updated_at`, and
/// an operator listing what was last written before it no longer finds the key.
#[tokio::test]
async fn every_write_of_the_holder_is_the_records_last_write() {
    let p = policy(StalePolicy::Reconcile);
    let ok = Outcome::definitive(201, &serde_json::json!({"id": 1})).unwrap();
    let down = Outcome::retryable(503, &serde_json::json!({"error": "down"})).unwrap();
    for write in [
        "checkpoint",
        "extend",
        "release",
        "complete",
        "complete retryable",
    ] {
        let w = world();
        let (token, _) = w.claimed(&p, t(0)).await;
        let at = t(10);
        let (s, k) = (&w.scope, &w.key);
        match write {
            "checkpoint" => {
                let cp = Checkpoint::new("step-1", "{\"n\": 1}", at).unwrap();
                let saved = w
                    .store
                    .checkpoint(&RecordId::new(s.clone(), k.clone()), token, &cp, &p)
                    .await
                    .unwrap();
                assert_eq!(saved, CheckpointAnswer::Saved);
            }
            "extend" => {
                let extended = w
                    .store
                    .extend(&RecordId::new(s.clone(), k.clone()), token, LEASE, at)
                    .await
                    .unwrap();
                assert!(matches!(extended, ExtendAnswer::Extended { .. }));
            }
            "release" => {
                let released = w
                    .store
                    .release(&RecordId::new(s.clone(), k.clone()), token, at)
                    .await
                    .unwrap();
                assert_eq!(released, ReleaseAnswer::Released);
            }
            "complete" => {
                let done = w
                    .store
                    .complete(&RecordId::new(s.clone(), k.clone()), token, &ok, &p, at)
                    .await
                    .unwrap();
                assert_eq!(done, CompleteAnswer::Completed);
            }
            _ => {
                let done = w
                    .store
                    .complete(&RecordId::new(s.clone(), k.clone()), token, &down, &p, at)
                    .await
                    .unwrap();
                assert_eq!(done, CompleteAnswer::MarkedRetryable);
            }
        }
        let record = w
            .store
            .get(&RecordId::new(s.clone(), k.clone()), at)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (record.created_at, record.updated_at),
            (t(0), at),
            "{write}"
        );
        assert_eq!(w.written_by(t(5), at).await, 0, "{write}");
        assert_eq!(w.written_by(at, at).await, 1, "{write}");
    }
}

/// The checkpoint size limit is inclusive ([contract §6.1](idem_core::contract#checkpoints)): a
/// checkpoint of exactly `max_checkpoint_bytes` is saved, one byte more is refused and leaves
/// the record as it was.
#[tokio::test]
async fn a_checkpoint_of_exactly_the_limit_is_saved_one_byte_more_is_refused() {
    let w = world();
    let p = policy(StalePolicy::Reconcile)
        .to_builder()
        .max_checkpoint_bytes(16)
        .build()
        .unwrap();
    let (token, _) = w.claimed(&p, t(0)).await;
    let (s, k) = (&w.scope, &w.key);

    let at_limit = Checkpoint::new("step-1", "\"12345678\"", t(1)).unwrap();
    assert_eq!(at_limit.size(), 16);
    let saved = w
        .store
        .checkpoint(&RecordId::new(s.clone(), k.clone()), token, &at_limit, &p)
        .await;
    assert_eq!(saved.unwrap(), CheckpointAnswer::Saved);

    let over = Checkpoint::new("step-2", "\"123456789\"", t(2)).unwrap();
    assert_eq!(over.size(), 17);
    let refused = w
        .store
        .checkpoint(&RecordId::new(s.clone(), k.clone()), token, &over, &p)
        .await;
    assert!(
        matches!(refused, Err(StoreError::CheckpointTooLarge(ref e)) if e.size == 17 && e.limit == 16),
        "{refused:?}"
    );

    let record = w
        .store
        .get(&RecordId::new(s.clone(), k.clone()), t(3))
        .await
        .unwrap()
        .unwrap();
    let names: Vec<&str> = record.checkpoints.iter().map(|c| c.name()).collect();
    assert_eq!(names, ["step-1"]);
    assert_eq!(record.updated_at, t(1));
}

/// Under the default policy a completed record replays for 24 hours (contract §1, ttl) and is
/// gone after: a claim a minute before the ttl ends is a replay, one at its end is new.
#[tokio::test]
async fn the_default_policy_keeps_a_record_for_24_hours() {
    let w = world();
    let p = Policy::default();
    // And its other limits: a 30 s lease, 1 MiB outcomes, 64 KiB checkpoints.
    assert_eq!(p.lease(), Duration::from_secs(30));
    assert_eq!(p.max_outcome_bytes(), 1024 * 1024);
    assert_eq!(p.max_checkpoint_bytes(), 64 * 1024);
    let (token, _) = w.claimed(&p, t(0)).await;
    let done = Outcome::definitive(201, &serde_json::json!({"ticket": "T-1"})).unwrap();
    let id = RecordId::new(w.scope.clone(), w.key.clone());
    let completed = w.store.complete(&id, token, &done, &p, t(0)).await;
    assert_eq!(completed.unwrap(), CompleteAnswer::Completed);
    let day = 24 * 3600;
    assert!(matches!(
        w.claim(&p, t(day - 60)).await,
        ClaimAnswer::Replay(_)
    ));
    assert!(matches!(
        w.claim(&p, t(day)).await,
        ClaimAnswer::Claimed {
            kind: ClaimKind::ExpiredReplaced,
            ..
        }
    ));
}

/// What an operator lists (`idem keys ls --state`, `--scope`) is the records of that state and
/// scope, no other; a store that holds a record is not empty.
#[tokio::test]
async fn a_listing_by_state_or_scope_selects_only_those_records() {
    let store = MemoryStore::new();
    assert!(store.is_empty());
    let p = policy(StalePolicy::Reconcile);
    let fp = Fingerprint::of_bytes(b"request");
    let (a, b) = (
        Scope::new("records/a").unwrap(),
        Scope::new("records/b").unwrap(),
    );
    let id =
        |scope: &Scope, key: &str| RecordId::new(scope.clone(), IdempotencyKey::new(key).unwrap());
    // `a/done` completed; `a/running` and `b/running` in flight.
    for id in [id(&a, "done"), id(&a, "running"), id(&b, "running")] {
        let answer = store.claim(&id, &fp, &p, t(0)).await.unwrap();
        let ClaimAnswer::Claimed { token, .. } = answer else {
            panic!("{answer:?}")
        };
        if id.key().as_str() == "done" {
            let outcome = Outcome::definitive(200, &serde_json::json!({})).unwrap();
            let done = store.complete(&id, token, &outcome, &p, t(1)).await;
            assert_eq!(done.unwrap(), CompleteAnswer::Completed);
        }
    }
    assert!(!store.is_empty());
    let listed = |filter: ListFilter| {
        let store = &store;
        async move {
            let records = store.list(&filter, t(2), 10).await.unwrap();
            let mut names: Vec<String> = records
                .iter()
                .map(|r| format!("{}/{}", r.scope.as_str(), r.key.as_str()))
                .collect();
            names.sort();
            names
        }
    };
    let state = |state| ListFilter {
        state: Some(state),
        ..ListFilter::default()
    };
    assert_eq!(
        listed(state(RecordState::Completed)).await,
        ["records/a/done"]
    );
    assert_eq!(
        listed(state(RecordState::Processing)).await,
        ["records/a/running", "records/b/running"]
    );
    let scope = ListFilter {
        scope: Some(b.clone()),
        ..ListFilter::default()
    };
    assert_eq!(listed(scope).await, ["records/b/running"]);
}

/// A listing (`idem keys ls`) is oldest write first, ties by scope then key, and holds at most
/// its limit: the first page is the records left untouched the longest.
#[tokio::test]
async fn a_listing_is_oldest_write_first_and_holds_at_most_its_limit() {
    let store = MemoryStore::new();
    let p = policy(StalePolicy::Reconcile);
    let fp = Fingerprint::of_bytes(b"request");
    let scope = Scope::new("records/a").unwrap();
    for (key, at) in [("k-new", 3), ("k-old", 1), ("k-tie-b", 2), ("k-tie-a", 2)] {
        let id = RecordId::new(scope.clone(), IdempotencyKey::new(key).unwrap());
        let answer = store.claim(&id, &fp, &p, t(at)).await.unwrap();
        assert!(matches!(answer, ClaimAnswer::Claimed { .. }), "{answer:?}");
    }
    let listed = |limit| {
        let store = &store;
        async move {
            let records = store.list(&ListFilter::default(), t(4), limit).await;
            let keys = records
                .unwrap()
                .into_iter()
                .map(|r| r.key.as_str().to_owned());
            keys.collect::<Vec<_>>()
        }
    };
    assert_eq!(listed(10).await, ["k-old", "k-tie-a", "k-tie-b", "k-new"]);
    assert_eq!(listed(2).await, ["k-old", "k-tie-a"]);
}
