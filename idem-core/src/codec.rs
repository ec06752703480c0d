//! Outcome codecs: what is done to a response before it is stored and after it is read back
//! ([contract §6](crate::contract#codecs)).
//!
//! A tool's response often carries personal data, and the store keeps it for the ttl (24 h by
//! default) in plain text. An [`OutcomeCodec`] set on the [`Executor`](crate::Executor)
//! ([`Executor::with_codec`](crate::Executor::with_codec)) is applied to every outcome on its way
//! into the store and to every stored outcome on its way back out, whatever the store: the
//! executor is what the HTTP layer, the MCP servers and your own code call, so no store changes.
//!
//! **What a codec sees and changes: the body only.** The status and the class, the fingerprint,
//! the state, the token and the timestamps stay clear, so claims, replays' statuses, the
//! conformance suite, `idem keys list` and reconciliation work as before. A codec cannot change
//! the status or the class: it returns the body to store (or to replay), and the executor keeps
//! the outcome's status and class around it.
//!
//! Codecs provided:
//!
//! - [`AesGcmCodec`] (feature `encryption`): AES-256-GCM with a key you supply, the key id stored
//!   beside the ciphertext so keys can rotate. A wrong key, an unknown key id or a tampered body
//!   is an error ([`Error::Decode`](crate::Error::Decode)), never a replay of garbage.
//! - [`Redact`]: masks or removes chosen fields (JSON pointers) before storing. A replay then
//!   returns the **redacted** body: the first caller gets the full response, every repeat gets it
//!   without those fields.
//! - [`Chain`]: one codec, then another (redact, then encrypt).
//!
//! A custom codec implements the two methods; [`CodecContext`] tells it which record the outcome
//! belongs to.
//!
//! ```
//! use idem_core::codec::{CodecContext, CodecError, OutcomeCodec};
//! use idem_core::Outcome;
//!
//! /// Wraps every stored body as `{"v": <body>}` (a toy: a real codec encrypts or redacts).
//! #[derive(Debug)]
//! struct Wrap;
//!
//! impl OutcomeCodec for Wrap {
//!     fn encode(&self, _cx: &CodecContext<'_>, outcome: &Outcome) -> Result<String, CodecError> {
//!         Ok(format!("{{\"v\":{}}}", outcome.body()))
//!     }
//!     fn decode(&self, _cx: &CodecContext<'_>, stored: &Outcome) -> Result<String, CodecError> {
//!         let v = stored.body_json().get("v").cloned().ok_or_else(|| CodecError::malformed("no v"))?;
//!         Ok(v.to_string())
//!     }
//! }
//! ```

use std::borrow::Cow;
use std::fmt;
use std::sync::Arc;

use serde_json::Value;

use crate::{IdempotencyKey, Outcome, Scope, store::BoxError};

#[cfg(feature = "encryption")]
mod aes;
#[cfg(feature = "encryption")]
#[cfg_attr(docsrs, doc(cfg(feature = "encryption")))]
pub use aes::AesGcmCodec;

mod redact;

pub use redact::Redact;

/// The field that marks a stored body as a sealed (encrypted) envelope:
/// `{"idem_sealed": {"v": 1, "alg": "A256GCM", "kid": "…", "nonce": "…", "ct": "…"}}`. Tools such
/// as `idem keys show` recognise it with [`sealed_info`] and say "encrypted" instead of printing
/// ciphertext.
pub(crate) const SEALED_MARKER: &str = "idem_sealed";

/// Which record an outcome belongs to, handed to a codec with every outcome (an encrypting codec
/// binds its ciphertext to it, so a sealed body copied into another record does not open).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct CodecContext<'a> {
    /// The record's scope.
    pub scope: &'a Scope,
    /// The record's key.
    pub key: &'a IdempotencyKey,
}

impl<'a> CodecContext<'a> {
    /// The context of the record (scope, key).
    pub fn new(scope: &'a Scope, key: &'a IdempotencyKey) -> Self {
        Self { scope, key }
    }
}

/// Why a codec could not encode or decode an outcome, or could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// The stored body was sealed with a key id this codec does not hold (a key retired too
    /// early, or another deployment's key). Add the old key with
    /// [`AesGcmCodec::with_old_key`](crate::codec::AesGcmCodec) to read it.
    #[error("the stored outcome was sealed with key id {key_id:?}, which this codec does not hold")]
    UnknownKey {
        /// The key id stored with the body.
        key_id: String,
    },
    /// The sealed body did not open: the key held under this id is not the one it was sealed
    /// with, or the body, its status or class, or its record was changed at rest.
    #[error(
        "the stored outcome (key id {key_id:?}) did not decrypt: wrong key for this id, or the record was tampered with"
    )]
    Decrypt {
        /// The key id stored with the body.
        key_id: String,
    },
    /// The stored body is not a sealed envelope (stored before encryption was turned on, or
    /// written by something without the codec). See
    /// [`AesGcmCodec::accept_unsealed`](crate::codec::AesGcmCodec).
    #[error("the stored outcome is not encrypted, and this codec only replays encrypted outcomes")]
    NotSealed,
    /// The stored body looks like a sealed envelope but a field is missing or malformed.
    #[error("malformed stored outcome: {message}")]
    Malformed {
        /// What is wrong.
        message: String,
    },
    /// A codec produced text that is not JSON (or JSON no reader can hold).
    #[error("the codec produced a body that is not JSON")]
    InvalidJson(#[source] serde_json::Error),
    /// A key id is empty, over 64 bytes, or has characters outside visible ASCII.
    #[error("a key id is 1 to 64 visible ASCII characters, got {key_id:?}")]
    InvalidKeyId {
        /// The key id given.
        key_id: String,
    },
    /// Two keys were given the same key id.
    #[error("key id {key_id:?} was given twice")]
    DuplicateKeyId {
        /// The key id given twice.
        key_id: String,
    },
    /// A JSON pointer for [`Redact`] does not start with `/` (RFC 6901), or is empty.
    #[error("a JSON pointer to redact starts with '/' and names a field, got {pointer:?}")]
    InvalidPointer {
        /// The pointer given.
        pointer: String,
    },
    /// The operating system's random number generator failed (no nonce could be drawn).
    #[error("no random nonce could be drawn: {message}")]
    Random {
        /// The generator's failure.
        message: String,
    },
    /// Another failure, from a custom codec.
    #[error("codec: {message}")]
    Other {
        /// What failed.
        message: String,
        /// The cause.
        #[source]
        source: Option<BoxError>,
    },
}

impl CodecError {
    /// A [`CodecError::Malformed`].
    pub fn malformed(message: impl Into<String>) -> Self {
        Self::Malformed {
            message: message.into(),
        }
    }

    /// A [`CodecError::Other`] keeping `source`, for custom codecs.
    pub fn other(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Other {
            message: message.into(),
            source: Some(source.into()),
        }
    }
}

/// Turns an outcome's body into what the store keeps, and back; see the [module docs](self).
///
/// Both methods see the whole outcome (status, class, body) and return a **body** only: the
/// status and the class are kept clear around it. `decode(encode(o))` must give back `o`'s body,
/// except for a codec that deliberately drops data (such as [`Redact`]), which documents that.
/// Both must be deterministic in what they accept: `decode` refuses (an error) what it cannot
/// read, it never guesses.
pub trait OutcomeCodec: Send + Sync + fmt::Debug + 'static {
    /// The body to store for `outcome` (JSON text).
    fn encode(&self, cx: &CodecContext<'_>, outcome: &Outcome) -> Result<String, CodecError>;

    /// The body to replay for the stored outcome `stored` (JSON text).
    fn decode(&self, cx: &CodecContext<'_>, stored: &Outcome) -> Result<String, CodecError>;
}

impl<C: OutcomeCodec + ?Sized> OutcomeCodec for Arc<C> {
    fn encode(&self, cx: &CodecContext<'_>, outcome: &Outcome) -> Result<String, CodecError> {
        (**self).encode(cx, outcome)
    }
    fn decode(&self, cx: &CodecContext<'_>, stored: &Outcome) -> Result<String, CodecError> {
        (**self).decode(cx, stored)
    }
}

/// The outcome to store for `outcome`: its status and class around the codec's body. Without a
/// codec, `outcome` itself.
pub(crate) fn encode_outcome<'o>(
    codec: Option<&dyn OutcomeCodec>,
    cx: &CodecContext<'_>,
    outcome: &'o Outcome,
) -> Result<Cow<'o, Outcome>, CodecError> {
    let Some(codec) = codec else {
        return Ok(Cow::Borrowed(outcome));
    };
    let body = codec.encode(cx, outcome)?;
    Outcome::from_json_text(outcome.status(), body, outcome.class())
        .map(Cow::Owned)
        .map_err(CodecError::InvalidJson)
}

/// The outcome to replay for the stored `stored`: its status and class around the codec's body.
/// Without a codec, `stored` itself.
pub(crate) fn decode_outcome(
    codec: Option<&dyn OutcomeCodec>,
    cx: &CodecContext<'_>,
    stored: Outcome,
) -> Result<Outcome, CodecError> {
    let Some(codec) = codec else {
        return Ok(stored);
    };
    let body = codec.decode(cx, &stored)?;
    Outcome::from_json_text(stored.status(), body, stored.class()).map_err(CodecError::InvalidJson)
}

/// What a sealed envelope says about itself, without any key: see [`sealed_info`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SealedInfo {
    /// The algorithm, e.g. `A256GCM`.
    pub algorithm: String,
    /// The id of the key it was sealed with.
    pub key_id: String,
}

/// If `body` is a sealed envelope (an object whose only field is `idem_sealed`, holding
/// `alg` and `kid`), its algorithm and key id; otherwise `None`. Needs no key and no feature.
///
/// ```
/// use idem_core::codec::sealed_info;
/// let info = sealed_info(r#"{"idem_sealed":{"v":1,"alg":"A256GCM","kid":"2026-01","nonce":"","ct":""}}"#).unwrap();
/// assert_eq!((info.algorithm.as_str(), info.key_id.as_str()), ("A256GCM", "2026-01"));
/// assert!(sealed_info(r#"{"idem_sealed":"x","other":1}"#).is_none());
/// ```
pub fn sealed_info(body: &str) -> Option<SealedInfo> {
    if !body.contains(SEALED_MARKER) {
        return None;
    }
    let value: Value = serde_json::from_str(body).ok()?;
    let object = value.as_object()?;
    if object.len() != 1 {
        return None;
    }
    let sealed = object.get(SEALED_MARKER)?.as_object()?;
    Some(SealedInfo {
        algorithm: sealed.get("alg")?.as_str()?.to_owned(),
        key_id: sealed.get("kid")?.as_str()?.to_owned(),
    })
}

/// Two codecs in a row: `first` encodes, then `then` encodes its result; decoding runs them the
/// other way round. E.g. `Chain::new(Redact::mask([...])?, AesGcmCodec::new(...)?)`: redacted,
/// then encrypted.
#[derive(Debug)]
pub struct Chain<A, B> {
    first: A,
    then: B,
}

impl<A: OutcomeCodec, B: OutcomeCodec> Chain<A, B> {
    /// `first`, then `then`.
    pub fn new(first: A, then: B) -> Self {
        Self { first, then }
    }
}

impl<A: OutcomeCodec, B: OutcomeCodec> OutcomeCodec for Chain<A, B> {
    fn encode(&self, cx: &CodecContext<'_>, outcome: &Outcome) -> Result<String, CodecError> {
        let middle = encode_outcome(Some(&self.first), cx, outcome)?;
        self.then.encode(cx, &middle)
    }

    fn decode(&self, cx: &CodecContext<'_>, stored: &Outcome) -> Result<String, CodecError> {
        let middle = decode_outcome(Some(&self.then), cx, stored.clone())?;
        self.first.decode(cx, &middle)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_info_needs_the_marker_shape() {
        assert!(sealed_info("{\"a\":1}").is_none());
        assert!(sealed_info("[\"idem_sealed\"]").is_none());
        assert!(sealed_info("{\"idem_sealed\":{\"alg\":\"A256GCM\"}}").is_none());
        assert!(sealed_info("{\"idem_sealed\":{\"alg\":\"A\",\"kid\":\"k\"}}").is_some());
    }
}
