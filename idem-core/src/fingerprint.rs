//! Request fingerprints: SHA-256 over the RFC 8785 canonical form of the request.

use std::cmp::Ordering;
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

/// The canonical JSON text of `value` that [`Fingerprint::of`] hashes: RFC 8785 (JCS), except
/// that an integer a double cannot hold exactly keeps its exact decimal digits (see
/// [`Fingerprint`]).
pub fn canonical_json(value: &serde_json::Value) -> Result<String, FingerprintError> {
    let mut out = Vec::new();
    write_canonical(value, &mut out)?;
    Ok(String::from_utf8(out).expect("canonical JSON is written from UTF-8 text only"))
}

/// Where canonical text goes: a buffer ([`canonical_json`]) or straight into the hash
/// ([`Fingerprint::of_value`]), so a fingerprint builds no intermediate text.
trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

impl Sink for Sha256 {
    fn put(&mut self, bytes: &[u8]) {
        self.update(bytes);
    }
}

/// A [`Sink`] as an `io::Write`, for the serialisers that write strings and doubles.
struct Writer<'a, S>(&'a mut S);

impl<S: Sink> std::io::Write for Writer<'_, S> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.put(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// JCS of one value, written into `out`.
///
/// What is written is exactly what `serde_json_canonicalizer` writes for the value (member order
/// by UTF-16 code units, ECMAScript number text, JCS string escapes), except for integers beyond
/// a double's precision; the parts are written here without building a text per leaf:
/// - strings with serde_json's own escaper, which escapes exactly what RFC 8785 §3.2.2.2 does
///   (`"`, `\`, and U+0000–U+001F as `\b \f \n \r \t` or `\u00xx` in lower case; nothing
///   else, not `/` nor DEL) and is the escaper `serde_json_canonicalizer` runs too;
/// - integers of magnitude up to 2^53 as their decimal digits (what ECMAScript writes for them);
/// - every other number through `serde_json_canonicalizer`, as before.
fn write_canonical<S: Sink>(
    value: &serde_json::Value,
    out: &mut S,
) -> Result<(), FingerprintError> {
    use serde_json::Value;
    match value {
        Value::Null => out.put(b"null"),
        Value::Bool(true) => out.put(b"true"),
        Value::Bool(false) => out.put(b"false"),
        Value::String(s) => write_string(s, out),
        Value::Number(n) => write_number(n, value, out)?,
        Value::Array(items) => {
            out.put(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.put(b",");
                }
                write_canonical(item, out)?;
            }
            out.put(b"]");
        }
        Value::Object(members) => {
            // RFC 8785 §3.2.3: members sorted by their names' UTF-16 code units. serde_json's map
            // (a BTreeMap by UTF-8 bytes) is nearly always in that order already.
            out.put(b"{");
            if members
                .keys()
                .is_sorted_by(|a, b| utf16_cmp(a, b) != Ordering::Greater)
            {
                write_members(members.iter(), out)?;
            } else {
                let mut sorted: Vec<_> = members.iter().collect();
                sorted.sort_by(|(a, _), (b, _)| utf16_cmp(a, b));
                write_members(sorted.into_iter(), out)?;
            }
            out.put(b"}");
        }
    }
    Ok(())
}

fn write_members<'a, S: Sink>(
    members: impl Iterator<Item = (&'a String, &'a serde_json::Value)>,
    out: &mut S,
) -> Result<(), FingerprintError> {
    for (i, (name, member)) in members.enumerate() {
        if i > 0 {
            out.put(b",");
        }
        write_string(name, out);
        out.put(b":");
        write_canonical(member, out)?;
    }
    Ok(())
}

/// A JSON string as JCS writes it (see [`write_canonical`]).
fn write_string<S: Sink>(s: &str, out: &mut S) {
    serde_json::to_writer(Writer(out), s).expect("a string always serialises");
}

/// A number: integers that fit 64 bits here, every other number as JCS writes it.
fn write_number<S: Sink>(
    n: &serde_json::Number,
    value: &serde_json::Value,
    out: &mut S,
) -> Result<(), FingerprintError> {
    let integer = match (n.as_u64(), n.as_i64()) {
        (Some(v), _) => Some(i128::from(v)),
        (None, Some(v)) => Some(i128::from(v)),
        (None, None) => None,
    };
    match integer {
        // Doubles hold every integer of magnitude up to 2^53, and ECMAScript writes those as
        // their digits; beyond it a double holds only some (a round trip through f64, exact in
        // i128, tells which): the others keep their exact digits, the exception to JCS.
        Some(v) if v.unsigned_abs() <= 1 << 53 || (v as f64) as i128 != v => {
            write_integer(v, out);
            Ok(())
        }
        _ => serde_json_canonicalizer::to_writer(value, &mut Writer(out))
            .map_err(FingerprintError::Canonicalize),
    }
}

/// The decimal digits of `v` (which fits 64 bits, signed or not).
fn write_integer<S: Sink>(v: i128, out: &mut S) {
    let mut digits = [0u8; 40];
    let mut at = digits.len();
    let mut rest = v.unsigned_abs();
    loop {
        at -= 1;
        digits[at] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    if v < 0 {
        at -= 1;
        digits[at] = b'-';
    }
    out.put(&digits[at..]);
}

/// Compares two strings by their UTF-16 code units (RFC 8785 §3.2.3) without transcoding them:
/// UTF-8 byte order is code point order, which is UTF-16 order except between a supplementary
/// character (UTF-8 lead byte `F0`–`F4`) and one of U+E000–U+FFFF (lead `EE` or `EF`). So the
/// first differing byte decides, unless both are such lead bytes.
fn utf16_cmp(a: &str, b: &str) -> Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        // Both are lead bytes (continuation bytes are below 0xC0) at the same offset after an
        // equal prefix, so `i` is a character boundary in both.
        Some(i) if x[i] >= 0xEE && y[i] >= 0xEE => a[i..].encode_utf16().cmp(b[i..].encode_utf16()),
        Some(i) => x[i].cmp(&y[i]),
    }
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

    fn canonical_request(operation: &str, arguments: &Value) -> Result<String, FingerprintError> {
        canonical_json(&json!({ "arguments": arguments, "operation": operation }))
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

    fn fp(args: Value) -> Fingerprint {
        Fingerprint::of("charge", &args).unwrap()
    }

    #[test]
    fn integers_beyond_a_doubles_precision_keep_their_digits() {
        let two53 = 1u64 << 53;
        let pairs: [(Value, Value); 6] = [
            (json!({"id": two53}), json!({"id": two53 + 1})),
            (json!({"id": i64::MAX}), json!({"id": i64::MAX - 1})),
            (json!({"id": u64::MAX}), json!({"id": u64::MAX - 1})),
            (
                json!({"id": -(two53 as i64)}),
                json!({"id": -(two53 as i64) - 1}),
            ),
            (json!({"id": i64::MIN}), json!({"id": i64::MIN + 1})),
            (json!([two53 + 1]), json!([two53])),
        ];
        for (a, b) in pairs {
            // Under plain JCS (doubles) each pair collides: that was the bug.
            assert_eq!(
                serde_json_canonicalizer::to_string(&a).unwrap(),
                serde_json_canonicalizer::to_string(&b).unwrap()
            );
            assert_ne!(
                fp(a.clone()),
                fp(b.clone()),
                "{a} and {b} share a fingerprint"
            );
        }
        assert_eq!(
            canonical_json(
                &json!({"b": u64::MAX, "a": [9007199254740993u64, i64::MAX, -9007199254740993i64]})
            )
            .unwrap(),
            r#"{"a":[9007199254740993,9223372036854775807,-9007199254740993],"b":18446744073709551615}"#
        );
        // Parsed from text, as a request body is.
        let text = |t: &str| fp(serde_json::from_str(t).unwrap());
        assert_ne!(
            text(r#"{"id":9007199254740993}"#),
            text(r#"{"id":9007199254740992}"#)
        );
        // Integers a double holds exactly are written as JCS writes them.
        assert_eq!(
            text(r#"{"id":9007199254740992}"#),
            text(r#"{"id":9007199254740992.0}"#)
        );
        assert_eq!(
            text(r#"{"id":-9223372036854775808}"#),
            fp(json!({"id": i64::MIN}))
        );
        assert_eq!(
            text(r#"{"id":4611686018427387904}"#),
            text(r#"{"id":4.611686018427387904e18}"#)
        );
    }

    #[test]
    fn one_and_one_point_zero_and_key_order_stay_the_same_request() {
        let a = fp(serde_json::from_str(r#"{"amount": 1, "n": {"y": 2, "x": -0.0}}"#).unwrap());
        let b = fp(serde_json::from_str(r#"{"n": {"x": 0, "y": 2.0}, "amount": 1.0}"#).unwrap());
        assert_eq!(a, b);
        assert_eq!(fp(json!({"amount": 1e2})), fp(json!({"amount": 100})));
    }

    /// Fingerprints made before the exact-integer rule: records stored with them must still match.
    #[test]
    fn fingerprints_of_ordinary_requests_are_unchanged() {
        let pinned = [
            (
                "create_ticket",
                json!({"title": "Printer on fire", "account_id": "A-7"}),
                "825b18a527e4da5c35ff0b4552bb88af6a1bad688e8666988fb447da35d29a57",
            ),
            (
                "charge",
                json!({"amount": 500, "currency": "EUR", "ids": [1, 2.5, -3, 9007199254740992u64], "nested": {"b": null, "a": true}}),
                "6756d801edec345f4501a677fc375938c8c3e693c8e17d43a71e3acc582c2d7a",
            ),
            (
                "POST /tools/charge",
                json!({"amount": 1.0e21, "tiny": 1e-7, "neg": -0.0, "unicode": "é😀"}),
                "3c049c8ec14307279043f9905650d56e32e3dd1841fb4b63b795b676d9df40e3",
            ),
            (
                "op",
                json!([]),
                "c2f35b531bf5c06b9b8e7f76135e7ee8f7d7eb905a9377e73b15d4ab67327898",
            ),
            (
                "op",
                json!(i64::MIN),
                "cdbc439e4b663006938ef6e3ebb1ea749186c016f1b34b2a937aa83672ef8bf1",
            ),
        ];
        for (op, args, hex) in pinned {
            assert_eq!(
                Fingerprint::of(op, &args).unwrap().as_str(),
                hex,
                "{op} {args}"
            );
        }
    }

    #[test]
    fn the_hash_is_of_the_canonical_request_text() {
        for (op, args) in [
            ("op", json!({"z": 1, "a": true})),
            (
                "POST /x?a=%22",
                json!([{"\u{e000}": 1, "😀": [2.5, null, "\u{1}"]}]),
            ),
            ("\"quoted\" \\ op", json!(u64::MAX)),
        ] {
            let text = canonical_request(op, &args).unwrap();
            assert_eq!(
                Fingerprint::of_value(op, &args).unwrap(),
                Fingerprint::of_bytes(text.as_bytes())
            );
        }
    }

    proptest::proptest! {
        /// The byte-wise comparison orders names as their UTF-16 code units do.
        #[test]
        fn utf16_order(
            a in "[a\u{7f}\u{80}é\u{d7ff}\u{e000}\u{fb33}\u{ffff}😀\u{10000}\u{10ffff}]{0,4}",
            b in "[a\u{7f}\u{80}é\u{d7ff}\u{e000}\u{fb33}\u{ffff}😀\u{10000}\u{10ffff}]{0,4}",
            prefix in "[aé😀\u{ffff}]{0,2}",
        ) {
            let (a, b) = (format!("{prefix}{a}"), format!("{prefix}{b}"));
            proptest::prop_assert_eq!(utf16_cmp(&a, &b), a.encode_utf16().cmp(b.encode_utf16()));
        }

        /// Away from the exact-integer rule, the canonical text is RFC 8785's, byte for byte.
        #[test]
        fn agrees_with_jcs_where_doubles_are_exact(
            ints in proptest::collection::vec(-(1i64 << 53)..=(1i64 << 53), 0..6),
            floats in proptest::collection::vec(proptest::num::f64::NORMAL, 0..6),
            names in proptest::collection::vec("[a-zé😀\\\"]{0,4}", 0..6),
        ) {
            let mut obj = serde_json::Map::new();
            for (i, name) in names.iter().enumerate() {
                obj.insert(name.clone(), json!([ints.get(i), floats.get(i), name]));
            }
            let v = json!({"o": obj, "i": ints, "f": floats});
            proptest::prop_assert_eq!(canonical_json(&v).unwrap(), serde_json_canonicalizer::to_string(&v).unwrap());
        }
    }

    #[test]
    fn parse_round_trips_and_refuses_garbage() {
        let f = Fingerprint::of_bytes(b"x");
        assert_eq!(Fingerprint::parse(f.as_str()).unwrap(), f);
        assert!(Fingerprint::parse("ABC").is_err());
        assert!(Fingerprint::parse(&"G".repeat(64)).is_err());
    }
}
