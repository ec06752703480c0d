//! The whole idem conformance suite against a real PostgreSQL named by `IDEM_TEST_POSTGRES_URL`
//! (read at run time), through the public API only: one `#[test]` per case, so
//! `cargo test -p idem-store-postgres --test conformance fencing_` runs the fencing cases.
//!
//! Without the variable every case prints why and skips; under `CI` it fails instead.

mod common;

// Each generated test evaluates this expression first; with no server configured it returns
// from the test (a skip, already explained by `common::url`).
idem_conformance::conformance_tests!(match common::conformance_factory(
    common::url(),
    "idem-conformance"
) {
    Some(factory) => factory,
    None => return,
});
