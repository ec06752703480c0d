//! What the fuzz targets share: the properties every accepted value must keep ("no
//! accepted-then-unreadable value"), and a small runtime to drive the async store and layer.
//!
//! Each `check_*` function panics (which libFuzzer reports as a crash) when a property breaks.

use std::cell::RefCell;
use std::future::Future;

use idem_core::{
    Fingerprint, IdempotencyKey, KeyError, KeyStore, MemoryStore, Policy, RecordId, RecordState,
    Scope, ScopeError, Timestamp,
};

thread_local! {
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

/// Runs `future` to completion on one current-thread tokio runtime kept for the whole process
/// (libFuzzer calls the target from one thread).
pub fn block_on<F: Future>(future: F) -> F::Output {
    RUNTIME.with(|cell| {
        let mut slot = cell.borrow_mut();
        let runtime = slot.get_or_insert_with(|| {
            tokio::runtime::Builder::new_current_thread()
                .build()
                .expect("a current-thread runtime")
        });
        runtime.block_on(future)
    })
}

/// Whether `b` is visible ASCII, the only bytes a key may hold ([contract
/// §4](idem_core::contract#refusals)).
pub fn visible_ascii(b: u8) -> bool {
    (0x21..=0x7e).contains(&b)
}

/// `IdempotencyKey::new(text)`, checked: an accepted key is exactly `text`, obeys [contract
/// §4](idem_core::contract#refusals) and reads back from its string form and from JSON; a refusal
/// names the rule `text` really breaks.
pub fn check_key(text: &str) -> Option<IdempotencyKey> {
    match IdempotencyKey::new(text) {
        Ok(key) => {
            assert_eq!(key.as_str(), text);
            assert!(!text.is_empty() && text.len() <= IdempotencyKey::MAX_BYTES);
            assert!(text.bytes().all(visible_ascii), "accepted {text:?}");
            assert_eq!(key.to_string().parse::<IdempotencyKey>().as_ref(), Ok(&key));
            let json = serde_json::to_string(&key).expect("a key serialises");
            let back: IdempotencyKey = serde_json::from_str(&json).expect("a key reads back");
            assert_eq!(back, key);
            Some(key)
        }
        Err(KeyError::Empty) => {
            assert!(text.is_empty());
            None
        }
        Err(KeyError::TooLong { len }) => {
            assert_eq!(len, text.len());
            assert!(len > IdempotencyKey::MAX_BYTES);
            None
        }
        Err(KeyError::InvalidCharacter { index, byte }) => {
            assert!(!text.is_empty() && text.len() <= IdempotencyKey::MAX_BYTES);
            assert_eq!(text.as_bytes()[index], byte);
            assert!(!visible_ascii(byte));
            assert!(text.as_bytes()[..index].iter().all(|&b| visible_ascii(b)));
            None
        }
        Err(other) => panic!("unexpected key error {other:?} for {text:?}"),
    }
}

/// `Scope::new(text)`, checked: an accepted scope is exactly `text`, obeys its rules and is
/// accepted again from its own string form and from JSON; a refusal names the rule broken.
pub fn check_scope(text: &str) -> Option<Scope> {
    match Scope::new(text) {
        Ok(scope) => {
            assert_eq!(scope.as_str(), text);
            assert!(!text.is_empty() && text.len() <= Scope::MAX_BYTES);
            assert!(!text.chars().any(char::is_control), "accepted {text:?}");
            assert_eq!(Scope::new(scope.as_str()).as_ref(), Ok(&scope));
            assert_eq!(scope.to_string().parse::<Scope>().as_ref(), Ok(&scope));
            let json = serde_json::to_string(&scope).expect("a scope serialises");
            let back: Scope = serde_json::from_str(&json).expect("a scope reads back");
            assert_eq!(back, scope);
            Some(scope)
        }
        Err(ScopeError::Empty) => {
            assert!(text.is_empty());
            None
        }
        Err(ScopeError::TooLong { len }) => {
            assert_eq!(len, text.len());
            assert!(len > Scope::MAX_BYTES);
            None
        }
        Err(ScopeError::ControlCharacter { index }) => {
            assert!(!text.is_empty() && text.len() <= Scope::MAX_BYTES);
            let c = text[index..].chars().next().expect("a character at index");
            assert!(c.is_control());
            assert!(!text[..index].chars().any(char::is_control));
            None
        }
        Err(other) => panic!("unexpected scope error {other:?} for {text:?}"),
    }
}

/// A fingerprint's text: 64 lower-case hex digits, parsed back to the same value, through JSON
/// too.
pub fn check_fingerprint(fingerprint: &Fingerprint) {
    let text = fingerprint.as_str();
    assert_eq!(text.len(), 64, "{text:?}");
    assert!(
        text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')),
        "{text:?}"
    );
    assert_eq!(Fingerprint::parse(text).ok().as_ref(), Some(fingerprint));
    let json = serde_json::to_string(fingerprint).expect("a fingerprint serialises");
    let back: Fingerprint = serde_json::from_str(&json).expect("a fingerprint reads back");
    assert_eq!(&back, fingerprint);
}

/// Writes a record for (scope, key) in a fresh [`MemoryStore`] and reads it back: the store
/// addresses it by exactly that scope and key, and the record survives a JSON round trip.
pub fn check_store_round_trip(scope: &Scope, key: &IdempotencyKey) {
    let store = MemoryStore::new();
    let fingerprint = Fingerprint::of_bytes(key.as_str().as_bytes());
    let now = Timestamp::from_millis(1_000_000);
    let id = RecordId::new(scope.clone(), key.clone());
    block_on(async {
        let policy = Policy::default();
        store
            .claim(&id, &fingerprint, &policy, now)
            .await
            .expect("a memory store claims");
        let record = store
            .get(&id, now)
            .await
            .expect("a memory store reads")
            .expect("the record just claimed");
        assert_eq!(record.id(), id);
        assert_eq!((&record.scope, &record.key), (scope, key));
        assert_eq!(record.fingerprint, fingerprint);
        assert_eq!(record.state, RecordState::Processing);
        let json = serde_json::to_string(&record).expect("a record serialises");
        let back: idem_core::Record = serde_json::from_str(&json).expect("a record reads back");
        assert_eq!(back, record);
    });
}
