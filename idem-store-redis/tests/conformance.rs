//! The whole idem conformance suite against the standalone Redis named by `IDEM_TEST_REDIS_URL`
//! (read at run time), through the public API only: one `#[test]` per case, so
//! `cargo test -p idem-store-redis --test conformance fencing_` runs the fencing cases.
//!
//! Without the variable every case prints why and skips; under `CI` it fails instead.

mod common;

// With no server configured the generated test returns early (a skip, explained by `common::url`).
idem_conformance::conformance_tests!(match common::url() {
    Some(url) => common::standalone_factory(url, None),
    None => return,
});
