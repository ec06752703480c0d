//! Fingerprints and canonical JSON: RFC 8785 vectors, known fingerprints, properties.

use super::canonical::utf16_cmp;
use super::*;
use serde_json::{Value, json};

fn jcs(text: &str) -> String {
    canonical_json(&serde_json::from_str::<Value>(text).unwrap()).unwrap()
}

// RFC 8785 §3.2.2 and appendix examples.
#[test]
fn rfc8785_primitive_and_number_example() {
    let input = r#"{
      "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
      "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
      "literals": [null, true, false]
    }"#;
    assert_eq!(
        jcs(input),
        r#"{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}"#
    );
}

#[test]
fn rfc8785_property_sorting_by_utf16_code_units() {
    let input = r#"{
      "\u20ac": "Euro Sign",
      "\r": "Carriage Return",
      "\ufb33": "Hebrew Letter Dalet With Dagesh",
      "1": "One",
      "\ud83d\ude00": "Emoji: Grinning Face",
      "\u0080": "Control",
      "\u00f6": "Latin Small Letter O With Diaeresis"
    }"#;
    assert_eq!(
        jcs(input),
        "{\"\\r\":\"Carriage Return\",\"1\":\"One\",\"\u{80}\":\"Control\",\"ö\":\"Latin Small Letter O With Diaeresis\",\"€\":\"Euro Sign\",\"😀\":\"Emoji: Grinning Face\",\"\u{fb33}\":\"Hebrew Letter Dalet With Dagesh\"}"
    );
}

#[test]
fn rfc8785_number_serialization_samples() {
    // From RFC 8785 appendix B (IEEE-754 → ECMAScript text).
    assert_eq!(
        jcs("[1e21, 1e-7, -0.0, 1e20, 5e-324]"),
        "[1e+21,1e-7,0,100000000000000000000,5e-324]"
    );
}

#[test]
fn key_order_and_whitespace_do_not_matter() {
    let a = Fingerprint::of("t", &json!({"a": 1, "b": [1, 2, {"c": "d"}]})).unwrap();
    let b: Value = serde_json::from_str("{\"b\":[1,2,{ \"c\" : \"d\" }],\n \"a\":1}").unwrap();
    assert_eq!(a, Fingerprint::of("t", &b).unwrap());
    assert_ne!(
        a,
        Fingerprint::of("t", &json!({"a": 2, "b": [1, 2, {"c": "d"}]})).unwrap()
    );
    assert_eq!(a.as_str().len(), 64);
    assert_eq!(a.short().len(), 12);
}

fn canonical_request(operation: &str, arguments: &Value) -> Result<String, FingerprintError> {
    canonical_json(&json!({ "arguments": arguments, "operation": operation }))
}

#[test]
fn known_vector() {
    // sha256 of the empty string.
    assert_eq!(
        Fingerprint::of_bytes(b"").as_str(),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
    assert_eq!(
        canonical_request("op", &json!({"z": 1, "a": true})).unwrap(),
        r#"{"arguments":{"a":true,"z":1},"operation":"op"}"#
    );
}

fn fp(args: Value) -> Fingerprint {
    Fingerprint::of("charge", &args).unwrap()
}

#[test]
fn integers_beyond_a_doubles_precision_keep_their_digits() {
    let two53 = 1u64 << 53;
    let pairs: [(Value, Value); 6] = [
        (json!({"id": two53}), json!({"id": two53 + 1})),
        (json!({"id": i64::MAX}), json!({"id": i64::MAX - 1})),
        (json!({"id": u64::MAX}), json!({"id": u64::MAX - 1})),
        (
            json!({"id": -(two53 as i64)}),
            json!({"id": -(two53 as i64) - 1}),
        ),
        (json!({"id": i64::MIN}), json!({"id": i64::MIN + 1})),
        (json!([two53 + 1]), json!([two53])),
    ];
    for (a, b) in pairs {
        // Under plain JCS (doubles) each pair collides: that was the bug.
        assert_eq!(
            serde_json_canonicalizer::to_string(&a).unwrap(),
            serde_json_canonicalizer::to_string(&b).unwrap()
        );
        assert_ne!(
            fp(a.clone()),
            fp(b.clone()),
            "{a} and {b} share a fingerprint"
        );
    }
    assert_eq!(
        canonical_json(
            &json!({"b": u64::MAX, "a": [9007199254740993u64, i64::MAX, -9007199254740993i64]})
        )
        .unwrap(),
        r#"{"a":[9007199254740993,9223372036854775807,-9007199254740993],"b":18446744073709551615}"#
    );
    // Parsed from text, as a request body is.
    let text = |t: &str| fp(serde_json::from_str(t).unwrap());
    assert_ne!(
        text(r#"{"id":9007199254740993}"#),
        text(r#"{"id":9007199254740992}"#)
    );
    // Integers a double holds exactly are written as JCS writes them.
    assert_eq!(
        text(r#"{"id":9007199254740992}"#),
        text(r#"{"id":9007199254740992.0}"#)
    );
    assert_eq!(
        text(r#"{"id":-9223372036854775808}"#),
        fp(json!({"id": i64::MIN}))
    );
    assert_eq!(
        text(r#"{"id":4611686018427387904}"#),
        text(r#"{"id":4.611686018427387904e18}"#)
    );
}

#[test]
fn one_and_one_point_zero_and_key_order_stay_the_same_request() {
    let a = fp(serde_json::from_str(r#"{"amount": 1, "n": {"y": 2, "x": -0.0}}"#).unwrap());
    let b = fp(serde_json::from_str(r#"{"n": {"x": 0, "y": 2.0}, "amount": 1.0}"#).unwrap());
    assert_eq!(a, b);
    assert_eq!(fp(json!({"amount": 1e2})), fp(json!({"amount": 100})));
}

/// Fingerprints made before the exact-integer rule: records stored with them must still match.
#[test]
fn fingerprints_of_ordinary_requests_are_unchanged() {
    let pinned = [
        (
            "create_ticket",
            json!({"title": "Printer on fire", "account_id": "A-7"}),
            "825b18a527e4da5c35ff0b4552bb88af6a1bad688e8666988fb447da35d29a57",
        ),
        (
            "charge",
            json!({"amount": 500, "currency": "EUR", "ids": [1, 2.5, -3, 9007199254740992u64], "nested": {"b": null, "a": true}}),
            "6756d801edec345f4501a677fc375938c8c3e693c8e17d43a71e3acc582c2d7a",
        ),
        (
            "POST /tools/charge",
            json!({"amount": 1.0e21, "tiny": 1e-7, "neg": -0.0, "unicode": "é😀"}),
            "3c049c8ec14307279043f9905650d56e32e3dd1841fb4b63b795b676d9df40e3",
        ),
        (
            "op",
            json!([]),
            "c2f35b531bf5c06b9b8e7f76135e7ee8f7d7eb905a9377e73b15d4ab67327898",
        ),
        (
            "op",
            json!(i64::MIN),
            "cdbc439e4b663006938ef6e3ebb1ea749186c016f1b34b2a937aa83672ef8bf1",
        ),
    ];
    for (op, args, hex) in pinned {
        assert_eq!(
            Fingerprint::of(op, &args).unwrap().as_str(),
            hex,
            "{op} {args}"
        );
    }
}

#[test]
fn the_hash_is_of_the_canonical_request_text() {
    for (op, args) in [
        ("op", json!({"z": 1, "a": true})),
        (
            "POST /x?a=%22",
            json!([{"\u{e000}": 1, "😀": [2.5, null, "\u{1}"]}]),
        ),
        ("\"quoted\" \\ op", json!(u64::MAX)),
    ] {
        let text = canonical_request(op, &args).unwrap();
        assert_eq!(
            Fingerprint::of_value(op, &args).unwrap(),
            Fingerprint::of_bytes(text.as_bytes())
        );
    }
}

proptest::proptest! {
    /// The byte-wise comparison orders names as their UTF-16 code units do.
    #[test]
    fn utf16_order(
        a in "[a\u{7f}\u{80}é\u{d7ff}\u{e000}\u{fb33}\u{ffff}😀\u{10000}\u{10ffff}]{0,4}",
        b in "[a\u{7f}\u{80}é\u{d7ff}\u{e000}\u{fb33}\u{ffff}😀\u{10000}\u{10ffff}]{0,4}",
        prefix in "[aé😀\u{ffff}]{0,2}",
    ) {
        let (a, b) = (format!("{prefix}{a}"), format!("{prefix}{b}"));
        proptest::prop_assert_eq!(utf16_cmp(&a, &b), a.encode_utf16().cmp(b.encode_utf16()));
    }

    /// Away from the exact-integer rule, the canonical text is RFC 8785's, byte for byte.
    #[test]
    fn agrees_with_jcs_where_doubles_are_exact(
        ints in proptest::collection::vec(-(1i64 << 53)..=(1i64 << 53), 0..6),
        floats in proptest::collection::vec(proptest::num::f64::NORMAL, 0..6),
        names in proptest::collection::vec("[a-zé😀\\\"]{0,4}", 0..6),
    ) {
        let mut obj = serde_json::Map::new();
        for (i, name) in names.iter().enumerate() {
            obj.insert(name.clone(), json!([ints.get(i), floats.get(i), name]));
        }
        let v = json!({"o": obj, "i": ints, "f": floats});
        proptest::prop_assert_eq!(canonical_json(&v).unwrap(), serde_json_canonicalizer::to_string(&v).unwrap());
    }
}

#[test]
fn parse_round_trips_and_refuses_garbage() {
    let f = Fingerprint::of_bytes(b"x");
    assert_eq!(Fingerprint::parse(f.as_str()).unwrap(), f);
    assert!(Fingerprint::parse("ABC").is_err());
    assert!(Fingerprint::parse(&"G".repeat(64)).is_err());
}
