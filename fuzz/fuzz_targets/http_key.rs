//! `idem_http::read_key` on arbitrary `Idempotency-Key` header values (split at `\n`, which no
//! header value can hold, so several headers can be sent), and `idem_http::key_header` on every
//! accepted key.
//!
//! No header: `key-required`; more than one: refused. One: an accepted key obeys [contract
//! §4](idem_core::contract#refusals) and is what the draft's syntax says (the unescaped inside of a
//! structured-field string, or the bare token); every accepted key, written by `key_header`, reads
//! back as the same key.
#![no_main]

use http::{HeaderMap, HeaderValue};
use idem_fuzz::check_key;
use idem_http::{IDEMPOTENCY_KEY, Problem, key_header, read_key};
use libfuzzer_sys::fuzz_target;

/// The draft's reading of one header value, written independently of `read_key`.
fn expected(value: &str) -> Option<String> {
    let text = value.trim_matches(' ');
    let Some(inner) = text.strip_prefix('"') else {
        return Some(text.to_owned());
    };
    let mut out = String::new();
    let mut bytes = inner.bytes();
    loop {
        match bytes.next()? {
            b'"' => return bytes.next().is_none().then_some(out),
            b'\\' => match bytes.next()? {
                e @ (b'"' | b'\\') => out.push(e as char),
                _ => return None,
            },
            b => out.push(b as char),
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let mut headers = HeaderMap::new();
    for value in data.split(|&b| b == b'\n').take(4) {
        let Ok(value) = HeaderValue::from_bytes(value) else {
            return;
        };
        headers.append(IDEMPOTENCY_KEY, value);
    }
    let values: Vec<&HeaderValue> = headers.get_all(IDEMPOTENCY_KEY).iter().collect();
    let read = read_key(&headers);
    match values.as_slice() {
        [] => assert_eq!(read, Err(Problem::KeyRequired)),
        [value] => {
            let want = value
                .to_str()
                .ok()
                .and_then(expected)
                .and_then(|text| check_key(&text));
            match (&read, &want) {
                (Ok(got), Some(want)) => assert_eq!(got, want),
                (Err(Problem::InvalidKey(_)), None) => {}
                _ => panic!("read_key {read:?}, expected {want:?} for {value:?}"),
            }
        }
        _ => assert!(matches!(read, Err(Problem::InvalidKey(_)))),
    }

    // Every key `new` accepts travels in a header and reads back unchanged.
    if let Some(key) = check_key(&String::from_utf8_lossy(data)) {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, key_header(&key));
        assert_eq!(read_key(&headers).as_ref(), Ok(&key));
    }
    if let Ok(key) = read {
        let mut headers = HeaderMap::new();
        headers.insert(IDEMPOTENCY_KEY, key_header(&key));
        assert_eq!(read_key(&headers), Ok(key));
    }
});
