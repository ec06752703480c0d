//! The table's shape: attribute and index names, the size budget of an item, the index shards and
//! the table name's rules.

use std::fmt;

use crate::error::TableNameError;

/// The schema version this crate writes and reads (kept in the table's schema item).
pub(crate) const SCHEMA_VERSION: u32 = 1;

/// The partition key: the scope and the key, length-prefixed (see [`partition_key`]).
pub(crate) const PK: &str = "pk";
/// The partition key of the item that records the schema version. Record keys start with a digit.
pub(crate) const SCHEMA_PK: &str = "#schema";
/// The schema item's version attribute.
pub(crate) const VERSION: &str = "version";

/// The index that serves `list` and `list_in_flight`: partition `gs` (state and shard), sorted by
/// `upd`, every attribute projected.
pub(crate) const BY_STATE: &str = "by_state";
/// The index that serves `purge_expired`: partition `gx` (shard), sorted by `exp`, keys only.
pub(crate) const BY_EXPIRY: &str = "by_expiry";

/// Each index partition key is spread over this many values, so that no single partition key of
/// an index takes every write (DynamoDB throttles one partition key at about 1 000 writes a
/// second). A reader of an index queries every shard.
pub(crate) const SHARDS: u32 = 8;

/// DynamoDB's limit on one item, attribute names included.
pub(crate) const ITEM_LIMIT: usize = 400 * 1024;
/// What an item's attributes other than the outcome body and the checkpoints can take: the
/// partition key (scope and key again), the scope (up to 512 bytes), the key (255), the
/// fingerprint, the token, the numbers and every attribute name, with room to spare.
pub(crate) const FIXED_ROOM: usize = 8 * 1024;
/// What the checkpoints of one record may take together (the `cpb` counter keeps them under it):
/// one checkpoint of the default limit (64 KiB) fits with room for more.
pub(crate) const CHECKPOINT_ROOM: usize = 96 * 1024;
/// The largest outcome body kept in the record's own item: what is left of an item once the
/// other attributes and the checkpoints (kept beside a retryable outcome) have their room, so
/// that every write fits by construction. A larger body is kept in chunk items (`chunks`).
pub(crate) const INLINE_OUTCOME_BYTES: usize = ITEM_LIMIT - FIXED_ROOM - CHECKPOINT_ROOM;
/// The bytes of an outcome body one chunk item holds.
pub(crate) const CHUNK_BYTES: usize = 256 * 1024;

/// The attribute names of a record item (short: names count against the item's size and its
/// capacity units).
pub(crate) mod attr {
    pub(crate) const SCOPE: &str = "sc";
    pub(crate) const KEY: &str = "k";
    pub(crate) const FINGERPRINT: &str = "fp";
    pub(crate) const STATE: &str = "st";
    pub(crate) const SEQ: &str = "seq";
    pub(crate) const TOKEN_ID: &str = "tid";
    pub(crate) const ATTEMPT: &str = "att";
    pub(crate) const LEASE: &str = "lease";
    pub(crate) const OUTCOME_STATUS: &str = "ost";
    pub(crate) const OUTCOME_BODY: &str = "obody";
    pub(crate) const OUTCOME_CLASS: &str = "ocls";
    pub(crate) const CREATED: &str = "cat";
    pub(crate) const UPDATED: &str = "upd";
    pub(crate) const EXPIRES: &str = "exp";
    /// The checkpoints: a list of strings, each one element of the checkpoints column
    /// (`idem_core::store::columns::checkpoint_item`), appended with `list_append`.
    pub(crate) const CHECKPOINTS: &str = "cps";
    /// The bytes the checkpoints take (the sum of their elements' lengths).
    pub(crate) const CHECKPOINT_BYTES: &str = "cpb";
    /// A random id drawn for every write: a compare-and-set on it sees every change (a
    /// checkpoint among them), and a write the SDK sent again after a lost answer recognises
    /// itself in the item the refusal returns.
    pub(crate) const WRITE_ID: &str = "wid";
    /// An outcome kept in chunk items: how many, and the write id that names them.
    pub(crate) const OUTCOME_CHUNKS: &str = "ochunks";
    /// See [`OUTCOME_CHUNKS`].
    pub(crate) const OUTCOME_WRITE: &str = "owid";
    /// A chunk item's bytes.
    pub(crate) const CHUNK: &str = "b";
    /// DynamoDB's TTL attribute: `exp` in whole seconds, rounded up. It only frees space.
    pub(crate) const TTL: &str = "ttl";
    /// The `by_state` partition: `{state}#{shard}`.
    pub(crate) const GSI_STATE: &str = "gs";
    /// The `by_expiry` partition: `x{shard}`.
    pub(crate) const GSI_EXPIRY: &str = "gx";
}

/// The partition key of (scope, key): the scope's length in bytes, `:`, the scope, the key. The
/// length prefix keeps `("a:b", "c")` and `("a", "b:c")` apart; the values compare byte for byte.
pub(crate) fn partition_key(scope: &str, key: &str) -> String {
    format!("{}:{scope}{key}", scope.len())
}

/// The shard of a partition key (FNV-1a, fixed forever: a record's index partitions are computed
/// from it on every write).
pub(crate) fn shard(pk: &str) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for b in pk.bytes() {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h % SHARDS
}

/// The `by_state` partition of a record in `state` (as stored) on `shard`.
pub(crate) fn state_partition(state: &str, shard: u32) -> String {
    format!("{state}#{shard}")
}

/// The `by_expiry` partition of the records of `shard`.
pub(crate) fn expiry_partition(shard: u32) -> String {
    format!("x{shard}")
}

/// The `by_expiry` partition of the outcome chunks of `shard` (purged, never counted).
pub(crate) fn chunk_partition(shard: u32) -> String {
    format!("c{shard}")
}

/// The partition key of chunk `index` of the outcome written by `write` on the record `pk`.
/// Record keys start with a digit, chunk keys with `o:`: the two never meet.
pub(crate) fn chunk_key(write: &str, index: u32, pk: &str) -> String {
    format!("o:{write}:{index}:{pk}")
}

/// A validated DynamoDB table name: 3 to 255 of `a-z A-Z 0-9 _ - .`.
///
/// ```
/// use idem_store_dynamodb::{TableName, TableNameError};
/// assert_eq!(TableName::new("idem-records").unwrap().as_str(), "idem-records");
/// assert_eq!(TableName::new("ab"), Err(TableNameError::Length { len: 2 }));
/// assert!(matches!(TableName::new("a b c"), Err(TableNameError::InvalidCharacter { index: 1, .. })));
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct TableName(String);

impl TableName {
    /// The default table name, `idem_records`.
    pub const DEFAULT: &'static str = "idem_records";

    /// Checks `name` against DynamoDB's rules for table names.
    pub fn new(name: impl Into<String>) -> Result<Self, TableNameError> {
        let name = name.into();
        if !(3..=255).contains(&name.len()) {
            return Err(TableNameError::Length { len: name.len() });
        }
        if let Some((index, c)) = name
            .char_indices()
            .find(|(_, c)| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        {
            return Err(TableNameError::InvalidCharacter { index, found: c });
        }
        Ok(Self(name))
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TableName {
    fn default() -> Self {
        Self(Self::DEFAULT.to_owned())
    }
}

impl fmt::Display for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for TableName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partition_keys_keep_the_separator_in_place() {
        assert_ne!(partition_key("a:b", "c"), partition_key("a", "b:c"));
        assert_ne!(partition_key("a/b", "c"), partition_key("a", "b/c"));
        assert_eq!(partition_key("tenant", "k-1"), "6:tenantk-1");
    }

    #[test]
    fn shards_are_stable_and_in_range() {
        // Fixed values: a change of the hash would move every stored record's index partitions.
        assert_eq!(shard("6:tenantk-1"), shard("6:tenantk-1"));
        assert_eq!(shard(""), 0x811c_9dc5 % SHARDS);
        assert!((0..1000).all(|i| shard(&format!("{i}")) < SHARDS));
        let used: std::collections::HashSet<u32> = (0..200)
            .map(|i| shard(&partition_key("s", &format!("k{i}"))))
            .collect();
        assert_eq!(used.len(), SHARDS as usize);
    }

    #[test]
    fn the_room_adds_up_to_one_item() {
        assert_eq!(
            INLINE_OUTCOME_BYTES + FIXED_ROOM + CHECKPOINT_ROOM,
            ITEM_LIMIT
        );
        const { assert!(CHECKPOINT_ROOM > idem_core::Policy::DEFAULT_MAX_CHECKPOINT_BYTES + 1024) };
        const { assert!(CHUNK_BYTES + FIXED_ROOM < ITEM_LIMIT) };
    }
}
