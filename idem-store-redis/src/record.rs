//! Reading a record hash back, and the answers of the scripts, through the columns of
//! [`idem_core::record::RawRecord`]: Redis keeps every field as text, numbers in decimal.

use std::collections::HashMap;

use idem_core::record::{RawRecord, integer_from_column, integer_from_text, outcome_from_columns};
use idem_core::{Outcome, Record, StoreError};

pub(crate) type Fields = HashMap<String, Vec<u8>>;

/// Bytes Redis returned, as text.
pub(crate) fn utf8(what: &str, bytes: &[u8]) -> Result<String, StoreError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|e| StoreError::corrupt_with(format!("redis: {what} is not UTF-8"), e))
}

fn optional_text(fields: &Fields, name: &str) -> Result<Option<String>, StoreError> {
    fields.get(name).map(|bytes| utf8(name, bytes)).transpose()
}

fn text(fields: &Fields, name: &str) -> Result<String, StoreError> {
    optional_text(fields, name)?
        .ok_or_else(|| StoreError::corrupt(format!("redis record: field {name} is missing")))
}

fn int(fields: &Fields, name: &str) -> Result<i64, StoreError> {
    integer_from_text(name, &text(fields, name)?)
}

/// A number from a script's answer.
pub(crate) fn number<T: TryFrom<i64, Error = std::num::TryFromIntError>>(
    what: &str,
    s: &str,
) -> Result<T, StoreError> {
    integer_from_column(what, integer_from_text(what, s)?)
}

/// An outcome from its stored parts.
pub(crate) fn outcome(status: &str, body: &[u8], class: &str) -> Result<Outcome, StoreError> {
    let status = integer_from_text("outcome_status", status)?;
    let body = utf8("outcome_body", body)?;
    outcome_from_columns(Some(status), Some(body), Some(class))?
        .ok_or_else(|| StoreError::corrupt("redis: outcome missing"))
}

/// The record in `fields` (an `HGETALL` reply), or `None` for an empty reply (no such key).
pub(crate) fn record(fields: &Fields) -> Result<Option<Record>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    let outcome_status = optional_text(fields, "os")?
        .map(|s| integer_from_text("outcome_status", &s))
        .transpose()?;
    RawRecord {
        scope: text(fields, "s")?,
        key: text(fields, "k")?,
        fingerprint: text(fields, "fp")?,
        state: text(fields, "st")?,
        token_seq: int(fields, "seq")?,
        token_id: text(fields, "tid")?,
        attempt: int(fields, "att")?,
        lease_until: int(fields, "lu")?,
        outcome_status,
        outcome_body: optional_text(fields, "ob")?,
        outcome_class: optional_text(fields, "oc")?,
        created_at: int(fields, "ca")?,
        updated_at: int(fields, "ua")?,
        expires_at: int(fields, "ea")?,
    }
    .into_record()
    .map(Some)
}
