#![doc = include_str!("../README.md")]

mod chunks;
mod config;
mod error;
mod expr;
mod item;
mod list;
mod maintenance;
mod migrate;
mod ops;
mod schema;
mod store;

use std::fmt;
use std::sync::Arc;

use idem_core::StoreError;

pub use aws_sdk_dynamodb;
pub use config::{DynamoOptions, UrlError};
pub use error::TableNameError;
pub use schema::TableName;

use ops::Inner;

/// A [`KeyStore`](idem_core::KeyStore) in a DynamoDB table: for services on AWS Lambda and
/// elsewhere on AWS, where there is no PostgreSQL or Redis to hand.
///
/// - A claim is one conditional write: a new or expired key is written `processing` by the
///   same request that checks it, decided by the caller's `now`; refused, the write returns the
///   record (`ReturnValuesOnConditionCheckFailure=ALL_OLD`), so a replay, an in-flight answer or
///   a mismatch costs that one request. A retry after `failed_retryable` or a takeover writes
///   with a second, compare-and-set request.
/// - Completion, release and checkpoints are one update each, conditional on the token (fenced);
///   `extend` reads, then writes with a compare-and-set; `get` reads strongly consistent.
/// - `list`, `list_in_flight` and `purge_expired` query the table's two global secondary
///   indexes, never a scan.
/// - Waiting polls `get` (DynamoDB has no notifications).
///
/// Clones share the SDK client. Its `Debug` shows the table, never credentials.
#[derive(Clone)]
pub struct DynamoStore {
    pub(crate) inner: Arc<Inner>,
}

impl fmt::Debug for DynamoStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let config = self.inner.client.config();
        f.debug_struct("DynamoStore")
            .field("table", &self.inner.table)
            .field("region", &config.region().map(|r| r.as_ref()))
            .finish_non_exhaustive()
    }
}

impl DynamoStore {
    /// Opens the table a `dynamodb://TABLE?region=…&endpoint=…` URL names, with credentials
    /// and anything the URL leaves out from the SDK's configuration chain (environment, profile,
    /// web identity, the container or instance role; on Lambda, the function's role). Sends no
    /// request: [`DynamoStore::migrate`] creates the table.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        let options = DynamoOptions::parse(url).map_err(|e| StoreError::Misconfigured {
            message: e.to_string(),
        })?;
        Self::connect_with(&options).await
    }

    /// Opens the table `options` names (see [`DynamoStore::connect`]).
    pub async fn connect_with(options: &DynamoOptions) -> Result<Self, StoreError> {
        Ok(Self::from_client(
            options.client().await?,
            options.table.clone(),
        ))
    }

    /// A store on `table` through a client you configured (retries, timeouts, credentials).
    pub fn from_client(client: aws_sdk_dynamodb::Client, table: TableName) -> Self {
        Self {
            inner: Arc::new(Inner { client, table }),
        }
    }

    /// The table.
    pub fn table(&self) -> &TableName {
        &self.inner.table
    }

    /// The SDK client, for requests of your own.
    pub fn client(&self) -> &aws_sdk_dynamodb::Client {
        &self.inner.client
    }

    /// Creates the table if it is missing (on-demand capacity, partition key `pk`, the indexes
    /// `by_state` and `by_expiry`, TTL on `ttl`), waits until it is active, and records the
    /// schema version. Refuses, with [`StoreError::Misconfigured`], a table of another shape
    /// and a schema newer than this build. Idempotent; needs `dynamodb:CreateTable`,
    /// `DescribeTable`, `DescribeTimeToLive` and `UpdateTimeToLive` besides the store's own
    /// rights.
    pub async fn migrate(&self) -> Result<(), StoreError> {
        self.inner.migrate().await
    }
}
