//! Task ids: the tool and the key of a task's record, sealed for the principal whose it is.
//!
//! An id is `t1.` and the unpadded base64url of a 12-byte nonce and the AES-256-GCM ciphertext
//! of the tool's name and the key, with the principal as associated data. The nonce is a keyed
//! hash (HMAC-SHA-256) of the principal and that text, a synthetic IV: the same call always gets
//! the same id, from any replica that holds the secret, and nothing else repeats a nonce. Only
//! the principal that the id was sealed for opens it: another's `tasks/get` finds no task.

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Key};
use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use idem_core::IdempotencyKey;
use sha2::Sha256;

const PREFIX: &str = "t1.";
const NONCE_LEN: usize = 12;

/// Seals and opens task ids with keys derived from one 32-byte secret.
pub(crate) struct TaskIds {
    cipher: Aes256Gcm,
    nonce_key: [u8; 32],
}

/// HMAC-SHA-256 of `parts` under `key`, each part length-prefixed.
fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    for part in parts {
        mac.update(&(part.len() as u64).to_be_bytes());
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

impl TaskIds {
    /// Ids under `secret`: every replica that serves the same tasks holds the same one.
    pub(crate) fn new(secret: [u8; 32]) -> Self {
        let cipher_key = mac(&secret, &[b"idem-mcp task id: cipher"]);
        let nonce_key = mac(&secret, &[b"idem-mcp task id: nonce"]);
        Self {
            cipher: Aes256Gcm::new(&Key::<Aes256Gcm>::from(cipher_key)),
            nonce_key,
        }
    }

    /// The id of the task of `tool` under `key`, for `principal`.
    pub(crate) fn seal(&self, principal: &str, tool: &str, key: &IdempotencyKey) -> String {
        let plain = plaintext(tool, key.as_str());
        let digest = mac(&self.nonce_key, &[principal.as_bytes(), &plain]);
        let mut nonce = [0u8; NONCE_LEN];
        nonce.copy_from_slice(&digest[..NONCE_LEN]);
        let sealed = self
            .cipher
            .encrypt(
                &nonce.into(),
                Payload {
                    msg: &plain,
                    aad: principal.as_bytes(),
                },
            )
            .unwrap_or_else(|_| unreachable!("a tool name and a key are far below GCM's limit"));
        let mut bytes = Vec::with_capacity(NONCE_LEN + sealed.len());
        bytes.extend_from_slice(&nonce);
        bytes.extend_from_slice(&sealed);
        format!("{PREFIX}{}", B64.encode(bytes))
    }

    /// The tool and the key `id` names, if it was sealed for `principal` under this secret.
    pub(crate) fn open(&self, principal: &str, id: &str) -> Option<(String, IdempotencyKey)> {
        let bytes = B64.decode(id.strip_prefix(PREFIX)?).ok()?;
        let (nonce, sealed) = bytes.split_first_chunk::<NONCE_LEN>()?;
        let plain = self
            .cipher
            .decrypt(
                &(*nonce).into(),
                Payload {
                    msg: sealed,
                    aad: principal.as_bytes(),
                },
            )
            .ok()?;
        let (len, rest) = plain.split_first_chunk::<2>()?;
        let (tool, key) = rest.split_at_checked(usize::from(u16::from_be_bytes(*len)))?;
        let tool = String::from_utf8(tool.to_vec()).ok()?;
        let key = IdempotencyKey::from_stored(String::from_utf8(key.to_vec()).ok()?).ok()?;
        Some((tool, key))
    }
}

/// The sealed text: the tool's name, length-prefixed, then the key.
fn plaintext(tool: &str, key: &str) -> Vec<u8> {
    let len = u16::try_from(tool.len()).unwrap_or(u16::MAX);
    let mut plain = Vec::with_capacity(2 + tool.len() + key.len());
    plain.extend_from_slice(&len.to_be_bytes());
    plain.extend_from_slice(&tool.as_bytes()[..usize::from(len)]);
    plain.extend_from_slice(key.as_bytes());
    plain
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> IdempotencyKey {
        IdempotencyKey::new(s).unwrap()
    }

    #[test]
    fn the_same_call_gets_the_same_id_and_only_its_principal_opens_it() {
        let ids = TaskIds::new([7; 32]);
        let id = ids.seal("tenant-a", "create_ticket", &key("order-42"));
        assert_eq!(id, ids.seal("tenant-a", "create_ticket", &key("order-42")));
        // Another replica with the same secret: the same id, and it opens.
        let replica = TaskIds::new([7; 32]);
        assert_eq!(
            replica.open("tenant-a", &id),
            Some(("create_ticket".to_owned(), key("order-42")))
        );
        // Another principal, another secret, a changed byte: no task.
        assert_eq!(ids.open("tenant-b", &id), None);
        assert_eq!(TaskIds::new([8; 32]).open("tenant-a", &id), None);
        let mut bytes = B64.decode(&id[PREFIX.len()..]).unwrap();
        *bytes.last_mut().unwrap() ^= 1;
        assert_eq!(
            ids.open("tenant-a", &format!("{PREFIX}{}", B64.encode(bytes))),
            None
        );
        assert_eq!(ids.open("tenant-a", "t1."), None);
        assert_eq!(ids.open("tenant-a", "not-an-id"), None);
    }

    #[test]
    fn ids_are_opaque_and_differ_per_principal_tool_and_key() {
        let ids = TaskIds::new([7; 32]);
        let id = ids.seal("tenant-a", "create_ticket", &key("order-42"));
        assert!(!id.contains("order") && !id.contains("tenant") && !id.contains("ticket"));
        let others = [
            ids.seal("tenant-b", "create_ticket", &key("order-42")),
            ids.seal("tenant-a", "refund", &key("order-42")),
            ids.seal("tenant-a", "create_ticket", &key("order-43")),
        ];
        for other in others {
            assert_ne!(id[..PREFIX.len() + 16], other[..PREFIX.len() + 16]);
        }
    }
}
