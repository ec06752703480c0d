//! Outcome bodies too large for the record's own item (DynamoDB keeps 400 KB per item): kept in
//! chunk items of [`CHUNK_BYTES`] each, and reading any record item with its body.
//!
//! The chunks are written first, under keys named by the completing write's id, and are never
//! changed; the fenced update of the record that names them is the commit. A reader that sees the
//! record's reference therefore finds every chunk (strongly consistent reads), and a completion
//! that was fenced leaves chunks that nothing names. Chunks carry the record's expiry and its TTL:
//! `purge_expired` deletes them after the record (without counting them) and DynamoDB's TTL
//! frees them as it frees records.

use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::{StoreError, Timestamp};

use crate::error::{classify, corrupt};
use crate::item::{self, Decoded, Item, Stored, s, ts};
use crate::ops::Inner;
use crate::schema::{self, CHUNK_BYTES, PK, attr};

impl Inner {
    /// Writes `body` as chunk items for the record `pk`, named by the write `write`; how many.
    pub(crate) async fn put_chunks(
        &self,
        pk: &str,
        write: &str,
        body: &str,
        expires_at: Timestamp,
    ) -> Result<u32, StoreError> {
        let partition = schema::chunk_partition(schema::shard(pk));
        let mut count = 0;
        for (index, part) in (0u32..).zip(body.as_bytes().chunks(CHUNK_BYTES)) {
            self.client
                .put_item()
                .table_name(self.table.as_str())
                .item(PK, s(schema::chunk_key(write, index, pk)))
                .item(attr::CHUNK, AttributeValue::B(Blob::new(part)))
                .item(attr::GSI_EXPIRY, s(partition.clone()))
                .item(attr::EXPIRES, ts(expires_at))
                .item(attr::TTL, item::ttl(expires_at))
                .send()
                .await
                .map_err(|e| classify("complete", self.table.as_str(), e))?;
            count = index + 1;
        }
        Ok(count)
    }

    /// The body kept in the chunks `(write, count)` of the record `pk`.
    async fn read_chunks(&self, pk: &str, write: &str, count: u32) -> Result<String, StoreError> {
        let mut bytes = Vec::new();
        for index in 0..count {
            let out = self
                .client
                .get_item()
                .table_name(self.table.as_str())
                .key(PK, s(schema::chunk_key(write, index, pk)))
                .consistent_read(true)
                .send()
                .await
                .map_err(|e| classify("get", self.table.as_str(), e))?;
            match out.item.as_ref().and_then(|i| i.get(attr::CHUNK)) {
                Some(AttributeValue::B(part)) => bytes.extend_from_slice(part.as_ref()),
                _ => {
                    return Err(corrupt(format!(
                        "chunk {index} of {count} of the outcome of record {pk:?} is missing"
                    )));
                }
            }
        }
        String::from_utf8(bytes).map_err(|e| {
            StoreError::corrupt_with(
                format!("dynamodb: the outcome chunks of record {pk:?} are not UTF-8"),
                e,
            )
        })
    }

    /// The record in a record item, its outcome's body fetched if it is kept in chunks.
    pub(crate) async fn stored(&self, item: &Item) -> Result<Stored, StoreError> {
        let decoded: Decoded = item::decode(item)?;
        let body = match &decoded.chunks {
            Some((write, count)) => Some(self.read_chunks(&decoded.pk, write, *count).await?),
            None => None,
        };
        decoded.finish(body)
    }

    /// The record in an item the service returned, if it returned one (a refused write on an
    /// absent key returns none).
    pub(crate) async fn returned(&self, item: Option<&Item>) -> Result<Option<Stored>, StoreError> {
        match item.filter(|i| !i.is_empty()) {
            Some(item) => Ok(Some(self.stored(item).await?)),
            None => Ok(None),
        }
    }
}
