//! A record as a row: reading (strictly, anything odd is `Corrupt`) and writing.

use idem_core::{
    Fingerprint, IdempotencyKey, Outcome, OutcomeClass, Record, RecordState, Scope, StoreError,
    Timestamp, Token,
};
use rusqlite::{Connection, OptionalExtension, Row, params};

use crate::error::at;
use crate::schema::Sql;

/// A timestamp as an SQLite INTEGER (i64). Timestamps past `i64::MAX` ms (292 million years)
/// are stored as `i64::MAX`, which reads back as the far end of time, `u64::MAX`, the value
/// [`Timestamp`] itself saturates at; every comparison in SQL keeps its order.
pub(crate) fn ts_to_sql(t: Timestamp) -> i64 {
    i64::try_from(t.as_millis()).unwrap_or(i64::MAX)
}

fn ts_from_sql(v: i64, column: &str) -> Result<Timestamp, StoreError> {
    match v {
        i64::MAX => Ok(Timestamp::from_millis(u64::MAX)),
        v if v >= 0 => Ok(Timestamp::from_millis(v as u64)),
        v => Err(StoreError::corrupt(format!(
            "sqlite: {column} is {v}, a negative timestamp"
        ))),
    }
}

/// The columns of a row, as SQLite typed them (a wrongly typed value fails here, as `Corrupt`).
struct RawRow {
    scope: String,
    key: String,
    fingerprint: String,
    state: String,
    token_seq: i64,
    token_id: String,
    attempt: i64,
    lease_until: i64,
    outcome_status: Option<i64>,
    outcome_body: Option<String>,
    outcome_class: Option<String>,
    created_at: i64,
    updated_at: i64,
    expires_at: i64,
}

impl RawRow {
    fn read(row: &Row<'_>) -> rusqlite::Result<Self> {
        Ok(Self {
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
        })
    }

    fn into_record(self) -> Result<Record, StoreError> {
        let bad = |what: &str| StoreError::corrupt(format!("sqlite: {what}"));
        let scope = Scope::new(self.scope).map_err(|e| bad(&format!("scope: {e}")))?;
        let key = IdempotencyKey::new(self.key).map_err(|e| bad(&format!("key: {e}")))?;
        let fingerprint = Fingerprint::parse(&self.fingerprint)
            .map_err(|_| bad("fingerprint is not 64 lower-case hex digits"))?;
        let state = RecordState::parse(&self.state)
            .ok_or_else(|| bad(&format!("unknown state {:?}", self.state)))?;
        let seq = u64::try_from(self.token_seq)
            .map_err(|_| bad(&format!("token_seq is {}", self.token_seq)))?;
        let id = Token::parse_id_hex(&self.token_id)
            .ok_or_else(|| bad("token_id is not 32 hex digits"))?;
        let attempt = u32::try_from(self.attempt)
            .map_err(|_| bad(&format!("attempt is {}", self.attempt)))?;
        let outcome = match (self.outcome_status, self.outcome_body, self.outcome_class) {
            (None, None, None) => None,
            (Some(status), Some(body), Some(class)) => {
                let status = u16::try_from(status)
                    .map_err(|_| bad(&format!("outcome_status is {status}")))?;
                let class = OutcomeClass::parse(&class)
                    .ok_or_else(|| bad(&format!("unknown outcome_class {class:?}")))?;
                // The body is stored exactly as `Outcome::body()` gave it: rebuilt, never
                // re-serialised, so it replays byte for byte.
                Some(
                    Outcome::from_json_text(status, body, class)
                        .map_err(|e| bad(&format!("outcome_body is not JSON: {e}")))?,
                )
            }
            _ => return Err(bad("outcome columns are partly NULL")),
        };
        Ok(Record {
            scope,
            key,
            fingerprint,
            state,
            token: Token::with_id(seq, id),
            attempt,
            lease_until: ts_from_sql(self.lease_until, "lease_until")?,
            outcome,
            created_at: ts_from_sql(self.created_at, "created_at")?,
            updated_at: ts_from_sql(self.updated_at, "updated_at")?,
            expires_at: ts_from_sql(self.expires_at, "expires_at")?,
        })
    }
}

/// The record stored for (scope, key), expired or not.
pub(crate) fn read(
    conn: &Connection,
    sql: &Sql,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<Option<Record>, StoreError> {
    conn.prepare_cached(&sql.select)
        .map_err(at("read: prepare"))?
        .query_row(params![scope.as_str(), key.as_str()], RawRow::read)
        .optional()
        .map_err(at("read"))?
        .map(RawRow::into_record)
        .transpose()
}

/// Every row a query returns, as records.
pub(crate) fn read_all(
    conn: &Connection,
    query: &str,
    params: impl rusqlite::Params,
) -> Result<Vec<Record>, StoreError> {
    let mut stmt = conn.prepare_cached(query).map_err(at("list: prepare"))?;
    let rows = stmt
        .query_map(params, RawRow::read)
        .map_err(at("list"))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(at("list"))?;
    rows.into_iter().map(RawRow::into_record).collect()
}

/// Writes `record` in place of `found`: an INSERT when there was no row, else an UPDATE fenced by
/// the token that was read. Must run inside the transaction that read `found`.
pub(crate) fn write(
    conn: &Connection,
    sql: &Sql,
    record: &Record,
    found: Option<&Record>,
) -> Result<(), StoreError> {
    let seq = i64::try_from(record.token.seq)
        .map_err(|e| StoreError::backend("sqlite: token seq beyond i64", e))?;
    let id = record.token.id_hex();
    let (status, body, class) = match &record.outcome {
        Some(o) => (
            Some(i64::from(o.status())),
            Some(o.body()),
            Some(o.class().as_str()),
        ),
        None => (None, None, None),
    };
    let columns = params![
        record.scope.as_str(),
        record.key.as_str(),
        record.fingerprint.as_str(),
        record.state.as_str(),
        seq,
        id,
        i64::from(record.attempt),
        ts_to_sql(record.lease_until),
        status,
        body,
        class,
        ts_to_sql(record.created_at),
        ts_to_sql(record.updated_at),
        ts_to_sql(record.expires_at),
    ];
    let changed = match found {
        None => conn
            .prepare_cached(&sql.insert)
            .map_err(at("write: prepare"))?
            .execute(columns)
            .map_err(at("write: insert"))?,
        Some(old) => {
            let old_seq = i64::try_from(old.token.seq)
                .map_err(|e| StoreError::backend("sqlite: token seq beyond i64", e))?;
            let old_id = old.token.id_hex();
            let mut all: Vec<&dyn rusqlite::ToSql> = columns.to_vec();
            all.push(&old_seq);
            all.push(&old_id);
            conn.prepare_cached(&sql.update_held)
                .map_err(at("write: prepare"))?
                .execute(all.as_slice())
                .map_err(at("write: update"))?
        }
    };
    if changed != 1 {
        // Cannot happen under the write lock that read `found`; refuse rather than guess.
        return Err(StoreError::Backend {
            message: format!(
                "sqlite: the record changed under a write transaction ({changed} rows)"
            ),
            source: None,
        });
    }
    Ok(())
}
