//! `Scope::new` and `Scope::from_parts` on arbitrary text.
//!
//! The first byte picks the entry point. `Scope::new`: an accepted scope is exactly the text,
//! obeys its rules, is accepted again from its own string form and from JSON, and addresses a
//! store record. `Scope::from_parts` (parts split at 0xFF bytes): an accepted scope is accepted
//! again by `Scope::new` from its string form, and decodes back to exactly the parts given, so no
//! two different lists of parts share a scope.
#![no_main]

use idem_core::{IdempotencyKey, Scope, ScopeError};
use idem_fuzz::{check_scope, check_store_round_trip};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    if mode & 1 == 0 {
        let text = String::from_utf8_lossy(rest);
        if let Some(scope) = check_scope(&text) {
            let key = IdempotencyKey::new("fuzz-key").expect("a valid key");
            check_store_round_trip(&scope, &key);
        }
        return;
    }
    let parts: Vec<String> = rest
        .split(|&b| b == 0xff)
        .map(|p| String::from_utf8_lossy(p).into_owned())
        .collect();
    match Scope::from_parts(&parts) {
        Ok(scope) => {
            assert_eq!(check_scope(scope.as_str()).as_ref(), Some(&scope));
            let decoded: Vec<String> = scope.as_str().split('/').map(percent_decode).collect();
            assert_eq!(decoded, parts, "scope {:?}", scope.as_str());
        }
        Err(ScopeError::Empty) => assert!(parts.len() == 1 && parts[0].is_empty()),
        Err(ScopeError::TooLong { len }) => assert!(len > idem_core::Scope::MAX_BYTES),
        Err(ScopeError::ControlCharacter { .. }) => {
            assert!(parts.iter().any(|p| p.chars().any(char::is_control)))
        }
        Err(other) => panic!("unexpected scope error {other:?}"),
    }
});

/// Decodes the two escapes `Scope::from_parts` writes (`%25`, `%2F`), left to right.
fn percent_decode(part: &str) -> String {
    let mut out = String::with_capacity(part.len());
    let mut rest = part;
    while let Some(i) = rest.find('%') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("%25") {
            out.push('%');
            rest = after;
        } else if let Some(after) = tail.strip_prefix("%2F") {
            out.push('/');
            rest = after;
        } else {
            panic!("a bare '%' in an escaped part: {part:?}");
        }
    }
    out.push_str(rest);
    out
}
