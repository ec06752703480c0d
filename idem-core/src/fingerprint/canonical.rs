//! The canonical JSON a fingerprint hashes (RFC 8785), written straight into its sink.

use std::cmp::Ordering;

use sha2::{Digest, Sha256};

use super::FingerprintError;

/// The canonical JSON text of `value` that [`Fingerprint::of`](super::Fingerprint::of) hashes: RFC
/// 8785 (JCS), except that an integer a double cannot hold exactly keeps its exact decimal digits
/// (see [`Fingerprint`](super::Fingerprint)).
pub fn canonical_json(value: &serde_json::Value) -> Result<String, FingerprintError> {
    let mut out = Vec::new();
    write_canonical(value, &mut out)?;
    Ok(String::from_utf8(out).expect("canonical JSON is written from UTF-8 text only"))
}

/// Where canonical text goes: a buffer ([`canonical_json`]) or straight into the hash
/// ([`Fingerprint::of_value`](super::Fingerprint::of_value)), so a fingerprint builds no
/// intermediate text.
pub(super) trait Sink {
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
pub(super) fn write_canonical<S: Sink>(
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
pub(super) fn write_string<S: Sink>(s: &str, out: &mut S) {
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
pub(super) fn utf16_cmp(a: &str, b: &str) -> Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    match x.iter().zip(y).position(|(p, q)| p != q) {
        None => x.len().cmp(&y.len()),
        // Both are lead bytes (continuation bytes are below 0xC0) at the same offset after an
        // equal prefix, so `i` is a character boundary in both.
        Some(i) if x[i] >= 0xEE && y[i] >= 0xEE => a[i..].encode_utf16().cmp(b[i..].encode_utf16()),
        Some(i) => x[i].cmp(&y[i]),
    }
}
