//! Keys for the downstream provider's own idempotency contract ([contract
//! §6](crate::contract#beyond-one-call)).

use sha2::{Digest, Sha256};

use crate::{IdempotencyKey, Scope};

/// A stable key for `provider`'s own idempotency header (Stripe's `Idempotency-Key`, say),
/// derived from (scope, key, provider).
///
/// The provider owns the effect, so it is the one party that can deduplicate it even after idem's
/// lease has elapsed and a second attempt runs. The key is the same on every attempt and every
/// process for the same (scope, key, provider), differs between providers, and reveals neither
/// the scope nor the key: `idem-` followed by 40 hex digits of a SHA-256.
///
/// ```
/// use idem_core::{downstream_key, IdempotencyKey, Scope};
/// let scope = Scope::new("tenant-a/charge").unwrap();
/// let key = IdempotencyKey::new("wf-1:step-2:charge").unwrap();
/// let stripe = downstream_key(&scope, &key, "stripe");
/// assert_eq!(stripe, downstream_key(&scope, &key, "stripe"));
/// assert_ne!(stripe, downstream_key(&scope, &key, "adyen"));
/// assert!(stripe.starts_with("idem-") && stripe.len() == 45);
/// ```
pub fn downstream_key(scope: &Scope, key: &IdempotencyKey, provider: &str) -> String {
    let mut h = Sha256::new();
    for part in ["idem-downstream-v1", scope.as_str(), key.as_str(), provider] {
        // Length-prefixed, so no two lists of parts hash the same bytes.
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    let digest = h.finalize();
    let mut out = String::with_capacity(45);
    out.push_str("idem-");
    for b in &digest[..20] {
        use std::fmt::Write;
        let _ = write!(out, "{b:02x}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stable_per_operation_and_distinct_per_provider_scope_and_key() {
        let scope = Scope::new("t/charge").unwrap();
        let key = IdempotencyKey::new("wf-1:s-1:charge").unwrap();
        let stripe = downstream_key(&scope, &key, "stripe");
        // Stable: the same on every attempt and in every process (a fixed derivation, no state).
        assert_eq!(
            stripe,
            downstream_key(&scope.clone(), &key.clone(), "stripe")
        );
        assert_ne!(stripe, downstream_key(&scope, &key, "adyen"));
        assert_ne!(
            stripe,
            downstream_key(&Scope::new("u/charge").unwrap(), &key, "stripe")
        );
        assert_ne!(
            stripe,
            downstream_key(
                &scope,
                &IdempotencyKey::new("wf-1:s-2:charge").unwrap(),
                "stripe"
            )
        );
        // Length-prefixed parts: moving a boundary changes the key.
        assert_ne!(
            downstream_key(
                &Scope::new("ab").unwrap(),
                &IdempotencyKey::new("c").unwrap(),
                "p"
            ),
            downstream_key(
                &Scope::new("a").unwrap(),
                &IdempotencyKey::new("bc").unwrap(),
                "p"
            )
        );
        // A known value (computed independently) pins the derivation across releases.
        assert_eq!(stripe, "idem-b0d00321a760fa47e06543d8f3ea594aa1c0c818");
        assert!(!stripe.contains("wf-1"), "reveals neither scope nor key");
    }
}
