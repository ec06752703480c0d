//! The whole `idem-conformance` suite against `SqliteStore`, through the public API only: one
//! `#[test]` per case; every factory call is a new handle (new connections) to the case's file.
//!
//! Three times: each case on a file of its own (the generated tests, in parallel), every case in
//! parallel on one shared file (`shared_file::`), and every case one after another on one shared
//! file (`run_all`).

use std::path::PathBuf;
use std::sync::Arc;

use idem_store_sqlite::SqliteStore;

async fn open_migrated(path: PathBuf) -> SqliteStore {
    let store = SqliteStore::open(&path).expect("open");
    store.migrate().expect("migrate");
    store
}

idem_conformance::conformance_tests!({
    let dir = Arc::new(tempfile::tempdir().expect("temp dir"));
    let path = dir.path().join("idem.sqlite3");
    move || {
        // The factory holds the directory, so the file lives as long as the case.
        let _keep = dir.clone();
        open_migrated(path.clone())
    }
});

/// `run_all`, the one-call form, every case on one shared file.
#[test]
fn run_all_reports_every_case_passed() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("run_all.sqlite3");
    let report = idem_conformance::run_all(move || open_migrated(path.clone()));
    report.assert_all_passed();
}

/// Every case in parallel on one shared file, as a real deployment shares one database: the
/// suite's cases isolate themselves (scopes of their own, purging cases in time windows of their
/// own), so none disturbs another.
mod shared_file {
    use std::path::PathBuf;
    use std::sync::OnceLock;

    fn path() -> PathBuf {
        static DIR: OnceLock<tempfile::TempDir> = OnceLock::new();
        DIR.get_or_init(|| tempfile::tempdir().expect("temp dir"))
            .path()
            .join("shared.sqlite3")
    }

    idem_conformance::conformance_tests!(|| super::open_migrated(path()));
}
