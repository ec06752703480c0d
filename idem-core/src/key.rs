//! Idempotency keys and scopes: the address of a record.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest key accepted, in bytes ([contract §4](crate::contract#refusals)).
pub const MAX_KEY_BYTES: usize = 255;

/// The longest scope accepted, in bytes.
pub const MAX_SCOPE_BYTES: usize = 512;

/// Why a key was refused ([contract §4](crate::contract#refusals)). Each variant names the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key was the empty string.
    #[error("invalid idempotency key: it is empty (a key is 1 to 255 bytes of visible ASCII)")]
    Empty,
    /// The key was longer than [`MAX_KEY_BYTES`].
    #[error("invalid idempotency key: it is {len} bytes long, the limit is 255 bytes")]
    TooLong {
        /// The length that was given, in bytes.
        len: usize,
    },
    /// The key held a byte outside visible ASCII (`!` to `~`; no space, no control character,
    /// nothing beyond ASCII).
    #[error(
        "invalid idempotency key: byte {index} is 0x{byte:02x}, outside visible ASCII ('!' to '~')"
    )]
    InvalidCharacter {
        /// Position of the first offending byte.
        index: usize,
        /// The offending byte.
        byte: u8,
    },
}

/// The caller's name for one logical operation, e.g. `wf-8812:step-3:create_ticket`.
///
/// It is built by the orchestrator from its durable step, never by the model and never fresh per
/// retry. Valid keys are 1 to 255 bytes of visible ASCII (`0x21..=0x7e`).
///
/// ```
/// use idem_core::{IdempotencyKey, KeyError};
/// assert!(IdempotencyKey::new("wf-8812:step-3:create_ticket").is_ok());
/// assert_eq!(IdempotencyKey::new(""), Err(KeyError::Empty));
/// assert!(matches!(IdempotencyKey::new("has space"), Err(KeyError::InvalidCharacter { index: 3, .. })));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Validates `key` per [contract §4](crate::contract#refusals).
    pub fn new(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        if key.is_empty() {
            return Err(KeyError::Empty);
        }
        if key.len() > MAX_KEY_BYTES {
            return Err(KeyError::TooLong { len: key.len() });
        }
        if let Some((index, &byte)) = key
            .as_bytes()
            .iter()
            .enumerate()
            .find(|(_, b)| !(0x21..=0x7e).contains(*b))
        {
            return Err(KeyError::InvalidCharacter { index, byte });
        }
        Ok(Self(key))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key of one step of a durable workflow: `{workflow_run_id}:{step_id}:{tool}`.
    ///
    /// **The orchestrator makes the key, never the model.** The key names one *business
    /// operation*: "step 3 of workflow run 8812 creates a ticket". It must be the same on every
    /// retry of that operation — after a timeout, after the model decides to "try again", after
    /// the orchestrator itself restarts — and different for every other operation. Only the
    /// orchestrator's durable state (the run id and the step id it persists before calling the
    /// tool) has both properties. A model asked to invent a key produces a fresh one on every
    /// attempt (the retry is then a new operation: a second charge) or reuses one across
    /// different operations (the second then replays the first's answer). A provider's tool-call
    /// id (`call_abc123`) is not a business-operation id either: it is minted per model response,
    /// so the same intended action re-issued after a timeout gets a new one.
    ///
    /// Parts are used as given when they are visible ASCII without `:` and do not start with
    /// `~`; any other part (and every part, when the result would be over 255 bytes) is replaced
    /// by its digest: `~` and 24 hex digits of its SHA-256. A digest starts with `~` and a part
    /// used as given never does, and no part contains `:`, so the key is injective: two
    /// different (run, step, tool) triples never give the same key (short of a 96-bit SHA-256
    /// collision).
    ///
    /// Keys of parts used as given are the same as before this rule. A part that starts with `~`
    /// used to be kept as given (so `~` followed by 24 hex digits could collide with another
    /// part's digest); it is now digested, so such a step gets a different key than it did
    /// before the upgrade: a retry in flight across the upgrade is then a new operation.
    ///
    /// ```
    /// use idem_core::IdempotencyKey;
    /// let key = IdempotencyKey::for_step("wf-8812", "step-3", "create_ticket").unwrap();
    /// assert_eq!(key.as_str(), "wf-8812:step-3:create_ticket");
    /// // Stable across retries and restarts: the same inputs give the same key.
    /// assert_eq!(key, IdempotencyKey::for_step("wf-8812", "step-3", "create_ticket").unwrap());
    /// // A part with spaces or a colon is digested, never mangled into another step's key.
    /// let odd = IdempotencyKey::for_step("run 1", "a:b", "t").unwrap();
    /// assert_ne!(odd, IdempotencyKey::for_step("run 1:a", "b", "t").unwrap());
    /// // A part that looks like a digest is digested too, never mistaken for one.
    /// let (digest, ..) = odd.as_str().split_once(':').unwrap();
    /// assert_ne!(odd, IdempotencyKey::for_step(digest, "a:b", "t").unwrap());
    /// ```
    pub fn for_step(workflow_run_id: &str, step_id: &str, tool: &str) -> Result<Self, KeyError> {
        let parts = [workflow_run_id, step_id, tool];
        if parts.iter().any(|p| p.is_empty()) {
            return Err(KeyError::Empty);
        }
        // Injective because a plain part never starts with the digest's `~` and no part holds
        // the separator.
        let plain = |p: &str| {
            !p.starts_with('~') && p.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b':')
        };
        let mut key = parts
            .iter()
            .map(|p| {
                if plain(p) {
                    (*p).to_owned()
                } else {
                    digest_part(p)
                }
            })
            .collect::<Vec<_>>()
            .join(":");
        if key.len() > MAX_KEY_BYTES {
            key = parts
                .iter()
                .map(|p| digest_part(p))
                .collect::<Vec<_>>()
                .join(":");
        }
        Self::new(key)
    }
}

/// `~` followed by 24 hex digits of SHA-256 of the part.
fn digest_part(part: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(part.as_bytes());
    let mut out = String::from("~");
    for b in &digest[..12] {
        use std::fmt::Write;
        let _ = write!(out, "{b:02x}");
    }
    out
}

impl fmt::Display for IdempotencyKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for IdempotencyKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl<'de> Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

/// Why a scope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The scope was the empty string.
    #[error("invalid scope: it is empty")]
    Empty,
    /// The scope was longer than [`MAX_SCOPE_BYTES`].
    #[error("invalid scope: it is {len} bytes long, the limit is 512 bytes")]
    TooLong {
        /// The length that was given, in bytes.
        len: usize,
    },
    /// The scope held a control character.
    #[error("invalid scope: character {index} is a control character")]
    ControlCharacter {
        /// Byte position of the offending character.
        index: usize,
    },
}

/// Who owns a key: the tenant or principal plus the tool ([contract §1](crate::contract#words)).
///
/// Records are addressed by (scope, key); the same key in two scopes is two records. Build one
/// from its parts with [`Scope::from_parts`], which escapes each part so that no two different
/// lists of parts give the same scope.
///
/// ```
/// use idem_core::Scope;
/// let a = Scope::from_parts(["tenant-a", "create_ticket"]).unwrap();
/// assert_eq!(a.as_str(), "tenant-a/create_ticket");
/// // A '/' inside a part cannot forge another tenant's scope.
/// let b = Scope::from_parts(["tenant-a/create_ticket", "x"]).unwrap();
/// assert_ne!(b, Scope::from_parts(["tenant-a", "create_ticket/x"]).unwrap());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(transparent)]
pub struct Scope(String);

impl Scope {
    /// Validates an already-built scope: 1 to 512 bytes of UTF-8 with no control characters.
    pub fn new(scope: impl Into<String>) -> Result<Self, ScopeError> {
        let scope = scope.into();
        if scope.is_empty() {
            return Err(ScopeError::Empty);
        }
        if scope.len() > MAX_SCOPE_BYTES {
            return Err(ScopeError::TooLong { len: scope.len() });
        }
        if let Some((index, _)) = scope.char_indices().find(|(_, c)| c.is_control()) {
            return Err(ScopeError::ControlCharacter { index });
        }
        Ok(Self(scope))
    }

    /// Joins parts (e.g. tenant and tool) with `/`, percent-escaping `%` and `/` inside each part
    /// so that the joining is injective.
    pub fn from_parts<I, S>(parts: I) -> Result<Self, ScopeError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let mut out = String::new();
        for (i, part) in parts.into_iter().enumerate() {
            if i > 0 {
                out.push('/');
            }
            for c in part.as_ref().chars() {
                match c {
                    '%' => out.push_str("%25"),
                    '/' => out.push_str("%2F"),
                    c => out.push(c),
                }
            }
        }
        Self::new(out)
    }

    /// The scope as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Scope {
    type Err = ScopeError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_accepts_visible_ascii_bounds() {
        assert!(IdempotencyKey::new("!").is_ok());
        assert!(IdempotencyKey::new("~").is_ok());
        assert!(IdempotencyKey::new("a".repeat(255)).is_ok());
    }

    #[test]
    fn key_refusals_name_their_rule() {
        assert_eq!(IdempotencyKey::new(""), Err(KeyError::Empty));
        assert_eq!(
            IdempotencyKey::new("a".repeat(256)),
            Err(KeyError::TooLong { len: 256 })
        );
        assert_eq!(
            IdempotencyKey::new("ab c"),
            Err(KeyError::InvalidCharacter {
                index: 2,
                byte: b' '
            })
        );
        assert_eq!(
            IdempotencyKey::new("a\u{7f}"),
            Err(KeyError::InvalidCharacter {
                index: 1,
                byte: 0x7f
            })
        );
        assert_eq!(
            IdempotencyKey::new("é"),
            Err(KeyError::InvalidCharacter {
                index: 0,
                byte: 0xc3
            })
        );
        assert!(KeyError::Empty.to_string().contains("empty"));
        assert!(KeyError::TooLong { len: 300 }.to_string().contains("255"));
        assert!(
            KeyError::InvalidCharacter { index: 0, byte: 9 }
                .to_string()
                .contains("visible ASCII")
        );
    }

    #[test]
    fn step_keys_are_stable_valid_and_distinct() {
        let a = IdempotencyKey::for_step("wf-1", "s-1", "t").unwrap();
        assert_eq!(a.as_str(), "wf-1:s-1:t");
        assert_eq!(IdempotencyKey::for_step("", "s", "t"), Err(KeyError::Empty));
        let long = "r".repeat(300);
        let k = IdempotencyKey::for_step(&long, "s-1", "t").unwrap();
        assert!(k.as_str().len() <= 255);
        assert_eq!(k, IdempotencyKey::for_step(&long, "s-1", "t").unwrap());
        let unicode = IdempotencyKey::for_step("wf-é", "s-1", "t").unwrap();
        assert!(unicode.as_str().starts_with('~'));
        assert_ne!(
            IdempotencyKey::for_step("a:b", "c", "t").unwrap(),
            IdempotencyKey::for_step("a", "b:c", "t").unwrap()
        );
        // Many parts long enough together: every part digested.
        let k =
            IdempotencyKey::for_step(&"a".repeat(120), &"b".repeat(120), &"c".repeat(20)).unwrap();
        assert_eq!(k.as_str().matches('~').count(), 3);
    }

    #[test]
    fn step_keys_of_ordinary_and_digested_parts_are_unchanged() {
        for (parts, key) in [
            (
                ("wf-8812", "step-3", "create_ticket"),
                "wf-8812:step-3:create_ticket",
            ),
            (("run 1", "s", "t"), "~b945d8cb026e35c608337842:s:t"),
            (
                ("wf-é", "step:3", "create ticket"),
                "~c5596133ed572d3460c87bff:~8a69fc71ccd8184822b6cae0:~40ae166db7786683b06c5f32",
            ),
        ] {
            assert_eq!(
                IdempotencyKey::for_step(parts.0, parts.1, parts.2)
                    .unwrap()
                    .as_str(),
                key
            );
        }
    }

    /// The collision of issue 13: a part that already looks like a digest.
    #[test]
    fn a_part_that_looks_like_a_digest_is_not_confused_with_one() {
        let digested = IdempotencyKey::for_step("run 1", "s", "t").unwrap();
        let lookalike = digest_part("run 1");
        assert!(digested.as_str().starts_with(&lookalike));
        let forged = IdempotencyKey::for_step(&lookalike, "s", "t").unwrap();
        assert_ne!(digested, forged);
        // Also when the whole key is digested for length.
        let long = "r".repeat(300);
        let all = IdempotencyKey::for_step(&long, "s", "t").unwrap();
        let parts: Vec<&str> = all.as_str().split(':').collect();
        assert_ne!(
            all,
            IdempotencyKey::for_step(parts[0], parts[1], parts[2]).unwrap()
        );
    }

    fn triple() -> impl proptest::strategy::Strategy<Value = (String, String, String)> {
        // Few characters, so that equal parts, separators, tildes and hex digits are frequent.
        let part = || proptest::prop_oneof!["[~:a-f0-9 é]{1,6}", "~[0-9a-f]{24}", "[a-z]{80,130}",];
        (part(), part(), part())
    }

    proptest::proptest! {
        /// Injective: equal keys only for equal triples, including for the triple spelled by a
        /// key's own parts (the forgery of a digest).
        #[test]
        fn for_step_is_injective(a in triple(), b in triple()) {
            let key = |t: &(String, String, String)| IdempotencyKey::for_step(&t.0, &t.1, &t.2).unwrap();
            let (ka, kb) = (key(&a), key(&b));
            proptest::prop_assert_eq!(ka == kb, a == b);
            let parts: Vec<String> = ka.as_str().split(':').map(str::to_owned).collect();
            proptest::prop_assert_eq!(parts.len(), 3);
            let spelled = (parts[0].clone(), parts[1].clone(), parts[2].clone());
            proptest::prop_assert_eq!(key(&spelled) == ka, spelled == a);
        }
    }

    #[test]
    fn key_deserialization_validates() {
        assert!(serde_json::from_str::<IdempotencyKey>("\"ok-key\"").is_ok());
        assert!(serde_json::from_str::<IdempotencyKey>("\"\"").is_err());
    }

    #[test]
    fn scope_rules() {
        assert_eq!(Scope::new(""), Err(ScopeError::Empty));
        assert!(matches!(
            Scope::new("a\nb"),
            Err(ScopeError::ControlCharacter { index: 1 })
        ));
        assert!(matches!(
            Scope::new("x".repeat(513)),
            Err(ScopeError::TooLong { len: 513 })
        ));
        assert_eq!(
            Scope::from_parts(["a%b", "c/d"]).unwrap().as_str(),
            "a%25b/c%2Fd"
        );
    }
}
