//! [`Maintenance`] for [`RedisStore`]: no schema; migrating loads the scripts and checks the
//! server's settings.

use idem_core::{ConfigWarning, Maintenance, StoreError, async_trait};
use redis::Script;

use crate::RedisStore;
use crate::error::classify;
use crate::{purge_scripts, scripts};

impl RedisStore {
    /// Prepares the server: loads the scripts (on every master of a cluster; they are loaded
    /// again on demand anyway, the script cache being volatile) and checks the server's settings
    /// ([`Maintenance::check_config`]), logging each warning with `tracing`. There is no schema;
    /// warnings do not fail it.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        for script in all_scripts(self.is_cluster()) {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|e| classify("script load", e))?;
        }
        let warnings = self.config_warnings().await?;
        for warning in &warnings {
            tracing::warn!(backend = "redis", "{warning}");
        }
        if warnings.is_empty() {
            tracing::info!(
                backend = "redis",
                "redis settings checked: no eviction, persistence on"
            );
        }
        Ok(())
    }
}

/// Redis has no schema: both versions are 0.
#[async_trait]
impl Maintenance for RedisStore {
    /// [`RedisStore::migrate`]: loads the scripts and logs the configuration warnings.
    async fn migrate(&self) -> Result<(), StoreError> {
        RedisStore::migrate(self).await
    }

    async fn schema_version(&self) -> Result<u32, StoreError> {
        Ok(0)
    }

    fn latest_schema_version(&self) -> u32 {
        0
    }

    /// Reads the settings the store's guarantees depend on from the server (from every master
    /// of a cluster) and warns about an eviction policy other than `noeviction`, persistence off
    /// or snapshot-only, replicas the store does not wait for (or fewer replicas than it waits
    /// for), and a `WAITAOF` the server does not have. A server that refuses `CONFIG GET`
    /// (renamed or denied, as on some managed services) is a warning saying so.
    async fn check_config(&self) -> Result<Vec<ConfigWarning>, StoreError> {
        self.config_warnings().await
    }
}

/// Every script a store on a cluster (`true`) or a standalone server runs, for preloading.
fn all_scripts(cluster: bool) -> [&'static Script; 9] {
    let p = scripts::publishing(cluster);
    [
        &scripts::CHECKPOINT_SCRIPT,
        &scripts::CONFIRM_SCRIPT,
        &scripts::MARK_WAITED_SCRIPT,
        &p.claim,
        &p.complete,
        &p.release,
        &scripts::EXTEND_SCRIPT,
        &purge_scripts::PURGE_SCRIPT,
        &purge_scripts::PURGE_SLICE_SCRIPT,
    ]
}
