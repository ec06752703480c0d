//! What the tests share: the conformance factories and the test-owned server (the servers they
//! are told about are read, and unique names made, with `idem_conformance::kit`).
#![allow(dead_code)]

pub mod server;

use std::pin::Pin;
use std::sync::LazyLock;

use idem_store_redis::RedisStore;

use idem_conformance::kit::{env_url, env_urls};
#[allow(unused_imports)] // each test binary uses a different part
pub use idem_conformance::kit::{redis_url as url, unique};

/// `IDEM_TEST_REDIS_CLUSTER_URLS`: the node URLs of a Redis cluster, comma-separated
/// (scripts/services/redis.sh).
pub fn cluster_urls() -> Option<Vec<String>> {
    env_urls(
        "IDEM_TEST_REDIS_CLUSTER_URLS",
        "scripts/services/redis.sh starts a cluster",
    )
}

/// `IDEM_TEST_REDIS_FAILOVER_URLS`: the node URLs of a 3-master, 3-replica cluster whose masters
/// a test may kill (scripts/services/redis-failover.sh).
pub fn failover_urls() -> Option<Vec<String>> {
    env_urls(
        "IDEM_TEST_REDIS_FAILOVER_URLS",
        "scripts/services/redis-failover.sh starts it",
    )
}

/// `IDEM_TEST_REDIS_TLS_URL`: a TLS-only standalone Redis (`rediss://…`,
/// scripts/services/tls.sh).
pub fn tls_url() -> Option<String> {
    env_url(
        "IDEM_TEST_REDIS_TLS_URL",
        "scripts/services/tls.sh starts a TLS-only server",
    )
}

/// `IDEM_TEST_REDIS_TLS_CLUSTER_URLS`: the node URLs of a TLS-only Redis cluster
/// (scripts/services/tls.sh).
pub fn tls_cluster_urls() -> Option<Vec<String>> {
    env_urls(
        "IDEM_TEST_REDIS_TLS_CLUSTER_URLS",
        "scripts/services/tls.sh starts a TLS-only cluster",
    )
}

/// `IDEM_TEST_TLS_CA` and `IDEM_TEST_TLS_UNTRUSTED_CA`: the file of the CA that signed the TLS
/// servers' certificates, and of one that signed nothing there (scripts/services/tls.sh).
pub fn tls_cas() -> Option<(String, String)> {
    let hint = "scripts/services/tls.sh makes it";
    Some((
        env_url("IDEM_TEST_TLS_CA", hint)?,
        env_url("IDEM_TEST_TLS_UNTRUSTED_CA", hint)?,
    ))
}

/// What `conformance_tests!` builds a store with.
pub type Factory =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = RedisStore> + Send>> + Send + Sync + 'static>;

/// The key prefix of every store the conformance factories make in this test process: one
/// process's stores share their records (the suite opens several as several processes would),
/// and what the cases leave behind (stale claims among them) stays out of the default prefix,
/// which `idem demo` and `idem serve` use and reconcile on the same server.
static PREFIX: LazyLock<String> = LazyLock::new(|| unique("conformance"));

/// The conformance suite's factory for the standalone server at `url` (verified against the CA
/// file `ca` if given): every call is a new store with its own connection, under [`PREFIX`].
pub fn standalone_factory(url: String, ca: Option<String>) -> Factory {
    Box::new(move || {
        let (url, ca) = (url.clone(), ca.clone());
        Box::pin(async move {
            match &ca {
                Some(ca) => RedisStore::connect_with_ca(&url, ca).await,
                None => RedisStore::connect(&url).await,
            }
            .expect("connect to redis")
            .with_prefix(&PREFIX)
            .expect("a valid prefix")
        })
    })
}

/// The conformance suite's factory for the cluster of `urls` (verified against the CA file `ca`
/// if given): every call is a new store with its own cluster connection, under [`PREFIX`].
pub fn cluster_factory(urls: Vec<String>, ca: Option<String>) -> Factory {
    Box::new(move || {
        let (urls, ca) = (urls.clone(), ca.clone());
        Box::pin(async move {
            let store = match &ca {
                Some(ca) => RedisStore::connect_cluster_with_ca(&urls, ca).await,
                None => RedisStore::connect_cluster(&urls).await,
            }
            .expect("connect to the redis cluster")
            .with_prefix(&PREFIX)
            .expect("a valid prefix");
            assert!(store.is_cluster());
            store
        })
    })
}

/// A store under a key prefix of its own (`unique(name)`) on the standalone server the tests are
/// told about, the prefix, and a connection of the test's own to that server, to look under the
/// store; `None` where no server is named.
pub async fn prefixed_store(
    name: &str,
) -> Option<(
    RedisStore,
    String,
    idem_store_redis::redis::aio::MultiplexedConnection,
)> {
    let url = url()?;
    let prefix = unique(name);
    let store = RedisStore::connect(&url)
        .await
        .unwrap()
        .with_prefix(&prefix)
        .unwrap();
    let conn = idem_store_redis::redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    Some((store, prefix, conn))
}
