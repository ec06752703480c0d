//! [`AesGcmCodec`]: AES-256-GCM over stored bodies (feature `encryption`).

use std::collections::BTreeMap;
use std::fmt;

use aes_gcm::aead::{Aead, Generate, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde_json::{Value, json};

use super::{CodecContext, CodecError, OutcomeCodec, SEALED_MARKER};
use crate::Outcome;

const ALGORITHM: &str = "A256GCM";
const NONCE_LEN: usize = 12;

/// Encrypts stored bodies with AES-256-GCM (RustCrypto's `aes-gcm`); see the
/// [module docs](crate::codec).
///
/// The stored body is an envelope, recognisable without any key ([`super::sealed_info`]):
///
/// ```json
/// {"idem_sealed": {"v": 1, "alg": "A256GCM", "kid": "2026-01", "nonce": "<base64, 12 bytes>", "ct": "<base64>"}}
/// ```
///
/// - **Keys** are 32 bytes you supply (from a KMS, a secret store, an environment variable): the
///   codec never makes or stores one. Each has a key id, stored in clear beside the ciphertext.
/// - **Rotation**: [`AesGcmCodec::new`] takes the key that seals new outcomes;
///   [`AesGcmCodec::with_old_key`] adds keys that only open outcomes sealed earlier. Keep an old
///   key for the ttl (24 h by default) after it stops sealing, then drop it.
/// - **Nonces** are 96 random bits from the operating system for every outcome. Rotate a key
///   well before it has sealed 2^32 outcomes (NIST's bound for random nonces).
/// - **What is bound** (authenticated, not encrypted): the record's scope and key, the outcome's
///   status and class, and the key id. A sealed body copied into another record, or a status
///   changed at rest, does not open.
/// - **Failures**: an unknown key id is [`CodecError::UnknownKey`], a wrong key or a tampered
///   record [`CodecError::Decrypt`], a body that is not an envelope [`CodecError::NotSealed`]
///   (unless [`AesGcmCodec::accept_unsealed`]). The executor answers them with
///   [`Error::Decode`](crate::Error::Decode): nothing runs, nothing is replayed.
///
/// Its `Debug` shows the key ids only.
///
/// ```
/// use idem_core::codec::{AesGcmCodec, CodecContext, OutcomeCodec, sealed_info};
/// use idem_core::{IdempotencyKey, Outcome, Scope};
/// let codec = AesGcmCodec::new("2026-01", [7u8; 32]).unwrap();
/// let (scope, key) = (Scope::new("t/charge").unwrap(), IdempotencyKey::new("k-1").unwrap());
/// let cx = CodecContext::new(&scope, &key);
/// let outcome = Outcome::definitive(201, &serde_json::json!({"email": "a@b.c"})).unwrap();
/// let sealed = Outcome::from_json_text(201, codec.encode(&cx, &outcome).unwrap(), outcome.class()).unwrap();
/// assert!(!sealed.body().contains("a@b.c"));
/// assert_eq!(sealed_info(sealed.body()).unwrap().key_id, "2026-01");
/// assert_eq!(codec.decode(&cx, &sealed).unwrap(), outcome.body());
/// ```
#[derive(Clone)]
pub struct AesGcmCodec {
    current: String,
    keys: BTreeMap<String, Aes256Gcm>,
    accept_unsealed: bool,
}

impl fmt::Debug for AesGcmCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AesGcmCodec")
            .field("current", &self.current)
            .field(
                "old",
                &self
                    .keys
                    .keys()
                    .filter(|k| **k != self.current)
                    .collect::<Vec<_>>(),
            )
            .field("accept_unsealed", &self.accept_unsealed)
            .finish_non_exhaustive()
    }
}

impl AesGcmCodec {
    /// A codec that seals with `key` under the id `key_id` (1 to 64 visible ASCII characters).
    pub fn new(key_id: impl Into<String>, key: [u8; 32]) -> Result<Self, CodecError> {
        let key_id = check_key_id(key_id.into())?;
        let mut keys = BTreeMap::new();
        keys.insert(key_id.clone(), cipher(&key));
        Ok(Self {
            current: key_id,
            keys,
            accept_unsealed: false,
        })
    }

    /// As [`AesGcmCodec::new`], with the key as a slice, refused unless it is 32 bytes long.
    pub fn from_slice(key_id: impl Into<String>, key: &[u8]) -> Result<Self, CodecError> {
        let key: [u8; 32] = key.try_into().map_err(|_| CodecError::Malformed {
            message: format!("an AES-256 key is 32 bytes, got {}", key.len()),
        })?;
        Self::new(key_id, key)
    }

    /// Adds a key that opens outcomes sealed under `key_id` but seals nothing new (a key being
    /// rotated out). Refused if `key_id` is already held.
    pub fn with_old_key(
        mut self,
        key_id: impl Into<String>,
        key: [u8; 32],
    ) -> Result<Self, CodecError> {
        let key_id = check_key_id(key_id.into())?;
        if self.keys.contains_key(&key_id) {
            return Err(CodecError::DuplicateKeyId { key_id });
        }
        self.keys.insert(key_id, cipher(&key));
        Ok(self)
    }

    /// Replays bodies that are not sealed envelopes as they are, instead of refusing them with
    /// [`CodecError::NotSealed`]: for the ttl after encryption is turned on, when records
    /// stored in clear may still be replayed. Off by default (a store that anyone could write
    /// clear bodies into should not have them replayed).
    pub fn accept_unsealed(mut self, accept: bool) -> Self {
        self.accept_unsealed = accept;
        self
    }

    /// The id of the key that seals new outcomes.
    pub fn current_key_id(&self) -> &str {
        &self.current
    }
}

fn cipher(key: &[u8; 32]) -> Aes256Gcm {
    Aes256Gcm::new(&Key::<Aes256Gcm>::from(*key))
}

fn check_key_id(key_id: String) -> Result<String, CodecError> {
    if key_id.is_empty() || key_id.len() > 64 || !key_id.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(CodecError::InvalidKeyId { key_id });
    }
    Ok(key_id)
}

/// The authenticated data: everything about the record that stays clear and must not move.
fn aad(cx: &CodecContext<'_>, outcome: &Outcome, key_id: &str) -> Vec<u8> {
    json!([
        "idem/outcome/v1",
        cx.scope.as_str(),
        cx.key.as_str(),
        outcome.status(),
        outcome.class().as_str(),
        key_id
    ])
    .to_string()
    .into_bytes()
}

impl OutcomeCodec for AesGcmCodec {
    fn encode(&self, cx: &CodecContext<'_>, outcome: &Outcome) -> Result<String, CodecError> {
        let cipher = &self.keys[&self.current];
        let nonce = aes_gcm::Nonce::<aes_gcm::aead::consts::U12>::try_generate().map_err(|e| {
            CodecError::Random {
                message: e.to_string(),
            }
        })?;
        let aad = aad(cx, outcome, &self.current);
        let ct = cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: outcome.body().as_bytes(),
                    aad: &aad,
                },
            )
            .map_err(|_| CodecError::Other {
                message: "AES-GCM refused to encrypt (body too long)".into(),
                source: None,
            })?;
        Ok(json!({
            SEALED_MARKER: {
                "v": 1,
                "alg": ALGORITHM,
                "kid": self.current,
                "nonce": B64.encode(nonce.as_slice()),
                "ct": B64.encode(ct),
            }
        })
        .to_string())
    }

    fn decode(&self, cx: &CodecContext<'_>, stored: &Outcome) -> Result<String, CodecError> {
        let Some(info) = super::sealed_info(stored.body()) else {
            return if self.accept_unsealed {
                Ok(stored.body().to_owned())
            } else {
                Err(CodecError::NotSealed)
            };
        };
        let value: Value = stored.body_json();
        let envelope = &value[SEALED_MARKER];
        if info.algorithm != ALGORITHM || envelope["v"] != 1 {
            return Err(CodecError::malformed(format!(
                "sealed with {} (version {}), this codec opens {ALGORITHM} version 1",
                info.algorithm, envelope["v"]
            )));
        }
        let cipher = self
            .keys
            .get(&info.key_id)
            .ok_or_else(|| CodecError::UnknownKey {
                key_id: info.key_id.clone(),
            })?;
        let field = |name: &str| -> Result<Vec<u8>, CodecError> {
            let text = envelope[name]
                .as_str()
                .ok_or_else(|| CodecError::malformed(format!("sealed outcome without {name:?}")))?;
            B64.decode(text)
                .map_err(|e| CodecError::malformed(format!("sealed outcome's {name:?}: {e}")))
        };
        let nonce = field("nonce")?;
        let nonce: [u8; NONCE_LEN] = nonce.as_slice().try_into().map_err(|_| {
            CodecError::malformed(format!("a nonce is {NONCE_LEN} bytes, got {}", nonce.len()))
        })?;
        let ct = field("ct")?;
        let aad = aad(cx, stored, &info.key_id);
        let plain = cipher
            .decrypt(
                &nonce.into(),
                Payload {
                    msg: &ct,
                    aad: &aad,
                },
            )
            .map_err(|_| CodecError::Decrypt {
                key_id: info.key_id.clone(),
            })?;
        String::from_utf8(plain).map_err(|_| CodecError::Decrypt {
            key_id: info.key_id,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyKey, OutcomeClass, Scope};

    fn parts() -> (Scope, IdempotencyKey) {
        (
            Scope::new("t/tool").unwrap(),
            IdempotencyKey::new("k-1").unwrap(),
        )
    }

    fn seal(codec: &AesGcmCodec, cx: &CodecContext<'_>, o: &Outcome) -> Outcome {
        Outcome::from_json_text(o.status(), codec.encode(cx, o).unwrap(), o.class()).unwrap()
    }

    #[test]
    fn round_trip_and_fresh_nonces() {
        let (scope, key) = parts();
        let cx = CodecContext::new(&scope, &key);
        let codec = AesGcmCodec::new("k1", [1; 32]).unwrap();
        let o = Outcome::definitive(200, &json!({"secret": "SECRET-MARKER"})).unwrap();
        let (a, b) = (seal(&codec, &cx, &o), seal(&codec, &cx, &o));
        assert_ne!(a.body(), b.body(), "a nonce is never reused");
        assert!(!a.body().contains("SECRET-MARKER"));
        assert_eq!(codec.decode(&cx, &a).unwrap(), o.body());
    }

    #[test]
    fn bound_to_record_status_and_class() {
        let (scope, key) = parts();
        let cx = CodecContext::new(&scope, &key);
        let codec = AesGcmCodec::new("k1", [1; 32]).unwrap();
        let o = Outcome::definitive(200, &json!({"x": 1})).unwrap();
        let sealed = seal(&codec, &cx, &o);
        let other_key = IdempotencyKey::new("k-2").unwrap();
        assert!(matches!(
            codec.decode(&CodecContext::new(&scope, &other_key), &sealed),
            Err(CodecError::Decrypt { .. })
        ));
        let moved = Outcome::from_json_text(500, sealed.body(), OutcomeClass::Definitive).unwrap();
        assert!(matches!(
            codec.decode(&cx, &moved),
            Err(CodecError::Decrypt { .. })
        ));
        let reclassed =
            Outcome::from_json_text(200, sealed.body(), OutcomeClass::Retryable).unwrap();
        assert!(matches!(
            codec.decode(&cx, &reclassed),
            Err(CodecError::Decrypt { .. })
        ));
    }

    #[test]
    fn refusals() {
        let (scope, key) = parts();
        let cx = CodecContext::new(&scope, &key);
        assert!(matches!(
            AesGcmCodec::new("", [0; 32]),
            Err(CodecError::InvalidKeyId { .. })
        ));
        assert!(matches!(
            AesGcmCodec::new("a b", [0; 32]),
            Err(CodecError::InvalidKeyId { .. })
        ));
        // At most 64 bytes: the limit itself is a key id, one byte more is refused.
        let id = |n| "k".repeat(n);
        assert_eq!(
            AesGcmCodec::new(id(64), [0; 32]).unwrap().current_key_id(),
            id(64)
        );
        assert!(matches!(
            AesGcmCodec::new(id(65), [0; 32]),
            Err(CodecError::InvalidKeyId { key_id }) if key_id == id(65)
        ));
        assert!(matches!(
            AesGcmCodec::from_slice("k", &[0; 16]),
            Err(CodecError::Malformed { .. })
        ));
        assert!(matches!(
            AesGcmCodec::new("k", [0; 32])
                .unwrap()
                .with_old_key("k", [1; 32]),
            Err(CodecError::DuplicateKeyId { .. })
        ));
        let codec = AesGcmCodec::new("k1", [1; 32]).unwrap();
        let clear = Outcome::definitive(200, &json!({"x": 1})).unwrap();
        assert!(matches!(
            codec.decode(&cx, &clear),
            Err(CodecError::NotSealed)
        ));
        assert_eq!(
            codec
                .clone()
                .accept_unsealed(true)
                .decode(&cx, &clear)
                .unwrap(),
            clear.body()
        );
        let bad_nonce = Outcome::definitive(
            200,
            &json!({SEALED_MARKER: {"v": 1, "alg": "A256GCM", "kid": "k1", "nonce": "AAAA", "ct": ""}}),
        )
        .unwrap();
        assert!(matches!(
            codec.decode(&cx, &bad_nonce),
            Err(CodecError::Malformed { .. })
        ));
    }

    /// An envelope of another version of the same algorithm is refused as malformed, not opened
    /// as version 1.
    #[test]
    fn another_envelope_version_is_malformed() {
        let (scope, key) = parts();
        let cx = CodecContext::new(&scope, &key);
        let codec = AesGcmCodec::new("k1", [1; 32]).unwrap();
        let o = Outcome::definitive(200, &json!({"x": 1})).unwrap();
        let sealed = seal(&codec, &cx, &o);
        assert_eq!(codec.decode(&cx, &sealed).unwrap(), o.body());
        let mut envelope: Value = sealed.body_json();
        envelope[SEALED_MARKER]["v"] = json!(2);
        let v2 = Outcome::from_json_text(200, envelope.to_string(), o.class()).unwrap();
        assert!(matches!(
            codec.decode(&cx, &v2),
            Err(CodecError::Malformed { .. })
        ));
    }

    #[test]
    fn debug_shows_key_ids_only() {
        let codec = AesGcmCodec::new("new", [0xAB; 32])
            .unwrap()
            .with_old_key("old", [0xCD; 32])
            .unwrap();
        let shown = format!("{codec:?}");
        assert_eq!(
            shown,
            r#"AesGcmCodec { current: "new", old: ["old"], accept_unsealed: false, .. }"#
        );
        assert!(
            !shown.to_lowercase().contains("ab, ") && !shown.contains("171"),
            "{shown}"
        );
    }
}
