//! The whole idem conformance suite over TLS, one `#[test]` per case: against the TLS-only
//! server of `IDEM_TEST_REDIS_TLS_URL` (module `standalone`) and the TLS-only cluster of
//! `IDEM_TEST_REDIS_TLS_CLUSTER_URLS` (module `cluster`), both `rediss://`, verified against the
//! CA of `IDEM_TEST_TLS_CA` (scripts/services/tls.sh starts them and makes the CA).
//!
//! Without the variables every case prints why and skips; under `CI` it fails instead.

mod common;

mod standalone {
    use super::common;

    idem_conformance::conformance_tests!(match common::tls_url().zip(common::tls_cas()) {
        Some((url, (ca, _))) => common::standalone_factory(url, Some(ca)),
        None => return,
    });
}

mod cluster {
    use super::common;

    idem_conformance::conformance_tests!(match common::tls_cluster_urls().zip(common::tls_cas()) {
        Some((urls, (ca, _))) => common::cluster_factory(urls, Some(ca)),
        None => return,
    });
}
