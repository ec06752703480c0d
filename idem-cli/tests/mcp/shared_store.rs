//! Two `idem serve --mcp` processes on one store, PostgreSQL or Redis, each reached by rmcp's
//! streamable HTTP client (stateless, the default): identical keyed calls alternate between them,
//! then go to both at once. The tickets, counted at the sink for a tenant of this test's own
//! (the `tickets` table; the tenant's list on Redis), are one per key.

use idem_conformance::kit;
use idem_core::IdempotencyKey;
use idem_mcp::client::{IdempotentCaller, RetryPolicy};
use idem_mcp::is_replay;
use idemkit::postgres::sqlx;
use idemkit::redis::redis::{self, AsyncCommands};

use crate::{Server, Transport, args, keyed, ticket_id};

/// Where the servers' tickets land, read directly.
pub(crate) enum Sink {
    Postgres(sqlx::PgPool),
    Redis(redis::aio::MultiplexedConnection),
}

impl Sink {
    pub(crate) async fn open(backend: &str, url: &str) -> Self {
        match backend {
            "postgres" => Self::Postgres(sqlx::PgPool::connect(url).await.unwrap()),
            _ => Self::Redis(
                redis::Client::open(url)
                    .unwrap()
                    .get_multiplexed_async_connection()
                    .await
                    .unwrap(),
            ),
        }
    }

    /// The keys of `tenant`'s tickets, one entry per ticket.
    pub(crate) async fn ticket_keys(&self, tenant: &str) -> Vec<String> {
        match self {
            Self::Postgres(pool) => {
                sqlx::query_scalar("SELECT idempotency_key FROM tickets WHERE tenant = $1")
                    .bind(tenant)
                    .fetch_all(pool)
                    .await
                    .unwrap()
            }
            Self::Redis(conn) => conn
                .clone()
                .lrange(format!("idem-demo:tickets:{{{tenant}}}"), 0, -1)
                .await
                .unwrap(),
        }
    }
}

async fn two_servers_one_store_one_ticket_per_key(backend: &str) {
    let Some((url, _dir)) = kit::store_url(backend, "idem.db") else {
        return;
    };
    let tenant = kit::unique("mcp-two-servers");
    // Real latency (200 ms), so that the calls sent at once overlap the running one.
    let slow = ["--tool-latency-ms", "200"];
    let a = Server::start_on(Transport::Http, &url, &slow).await;
    let b = Server::start_on(Transport::Http, &url, &slow).await;
    let (to_a, to_b) = (
        a.connect(Some(&tenant)).await,
        b.connect(Some(&tenant)).await,
    );
    let mut keys = Vec::new();

    // Alternating a, b, a, b: the first call runs, each other one replays its answer.
    for n in 0..4 {
        let key = format!("wf-{n}:step-1:create_ticket");
        let mut ids = Vec::new();
        for (i, client) in [&to_a, &to_b, &to_a, &to_b].into_iter().enumerate() {
            let result = client.call_tool(keyed(&key, "alternating")).await.unwrap();
            assert_eq!(is_replay(&result), i > 0, "call {i} of {key}");
            ids.push(ticket_id(&result));
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "one ticket named by every answer: {ids:?}");
        keys.push(key);
    }

    // At once: two calls to each server with one key; the repeats wait for the first's answer.
    for n in 0..4 {
        let key = IdempotencyKey::new(format!("wf-at-once-{n}:step-1:create_ticket")).unwrap();
        let calls: Vec<_> = [&to_a, &to_b, &to_a, &to_b]
            .into_iter()
            .map(|client| {
                let caller = IdempotentCaller::new(client.peer().clone(), RetryPolicy::default());
                let key = key.clone();
                tokio::spawn(async move {
                    caller
                        .call("create_ticket", args("at once"), &key, None)
                        .await
                        .unwrap()
                })
            })
            .collect();
        let (mut ids, mut executed) = (Vec::new(), 0);
        for call in calls {
            let answer = call.await.unwrap();
            executed += usize::from(!answer.replayed);
            ids.push(ticket_id(&answer.result));
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "one ticket named by every answer: {ids:?}");
        assert_eq!(executed, 1, "one call ran the tool");
        keys.push(key.as_str().to_owned());
    }

    let mut at_the_sink = Sink::open(backend, &url).await.ticket_keys(&tenant).await;
    at_the_sink.sort();
    keys.sort();
    assert_eq!(
        at_the_sink, keys,
        "one ticket per key, in the store both servers share"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_postgres_store_one_ticket_per_key() {
    two_servers_one_store_one_ticket_per_key("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_redis_store_one_ticket_per_key() {
    two_servers_one_store_one_ticket_per_key("redis").await;
}
