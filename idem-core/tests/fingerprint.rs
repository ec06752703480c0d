//! The fingerprint never changes for any input: it is part of every stored record, so a changed
//! value would turn every retry after an upgrade into a 422.
//!
//! `reference` is the implementation as it was before the fingerprint was optimised (canonical
//! text built in a `String` through `serde_json_canonicalizer`, one leaf at a time, then hashed),
//! kept verbatim as the oracle. The crate's `Fingerprint::of`, `Fingerprint::of_value` and
//! `canonical_json` must agree with it on a varied fixed corpus (whose digest is pinned too, so
//! the oracle itself cannot drift) and on random values.

use idem_core::{Fingerprint, canonical_json};
use proptest::prelude::*;
use serde_json::{Map, Number, Value, json};
use sha2::{Digest, Sha256};

/// The implementation before the optimisation, verbatim but for names.
mod reference {
    use serde_json::Value;

    pub fn canonical_json(value: &Value) -> String {
        let mut out = String::new();
        write_canonical(value, &mut out);
        out
    }

    fn write_canonical(value: &Value, out: &mut String) {
        let leaf = |v: &Value, out: &mut String| {
            out.push_str(&serde_json_canonicalizer::to_string(v).unwrap());
        };
        match value {
            Value::Number(n) => match exact_integer(n) {
                Some(digits) => out.push_str(&digits),
                None => leaf(value, out),
            },
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write_canonical(item, out);
                }
                out.push(']');
            }
            Value::Object(members) => {
                let mut sorted: Vec<_> = members.iter().collect();
                sorted.sort_by(|(a, _), (b, _)| a.encode_utf16().cmp(b.encode_utf16()));
                out.push('{');
                for (i, (name, member)) in sorted.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    leaf(&Value::String(name.clone()), out);
                    out.push(':');
                    write_canonical(member, out);
                }
                out.push('}');
            }
            Value::Null | Value::Bool(_) | Value::String(_) => leaf(value, out),
        }
    }

    fn exact_integer(n: &serde_json::Number) -> Option<String> {
        let exact = |v: i128| {
            let d = v as f64;
            (d as i128 != v).then(|| v.to_string())
        };
        if let Some(v) = n.as_u64() {
            exact(i128::from(v))
        } else {
            n.as_i64().and_then(|v| exact(i128::from(v)))
        }
    }

    pub fn fingerprint(operation: &str, arguments: &Value) -> String {
        let canonical =
            canonical_json(&serde_json::json!({ "arguments": arguments, "operation": operation }));
        let digest = sha2::Sha256::digest(canonical.as_bytes());
        let mut hex = String::with_capacity(64);
        for b in digest {
            use std::fmt::Write;
            let _ = write!(hex, "{b:02x}");
        }
        hex
    }

    use sha2::Digest;
}

/// SplitMix64: a fixed, dependency-free sequence, so the corpus is the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Characters that canonicalisation treats specially: escapes, control characters, DEL, the
/// solidus, multi-byte UTF-8, the private-use and last BMP characters (U+E000–U+FFFF, which
/// sort after surrogate pairs in UTF-16), supplementary characters, line separators.
const CHARS: &[char] = &[
    'a',
    'b',
    'z',
    'A',
    'Z',
    '0',
    '9',
    ' ',
    '_',
    '-',
    '"',
    '\\',
    '/',
    '\u{0}',
    '\u{1}',
    '\u{8}',
    '\t',
    '\n',
    '\u{b}',
    '\u{c}',
    '\r',
    '\u{f}',
    '\u{1f}',
    '\u{7f}',
    '\u{80}',
    'é',
    'ö',
    '€',
    '\u{2028}',
    '\u{d7ff}',
    '\u{e000}',
    '\u{fb33}',
    '\u{fffd}',
    '\u{ffff}',
    '😀',
    '\u{10000}',
    '\u{10ffff}',
];

fn string(rng: &mut Rng) -> String {
    let len = rng.below(7);
    (0..len).map(|_| *rng.pick(CHARS)).collect()
}

fn number(rng: &mut Rng) -> Value {
    let two53 = 1i64 << 53;
    match rng.below(12) {
        0 => json!(rng.below(1000)),
        1 => json!(-(rng.below(1000) as i64)),
        2 => json!(two53 - 2 + rng.below(5) as i64),
        3 => json!(-two53 + 2 - rng.below(5) as i64),
        4 => json!(*rng.pick(&[i64::MIN, i64::MIN + 1, i64::MAX, i64::MAX - 1, 0, -1])),
        5 => json!(*rng.pick(&[
            u64::MAX,
            u64::MAX - 1,
            1u64 << 60,
            1u64 << 63,
            (1u64 << 63) + 1
        ])),
        6 => json!(rng.next()),
        7 => json!(rng.next() as i64),
        8 => {
            // Any finite double, from its bits.
            loop {
                let f = f64::from_bits(rng.next());
                if f.is_finite() {
                    break json!(f);
                }
            }
        }
        9 => json!(*rng.pick(&[
            0.0,
            -0.0,
            1.0,
            -1.0,
            0.1,
            0.5,
            4.5,
            1e21,
            1e20,
            1e-7,
            1e-6,
            5e-324,
            1e30,
            2e-3,
            333_333_333.333_333_3,
            9_007_199_254_740_993.0,
            1.797_693_134_862_315_7e308,
            1e23,
            123_456_789.0,
            100.0,
        ])),
        10 => json!((rng.below(2_000_000) as f64 - 1_000_000.0) / 64.0),
        _ => json!((rng.next() >> 11) as f64 * 10f64.powi(rng.below(40) as i32 - 20)),
    }
}

fn value(rng: &mut Rng, depth: u32) -> Value {
    let kinds = if depth == 0 { 5 } else { 7 };
    match rng.below(kinds) {
        0 => Value::Null,
        1 => Value::Bool(rng.below(2) == 1),
        2 | 3 => number(rng),
        4 => Value::String(string(rng)),
        5 => Value::Array((0..rng.below(5)).map(|_| value(rng, depth - 1)).collect()),
        _ => {
            let mut map = Map::new();
            for _ in 0..rng.below(6) {
                map.insert(string(rng), value(rng, depth - 1));
            }
            Value::Object(map)
        }
    }
}

/// 2000 (operation, arguments) pairs from a fixed seed, plus hand-picked edge cases.
fn corpus() -> Vec<(String, Value)> {
    let mut rng = Rng(0x1de3_f1a9_e2c4_0001);
    let mut out: Vec<(String, Value)> = (0..2000)
        .map(|i| {
            let operation = match i % 4 {
                0 => "create_ticket".to_owned(),
                1 => format!("POST /tools/{}", string(&mut rng)),
                2 => string(&mut rng),
                _ => format!("POST /t?{}", string(&mut rng)),
            };
            (operation, value(&mut rng, 4))
        })
        .collect();
    let edge = [
        json!(null),
        json!({}),
        json!([]),
        json!(""),
        json!({"": ""}),
        json!({"\u{e000}": 1, "😀": 2, "\u{ffff}": 3, "\u{10000}": 4, "a": 5}),
        json!({"b": {"b": {"a": [[], {}, [[]]]}}}),
        json!([
            i64::MIN,
            u64::MAX,
            9_007_199_254_740_993u64,
            -9_007_199_254_740_993i64
        ]),
    ];
    out.extend(edge.into_iter().map(|v| ("op".to_owned(), v)));
    out
}

#[test]
fn the_corpus_fingerprints_as_before() {
    let mut all = Sha256::new();
    let mut texts = Sha256::new();
    for (operation, arguments) in corpus() {
        let expected = reference::fingerprint(&operation, &arguments);
        assert_eq!(
            Fingerprint::of(&operation, &arguments).unwrap().as_str(),
            expected,
            "{operation:?} {arguments}"
        );
        assert_eq!(
            Fingerprint::of_value(&operation, &arguments)
                .unwrap()
                .as_str(),
            expected,
            "{operation:?} {arguments}"
        );
        let text = canonical_json(&arguments).unwrap();
        assert_eq!(text, reference::canonical_json(&arguments), "{arguments}");
        all.update(expected.as_bytes());
        all.update(b"\n");
        texts.update(text.as_bytes());
        texts.update(b"\n");
    }
    // Pinned when the corpus was written (against the implementation before the optimisation):
    // the oracle and the corpus generator cannot drift either.
    let hex = |d: &[u8]| d.iter().map(|b| format!("{b:02x}")).collect::<String>();
    assert_eq!(
        hex(&all.finalize()),
        "296952d19af5900cb22058d7c6637c217217f280b3ec88516d0dfcbce353e0ae",
        "digest of the corpus's fingerprints"
    );
    assert_eq!(
        hex(&texts.finalize()),
        "c0b20ded7337cc8472e438673137b8b4ce63bf990c0bce054e02d65ad6a162e9",
        "digest of the corpus's canonical texts"
    );
}

fn arb_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-(1i64 << 54)..(1i64 << 54)).prop_map(Value::from),
        any::<f64>()
            .prop_filter_map("finite", Number::from_f64)
            .prop_map(Value::Number),
        proptest::num::f64::NORMAL.prop_map(Value::from),
    ]
}

fn arb_string() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::collection::vec(proptest::sample::select(CHARS), 0..8)
            .prop_map(|cs| cs.into_iter().collect()),
        any::<String>(),
    ]
}

fn arb_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        arb_number(),
        arb_string().prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((arb_string(), inner), 0..6)
                .prop_map(|members| Value::Object(members.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn agrees_with_the_implementation_before(operation in arb_string(), arguments in arb_value()) {
        let expected = reference::fingerprint(&operation, &arguments);
        prop_assert_eq!(Fingerprint::of(&operation, &arguments).unwrap().to_string(), expected.clone());
        prop_assert_eq!(Fingerprint::of_value(&operation, &arguments).unwrap().to_string(), expected);
        prop_assert_eq!(canonical_json(&arguments).unwrap(), reference::canonical_json(&arguments));
    }

    /// The same value parsed back from its serde_json text (a request body) fingerprints the same.
    #[test]
    fn parsed_text_agrees(operation in arb_string(), arguments in arb_value()) {
        let parsed: Value = serde_json::from_str(&arguments.to_string()).unwrap();
        prop_assert_eq!(
            Fingerprint::of_value(&operation, &parsed).unwrap().to_string(),
            reference::fingerprint(&operation, &parsed)
        );
    }
}
