//! The whole `idem-conformance` suite against `SqliteStore`, through the public API only: one
//! `#[test]` per case, each on its own database file in a temporary directory; every factory call
//! is a new handle (new connections) to that file.

use std::sync::Arc;

use idem_store_sqlite::SqliteStore;

idem_conformance::conformance_tests!({
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    let path = dir.path().join("idem.sqlite3");
    move || {
        let (path, _dir) = (path.clone(), dir.clone());
        async move {
            let store = SqliteStore::open(&path).expect("open");
            store.migrate().expect("migrate");
            drop(_dir);
            store
        }
    }
});
