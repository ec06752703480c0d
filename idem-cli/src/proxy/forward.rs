//! [`Upstream`]: sends a request on to the tool server and says what is known of its effect.
//!
//! Three answers ([`Forwarded`]): the upstream answered (its status, headers less the hop-by-hop
//! ones, and body); nothing was sent (the connection was refused or never made: nothing can have
//! happened); or the request was sent and no valid answer came back (a timeout, a reset, bytes
//! that are not HTTP, a body cut short: the effect may have happened). Neither bodies nor header
//! values are logged, and errors are logged without the URL (its query may hold a secret).

use std::time::Duration;

use axum::body::{Body, Bytes};
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode};

/// The upstream tool server: its base URL and one connection pool.
#[derive(Debug, Clone)]
pub(crate) struct Upstream {
    client: reqwest::Client,
    base: String,
}

/// What the upstream did with a request.
pub(crate) enum Forwarded {
    /// It answered: the response to give the caller (and to keep).
    Answered(Response<Body>),
    /// Nothing was sent: a `502 urn:idem:problem:upstream-unreachable` for the caller.
    NotSent(Response<Body>),
    /// Sent, no valid answer: a `502`/`504 urn:idem:problem:upstream-no-answer` for the caller.
    NoAnswer(Response<Body>),
}

/// How one request goes on.
pub(crate) struct Outgoing<'a> {
    /// The downstream key and the header it goes in (protected requests only).
    pub(crate) key: Option<(&'a HeaderName, String)>,
    /// Headers the proxy consumed and must not pass on (the client's own key, its token).
    pub(crate) drop: &'a [HeaderName],
    pub(crate) timeout: Duration,
    pub(crate) max_response_bytes: usize,
}

impl Upstream {
    /// The upstream at `base` (`http://HOST:PORT`, maybe with a path prefix). Redirects are
    /// the caller's to follow, never the proxy's; no system proxy is used.
    pub(crate) fn new(base: &str) -> Result<Self, String> {
        let url = reqwest::Url::parse(base)
            .map_err(|e| format!("--upstream {base:?} is not a URL: {e}"))?;
        if url.scheme() != "http" || url.host().is_none() {
            return Err(format!(
                "--upstream {base:?}: write http://HOST:PORT (https upstreams are not supported yet)"
            ));
        }
        // idem-http's builder: reqwest with its TLS provider installed (needed to build one).
        let client = idem_http::client::http_client_builder()
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            // Shorter than the idle timeouts servers use (5 s for node), so a pooled connection
            // is rarely one the upstream is closing as a request goes out on it.
            .pool_idle_timeout(Duration::from_secs(2))
            .build()
            .map_err(|e| format!("cannot build the upstream client: {e}"))?;
        Ok(Self {
            client,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    /// Sends `parts` and `body` on.
    pub(crate) async fn forward(
        &self,
        parts: &Parts,
        body: Bytes,
        outgoing: Outgoing<'_>,
    ) -> Forwarded {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let mut headers = end_to_end(&parts.headers);
        for name in outgoing.drop {
            headers.remove(name);
        }
        headers.remove(header::HOST);
        headers.remove(header::CONTENT_LENGTH);
        if let Some((name, key)) = outgoing.key
            && let Ok(value) = HeaderValue::from_str(&key)
        {
            headers.insert(name.clone(), value);
        }
        let request = self
            .client
            .request(parts.method.clone(), format!("{}{path}", self.base))
            .headers(headers)
            .timeout(outgoing.timeout)
            .body(body);
        let mut response = match request.send().await {
            Ok(response) => response,
            Err(e) if e.is_connect() => {
                tracing::warn!(error = %e.without_url(), method = %parts.method, path = parts.uri.path(), "upstream unreachable: nothing sent");
                return Forwarded::NotSent(problem(
                    StatusCode::BAD_GATEWAY,
                    "upstream-unreachable",
                    "The upstream could not be reached",
                    "the request was not sent (the connection was refused or never made): nothing happened; retry with the same key",
                ));
            }
            Err(e) => return no_answer(parts, e),
        };
        let status = response.status();
        let mut kept = Vec::new();
        let mut too_large = false;
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) if kept.len() + chunk.len() > outgoing.max_response_bytes => {
                    too_large = true;
                    break;
                }
                Ok(Some(chunk)) => kept.extend_from_slice(&chunk),
                Ok(None) => break,
                Err(e) => return no_answer(parts, e),
            }
        }
        if too_large {
            tracing::warn!(method = %parts.method, path = parts.uri.path(), %status, limit = outgoing.max_response_bytes, "the upstream's answer is over max_response_bytes: not passed on");
            let mut answer = problem(
                status,
                "response-too-large",
                "The upstream's answer was too large to pass on",
                &format!(
                    "the upstream answered {status} with a body over the proxy's limit of {} bytes (max_response_bytes); the operation ran",
                    outgoing.max_response_bytes
                ),
            );
            *answer.status_mut() = status;
            return Forwarded::Answered(answer);
        }
        let mut answer = Response::new(Body::from(kept));
        *answer.status_mut() = status;
        *answer.headers_mut() = end_to_end(response.headers());
        if parts.method != http::Method::HEAD {
            // The body is whole: its length is set from it (a HEAD's says what a GET would get).
            answer.headers_mut().remove(header::CONTENT_LENGTH);
        }
        Forwarded::Answered(answer)
    }
}

/// Sent, and no valid answer: the effect may have happened.
fn no_answer(parts: &Parts, e: reqwest::Error) -> Forwarded {
    let timeout = e.is_timeout();
    tracing::warn!(error = %e.without_url(), method = %parts.method, path = parts.uri.path(), "the upstream gave no valid answer: its effect may have happened");
    let status = match timeout {
        true => StatusCode::GATEWAY_TIMEOUT,
        false => StatusCode::BAD_GATEWAY,
    };
    Forwarded::NoAnswer(problem(
        status,
        "upstream-no-answer",
        "The upstream gave no valid answer",
        "the request was sent and no valid answer came back (a timeout, a reset or bytes that are not HTTP): its effect may have happened, so a retry with the same key is answered 409 (in flight, then in doubt) until an operator settles the key",
    ))
}

/// Headers that describe one connection (RFC 9110 §7.6.1), never passed on.
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
];

/// `headers` less the hop-by-hop ones and those their `Connection` header names.
fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = name.as_str();
        if !HOP_BY_HOP.contains(&n) && !named.iter().any(|c| c == n) {
            out.append(name.clone(), value.clone());
        }
    }
    out
}

/// An `application/problem+json` answer of the proxy's own.
pub(crate) fn problem(status: StatusCode, name: &str, title: &str, detail: &str) -> Response<Body> {
    let body = serde_json::json!({
        "type": format!("urn:idem:problem:{name}"),
        "title": title,
        "status": status.as_u16(),
        "detail": detail,
    });
    let mut response = Response::new(Body::from(body.to_string()));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_dropped() {
        let mut h = HeaderMap::new();
        h.insert("connection", "close, x-trace".parse().unwrap());
        h.insert("x-trace", "1".parse().unwrap());
        h.insert("transfer-encoding", "chunked".parse().unwrap());
        h.append("set-cookie", "a=1".parse().unwrap());
        h.append("set-cookie", "b=2".parse().unwrap());
        let kept = end_to_end(&h);
        assert_eq!(kept.len(), 2);
        assert_eq!(kept.get_all("set-cookie").iter().count(), 2);
    }
}
