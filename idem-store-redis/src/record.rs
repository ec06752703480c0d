//! Reading a record hash back, and the answers of the scripts.

use std::collections::HashMap;

use idem_core::{
    Fingerprint, IdempotencyKey, Outcome, OutcomeClass, Record, RecordState, Scope, StoreError,
    Timestamp, Token,
};

pub(crate) type Fields = HashMap<String, Vec<u8>>;

fn text<'a>(fields: &'a Fields, name: &str) -> Result<&'a str, StoreError> {
    let bytes = fields
        .get(name)
        .ok_or_else(|| StoreError::corrupt(format!("redis record: field {name} is missing")))?;
    std::str::from_utf8(bytes)
        .map_err(|_| StoreError::corrupt(format!("redis record: field {name} is not UTF-8")))
}

/// Parses a decimal number written by the store.
pub(crate) fn number<T: std::str::FromStr>(what: &str, s: &str) -> Result<T, StoreError> {
    s.parse()
        .map_err(|_| StoreError::corrupt(format!("redis record: {what} {s:?} is not a number")))
}

fn ts(fields: &Fields, name: &str) -> Result<Timestamp, StoreError> {
    Ok(Timestamp::from_millis(number(name, text(fields, name)?)?))
}

/// An outcome from its stored parts.
pub(crate) fn outcome(status: &str, body: &[u8], class: &str) -> Result<Outcome, StoreError> {
    let status: u16 = number("outcome status", status)?;
    let class = OutcomeClass::parse(class)
        .ok_or_else(|| StoreError::corrupt(format!("redis record: outcome class {class:?}")))?;
    let body = String::from_utf8(body.to_vec())
        .map_err(|_| StoreError::corrupt("redis record: outcome body is not UTF-8"))?;
    Outcome::from_json_text(status, body, class)
        .map_err(|e| StoreError::corrupt(format!("redis record: outcome body is not JSON: {e}")))
}

/// A token from its stored parts.
pub(crate) fn token(seq: &str, id: &str) -> Result<Token, StoreError> {
    let id = Token::parse_id_hex(id)
        .ok_or_else(|| StoreError::corrupt(format!("redis record: token id {id:?}")))?;
    Ok(Token::with_id(number("token seq", seq)?, id))
}

/// The record in `fields` (an `HGETALL` reply), or `None` for an empty reply (no such key).
pub(crate) fn record(fields: &Fields) -> Result<Option<Record>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let state = text(fields, "st")?;
    let state = RecordState::parse(state)
        .ok_or_else(|| StoreError::corrupt(format!("redis record: state {state:?}")))?;
    let outcome = match fields.get("ob") {
        Some(body) => Some(outcome(text(fields, "os")?, body, text(fields, "oc")?)?),
        None => None,
    };
    Ok(Some(Record {
        scope: Scope::new(text(fields, "s")?)
            .map_err(|e| StoreError::corrupt(format!("redis record: scope: {e}")))?,
        key: IdempotencyKey::new(text(fields, "k")?)
            .map_err(|e| StoreError::corrupt(format!("redis record: key: {e}")))?,
        fingerprint: Fingerprint::parse(text(fields, "fp")?)
            .map_err(|e| StoreError::corrupt(format!("redis record: fingerprint: {e}")))?,
        state,
        token: token(text(fields, "seq")?, text(fields, "tid")?)?,
        attempt: number("attempt", text(fields, "att")?)?,
        lease_until: ts(fields, "lu")?,
        outcome,
        created_at: ts(fields, "ca")?,
        updated_at: ts(fields, "ua")?,
        expires_at: ts(fields, "ea")?,
    }))
}
