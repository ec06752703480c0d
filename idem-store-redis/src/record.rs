//! Reading a record hash back, and the answers of the scripts, through the columns of
//! [`idem_core::store::columns::RawRecord`]: Redis keeps every field as text, numbers in decimal.
//!
//! Two layouts are read (see `scripts.rs`): format 2, the metadata packed in field `m` and the
//! outcome in `o` (and the checkpoints in `c`), which every script writes; and format 1, one field
//! per column, which earlier versions wrote and which a record keeps until its next write.

use std::collections::HashMap;

use idem_core::store::columns::{
    RawRecord, integer_from_column, integer_from_text, outcome_from_columns,
};
use idem_core::{Outcome, OutcomeClass, Record, StoreError};

pub(crate) type Fields = HashMap<String, Vec<u8>>;

/// Bytes Redis returned, as text.
pub(crate) fn utf8(what: &str, bytes: &[u8]) -> Result<String, StoreError> {
    std::str::from_utf8(bytes)
        .map(str::to_owned)
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

/// The outcome's class as stored in format 2.
pub(crate) fn class_char(class: OutcomeClass) -> u8 {
    match class {
        OutcomeClass::Definitive => b'd',
        OutcomeClass::Retryable => b'r',
    }
}

/// Length of the header format 2 writes before an outcome: state, fingerprint, expires_at.
const OUTCOME_HEADER: usize = 1 + 64 + 20;

/// The parts of a format-2 outcome (`status|class|body`, behind its header when it has one), as
/// the columns hold them.
fn outcome_parts(mut packed: Vec<u8>) -> Result<(i64, &'static str, String), StoreError> {
    let bad = || StoreError::corrupt("redis record: the outcome is malformed");
    // An outcome written before the header begins with its status's digit.
    if matches!(packed.first(), Some(b'c' | b'f')) {
        if packed.len() < OUTCOME_HEADER {
            return Err(bad());
        }
        packed.drain(..OUTCOME_HEADER);
    }
    let bar = packed.iter().position(|&b| b == b'|').ok_or_else(bad)?;
    let status = std::str::from_utf8(&packed[..bar]).map_err(|_| bad())?;
    let status = integer_from_text("outcome_status", status)?;
    let class = match packed.get(bar + 1..bar + 3) {
        Some(b"d|") => OutcomeClass::Definitive.as_str(),
        Some(b"r|") => OutcomeClass::Retryable.as_str(),
        _ => return Err(bad()),
    };
    let mut body = packed;
    body.drain(..bar + 3);
    let body = String::from_utf8(body)
        .map_err(|e| StoreError::corrupt_with("redis: outcome_body is not UTF-8", e))?;
    Ok((status, class, body))
}

/// The outcome a script returned (`status|class|body`), taking the reply's bytes.
pub(crate) fn outcome(packed: Vec<u8>) -> Result<Outcome, StoreError> {
    let (status, class, body) = outcome_parts(packed)?;
    outcome_from_columns(Some(status), Some(body), Some(class))?
        .ok_or_else(|| StoreError::corrupt("redis: outcome missing"))
}

/// The record in `fields` (an `HGETALL` reply), or `None` for an empty reply (no such key).
/// `names` gives its scope and key, which format 2 keeps only in the key name.
pub(crate) fn record(
    fields: Fields,
    names: impl FnOnce() -> Result<(String, String), StoreError>,
) -> Result<Option<Record>, StoreError> {
    if fields.is_empty() {
        return Ok(None);
    }
    if fields.contains_key("m") {
        return record_v2(fields, names).map(Some);
    }
    let outcome_status = optional_text(&fields, "os")?
        .map(|s| integer_from_text("outcome_status", &s))
        .transpose()?;
    RawRecord {
        scope: text(&fields, "s")?,
        key: text(&fields, "k")?,
        fingerprint: text(&fields, "fp")?,
        state: text(&fields, "st")?,
        token_seq: int(&fields, "seq")?,
        token_id: text(&fields, "tid")?,
        attempt: int(&fields, "att")?,
        lease_until: int(&fields, "lu")?,
        outcome_status,
        outcome_body: optional_text(&fields, "ob")?,
        outcome_class: optional_text(&fields, "oc")?,
        created_at: int(&fields, "ca")?,
        updated_at: int(&fields, "ua")?,
        expires_at: int(&fields, "ea")?,
        checkpoints: optional_text(&fields, "c")?,
    }
    .into_record()
    .map(Some)
}

fn record_v2(
    mut fields: Fields,
    names: impl FnOnce() -> Result<(String, String), StoreError>,
) -> Result<Record, StoreError> {
    let bad = || StoreError::corrupt("redis record: the metadata is malformed");
    let m = fields.remove("m").ok_or_else(bad)?;
    let m = std::str::from_utf8(&m).map_err(|_| bad())?;
    if m.len() < 131 || !m.is_ascii() {
        return Err(bad());
    }
    let state = match &m[..1] {
        "p" => "processing",
        "c" => "completed",
        "f" => "failed_retryable",
        _ => return Err(bad()),
    };
    let mut numbers = m[130..].split('|');
    let mut next = |what: &str| -> Result<i64, StoreError> {
        integer_from_text(what, numbers.next().ok_or_else(bad)?)
    };
    let token_seq = next("token_seq")?;
    let attempt = next("attempt")?;
    let lease_until = next("lease_until")?;
    let created_at = next("created_at")?;
    let expires_at = next("expires_at")?;
    let updated_at = next("updated_at")?;
    if numbers.next().is_some() {
        return Err(bad());
    }
    let (outcome_status, outcome_class, outcome_body) = match fields.remove("o") {
        Some(o) => {
            let (status, class, body) = outcome_parts(o)?;
            (Some(status), Some(class.to_owned()), Some(body))
        }
        None => (None, None, None),
    };
    let checkpoints = optional_text(&fields, "c")?;
    let (scope, key) = names()?;
    RawRecord {
        scope,
        key,
        fingerprint: m[2..66].to_owned(),
        state: state.to_owned(),
        token_seq,
        token_id: m[66..98].to_owned(),
        attempt,
        lease_until,
        outcome_status,
        outcome_body,
        outcome_class,
        created_at,
        updated_at,
        expires_at,
        checkpoints,
    }
    .into_record()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names() -> Result<(String, String), StoreError> {
        Ok(("scope".into(), "key".into()))
    }

    /// A valid format-2 metadata field: 130 fixed characters, then the six numbers.
    fn meta() -> String {
        format!(
            "pn{}{}{}1|1|1700000030000|1700000000000|1700086400000|1700000000000",
            "a".repeat(64),
            "b".repeat(32),
            "c".repeat(32)
        )
    }

    fn v2(m: &str, o: Option<&[u8]>) -> Fields {
        let mut fields = Fields::new();
        fields.insert("m".into(), m.as_bytes().to_vec());
        if let Some(o) = o {
            fields.insert("o".into(), o.to_vec());
        }
        fields
    }

    fn corrupt(result: Result<Option<Record>, StoreError>) -> String {
        match result {
            Err(e) => {
                assert_eq!(e.kind(), "corrupt", "{e}");
                e.to_string()
            }
            Ok(r) => panic!("read a damaged record as {r:?}"),
        }
    }

    #[test]
    fn a_well_formed_record_reads_back() {
        let header = format!("c{}{:020}", "a".repeat(64), 1_700_086_400_000_u64);
        let o = format!("{header}201|d|{{\"ticket\":\"T-1\"}}");
        let record = record(v2(&meta(), Some(o.as_bytes())), names)
            .unwrap()
            .unwrap();
        assert_eq!(record.token.seq, 1);
        assert_eq!(record.outcome.unwrap().status(), 201);
    }

    /// Damaged fields are a corrupt-record error, never a panic or a guess: metadata shorter
    /// than its fixed part, metadata with a character outside ASCII (every field of it is
    /// ASCII, and it is cut at fixed byte offsets), an outcome whose header is cut short.
    #[test]
    fn damaged_fields_are_a_corrupt_record_error() {
        let short = &meta()[..120];
        assert!(corrupt(record(v2(short, None), names)).contains("metadata"));
        let wide = meta().replacen('a', "é", 1);
        assert!(wide.len() > 131);
        assert!(corrupt(record(v2(&wide, None), names)).contains("metadata"));
        let cut = format!("c{}", "a".repeat(20));
        assert!(corrupt(record(v2(&meta(), Some(cut.as_bytes())), names)).contains("outcome"));
        assert!(outcome(b"c1".to_vec()).is_err());
    }
}
