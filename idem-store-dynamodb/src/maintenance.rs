//! [`Maintenance`] for [`DynamoStore`]: the table and its schema item, and the settings that
//! matter on DynamoDB (the table's shape, and TTL on the `ttl` attribute).

use aws_sdk_dynamodb::types::TimeToLiveStatus;
use idem_core::{ConfigWarning, Maintenance, StoreError, async_trait};

use crate::DynamoStore;
use crate::migrate::check_shape;
use crate::schema::{SCHEMA_VERSION, attr};

#[async_trait]
impl Maintenance for DynamoStore {
    /// [`DynamoStore::migrate`].
    async fn migrate(&self) -> Result<(), StoreError> {
        DynamoStore::migrate(self).await
    }

    /// The version in the table's schema item; 0 when there is no table or no item.
    async fn schema_version(&self) -> Result<u32, StoreError> {
        self.inner.schema_version().await
    }

    fn latest_schema_version(&self) -> u32 {
        SCHEMA_VERSION
    }

    /// Warns when the table is missing or of another shape, and when DynamoDB's TTL is off (or
    /// on another attribute): expiry is still decided by `now`, but expired records then stay
    /// until `purge_expired` deletes them.
    async fn check_config(&self) -> Result<Vec<ConfigWarning>, StoreError> {
        let table = self.inner.table.as_str();
        let Some(description) = self.inner.describe().await? else {
            return Ok(vec![ConfigWarning::new(
                format!("table {table} does not exist"),
                "every claim fails until it is created",
                "run `idem migrate` (or DynamoStore::migrate) with a role allowed to create it",
            )]);
        };
        let mut warnings = Vec::new();
        if let Err(e) = check_shape(table, &description) {
            warnings.push(ConfigWarning::new(
                format!("table {table} has another shape"),
                e.to_string(),
                "name another table, or let migrate create one",
            ));
        }
        let ttl = self
            .inner
            .client
            .describe_time_to_live()
            .table_name(table)
            .send()
            .await
            .map_err(|e| crate::error::classify("describe ttl", table, e))?;
        let ttl = ttl.time_to_live_description;
        let on_ours = ttl.as_ref().is_some_and(|d| {
            matches!(
                d.time_to_live_status(),
                Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
            ) && d.attribute_name() == Some(attr::TTL)
        });
        if !on_ours {
            warnings.push(ConfigWarning::new(
                format!(
                    "time to live on table {table} is not enabled on attribute {}",
                    attr::TTL
                ),
                "expired records are never deleted by DynamoDB and take space (and list \
                 capacity) until purge_expired deletes them",
                "run `idem migrate`, or enable TTL on the attribute `ttl`",
            ));
        }
        Ok(warnings)
    }
}
