//! Who is asking, as `idem serve` decides it: with `--tokens`, the tenant of the request's
//! `Authorization: Bearer` token (the header is then the proxy's and is not passed on); without,
//! the `X-Tenant-Id` header as sent (default `public`), which an authenticating proxy in front
//! must set.

use std::sync::Arc;

use http::HeaderMap;
use http::header::{self, HeaderName};

use crate::tokens::Tokens;

/// The header naming the tenant without `--tokens`.
const TENANT_HEADER: &str = "x-tenant-id";

/// How the proxy finds the tenant of a request.
#[derive(Debug, Clone)]
pub(crate) struct Tenancy {
    tokens: Option<Arc<Tokens>>,
}

impl Tenancy {
    pub(crate) fn new(tokens: Option<Arc<Tokens>>) -> Self {
        Self { tokens }
    }

    /// The tenant of a request with `headers`; `None` when tokens are required and none of
    /// them was sent.
    pub(crate) fn tenant(&self, headers: &HeaderMap) -> Option<String> {
        match &self.tokens {
            Some(tokens) => {
                let value = headers.get(header::AUTHORIZATION).map(|v| v.as_bytes());
                tokens.tenant_of_header(value).map(str::to_owned)
            }
            None => Some(
                headers
                    .get(TENANT_HEADER)
                    .and_then(|v| v.to_str().ok())
                    .filter(|v| !v.is_empty())
                    .unwrap_or("public")
                    .to_owned(),
            ),
        }
    }

    /// The headers of a protected request the proxy consumed: never passed on.
    pub(crate) fn consumed(&self) -> &'static [HeaderName] {
        match self.tokens {
            Some(_) => &[header::AUTHORIZATION],
            None => &[],
        }
    }
}
