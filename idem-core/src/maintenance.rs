//! Looking after a store: [`Maintenance`] (migrate, schema version, configuration warnings), the
//! same for every backend, and the [`ConfigWarning`] each backend reports.

use std::fmt;

use async_trait::async_trait;

use crate::memory::MemoryStore;
use crate::store::StoreError;

/// Migrating a store, reading its schema version and judging its configuration: what an
/// operator (`idem migrate`, `idem conformance`, `idemkit::open`) does with any store.
///
/// Every store idem ships implements it, so an operator tool holds an `&dyn Maintenance` (or an
/// `Arc<dyn Maintenance>`) next to its `Arc<dyn KeyStore>` and never needs the store's own type:
///
/// ```
/// use idem_core::{Maintenance, MemoryStore};
/// # tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(async {
/// let store: &dyn Maintenance = &MemoryStore::new();
/// store.migrate().await?;
/// assert_eq!(store.schema_version().await?, store.latest_schema_version());
/// for warning in store.check_config().await? {
///     eprintln!("warning: {warning}"); // what is set, what can go wrong, what to do
/// }
/// # Ok::<(), idem_core::StoreError>(()) }).unwrap();
/// ```
///
/// Dyn-safe: `&dyn Maintenance` and `Arc<dyn Maintenance>` work. A store without a schema (a
/// key-value server, memory) migrates by preparing what it needs, if anything, and answers 0
/// for both versions.
#[async_trait]
pub trait Maintenance: Send + Sync + fmt::Debug {
    /// Creates or upgrades the store's schema to [`Maintenance::latest_schema_version`].
    ///
    /// ### To ensure correctness:
    /// - Idempotent: a second call (from this or any other process, also concurrently) changes
    ///   nothing and succeeds.
    /// - A schema newer than this build knows is refused with [`StoreError::Misconfigured`],
    ///   never downgraded.
    /// - It may need more rights than the store's day-to-day role (creating tables).
    async fn migrate(&self) -> Result<(), StoreError>;

    /// The schema version the store holds now, reading only (nothing is created): 0 when it was
    /// never migrated. Below [`Maintenance::latest_schema_version`] the store needs
    /// [`Maintenance::migrate`]; above it, a newer build migrated it.
    async fn schema_version(&self) -> Result<u32, StoreError>;

    /// The schema version this build reads and writes, the one [`Maintenance::migrate`] brings
    /// the store to.
    fn latest_schema_version(&self) -> u32;

    /// Reads the settings the store's guarantees depend on and returns each one that can lose
    /// an acknowledged claim or outcome (so that a retry runs the operation a second time), or
    /// that stops the store from working. Empty when nothing was found.
    ///
    /// ### To ensure correctness:
    /// - An unsafe setting is a warning (a value), not an error; an unreachable server is an
    ///   error ([`StoreError::Unavailable`]).
    /// - A setting that cannot be read is a warning saying what to check by hand, never silence.
    async fn check_config(&self) -> Result<Vec<ConfigWarning>, StoreError>;
}

/// A setting that can lose an acknowledged claim or outcome, or stop the store from working:
/// what is set, what can go wrong, and what to do. `Display` prints all three in one line:
/// `{setting}: {risk}; {fix}`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct ConfigWarning {
    /// What is set, and where, as the engine names it: `synchronous_commit is off`,
    /// `maxmemory-policy is allkeys-lru on 10.0.0.7:6379`.
    pub setting: String,
    /// What can go wrong because of it.
    pub risk: String,
    /// What to do about it.
    pub fix: String,
}

impl ConfigWarning {
    /// A warning about `setting` (what is set, and where), its `risk` and its `fix`.
    pub fn new(
        setting: impl Into<String>,
        risk: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            setting: setting.into(),
            risk: risk.into(),
            fix: fix.into(),
        }
    }
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}; {}", self.setting, self.risk, self.fix)
    }
}

/// The reference store has no schema (versions 0) and one setting to warn about: it is memory.
#[async_trait]
impl Maintenance for MemoryStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        Ok(())
    }

    async fn schema_version(&self) -> Result<u32, StoreError> {
        Ok(0)
    }

    fn latest_schema_version(&self) -> u32 {
        0
    }

    async fn check_config(&self) -> Result<Vec<ConfigWarning>, StoreError> {
        Ok(vec![ConfigWarning::new(
            "the records are kept in this process's memory",
            "a restart forgets every claim and outcome, and other processes never see them, so \
             a retry after a crash runs the operation a second time",
            "use a durable store (SQLite, PostgreSQL or Redis) where effects must happen once",
        )])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_reads_as_one_line() {
        let w = ConfigWarning::new("fsync is off", "a crash can lose claims", "set fsync = on");
        assert_eq!(
            w.to_string(),
            "fsync is off: a crash can lose claims; set fsync = on"
        );
    }

    #[tokio::test]
    async fn memory_is_always_current_and_says_it_is_memory() {
        let store: std::sync::Arc<dyn Maintenance> = std::sync::Arc::new(MemoryStore::new());
        store.migrate().await.unwrap();
        store.migrate().await.unwrap();
        assert_eq!(
            store.schema_version().await.unwrap(),
            store.latest_schema_version()
        );
        let warnings = store.check_config().await.unwrap();
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].setting.contains("memory"), "{warnings:?}");
    }
}
