//! Request fingerprints: SHA-256 over the RFC 8785 canonical form of the request.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

mod canonical;

pub use canonical::canonical_json;
use canonical::{write_canonical, write_string};

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
/// The canonical form hashed is the JCS text of `{"arguments": <args>, "operation": <name>}`,
/// with one deliberate departure from RFC 8785 for numbers ([contract §1](crate::contract#words)):
///
/// - JCS reads every number as an IEEE-754 double, so two 64-bit integers that differ only
///   beyond ±2^53 (ids sent as JSON numbers) would round to the same double and the second
///   request would replay the first. Here an integer whose value a double cannot hold exactly
///   (e.g. `9007199254740993`, `i64::MAX`, `u64::MAX`) is written with its exact decimal digits
///   instead. Every other number is written exactly as JCS writes it, so fingerprints of
///   ordinary requests (and records stored before this rule) are unchanged, and `1.0` and `1`
///   are still the same request.
/// - The exact digits are those `serde_json` parsed: integers that fit `i64` or `u64`. A number
///   written with a fraction or an exponent (`9007199254740993.0`, `1e30`) is parsed as a double
///   and canonicalised as one, as JCS does (so `9007199254740993.0` is not the same request as
///   `9007199254740993`). This needs no `serde_json` feature (in particular not
///   `arbitrary_precision`, which would change every crate's `serde_json` in the graph).
///
/// ```
/// use idem_core::Fingerprint;
/// use serde_json::json;
/// let a = Fingerprint::of("create_ticket", &json!({"title": "x", "account_id": 7})).unwrap();
/// let b: serde_json::Value = serde_json::from_str(r#"{ "account_id":7.0,  "title":"x" }"#).unwrap();
/// assert_eq!(a, Fingerprint::of("create_ticket", &b).unwrap());
/// assert_ne!(a, Fingerprint::of("delete_ticket", &b).unwrap());
/// // 2^53 and 2^53 + 1 are the same double, but not the same request.
/// assert_ne!(
///     Fingerprint::of("charge", &json!({"id": 9007199254740992u64})).unwrap(),
///     Fingerprint::of("charge", &json!({"id": 9007199254740993u64})).unwrap(),
/// );
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize)]
#[serde(transparent)]
pub struct Fingerprint(String);

impl Fingerprint {
    /// Fingerprints the operation `operation` called with `arguments`: a `serde_json::Value`, or
    /// any value that serialises (your request struct), which is fingerprinted as the JSON it
    /// serialises to. A value that cannot be serialised as JSON (a map with non-string keys, a
    /// float that is not finite) is [`FingerprintError::Canonicalize`].
    ///
    /// ```
    /// use idem_core::Fingerprint;
    /// #[derive(serde::Serialize)]
    /// struct Charge { account: String, cents: u64 }
    /// let typed = Fingerprint::of("charge", &Charge { account: "A-7".into(), cents: 500 }).unwrap();
    /// let value = Fingerprint::of("charge", &serde_json::json!({"cents": 500, "account": "A-7"})).unwrap();
    /// assert_eq!(typed, value);
    /// ```
    pub fn of<A: Serialize + ?Sized>(
        operation: &str,
        arguments: &A,
    ) -> Result<Self, FingerprintError> {
        let arguments = serde_json::to_value(arguments).map_err(FingerprintError::Canonicalize)?;
        Self::of_value(operation, &arguments)
    }

    /// [`Fingerprint::of`] for arguments that are already a `serde_json::Value` (a parsed
    /// request body): the same fingerprint, without first copying the value.
    pub fn of_value(
        operation: &str,
        arguments: &serde_json::Value,
    ) -> Result<Self, FingerprintError> {
        // The JCS text of `{"arguments": <args>, "operation": <name>}`, written straight into
        // the hash.
        let mut hasher = Sha256::new();
        hasher.update(br#"{"arguments":"#);
        write_canonical(arguments, &mut hasher)?;
        hasher.update(br#","operation":"#);
        write_string(operation, &mut hasher);
        hasher.update(b"}");
        Ok(Self::of_digest(&hasher.finalize()))
    }

    /// SHA-256 of bytes that the caller has already put in a canonical form.
    pub fn of_bytes(bytes: &[u8]) -> Self {
        Self::of_digest(&Sha256::digest(bytes))
    }

    fn of_digest(digest: &[u8]) -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let mut hex = String::with_capacity(2 * digest.len());
        for &b in digest {
            hex.push(char::from(HEX[usize::from(b >> 4)]));
            hex.push(char::from(HEX[usize::from(b & 0xf)]));
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

#[cfg(test)]
mod tests;
