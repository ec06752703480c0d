#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

mod config;
mod durability;
mod error;
mod keys;
mod record;
mod scripts;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use idem_core::machine::{
    self, ClaimAnswer, ClaimKind, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, ListFilter, Outcome, Policy, Record, Scope, StalePolicy,
    StoreError, Timestamp, Token, async_trait,
};
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, IntoConnectionInfo, Pipeline, RedisFuture, Value};

pub use config::{ConfigReport, ConfigWarning, NodeConfig};
pub use durability::{InvalidWait, WaitForReplicas};
pub use keys::{BUCKETS, InvalidPrefix};
/// The driver this crate is built on, re-exported so callers use the same version.
pub use redis;

use error::classify;
use keys::{BucketKeys, RecordKeys, check_prefix};
use record::Fields;
use scripts::{CLAIM_SCRIPT, COMPLETE_SCRIPT, EXTEND_SCRIPT, PURGE_SCRIPT, RELEASE_SCRIPT};

/// Native expiries at or beyond this many milliseconds are not set (the record is kept until
/// purged): Lua numbers are doubles, exact only below 2^53.
const MAX_NATIVE_TTL_MS: u64 = 1 << 53;

/// How many index entries one `purge_expired` script handles at most.
const PURGE_BATCH: usize = 256;

/// How many index entries `list_in_flight` reads per page.
const LIST_PAGE: usize = 256;

/// A reconnecting, multiplexed connection to a standalone server or to a cluster.
#[derive(Clone)]
enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        cmd: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(cmd, offset, count),
            Self::Cluster(c) => c.req_packed_commands(cmd, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// A [`KeyStore`] on Redis or Redis Cluster.
///
/// - Every operation is one Lua script run with `EVALSHA` (loaded again on `NOSCRIPT`): one round
///   trip, atomic on the server, deciding expiry and leases against the caller's `now`.
/// - A record is one hash; it and its bucket's two index entries share a hash tag, so each
///   script touches one cluster slot. `list_in_flight` and `purge_expired` walk the
///   [`BUCKETS`] per-bucket indexes (no single hot index key).
/// - Native expiry (`PEXPIRE`, relative, `ttl + gc margin`) only collects garbage; it never
///   decides whether a record exists.
///
/// Clones share the connection. See the crate documentation for the layout and the durability
/// trade-offs.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    prefix: Arc<str>,
    gc_margin: Duration,
    endpoints: Arc<[String]>,
    wait: Option<WaitForReplicas>,
    waitaof: Arc<durability::WaitAofSupport>,
}

impl fmt::Debug for RedisStore {
    // Hand-written: the client's connection info holds the password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field(
                "mode",
                &if self.is_cluster() {
                    "cluster"
                } else {
                    "standalone"
                },
            )
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .field("gc_margin", &self.gc_margin)
            .field("wait_for_replicas", &self.wait)
            .finish_non_exhaustive()
    }
}

fn endpoint(info: &redis::ConnectionInfo) -> String {
    // `ConnectionAddr` displays host and port only, never credentials.
    info.addr().to_string()
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn invalid_config(err: redis::RedisError) -> StoreError {
    StoreError::Misconfigured {
        message: format!("redis: {err}"),
    }
}

/// Refuses a `rediss://` URL when this build has no TLS, naming the feature that adds it (the
/// driver alone would only say that "the feature is not enabled").
fn check_tls_built(url: &str) -> Result<(), StoreError> {
    let wants_tls = url
        .get(..9)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("rediss://"));
    if wants_tls && !cfg!(feature = "rustls") {
        return Err(StoreError::Misconfigured {
            message:
                "redis: a rediss:// URL needs TLS, which this build lacks: enable the `rustls` \
                      feature of idem-store-redis (of idemkit, with `redis`)"
                    .to_owned(),
        });
    }
    Ok(())
}

/// The driver builds its TLS configuration with rustls' process-wide crypto provider, and there
/// is none unless exactly one provider is compiled in or the application installed one: install
/// ring (what this crate's `rustls` feature compiles in) if nobody did.
fn ensure_crypto_provider() {
    #[cfg(feature = "rustls")]
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race with another installer is fine: a provider is installed either way.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The CA certificates (PEM) in `ca_file`, checked to hold at least one certificate.
#[cfg(feature = "rustls")]
fn read_ca_file(ca_file: &std::path::Path) -> Result<Vec<u8>, StoreError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let misconfigured = |why: String| StoreError::Misconfigured {
        message: format!("redis: CA file {}: {why}", ca_file.display()),
    };
    let pem = std::fs::read(ca_file).map_err(|e| misconfigured(format!("cannot be read ({e})")))?;
    let mut certs = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        cert.map_err(|e| misconfigured(format!("not PEM certificates ({e})")))?;
        certs += 1;
    }
    if certs == 0 {
        return Err(misconfigured("holds no PEM certificate".to_owned()));
    }
    Ok(pem)
}

/// Refuses a URL that does not ask for TLS where the caller named a CA to verify it with.
#[cfg(feature = "rustls")]
fn check_tls_url(info: &redis::ConnectionInfo) -> Result<(), StoreError> {
    match info.addr() {
        redis::ConnectionAddr::TcpTls { .. } => Ok(()),
        _ => Err(StoreError::Misconfigured {
            message: format!(
                "redis: a CA file was given but {} is not a rediss:// address",
                endpoint(info)
            ),
        }),
    }
}

impl RedisStore {
    /// The default key prefix: `idem`.
    pub const DEFAULT_PREFIX: &'static str = "idem";
    /// The default garbage-collection margin: one hour past a record's logical expiry.
    pub const DEFAULT_GC_MARGIN: Duration = Duration::from_secs(3600);

    /// The connection settings [`RedisStore::connect`] uses: 5 s to connect, 10 s for a reply,
    /// and no waiting reconnection attempts (the driver's default retries a failed reconnection 6
    /// times, with a jittered back-off from 100 ms), so calls fail fast with
    /// [`StoreError::Unavailable`] while the server is down; each new call reconnects in the
    /// background, and calls succeed again as soon as it is back.
    pub fn default_connection_config() -> ConnectionManagerConfig {
        ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(10)))
            .set_number_of_retries(0)
    }

    /// Connects to a standalone server, e.g. `redis://:password@host:6379/0`, or over TLS
    /// (feature `rustls`) `rediss://:password@host:6380/0`, verifying the server's certificate
    /// against the system's roots (`SSL_CERT_FILE` and `SSL_CERT_DIR`, when set, replace them).
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        check_tls_built(url)?;
        let client = redis::Client::open(url).map_err(invalid_config)?;
        Self::from_client(client, Self::default_connection_config()).await
    }

    /// Connects to a standalone server over TLS (`rediss://host:port`), trusting only the CA
    /// certificates (PEM) in `ca_file`: for a private certificate authority. The server's
    /// certificate must name the host of the URL.
    ///
    /// A file that cannot be read or holds no PEM certificate, or a `redis://` URL, is
    /// [`StoreError::Misconfigured`]; a server whose certificate that CA did not sign is refused
    /// ([`StoreError::Unavailable`], the TLS error kept as the source).
    #[cfg(feature = "rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
    pub async fn connect_with_ca(
        url: &str,
        ca_file: impl AsRef<std::path::Path>,
    ) -> Result<Self, StoreError> {
        let info = url.into_connection_info().map_err(invalid_config)?;
        check_tls_url(&info)?;
        let pem = read_ca_file(ca_file.as_ref())?;
        let client = redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(pem),
            },
        )
        .map_err(invalid_config)?;
        Self::from_client(client, Self::default_connection_config()).await
    }

    /// A store on a standalone server through a [`ConnectionManager`] made with `config`.
    pub async fn from_client(
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> Result<Self, StoreError> {
        ensure_crypto_provider();
        let endpoints = vec![endpoint(client.get_connection_info())];
        let manager = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| classify("connect", e))?;
        Ok(Self::new(Conn::Single(manager), endpoints))
    }

    /// Connects to a Redis Cluster through any of its nodes, e.g. `["redis://10.0.0.1:7000",
    /// "redis://10.0.0.2:7000"]`, with 5 s to connect, 10 s for a reply and 3 retries of a
    /// command on a moved slot or a broken connection (safe: every script recognises a second
    /// delivery of itself). With `rediss://` URLs (feature `rustls`) every node is reached over
    /// TLS, its certificate verified against the system's roots (`SSL_CERT_FILE` and
    /// `SSL_CERT_DIR`, when set, replace them).
    pub async fn connect_cluster<I, S>(urls: I) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let (builder, endpoints) = Self::cluster_builder(urls)?;
        Self::connect_cluster_with(builder, endpoints).await
    }

    /// [`RedisStore::connect_cluster`] over TLS (`rediss://` URLs), trusting only the CA
    /// certificates (PEM) in `ca_file`. Refuses what [`RedisStore::connect_with_ca`] refuses.
    #[cfg(feature = "rustls")]
    #[cfg_attr(docsrs, doc(cfg(feature = "rustls")))]
    pub async fn connect_cluster_with_ca<I, S>(
        urls: I,
        ca_file: impl AsRef<std::path::Path>,
    ) -> Result<Self, StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        for url in &urls {
            check_tls_url(
                &url.as_str()
                    .into_connection_info()
                    .map_err(invalid_config)?,
            )?;
        }
        let pem = read_ca_file(ca_file.as_ref())?;
        let (builder, endpoints) = Self::cluster_builder(urls)?;
        let builder = builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        });
        Self::connect_cluster_with(builder, endpoints).await
    }

    /// The builder [`RedisStore::connect_cluster`] uses, and the nodes' `host:port`s.
    fn cluster_builder<I, S>(
        urls: I,
    ) -> Result<(redis::cluster::ClusterClientBuilder, Vec<String>), StoreError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        for url in &urls {
            check_tls_built(url)?;
        }
        let endpoints: Vec<String> = urls
            .iter()
            .filter_map(|u| u.as_str().into_connection_info().ok())
            .map(|info| endpoint(&info))
            .collect();
        let builder = ClusterClient::builder(urls)
            .connection_timeout(Duration::from_secs(5))
            .response_timeout(Duration::from_secs(10))
            .retries(3);
        Ok((builder, endpoints))
    }

    async fn connect_cluster_with(
        builder: redis::cluster::ClusterClientBuilder,
        endpoints: Vec<String>,
    ) -> Result<Self, StoreError> {
        let client = builder.build().map_err(invalid_config)?;
        let mut store = Self::from_cluster_client(client).await?;
        store.endpoints = Arc::from(endpoints);
        Ok(store)
    }

    /// A store on a cluster through `client`'s multiplexed, reconnecting connection.
    pub async fn from_cluster_client(client: ClusterClient) -> Result<Self, StoreError> {
        ensure_crypto_provider();
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| classify("connect", e))?;
        Ok(Self::new(Conn::Cluster(conn), vec!["cluster".to_owned()]))
    }

    /// A store on a [`ConnectionManager`] the caller made.
    pub fn from_connection_manager(manager: ConnectionManager) -> Self {
        Self::new(Conn::Single(manager), vec!["standalone".to_owned()])
    }

    fn new(conn: Conn, endpoints: Vec<String>) -> Self {
        Self {
            conn,
            prefix: Arc::from(Self::DEFAULT_PREFIX),
            gc_margin: Self::DEFAULT_GC_MARGIN,
            endpoints: endpoints.into(),
            wait: None,
            waitaof: durability::waitaof_cell(),
        }
    }

    /// The same store with keys under `prefix` instead of `idem` (for several applications on
    /// one server). 1 to 64 bytes of visible ASCII without `{` or `}`. Every handle on the same
    /// records must use the same prefix.
    pub fn with_prefix(mut self, prefix: &str) -> Result<Self, InvalidPrefix> {
        check_prefix(prefix)?;
        self.prefix = Arc::from(prefix);
        Ok(self)
    }

    /// The same store with a different garbage-collection margin: how long past its logical
    /// expiry (by the writer's clock) the server keeps a record before deleting it natively. It
    /// must exceed the clock skew between the store's callers; the default is one hour.
    pub fn with_gc_margin(mut self, margin: Duration) -> Self {
        self.gc_margin = margin;
        self
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Whether the store runs on a cluster.
    pub fn is_cluster(&self) -> bool {
        matches!(self.conn, Conn::Cluster(_))
    }

    /// Prepares the server: loads the scripts (on every master of a cluster; they are loaded
    /// again on demand anyway, the script cache being volatile) and runs
    /// [`RedisStore::check_config`], logging each warning with `tracing`. There is no schema.
    /// Returns the report; warnings do not fail it.
    pub async fn migrate(&self) -> Result<ConfigReport, StoreError> {
        let mut conn = self.conn.clone();
        for script in scripts::all() {
            script
                .prepare_invoke()
                .load_async(&mut conn)
                .await
                .map_err(|e| classify("script load", e))?;
        }
        let report = self.check_config().await?;
        for warning in &report.warnings {
            tracing::warn!(backend = "redis", "{warning}");
        }
        if report.is_safe() {
            tracing::info!(
                backend = "redis",
                nodes = report.nodes.len(),
                "redis settings checked: no eviction, persistence on"
            );
        }
        Ok(report)
    }

    fn native_ttl(&self, ttl: Duration) -> String {
        let ms = millis(ttl).saturating_add(millis(self.gc_margin));
        if ms >= MAX_NATIVE_TTL_MS {
            String::new()
        } else {
            ms.to_string()
        }
    }

    fn conn(&self) -> Conn {
        self.conn.clone()
    }
}

impl RedisStore {
    async fn release_script(
        &self,
        keys: &RecordKeys,
        token: Token,
        now: Timestamp,
        nonce: &str,
    ) -> Result<String, StoreError> {
        RELEASE_SCRIPT
            .key(&keys.record)
            .key(&keys.lease_index)
            .arg(nonce)
            .arg(now.as_millis())
            .arg(token.seq)
            .arg(token.id_hex())
            .arg(&keys.member)
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| classify("release", e))
    }

    /// Gives back a claim whose confirmation failed, without waiting for replicas: if this
    /// release is lost too, the claim stays `processing` for its lease and reconciliation,
    /// which is safe (the operation never ran).
    async fn release_unconfirmed(
        &self,
        keys: &RecordKeys,
        token: Token,
        now: Timestamp,
    ) -> Result<String, StoreError> {
        self.release_script(keys, token, now, &nonce()).await
    }
}

fn nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn utf8(what: &str, bytes: &[u8]) -> Result<String, StoreError> {
    String::from_utf8(bytes.to_vec())
        .map_err(|_| StoreError::corrupt(format!("redis script: {what} is not UTF-8")))
}

fn parse_claim(reply: &[Vec<u8>], token_id: u128) -> Result<ClaimAnswer, StoreError> {
    let field = |i: usize| -> Result<String, StoreError> {
        let bytes = reply
            .get(i)
            .ok_or_else(|| StoreError::corrupt("redis claim script: short answer"))?;
        utf8("answer", bytes)
    };
    match field(0)?.as_str() {
        "claimed" => {
            let seq = record::number("token seq", &field(1)?)?;
            let attempt = record::number("attempt", &field(2)?)?;
            let kind = match field(3)?.as_str() {
                "new" => ClaimKind::New,
                "expired_replaced" => ClaimKind::ExpiredReplaced,
                "retry" => ClaimKind::Retry,
                "taken_over" => ClaimKind::TakenOver,
                other => {
                    return Err(StoreError::corrupt(format!(
                        "redis record: claim kind {other:?}"
                    )));
                }
            };
            Ok(ClaimAnswer::Claimed {
                token: Token::with_id(seq, token_id),
                attempt,
                kind,
            })
        }
        "replay" => {
            let body = reply
                .get(2)
                .ok_or_else(|| StoreError::corrupt("redis claim script: short answer"))?;
            Ok(ClaimAnswer::Replay(record::outcome(
                &field(1)?,
                body,
                &field(3)?,
            )?))
        }
        "in_flight" => {
            let ms: u64 = record::number("retry_after", &field(1)?)?;
            Ok(ClaimAnswer::InFlight {
                retry_after: Duration::from_millis(ms.max(1)),
                stale: field(2)? == "1",
            })
        }
        "mismatch" => Ok(ClaimAnswer::FingerprintMismatch),
        "corrupt" => Err(StoreError::corrupt(format!("redis record: {}", field(1)?))),
        other => Err(StoreError::corrupt(format!(
            "redis claim script: unknown answer {other:?}"
        ))),
    }
}

#[async_trait]
impl KeyStore for RedisStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let token_id: u128 = rand::random();
        let takeover = match policy.stale() {
            StalePolicy::Takeover => "1",
            StalePolicy::Reconcile => "0",
        };
        let reply: Vec<Vec<u8>> = CLAIM_SCRIPT
            .key(&keys.record)
            .key(&keys.expiry_index)
            .key(&keys.lease_index)
            .arg(format!("{token_id:032x}"))
            .arg(fingerprint.as_str())
            .arg(now.as_millis())
            .arg((now + policy.lease()).as_millis())
            .arg((now + policy.ttl()).as_millis())
            .arg(millis(policy.lease()).max(1))
            .arg(takeover)
            .arg(scope.as_str())
            .arg(key.as_str())
            .arg(&keys.member)
            .arg(self.native_ttl(policy.ttl()))
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| classify("claim", e))?;
        let answer = parse_claim(&reply, token_id)?;
        if let ClaimAnswer::Claimed { token, .. } = &answer
            && let Err(e) = self
                .confirm("claim", &keys.record, &format!("{token_id:032x}"))
                .await
        {
            // Nothing ran on this claim: give it back (best effort, unconfirmed) so the next
            // retry claims at once instead of waiting for the lease.
            let _ = self.release_unconfirmed(&keys, *token, now).await;
            return Err(e);
        }
        Ok(answer)
    }

    async fn complete(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        machine::check_outcome_size(outcome, policy)?;
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let state = machine::completed_state(outcome, policy);
        let nonce = nonce();
        let reply: String = COMPLETE_SCRIPT
            .key(&keys.record)
            .key(&keys.expiry_index)
            .key(&keys.lease_index)
            .arg(&nonce)
            .arg(now.as_millis())
            .arg(token.seq)
            .arg(token.id_hex())
            .arg(state.as_str())
            .arg(outcome.status())
            .arg(outcome.body())
            .arg(outcome.class().as_str())
            .arg((now + policy.ttl()).as_millis())
            .arg(&keys.member)
            .arg(self.native_ttl(policy.ttl()))
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| classify("complete", e))?;
        if matches!(reply.as_str(), "completed" | "marked_retryable") {
            self.confirm("complete", &keys.record, &nonce).await?;
        }
        match reply.as_str() {
            "completed" => Ok(CompleteAnswer::Completed),
            "marked_retryable" => Ok(CompleteAnswer::MarkedRetryable),
            "fenced" => Ok(CompleteAnswer::Fenced),
            other => Err(StoreError::corrupt(format!(
                "redis complete script: unknown answer {other:?}"
            ))),
        }
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let nonce = nonce();
        let reply = self.release_script(&keys, token, now, &nonce).await?;
        if reply == "released" {
            self.confirm("release", &keys.record, &nonce).await?;
        }
        match reply.as_str() {
            "released" => Ok(ReleaseAnswer::Released),
            "fenced" => Ok(ReleaseAnswer::Fenced),
            other => Err(StoreError::corrupt(format!(
                "redis release script: unknown answer {other:?}"
            ))),
        }
    }

    async fn extend(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        machine::check_lease(lease)?;
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let lease_until = now + lease;
        let nonce = nonce();
        let reply: Vec<String> = EXTEND_SCRIPT
            .key(&keys.record)
            .key(&keys.expiry_index)
            .key(&keys.lease_index)
            .arg(&nonce)
            .arg(now.as_millis())
            .arg(token.seq)
            .arg(token.id_hex())
            .arg(lease_until.as_millis())
            .arg(&keys.member)
            .arg(millis(self.gc_margin))
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| classify("extend", e))?;
        if reply.first().map(String::as_str) == Some("extended") {
            self.confirm("extend", &keys.record, &nonce).await?;
        }
        match reply.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["extended", stored] => match stored.parse::<u64>() {
                Ok(ms) => Ok(ExtendAnswer::Extended {
                    lease_until: Timestamp::from_millis(ms),
                }),
                Err(_) => Err(StoreError::corrupt(format!(
                    "redis extend script: lease_until {stored:?} is not a number"
                ))),
            },
            ["fenced"] => Ok(ExtendAnswer::Fenced),
            ["corrupt", why] => Err(StoreError::corrupt(format!("redis record: {why}"))),
            _ => Err(StoreError::corrupt(format!(
                "redis extend script: unknown answer {reply:?}"
            ))),
        }
    }

    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let fields: Fields = redis::cmd("HGETALL")
            .arg(&keys.record)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| classify("get", e))?;
        Ok(record::record(&fields)?.filter(|r| !r.is_expired(now)))
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut conn = self.conn();
        let mut stale = Vec::new();
        if limit == 0 {
            return Ok(stale);
        }
        for bucket in 0..BUCKETS {
            let keys = BucketKeys::new(&self.prefix, bucket);
            let (mut found, mut offset) = (0usize, 0usize);
            loop {
                // The index holds the `processing` records by lease; the records decide.
                let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                    .arg(&keys.lease_index)
                    .arg("-inf")
                    .arg(older_than.as_millis())
                    .arg("LIMIT")
                    .arg(offset)
                    .arg(LIST_PAGE)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| classify("list_in_flight", e))?;
                if members.is_empty() {
                    break;
                }
                let mut pipe = redis::pipe();
                for m in &members {
                    pipe.cmd("HGETALL").arg(keys.record(m));
                }
                let replies: Vec<Fields> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| classify("list_in_flight", e))?;
                for fields in &replies {
                    match record::record(fields) {
                        Ok(Some(r)) if r.is_stale_processing(older_than) => {
                            found += 1;
                            stale.push(r);
                        }
                        Ok(_) => {}
                        // One unreadable record must not stop reconciliation of the others.
                        Err(e) => {
                            tracing::warn!(backend = "redis", error = %e, "list_in_flight skipped a corrupt record")
                        }
                    }
                }
                if found >= limit || members.len() < LIST_PAGE {
                    break;
                }
                offset += members.len();
            }
        }
        stale.sort_by(|a, b| {
            (a.lease_until, &a.scope, &a.key).cmp(&(b.lease_until, &b.scope, &b.key))
        });
        stale.truncate(limit);
        Ok(stale)
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut conn = self.conn();
        let mut found = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        // A member is `<hex scope>:<hex key>`, so a scope filters members before any record is
        // read. `processing` records are read from the lease index, the others from the expiry
        // index, from `now` on (the live ones).
        let scope_prefix = filter
            .scope
            .as_ref()
            .map(|s| format!("{}:", keys::hex(s.as_str().as_bytes())));
        for bucket in 0..BUCKETS {
            let bucket_keys = BucketKeys::new(&self.prefix, bucket);
            let (index, min) = match filter.state {
                Some(idem_core::RecordState::Processing) => {
                    (&bucket_keys.lease_index, "-inf".to_owned())
                }
                _ => (&bucket_keys.expiry_index, format!("({}", now.as_millis())),
            };
            let mut offset = 0usize;
            loop {
                let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                    .arg(index)
                    .arg(&min)
                    .arg("+inf")
                    .arg("LIMIT")
                    .arg(offset)
                    .arg(LIST_PAGE)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| classify("list", e))?;
                let wanted: Vec<&String> = members
                    .iter()
                    .filter(|m| scope_prefix.as_ref().is_none_or(|p| m.starts_with(p)))
                    .collect();
                if !wanted.is_empty() {
                    let mut pipe = redis::pipe();
                    for m in &wanted {
                        pipe.cmd("HGETALL").arg(bucket_keys.record(m));
                    }
                    let replies: Vec<Fields> = pipe
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| classify("list", e))?;
                    for fields in &replies {
                        match record::record(fields) {
                            Ok(Some(r)) if filter.matches(&r, now) => found.push(r),
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(backend = "redis", error = %e, "list skipped a corrupt record")
                            }
                        }
                    }
                }
                if members.len() < LIST_PAGE {
                    break;
                }
                offset += members.len();
            }
        }
        ListFilter::order_and_truncate(&mut found, limit);
        Ok(found)
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        let mut conn = self.conn();
        let mut deleted = 0usize;
        for bucket in 0..BUCKETS {
            if deleted >= limit {
                break;
            }
            let keys = BucketKeys::new(&self.prefix, bucket);
            while deleted < limit {
                let want = (limit - deleted).min(PURGE_BATCH);
                let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                    .arg(&keys.expiry_index)
                    .arg("-inf")
                    .arg(now.as_millis())
                    .arg("LIMIT")
                    .arg(0)
                    .arg(want)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| classify("purge_expired", e))?;
                if members.is_empty() {
                    break;
                }
                // The script re-checks each candidate against `now`: the index was read outside it.
                let mut invocation = PURGE_SCRIPT.prepare_invoke();
                invocation.key(&keys.expiry_index).key(&keys.lease_index);
                for m in &members {
                    invocation.key(keys.record(m));
                }
                invocation.arg(now.as_millis());
                for m in &members {
                    invocation.arg(m);
                }
                let n: usize = invocation
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| classify("purge_expired", e))?;
                deleted += n;
                if members.len() < want {
                    break;
                }
            }
        }
        Ok(deleted)
    }

    fn backend(&self) -> &'static str {
        "redis"
    }
}
