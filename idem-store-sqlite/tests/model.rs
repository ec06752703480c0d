//! The model-based test of `idem-conformance` against `SqliteStore`: random sequences of every
//! operation compared with the pure rules, on a real file. Each namespace the test asks for is a
//! new, migrated file of its own. `IDEM_CONFORMANCE_MODEL_CASES` sets the number of sequences.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use idem_store_sqlite::SqliteStore;

#[test]
fn sqlite_store_agrees_with_the_model() {
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    let files = Arc::new(AtomicU64::new(0));
    let stats = idem_conformance::run_model(move || {
        let path = dir.path().join(format!(
            "model-{}.sqlite3",
            files.fetch_add(1, Ordering::Relaxed)
        ));
        async move {
            let store = SqliteStore::open(&path).expect("open");
            store.migrate().expect("migrate");
            store
        }
    });
    eprintln!("sqlite: {stats:?}");
}
