//! The tool client over `https://`: a tool behind the layer, served with TLS on loopback with a
//! certificate from a certificate authority made in-process (rcgen). A client that trusts that CA
//! (the caller's own `reqwest::Client`) calls it, once per key however often it asks; a client
//! that does not is refused at once, without retrying and without the tool running.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::serve::Listener as _;
use idem_core::{Executor, IdempotencyKey, MemoryStore};
use idem_http::IdempotencyLayer;
use idem_http::client::{ClientError, RetryPolicy, ToolClient};
use serde_json::json;
use tokio_rustls::rustls;

/// A CA and a server certificate it signed for localhost and 127.0.0.1: (CA PEM, chain, key).
fn certificates() -> (
    String,
    Vec<rustls::pki_types::CertificateDer<'static>>,
    rustls::pki_types::PrivateKeyDer<'static>,
) {
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "idem test CA");
    ca.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
    ];
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let ca = ca.self_signed(&ca_key).unwrap();
    let leaf = rcgen::CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()]).unwrap();
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let leaf = leaf.signed_by(&leaf_key, &ca, &ca_key).unwrap();
    (
        ca.pem(),
        vec![leaf.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(leaf_key.serialize_der().into()),
    )
}

/// TCP connections that complete a TLS handshake; a failed handshake (a client that refused the
/// certificate) is dropped and the listener waits for the next.
struct TlsListener {
    tcp: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = tokio_rustls::server::TlsStream<tokio::net::TcpStream>;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((tcp, addr)) = self.tcp.accept().await else {
                continue;
            };
            if let Ok(tls) = self.acceptor.accept(tcp).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}

/// The create_ticket tool behind the layer over TLS; answers its base URL (`https://127.0.0.1:…`)
/// and the CA's PEM. `tickets` counts executions.
async fn https_tool(tickets: Arc<AtomicU32>) -> (String, String) {
    let (ca_pem, chain, key) = certificates();
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    let executor = Executor::new(MemoryStore::new());
    let layer = IdempotencyLayer::new(executor, |_| Ok("public".into()));
    let tool = move || async move {
        let n = tickets.fetch_add(1, Ordering::SeqCst) + 1;
        (
            StatusCode::CREATED,
            axum::Json(json!({"ticket_id": format!("T-{n}")})),
        )
    };
    let app = Router::new()
        .route("/tools/create_ticket", post(tool))
        .route_layer(layer)
        .route(
            "/tools",
            get(|| async {
                axum::Json(
                    json!({"tools": [{"name": "create_ticket", "min_client_deadline_ms": 1500}]}),
                )
            }),
        );
    let listener = TlsListener {
        tcp: tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap(),
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
    };
    let base = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (base, ca_pem)
}

#[tokio::test]
async fn https_with_the_callers_client_runs_once_per_key() {
    let tickets = Arc::new(AtomicU32::new(0));
    let (base, ca_pem) = https_tool(tickets.clone()).await;
    let http = idem_http::client::http_client_builder()
        .tls_certs_merge([reqwest::Certificate::from_pem(ca_pem.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let client = ToolClient::discover_with(
        http,
        &format!("{base}/tools"),
        "create_ticket",
        format!("{base}/tools/create_ticket"),
        RetryPolicy::default(),
    )
    .await
    .unwrap();
    assert_eq!(
        client.min_client_deadline(),
        Some(Duration::from_millis(1500))
    );
    let key = IdempotencyKey::new("wf-1:step-1").unwrap();
    let args = json!({"title": "printer on fire"});
    let first = client.call(&key, &args).await.unwrap();
    let second = client.call(&key, &args).await.unwrap();
    assert_eq!(first.status, StatusCode::CREATED);
    assert!(!first.replayed);
    assert!(second.replayed);
    assert_eq!(second.original_response(), first.original_response());
    assert_eq!(tickets.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn an_untrusted_certificate_is_refused_at_once() {
    let tickets = Arc::new(AtomicU32::new(0));
    let (base, _) = https_tool(tickets.clone()).await;
    // Clients that do not trust the test CA: the system's roots (`new`), and one trusting another
    // CA.
    let (other_ca, _, _) = certificates();
    let other = idem_http::client::http_client_builder()
        .tls_certs_only([reqwest::Certificate::from_pem(other_ca.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let url = format!("{base}/tools/create_ticket");
    let policy = RetryPolicy {
        overall_deadline: Duration::from_secs(30),
        ..RetryPolicy::default()
    };
    let system_roots = ToolClient::new(&url, policy, None).unwrap();
    let other_roots = ToolClient::new(&url, policy, None)
        .unwrap()
        .with_http_client(other);
    for client in [system_roots, other_roots] {
        let started = Instant::now();
        let err = client
            .call(&IdempotencyKey::new("wf-2:step-1").unwrap(), &json!({}))
            .await
            .unwrap_err();
        match &err {
            ClientError::Tls { message, .. } => {
                assert!(message.contains("invalid peer certificate"), "{message}")
            }
            other => panic!("expected a TLS refusal, got {other:?}"),
        }
        // Not retried until the overall deadline: no retry can fix a certificate.
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
    }
    assert_eq!(tickets.load(Ordering::SeqCst), 0);
}
