//! A [`Record`] as a DynamoDB item and back, through the shared columns of
//! [`idem_core::store::columns`] (so a damaged item reads as corrupt exactly as a damaged row).

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::store::columns::{self, RawRecord};
use idem_core::{Checkpoint, Record, RecordId, RecordState, StoreError, Timestamp};

use crate::error::corrupt;
use crate::schema::{self, PK, attr};

/// An item as the SDK holds it.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// A record as stored, with the id of its last write, for a compare-and-set.
#[derive(Debug, Clone)]
pub(crate) struct Stored {
    pub(crate) record: Record,
    pub(crate) write_id: String,
}

/// A fresh write id: 64 random bits.
pub(crate) fn write_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The partition key of `id`.
pub(crate) fn pk_of(id: &RecordId) -> String {
    schema::partition_key(id.scope().as_str(), id.key().as_str())
}

/// A number attribute.
pub(crate) fn n(v: impl ToString) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// A string attribute.
pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

/// A timestamp as a number attribute (milliseconds, saturating as the shared columns do).
pub(crate) fn ts(t: Timestamp) -> AttributeValue {
    n(columns::timestamp_to_column(t))
}

/// The TTL attribute for an expiry: whole seconds, rounded up, so DynamoDB never deletes a
/// record before `now` says it expired.
pub(crate) fn ttl(expires_at: Timestamp) -> AttributeValue {
    n(expires_at.as_millis().div_ceil(1000))
}

/// The `by_state` partition of the record `pk` in `state`.
pub(crate) fn state_partition(pk: &str, state: RecordState) -> AttributeValue {
    s(schema::state_partition(state.as_str(), schema::shard(pk)))
}

/// One checkpoint as an element of the checkpoints list.
pub(crate) fn checkpoint_element(checkpoint: &Checkpoint) -> String {
    columns::checkpoint_item(checkpoint)
}

/// The whole item of `record` written by the write `write_id` (what a compare-and-set writes).
pub(crate) fn to_item(record: &Record, write_id: &str) -> Item {
    let raw = RawRecord::from_record(record);
    let pk = schema::partition_key(&raw.scope, &raw.key);
    let shard = schema::shard(&pk);
    let mut item = Item::new();
    item.insert(attr::GSI_STATE.into(), state_partition(&pk, record.state));
    item.insert(attr::GSI_EXPIRY.into(), s(schema::expiry_partition(shard)));
    item.insert(PK.into(), s(pk));
    item.insert(attr::SCOPE.into(), s(raw.scope));
    item.insert(attr::KEY.into(), s(raw.key));
    item.insert(attr::FINGERPRINT.into(), s(raw.fingerprint));
    item.insert(attr::STATE.into(), s(raw.state));
    item.insert(attr::SEQ.into(), n(raw.token_seq));
    item.insert(attr::TOKEN_ID.into(), s(raw.token_id));
    item.insert(attr::ATTEMPT.into(), n(raw.attempt));
    item.insert(attr::LEASE.into(), n(raw.lease_until));
    if let (Some(status), Some(body), Some(class)) =
        (raw.outcome_status, raw.outcome_body, raw.outcome_class)
    {
        item.insert(attr::OUTCOME_STATUS.into(), n(status));
        item.insert(attr::OUTCOME_BODY.into(), s(body));
        item.insert(attr::OUTCOME_CLASS.into(), s(class));
    }
    item.insert(attr::CREATED.into(), n(raw.created_at));
    item.insert(attr::UPDATED.into(), n(raw.updated_at));
    item.insert(attr::EXPIRES.into(), n(raw.expires_at));
    item.insert(attr::TTL.into(), ttl(record.expires_at));
    if !record.checkpoints.is_empty() {
        let elements: Vec<String> = record.checkpoints.iter().map(checkpoint_element).collect();
        let bytes: usize = elements.iter().map(String::len).sum();
        item.insert(
            attr::CHECKPOINTS.into(),
            AttributeValue::L(elements.into_iter().map(AttributeValue::S).collect()),
        );
        item.insert(attr::CHECKPOINT_BYTES.into(), n(bytes));
    }
    item.insert(attr::WRITE_ID.into(), s(write_id));
    item
}

/// A record item read, before its outcome body is fetched if it is kept in chunk items.
pub(crate) struct Decoded {
    raw: RawRecord,
    write_id: String,
    /// The write id and the number of the chunks that hold the outcome's body.
    pub(crate) chunks: Option<(String, u32)>,
    pub(crate) pk: String,
}

impl Decoded {
    /// The record, with `body` as its outcome's body when it is kept in chunks.
    pub(crate) fn finish(mut self, body: Option<String>) -> Result<Stored, StoreError> {
        if body.is_some() {
            self.raw.outcome_body = body;
        }
        Ok(Stored {
            record: self.raw.into_record()?,
            write_id: self.write_id,
        })
    }
}

/// Reads `item` as a record (see [`Decoded`]); anything missing or malformed is
/// [`StoreError::Corrupt`].
pub(crate) fn decode(item: &Item) -> Result<Decoded, StoreError> {
    let raw = RawRecord {
        scope: text(item, attr::SCOPE)?,
        key: text(item, attr::KEY)?,
        fingerprint: text(item, attr::FINGERPRINT)?,
        state: text(item, attr::STATE)?,
        token_seq: number(item, attr::SEQ)?,
        token_id: text(item, attr::TOKEN_ID)?,
        attempt: number(item, attr::ATTEMPT)?,
        lease_until: number(item, attr::LEASE)?,
        outcome_status: optional(item, attr::OUTCOME_STATUS, number)?,
        outcome_body: optional(item, attr::OUTCOME_BODY, text)?,
        outcome_class: optional(item, attr::OUTCOME_CLASS, text)?,
        created_at: number(item, attr::CREATED)?,
        updated_at: number(item, attr::UPDATED)?,
        expires_at: number(item, attr::EXPIRES)?,
        checkpoints: checkpoints(item)?,
    };
    let chunks = match optional(item, attr::OUTCOME_CHUNKS, number)? {
        None => None,
        Some(count) => Some((
            text(item, attr::OUTCOME_WRITE)?,
            columns::integer_from_column(attr::OUTCOME_CHUNKS, count)?,
        )),
    };
    Ok(Decoded {
        write_id: text(item, attr::WRITE_ID)?,
        pk: text(item, PK)?,
        raw,
        chunks,
    })
}

/// Reads an item whose outcome, if any, is inline.
#[cfg(test)]
pub(crate) fn from_item(item: &Item) -> Result<Stored, StoreError> {
    decode(item)?.finish(None)
}

fn optional<T>(
    item: &Item,
    name: &str,
    read: fn(&Item, &str) -> Result<T, StoreError>,
) -> Result<Option<T>, StoreError> {
    match item.get(name) {
        None | Some(AttributeValue::Null(true)) => Ok(None),
        Some(_) => read(item, name).map(Some),
    }
}

fn text(item: &Item, name: &str) -> Result<String, StoreError> {
    match item.get(name) {
        Some(AttributeValue::S(v)) => Ok(v.clone()),
        Some(_) => Err(corrupt(format!("attribute {name} is not a string"))),
        None => Err(corrupt(format!("attribute {name} is missing"))),
    }
}

pub(crate) fn number(item: &Item, name: &str) -> Result<i64, StoreError> {
    match item.get(name) {
        Some(AttributeValue::N(v)) => columns::integer_from_text(name, v),
        Some(_) => Err(corrupt(format!("attribute {name} is not a number"))),
        None => Err(corrupt(format!("attribute {name} is missing"))),
    }
}

/// The checkpoints list as the shared checkpoints column (a JSON array of its elements).
fn checkpoints(item: &Item) -> Result<Option<String>, StoreError> {
    let list = match item.get(attr::CHECKPOINTS) {
        None => return Ok(None),
        Some(AttributeValue::L(list)) => list,
        Some(_) => return Err(corrupt("attribute cps is not a list")),
    };
    let mut column = String::from("[");
    for (i, element) in list.iter().enumerate() {
        let AttributeValue::S(text) = element else {
            return Err(corrupt("an element of attribute cps is not a string"));
        };
        if i > 0 {
            column.push(',');
        }
        column.push_str(text);
    }
    column.push(']');
    Ok(Some(column))
}

#[cfg(test)]
mod tests {
    use idem_core::{Fingerprint, IdempotencyKey, Outcome, Scope, Token};

    use super::*;

    fn record() -> Record {
        Record {
            scope: Scope::new("tenant/tool").unwrap(),
            key: IdempotencyKey::new("k-1").unwrap(),
            fingerprint: Fingerprint::parse(&"a".repeat(64)).unwrap(),
            state: RecordState::FailedRetryable,
            token: Token::with_id(3, 0xfeed),
            attempt: 2,
            lease_until: Timestamp::from_millis(5_000),
            outcome: Some(Outcome::retryable_json(503, "down\u{0}")),
            created_at: Timestamp::from_millis(1_000),
            updated_at: Timestamp::from_millis(2_000),
            expires_at: Timestamp::from_millis(u64::MAX),
            checkpoints: vec![
                Checkpoint::new("a", "1", Timestamp::from_millis(1_500)).unwrap(),
                Checkpoint::new("b", "{\"x\": [1, 2]}", Timestamp::from_millis(1_600)).unwrap(),
            ],
        }
    }

    #[test]
    fn a_record_round_trips_with_its_counter() {
        let r = record();
        let item = to_item(&r, "w7");
        let back = from_item(&item).unwrap();
        assert_eq!((back.record, back.write_id.as_str()), (r, "w7"));
        assert_ne!(write_id(), write_id());
        assert_eq!(
            item[attr::GSI_STATE],
            s(format!(
                "failed_retryable#{}",
                schema::shard("11:tenant/toolk-1")
            ))
        );
        assert_eq!(item[attr::EXPIRES], n(i64::MAX));
    }

    #[test]
    fn the_ttl_never_comes_before_the_expiry() {
        assert_eq!(ttl(Timestamp::from_millis(1_001)), n(2));
        assert_eq!(ttl(Timestamp::from_millis(2_000)), n(2));
    }

    #[test]
    fn a_damaged_item_is_corrupt_never_guessed() {
        let mut item = to_item(&record(), "w1");
        item.insert(attr::SEQ.into(), s("x"));
        assert!(matches!(from_item(&item), Err(StoreError::Corrupt { .. })));
        let mut item = to_item(&record(), "w1");
        item.remove(attr::OUTCOME_CLASS);
        assert!(matches!(from_item(&item), Err(StoreError::Corrupt { .. })));
        let mut item = to_item(&record(), "w1");
        item.insert(attr::CHECKPOINTS.into(), AttributeValue::L(vec![n(1)]));
        assert!(matches!(from_item(&item), Err(StoreError::Corrupt { .. })));
    }
}
