//! TLS to PostgreSQL as libpq's `sslmode` describes it, against the TLS-only server of
//! `IDEM_TEST_POSTGRES_TLS_URL` (its `pg_hba.conf` has `hostssl` lines only) and the test CA of
//! `IDEM_TEST_TLS_CA`; `IDEM_TEST_TLS_UNTRUSTED_CA` is a CA that signed nothing there. Every
//! connection that succeeds also runs a claim and reads `pg_stat_ssl` for its own backend, so
//! "connected" means "connected over TLS and working".
//!
//! Without the variables the tests print why and skip; under `CI` they fail instead.

mod common;

use std::error::Error as _;

use idem_core::machine::ClaimAnswer;
use idem_core::{Fingerprint, IdempotencyKey, KeyStore, Policy, RecordId, Scope, StoreError};
use idem_store_postgres::PostgresStore;
use idem_store_postgres::sqlx;

/// The server's URL without its query, and the CA files: (base, trusted CA, untrusted CA).
fn setup() -> Option<(String, String, String)> {
    let url = common::tls_url()?;
    let (ca, untrusted) = common::tls_cas()?;
    let base = url.split('?').next().unwrap_or(&url).to_owned();
    Some((base, ca, untrusted))
}

/// `base` with `query` (`sslmode=…&sslrootcert=…`).
fn with(base: &str, query: &str) -> String {
    format!("{base}?{query}")
}

/// Connects with `PostgresStore::connect`, migrates the test table and claims a fresh key once
/// (a replay the second time); answers whether the store's own connection uses TLS.
async fn connect_and_claim(url: &str) -> Result<bool, StoreError> {
    let store = PostgresStore::connect(url).await?;
    let store = PostgresStore::with_table(store.pool().clone(), common::SCHEMA, common::TABLE)
        .expect("valid names");
    store.migrate().await?;
    let scope = Scope::new(common::unique("tls")).unwrap();
    let key = IdempotencyKey::new("k").unwrap();
    let fp = Fingerprint::of("tls", &serde_json::json!({})).unwrap();
    let policy = Policy::default();
    let now = idem_core::Timestamp::now();
    let id = RecordId::new(scope.clone(), key.clone());
    let first = store.claim(&id, &fp, &policy, now).await?;
    assert!(matches!(first, ClaimAnswer::Claimed { .. }), "{first:?}");
    let second = store.claim(&id, &fp, &policy, now).await?;
    assert!(matches!(second, ClaimAnswer::InFlight { .. }), "{second:?}");
    let ssl: bool = sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(store.pool())
        .await
        .expect("pg_stat_ssl");
    Ok(ssl)
}

/// The rustls error somewhere in `err`'s sources, if any.
fn rustls_error(err: &StoreError) -> Option<&rustls::Error> {
    idem_conformance::kit::find_source(err)
}

/// Asserts that `err` is a refused certificate (`Unavailable`, the rustls error kept as the source,
/// and said in the message) of kind `expected`.
fn assert_certificate_refused(err: &StoreError, expected: rustls::CertificateError) {
    assert!(err.is_unavailable(), "{err:?}");
    match rustls_error(err) {
        Some(rustls::Error::InvalidCertificate(kind)) => assert_eq!(kind, &expected, "{err}"),
        other => panic!("expected a refused certificate, got {other:?} in {err:?}"),
    }
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[tokio::test]
async fn verify_full_with_the_ca_connects_over_tls() {
    let Some((base, ca, _)) = setup() else { return };
    let url = with(&base, &format!("sslmode=verify-full&sslrootcert={ca}"));
    assert!(
        connect_and_claim(&url)
            .await
            .expect("verify-full with the CA")
    );
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_from_another_ca() {
    let Some((base, _, untrusted)) = setup() else {
        return;
    };
    let url = with(
        &base,
        &format!("sslmode=verify-full&sslrootcert={untrusted}"),
    );
    let err = connect_and_claim(&url).await.unwrap_err();
    assert_certificate_refused(&err, rustls::CertificateError::UnknownIssuer);
}

#[tokio::test]
async fn verify_full_refuses_a_host_the_certificate_does_not_name() {
    let Some((base, ca, _)) = setup() else { return };
    // The certificate names localhost and 127.0.0.1; the server also listens on 127.0.0.2.
    let other_host = base.replace("@127.0.0.1:", "@127.0.0.2:");
    if other_host == base {
        eprintln!("skipping: IDEM_TEST_POSTGRES_TLS_URL is not on 127.0.0.1");
        return;
    }
    // verify-ca checks the chain only, as libpq's does (sqlx 0.9): a host the certificate does
    // not name is accepted, over TLS.
    let verify_ca = with(&other_host, &format!("sslmode=verify-ca&sslrootcert={ca}"));
    match connect_and_claim(&verify_ca).await {
        Err(e) if rustls_error(&e).is_none() => {
            eprintln!("skipping: the server does not answer on 127.0.0.2 ({e})");
            return;
        }
        Err(e) => panic!("verify-ca checked the host name, unlike libpq: {e:?}"),
        Ok(tls) => assert!(tls, "verify-ca connected without TLS"),
    }
    // … and verify-full refuses it: the certificate is not valid for that name.
    let verify_full = with(
        &other_host,
        &format!("sslmode=verify-full&sslrootcert={ca}"),
    );
    let err = connect_and_claim(&verify_full).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(
        matches!(
            rustls_error(&err),
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. }
            ))
        ),
        "{err:?}"
    );
}

#[tokio::test]
async fn verify_ca_needs_the_ca() {
    let Some((base, ca, untrusted)) = setup() else {
        return;
    };
    let url = with(&base, &format!("sslmode=verify-ca&sslrootcert={ca}"));
    assert!(
        connect_and_claim(&url)
            .await
            .expect("verify-ca with the CA")
    );
    let url = with(&base, &format!("sslmode=verify-ca&sslrootcert={untrusted}"));
    let err = connect_and_claim(&url).await.unwrap_err();
    assert_certificate_refused(&err, rustls::CertificateError::UnknownIssuer);
    if std::env::var_os("SSL_CERT_FILE").is_none() && std::env::var_os("SSL_CERT_DIR").is_none() {
        // Without sslrootcert the system's roots decide, and they do not hold the test CA.
        let err = connect_and_claim(&with(&base, "sslmode=verify-ca"))
            .await
            .unwrap_err();
        assert_certificate_refused(&err, rustls::CertificateError::UnknownIssuer);
    }
}

#[tokio::test]
async fn require_encrypts_without_verifying() {
    let Some((base, _, _)) = setup() else { return };
    // No CA at all: the certificate is not checked, the connection is still TLS.
    assert!(
        connect_and_claim(&with(&base, "sslmode=require"))
            .await
            .expect("require")
    );
}

#[tokio::test]
async fn prefer_uses_tls_when_the_server_offers_it() {
    let Some((base, _, _)) = setup() else { return };
    assert!(
        connect_and_claim(&with(&base, "sslmode=prefer"))
            .await
            .expect("prefer")
    );
}

#[tokio::test]
async fn disable_is_refused_by_a_tls_only_server() {
    let Some((base, _, _)) = setup() else { return };
    let err = connect_and_claim(&with(&base, "sslmode=disable"))
        .await
        .unwrap_err();
    // pg_hba.conf has no line for a connection without encryption:
    // invalid_authorization_specification.
    let sqlx_err = err
        .source()
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .expect("the sqlx error is the source");
    match sqlx_err {
        sqlx::Error::Database(db) => assert_eq!(db.code().as_deref(), Some("28000"), "{db}"),
        other => panic!("expected the server's refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn a_missing_ca_file_is_an_error_not_a_silent_fallback() {
    let Some((base, _, _)) = setup() else { return };
    let url = with(
        &base,
        "sslmode=verify-full&sslrootcert=/nonexistent/idem-test-ca.pem",
    );
    let err = connect_and_claim(&url).await.unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    let io = err
        .source()
        .and_then(|s| s.downcast_ref::<sqlx::Error>())
        .and_then(|s| match s {
            sqlx::Error::Io(io) => Some(io.kind()),
            _ => None,
        });
    assert_eq!(io, Some(std::io::ErrorKind::NotFound), "{err:?}");
}
