//! [`Replay`]: how the layer answers, and how a verbatim response is kept in an [`Outcome`].

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use idem_core::Outcome;
use serde::{Deserialize, Serialize};

/// How the layer answers a request it ran or replays ([contract §5](idem_core::contract#http)).
/// Chosen per layer with [`IdempotencyLayer::replay`](crate::IdempotencyLayer::replay).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Replay {
    /// The default: the tool's status with
    /// `{"ok", "idempotent_replay", "original_response"}` as an `application/json` body; the
    /// tool's body must be JSON to be kept as JSON (other bodies are kept as a JSON string), and
    /// its headers are not kept.
    #[default]
    Envelope,
    /// No envelope, for APIs that cannot change their response shape: the first request gets the
    /// tool's response untouched; a repeat gets the original status, the listed headers (every
    /// value, in order) and the body byte for byte (any content type, binary included), plus
    /// `Idempotency-Replayed: true`. Headers not listed are not kept, nor are hop-by-hop headers
    /// (`Connection`, `Transfer-Encoding`, `Keep-Alive`, `TE`, `Trailer`, `Upgrade`,
    /// `Proxy-Authenticate`) even if listed. A listed header is stored with the record: list
    /// `Set-Cookie` or other secrets only if the store may hold them.
    Verbatim {
        /// The response headers kept and replayed.
        headers: Vec<HeaderName>,
    },
    /// [`Replay::Verbatim`] keeping every header of the tool's response except the hop-by-hop
    /// ones (those listed in [`Replay::Verbatim`], and any the response's `Connection` header
    /// names): a proxy's replay, for a tool whose headers it does not know
    /// ([contract §5](idem_core::contract#http)). Every header is stored with the record,
    /// `Set-Cookie` included.
    VerbatimAllHeaders,
}

impl Replay {
    /// The headers [`Replay::verbatim`] keeps: `Content-Type` and `Location`.
    pub const DEFAULT_HEADERS: [HeaderName; 2] = [header::CONTENT_TYPE, header::LOCATION];

    /// [`Replay::Verbatim`] keeping [`Replay::DEFAULT_HEADERS`].
    pub fn verbatim() -> Self {
        Self::verbatim_with(Self::DEFAULT_HEADERS)
    }

    /// [`Replay::Verbatim`] keeping exactly `headers` (add `Content-Type` yourself if you want it).
    ///
    /// ```
    /// use http::header::{CONTENT_TYPE, ETAG, LOCATION};
    /// use idem_http::Replay;
    /// let replay = Replay::verbatim_with([CONTENT_TYPE, LOCATION, ETAG]);
    /// assert_ne!(replay, Replay::verbatim());
    /// ```
    pub fn verbatim_with(headers: impl IntoIterator<Item = HeaderName>) -> Self {
        Self::Verbatim {
            headers: headers.into_iter().collect(),
        }
    }
}

/// Bytes in the stored JSON: a string when they are UTF-8 (readable in the store), else
/// `{"base64": "…"}` (standard alphabet, padded).
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum StoredBytes {
    Text(String),
    Base64 { base64: String },
}

impl StoredBytes {
    fn of(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Self::Text(text.to_owned()),
            Err(_) => Self::Base64 {
                base64: STANDARD.encode(bytes),
            },
        }
    }

    fn into_bytes(self) -> Option<Vec<u8>> {
        match self {
            Self::Text(text) => Some(text.into_bytes()),
            Self::Base64 { base64 } => STANDARD.decode(base64).ok(),
        }
    }
}

#[derive(Serialize, Deserialize)]
enum Kind {
    #[serde(rename = "verbatim")]
    Verbatim,
}

/// A verbatim response as the outcome's JSON body. The marker field comes first, so a stored
/// body is recognised by its first bytes ([`VERBATIM_PREFIX`]) before it is parsed.
#[derive(Serialize, Deserialize)]
struct Stored {
    idem_http: Kind,
    headers: Vec<(String, StoredBytes)>,
    body: StoredBytes,
}

const VERBATIM_PREFIX: &str = r#"{"idem_http":"verbatim","#;

/// A response kept in verbatim mode: the listed headers and the body bytes (the status is the
/// outcome's).
pub(crate) struct VerbatimResponse {
    pub(crate) headers: Vec<(HeaderName, HeaderValue)>,
    pub(crate) body: Bytes,
}

/// Headers that describe one connection, not the response (RFC 9110 §7.6.1): never kept, even
/// if listed; a replay that repeated them (`Transfer-Encoding: chunked` over a whole body) would
/// be malformed.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TRANSFER_ENCODING,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
    header::PROXY_AUTHENTICATE,
];

fn hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name) || name.as_str() == "keep-alive"
}

/// Whether `name` is one the `Connection` header of `headers` names (hop-by-hop too).
fn named_by_connection(headers: &HeaderMap, name: &HeaderName) -> bool {
    headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|token| token.trim().eq_ignore_ascii_case(name.as_str()))
}

/// The JSON text stored for a verbatim response: the values of the `listed` headers in
/// `headers` (every header when `None`), in order (hop-by-hop headers left out), and the body.
pub(crate) fn encode(listed: Option<&[HeaderName]>, headers: &HeaderMap, body: &[u8]) -> String {
    let mut kept = Vec::new();
    match listed {
        Some(listed) => {
            for name in listed.iter().filter(|n| !hop_by_hop(n)) {
                for value in headers.get_all(name) {
                    kept.push((name.as_str().to_owned(), StoredBytes::of(value.as_bytes())));
                }
            }
        }
        None => {
            for (name, value) in headers {
                if !hop_by_hop(name) && !named_by_connection(headers, name) {
                    kept.push((name.as_str().to_owned(), StoredBytes::of(value.as_bytes())));
                }
            }
        }
    }
    let stored = Stored {
        idem_http: Kind::Verbatim,
        headers: kept,
        body: StoredBytes::of(body),
    };
    serde_json::to_string(&stored).expect("strings and pairs always serialise")
}

/// The verbatim response kept in `outcome`, if it holds one (an outcome stored in envelope mode,
/// or stored by the executor in place of the tool's, does not).
pub(crate) fn decode(outcome: &Outcome) -> Option<VerbatimResponse> {
    if !outcome.body().starts_with(VERBATIM_PREFIX) {
        return None;
    }
    let stored: Stored = serde_json::from_str(outcome.body()).ok()?;
    let mut headers = Vec::with_capacity(stored.headers.len());
    for (name, value) in stored.headers {
        let name = HeaderName::try_from(name).ok()?;
        let value = HeaderValue::from_bytes(&value.into_bytes()?).ok()?;
        headers.push((name, value));
    }
    Some(VerbatimResponse {
        headers,
        body: Bytes::from(stored.body.into_bytes()?),
    })
}

/// The status to answer with for a stored status code.
pub(crate) fn status_of(outcome: &Outcome) -> StatusCode {
    StatusCode::from_u16(outcome.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use idem_core::OutcomeClass;

    fn round_trip(headers: &HeaderMap, body: &[u8]) -> VerbatimResponse {
        let text = encode(
            Some(&[
                header::CONTENT_TYPE,
                header::LOCATION,
                header::SET_COOKIE,
                header::TRANSFER_ENCODING,
            ]),
            headers,
            body,
        );
        let outcome = Outcome::from_json_text(201, text, OutcomeClass::Definitive).unwrap();
        decode(&outcome).expect("a verbatim outcome")
    }

    #[test]
    fn headers_and_bytes_round_trip() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONTENT_TYPE,
            "text/plain; charset=utf-8".parse().unwrap(),
        );
        h.append(header::SET_COOKIE, "a=1".parse().unwrap());
        h.append(header::SET_COOKIE, "b=2".parse().unwrap());
        h.insert(header::ETAG, "\"not-listed\"".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(
            header::LOCATION,
            HeaderValue::from_bytes(b"/caf\xe9").unwrap(),
        );
        let binary: Vec<u8> = (0..=255u8).collect();
        let back = round_trip(&h, &binary);
        assert_eq!(back.body.as_ref(), binary.as_slice());
        // ETag is not listed; Transfer-Encoding is listed but hop-by-hop.
        let names: Vec<_> = back.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["content-type", "location", "set-cookie", "set-cookie"]
        );
        assert_eq!(back.headers[1].1.as_bytes(), b"/caf\xe9");
        assert_eq!(back.headers[3].1, "b=2");
        let text = round_trip(&h, "ünïcode \u{0} \"quoted\"".as_bytes());
        assert_eq!(text.body.as_ref(), "ünïcode \u{0} \"quoted\"".as_bytes());
    }

    #[test]
    fn all_headers_but_hop_by_hop_ones_are_kept_when_none_is_listed() {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, "text/plain".parse().unwrap());
        h.append(header::SET_COOKIE, "a=1".parse().unwrap());
        h.append(header::SET_COOKIE, "b=2".parse().unwrap());
        h.insert("x-request-id", "r-1".parse().unwrap());
        h.insert(header::TRANSFER_ENCODING, "chunked".parse().unwrap());
        h.insert(header::CONNECTION, "keep-alive, X-Hop".parse().unwrap());
        h.insert("keep-alive", "timeout=5".parse().unwrap());
        h.insert("x-hop", "1".parse().unwrap());
        let text = encode(None, &h, b"body");
        let outcome = Outcome::from_json_text(200, text, OutcomeClass::Definitive).unwrap();
        let back = decode(&outcome).unwrap();
        let kept: Vec<_> = back
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(
            kept,
            [
                ("content-type", "text/plain"),
                ("set-cookie", "a=1"),
                ("set-cookie", "b=2"),
                ("x-request-id", "r-1")
            ]
        );
    }

    #[test]
    fn other_outcomes_are_not_verbatim() {
        for body in [
            r#"{"headers":[],"body":"x"}"#,
            r#"{"idem_http":"verbatim","headers":"no","body":"x"}"#,
            r#""{\"idem_http\":\"verbatim\",""#,
        ] {
            let o = Outcome::from_json_text(200, body, OutcomeClass::Definitive).unwrap();
            assert!(decode(&o).is_none(), "{body}");
        }
    }
}
