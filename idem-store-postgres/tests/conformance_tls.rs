//! The whole idem conformance suite over TLS: against the TLS-only PostgreSQL named by
//! `IDEM_TEST_POSTGRES_TLS_URL` (`sslmode=verify-full` with `sslrootcert` naming the test CA;
//! scripts/services/tls.sh starts it), through the public API only, one `#[test]` per case.
//!
//! Without the variable every case prints why and skips; under `CI` it fails instead.

mod common;

// Each generated test evaluates this expression first; with no server configured it returns
// from the test (a skip, already explained by `common::tls_url`).
idem_conformance::conformance_tests!(match common::conformance_factory(
    common::tls_url(),
    "idem-conformance-tls"
) {
    Some(factory) => factory,
    None => return,
});
