//! [`Maintenance`] on real files, through `&dyn Maintenance` as an operator tool holds it:
//! migrating twice, the version after it, and a warning for `synchronous = NORMAL`.

use idem_core::Maintenance;
use idem_store_sqlite::{SqliteStore, Synchronous};

#[tokio::test]
async fn migrate_twice_then_the_version_is_the_builds() {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(dir.path().join("idem.db")).unwrap();
    let maintenance: &dyn Maintenance = &store;
    assert_eq!(maintenance.schema_version().await.unwrap(), 0);
    maintenance.migrate().await.unwrap();
    maintenance.migrate().await.unwrap();
    assert!(maintenance.latest_schema_version() >= 1);
    assert_eq!(
        maintenance.schema_version().await.unwrap(),
        maintenance.latest_schema_version()
    );
    assert_eq!(
        maintenance.check_config().await.unwrap(),
        [],
        "the defaults"
    );
}

#[tokio::test]
async fn synchronous_normal_is_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idem.db");
    let store = SqliteStore::builder(&path)
        .synchronous(Synchronous::Normal)
        .open()
        .unwrap();
    let warnings = (&store as &dyn Maintenance).check_config().await.unwrap();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    assert_eq!(
        warnings[0].setting,
        format!("synchronous is NORMAL on {}", path.display())
    );
    assert!(warnings[0].risk.contains("power loss"), "{warnings:#?}");
    assert!(
        warnings[0].fix.contains("Synchronous::Full"),
        "{warnings:#?}"
    );
}
