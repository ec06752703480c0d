//! Reading the `Idempotency-Key` header.

use http::{HeaderMap, HeaderValue};
use idem_core::IdempotencyKey;

use crate::Problem;

/// The header that carries the key ([contract §5](idem_core::contract#http); IETF draft "The
/// Idempotency-Key HTTP Header Field").
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Reads the key from `headers`: the IETF draft's structured-field string (`"abc"`, with `\"` and
/// `\\` escapes) or a bare token (`abc`), then validates it ([contract
/// §4](idem_core::contract#refusals)).
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

/// The `Idempotency-Key` header value for `key`: always the IETF draft's structured-field string
/// (`"wf-1:step-2"`, with `\"` and `\\` escaped), which [`read_key`] reads back as exactly `key`.
///
/// Send this, not the bare key: a key is any visible ASCII, and a bare key that starts with `"`
/// would be read as a quoted string (`"abc"` as `abc`, another record; `"a` refused).
///
/// ```
/// use http::HeaderMap;
/// use idem_core::IdempotencyKey;
/// use idem_http::{IDEMPOTENCY_KEY, key_header, read_key};
/// let key = IdempotencyKey::new(r#""quoted"\key"#).unwrap();
/// assert_eq!(key_header(&key), r#""\"quoted\"\\key""#);
/// let mut h = HeaderMap::new();
/// h.insert(IDEMPOTENCY_KEY, key_header(&key));
/// assert_eq!(read_key(&h), Ok(key));
/// ```
pub fn key_header(key: &IdempotencyKey) -> HeaderValue {
    let mut text = String::with_capacity(key.as_str().len() + 2);
    text.push('"');
    for c in key.as_str().chars() {
        if matches!(c, '"' | '\\') {
            text.push('\\');
        }
        text.push(c);
    }
    text.push('"');
    HeaderValue::try_from(text).expect("a quoted key of visible ASCII is a valid header value")
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
    fn every_key_round_trips_through_key_header() {
        // Found with the fuzz target `http_key` (its round-trip property): the client sent keys
        // bare, so a key starting with '"' was read as a quoted string: `"abc"` became `abc`
        // (another key, another record) and `"a` was refused.
        for text in ["\"abc\"", "\"a", "a\"b", "\\", "\"\\\"", "plain-key", "~"] {
            let key = IdempotencyKey::new(text).unwrap();
            let value = key_header(&key);
            assert!(value.to_str().unwrap().starts_with('"'));
            let mut h = HeaderMap::new();
            h.insert(IDEMPOTENCY_KEY, value);
            assert_eq!(read_key(&h), Ok(key), "{text}");
        }
        // The bare form of such a key is not the key: why the client must quote.
        assert_eq!(read(&["\"abc\""]).unwrap().as_str(), "abc");
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
