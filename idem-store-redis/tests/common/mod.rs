//! What the tests share: the conformance factories and the test-owned server (the servers they
//! are told about and unique names come from `idem_conformance::kit`).
#![allow(dead_code)]

pub mod server;

use std::pin::Pin;

use idem_store_redis::RedisStore;

#[allow(unused_imports)] // each test binary uses a different part
pub use idem_conformance::kit::{
    redis_cluster_urls as cluster_urls, redis_failover_urls as failover_urls,
    redis_tls_cluster_urls as tls_cluster_urls, redis_tls_url as tls_url, redis_url as url,
    tls_cas, unique,
};

/// What `conformance_tests!` builds a store with.
pub type Factory =
    Box<dyn Fn() -> Pin<Box<dyn Future<Output = RedisStore> + Send>> + Send + Sync + 'static>;

/// The conformance suite's factory for the standalone server at `url` (verified against the CA
/// file `ca` if given): every call is a new store with its own connection.
pub fn standalone_factory(url: String, ca: Option<String>) -> Factory {
    Box::new(move || {
        let (url, ca) = (url.clone(), ca.clone());
        Box::pin(async move {
            match &ca {
                Some(ca) => RedisStore::connect_with_ca(&url, ca).await,
                None => RedisStore::connect(&url).await,
            }
            .expect("connect to redis")
        })
    })
}

/// The conformance suite's factory for the cluster of `urls` (verified against the CA file `ca`
/// if given): every call is a new store with its own cluster connection.
pub fn cluster_factory(urls: Vec<String>, ca: Option<String>) -> Factory {
    Box::new(move || {
        let (urls, ca) = (urls.clone(), ca.clone());
        Box::pin(async move {
            let store = match &ca {
                Some(ca) => RedisStore::connect_cluster_with_ca(&urls, ca).await,
                None => RedisStore::connect_cluster(&urls).await,
            }
            .expect("connect to the redis cluster");
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
