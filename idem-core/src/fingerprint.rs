//! Request fingerprints: SHA-256 over the RFC 8785 canonical form of the request.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Why a fingerprint could not be made or parsed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FingerprintError {
    /// The arguments could not be canonicalised (e.g. a number that is not finite).
    #[error("request arguments cannot be canonicalised as JSON (RFC 8785): {0}")]
    Canonicalize(#[source] serde_json::Error),
    /// The text is not 64 lower-case hexadecimal digits.
    #[error("a fingerprint is 64 lower-case hexadecimal digits")]
    Malformed,
}

/// SHA-256 (lower-case hex) of the canonical form of a request: its operation name and its
/// arguments, canonicalised with RFC 8785 (JCS) so that key order and insignificant white space do
/// not change it.
///
/// The canonical form hashed is the JCS text of `{"arguments": <args>, "operation": <name>}`.
/// JCS reads every number as an IEEE-754 double, so integers beyond 2^53 that differ only past
/// that precision have the same fingerprint.
///
/// ```
/// use idem_core::Fingerprint;
/// use serde_json::json;
/// let a = Fingerprint::of("create_ticket", &json!({"title": "x", "account_id": 7})).unwrap();
/// let b: serde_json::Value = serde_json::from_str(r#"{ "account_id":7.0,  "title":"x" }"#).unwrap();
/// assert_eq!(a, Fingerprint::of("create_ticket", &b).unwrap());
/// assert_ne!(a, Fingerprint::of("delete_ticket", &b).unwrap());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Fingerprints the operation `operation` called with `arguments`.
    pub fn of(operation: &str, arguments: &serde_json::Value) -> Result<Self, FingerprintError> {
        let canonical = canonical_request(operation, arguments)?;
        Ok(Self::of_bytes(canonical.as_bytes()))
    }

    /// SHA-256 of bytes that the caller has already put in a canonical form.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        let digest = Sha256::digest(bytes);
        let mut hex = String::with_capacity(64);
        for b in digest {
            use std::fmt::Write;
            let _ = write!(hex, "{b:02x}");
        }
        Self(hex)
    }

    /// Parses a stored fingerprint (64 lower-case hex digits).
    pub fn parse(hex: &str) -> Result<Self, FingerprintError> {
        if hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            Ok(Self(hex.to_owned()))
        } else {
            Err(FingerprintError::Malformed)
        }
    }

    /// The 64 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The first 12 hex digits, for logs.
    pub fn short(&self) -> &str {
        &self.0[..12]
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Fingerprint {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// The RFC 8785 canonical JSON text of `value`.
pub fn canonical_json(value: &serde_json::Value) -> Result<String, FingerprintError> {
    serde_json_canonicalizer::to_string(value).map_err(FingerprintError::Canonicalize)
}

fn canonical_request(
    operation: &str,
    arguments: &serde_json::Value,
) -> Result<String, FingerprintError> {
    canonical_json(&serde_json::json!({ "arguments": arguments, "operation": operation }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn jcs(text: &str) -> String {
        canonical_json(&serde_json::from_str::<Value>(text).unwrap()).unwrap()
    }

    // RFC 8785 §3.2.2 and appendix examples.
    #[test]
    fn rfc8785_primitive_and_number_example() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        assert_eq!(
            jcs(input),
            r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
        );
    }

    #[test]
    fn rfc8785_property_sorting_by_utf16_code_units() {
        let input = r#"{
          "\u20ac": "Euro Sign",
          "\r": "Carriage Return",
          "\ufb33": "Hebrew Letter Dalet With Dagesh",
          "1": "One",
          "\ud83d\ude00": "Emoji: Grinning Face",
          "\u0080": "Control",
          "\u00f6": "Latin Small Letter O With Diaeresis"
        }"#;
        assert_eq!(
            jcs(input),
            "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
        );
    }

    #[test]
    fn rfc8785_number_serialization_samples() {
        // From RFC 8785 appendix B (IEEE-754 → ECMAScript text).
        assert_eq!(
            jcs("[1e21, 1e-7, -0.0, 1e20, 5e-324]"),
            "[1e+21,1e-7,0,100000000000000000000,5e-324]"
        );
    }

    #[test]
    fn key_order_and_whitespace_do_not_matter() {
        let a = Fingerprint::of("t", &json!({"a": 1, "b": [1, 2, {"c": "d"}]})).unwrap();
        let b: Value = serde_json::from_str("{\"b\":[1,2,{ \"c\" : \"d\" }],\n \"a\":1}").unwrap();
        assert_eq!(a, Fingerprint::of("t", &b).unwrap());
        assert_ne!(
            a,
            Fingerprint::of("t", &json!({"a": 2, "b": [1, 2, {"c": "d"}]})).unwrap()
        );
        assert_eq!(a.as_str().len(), 64);
        assert_eq!(a.short().len(), 12);
    }

    #[test]
    fn known_vector() {
        // sha256 of the empty string.
        assert_eq!(
            Fingerprint::of_bytes(b"").as_str(),
            "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(
            canonical_request("op", &json!({"z": 1, "a": true})).unwrap(),
            r#"{"arguments":{"a":true,"z":1},"operation":"op"}"#
        );
    }

    #[test]
    fn parse_round_trips_and_refuses_garbage() {
        let f = Fingerprint::of_bytes(b"x");
        assert_eq!(Fingerprint::parse(f.as_str()).unwrap(), f);
        assert!(Fingerprint::parse("ABC").is_err());
        assert!(Fingerprint::parse(&"G".repeat(64)).is_err());
    }
}
