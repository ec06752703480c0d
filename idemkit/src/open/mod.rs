//! Opening a store from a URL: `sqlite://PATH`, `postgres://…`, `redis://…`, `rediss://…`,
//! `redis+cluster://…`, `dynamodb://TABLE`.
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
//! | `postgres://…`, `postgresql://…` | `PostgresStore` in `public.idem_records`; parameters go to sqlx (`?sslmode=…`, `?password=…`), except the store's own: `&listen_url=…` a direct URL to `LISTEN` on behind a transaction pooler such as PgBouncer (which the store finds by itself; `?pooler=transaction`, `session` or `none` says it and skips the check) | `postgres` |
//! | `redis://…`, `rediss://…` | `RedisStore` on a standalone server | `redis` |
//! | `redis+cluster://[USER:PASS@]HOST:PORT[?node=HOST:PORT&node=…]`, `rediss+cluster://…` | `RedisStore` on a Redis Cluster, seeded by every node named | `redis` |
//! | `dynamodb://TABLE[?region=REGION][&endpoint=URL]` | `DynamoStore` on the table; credentials (and the region, if not given) from the AWS SDK's configuration chain | `dynamodb` |
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

mod error;
mod store_url;

pub use error::OpenError;
pub use store_url::StoreUrl;
use store_url::split_host_port;

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use idem_core::{KeyStore, Maintenance, StoreError};

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

    /// With `true`, create or upgrade the schema (and an SQLite file) while opening, with
    /// [`Maintenance::migrate`]; this needs a role allowed to change the schema. On Redis it
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

/// Opens the store `url` names, reading only (the schema must exist): the one call most
/// programs need. See [`OpenOptions`] for migrating, and [`Opened`] for the engine's own type.
pub async fn open<U>(url: U) -> Result<Arc<dyn KeyStore>, OpenError>
where
    U: TryInto<StoreUrl>,
    U::Error: Into<OpenError>,
{
    Ok(OpenOptions::new().open(url).await?.into_store())
}

/// An opened store: the [`KeyStore`] to use, its [`Maintenance`] (migrate, schema version,
/// configuration warnings), and the engine's own store type for what only it offers
/// (`SqliteStore::with_connection`, `PostgresStore::pool`, …).
pub struct Opened {
    store: Arc<dyn KeyStore>,
    maintenance: Arc<dyn Maintenance>,
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
    fn new<S: KeyStore + Maintenance + Clone>(store: S, url: &StoreUrl) -> Self {
        Self {
            store: Arc::new(store.clone()),
            maintenance: Arc::new(store.clone()),
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

    /// The store's maintenance: migrate, schema version, configuration warnings (the same
    /// for every backend, no downcast needed).
    pub fn maintenance(&self) -> &dyn Maintenance {
        &*self.maintenance
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
    Backend {
        name: "dynamodb",
        schemes: &["dynamodb"],
        feature: "dynamodb",
        check: check_dynamodb,
        open: opener!("dynamodb", dynamodb::open),
    },
];

/// The known schemes, for people.
const KNOWN: &str =
    "sqlite://PATH, postgres://…, redis://…, rediss://…, redis+cluster://…, dynamodb://TABLE";

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

fn check_dynamodb(url: &StoreUrl) -> Result<(), OpenError> {
    if url.url.host_str().is_none_or(str::is_empty) {
        return Err(invalid(
            url,
            "dynamodb:// needs a table name, e.g. dynamodb://idem_records?region=eu-west-1",
        ));
    }
    for (k, _) in url.url.query_pairs() {
        if !matches!(&*k, "region" | "endpoint") {
            return Err(invalid(
                url,
                format!("dynamodb:// takes region= and endpoint= only, not {k}="),
            ));
        }
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

/// What every backend does once its store is built: migrate when asked, else check that the
/// schema is the one this build reads and writes.
#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "dynamodb"
))]
async fn finish<S: KeyStore + Maintenance + Clone>(
    store: S,
    url: &StoreUrl,
    options: &OpenOptions,
) -> Result<Opened, OpenError> {
    if options.migrate {
        store.migrate().await.map_err(store_error(url))?;
    } else {
        let found = store.schema_version().await.map_err(store_error(url))?;
        check_version(url, found, store.latest_schema_version())?;
    }
    Ok(Opened::new(store, url))
}

#[cfg(any(
    feature = "sqlite",
    feature = "postgres",
    feature = "redis",
    feature = "dynamodb"
))]
fn check_version(url: &StoreUrl, found: u32, expected: u32) -> Result<(), OpenError> {
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
    use idem_store_sqlite::SqliteStore;

    // Opening the file, like migrating it, is a brief blocking call on a local file.
    pub(super) async fn open(url: &StoreUrl, options: &OpenOptions) -> Result<Opened, OpenError> {
        let path = url.sqlite_path().unwrap_or_default();
        // Opening creates a missing file: only when migrating.
        if !options.migrate && !path.exists() {
            return Err(OpenError::NoDatabaseFile { path });
        }
        let store = SqliteStore::open(&path).map_err(store_error(url))?;
        finish(store, url, options).await
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::*;
    use idem_store_postgres::PostgresStore;

    pub(super) async fn open(url: &StoreUrl, options: &OpenOptions) -> Result<Opened, OpenError> {
        let store = PostgresStore::connect(url.expose_secret())
            .await
            .map_err(store_error(url))?;
        finish(store, url, options).await
    }
}

#[cfg(feature = "redis")]
mod redis {
    use super::*;
    use idem_store_redis::RedisStore;

    // Redis has no schema: migrating loads the scripts and checks the server's settings
    // (logging each warning); without it the scripts load on first use.
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

#[cfg(feature = "dynamodb")]
mod dynamodb {
    use super::*;
    use idem_store_dynamodb::DynamoStore;

    // Sends no request: migrating creates the table (on-demand, TTL on); without it the
    // schema item must be there.
    pub(super) async fn open(url: &StoreUrl, options: &OpenOptions) -> Result<Opened, OpenError> {
        let store = DynamoStore::connect(url.expose_secret())
            .await
            .map_err(store_error(url))?;
        finish(store, url, options).await
    }
}
