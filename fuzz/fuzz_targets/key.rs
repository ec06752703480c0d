//! `IdempotencyKey::new` and `IdempotencyKey::for_step` on arbitrary text.
//!
//! An accepted key is exactly the text given, obeys [contract §4](idem_core::contract#refusals),
//! and reads back from its string form, from JSON and from a store (MemoryStore claim then get). A
//! refusal names the rule really broken. `for_step` (the input split at 0xFF bytes into three
//! parts) never refuses non-empty parts, always yields a valid key, and yields the same key for the
//! same parts.
#![no_main]

use idem_core::{IdempotencyKey, KeyError, Scope};
use idem_fuzz::{check_key, check_store_round_trip};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    if let Some(key) = check_key(&text) {
        let scope = Scope::new("fuzz/key").expect("a valid scope");
        check_store_round_trip(&scope, &key);
    }

    let mut parts = data.splitn(3, |&b| b == 0xff).map(String::from_utf8_lossy);
    let (Some(run), Some(step), Some(tool)) = (parts.next(), parts.next(), parts.next()) else {
        return;
    };
    let made = IdempotencyKey::for_step(&run, &step, &tool);
    if run.is_empty() || step.is_empty() || tool.is_empty() {
        assert_eq!(made, Err(KeyError::Empty));
        return;
    }
    let key = made.expect("for_step accepts any non-empty parts");
    assert_eq!(check_key(key.as_str()).as_ref(), Some(&key));
    assert_eq!(
        IdempotencyKey::for_step(&run, &step, &tool).as_ref(),
        Ok(&key)
    );
    // Kept as it is: visible ASCII without ':' and not starting with '~' (a part starting with
    // '~' is always digested, so it can never be taken for a digest: for_step is injective).
    let plain = |p: &str| {
        !p.starts_with('~') && p.bytes().all(|b| idem_fuzz::visible_ascii(b) && b != b':')
    };
    let joined = format!("{run}:{step}:{tool}");
    if plain(&run) && plain(&step) && plain(&tool) && joined.len() <= 255 {
        assert_eq!(key.as_str(), joined);
    } else {
        assert_ne!(
            key.as_str(),
            joined,
            "a part that is not plain must be digested"
        );
    }
});
