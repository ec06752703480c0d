//! The whole idem conformance suite again, against the Redis Cluster whose nodes
//! `IDEM_TEST_REDIS_CLUSTER_URLS` names (comma-separated, read at run time; scripts/test starts a
//! local 3-master cluster). One `#[test]` per case.
//!
//! Without the variable every case prints why and skips; under `CI` it fails instead.

mod common;

idem_conformance::conformance_tests!(match common::cluster_urls() {
    Some(urls) => common::cluster_factory(urls, None),
    None => return,
});
