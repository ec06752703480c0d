//! Where records live: key names, buckets and hash tags.
//!
//! A record for (scope, key) is the hash `<prefix>:{b<NN>}:r:<hex scope>:<hex key>`, where `NN`
//! is its bucket, `hash(scope, key) % BUCKETS`. Each bucket keeps its indexes under the same hash
//! tag, so a script that writes a record and its index entries touches one cluster slot:
//!
//! - the expiry index: one list per time slice of [`SLICE_MS`], `<prefix>:{b<NN>}:x:<slice>`
//!   (`slice = expires_at / SLICE_MS`), holding the members of the records that expire in it (an
//!   append is O(1) and does not grow with the index, where a sorted-set insert is O(log n) with
//!   a cache miss per level), and the sorted set `<prefix>:{b<NN>}:xs` of the slices that exist,
//!   scored by slice number;
//! - `<prefix>:{b<NN>}:lease`, the `processing` records scored by `lease_until` (a small set:
//!   only the claims in flight);
//! - `<prefix>:{b<NN>}:exp`, the expiry index of earlier versions (a sorted set scored by
//!   `expires_at`), no longer written, read by purge and list until it drains.
//!
//! Hex keeps the names injective: no `{`, `}` or `:` of a scope or key can reach the name's
//! structure.

use idem_core::RecordId;
#[cfg(test)]
use idem_core::{IdempotencyKey, Scope};

/// How many buckets records are spread over. Part of the stored format: every handle on the same
/// data must agree, so it is a constant, not a setting.
pub const BUCKETS: u16 = 64;

/// The width of one expiry slice, in milliseconds (2^16, about 65 s). Part of the stored format,
/// like [`BUCKETS`]. A purge visits every slice that has begun, so a slice's records that are
/// still live are looked at again by each purge until their slice has passed: narrow slices keep
/// that rework small, wide ones keep the lists few.
pub const SLICE_MS: u64 = 1 << 16;

/// The expiry slice of a record expiring at `expires_at` (ms).
pub(crate) fn slice_of(expires_at: u64) -> u64 {
    expires_at / SLICE_MS
}

/// FNV-1a, 64 bits: small, stable across versions and platforms (the bucket is part of the
/// stored format, so it must never change).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in *part {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

const DIGITS: &[u8; 16] = b"0123456789abcdef";

fn push_hex(out: &mut String, bytes: &[u8]) {
    for &b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0x0f)] as char);
    }
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len() * 2);
    push_hex(&mut out, bytes);
    out
}

fn unhex(hex: &str) -> Option<String> {
    let digit = |c: u8| (c as char).to_digit(16).map(|d| d as u8);
    let bytes = hex.as_bytes();
    if !bytes.len().is_multiple_of(2) {
        return None;
    }
    let raw = bytes
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect::<Option<Vec<u8>>>()?;
    String::from_utf8(raw).ok()
}

/// The scope and key an index member (`<hex scope>:<hex key>`) names.
pub(crate) fn names_of_member(member: &str) -> Option<(String, String)> {
    let (scope, key) = member.split_once(':')?;
    Some((unhex(scope)?, unhex(key)?))
}

/// The names of one record and its bucket's indexes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RecordKeys {
    /// `<bucket base>:r:<member>`: the scripts take the member (the record's index entry) from
    /// here, `record[lease_index.len() - 3..]` (`:lease` is three bytes longer than `:r:`).
    pub record: String,
    /// `<bucket base>:lease`; the scripts also take the length of the bucket base from it.
    pub lease_index: String,
    /// The registry of the bucket's expiry slices (`<bucket base>:xs`).
    pub slices: String,
}

/// The bucket of (scope, key).
#[cfg(test)]
pub(crate) fn bucket_of(scope: &Scope, key: &IdempotencyKey) -> u16 {
    bucket_of_bytes(scope.as_str().as_bytes(), key.as_str().as_bytes())
}

fn bucket_of_bytes(scope: &[u8], key: &[u8]) -> u16 {
    (fnv1a(&[scope, &[0x1f], key]) % u64::from(BUCKETS)) as u16
}

/// The names of bucket `bucket`'s indexes and its record prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BucketKeys {
    /// The earlier versions' expiry index, drained by purge.
    pub expiry_index: String,
    pub lease_index: String,
    pub slices: String,
    /// `<bucket base>:r:`, what a member is appended to for its record's name.
    pub record_prefix: String,
    /// `<bucket base>:x:`, what a slice number is appended to for its list's name.
    pub slice_prefix: String,
}

impl BucketKeys {
    pub(crate) fn new(prefix: &str, bucket: u16) -> Self {
        let base = format!("{prefix}:{{b{bucket:02}}}");
        Self {
            expiry_index: format!("{base}:exp"),
            lease_index: format!("{base}:lease"),
            slices: format!("{base}:xs"),
            record_prefix: format!("{base}:r:"),
            slice_prefix: format!("{base}:x:"),
        }
    }

    /// The record key of an index member.
    pub(crate) fn record(&self, member: &str) -> String {
        format!("{}{member}", self.record_prefix)
    }

    /// The list of expiry slice `slice`.
    pub(crate) fn slice(&self, slice: u64) -> String {
        format!("{}{slice}", self.slice_prefix)
    }
}

impl RecordKeys {
    pub(crate) fn new(prefix: &str, id: &RecordId) -> Self {
        use std::fmt::Write;
        let (scope, key) = (id.scope().as_str().as_bytes(), id.key().as_str().as_bytes());
        let bucket = bucket_of_bytes(scope, key);
        let mut base = String::with_capacity(prefix.len() + 6);
        let _ = write!(base, "{prefix}:{{b{bucket:02}}}");
        let mut record = String::with_capacity(base.len() + 4 + 2 * (scope.len() + key.len()));
        record.push_str(&base);
        record.push_str(":r:");
        push_hex(&mut record, scope);
        record.push(':');
        push_hex(&mut record, key);
        let mut slices = String::with_capacity(base.len() + 3);
        slices.push_str(&base);
        slices.push_str(":xs");
        base.push_str(":lease");
        Self {
            record,
            lease_index: base,
            slices,
        }
    }

    /// The list of the expiry slice of `expires_at` (ms).
    pub(crate) fn slice(&self, expires_at: u64) -> String {
        let base = &self.lease_index[..self.lease_index.len() - 6];
        format!("{base}:x:{}", slice_of(expires_at))
    }

    /// The record's entry in its bucket's indexes, as the scripts derive it.
    #[cfg(test)]
    pub(crate) fn member(&self) -> &str {
        &self.record[self.lease_index.len() - 3..]
    }
}

/// Why a key prefix was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid key prefix {prefix:?}: it must be 1 to 64 bytes of visible ASCII without '{{' or '}}' (they would break the cluster hash tag)"
)]
pub struct InvalidPrefix {
    /// The prefix given.
    pub prefix: String,
}

pub(crate) fn check_prefix(prefix: &str) -> Result<(), InvalidPrefix> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 64
        && prefix
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b'{' && b != b'}');
    if ok {
        Ok(())
    } else {
        Err(InvalidPrefix {
            prefix: prefix.to_owned(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(scope: &str, key: &str) -> RecordKeys {
        RecordKeys::new(
            "idem",
            &RecordId::new(
                Scope::new(scope).unwrap(),
                IdempotencyKey::new(key).unwrap(),
            ),
        )
    }

    #[test]
    fn names_share_one_hash_tag_and_are_injective() {
        let k = keys("tenant-1/tool", "wf-1:step-1");
        let tag = |s: &str| s[s.find('{').unwrap()..=s.find('}').unwrap()].to_owned();
        assert_eq!(tag(&k.record), tag(&k.lease_index));
        // The scripts take the member from the record's name: it must be exactly the member
        // list and purge map back to the record, and name the scope and key.
        let bucket = BucketKeys::new(
            "idem",
            bucket_of(
                &Scope::new("tenant-1/tool").unwrap(),
                &IdempotencyKey::new("wf-1:step-1").unwrap(),
            ),
        );
        assert_eq!(bucket.record(k.member()), k.record);
        assert_eq!(bucket.lease_index, k.lease_index);
        assert_eq!(bucket.slices, k.slices);
        let ea = 1_800_000_000_000;
        assert_eq!(bucket.slice(slice_of(ea)), k.slice(ea));
        assert_eq!(tag(&k.slice(ea)), tag(&k.record));
        assert_eq!(tag(&k.slices), tag(&k.record));
        assert_eq!(
            names_of_member(k.member()),
            Some(("tenant-1/tool".to_owned(), "wf-1:step-1".to_owned()))
        );
        assert_eq!(
            k.member(),
            format!("{}:{}", hex(b"tenant-1/tool"), hex(b"wf-1:step-1"))
        );
        // Braces and separators in scope or key cannot move the tag or merge two names.
        let a = keys("a}{:", "b");
        assert_eq!(a.record.matches('{').count(), 1);
        assert_ne!(keys("ab", "c").member(), keys("a", "bc").member());
        assert_ne!(keys("a:b", "c").member(), keys("a", "b:c").member());
    }

    #[test]
    fn buckets_are_stable_and_spread() {
        // Part of the stored format: these values must never change.
        assert_eq!(fnv1a(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        let mut seen = std::collections::HashSet::new();
        for i in 0..1000 {
            seen.insert(bucket_of(
                &Scope::new("s").unwrap(),
                &IdempotencyKey::new(format!("k{i}")).unwrap(),
            ));
        }
        assert_eq!(seen.len(), usize::from(BUCKETS));
    }

    #[test]
    fn prefixes() {
        assert!(check_prefix("idem").is_ok());
        assert!(check_prefix("app:idem").is_ok());
        assert!(check_prefix("").is_err());
        assert!(check_prefix("a{b").is_err());
        assert!(check_prefix("a b").is_err());
    }
}
