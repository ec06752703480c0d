//! Opening a store from a URL: `sqlite://PATH`, `postgres://…`, `redis://…`, `rediss://…`,
//! `redis+cluster://…`.
//!
//! ```no_run
//! # async fn f() -> Result<(), idemkit::open::OpenError> {
//! // Reads only: the schema must exist (`idemkit::open::OpenOptions::new().migrate(true)`
//! // creates it, as `idem migrate` does).
//! let store = idemkit::open::open("postgres://app:secret@db.internal/app").await?;
//! # let _ = store; Ok(()) }
//! ```
//!
//! | URL | store | feature |
//! | --- | --- | --- |
//! | `sqlite://PATH`, `sqlite:PATH`, `sqlite:///ABS/PATH` | `SqliteStore` on the file (percent-encode spaces) | `sqlite` |
//! | `postgres://…`, `postgresql://…` | `PostgresStore` in `public.idem_records`; parameters go to sqlx (`?sslmode=…`, `?password=…`) | `postgres` |
//! | `redis://…`, `rediss://…` | `RedisStore` on a standalone server | `redis` |
//! | `redis+cluster://[USER:PASS@]HOST:PORT[?node=HOST:PORT&node=…]`, `rediss+cluster://…` | `RedisStore` on a Redis Cluster, seeded by every node named | `redis` |
//!
//! A URL is shown (in [`StoreUrl`]'s `Display` and `Debug`, and in every [`OpenError`]) with its
//! password replaced by `***`, in the user-info part and in any query parameter whose name says
//! it holds a secret (`password`, `pass`, `secret`, `token`, …).
//!
//! Opening never changes the schema unless [`OpenOptions::migrate`] asks for it: a store whose
//! schema is missing or behind is refused with [`OpenError::SchemaMissing`], and an SQLite file
//! that does not exist with [`OpenError::NoDatabaseFile`] (it is not created).
//!
//! Adding a backend: its crate, its facade feature, and one line in the table of backends
//! (`BACKENDS` in this module) pointing at its opener.

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;

use idem_core::{KeyStore, StoreError};
use url::Url;

/// Why a store could not be opened from its URL. Every URL inside is already redacted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The text has no `scheme://`; `hint` suggests the URL that was probably meant.
    #[error("store URL {input:?} has no scheme: {hint}")]
    NoScheme {
        /// The text given (redacted).
        input: String,
        /// What to write instead.
        hint: String,
    },
    /// The scheme is not one idemkit knows.
    #[error("unknown store URL scheme {scheme:?} in {input:?}: use {known}")]
    UnknownScheme {
        /// The scheme given.
        scheme: String,
        /// The text given (redacted).
        input: String,
        /// The schemes that are known, for people.
        known: &'static str,
    },
    /// The URL does not parse, or its parts do not make sense for its scheme.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL (redacted).
        url: String,
        /// What is wrong.
        reason: String,
        /// The parser's error, if there was one.
        #[source]
        source: Option<url::ParseError>,
    },
    /// The scheme's backend is not compiled in: enable the named cargo feature of `idemkit`.
    #[error("{url} needs idemkit's `{feature}` feature, which this build does not have")]
    FeatureDisabled {
        /// The URL (redacted).
        url: String,
        /// The cargo feature to enable.
        feature: &'static str,
    },
    /// The SQLite file does not exist (it is created only when migrating).
    #[error(
        "no SQLite file at {}: check the path, or create it with `idem migrate` (in code: OpenOptions::migrate)",
        path.display()
    )]
    NoDatabaseFile {
        /// The path.
        path: PathBuf,
    },
    /// The store's schema is missing or older than this build needs; nothing was changed.
    #[error(
        "schema missing at {url}: found version {found}, this build needs {expected}; run `idem migrate` (in code: OpenOptions::migrate) with a role allowed to change the schema"
    )]
    SchemaMissing {
        /// The URL (redacted).
        url: String,
        /// The version found (0: never migrated).
        found: i64,
        /// The version this build reads and writes.
        expected: i64,
    },
    /// The store's schema is newer than this build knows: upgrade idem.
    #[error(
        "the schema at {url} is at version {found}, newer than this build's {expected}: upgrade idem"
    )]
    SchemaNewer {
        /// The URL (redacted).
        url: String,
        /// The version found.
        found: i64,
        /// The version this build reads and writes.
        expected: i64,
    },
    /// The store refused or could not be reached while opening (see
    /// [`StoreError::is_unavailable`] on the source).
    #[error("cannot open the store {url}: {source}")]
    Store {
        /// The URL (redacted).
        url: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

impl OpenError {
    /// Whether the text given was not a usable store URL (as opposed to a store that could not
    /// be opened).
    pub fn is_bad_url(&self) -> bool {
        matches!(
            self,
            Self::NoScheme { .. }
                | Self::UnknownScheme { .. }
                | Self::InvalidUrl { .. }
                | Self::FeatureDisabled { .. }
        )
    }
}

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
    url: Url,
    backend: &'static Backend,
}

impl StoreUrl {
    /// Parses `input`; see the [module docs](self) for the forms.
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

    /// The backend's name: `sqlite`, `postgres`, `redis` or `redis-cluster`.
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

fn split_host_port(node: &str) -> Option<(&str, Option<u16>)> {
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

/// Whether a query parameter named `name` holds a secret.
fn is_secret_param(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    ["pass", "pwd", "secret", "token", "auth"]
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

/// How a store is opened.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    migrate: bool,
}

impl OpenOptions {
    /// Reading only: the schema must already exist.
    pub fn new() -> Self {
        Self::default()
    }

    /// With `true`, create or upgrade the schema (and an SQLite file) while opening, as the
    /// store's own `migrate` does; this needs a role allowed to change the schema. On Redis it
    /// loads the scripts and checks the server's settings (there is no schema).
    pub fn migrate(mut self, migrate: bool) -> Self {
        self.migrate = migrate;
        self
    }

    /// Opens the store `url` names (a [`StoreUrl`] or text to parse).
    pub async fn open<U>(&self, url: U) -> Result<Opened, OpenError>
    where
        U: TryInto<StoreUrl>,
        U::Error: Into<OpenError>,
    {
        let url: StoreUrl = url.try_into().map_err(Into::into)?;
        match url.backend.open {
            Some(open) => open(&url, self).await,
            None => Err(OpenError::FeatureDisabled {
                url: url.to_string(),
                feature: url.backend.feature,
            }),
        }
    }
}

impl From<std::convert::Infallible> for OpenError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
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

/// Opens the store `url` names, reading only (the schema must exist): the one call most
/// programs need. See [`OpenOptions`] for migrating, and [`Opened`] for the engine's own type.
pub async fn open<U>(url: U) -> Result<Arc<dyn KeyStore>, OpenError>
where
    U: TryInto<StoreUrl>,
    U::Error: Into<OpenError>,
{
    Ok(OpenOptions::new().open(url).await?.into_store())
}

/// An opened store: the [`KeyStore`] to use, and the engine's own store type for what only it
/// offers (`SqliteStore::with_connection`, `PostgresStore::pool`, `check_config`, …).
pub struct Opened {
    store: Arc<dyn KeyStore>,
    engine: Box<dyn Any + Send + Sync>,
    url: StoreUrl,
}

impl fmt::Debug for Opened {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Opened")
            .field("url", &self.url)
            .field("store", &self.store)
            .finish()
    }
}

impl Opened {
    fn new<S: KeyStore + Clone + Send + Sync + 'static>(store: S, url: &StoreUrl) -> Self {
        Self {
            store: Arc::new(store.clone()),
            engine: Box::new(store),
            url: url.clone(),
        }
    }

    /// The store.
    pub fn store(&self) -> Arc<dyn KeyStore> {
        self.store.clone()
    }

    /// The store, consuming this.
    pub fn into_store(self) -> Arc<dyn KeyStore> {
        self.store
    }

    /// The URL it was opened from.
    pub fn url(&self) -> &StoreUrl {
        &self.url
    }

    /// The engine's own store (e.g. `idemkit::sqlite::SqliteStore`), if it is a `T`.
    pub fn engine<T: Any>(&self) -> Option<&T> {
        self.engine.downcast_ref()
    }
}

/// What a backend's opener returns.
type Opening<'a> = Pin<Box<dyn Future<Output = Result<Opened, OpenError>> + Send + 'a>>;

/// One backend: its URL schemes, its cargo feature, and its opener (when compiled in).
struct Backend {
    name: &'static str,
    schemes: &'static [&'static str],
    feature: &'static str,
    /// Checks a parsed URL's parts for this backend.
    check: fn(&StoreUrl) -> Result<(), OpenError>,
    open: Option<for<'a> fn(&'a StoreUrl, &'a OpenOptions) -> Opening<'a>>,
}

impl PartialEq for Backend {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name
    }
}

impl Eq for Backend {}

/// `Some(opener)` when `feature` is compiled in.
macro_rules! opener {
    ($feature:literal, $open:path) => {{
        #[cfg(feature = $feature)]
        let open: Option<for<'a> fn(&'a StoreUrl, &'a OpenOptions) -> Opening<'a>> =
            Some(|url, options| Box::pin($open(url, options)));
        #[cfg(not(feature = $feature))]
        let open: Option<for<'a> fn(&'a StoreUrl, &'a OpenOptions) -> Opening<'a>> = None;
        open
    }};
}

/// Every backend, one line each.
static BACKENDS: &[Backend] = &[
    Backend {
        name: "sqlite",
        schemes: &["sqlite"],
        feature: "sqlite",
        check: check_sqlite,
        open: opener!("sqlite", sqlite::open),
    },
    Backend {
        name: "postgres",
        schemes: &["postgres", "postgresql"],
        feature: "postgres",
        check: check_host,
        open: opener!("postgres", postgres::open),
    },
    Backend {
        name: "redis",
        schemes: &["redis", "rediss"],
        feature: "redis",
        check: check_host,
        open: opener!("redis", redis::open),
    },
    Backend {
        name: "redis-cluster",
        schemes: &["redis+cluster", "rediss+cluster"],
        feature: "redis",
        check: check_cluster,
        open: opener!("redis", redis::open_cluster),
    },
];

/// The known schemes, for people.
const KNOWN: &str = "sqlite://PATH, postgres://…, redis://…, rediss://…, redis+cluster://…";

fn invalid(url: &StoreUrl, reason: impl Into<String>) -> OpenError {
    OpenError::InvalidUrl {
        url: url.to_string(),
        reason: reason.into(),
        source: None,
    }
}

fn check_sqlite(url: &StoreUrl) -> Result<(), OpenError> {
    if url.url.query().is_some() {
        return Err(invalid(url, "sqlite URLs take no parameters"));
    }
    if url.sqlite_path().is_none_or(|p| p.as_os_str().is_empty()) {
        return Err(invalid(
            url,
            "sqlite:// needs a file path, e.g. sqlite://idem.db",
        ));
    }
    Ok(())
}

fn check_host(url: &StoreUrl) -> Result<(), OpenError> {
    if url.url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(url, "the URL names no host"));
    }
    Ok(())
}

fn check_cluster(url: &StoreUrl) -> Result<(), OpenError> {
    check_host(url)?;
    for (k, node) in url.url.query_pairs() {
        if k == "node" && split_host_port(&node).is_none() {
            return Err(invalid(url, format!("node={node:?} is not HOST:PORT")));
        }
    }
    Ok(())
}

fn store_error(url: &StoreUrl) -> impl FnOnce(StoreError) -> OpenError + '_ {
    move |source| OpenError::Store {
        url: url.to_string(),
        source,
    }
}

/// The schema check shared by the SQL stores.
fn check_version(url: &StoreUrl, found: i64, expected: i64) -> Result<(), OpenError> {
    use std::cmp::Ordering::*;
    match found.cmp(&expected) {
        Equal => Ok(()),
        Less => Err(OpenError::SchemaMissing {
            url: url.to_string(),
            found,
            expected,
        }),
        Greater => Err(OpenError::SchemaNewer {
            url: url.to_string(),
            found,
            expected,
        }),
    }
}

#[cfg(feature = "sqlite")]
mod sqlite {
    use super::*;
    use idem_store_sqlite::{SCHEMA_VERSION, SqliteStore};

    // SQLite's calls here are brief and blocking (a local file), as `SqliteStore::migrate` is.
    pub(super) async fn open(url: &StoreUrl, options: &OpenOptions) -> Result<Opened, OpenError> {
        let path = url.sqlite_path().unwrap_or_default();
        // Opening creates a missing file: only when migrating.
        if !options.migrate && !path.exists() {
            return Err(OpenError::NoDatabaseFile { path });
        }
        let store = SqliteStore::open(&path).map_err(store_error(url))?;
        if options.migrate {
            store.migrate().map_err(store_error(url))?;
        } else {
            let found = store.schema_version().map_err(store_error(url))?;
            check_version(url, found, SCHEMA_VERSION)?;
        }
        Ok(Opened::new(store, url))
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use idem_store_postgres::{PostgresStore, SCHEMA_VERSION};

    pub(super) async fn open(url: &StoreUrl, options: &OpenOptions) -> Result<Opened, OpenError> {
        let store = PostgresStore::connect(url.expose_secret())
            .await
            .map_err(store_error(url))?;
        if options.migrate {
            store.migrate().await.map_err(store_error(url))?;
        } else {
            let found = store.schema_version().await.map_err(store_error(url))?;
            check_version(url, found.into(), SCHEMA_VERSION.into())?;
        }
        Ok(Opened::new(store, url))
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use idem_store_redis::RedisStore;

    // Redis has no schema: migrating loads the scripts and checks the server's settings
    // (logging each warning); without it the scripts load on first use.
    async fn finish(
        store: RedisStore,
        url: &StoreUrl,
        options: &OpenOptions,
    ) -> Result<Opened, OpenError> {
        if options.migrate {
            store.migrate().await.map_err(store_error(url))?;
        }
        Ok(Opened::new(store, url))
    }

    pub(super) async fn open(url: &StoreUrl, options: &OpenOptions) -> Result<Opened, OpenError> {
        let store = RedisStore::connect(url.expose_secret())
            .await
            .map_err(store_error(url))?;
        finish(store, url, options).await
    }

    pub(super) async fn open_cluster(
        url: &StoreUrl,
        options: &OpenOptions,
    ) -> Result<Opened, OpenError> {
        let nodes = url
            .cluster_nodes()
            .ok_or_else(|| invalid(url, "cannot list the cluster's nodes"))?;
        let store = RedisStore::connect_cluster(nodes)
            .await
            .map_err(store_error(url))?;
        finish(store, url, options).await
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
