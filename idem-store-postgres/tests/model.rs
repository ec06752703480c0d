//! The model-based test of `idem-conformance` against a real PostgreSQL named by
//! `IDEM_TEST_POSTGRES_URL` (read at run time): random sequences of every operation compared with
//! the pure rules. Each namespace the test asks for is a table of its own
//! (`idem_test.model_<random>`), migrated on creation and dropped when the test passes (kept for
//! inspection when it fails). `IDEM_CONFORMANCE_MODEL_CASES` sets the number of sequences.
//!
//! Without the variable the test prints why and skips; under `CI` it fails instead.

mod common;

use std::sync::{Arc, Mutex};

use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx;

#[test]
fn postgres_store_agrees_with_the_model() {
    let Some(url) = common::url() else { return };
    let tables = Arc::new(Mutex::new(Vec::<String>::new()));
    let made = tables.clone();
    let factory_url = url.clone();
    let stats = idem_conformance::run_model(move || {
        let url = factory_url.clone();
        let table = format!("model_{:016x}", rand::random::<u64>());
        made.lock().unwrap().push(table.clone());
        async move {
            let pool = common::pool(&url, "idem-model", 4).await;
            let store =
                PostgresStore::with_table(pool, common::SCHEMA, &table).expect("valid names");
            store.migrate().await.expect("migrate the model's table");
            store
        }
    });
    eprintln!("postgres: {stats:?}");

    // Passed: drop the tables this run made.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    runtime.block_on(async {
        let pool = common::pool(&url, "idem-model-cleanup", 1).await;
        let made: Vec<String> = tables.lock().unwrap().clone();
        for table in &made {
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "DROP TABLE IF EXISTS {schema}.{table}; DROP TABLE IF EXISTS {schema}.{table}_migrations",
                schema = common::SCHEMA
            )))
            .execute(&pool)
            .await
            .expect("drop the model's table");
        }
    });
}
