//! The reference tool server over real HTTP on loopback, on a real SQLite file and a real
//! PostgreSQL, counting tickets in the database (issue: the tool interface).

use std::sync::Arc;
use std::time::Duration;

use crate::serve::{Backend, ServeOptions, router};
use idem_conformance::kit::{self, FaultStore, Op, TempDir, unique};
use idem_core::{KeyStore, ManualClock, RecordId, RecordState};
use idemkit::StoreUrl;
use serde_json::{Value, json};
use tokio::sync::{Barrier, Semaphore};

struct Server {
    base: String,
    backend: Backend,
    /// The server's records, as it reaches them.
    watched: FaultStore<Arc<dyn KeyStore>>,
    clock: ManualClock,
    /// The tool's permits: as many as any test uses, until a test takes them away to hold the
    /// tool.
    hold: Arc<Semaphore>,
    /// A tenant of this test's own, so counts on a shared database are this test's.
    tenant: String,
    _dir: Option<TempDir>,
}

async fn start(backend: &str, latency: Duration) -> Option<Server> {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let (url, dir) = kit::store_url(backend, "idem.db")?;
    let url = url.parse::<StoreUrl>().unwrap();
    let backend = Backend::open(&url).await.expect("store opens");
    // The server's records through a wrapper that tells the test what the server asked (a
    // waiter waits by polling through it: how fast it is woken is the stores' own tests' matter).
    let watched = FaultStore::new(backend.store());
    let backend = backend.with_store(Arc::new(watched.clone()));
    let clock = ManualClock::starting_now();
    let hold = Arc::new(Semaphore::new(Semaphore::MAX_PERMITS));
    let options = ServeOptions {
        tool_latency: latency,
        clock: Arc::new(clock.clone()),
        demo_faults: false,
        tokens: None,
        key_source: idem_core::KeySource::Refuse,
        hold: Some(hold.clone()),
    };
    let app = router(backend.clone(), options).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    Some(Server {
        base,
        backend,
        watched,
        clock,
        hold,
        tenant: unique("tenant"),
        _dir: dir,
    })
}

impl Server {
    async fn tickets(&self) -> i64 {
        self.backend.ticket_count(&self.tenant).await.unwrap()
    }

    async fn post(&self, key: Option<&str>, body: &str) -> reqwest::Response {
        self.post_as(&self.tenant, key, body).await
    }

    async fn post_as(&self, tenant: &str, key: Option<&str>, body: &str) -> reqwest::Response {
        let mut req = idem_http::client::http_client()
            .unwrap()
            .post(format!("{}/tools/create_ticket", self.base))
            .header("content-type", "application/json")
            .header("x-tenant-id", tenant)
            .body(body.to_owned());
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        req.send().await.unwrap()
    }
}

fn args() -> String {
    json!({"title": "Printer on fire", "account_id": "A-7"}).to_string()
}

async fn same_key_twice_one_ticket(s: Server) {
    let first = s.post(Some("wf-8812:step-3:create_ticket"), &args()).await;
    assert_eq!(first.status(), 201);
    let first = first.text().await.unwrap();
    let again = s.post(Some("wf-8812:step-3:create_ticket"), &args()).await;
    assert_eq!(again.status(), 201);
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    let again = again.text().await.unwrap();
    assert_eq!(s.tickets().await, 1, "one ticket row");
    assert_eq!(
        again,
        first.replace("\"idempotent_replay\":false", "\"idempotent_replay\":true")
    );
    let body: Value = serde_json::from_str(&first).unwrap();
    assert!(
        body["original_response"]["ticket_id"]
            .as_str()
            .unwrap()
            .starts_with("T-")
    );
    assert!(
        body["original_response"]["created_at"]
            .as_str()
            .unwrap()
            .ends_with('Z')
    );
}

async fn other_body_is_422_and_no_ticket(s: Server) {
    assert_eq!(s.post(Some("k-m"), &args()).await.status(), 201);
    let other = json!({"title": "Printer fixed", "account_id": "A-7"}).to_string();
    let resp = s.post(Some("k-m"), &other).await;
    assert_eq!(resp.status(), 422);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    assert_eq!(s.tickets().await, 1);
}

async fn refused_input_creates_nothing(s: Server) {
    assert_eq!(s.post(None, &args()).await.status(), 400);
    assert_eq!(s.post(Some("has space"), &args()).await.status(), 400);
    assert_eq!(s.post(Some("k-j"), "{not json").await.status(), 400);
    let invalid = s
        .post(Some("k-v"), &json!({"title": "no account"}).to_string())
        .await;
    assert_eq!(invalid.status(), 422, "the tool's own validation");
    assert_eq!(s.tickets().await, 0);
}

async fn thirty_two_concurrent_one_ticket(s: Server) {
    const N: usize = 32;
    let s = Arc::new(s);
    let gate = Arc::new(Barrier::new(N));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..N {
        let (s, gate) = (s.clone(), gate.clone());
        tasks.spawn(async move {
            let client = idem_http::client::http_client_builder()
                .pool_max_idle_per_host(0)
                .build()
                .unwrap();
            gate.wait().await;
            let resp = client
                .post(format!("{}/tools/create_ticket", s.base))
                .header("x-tenant-id", &s.tenant)
                .header("idempotency-key", "wf-3:step-1:create_ticket")
                .header("content-type", "application/json")
                .body(args())
                .send()
                .await
                .unwrap();
            (
                resp.status().as_u16(),
                resp.headers().contains_key("idempotency-replayed"),
            )
        });
    }
    let answers: Vec<_> = tasks.join_all().await;
    let executed = answers
        .iter()
        .filter(|(st, rep)| *st == 201 && !rep)
        .count();
    let others = answers
        .iter()
        .filter(|(st, rep)| *st == 409 || (*st == 201 && *rep))
        .count();
    assert_eq!((executed, others), (1, N - 1), "{answers:?}");
    assert_eq!(s.tickets().await, 1, "exactly one ticket row");
}

async fn two_hundred_new_keys_two_hundred_tickets(s: Server) {
    for i in 0..200 {
        let resp = s.post(Some(&format!("wf-seq:step-{i}")), &args()).await;
        assert_eq!(
            resp.status(),
            201,
            "key {i}: {}",
            resp.text().await.unwrap()
        );
    }
    assert_eq!(s.tickets().await, 200, "one ticket per key");
}

/// A retry that asks to wait (`Prefer: wait`) while the first call runs gets the replay, not
/// 409; one ticket. The tool is held until the retry's claim (the second claim the store
/// answers) has been answered "in flight": from there it waits, however soon the first call then
/// finishes.
async fn a_waiting_retry_gets_the_replay(s: Server) {
    s.hold.forget_permits(Semaphore::MAX_PERMITS);
    let s = Arc::new(s);
    let key = "wf-wait:step-1";
    // Counted from before the first call: a store may make a claim visible before it answers it,
    // so "the next claim after the record shows" could still be the first call's.
    let (claims_tx, mut claims) = tokio::sync::watch::channel(0usize);
    let claims_tx = Arc::new(claims_tx);
    s.watched.after(Op::Claim, move |_| {
        let claims_tx = claims_tx.clone();
        async move { claims_tx.send_modify(|n| *n += 1) }
    });
    let first = {
        let s = s.clone();
        tokio::spawn(async move { s.post(Some(key), &args()).await })
    };
    until_state(&s, key, RecordState::Processing).await;
    let again = {
        let s = s.clone();
        tokio::spawn(async move {
            idem_http::client::http_client()
                .unwrap()
                .post(format!("{}/tools/create_ticket", s.base))
                .header("content-type", "application/json")
                .header("x-tenant-id", &s.tenant)
                .header("idempotency-key", key)
                .header("prefer", "wait=10")
                .body(args())
                .send()
                .await
                .unwrap()
        })
    };
    claims.wait_for(|n| *n >= 2).await.unwrap();
    s.hold.add_permits(1);
    let again = again.await.unwrap();
    assert_eq!(again.status(), 201, "the replay, not 409");
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    assert!(again.headers().contains_key("preference-applied"));
    assert_eq!(first.await.unwrap().status(), 201);
    assert_eq!(s.tickets().await, 1, "one ticket");
}

async fn after_expiry_runs_again_once(s: Server) {
    assert_eq!(s.post(Some("k-e"), &args()).await.status(), 201);
    s.clock.advance(Duration::from_secs(24 * 3600 + 1));
    let again = s.post(Some("k-e"), &args()).await;
    assert!(again.headers().get("idempotency-replayed").is_none());
    assert!(
        s.post(Some("k-e"), &args())
            .await
            .headers()
            .contains_key("idempotency-replayed")
    );
    assert_eq!(s.tickets().await, 2, "exactly one new ticket");
}

async fn two_tenants_two_tickets(s: Server) {
    let other = unique("tenant-b");
    assert!(
        s.post(Some("k-t"), &args())
            .await
            .headers()
            .get("idempotency-replayed")
            .is_none()
    );
    let b = s.post_as(&other, Some("k-t"), &args()).await;
    assert!(
        b.headers().get("idempotency-replayed").is_none(),
        "no cross-tenant replay"
    );
    assert_eq!(s.tickets().await, 1);
    assert_eq!(s.backend.ticket_count(&other).await.unwrap(), 1);
}

/// Returns once the record of `key` is in `state`, read from the server's store.
async fn until_state(s: &Server, key: &str, state: RecordState) {
    use idem_core::Clock;
    let id = RecordId::new(
        idem_core::Scope::from_parts([s.tenant.as_str(), "/tools/create_ticket"]).unwrap(),
        idem_core::IdempotencyKey::new(key).unwrap(),
    );
    let store = s.backend.store();
    let reached = async {
        while store
            .get(&id, s.clock.now())
            .await
            .unwrap()
            .map(|r| r.state)
            != Some(state)
        {
            tokio::task::yield_now().await;
        }
    };
    // A guard against a hang, never a measure.
    tokio::time::timeout(Duration::from_secs(30), reached)
        .await
        .unwrap_or_else(|_| panic!("{key} never reached {state:?}"));
}

/// The tool works until the test releases it: a client that gives up meanwhile leaves its
/// work running, a retry meanwhile is told 409, and once it is done a retry gets its replay.
async fn slow_tool_short_deadline_then_replay(s: Server) {
    s.hold.forget_permits(Semaphore::MAX_PERMITS);
    let key = "wf-4:step-1:create_ticket";
    let client = idem_http::client::http_client().unwrap();
    let send = || {
        client
            .post(format!("{}/tools/create_ticket", s.base))
            .header("x-tenant-id", &s.tenant)
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(args())
            .send()
    };
    // The first attempt's deadline passes while the tool works: its client gives up once the
    // claim is recorded.
    tokio::select! {
        sent = send() => panic!("the held tool answered: {sent:?}"),
        () = until_state(&s, key, RecordState::Processing) => {}
    }
    let conflict = send().await.unwrap();
    assert_eq!(conflict.status(), 409, "a retry while the tool works");
    assert!(conflict.headers().contains_key("retry-after"));
    s.hold.add_permits(1);
    until_state(&s, key, RecordState::Completed).await;
    let replay = send().await.unwrap();
    assert_eq!(replay.status(), 201);
    assert_eq!(replay.headers()["idempotency-replayed"], "true");
    assert_eq!(s.tickets().await, 1);
}

async fn tools_publish_window_and_deadline(s: Server) {
    let tools: Value = idem_http::client::http_client()
        .unwrap()
        .get(format!("{}/tools", s.base))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let tool = &tools["tools"][0];
    assert_eq!(tool["name"], "create_ticket");
    let window = tool["processing_window_ms"].as_u64().unwrap();
    let deadline = tool["min_client_deadline_ms"].as_u64().unwrap();
    assert_eq!(
        tool["max_wait_ms"].as_u64(),
        Some(deadline),
        "a repeat may wait up to the lease"
    );
    assert!(deadline > window && window >= 1500, "{tool}");
    let description = tool["description"].as_str().unwrap();
    assert!(
        description.contains(&format!("{window} ms"))
            && description.contains(&format!("{deadline} ms"))
    );
    assert_eq!(
        tool["input_schema"]["required"],
        json!(["title", "account_id"])
    );
}

macro_rules! on_backends {
    ($($name:ident => $latency_ms:expr),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    let s = super::start("sqlite", std::time::Duration::from_millis($latency_ms)).await.unwrap();
                    super::$name(s).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if let Some(s) = super::start("postgres", std::time::Duration::from_millis($latency_ms)).await {
                        super::$name(s).await;
                    }
                }
            )*
        }
        mod postgres_pooler {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if let Some(s) = super::start("postgres-pooler", std::time::Duration::from_millis($latency_ms)).await {
                        super::$name(s).await;
                    }
                }
            )*
        }
        mod redis {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn $name() {
                    if let Some(s) = super::start("redis", std::time::Duration::from_millis($latency_ms)).await {
                        super::$name(s).await;
                    }
                }
            )*
        }
    };
}

on_backends! {
    same_key_twice_one_ticket => 0,
    other_body_is_422_and_no_ticket => 0,
    refused_input_creates_nothing => 0,
    thirty_two_concurrent_one_ticket => 200,
    after_expiry_runs_again_once => 0,
    two_tenants_two_tickets => 0,
    slow_tool_short_deadline_then_replay => 0,
    two_hundred_new_keys_two_hundred_tickets => 0,
    a_waiting_retry_gets_the_replay => 0,
    tools_publish_window_and_deadline => 500,
}
