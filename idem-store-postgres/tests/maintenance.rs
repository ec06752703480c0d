//! [`Maintenance`] on a real server, through `&dyn Maintenance` as an operator tool holds it:
//! migrating twice, the version after it, and a warning for a setting that loses claims.

mod common;

use std::time::Duration;

use idem_core::Maintenance;
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx::{self, AssertSqlSafe, postgres::PgPoolOptions};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn migrate_twice_then_the_version_is_the_builds() {
    let Some(url) = common::url() else { return };
    let pool = common::pool(&url, "idem-test-maintenance", 2).await;
    let table = common::unique("maint").replace('-', "_");
    let store = PostgresStore::with_table(pool.clone(), common::SCHEMA, &table).unwrap();
    let maintenance: &dyn Maintenance = &store;
    assert_eq!(maintenance.schema_version().await.unwrap(), 0);
    maintenance.migrate().await.unwrap();
    maintenance.migrate().await.unwrap();
    assert!(maintenance.latest_schema_version() >= 1);
    assert_eq!(
        maintenance.schema_version().await.unwrap(),
        maintenance.latest_schema_version()
    );
    sqlx::raw_sql(AssertSqlSafe(format!(
        "DROP TABLE {schema}.\"{table}\"; DROP TABLE {schema}.\"{table}_migrations\"",
        schema = common::SCHEMA
    )))
    .execute(&pool)
    .await
    .unwrap();
}

/// `synchronous_commit` set for the store's connections only (as a role or a connection string
/// can): the check reads what the store's own connections see.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn synchronous_commit_off_is_a_warning() {
    let Some(url) = common::url() else { return };
    let safe = PostgresStore::new(common::pool(&url, "idem-test-maintenance", 1).await);
    let safe: &dyn Maintenance = &safe;
    let before = safe.check_config().await.unwrap();
    assert!(
        !before
            .iter()
            .any(|w| w.setting.starts_with("synchronous_commit")),
        "{before:#?}"
    );
    let options =
        common::options(&url, "idem-test-maintenance").options([("synchronous_commit", "off")]);
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .unwrap();
    let unsafe_store: &dyn Maintenance = &PostgresStore::new(pool);
    let warnings = unsafe_store.check_config().await.unwrap();
    let off = warnings
        .iter()
        .find(|w| w.setting == "synchronous_commit is off")
        .unwrap_or_else(|| panic!("no warning about synchronous_commit: {warnings:#?}"));
    assert!(off.risk.contains("a server crash can lose it"), "{off:?}");
    assert_eq!(off.fix, "set synchronous_commit = on");
}
