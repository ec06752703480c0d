//! Records to bind parameters and back, through the columns of
//! [`idem_core::store::columns::RawRecord`].
//!
//! Timestamps and the token's `seq` are kept as BIGINT by the one clamping rule of
//! [`idem_core::store::columns`] (past `i64::MAX`, the year 292 million, they are stored as
//! `i64::MAX`, which keeps every comparison the store makes in SQL right). The token id is kept as
//! 32 hex digits, the outcome body as TEXT exactly as [`idem_core::Outcome::body`] gives it (never
//! jsonb, which reorders keys).

use idem_core::store::columns::{RawRecord, timestamp_from_column};
use idem_core::{Record, StoreError, Timestamp};
use sqlx::Row;
use sqlx::postgres::PgRow;

pub(crate) use idem_core::store::columns::{timestamp_to_column as ts, to_column as big};

use crate::statement::Statement;

/// Binds a whole record as `$1..$15`, in [`crate::schema::COLUMNS`] order.
pub(crate) fn bind_record<'q>(q: Statement<'q>, r: &Record) -> Statement<'q> {
    let r = RawRecord::from_record(r);
    let status = r.outcome_status.map(status);
    q.bind(r.scope)
        .bind(r.key)
        .bind(r.fingerprint)
        .bind(r.state)
        .bind(r.token_seq)
        .bind(r.token_id)
        .bind(r.attempt)
        .bind(r.lease_until)
        .bind(status)
        .bind(r.outcome_body)
        .bind(r.outcome_class)
        .bind(r.created_at)
        .bind(r.updated_at)
        .bind(r.expires_at)
        .bind(r.checkpoints)
}

/// Binds whole records as `$1..$15`, one array per column in [`crate::schema::COLUMNS`] order
/// (the rows of an `unnest`).
pub(crate) fn bind_records<'q>(q: Statement<'q>, records: &[&Record]) -> Statement<'q> {
    let raw: Vec<RawRecord> = records.iter().map(|r| RawRecord::from_record(r)).collect();
    fn column<T>(raw: &[RawRecord], f: impl Fn(&RawRecord) -> T) -> Vec<T> {
        raw.iter().map(f).collect()
    }
    q.bind(column(&raw, |r| r.scope.clone()))
        .bind(column(&raw, |r| r.key.clone()))
        .bind(column(&raw, |r| r.fingerprint.clone()))
        .bind(column(&raw, |r| r.state.clone()))
        .bind(column(&raw, |r| r.token_seq))
        .bind(column(&raw, |r| r.token_id.clone()))
        .bind(column(&raw, |r| r.attempt))
        .bind(column(&raw, |r| r.lease_until))
        .bind(column(&raw, |r| r.outcome_status.map(status)))
        .bind(column(&raw, |r| r.outcome_body.clone()))
        .bind(column(&raw, |r| r.outcome_class.clone()))
        .bind(column(&raw, |r| r.created_at))
        .bind(column(&raw, |r| r.updated_at))
        .bind(column(&raw, |r| r.expires_at))
        .bind(column(&raw, |r| r.checkpoints.clone()))
}

/// outcome_status is an INTEGER column; a status is a u16.
fn status(s: i64) -> i32 {
    i32::try_from(s).unwrap_or(i32::MAX)
}

fn col<'r, T>(row: &'r PgRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get::<T, _>(name)
        .map_err(|e| StoreError::corrupt_with(format!("column {name}: {e}"), e))
}

/// A timestamp column of `row`.
pub(crate) fn timestamp(row: &PgRow, name: &str) -> Result<Timestamp, StoreError> {
    timestamp_from_column(name, col(row, name)?)
}

/// Reads a record written by this crate; anything that does not parse is [`StoreError::Corrupt`].
pub(crate) fn record_from_row(row: &PgRow) -> Result<Record, StoreError> {
    RawRecord {
        scope: col(row, "scope")?,
        key: col(row, "key")?,
        fingerprint: col(row, "fingerprint")?,
        state: col(row, "state")?,
        token_seq: col(row, "token_seq")?,
        token_id: col(row, "token_id")?,
        attempt: col(row, "attempt")?,
        lease_until: col(row, "lease_until")?,
        outcome_status: col::<Option<i32>>(row, "outcome_status")?.map(i64::from),
        outcome_body: col(row, "outcome_body")?,
        outcome_class: col(row, "outcome_class")?,
        created_at: col(row, "created_at")?,
        updated_at: col(row, "updated_at")?,
        expires_at: col(row, "expires_at")?,
        checkpoints: col(row, "checkpoints")?,
    }
    .into_record()
}
