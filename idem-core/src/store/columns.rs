//! For store authors: a [`Record`] as the plain columns every engine keeps, and back.
//!
//! A store maps its engine's values to [`RawRecord`] and back; the checks and the "corrupt"
//! messages live here only, so every store reads a damaged record the same way
//! ([`StoreError::Corrupt`], never a guess).
//!
//! Checkpoints ([contract §6.1](crate::contract#checkpoints)) are kept in one text column: a JSON
//! array of `{"name": "charged", "value": "<the value's JSON text>", "saved_at": <ms>}`, the value
//! kept as a string so it reads back byte for byte. [`checkpoints_to_column`],
//! [`checkpoint_item`] and [`checkpoints_from_column`] write and read it.

use serde::{Deserialize, Serialize};

use crate::{
    Checkpoint, Fingerprint, IdempotencyKey, Outcome, OutcomeClass, Record, RecordState, Scope,
    StoreError, Timestamp, Token,
};

#[cfg(test)]
mod tests;

/// A [`Record`] as plain columns, the shape every engine stores: text, 64-bit signed integers and
/// an optional outcome in three columns. A store maps its engine's values to these columns and
/// back; the checks and the "corrupt" messages live here only.
///
/// Integers are `i64` because that is what SQL engines and Redis hold. Timestamps and the token's
/// `seq` (u64) are written saturating at `i64::MAX` ([`to_column`]); a timestamp column holding
/// `i64::MAX` reads back as the far end of time, `u64::MAX`, the value [`Timestamp`] saturates at
/// ([`timestamp_from_column`]), so every comparison an engine makes keeps its order. A negative
/// integer is corrupt.
///
/// ```
/// use idem_core::store::columns::RawRecord;
/// # use idem_core::{Fingerprint, IdempotencyKey, Record, RecordState, Scope, Timestamp, Token};
/// # let record = Record { scope: Scope::new("s").unwrap(), key: IdempotencyKey::new("k").unwrap(),
/// #     fingerprint: Fingerprint::parse(&"a".repeat(64)).unwrap(), state: RecordState::Processing,
/// #     token: Token::with_id(1, 7), attempt: 1, lease_until: Timestamp::from_millis(5),
/// #     outcome: None, created_at: Timestamp::from_millis(0), updated_at: Timestamp::from_millis(0),
/// #     expires_at: Timestamp::from_millis(u64::MAX), checkpoints: Vec::new() };
/// let columns = RawRecord::from_record(&record);
/// assert_eq!(columns.expires_at, i64::MAX);
/// assert_eq!(columns.into_record().unwrap(), record);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawRecord {
    /// [`Record::scope`].
    pub scope: String,
    /// [`Record::key`].
    pub key: String,
    /// [`Record::fingerprint`], 64 lower-case hex digits.
    pub fingerprint: String,
    /// [`Record::state`], as [`RecordState::as_str`].
    pub state: String,
    /// The token's `seq`.
    pub token_seq: i64,
    /// The token's id, 32 hex digits ([`Token::id_hex`]).
    pub token_id: String,
    /// [`Record::attempt`].
    pub attempt: i64,
    /// [`Record::lease_until`], in milliseconds.
    pub lease_until: i64,
    /// The outcome's status; the three outcome columns are all set or all absent.
    pub outcome_status: Option<i64>,
    /// The outcome's body, exactly as [`Outcome::body`] gave it.
    pub outcome_body: Option<String>,
    /// The outcome's class, as [`OutcomeClass::as_str`].
    pub outcome_class: Option<String>,
    /// [`Record::created_at`], in milliseconds.
    pub created_at: i64,
    /// [`Record::updated_at`], in milliseconds.
    pub updated_at: i64,
    /// [`Record::expires_at`], in milliseconds.
    pub expires_at: i64,
    /// [`Record::checkpoints`] as a JSON array ([`checkpoints_to_column`]); `None` when there are
    /// none.
    pub checkpoints: Option<String>,
}

impl RawRecord {
    /// The columns of `record`.
    pub fn from_record(record: &Record) -> Self {
        let outcome = record.outcome.as_ref();
        Self {
            scope: record.scope.as_str().to_owned(),
            key: record.key.as_str().to_owned(),
            fingerprint: record.fingerprint.as_str().to_owned(),
            state: record.state.as_str().to_owned(),
            token_seq: to_column(record.token.seq),
            token_id: record.token.id_hex(),
            attempt: i64::from(record.attempt),
            lease_until: timestamp_to_column(record.lease_until),
            outcome_status: outcome.map(|o| i64::from(o.status())),
            outcome_body: outcome.map(|o| o.body().to_owned()),
            outcome_class: outcome.map(|o| o.class().as_str().to_owned()),
            created_at: timestamp_to_column(record.created_at),
            updated_at: timestamp_to_column(record.updated_at),
            expires_at: timestamp_to_column(record.expires_at),
            checkpoints: checkpoints_to_column(&record.checkpoints),
        }
    }

    /// The record these columns hold; anything that does not parse is [`StoreError::Corrupt`],
    /// never guessed.
    pub fn into_record(self) -> Result<Record, StoreError> {
        let scope = Scope::new(self.scope).map_err(|e| corrupt("scope", e))?;
        let key = IdempotencyKey::from_stored(self.key).map_err(|e| corrupt("key", e))?;
        let fingerprint =
            Fingerprint::parse(&self.fingerprint).map_err(|e| corrupt("fingerprint", e))?;
        let state = RecordState::parse(&self.state)
            .ok_or_else(|| corrupt_value("state", &self.state, "an unknown state"))?;
        Ok(Record {
            scope,
            key,
            fingerprint,
            state,
            token: token_from_columns(self.token_seq, &self.token_id)?,
            attempt: integer_from_column("attempt", self.attempt)?,
            lease_until: timestamp_from_column("lease_until", self.lease_until)?,
            outcome: outcome_from_columns(
                self.outcome_status,
                self.outcome_body,
                self.outcome_class.as_deref(),
            )?,
            created_at: timestamp_from_column("created_at", self.created_at)?,
            updated_at: timestamp_from_column("updated_at", self.updated_at)?,
            expires_at: timestamp_from_column("expires_at", self.expires_at)?,
            checkpoints: checkpoints_from_column(self.checkpoints.as_deref())?,
        })
    }
}

/// An unsigned value (a token's `seq`, milliseconds) as a 64-bit signed column: values past
/// `i64::MAX` are stored as `i64::MAX`.
pub fn to_column(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// A timestamp as a column ([`to_column`] of its milliseconds).
pub fn timestamp_to_column(t: Timestamp) -> i64 {
    to_column(t.as_millis())
}

/// A timestamp column read back: `i64::MAX` is the far end of time (`u64::MAX`), a negative value
/// is [`StoreError::Corrupt`].
pub fn timestamp_from_column(column: &str, v: i64) -> Result<Timestamp, StoreError> {
    match v {
        i64::MAX => Ok(Timestamp::from_millis(u64::MAX)),
        v => integer_from_column(column, v).map(Timestamp::from_millis),
    }
}

/// An integer column read back as `T` (`u64`, `u32`, `u16`…); out of `T`'s range (negative, too
/// large) is [`StoreError::Corrupt`].
pub fn integer_from_column<T: TryFrom<i64, Error = std::num::TryFromIntError>>(
    column: &str,
    v: i64,
) -> Result<T, StoreError> {
    T::try_from(v)
        .map_err(|e| StoreError::corrupt_with(format!("column {column} is {v}, out of range"), e))
}

/// An integer column stored as decimal text (as Redis keeps numbers). A number past `i64::MAX`
/// that fits a `u64` saturates at `i64::MAX`, as [`to_column`] would have written it.
pub fn integer_from_text(column: &str, text: &str) -> Result<i64, StoreError> {
    match text.parse::<i64>() {
        Ok(v) => Ok(v),
        Err(e) => match text.parse::<u64>() {
            Ok(_) => Ok(i64::MAX),
            Err(_) => Err(StoreError::corrupt_with(
                format!("column {column} is {text:?}, not a number"),
                e,
            )),
        },
    }
}

/// A token from its `token_seq` and `token_id` columns.
pub fn token_from_columns(seq: i64, id: &str) -> Result<Token, StoreError> {
    let id = Token::parse_id_hex(id)
        .ok_or_else(|| corrupt_value("token_id", id, "not 32 hex digits"))?;
    Ok(Token::with_id(integer_from_column("token_seq", seq)?, id))
}

/// The outcome in the three outcome columns: all absent is none, all set is an outcome, anything
/// else is [`StoreError::Corrupt`]. The body is rebuilt exactly as stored, never re-serialised, so
/// it replays byte for byte.
pub fn outcome_from_columns(
    status: Option<i64>,
    body: Option<String>,
    class: Option<&str>,
) -> Result<Option<Outcome>, StoreError> {
    let (status, body, class) = match (status, body, class) {
        (None, None, None) => return Ok(None),
        (Some(status), Some(body), Some(class)) => (status, body, class),
        _ => {
            return Err(StoreError::corrupt(
                "outcome columns are partly absent (status, body and class go together)",
            ));
        }
    };
    let status = integer_from_column("outcome_status", status)?;
    let class = OutcomeClass::parse(class)
        .ok_or_else(|| corrupt_value("outcome_class", class, "an unknown class"))?;
    Outcome::from_json_text(status, body, class)
        .map(Some)
        .map_err(|e| corrupt("outcome_body", e))
}

fn corrupt(column: &str, source: impl std::error::Error + Send + Sync + 'static) -> StoreError {
    StoreError::corrupt_with(format!("column {column}: {source}"), source)
}

fn corrupt_value(column: &str, value: &str, what: &str) -> StoreError {
    StoreError::corrupt(format!("column {column} is {value:?}, {what}"))
}

/// One element of the checkpoints column.
#[derive(Serialize, Deserialize)]
struct Item<'a> {
    #[serde(borrow)]
    name: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    value: std::borrow::Cow<'a, str>,
    saved_at: i64,
}

impl<'a> Item<'a> {
    fn of(c: &'a Checkpoint) -> Self {
        Self {
            name: c.name().into(),
            value: c.value().into(),
            saved_at: i64::try_from(c.saved_at().as_millis()).unwrap_or(i64::MAX),
        }
    }
}

/// One checkpoint as an element of the checkpoints column, for a store that appends it in one
/// statement (SQL: `'[' || item || ']'` or the column without its closing `]` followed by
/// `',' || item || ']'`).
pub fn checkpoint_item(checkpoint: &Checkpoint) -> String {
    serde_json::to_string(&Item::of(checkpoint)).expect("strings and integers serialise")
}

/// The checkpoints column for `checkpoints`: `None` when there are none.
pub fn checkpoints_to_column(checkpoints: &[Checkpoint]) -> Option<String> {
    if checkpoints.is_empty() {
        return None;
    }
    let items: Vec<Item<'_>> = checkpoints.iter().map(Item::of).collect();
    Some(serde_json::to_string(&items).expect("strings and integers serialise"))
}

/// The checkpoints in a checkpoints column (`None` or `[]`: none). Anything that does not parse
/// is [`StoreError::Corrupt`].
pub fn checkpoints_from_column(column: Option<&str>) -> Result<Vec<Checkpoint>, StoreError> {
    let Some(text) = column else {
        return Ok(Vec::new());
    };
    let items: Vec<Item<'_>> = serde_json::from_str(text)
        .map_err(|e| StoreError::corrupt_with(format!("column checkpoints: {e}"), e))?;
    items
        .into_iter()
        .map(|item| {
            let saved_at = match item.saved_at {
                i64::MAX => Timestamp::from_millis(u64::MAX),
                ms => u64::try_from(ms).map(Timestamp::from_millis).map_err(|e| {
                    StoreError::corrupt_with(format!("checkpoint saved_at is {ms}"), e)
                })?,
            };
            Checkpoint::new(item.name, item.value, saved_at).map_err(|e| {
                StoreError::corrupt_with(format!("checkpoint value is not JSON: {e}"), e)
            })
        })
        .collect()
}
