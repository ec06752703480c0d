//! Creating the table (on-demand capacity, both indexes, TTL on `ttl`), recognising one of
//! another shape, and the schema item that records the version.

use std::time::Duration;

use aws_sdk_dynamodb::error::ProvideErrorMetadata;
use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TableDescription, TableStatus, TimeToLiveSpecification,
    TimeToLiveStatus,
};
use idem_core::StoreError;

use crate::error::classify;
use crate::item::{n, s};
use crate::ops::Inner;
use crate::schema::{BY_EXPIRY, BY_STATE, PK, SCHEMA_PK, SCHEMA_VERSION, VERSION, attr};

/// How long `migrate` waits for a table it created (or found being created) to become active.
const ACTIVE_WITHIN: Duration = Duration::from_secs(300);

/// The shape the store needs, for people.
const SHAPE: &str = "partition key pk (string) and no sort key; index by_state on gs (string) \
                     and upd (number), all attributes projected; index by_expiry on gx \
                     (string) and exp (number)";

fn key(name: &str, kind: KeyType) -> KeySchemaElement {
    KeySchemaElement::builder()
        .attribute_name(name)
        .key_type(kind)
        .build()
        .expect("name and type are set")
}

fn attribute(name: &str, kind: ScalarAttributeType) -> AttributeDefinition {
    AttributeDefinition::builder()
        .attribute_name(name)
        .attribute_type(kind)
        .build()
        .expect("name and type are set")
}

fn index(name: &str, hash: &str, range: &str, projection: ProjectionType) -> GlobalSecondaryIndex {
    GlobalSecondaryIndex::builder()
        .index_name(name)
        .key_schema(key(hash, KeyType::Hash))
        .key_schema(key(range, KeyType::Range))
        .projection(Projection::builder().projection_type(projection).build())
        .build()
        .expect("name and keys are set")
}

impl Inner {
    /// The table's description, or `None` if there is no such table.
    pub(crate) async fn describe(&self) -> Result<Option<TableDescription>, StoreError> {
        match self
            .client
            .describe_table()
            .table_name(self.table.as_str())
            .send()
            .await
        {
            Ok(out) => Ok(out.table),
            Err(err)
                if err.as_service_error().and_then(|e| e.code())
                    == Some("ResourceNotFoundException") =>
            {
                Ok(None)
            }
            Err(err) => Err(classify("describe table", self.table.as_str(), err)),
        }
    }

    /// Creates the table if there is none, waits for it to be active, refuses one of another
    /// shape, enables TTL on `ttl`, and records the schema version (refusing a newer one).
    pub(crate) async fn migrate(&self) -> Result<(), StoreError> {
        if self.describe().await?.is_none() {
            let created = self
                .client
                .create_table()
                .table_name(self.table.as_str())
                .billing_mode(BillingMode::PayPerRequest)
                .key_schema(key(PK, KeyType::Hash))
                .attribute_definitions(attribute(PK, ScalarAttributeType::S))
                .attribute_definitions(attribute(attr::GSI_STATE, ScalarAttributeType::S))
                .attribute_definitions(attribute(attr::UPDATED, ScalarAttributeType::N))
                .attribute_definitions(attribute(attr::GSI_EXPIRY, ScalarAttributeType::S))
                .attribute_definitions(attribute(attr::EXPIRES, ScalarAttributeType::N))
                .global_secondary_indexes(index(
                    BY_STATE,
                    attr::GSI_STATE,
                    attr::UPDATED,
                    ProjectionType::All,
                ))
                .global_secondary_indexes(index(
                    BY_EXPIRY,
                    attr::GSI_EXPIRY,
                    attr::EXPIRES,
                    ProjectionType::KeysOnly,
                ))
                .send()
                .await;
            match created {
                Ok(_) => {}
                // Another process created it meanwhile: wait for it like ours.
                Err(err)
                    if err.as_service_error().and_then(|e| e.code())
                        == Some("ResourceInUseException") => {}
                Err(err) => return Err(classify("create table", self.table.as_str(), err)),
            }
        }
        let table = self.wait_active().await?;
        check_shape(self.table.as_str(), &table)?;
        self.enable_ttl().await?;
        self.record_version().await
    }

    async fn wait_active(&self) -> Result<TableDescription, StoreError> {
        let deadline = tokio::time::Instant::now() + ACTIVE_WITHIN;
        loop {
            let table = self
                .describe()
                .await?
                .ok_or_else(|| StoreError::Misconfigured {
                    message: format!(
                        "dynamodb: table {} vanished while it was created",
                        self.table
                    ),
                })?;
            let indexes_active = table.global_secondary_indexes().iter().all(|i| {
                i.index_status()
                    .is_none_or(|st| *st == aws_sdk_dynamodb::types::IndexStatus::Active)
            });
            if table.table_status() == Some(&TableStatus::Active) && indexes_active {
                return Ok(table);
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(StoreError::Unavailable {
                    message: format!(
                        "dynamodb: table {} is not active after {ACTIVE_WITHIN:?}",
                        self.table
                    ),
                    source: None,
                });
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }

    async fn enable_ttl(&self) -> Result<(), StoreError> {
        let described = self
            .client
            .describe_time_to_live()
            .table_name(self.table.as_str())
            .send()
            .await
            .map_err(|e| classify("describe ttl", self.table.as_str(), e))?;
        let current = described.time_to_live_description;
        let status = current.as_ref().and_then(|d| d.time_to_live_status());
        if matches!(
            status,
            Some(TimeToLiveStatus::Enabled | TimeToLiveStatus::Enabling)
        ) {
            // On this attribute, or on another one the owner chose (check_config says so).
            return Ok(());
        }
        self.client
            .update_time_to_live()
            .table_name(self.table.as_str())
            .time_to_live_specification(
                TimeToLiveSpecification::builder()
                    .enabled(true)
                    .attribute_name(attr::TTL)
                    .build()
                    .expect("enabled and attribute are set"),
            )
            .send()
            .await
            .map_err(|e| classify("enable ttl", self.table.as_str(), e))?;
        Ok(())
    }

    async fn record_version(&self) -> Result<(), StoreError> {
        let condition = "attribute_not_exists(#pk) OR #version <= :v";
        let sent = self
            .client
            .put_item()
            .table_name(self.table.as_str())
            .item(PK, s(SCHEMA_PK))
            .item(VERSION, n(SCHEMA_VERSION))
            .condition_expression(condition)
            .set_expression_attribute_names(Some(crate::expr::names(&[condition])))
            .expression_attribute_values(":v", n(SCHEMA_VERSION))
            .send()
            .await;
        match sent {
            Ok(_) => Ok(()),
            Err(err)
                if err
                    .as_service_error()
                    .is_some_and(|e| e.is_conditional_check_failed_exception()) =>
            {
                Err(StoreError::Misconfigured {
                    message: format!(
                        "dynamodb: table {} holds a schema newer than version {SCHEMA_VERSION}, which this build writes; upgrade idem",
                        self.table
                    ),
                })
            }
            Err(err) => Err(classify("migrate", self.table.as_str(), err)),
        }
    }

    /// The schema version recorded in the table; 0 when there is no table or no schema item.
    pub(crate) async fn schema_version(&self) -> Result<u32, StoreError> {
        let got = self
            .client
            .get_item()
            .table_name(self.table.as_str())
            .key(PK, s(SCHEMA_PK))
            .consistent_read(true)
            .send()
            .await;
        let item = match got {
            Ok(out) => out.item.unwrap_or_default(),
            Err(err) => {
                match err.as_service_error().and_then(|e| e.code()) {
                    Some("ResourceNotFoundException") => return Ok(0),
                    // The key is not `pk`: a table of another shape, said as such.
                    Some("ValidationException") => {
                        if let Some(table) = self.describe().await? {
                            check_shape(self.table.as_str(), &table)?;
                        }
                    }
                    _ => {}
                }
                return Err(classify("schema version", self.table.as_str(), err));
            }
        };
        if item.is_empty() {
            return Ok(0);
        }
        let v = crate::item::number(&item, VERSION)?;
        u32::try_from(v)
            .map_err(|_| crate::error::corrupt(format!("the schema item records version {v}")))
    }
}

/// Refuses a table whose keys or indexes are not the ones the store writes and queries.
pub(crate) fn check_shape(name: &str, table: &TableDescription) -> Result<(), StoreError> {
    let keys = |schema: &[KeySchemaElement]| -> Vec<(String, KeyType)> {
        schema
            .iter()
            .map(|k| (k.attribute_name().to_owned(), k.key_type().clone()))
            .collect()
    };
    let types: std::collections::HashMap<&str, &ScalarAttributeType> = table
        .attribute_definitions()
        .iter()
        .map(|a| (a.attribute_name(), a.attribute_type()))
        .collect();
    let typed = |attr: &str, want: ScalarAttributeType| types.get(attr) == Some(&&want);
    let index_ok = |index: &str, hash: &str, range: &str, projection: ProjectionType| {
        table.global_secondary_indexes().iter().any(|i| {
            i.index_name() == Some(index)
                && keys(i.key_schema())
                    == [
                        (hash.to_owned(), KeyType::Hash),
                        (range.to_owned(), KeyType::Range),
                    ]
                && (i.projection().and_then(|p| p.projection_type()) == Some(&projection)
                    || i.projection().and_then(|p| p.projection_type())
                        == Some(&ProjectionType::All))
        })
    };
    let ok = keys(table.key_schema()) == [(PK.to_owned(), KeyType::Hash)]
        && typed(PK, ScalarAttributeType::S)
        && typed(attr::GSI_STATE, ScalarAttributeType::S)
        && typed(attr::UPDATED, ScalarAttributeType::N)
        && typed(attr::GSI_EXPIRY, ScalarAttributeType::S)
        && typed(attr::EXPIRES, ScalarAttributeType::N)
        && index_ok(
            BY_STATE,
            attr::GSI_STATE,
            attr::UPDATED,
            ProjectionType::All,
        )
        && index_ok(
            BY_EXPIRY,
            attr::GSI_EXPIRY,
            attr::EXPIRES,
            ProjectionType::KeysOnly,
        );
    if ok {
        return Ok(());
    }
    let found: Vec<String> = keys(table.key_schema())
        .into_iter()
        .map(|(k, t)| format!("{k} ({})", t.as_str()))
        .collect();
    let indexes: Vec<&str> = table
        .global_secondary_indexes()
        .iter()
        .filter_map(|i| i.index_name())
        .collect();
    Err(StoreError::Misconfigured {
        message: format!(
            "dynamodb: table {name} is not an idem table (its key is {}, its indexes {:?}); idem needs {SHAPE}. Name another table, or let migrate create it",
            found.join(", "),
            indexes
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_shape_is_refused_with_what_was_found() {
        let table = TableDescription::builder()
            .key_schema(key("id", KeyType::Hash))
            .attribute_definitions(attribute("id", ScalarAttributeType::S))
            .build();
        let err = check_shape("orders", &table).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, StoreError::Misconfigured { .. }));
        assert!(
            text.contains("orders") && text.contains("id (HASH)"),
            "{text}"
        );
    }

    /// The code that unknown codes would be mistaken for: the type's name, not a message.
    #[test]
    fn codes_are_read_from_metadata() {
        let e = aws_sdk_dynamodb::operation::describe_table::DescribeTableError::generic(
            aws_sdk_dynamodb::error::ErrorMetadata::builder()
                .code("ResourceNotFoundException")
                .build(),
        );
        assert_eq!(e.code(), Some("ResourceNotFoundException"));
    }
}
