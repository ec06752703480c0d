//! Connecting: a standalone server or a cluster, with or without TLS.

use std::sync::Arc;
use std::time::Duration;

use idem_core::StoreError;
use redis::IntoConnectionInfo;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;

use crate::conn::Conn;
use crate::error::classify;
use crate::wake::{Hub, Source};
use crate::{RedisStore, durability};

fn endpoint(info: &redis::ConnectionInfo) -> String {
    // `ConnectionAddr` displays host and port only, never credentials.
    info.addr().to_string()
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
        let source = Source::single(&client);
        let manager = ConnectionManager::new_with_config(client, config)
            .await
            .map_err(|e| classify("connect", e))?;
        Ok(Self::new(Conn::Single(manager), endpoints, source))
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
        let urls: Vec<String> = urls.into_iter().map(|u| u.as_ref().to_owned()).collect();
        let (builder, endpoints) = Self::cluster_builder(&urls)?;
        let (subscriber, _) = Self::cluster_builder(&urls)?;
        Self::connect_cluster_with(builder, subscriber, endpoints).await
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
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        };
        let (builder, endpoints) = Self::cluster_builder(&urls)?;
        let (subscriber, _) = Self::cluster_builder(&urls)?;
        Self::connect_cluster_with(
            builder.certs(certs.clone()),
            subscriber.certs(certs),
            endpoints,
        )
        .await
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

    /// A store on the cluster `builder` reaches, subscribing (to wake waiting requests) through
    /// `subscriber`, the same settings, set here to RESP3.
    async fn connect_cluster_with(
        builder: redis::cluster::ClusterClientBuilder,
        subscriber: redis::cluster::ClusterClientBuilder,
        endpoints: Vec<String>,
    ) -> Result<Self, StoreError> {
        let client = builder.build().map_err(invalid_config)?;
        let subscriber = subscriber
            .use_protocol(redis::ProtocolVersion::RESP3)
            .build()
            .map_err(invalid_config)?;
        let mut store = Self::from_cluster_client(client).await?;
        store.endpoints = Arc::from(endpoints);
        store.hub = Arc::new(Hub::new(Source::Cluster(Box::new(subscriber))));
        Ok(store)
    }

    /// A store on a cluster through `client`'s multiplexed, reconnecting connection. Requests
    /// waiting for an in-flight answer are woken by sharded pub/sub only if `client` speaks
    /// RESP3 (`use_protocol`); otherwise they poll.
    pub async fn from_cluster_client(client: ClusterClient) -> Result<Self, StoreError> {
        ensure_crypto_provider();
        let conn = client
            .get_async_connection()
            .await
            .map_err(|e| classify("connect", e))?;
        Ok(Self::new(
            Conn::Cluster(conn),
            vec!["cluster".to_owned()],
            Source::Cluster(Box::new(client)),
        ))
    }

    /// A store on a [`ConnectionManager`] the caller made. With no client to subscribe with,
    /// requests waiting for an in-flight answer poll the record; [`RedisStore::from_client`]
    /// wakes them by pub/sub.
    pub fn from_connection_manager(manager: ConnectionManager) -> Self {
        Self::new(
            Conn::Single(manager),
            vec!["standalone".to_owned()],
            Source::None,
        )
    }

    fn new(conn: Conn, endpoints: Vec<String>, source: Source) -> Self {
        Self {
            conn,
            prefix: Arc::from(Self::DEFAULT_PREFIX),
            gc_margin: Self::DEFAULT_GC_MARGIN,
            endpoints: endpoints.into(),
            wait: None,
            waitaof: durability::waitaof_cell(),
            hub: Arc::new(Hub::new(source)),
        }
    }
}
