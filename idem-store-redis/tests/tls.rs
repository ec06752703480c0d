//! TLS (`rediss://`) against the TLS-only server and cluster of `IDEM_TEST_REDIS_TLS_URL` and
//! `IDEM_TEST_REDIS_TLS_CLUSTER_URLS` (no plain-text port: anything that works went over TLS),
//! whose certificate the CA of `IDEM_TEST_TLS_CA` signed; `IDEM_TEST_TLS_UNTRUSTED_CA` signed
//! nothing there. The CA-file checks need no server and always run.
//!
//! Without the variables the server tests print why and skip; under `CI` they fail instead.

mod common;

use std::process::Command;

use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, StoreError, Timestamp,
};
use idem_store_redis::RedisStore;

/// Claims a fresh key twice, completes it, claims it again: answers how many claims were
/// `Claimed` (the operation would have run that many times) and whether the last one replayed.
async fn claim_complete_replay(store: &RedisStore) -> (usize, bool) {
    let scope = Scope::new(common::unique("tls")).unwrap();
    let key = IdempotencyKey::new("k").unwrap();
    let id = RecordId::new(scope.clone(), key.clone());
    let fp = Fingerprint::of("tls", &serde_json::json!({})).unwrap();
    let policy = Policy::default();
    let now = Timestamp::now();
    let mut runs = 0;
    let mut token = None;
    for _ in 0..2 {
        if let ClaimAnswer::Claimed { token: t, .. } =
            store.claim(&id, &fp, &policy, now).await.unwrap()
        {
            runs += 1;
            token = Some(t);
        }
    }
    let outcome = Outcome::definitive(200, &serde_json::json!({"ok": true})).unwrap();
    let done = store
        .complete(&id, token.expect("claimed once"), &outcome, &policy, now)
        .await
        .unwrap();
    assert_eq!(done, CompleteAnswer::Completed);
    let replay = store.claim(&id, &fp, &policy, now).await.unwrap();
    (
        runs,
        matches!(replay, ClaimAnswer::Replay(o) if o.body() == outcome.body()),
    )
}

/// The rustls error somewhere in `err`'s sources, if any.
fn rustls_error<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    idem_conformance::kit::find_source(err)
}

/// `err` is a refused certificate: `Unavailable`, saying so, with the rustls error kept.
fn assert_unknown_issuer(err: &StoreError) {
    assert!(err.is_unavailable(), "{err:?}");
    // redis 1.x keeps rustls' error as text in its I/O error, not always as a typed source.
    assert!(
        matches!(
            rustls_error(err),
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::UnknownIssuer
            ))
        ) || err.to_string().contains("UnknownIssuer"),
        "{err:?}"
    );
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[tokio::test]
async fn standalone_with_the_named_ca() {
    let (Some(url), Some((ca, _))) = (common::tls_url(), common::tls_cas()) else {
        return;
    };
    let store = RedisStore::connect_with_ca(&url, &ca).await.unwrap();
    store.migrate().await.unwrap();
    assert_eq!(claim_complete_replay(&store).await, (1, true));
}

#[tokio::test]
async fn cluster_with_the_named_ca() {
    let (Some(urls), Some((ca, _))) = (common::tls_cluster_urls(), common::tls_cas()) else {
        return;
    };
    let store = RedisStore::connect_cluster_with_ca(&urls, &ca)
        .await
        .unwrap();
    store.migrate().await.unwrap();
    // Keys on every master: each node's connection is TLS.
    for _ in 0..8 {
        assert_eq!(claim_complete_replay(&store).await, (1, true));
    }
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_refused() {
    let (Some(url), Some((_, untrusted))) = (common::tls_url(), common::tls_cas()) else {
        return;
    };
    let err = RedisStore::connect_with_ca(&url, &untrusted)
        .await
        .unwrap_err();
    assert_unknown_issuer(&err);
}

#[tokio::test]
async fn a_cluster_certificate_from_another_ca_is_refused() {
    let (Some(urls), Some((_, untrusted))) = (common::tls_cluster_urls(), common::tls_cas()) else {
        return;
    };
    let err = RedisStore::connect_cluster_with_ca(&urls, &untrusted)
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    assert!(err.to_string().contains("certificate"), "{err}");
}

#[tokio::test]
async fn the_system_roots_do_not_trust_the_test_ca() {
    let Some(url) = common::tls_url() else { return };
    if std::env::var_os("SSL_CERT_FILE").is_some() || std::env::var_os("SSL_CERT_DIR").is_some() {
        eprintln!("skipping: SSL_CERT_FILE or SSL_CERT_DIR replaces the system's roots here");
        return;
    }
    assert_unknown_issuer(&RedisStore::connect(&url).await.unwrap_err());
}

/// Set only for the child process `ssl_cert_file_replaces_the_system_roots` starts.
const CHILD_URL: &str = "IDEM_TEST_TLS_CHILD_URL";

/// Run as a child (see below): `connect`, which trusts the system's roots, under the child's
/// `SSL_CERT_FILE`. Does nothing in an ordinary run.
#[tokio::test]
async fn child_connects_with_the_system_roots() {
    let Ok(url) = std::env::var(CHILD_URL) else {
        return;
    };
    match RedisStore::connect(&url).await {
        Ok(store) => assert_eq!(claim_complete_replay(&store).await, (1, true)),
        Err(e) => panic!("child connect failed: {e}; tls: {:?}", rustls_error(&e)),
    }
}

#[test]
fn ssl_cert_file_replaces_the_system_roots() {
    let (Some(url), Some((ca, untrusted))) = (common::tls_url(), common::tls_cas()) else {
        return;
    };
    // The environment is the process's: a child of this test binary runs the connect.
    let child = |cert_file: &str| {
        Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child_connects_with_the_system_roots",
                "--nocapture",
            ])
            .env(CHILD_URL, &url)
            .env("SSL_CERT_FILE", cert_file)
            .env_remove("SSL_CERT_DIR")
            .output()
            .unwrap()
    };
    let trusted = child(&ca);
    assert!(
        trusted.status.success(),
        "{}",
        String::from_utf8_lossy(&trusted.stdout)
    );
    assert!(String::from_utf8_lossy(&trusted.stdout).contains("1 passed"));
    let refused = child(&untrusted);
    assert!(!refused.status.success());
    // The child's panic message goes to its stderr.
    let out = String::from_utf8_lossy(&refused.stderr);
    assert!(out.contains("UnknownIssuer"), "{out}");
}

#[tokio::test]
async fn a_bad_ca_file_or_a_plain_url_is_misconfigured() {
    let dir = std::env::temp_dir().join(common::unique("idem-tls-ca"));
    std::fs::create_dir_all(&dir).unwrap();
    let not_pem = dir.join("not-pem.txt");
    std::fs::write(&not_pem, "hello").unwrap();
    let missing = dir.join("missing.pem");
    let url = "rediss://127.0.0.1:1";
    for (case, err) in [
        ("missing", RedisStore::connect_with_ca(url, &missing).await),
        ("not PEM", RedisStore::connect_with_ca(url, &not_pem).await),
        (
            "cluster, missing",
            RedisStore::connect_cluster_with_ca([url], &missing).await,
        ),
    ]
    .map(|(case, r)| (case, r.unwrap_err()))
    {
        assert!(
            matches!(&err, StoreError::Misconfigured { message } if message.contains("CA file")),
            "{case}: {err:?}"
        );
    }
    // A CA file says the caller wants TLS: a redis:// URL is a mistake, not a plain-text connect.
    let err = RedisStore::connect_with_ca("redis://127.0.0.1:1", &not_pem)
        .await
        .unwrap_err();
    assert!(
        matches!(&err, StoreError::Misconfigured { message } if message.contains("rediss://")),
        "{err:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
