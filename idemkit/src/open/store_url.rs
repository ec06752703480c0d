//! [`StoreUrl`]: a store URL, parsed, checked against its backend, and shown redacted.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use url::Url;

use super::{BACKENDS, Backend, KNOWN, OpenError};

/// A parsed store URL. `Display` and `Debug` never show a password.
///
/// ```
/// use idemkit::open::StoreUrl;
/// let url: StoreUrl = "postgres://app:hunter2@db/app?sslmode=require&password=hunter2".parse().unwrap();
/// assert_eq!(url.backend(), "postgres");
/// assert_eq!(url.to_string(), "postgres://app:***@db/app?sslmode=require&password=***");
/// assert!(!format!("{url:?}").contains("hunter2"));
/// assert!("localhost:5432".parse::<StoreUrl>().unwrap_err().to_string().contains("postgres://localhost:5432"));
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct StoreUrl {
    /// The text given, trimmed (an SQLite path is read from it, not from the normalised URL,
    /// which would resolve `..`).
    raw: String,
    pub(super) url: Url,
    pub(super) backend: &'static Backend,
}

impl StoreUrl {
    /// Parses `input`; see the [module docs](mod@crate::open) for the forms.
    pub fn parse(input: &str) -> Result<Self, OpenError> {
        let input = input.trim();
        if input.is_empty() {
            return Err(OpenError::NoScheme {
                input: String::new(),
                hint: "give a store URL, e.g. sqlite://idem.db".into(),
            });
        }
        let Some((scheme, _)) = input.split_once(':') else {
            return Err(no_scheme(input));
        };
        let scheme = scheme.to_ascii_lowercase();
        let backend = BACKENDS
            .iter()
            .find(|b| b.schemes.contains(&scheme.as_str()));
        // `sqlite:PATH` is the one form without `//`; anything else must say `scheme://`.
        let Some(backend) = backend.filter(|b| b.name == "sqlite" || input.contains("://")) else {
            if !input.contains("://") {
                return Err(no_scheme(input));
            }
            return Err(OpenError::UnknownScheme {
                scheme,
                input: redact_text(input),
                known: KNOWN,
            });
        };
        let url = Url::parse(input).map_err(|e| OpenError::InvalidUrl {
            url: redact_text(input),
            reason: e.to_string(),
            source: Some(e),
        })?;
        let parsed = Self {
            raw: input.to_owned(),
            url,
            backend,
        };
        (backend.check)(&parsed)?;
        Ok(parsed)
    }

    /// The backend's name: `sqlite`, `postgres`, `redis`, `redis-cluster` or `dynamodb`.
    pub fn backend(&self) -> &'static str {
        self.backend.name
    }

    /// The URL's scheme, e.g. `postgres`.
    pub fn scheme(&self) -> &str {
        self.url.scheme()
    }

    /// The URL with its secrets, for handing to a driver. Never log it: use `Display`.
    pub fn expose_secret(&self) -> &str {
        self.url.as_str()
    }

    /// The parsed URL, secrets included.
    pub fn as_url(&self) -> &Url {
        &self.url
    }

    /// For `sqlite:` URLs, the file's path (`sqlite://idem.db` is `idem.db`, relative to the
    /// working directory; `sqlite:///var/idem.db` is absolute); `None` for other backends.
    pub fn sqlite_path(&self) -> Option<PathBuf> {
        if self.backend.name != "sqlite" {
            return None;
        }
        let s = self.raw.as_str();
        let rest = s
            .get(7..)
            .filter(|_| s[..7].eq_ignore_ascii_case("sqlite:"))
            .map(|r| r.strip_prefix("//").unwrap_or(r))
            .unwrap_or_default();
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
        let decoded = percent_encoding::percent_decode_str(rest).decode_utf8_lossy();
        Some(PathBuf::from(decoded.into_owned()))
    }

    /// For `redis+cluster:` URLs, one plain `redis://` (or `rediss://`) URL per node named, the
    /// credentials and other parameters repeated on each; `None` for other backends.
    pub fn cluster_nodes(&self) -> Option<Vec<String>> {
        if self.backend.name != "redis-cluster" {
            return None;
        }
        let tls = self.url.scheme().starts_with("rediss");
        let mut base = self.url.clone();
        // `set_scheme` refuses a change between special and non-special schemes; both are
        // non-special here.
        base.set_scheme(if tls { "rediss" } else { "redis" }).ok()?;
        let others: Vec<(String, String)> = self
            .url
            .query_pairs()
            .filter(|(k, _)| k != "node")
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        base.set_query(None);
        if !others.is_empty() {
            base.query_pairs_mut().extend_pairs(others);
        }
        let mut nodes = vec![base.to_string()];
        for (k, node) in self.url.query_pairs() {
            if k == "node" {
                let mut u = base.clone();
                let (host, port) = split_host_port(&node)?;
                u.set_host(Some(host)).ok()?;
                u.set_port(port).ok()?;
                nodes.push(u.to_string());
            }
        }
        Some(nodes)
    }
}

pub(super) fn split_host_port(node: &str) -> Option<(&str, Option<u16>)> {
    match node.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() => Some((host, Some(port.parse().ok()?))),
        Some(_) => None,
        None if !node.is_empty() => Some((node, None)),
        None => None,
    }
}

impl FromStr for StoreUrl {
    type Err = OpenError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.backend.name == "sqlite" {
            // A path holds no secret; shown as given (the URL form would resolve `..`).
            return f.write_str(&self.raw);
        }
        f.write_str(&redact(&self.url))
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("StoreUrl").field(&self.to_string()).finish()
    }
}

/// Whether a query parameter named `name` holds a secret (`listen_url`: a URL, with its own
/// password).
fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "auth", "listen_url"]
        .iter()
        .any(|s| name.contains(s))
}

/// `url` with the password of its user-info and of its secret query parameters replaced by
/// `***`.
fn redact(url: &Url) -> String {
    let mut shown = url.clone();
    if url.password().is_some() {
        let _ = shown.set_password(Some("***"));
    }
    if url.query_pairs().any(|(k, _)| is_secret_param(&k)) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(k, v)| {
                let v = if is_secret_param(&k) {
                    "***".to_owned()
                } else {
                    v.into_owned()
                };
                (k.into_owned(), v)
            })
            .collect();
        shown.set_query(None);
        shown.query_pairs_mut().extend_pairs(pairs);
    }
    shown.to_string()
}

/// Text that did not parse as a URL, with anything that could be credentials hidden: the part
/// before the last `@` (after the scheme) and every query string.
fn redact_text(input: &str) -> String {
    let (head, query) = match input.split_once('?') {
        Some((h, _)) => (h, "?***"),
        None => (input, ""),
    };
    let (scheme, rest) = match head.split_once("://") {
        Some((s, r)) => (format!("{s}://"), r),
        None => (String::new(), head),
    };
    match rest.rsplit_once('@') {
        Some((_, host)) => format!("{scheme}***@{host}{query}"),
        None => format!("{scheme}{rest}{query}"),
    }
}

/// The error for text without a scheme, with the URL it probably meant.
fn no_scheme(input: &str) -> OpenError {
    let shown = redact_text(input);
    let host_port = {
        let authority = shown.split('/').next().unwrap_or_default();
        let host = authority.rsplit('@').next().unwrap_or_default();
        host.rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok())
            || input.contains('@')
    };
    let hint = if host_port {
        format!(
            "it looks like a server address; write postgres://{shown} or redis://{shown} (a text without a scheme is never taken as a file path)"
        )
    } else {
        format!("for an SQLite file write sqlite://{shown}")
    };
    OpenError::NoScheme { input: shown, hint }
}

impl TryFrom<&str> for StoreUrl {
    type Error = OpenError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::parse(s)
    }
}

impl TryFrom<&String> for StoreUrl {
    type Error = OpenError;

    fn try_from(s: &String) -> Result<Self, Self::Error> {
        Self::parse(s)
    }
}

impl TryFrom<&StoreUrl> for StoreUrl {
    type Error = OpenError;

    fn try_from(s: &StoreUrl) -> Result<Self, Self::Error> {
        Ok(s.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<StoreUrl, OpenError> {
        s.parse()
    }

    #[test]
    fn sqlite_paths() {
        for (input, path) in [
            ("sqlite://idem.db", "idem.db"),
            ("sqlite:idem.db", "idem.db"),
            ("sqlite:///var/lib/idem.db", "/var/lib/idem.db"),
            ("sqlite://data/idem.db", "data/idem.db"),
            ("sqlite://./idem.db", "./idem.db"),
            ("sqlite://my%20file.db", "my file.db"),
            ("sqlite://data/../idem.db", "data/../idem.db"),
            ("SQLite://idem.db", "idem.db"),
        ] {
            let url = parse(input).unwrap();
            assert_eq!(url.backend(), "sqlite", "{input}");
            assert_eq!(url.sqlite_path().unwrap(), PathBuf::from(path), "{input}");
        }
        for bad in ["sqlite://", "sqlite:", "sqlite://x.db?mode=ro"] {
            assert!(
                matches!(parse(bad), Err(OpenError::InvalidUrl { .. })),
                "{bad}: {:?}",
                parse(bad)
            );
        }
    }

    #[test]
    fn text_without_a_scheme_is_refused_with_a_hint() {
        for (input, hint) in [
            ("localhost:5432", "postgres://localhost:5432"),
            ("db.internal:6379/0", "redis://db.internal:6379/0"),
            ("idem.db", "sqlite://idem.db"),
            ("/var/lib/idem.db", "sqlite:///var/lib/idem.db"),
        ] {
            let err = parse(input).unwrap_err();
            assert!(
                matches!(err, OpenError::NoScheme { .. }),
                "{input}: {err:?}"
            );
            assert!(err.to_string().contains(hint), "{input}: {err}");
            assert!(err.is_bad_url());
        }
        let err = parse("app:hunter2@db:5432/app").unwrap_err();
        assert!(matches!(err, OpenError::NoScheme { .. }), "{err:?}");
        assert!(!err.to_string().contains("hunter2"), "{err}");
        assert!(!format!("{err:?}").contains("hunter2"), "{err:?}");
    }

    #[test]
    fn unknown_schemes_are_refused_without_showing_secrets() {
        let err = parse("mysql://root:hunter2@db/app?password=hunter2").unwrap_err();
        assert!(matches!(err, OpenError::UnknownScheme { .. }), "{err:?}");
        assert!(err.to_string().contains("mysql"), "{err}");
        assert!(!format!("{err} {err:?}").contains("hunter2"), "{err:?}");
        assert!(matches!(
            parse("postgres://"),
            Err(OpenError::InvalidUrl { .. })
        ));
    }

    #[test]
    fn passwords_are_redacted_in_userinfo_and_parameters() {
        for (input, shown) in [
            (
                "postgres://app:hunter2@db:5432/app",
                "postgres://app:***@db:5432/app",
            ),
            (
                "postgres://app@db/app?password=hunter2&sslmode=require",
                "postgres://app@db/app?password=***&sslmode=require",
            ),
            ("redis://:hunter2@cache:6379/0", "redis://:***@cache:6379/0"),
            (
                "postgres://app@pooler:6432/app?pooler=transaction&listen_url=postgres%3A%2F%2Fapp%3Ahunter2%40db%2Fapp",
                "postgres://app@pooler:6432/app?pooler=transaction&listen_url=***",
            ),
            (
                "rediss+cluster://u:hunter2@n1:7000?node=n2:7000",
                "rediss+cluster://u:***@n1:7000?node=n2:7000",
            ),
        ] {
            let url = parse(input).unwrap();
            assert_eq!(url.to_string(), shown);
            assert!(!format!("{url:?}").contains("hunter2"));
            assert_eq!(url.expose_secret(), input);
        }
    }

    #[test]
    fn cluster_urls_name_every_node_with_the_credentials() {
        let url =
            parse("redis+cluster://u:pw@n1:7000?node=n2:7001&node=n3:7002&protocol=resp3").unwrap();
        assert_eq!(url.backend(), "redis-cluster");
        assert_eq!(
            url.cluster_nodes().unwrap(),
            [
                "redis://u:pw@n1:7000?protocol=resp3",
                "redis://u:pw@n2:7001?protocol=resp3",
                "redis://u:pw@n3:7002?protocol=resp3",
            ]
        );
        let tls = parse("rediss+cluster://n1:7000").unwrap();
        assert_eq!(tls.cluster_nodes().unwrap(), ["rediss://n1:7000"]);
        assert!(matches!(
            parse("redis+cluster://n1:7000?node=n2:notaport"),
            Err(OpenError::InvalidUrl { .. })
        ));
    }

    #[test]
    fn schemes_map_to_backends() {
        for (input, backend) in [
            ("postgresql://db/app", "postgres"),
            ("POSTGRES://db/app", "postgres"),
            ("rediss://cache:6380", "redis"),
        ] {
            assert_eq!(parse(input).unwrap().backend(), backend, "{input}");
        }
    }
}
