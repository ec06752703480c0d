//! What a store keeps for one (scope, key).

use serde::{Deserialize, Serialize};

use crate::checkpoint::{checkpoints_from_column, checkpoints_to_column};
use crate::{
    Checkpoint, Fingerprint, IdempotencyKey, Outcome, OutcomeClass, Scope, StoreError, Timestamp,
    Token,
};

/// The state of a record ([contract §2](crate::contract#states)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordState {
    /// A holder has claimed the operation and has not finished it.
    Processing,
    /// The operation finished; its outcome is the answer to every repeat.
    Completed,
    /// The last attempt failed retryably or was released; the next claim runs it again.
    FailedRetryable,
}

impl RecordState {
    /// Every state, in the order of the contract's table (for a store that reads an index once
    /// per state, e.g. `list` without a state filter).
    pub const ALL: [RecordState; 3] = [
        RecordState::Processing,
        RecordState::Completed,
        RecordState::FailedRetryable,
    ];

    /// `"processing"`, `"completed"` or `"failed_retryable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Processing => "processing",
            Self::Completed => "completed",
            Self::FailedRetryable => "failed_retryable",
        }
    }

    /// Parses [`RecordState::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "processing" => Some(Self::Processing),
            "completed" => Some(Self::Completed),
            "failed_retryable" => Some(Self::FailedRetryable),
            _ => None,
        }
    }
}

impl std::fmt::Display for RecordState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a store keeps for (scope, key) ([contract §1](crate::contract#words)).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Record {
    /// Who owns the key.
    pub scope: Scope,
    /// The key.
    pub key: IdempotencyKey,
    /// The fingerprint of the request that first claimed the key; never changes while the record
    /// lives.
    pub fingerprint: Fingerprint,
    /// Where the record is in its life.
    pub state: RecordState,
    /// The token of the latest claim.
    pub token: Token,
    /// Which attempt the latest claim was, from 1.
    pub attempt: u32,
    /// Until when the latest claim is presumed alive.
    pub lease_until: Timestamp,
    /// The stored outcome: the answer when `completed`; the last retryable answer, if any, when
    /// `failed_retryable`; none while `processing`.
    pub outcome: Option<Outcome>,
    /// When the record was first written.
    pub created_at: Timestamp,
    /// When the record was last written.
    pub updated_at: Timestamp,
    /// From this instant on the record is treated exactly as if it did not exist.
    pub expires_at: Timestamp,
    /// The steps the operation saved so far, in order ([contract §6.1](crate::contract#checkpoints)):
    /// kept through a release, a retryable outcome and a takeover; none once `completed`.
    #[serde(default)]
    pub checkpoints: Vec<Checkpoint>,
}

impl Record {
    /// Where the record's key came from: sent by the caller or derived by the tool
    /// ([contract §5.1](crate::contract#keyless)), as [`IdempotencyKey::origin`] reads it.
    pub fn key_origin(&self) -> crate::KeyOrigin {
        self.key.origin()
    }

    /// Whether the record has expired at `now` (`now >= expires_at`): an expired record is absent.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// Whether the lease of a `processing` record has run out at `now` (`now >= lease_until`).
    pub fn lease_elapsed(&self, now: Timestamp) -> bool {
        now >= self.lease_until
    }

    /// The last step the operation saved ([contract §6.1](crate::contract#checkpoints)): the
    /// step a resumed attempt or a reconciliation probe continues after.
    pub fn last_checkpoint(&self) -> Option<&Checkpoint> {
        self.checkpoints.last()
    }

    /// Whether `list_in_flight(at, …)` lists it: `processing`, lease elapsed and not expired at
    /// `at`.
    pub fn is_stale_processing(&self, at: Timestamp) -> bool {
        self.state == RecordState::Processing && self.lease_elapsed(at) && !self.is_expired(at)
    }
}

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
/// use idem_core::record::RawRecord;
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
    /// [`Record::checkpoints`] as a JSON array ([`crate::checkpoint`]); `None` when there are
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_round_trips() {
        for s in [
            RecordState::Processing,
            RecordState::Completed,
            RecordState::FailedRetryable,
        ] {
            assert_eq!(RecordState::parse(s.as_str()), Some(s));
            assert_eq!(s.to_string(), s.as_str());
        }
        assert_eq!(RecordState::parse("done"), None);
    }

    fn record() -> Record {
        Record {
            scope: Scope::new("tenant").unwrap(),
            key: IdempotencyKey::new("k-1").unwrap(),
            fingerprint: Fingerprint::parse(&"ab".repeat(32)).unwrap(),
            state: RecordState::Completed,
            token: Token::with_id(3, 0xfeed),
            attempt: 2,
            lease_until: Timestamp::from_millis(1_000),
            outcome: Some(
                Outcome::from_json_text(201, "{ \"b\":1, \"a\":2 }", OutcomeClass::Definitive)
                    .unwrap(),
            ),
            created_at: Timestamp::from_millis(10),
            updated_at: Timestamp::from_millis(20),
            expires_at: Timestamp::from_millis(30),
            checkpoints: vec![
                Checkpoint::new("charged", "{\"id\": 1}", Timestamp::from_millis(15)).unwrap(),
            ],
        }
    }

    fn message(err: StoreError) -> String {
        assert_eq!(err.kind(), "corrupt", "{err:?}");
        err.to_string()
    }

    #[test]
    fn columns_round_trip() {
        let r = record();
        assert_eq!(RawRecord::from_record(&r).into_record().unwrap(), r);
        let bare = Record {
            outcome: None,
            state: RecordState::Processing,
            ..record()
        };
        let raw = RawRecord::from_record(&bare);
        assert_eq!(raw.outcome_status, None);
        assert_eq!(raw.into_record().unwrap(), bare);
    }

    #[test]
    fn timestamps_clamp_at_the_far_end() {
        let far = Record {
            expires_at: Timestamp::from_millis(u64::MAX),
            lease_until: Timestamp::from_millis(u64::MAX - 1),
            ..record()
        };
        let raw = RawRecord::from_record(&far);
        assert_eq!((raw.expires_at, raw.lease_until), (i64::MAX, i64::MAX));
        let back = raw.into_record().unwrap();
        assert_eq!(back.expires_at, Timestamp::from_millis(u64::MAX));
        assert_eq!(back.lease_until, Timestamp::from_millis(u64::MAX));
        assert_eq!(
            timestamp_from_column("x", 7).unwrap(),
            Timestamp::from_millis(7)
        );
        assert!(
            message(timestamp_from_column("lease_until", -5).unwrap_err()).contains("lease_until")
        );
        assert_eq!(
            integer_from_text("x", "18446744073709551615").unwrap(),
            i64::MAX
        );
        assert_eq!(integer_from_text("x", "-3").unwrap(), -3);
        assert!(message(integer_from_text("lu", "soon").unwrap_err()).contains("lu"));
    }

    #[test]
    fn every_bad_column_is_corrupt_and_named() {
        type Spoil = fn(&mut RawRecord);
        let cases: [(&str, Spoil); 16] = [
            ("scope", |r| r.scope = String::new()),
            ("key", |r| r.key = String::new()),
            ("fingerprint", |r| r.fingerprint = "ABC".into()),
            ("state", |r| r.state = "done".into()),
            ("token_seq", |r| r.token_seq = -1),
            ("token_id", |r| r.token_id = "not-hex".into()),
            ("attempt", |r| r.attempt = 5_000_000_000),
            ("attempt", |r| r.attempt = -1),
            ("lease_until", |r| r.lease_until = -5),
            ("created_at", |r| r.created_at = -1),
            ("updated_at", |r| r.updated_at = -1),
            ("expires_at", |r| r.expires_at = -1),
            ("outcome_status", |r| r.outcome_status = Some(70_000)),
            ("outcome_class", |r| r.outcome_class = Some("maybe".into())),
            ("outcome_body", |r| {
                r.outcome_body = Some("{not json".into())
            }),
            ("checkpoints", |r| r.checkpoints = Some("[{".into())),
        ];
        for (column, spoil) in cases {
            let mut raw = RawRecord::from_record(&record());
            spoil(&mut raw);
            let msg = message(raw.into_record().unwrap_err());
            assert!(msg.contains(column), "{column}: {msg}");
        }
        let mut raw = RawRecord::from_record(&record());
        raw.outcome_class = None;
        assert!(message(raw.into_record().unwrap_err()).contains("partly absent"));
    }

    #[test]
    fn corrupt_keeps_its_source() {
        let mut raw = RawRecord::from_record(&record());
        raw.outcome_body = Some("{not json".into());
        let err = raw.into_record().unwrap_err();
        assert!(std::error::Error::source(&err).is_some(), "{err:?}");
        assert!(std::error::Error::source(&StoreError::corrupt("x")).is_none());
    }
}
