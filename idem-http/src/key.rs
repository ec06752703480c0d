//! Reading the `Idempotency-Key` header.

use http::HeaderMap;
use idem_core::IdempotencyKey;

use crate::Problem;

/// The header that carries the key (SPEC §5; IETF draft "The Idempotency-Key HTTP Header Field").
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Reads the key from `headers`: the IETF draft's structured-field string (`"abc"`, with `\"` and
/// `\\` escapes) or a bare token (`abc`), then validates it (SPEC §4).
///
/// ```
/// use http::HeaderMap;
/// use idem_http::{Problem, read_key};
/// let mut h = HeaderMap::new();
/// assert_eq!(read_key(&h), Err(Problem::KeyRequired));
/// h.insert("idempotency-key", "\"wf-1:step-2\"".parse().unwrap());
/// assert_eq!(read_key(&h).unwrap().as_str(), "wf-1:step-2");
/// h.insert("idempotency-key", "wf-1:step-2".parse().unwrap());
/// assert_eq!(read_key(&h).unwrap().as_str(), "wf-1:step-2");
/// ```
pub fn read_key(headers: &HeaderMap) -> Result<IdempotencyKey, Problem> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Err(Problem::KeyRequired);
    };
    if values.next().is_some() {
        return Err(Problem::InvalidKey(
            "more than one Idempotency-Key header: send exactly one".into(),
        ));
    }
    let text = value.to_str().map_err(|_| {
        Problem::InvalidKey("invalid idempotency key: outside visible ASCII ('!' to '~')".into())
    })?;
    let text = text.trim_matches(' ');
    let key = match text.strip_prefix('"') {
        Some(rest) => unquote(rest)?,
        None => text.to_owned(),
    };
    IdempotencyKey::new(key).map_err(|e| Problem::InvalidKey(e.to_string()))
}

/// The inside of a structured-field string whose opening quote is already consumed.
fn unquote(rest: &str) -> Result<String, Problem> {
    let bad = |why: &str| Problem::InvalidKey(format!("invalid idempotency key: {why}"));
    let mut out = String::with_capacity(rest.len());
    let mut chars = rest.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                return if chars.next().is_none() {
                    Ok(out)
                } else {
                    Err(bad("text after the closing quote"))
                };
            }
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => return Err(bad("a quoted key may only escape '\"' and '\\\\'")),
            },
            c => out.push(c),
        }
    }
    Err(bad("the quoted string is not closed"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(values: &[&str]) -> Result<IdempotencyKey, Problem> {
        let mut h = HeaderMap::new();
        for v in values {
            h.append(IDEMPOTENCY_KEY, v.parse().unwrap());
        }
        read_key(&h)
    }

    #[test]
    fn structured_field_strings_and_bare_tokens() {
        assert_eq!(read(&["\"a\\\"b\\\\c\""]).unwrap().as_str(), "a\"b\\c");
        assert_eq!(read(&["abc"]).unwrap().as_str(), "abc");
    }

    #[test]
    fn refusals() {
        assert_eq!(read(&[]), Err(Problem::KeyRequired));
        assert!(
            matches!(read(&["a", "b"]), Err(Problem::InvalidKey(m)) if m.contains("more than one"))
        );
        assert!(
            matches!(read(&["\"abc"]), Err(Problem::InvalidKey(m)) if m.contains("not closed"))
        );
        assert!(
            matches!(read(&["\"a\"b"]), Err(Problem::InvalidKey(m)) if m.contains("after the closing"))
        );
        assert!(
            matches!(read(&["\"a\\nb\""]), Err(Problem::InvalidKey(m)) if m.contains("escape"))
        );
        assert!(matches!(read(&["\"\""]), Err(Problem::InvalidKey(m)) if m.contains("empty")));
        assert!(
            matches!(read(&["\"a b\""]), Err(Problem::InvalidKey(m)) if m.contains("visible ASCII"))
        );
        let long = "k".repeat(256);
        assert!(matches!(read(&[long.as_str()]), Err(Problem::InvalidKey(m)) if m.contains("255")));
    }
}
