//! The whole idem conformance suite again, against the Redis Cluster whose nodes
//! `IDEM_TEST_REDIS_CLUSTER_URLS` names (comma-separated, read at run time; scripts/test starts a
//! local 3-master cluster). One `#[test]` per case.
//!
//! Without the variable every case prints why and skips; under `CI` it fails instead.

mod common;

use idem_store_redis::RedisStore;

/// Every call is a new store with its own cluster connection.
fn factory() -> Option<
    impl Fn() -> std::pin::Pin<Box<dyn Future<Output = RedisStore> + Send>> + Send + Sync + 'static,
> {
    let urls = common::cluster_urls()?;
    Some(move || {
        let urls = urls.clone();
        Box::pin(async move {
            let store = RedisStore::connect_cluster(&urls)
                .await
                .expect("connect to the redis cluster");
            assert!(store.is_cluster());
            store
        }) as std::pin::Pin<Box<dyn Future<Output = RedisStore> + Send>>
    })
}

idem_conformance::conformance_tests!(match factory() {
    Some(factory) => factory,
    None => return,
});
