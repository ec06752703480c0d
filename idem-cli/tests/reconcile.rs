//! The Reconciler on real stores (SQLite file, PostgreSQL, Redis): found → completed and
//! replayed, not found → released and run once, unknown → left and reported, and the late
//! original holder fenced in every case. Effects are counted downstream.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_conformance::kit::{self, TempDir, unique};
use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::reconcile::{Finding, Probe, Reconciler};
use idem_core::{
    Clock, Fingerprint, IdempotencyKey, KeyStore, ManualClock, Outcome, Policy, Record, RecordId,
    RecordState, Scope, Timestamp, async_trait, downstream_key,
};
use idemkit::OpenOptions;
use serde_json::json;

/// The downstream helpdesk: tickets by their downstream key; `None` while it is unreachable.
#[derive(Clone, Default)]
struct Helpdesk(Arc<Mutex<Option<HashMap<String, String>>>>);

#[async_trait]
impl Probe for Helpdesk {
    async fn probe(&self, record: &Record) -> Finding {
        let tickets = self.0.lock().unwrap();
        let Some(tickets) = tickets.as_ref() else {
            return Finding::Unknown;
        };
        match tickets.get(&downstream_key(&record.scope, &record.key, "helpdesk")) {
            Some(id) => {
                Finding::Happened(Outcome::definitive(201, &json!({"ticket_id": id})).unwrap())
            }
            None => Finding::NotHappened,
        }
    }
}

async fn store(backend: &str) -> Option<(Arc<dyn KeyStore>, Option<TempDir>)> {
    let (url, dir) = kit::store_url(backend, "r.db")?;
    Some((
        OpenOptions::new()
            .migrate(true)
            .open(&url)
            .await
            .unwrap()
            .into_store(),
        dir,
    ))
}

async fn scenarios(store: Arc<dyn KeyStore>) {
    // A clock of its own, decades back, so only this test's stale records are in the window.
    let base = Timestamp::from_millis(400_000_000_000 + (rand_u32() as u64) * 1000);
    let clock = ManualClock::new(base);
    let policy = Policy::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let scope = Scope::new(unique("reconcile")).unwrap();
    let fp = Fingerprint::of("create_ticket", &json!({"title": "x"})).unwrap();
    let helpdesk = Helpdesk(Arc::new(Mutex::new(Some(HashMap::new()))));
    // Three holders claim, two do their effect downstream, then all three die.
    let mut tokens = HashMap::new();
    for (name, did_effect) in [("found", true), ("not-found", false), ("unknown", true)] {
        let key = IdempotencyKey::new(name).unwrap();
        let id = RecordId::new(scope.clone(), key.clone());
        let ClaimAnswer::Claimed { token, .. } =
            store.claim(&id, &fp, &policy, base).await.unwrap()
        else {
            panic!("claim {name}")
        };
        tokens.insert(name, token);
        if did_effect {
            let ext = downstream_key(&scope, &key, "helpdesk");
            helpdesk
                .0
                .lock()
                .unwrap()
                .as_mut()
                .unwrap()
                .insert(ext, format!("T-{name}"));
        }
    }
    let reconciler = |probe: Helpdesk| {
        Reconciler::new(store.clone(), Arc::new(clock.clone()), policy, probe).batch(10_000)
    };
    clock.advance(Duration::from_secs(31));

    // Pass 1: the helpdesk is down. Every stale record is taken over (fencing its original
    // holder), left processing and reported.
    let report = reconciler(Helpdesk::default()).run_once().await.unwrap();
    let mut unknown: Vec<_> = report
        .unknown
        .iter()
        .filter(|r| r.scope == scope)
        .map(|r| r.key.to_string())
        .collect();
    unknown.sort();
    assert_eq!(unknown, ["found", "not-found", "unknown"]);
    let late = Outcome::definitive(201, &json!({"late": true})).unwrap();
    for (name, token) in &tokens {
        let id = RecordId::new(scope.clone(), IdempotencyKey::new(*name).unwrap());
        let r = store.get(&id, clock.now()).await.unwrap().unwrap();
        assert_eq!(r.state, RecordState::Processing, "{name} left processing");
        assert_eq!(
            store
                .complete(&id, *token, &late, &policy, clock.now())
                .await
                .unwrap(),
            CompleteAnswer::Fenced,
            "the late original holder of {name} is fenced"
        );
    }

    // Pass 2, after the reconciler's own lease: the helpdesk answers.
    clock.advance(Duration::from_secs(31));
    let report = reconciler(helpdesk.clone()).run_once().await.unwrap();
    assert!(report.completed >= 2 && report.released >= 1, "{report:?}");
    for (name, ticket) in [("found", "T-found"), ("unknown", "T-unknown")] {
        let key = IdempotencyKey::new(name).unwrap();
        let id = RecordId::new(scope.clone(), key.clone());
        let r = store.get(&id, clock.now()).await.unwrap().unwrap();
        assert_eq!(r.state, RecordState::Completed, "{name}");
        // The retry replays the reconciled answer: no second ticket.
        match store.claim(&id, &fp, &policy, clock.now()).await.unwrap() {
            ClaimAnswer::Replay(o) => assert_eq!(o.body_json()["ticket_id"], ticket),
            other => panic!("{name}: expected a replay, got {other:?}"),
        }
    }
    let not_found = IdempotencyKey::new("not-found").unwrap();
    let r = store
        .get(
            &RecordId::new(scope.clone(), not_found.clone()),
            clock.now(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.state, RecordState::FailedRetryable);
    // Its retry runs the operation, once.
    assert!(matches!(
        store
            .claim(
                &RecordId::new(scope.clone(), not_found.clone()),
                &fp,
                &policy,
                clock.now()
            )
            .await
            .unwrap(),
        ClaimAnswer::Claimed { .. }
    ));
    assert_eq!(
        helpdesk.0.lock().unwrap().as_ref().unwrap().len(),
        2,
        "no effect was repeated"
    );
    // And the originals stay fenced after the settlement.
    for (name, token) in &tokens {
        let id = RecordId::new(scope.clone(), IdempotencyKey::new(*name).unwrap());
        assert_eq!(
            store
                .complete(&id, *token, &late, &policy, clock.now())
                .await
                .unwrap(),
            CompleteAnswer::Fenced,
            "{name}"
        );
    }
}

fn rand_u32() -> u32 {
    (std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos())
        % 1_000_000
}

macro_rules! on_backends {
    ($($backend:ident),*) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $backend() {
            if let Some((store, _dir)) = store(stringify!($backend)).await {
                scenarios(store).await;
            }
        }
    )*};
}

on_backends!(sqlite, postgres, redis);
