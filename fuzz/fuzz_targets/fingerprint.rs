//! `Fingerprint::of` on arbitrary JSON, and `Fingerprint::parse` on arbitrary text.
//!
//! The input is `operation 0xFF json` (or just `json`, with the operation `"op"`). For JSON that
//! parses: a fingerprint is 64 lower-case hex digits that parse back; it is deterministic; the
//! same value written again by serde_json (other white space and number spelling) has the same
//! fingerprint; and JSON that canonicalises is stable: the canonical text parses, canonicalises
//! to itself and fingerprint(parse(canonical)) == fingerprint(original).
#![no_main]

use idem_core::{Fingerprint, canonical_json};
use idem_fuzz::check_fingerprint;
use libfuzzer_sys::fuzz_target;
use serde_json::Value;

fuzz_target!(|data: &[u8]| {
    if let Ok(parsed) = Fingerprint::parse(&String::from_utf8_lossy(data)) {
        assert_eq!(parsed.as_str().as_bytes(), data);
        check_fingerprint(&parsed);
    }

    let (operation, json) = match data.iter().position(|&b| b == 0xff) {
        Some(i) => (String::from_utf8_lossy(&data[..i]), &data[i + 1..]),
        None => ("op".into(), data),
    };
    let Ok(value) = serde_json::from_slice::<Value>(json) else {
        return;
    };
    let Ok(fingerprint) = Fingerprint::of(&operation, &value) else {
        // A refusal is a refusal every time.
        assert!(Fingerprint::of(&operation, &value.clone()).is_err());
        return;
    };
    check_fingerprint(&fingerprint);
    assert_eq!(
        Fingerprint::of(&operation, &value.clone()).ok().as_ref(),
        Some(&fingerprint)
    );

    let rewritten = serde_json::to_string(&value).expect("a parsed value serialises");
    let reparsed: Value = serde_json::from_str(&rewritten).expect("serde_json reads its own text");
    assert_eq!(
        Fingerprint::of(&operation, &reparsed).ok().as_ref(),
        Some(&fingerprint),
        "the same value written again: {rewritten}"
    );

    if let Ok(canonical) = canonical_json(&value) {
        let again: Value = serde_json::from_str(&canonical).expect("canonical JSON parses");
        assert_eq!(
            canonical_json(&again).ok().as_deref(),
            Some(canonical.as_str()),
            "canonicalisation is idempotent"
        );
        assert_eq!(
            Fingerprint::of(&operation, &again).ok().as_ref(),
            Some(&fingerprint),
            "fingerprint(parse(canonical)) == fingerprint(original): {canonical}"
        );
    }
});
