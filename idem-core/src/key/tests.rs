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
    let k = IdempotencyKey::for_step(&"a".repeat(120), &"b".repeat(120), &"c".repeat(20)).unwrap();
    assert_eq!(k.as_str().matches('~').count(), 3);
}

/// A step key whose plain parts join to exactly the 255 bytes a key may hold is kept in clear;
/// one byte more and every part is digested.
#[test]
fn a_step_key_of_exactly_the_limit_is_kept_in_clear() {
    let (run, step) = ("r".repeat(126), "s".repeat(126));
    let k = IdempotencyKey::for_step(&run, &step, "t").unwrap();
    assert_eq!(k.as_str().len(), 255);
    assert_eq!(k.as_str(), format!("{run}:{step}:t"));
    let k = IdempotencyKey::for_step(&run, &step, "tt").unwrap();
    assert_eq!(k.as_str().matches('~').count(), 3, "{}", k.as_str());
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
    let scope = Scope::from_parts(["a%b", "c/d"]).unwrap();
    assert_eq!(scope.as_str(), "a%25b/c%2Fd");
    // Written (logs, `idem keys ls`) as its text, and read back from it.
    assert_eq!(scope.to_string(), "a%25b/c%2Fd");
    assert_eq!(scope.to_string().parse::<Scope>().unwrap(), scope);
}

/// A key is written (logs, headers, `idem keys ls`) as the text it was made from, and read back
/// from that text; an origin is written as its label.
#[test]
fn a_key_and_its_origin_are_written_as_their_text() {
    let key = IdempotencyKey::new("wf-8812:step-3").unwrap();
    assert_eq!(key.to_string(), "wf-8812:step-3");
    assert_eq!(key.to_string().parse::<IdempotencyKey>().unwrap(), key);
    for origin in [
        KeyOrigin::Sent,
        KeyOrigin::Arguments,
        KeyOrigin::ModelArgument,
        KeyOrigin::Request,
    ] {
        assert_eq!(origin.to_string(), origin.as_str());
    }
    assert_eq!(KeyOrigin::ModelArgument.to_string(), "model_argument");
}

#[test]
fn a_model_argument_that_fits_with_its_prefix_is_kept_as_it_is() {
    // 7 bytes of prefix and 200 of value fit in 255: kept in clear, not digested.
    let value = "v".repeat(200);
    let key = IdempotencyKey::from_model_argument(&value).unwrap();
    assert_eq!(key.as_str(), format!("model: {value}"));
    // One byte more than fits is digested.
    let long = "v".repeat(255 - 7 + 1);
    let key = IdempotencyKey::from_model_argument(&long).unwrap();
    assert!(
        key.as_str().starts_with("model: sha256 "),
        "{}",
        key.as_str()
    );
}
