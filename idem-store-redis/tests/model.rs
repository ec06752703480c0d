//! The model-based test of `idem-conformance` against the standalone Redis named by
//! `IDEM_TEST_REDIS_URL` and the Redis Cluster named by `IDEM_TEST_REDIS_CLUSTER_URLS` (read at
//! run time): random sequences of every operation compared with the pure rules. Each namespace
//! the test asks for is a key prefix of its own (`idem-model-<random>`); every sequence purges
//! what it wrote. `IDEM_CONFORMANCE_MODEL_CASES` sets the number of sequences.
//!
//! Without a variable its test prints why and skips; under `CI` it fails instead.

mod common;

use idem_store_redis::RedisStore;

#[test]
fn redis_store_agrees_with_the_model() {
    let Some(url) = common::url() else { return };
    let stats = idem_conformance::run_model(move || {
        let url = url.clone();
        async move {
            RedisStore::connect(&url)
                .await
                .expect("connect to redis")
                .with_prefix(&common::unique("idem-model"))
                .expect("valid prefix")
        }
    });
    eprintln!("redis: {stats:?}");
}

#[test]
fn redis_cluster_store_agrees_with_the_model() {
    let Some(urls) = common::cluster_urls() else {
        return;
    };
    let stats = idem_conformance::run_model(move || {
        let urls = urls.clone();
        async move {
            let store = RedisStore::connect_cluster(&urls)
                .await
                .expect("connect to the redis cluster")
                .with_prefix(&common::unique("idem-model"))
                .expect("valid prefix");
            assert!(store.is_cluster());
            store
        }
    });
    eprintln!("redis cluster: {stats:?}");
}
