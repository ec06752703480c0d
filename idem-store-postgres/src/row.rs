//! Records to bind parameters and back.
//!
//! `Timestamp` (u64 milliseconds) and the token's `seq` are kept as BIGINT; values past
//! `i64::MAX` (the year 292 million) are stored as `i64::MAX`, which keeps every comparison the
//! store makes in SQL right. The token id is kept as 32 hex digits, the outcome body as TEXT
//! exactly as [`Outcome::body`] gives it (never jsonb, which reorders keys).

use idem_core::{
    Fingerprint, IdempotencyKey, Outcome, OutcomeClass, Record, RecordState, Scope, StoreError,
    Timestamp, Token,
};
use sqlx::Row;
use sqlx::postgres::{PgArguments, PgRow};
use sqlx::query::Query;

pub(crate) type PgQuery<'q> = Query<'q, sqlx::Postgres, PgArguments>;

pub(crate) fn ts(t: Timestamp) -> i64 {
    big(t.as_millis())
}

pub(crate) fn big(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// Binds a whole record as `$1..$14`, in [`crate::schema::COLUMNS`] order.
pub(crate) fn bind_record<'q>(q: PgQuery<'q>, r: &Record) -> PgQuery<'q> {
    let (status, body, class) = match &r.outcome {
        Some(o) => (
            Some(i32::from(o.status())),
            Some(o.body().to_owned()),
            Some(o.class().as_str()),
        ),
        None => (None, None, None),
    };
    q.bind(r.scope.as_str().to_owned())
        .bind(r.key.as_str().to_owned())
        .bind(r.fingerprint.as_str().to_owned())
        .bind(r.state.as_str())
        .bind(big(r.token.seq))
        .bind(r.token.id_hex())
        .bind(i64::from(r.attempt))
        .bind(ts(r.lease_until))
        .bind(status)
        .bind(body)
        .bind(class)
        .bind(ts(r.created_at))
        .bind(ts(r.updated_at))
        .bind(ts(r.expires_at))
}

fn col<'r, T>(row: &'r PgRow, name: &str) -> Result<T, StoreError>
where
    T: sqlx::Decode<'r, sqlx::Postgres> + sqlx::Type<sqlx::Postgres>,
{
    row.try_get::<T, _>(name)
        .map_err(|e| StoreError::corrupt(format!("column {name}: {e}")))
}

fn non_negative(name: &str, v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::corrupt(format!("column {name} is negative: {v}")))
}

pub(crate) fn timestamp(row: &PgRow, name: &str) -> Result<Timestamp, StoreError> {
    Ok(Timestamp::from_millis(non_negative(
        name,
        col::<i64>(row, name)?,
    )?))
}

/// Reads a record written by this crate; anything that does not parse is [`StoreError::Corrupt`].
pub(crate) fn record_from_row(row: &PgRow) -> Result<Record, StoreError> {
    let corrupt =
        |what: &str, e: &dyn std::fmt::Display| StoreError::corrupt(format!("column {what}: {e}"));
    let scope = Scope::new(col::<String>(row, "scope")?).map_err(|e| corrupt("scope", &e))?;
    let key = IdempotencyKey::new(col::<String>(row, "key")?).map_err(|e| corrupt("key", &e))?;
    let fingerprint = Fingerprint::parse(&col::<String>(row, "fingerprint")?)
        .map_err(|e| corrupt("fingerprint", &e))?;
    let state_text = col::<String>(row, "state")?;
    let state = RecordState::parse(&state_text)
        .ok_or_else(|| corrupt("state", &format!("unknown state {state_text:?}")))?;
    let seq = non_negative("token_seq", col::<i64>(row, "token_seq")?)?;
    let id_text = col::<String>(row, "token_id")?;
    let id = Token::parse_id_hex(&id_text)
        .ok_or_else(|| corrupt("token_id", &format!("not 32 hex digits: {id_text:?}")))?;
    let attempt_raw = col::<i64>(row, "attempt")?;
    let attempt = u32::try_from(attempt_raw)
        .map_err(|_| corrupt("attempt", &format!("out of range: {attempt_raw}")))?;
    let status = col::<Option<i32>>(row, "outcome_status")?;
    let body = col::<Option<String>>(row, "outcome_body")?;
    let class = col::<Option<String>>(row, "outcome_class")?;
    let outcome = match (status, body, class) {
        (None, None, None) => None,
        (Some(status), Some(body), Some(class)) => {
            let status = u16::try_from(status)
                .map_err(|_| corrupt("outcome_status", &format!("out of range: {status}")))?;
            let class = OutcomeClass::parse(&class)
                .ok_or_else(|| corrupt("outcome_class", &format!("unknown class {class:?}")))?;
            Some(
                Outcome::from_json_text(status, body, class)
                    .map_err(|e| corrupt("outcome_body", &e))?,
            )
        }
        _ => {
            return Err(StoreError::corrupt(
                "outcome columns are partly null (status, body and class go together)",
            ));
        }
    };
    Ok(Record {
        scope,
        key,
        fingerprint,
        state,
        token: Token::with_id(seq, id),
        attempt,
        lease_until: timestamp(row, "lease_until")?,
        outcome,
        created_at: timestamp(row, "created_at")?,
        updated_at: timestamp(row, "updated_at")?,
        expires_at: timestamp(row, "expires_at")?,
    })
}
