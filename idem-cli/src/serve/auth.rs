//! Who is asking: the tenant of a request, from its bearer token or its `X-Tenant-Id` header
//! (the HTTP tool's [`authenticate`]; the MCP tool reads the same two).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, header};
use axum::middleware::Next;
use axum::response::Response;
use idem_http::{Problem, ProblemResponse};

use super::TENANT_HEADER;
use crate::tokens::Tokens;

/// The tenant of a request, as [`authenticate`] established it.
#[derive(Debug, Clone)]
pub(super) struct Tenant(pub(super) String);

/// Puts the request's [`Tenant`] in its extensions: with tokens, the tenant of its
/// `Authorization: Bearer` token (else 401, and the request goes no further); without, the
/// `X-Tenant-Id` header as sent.
pub(super) async fn authenticate(
    State(tokens): State<Option<Arc<Tokens>>>,
    mut request: Request,
    next: Next,
) -> Response {
    let tenant = match &tokens {
        None => tenant(request.headers()),
        Some(tokens) => match bearer_tenant(tokens, request.headers()) {
            Some(tenant) => tenant,
            None => return unauthenticated(),
        },
    };
    request.extensions_mut().insert(Tenant(tenant));
    next.run(request).await
}

/// The tenant of the request's `Authorization: Bearer` token, if it is one of `tokens`.
pub(super) fn bearer_tenant(tokens: &Tokens, headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
    tokens.tenant_of_header(value).map(str::to_owned)
}

/// The 401 of a request without a token this server knows.
pub(super) fn unauthenticated() -> Response {
    let mut refused: Response = Problem::Unauthenticated(
        "send Authorization: Bearer TOKEN with a token this server knows".into(),
    )
    .to_response();
    refused.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        axum::http::HeaderValue::from_static("Bearer realm=\"idem\""),
    );
    refused
}

/// The `X-Tenant-Id` header as sent, if it names one.
pub(super) fn header_tenant(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
}

/// The tenant of the HTTP tool without tokens: [`header_tenant`], else `public`.
pub(super) fn tenant(headers: &HeaderMap) -> String {
    header_tenant(headers).unwrap_or("public").to_owned()
}
