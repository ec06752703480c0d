//! Who is asking: the tenant of a request, from its bearer token or its `X-Tenant-Id` header.

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
        Some(tokens) => {
            let value = request
                .headers()
                .get(header::AUTHORIZATION)
                .map(|v| v.as_bytes());
            match tokens.tenant_of_header(value) {
                Some(tenant) => tenant.to_owned(),
                None => {
                    let mut refused: Response = Problem::Unauthenticated(
                        "send Authorization: Bearer TOKEN with a token this server knows".into(),
                    )
                    .to_response();
                    refused.headers_mut().insert(
                        header::WWW_AUTHENTICATE,
                        axum::http::HeaderValue::from_static("Bearer realm=\"idem\""),
                    );
                    return refused;
                }
            }
        }
    };
    request.extensions_mut().insert(Tenant(tenant));
    next.run(request).await
}

pub(super) fn tenant(headers: &HeaderMap) -> String {
    headers
        .get(TENANT_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty())
        .unwrap_or("public")
        .to_owned()
}
