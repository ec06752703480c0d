//! The whole idem conformance suite over TLS: against the TLS-only PostgreSQL named by
//! `IDEM_TEST_POSTGRES_TLS_URL` (`sslmode=verify-full` with `sslrootcert` naming the test CA;
//! scripts/services/tls.sh starts it), through the public API only, one `#[test]` per case.
//!
//! Without the variable every case prints why and skips; under `CI` it fails instead.

mod common;

use idem_store_postgres::PostgresStore;

/// Every call is a new handle with its own small pool on the shared, migrated test table.
fn factory() -> Option<
    impl Fn() -> std::pin::Pin<Box<dyn Future<Output = PostgresStore> + Send>> + Send + Sync + 'static,
> {
    static MIGRATED: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    let url = common::tls_url()?;
    Some(move || {
        let url = url.clone();
        Box::pin(async move {
            let pool = common::pool(&url, "idem-conformance-tls", 4).await;
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

idem_conformance::conformance_tests!(match factory() {
    Some(factory) => factory,
    None => return,
});
