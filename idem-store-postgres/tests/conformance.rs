//! The whole idem conformance suite against a real PostgreSQL named by `IDEM_TEST_POSTGRES_URL`
//! (read at run time), through the public API only: one `#[test]` per case, so
//! `cargo test -p idem-store-postgres --test conformance fencing_` runs the fencing cases.
//!
//! Without the variable every case prints why and skips; under `CI` it fails instead.

mod common;

use idem_store_postgres::PostgresStore;

/// The factory the suite calls: every call is a new handle with its own small pool (up to 4
/// connections) on the shared, migrated test table. `None` (after saying why) when no server is
/// configured.
fn factory() -> Option<
    impl Fn() -> std::pin::Pin<Box<dyn Future<Output = PostgresStore> + Send>> + Send + Sync + 'static,
> {
    static MIGRATED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let url = common::url()?;
    Some(move || {
        let url = url.clone();
        Box::pin(async move {
            let pool = common::pool(&url, "idem-conformance", 4).await;
            let store = PostgresStore::with_table(pool, common::SCHEMA, common::TABLE)
                .expect("valid names");
            MIGRATED
                .get_or_try_init(|| store.migrate())
                .await
                .expect("migrate the test table");
            store
        }) as std::pin::Pin<Box<dyn Future<Output = PostgresStore> + Send>>
    })
}

// Each generated test evaluates this expression first; with no server configured it returns
// from the test (a skip, already explained by `common::url`).
idem_conformance::conformance_tests!(match factory() {
    Some(factory) => factory,
    None => return,
});
