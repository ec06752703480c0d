//! Bearer tokens mapped to tenants, for running `idem serve` exposed (`--tokens FILE`).
//!
//! The file holds one `TOKEN TENANT` pair per line, separated by white space; blank lines and
//! lines starting with `#` are ignored:
//!
//! ```text
//! # token                              tenant
//! 3f9c1e0b7d2a4c58a1e6f0b9d8c7a6e5     acme
//! b41d9e2f6a3c4b7d8e1f0a9b8c7d6e5f     globex
//! ```
//!
//! A token is 16 to 512 characters of `A–Z a–z 0–9 - . _ ~ + / =` (RFC 6750's `b64token`), each
//! token appears once; a tenant is any non-empty word. A request must then carry
//! `Authorization: Bearer TOKEN`; its tenant is the one the token maps to (`X-Tenant-Id` is
//! ignored). Tokens are compared in constant time (their SHA-256 digests, with `subtle`), are
//! never logged, and [`Tokens`]' `Debug` shows only the tenants.

use std::fmt;
use std::path::Path;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The shortest token accepted: shorter ones are guessable.
pub const MIN_TOKEN_LEN: usize = 16;
/// The longest token accepted.
pub const MAX_TOKEN_LEN: usize = 512;

/// Why a tokens file was refused. Messages name the line, never the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TokensError {
    /// The file could not be read.
    #[error("cannot read the tokens file {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// A line is not `TOKEN TENANT`.
    #[error("tokens file line {line}: expected `TOKEN TENANT` (two words)")]
    Shape {
        /// 1-based line number.
        line: usize,
    },
    /// A token breaks the length or character rule.
    #[error(
        "tokens file line {line}: a token must be {MIN_TOKEN_LEN} to {MAX_TOKEN_LEN} characters of A-Z a-z 0-9 - . _ ~ + / ="
    )]
    BadToken {
        /// 1-based line number.
        line: usize,
    },
    /// A token appears twice.
    #[error("tokens file line {line}: this token already appears on line {first}")]
    Duplicate {
        /// 1-based line number.
        line: usize,
        /// The line where it first appears.
        first: usize,
    },
    /// No token at all: every request would be refused.
    #[error("the tokens file has no tokens")]
    Empty,
}

/// Bearer tokens and the tenant each maps to.
#[derive(Clone)]
pub struct Tokens {
    /// SHA-256 of each token, and its tenant.
    entries: Vec<([u8; 32], String)>,
}

impl fmt::Debug for Tokens {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let tenants: Vec<&str> = self.entries.iter().map(|(_, t)| t.as_str()).collect();
        f.debug_struct("Tokens")
            .field("tenants", &tenants)
            .finish_non_exhaustive()
    }
}

fn is_token_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_' | '~' | '+' | '/' | '=')
}

impl Tokens {
    /// Reads the tokens file at `path` (format in the module docs).
    pub fn load(path: &Path) -> Result<Self, TokensError> {
        let text = std::fs::read_to_string(path).map_err(|e| TokensError::Read {
            path: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::parse(&text)
    }

    /// Parses the text of a tokens file.
    pub fn parse(text: &str) -> Result<Self, TokensError> {
        let mut entries: Vec<([u8; 32], String)> = Vec::new();
        let mut lines_of: Vec<usize> = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let line_no = i + 1;
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(token), Some(tenant), None) = (words.next(), words.next(), words.next())
            else {
                return Err(TokensError::Shape { line: line_no });
            };
            if !(MIN_TOKEN_LEN..=MAX_TOKEN_LEN).contains(&token.len())
                || !token.chars().all(is_token_char)
            {
                return Err(TokensError::BadToken { line: line_no });
            }
            let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
            if let Some(at) = entries.iter().position(|(d, _)| *d == digest) {
                return Err(TokensError::Duplicate {
                    line: line_no,
                    first: lines_of[at],
                });
            }
            entries.push((digest, tenant.to_owned()));
            lines_of.push(line_no);
        }
        if entries.is_empty() {
            return Err(TokensError::Empty);
        }
        Ok(Self { entries })
    }

    /// How many tokens.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The tenant of `token`, comparing against every token in constant time (digests of fixed
    /// length, every entry compared, no early exit).
    pub fn tenant_of(&self, token: &str) -> Option<&str> {
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        let mut found = None;
        for (known, tenant) in &self.entries {
            if bool::from(known.ct_eq(&digest)) {
                found = Some(tenant.as_str());
            }
        }
        found
    }

    /// The tenant of a request's `Authorization` header value: `Bearer TOKEN` (the scheme in any
    /// case, RFC 9110), or `None`.
    pub fn tenant_of_header(&self, authorization: Option<&[u8]>) -> Option<&str> {
        let value = std::str::from_utf8(authorization?).ok()?.trim();
        let (scheme, token) = value.split_once(' ')?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return None;
        }
        self.tenant_of(token.trim_start_matches(' '))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: &str = "aaaaaaaaaaaaaaaa-1";
    const B: &str = "bbbbbbbbbbbbbbbb-2";

    fn tokens() -> Tokens {
        Tokens::parse(&format!("# comment\n\n{A} acme\n  {B}\tglobex  \n")).unwrap()
    }

    #[test]
    fn maps_tokens_to_tenants() {
        let t = tokens();
        assert_eq!(t.len(), 2);
        assert_eq!(t.tenant_of(A), Some("acme"));
        assert_eq!(t.tenant_of(B), Some("globex"));
        assert_eq!(t.tenant_of("aaaaaaaaaaaaaaaa-"), None);
        assert_eq!(t.tenant_of(""), None);
        let h = |v: &str| t.tenant_of_header(Some(v.as_bytes())).map(str::to_owned);
        assert_eq!(h(&format!("Bearer {A}")).as_deref(), Some("acme"));
        assert_eq!(h(&format!("bearer {B}")).as_deref(), Some("globex"));
        assert_eq!(h(&format!("Basic {A}")), None);
        assert_eq!(h(A), None);
        assert_eq!(t.tenant_of_header(None), None);
    }

    #[test]
    fn refusals_name_the_line_never_the_token() {
        let bad = [
            (format!("{A}\n"), TokensError::Shape { line: 1 }),
            (format!("{A} acme extra\n"), TokensError::Shape { line: 1 }),
            ("short acme\n".to_owned(), TokensError::BadToken { line: 1 }),
            (
                format!("{A} acme\naaaaaaaaaaaaaaaa\"x acme\n"),
                TokensError::BadToken { line: 2 },
            ),
            (
                format!("{A} acme\n# x\n{A} other\n"),
                TokensError::Duplicate { line: 3, first: 1 },
            ),
            ("# nothing\n".to_owned(), TokensError::Empty),
        ];
        for (text, want) in bad {
            let err = Tokens::parse(&text).unwrap_err();
            assert_eq!(err, want, "{text:?}");
            assert!(!err.to_string().contains(A));
        }
    }

    #[test]
    fn debug_shows_tenants_not_tokens() {
        let shown = format!("{:?}", tokens());
        assert!(
            shown.contains("acme") && shown.contains("globex"),
            "{shown}"
        );
        assert!(!shown.contains(A) && !shown.contains(B), "{shown}");
    }
}
