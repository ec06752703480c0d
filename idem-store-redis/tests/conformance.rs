//! The whole idem conformance suite against the standalone Redis named by `IDEM_TEST_REDIS_URL`
//! (read at run time), through the public API only: one `#[test]` per case, so
//! `cargo test -p idem-store-redis --test conformance fencing_` runs the fencing cases.
//!
//! Without the variable every case prints why and skips; under `CI` it fails instead.

mod common;

use idem_store_redis::RedisStore;

/// Every call is a new store with its own connection to the same server.
fn factory() -> Option<
    impl Fn() -> std::pin::Pin<Box<dyn Future<Output = RedisStore> + Send>> + Send + Sync + 'static,
> {
    let url = common::url()?;
    Some(move || {
        let url = url.clone();
        Box::pin(async move { RedisStore::connect(&url).await.expect("connect to redis") })
            as std::pin::Pin<Box<dyn Future<Output = RedisStore> + Send>>
    })
}

// With no server configured the generated test returns early (a skip, explained by `common::url`).
idem_conformance::conformance_tests!(match factory() {
    Some(factory) => factory,
    None => return,
});
