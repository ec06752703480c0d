//! [contract §3.7](idem_core::contract#guarantee-7): inspection (`get`, `list_in_flight`, `list`).

use super::*;

/// `get` returns the record as stored, and `None` for a key never claimed.
pub(crate) async fn inspect_get_returns_the_record(h: Harness) {
    let (store, id) = one(&h).await;
    assert_eq!(store.get(&id, h.now()).await.unwrap(), None);
    let t0 = h.now();
    let token = claim_new(&store, &id, &fp("a"), &policy(), t0).await;
    h.advance(Duration::from_secs(2));
    store
        .complete(&id, token, &ok("T"), &policy(), h.now())
        .await
        .unwrap();
    let r = store.get(&id, h.now()).await.unwrap().unwrap();
    assert_eq!(r.created_at, t0);
    assert_eq!(r.updated_at, h.now());
    assert_eq!(r.lease_until, t0 + LEASE);
    assert_eq!(
        (r.attempt, r.token, r.state),
        (1, token, RecordState::Completed)
    );
    assert_eq!(store.get(&h.id("s", "other"), h.now()).await.unwrap(), None);
}

/// `list_in_flight(older_than, limit)` returns the `processing` records whose lease ended by
/// `older_than`, earliest first, at most `limit`; not running leases, not completed, not
/// released, not expired.
pub(crate) async fn inspect_list_in_flight_returns_only_stale_processing(h: Harness) {
    let store = h.store().await;
    let base = ancient(1980, 2000);
    let scope = h.scope("list");
    let at = |s: u64| base + Duration::from_secs(s);
    let id = |key: &str| RecordId::new(scope.clone(), h.key(key));
    let claim = |key: &'static str, t| {
        let (store, id) = (store.clone(), id(key));
        async move {
            claimed(
                &store.claim(&id, &fp("a"), &policy(), t).await.unwrap(),
                "absent key",
            )
            .0
        }
    };
    // Claimed at 0, 10, 20 s: leases end at 30, 40, 50 s. Written out of order, so the order of
    // the listing is the store's doing, not the order of insertion.
    claim("running", at(20)).await;
    claim("stale-2", at(10)).await;
    claim("stale-1", at(0)).await;
    let done = claim("completed", at(0)).await;
    store
        .complete(&id("completed"), done, &ok("T"), &policy(), at(1))
        .await
        .unwrap();
    let released = claim("released", at(0)).await;
    store
        .release(&id("released"), released, at(1))
        .await
        .unwrap();
    // Stale at 30 s too, but expired at 31 s: never listed below.
    let short = policy()
        .to_builder()
        .ttl(Duration::from_secs(31))
        .build()
        .unwrap();
    store
        .claim(&id("expired"), &fp("a"), &short, at(0))
        .await
        .unwrap();

    let mine = |records: Vec<idem_core::Record>| -> Vec<String> {
        records
            .into_iter()
            .filter(|r| r.scope == scope)
            .map(|r| r.key.to_string())
            .collect()
    };
    let listed = mine(store.list_in_flight(at(45), 1000).await.unwrap());
    assert_eq!(
        listed,
        ["stale-1", "stale-2"],
        "stale processing records, earliest lease first"
    );
    let listed = mine(store.list_in_flight(at(35), 1000).await.unwrap());
    assert_eq!(listed, ["stale-1"], "only leases ended by older_than");
    let first = store.list_in_flight(at(45), 1).await.unwrap();
    assert_eq!(first.len(), 1, "limit respected");
    let listed = mine(store.list_in_flight(at(70), 1000).await.unwrap());
    assert_eq!(
        listed,
        ["stale-1", "stale-2", "running"],
        "the expired record is absent"
    );
}

/// `list(filter, now, limit)` selects by state, scope and age, least recently written first,
/// at most `limit`, never an expired record.
pub(crate) async fn inspect_list_filters_by_state_scope_and_age(h: Harness) {
    let store = h.store().await;
    let base = ancient(1980, 2000);
    let at = |s: u64| base + Duration::from_secs(s);
    let (a, b) = (h.scope("a"), h.scope("b"));
    let (id_a, id_b) = (
        |k: &str| RecordId::new(a.clone(), h.key(k)),
        |k: &str| RecordId::new(b.clone(), h.key(k)),
    );
    let p1 = claim_new(&store, &id_a("p1"), &fp("x"), &policy(), at(0)).await;
    let _ = p1;
    let c1 = claim_new(&store, &id_a("c1"), &fp("x"), &policy(), at(10)).await;
    store
        .complete(&id_a("c1"), c1, &ok("T"), &policy(), at(10))
        .await
        .unwrap();
    let f1 = claim_new(&store, &id_a("f1"), &fp("x"), &policy(), at(15)).await;
    store.release(&id_a("f1"), f1, at(20)).await.unwrap();
    claim_new(&store, &id_a("p2"), &fp("x"), &policy(), at(30)).await;
    claim_new(&store, &id_b("x"), &fp("x"), &policy(), at(5)).await;
    let short = policy()
        .to_builder()
        .ttl(Duration::from_secs(31))
        .build()
        .unwrap();
    claim_new(&store, &id_a("expired"), &fp("x"), &short, at(1)).await;

    let now = at(40);
    let list = |filter: idem_core::store::ListFilter, limit: usize| {
        let store = store.clone();
        async move {
            store
                .list(&filter, now, limit)
                .await
                .unwrap()
                .into_iter()
                .map(|r| r.key.to_string())
                .collect::<Vec<_>>()
        }
    };
    let in_a = idem_core::store::ListFilter {
        scope: Some(a.clone()),
        ..Default::default()
    };
    assert_eq!(
        list(in_a.clone(), 100).await,
        ["p1", "c1", "f1", "p2"],
        "the scope's live records, least recently written first"
    );
    assert_eq!(list(in_a.clone(), 2).await, ["p1", "c1"], "at most `limit`");
    let by_state = |state| idem_core::store::ListFilter {
        state: Some(state),
        ..in_a.clone()
    };
    assert_eq!(
        list(by_state(RecordState::Processing), 100).await,
        ["p1", "p2"]
    );
    assert_eq!(list(by_state(RecordState::Completed), 100).await, ["c1"]);
    assert_eq!(
        list(by_state(RecordState::FailedRetryable), 100).await,
        ["f1"]
    );
    let older = idem_core::store::ListFilter {
        updated_before: Some(at(15)),
        ..in_a.clone()
    };
    assert_eq!(
        list(older, 100).await,
        ["p1", "c1"],
        "written at or before 15 s"
    );
    let in_b = idem_core::store::ListFilter {
        scope: Some(b.clone()),
        ..Default::default()
    };
    assert_eq!(list(in_b, 100).await, ["x"]);
    // Without a scope the listing spans scopes. Other records share the storage; bounding the
    // age keeps this case to the decades only the suite's own ancient cases write in.
    let all = store
        .list(
            &idem_core::store::ListFilter {
                updated_before: Some(now),
                ..Default::default()
            },
            now,
            10_000,
        )
        .await
        .unwrap();
    let mine: Vec<_> = all
        .iter()
        .filter(|r| r.scope == a || r.scope == b)
        .map(|r| r.key.to_string())
        .collect();
    assert_eq!(mine, ["p1", "x", "c1", "f1", "p2"]);
    assert!(
        all.windows(2).all(|w| w[0].updated_at <= w[1].updated_at),
        "ordered by last write"
    );
}
