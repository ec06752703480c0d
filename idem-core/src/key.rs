//! Idempotency keys and scopes: the address of a record.

use std::fmt;

use serde::{Deserialize, Serialize};

const MAX_KEY_BYTES: usize = IdempotencyKey::MAX_BYTES;
const MAX_SCOPE_BYTES: usize = Scope::MAX_BYTES;

/// Why a key was refused ([contract §4](crate::contract#refusals)). Each variant names the rule it
/// broke.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The key was the empty string.
    #[error("invalid idempotency key: it is empty (a key is 1 to 255 bytes of visible ASCII)")]
    Empty,
    /// The key was longer than [`IdempotencyKey::MAX_BYTES`].
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
    /// The longest key accepted, in bytes ([contract §4](crate::contract#refusals)).
    pub const MAX_BYTES: usize = 255;

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

/// Parses a key as a store holds it: [`IdempotencyKey::from_stored`] (a sent key or a derived one).
impl std::str::FromStr for IdempotencyKey {
    type Err = KeyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::from_stored(s)
    }
}

/// Reads a key as a store holds it: [`IdempotencyKey::from_stored`] (a sent key or a derived one).
impl<'de> Deserialize<'de> for IdempotencyKey {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Self::from_stored(s).map_err(serde::de::Error::custom)
    }
}

/// Where a key came from ([contract §5.1](crate::contract#keyless)): sent by the caller, or
/// derived by the tool for a call that sent none. The key itself says it (a derived key starts
/// with its source's prefix and a space, which no sent key can hold), so a store keeps it
/// without a column of its own.
///
/// ```
/// use idem_core::{IdempotencyKey, KeyOrigin};
/// assert_eq!(IdempotencyKey::new("wf-1:step-3").unwrap().origin(), KeyOrigin::Sent);
/// let derived = IdempotencyKey::from_model_argument("retry-me-7").unwrap();
/// assert_eq!(derived.as_str(), "model: retry-me-7");
/// assert_eq!(derived.origin(), KeyOrigin::ModelArgument);
/// // A caller cannot send it: a sent key holds no space.
/// assert!(IdempotencyKey::new(derived.as_str()).is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum KeyOrigin {
    /// The caller sent the key (header, `_meta`, `params.idempotencyKey`).
    Sent,
    /// Derived from the call's arguments (`args: ` and 64 hex digits).
    Arguments,
    /// The argument the tool asks the model to fill (`model: ` and the value, or `model: sha256 `
    /// and its digest when the value is not short visible ASCII).
    ModelArgument,
    /// The MCP session id and JSON-RPC request id (`request: ` and 64 hex digits).
    Request,
}

impl KeyOrigin {
    /// The label of metrics, events and answers: `sent`, `arguments`, `model_argument`,
    /// `request`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sent => "sent",
            Self::Arguments => "arguments",
            Self::ModelArgument => "model_argument",
            Self::Request => "request",
        }
    }

    /// The prefix of a key derived from this source, space included; `None` for a sent key.
    fn prefix(self) -> Option<&'static str> {
        match self {
            Self::Sent => None,
            Self::Arguments => Some("args: "),
            Self::ModelArgument => Some("model: "),
            Self::Request => Some("request: "),
        }
    }

    const DERIVED: [KeyOrigin; 3] = [Self::Arguments, Self::ModelArgument, Self::Request];
}

impl fmt::Display for KeyOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl IdempotencyKey {
    /// Reads a key back as a store holds it: a key a caller sent ([`IdempotencyKey::new`]) or one
    /// a tool derived ([`KeyOrigin`]: its prefix, a space, then 1 or more bytes of printable
    /// ASCII, 255 bytes in all). For stores, `Record` deserialisation and operator tools; a key
    /// from a caller goes through [`IdempotencyKey::new`], which refuses the derived forms.
    pub fn from_stored(key: impl Into<String>) -> Result<Self, KeyError> {
        let key = key.into();
        let sent = match Self::new(key.as_str()) {
            Ok(_) => return Ok(Self(key)),
            Err(e) => e,
        };
        let derived = KeyOrigin::DERIVED.iter().any(|origin| {
            origin.prefix().is_some_and(|prefix| {
                key.strip_prefix(prefix).is_some_and(|rest| {
                    !rest.is_empty() && rest.bytes().all(|b| (0x20..=0x7e).contains(&b))
                })
            })
        });
        if derived && key.len() <= MAX_KEY_BYTES {
            Ok(Self(key))
        } else {
            Err(sent)
        }
    }

    /// Where this key came from: [`KeyOrigin::Sent`], or the source that derived it.
    pub fn origin(&self) -> KeyOrigin {
        KeyOrigin::DERIVED
            .into_iter()
            .find(|origin| origin.prefix().is_some_and(|p| self.0.starts_with(p)))
            .unwrap_or(KeyOrigin::Sent)
    }

    /// The key of a call that sent none, derived from its selected arguments (the
    /// [`KeySource::Arguments`](crate::KeySource::Arguments) of its tool): `args: ` and the
    /// SHA-256 of their canonical JSON (as in the fingerprint: key order, white space and `1.0`
    /// versus `1` do not matter). Equal arguments in one scope give one key.
    pub fn from_arguments(arguments: &serde_json::Value) -> Result<Self, crate::FingerprintError> {
        // A digest of its own domain: the same JSON never gives a fingerprint's digest.
        let digest = crate::Fingerprint::of_value("idem.key.arguments", arguments)?;
        Ok(Self::derived(KeyOrigin::Arguments, digest.as_str()))
    }

    /// The key of a call whose model filled the tool's key argument with `value`
    /// ([`KeySource::ModelArgument`](crate::KeySource::ModelArgument)): `model: ` and the value
    /// when it is visible ASCII and fits, else `model: sha256 ` and its digest (the second space
    /// keeps the two forms apart). An empty value is [`KeyError::Empty`].
    pub fn from_model_argument(value: &str) -> Result<Self, KeyError> {
        if value.is_empty() {
            return Err(KeyError::Empty);
        }
        let prefix = KeyOrigin::ModelArgument.prefix().unwrap_or_default();
        let plain = prefix.len() + value.len() <= MAX_KEY_BYTES
            && value.bytes().all(|b| (0x21..=0x7e).contains(&b));
        Ok(if plain {
            Self::derived(KeyOrigin::ModelArgument, value)
        } else {
            let digest = crate::Fingerprint::of_bytes(value.as_bytes());
            Self::derived(
                KeyOrigin::ModelArgument,
                &format!("sha256 {}", digest.as_str()),
            )
        })
    }

    /// The key of an MCP call from its session id and JSON-RPC request id
    /// ([`KeySource::Request`](crate::KeySource::Request)): `request: ` and the SHA-256 of both
    /// (length-prefixed, so no two pairs give one key). Only a resend of the very same request
    /// (same session, same id) meets it again.
    pub fn from_request(session: &str, request_id: &str) -> Self {
        let text = format!("{}:{session}{request_id}", session.len());
        let digest = crate::Fingerprint::of_bytes(text.as_bytes());
        Self::derived(KeyOrigin::Request, digest.as_str())
    }

    /// `origin`'s prefix followed by `body` (printable ASCII, short enough: checked by callers).
    fn derived(origin: KeyOrigin, body: &str) -> Self {
        let prefix = origin.prefix().unwrap_or_default();
        let mut key = String::with_capacity(prefix.len() + body.len());
        key.push_str(prefix);
        key.push_str(body);
        debug_assert!(Self::from_stored(key.as_str()).is_ok());
        Self(key)
    }
}

/// Why a scope was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScopeError {
    /// The scope was the empty string.
    #[error("invalid scope: it is empty")]
    Empty,
    /// The scope was longer than [`Scope::MAX_BYTES`].
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
    /// The longest scope accepted, in bytes ([contract §4](crate::contract#refusals)).
    pub const MAX_BYTES: usize = 512;

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
mod tests;
