//! The whole idem conformance suite over TLS, one `#[test]` per case: against the TLS-only
//! server of `IDEM_TEST_REDIS_TLS_URL` (module `standalone`) and the TLS-only cluster of
//! `IDEM_TEST_REDIS_TLS_CLUSTER_URLS` (module `cluster`), both `rediss://`, verified against the
//! CA of `IDEM_TEST_TLS_CA` (scripts/services/tls.sh starts them and makes the CA).
//!
//! Without the variables every case prints why and skips; under `CI` it fails instead.

mod common;

mod standalone {
    use idem_store_redis::RedisStore;

    /// Every call is a new store with its own TLS connection to the same server.
    fn factory() -> Option<
        impl Fn() -> std::pin::Pin<Box<dyn Future<Output = RedisStore> + Send>> + Send + Sync + 'static,
    > {
        let url = super::common::tls_url()?;
        let (ca, _) = super::common::tls_cas()?;
        Some(move || {
            let (url, ca) = (url.clone(), ca.clone());
            Box::pin(async move {
                RedisStore::connect_with_ca(&url, &ca)
                    .await
                    .expect("connect to redis over TLS")
            }) as std::pin::Pin<Box<dyn Future<Output = RedisStore> + Send>>
        })
    }

    idem_conformance::conformance_tests!(match factory() {
        Some(factory) => factory,
        None => return,
    });
}

mod cluster {
    use idem_store_redis::RedisStore;

    /// Every call is a new store with its own TLS cluster connection.
    fn factory() -> Option<
        impl Fn() -> std::pin::Pin<Box<dyn Future<Output = RedisStore> + Send>> + Send + Sync + 'static,
    > {
        let urls = super::common::tls_cluster_urls()?;
        let (ca, _) = super::common::tls_cas()?;
        Some(move || {
            let (urls, ca) = (urls.clone(), ca.clone());
            Box::pin(async move {
                let store = RedisStore::connect_cluster_with_ca(&urls, &ca)
                    .await
                    .expect("connect to the redis cluster over TLS");
                assert!(store.is_cluster());
                store
            }) as std::pin::Pin<Box<dyn Future<Output = RedisStore> + Send>>
        })
    }

    idem_conformance::conformance_tests!(match factory() {
        Some(factory) => factory,
        None => return,
    });
}
