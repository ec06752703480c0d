//! A record as a row and back, through the columns of [`idem_core::store::columns::RawRecord`]:
//! reading strictly (a wrongly typed value is `Corrupt`), binding in
//! [`COLUMNS`](crate::schema::COLUMNS) order.

use idem_core::store::columns::RawRecord;
use rusqlite::Row;

pub(crate) use idem_core::store::columns::{timestamp_to_column as ts, to_column as big};

/// The columns of a row, as SQLite typed them (a wrongly typed value fails here, as `Corrupt`).
pub(crate) fn read_row(row: &Row<'_>) -> rusqlite::Result<RawRecord> {
    Ok(RawRecord {
        scope: row.get(0)?,
        key: row.get(1)?,
        fingerprint: row.get(2)?,
        state: row.get(3)?,
        token_seq: row.get(4)?,
        token_id: row.get(5)?,
        attempt: row.get(6)?,
        lease_until: row.get(7)?,
        outcome_status: row.get(8)?,
        outcome_body: row.get(9)?,
        outcome_class: row.get(10)?,
        created_at: row.get(11)?,
        updated_at: row.get(12)?,
        expires_at: row.get(13)?,
        checkpoints: row.get(14)?,
    })
}

/// The record's columns in the schema's order, as the insert and update statements bind them.
pub(crate) fn columns(r: &RawRecord) -> [&dyn rusqlite::ToSql; 15] {
    [
        &r.scope,
        &r.key,
        &r.fingerprint,
        &r.state,
        &r.token_seq,
        &r.token_id,
        &r.attempt,
        &r.lease_until,
        &r.outcome_status,
        &r.outcome_body,
        &r.outcome_class,
        &r.created_at,
        &r.updated_at,
        &r.expires_at,
        &r.checkpoints,
    ]
}
