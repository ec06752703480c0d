//! What the tests share: the servers they are told about, and unique names.
#![allow(dead_code)]

pub mod server;

/// The standalone server's URL from `IDEM_TEST_REDIS_URL`, read at run time. `None` (after saying
/// why) when it is unset; under `CI` a missing server fails the test instead.
pub fn url() -> Option<String> {
    var("IDEM_TEST_REDIS_URL")
}

/// The cluster's node URLs from `IDEM_TEST_REDIS_CLUSTER_URLS` (comma-separated), read at run
/// time; `None` (after saying why) when unset, a failure under `CI`.
pub fn cluster_urls() -> Option<Vec<String>> {
    var("IDEM_TEST_REDIS_CLUSTER_URLS").map(|v| {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

/// The 3-master, 3-replica cluster's node URLs from `IDEM_TEST_REDIS_FAILOVER_URLS`
/// (`scripts/services/redis-failover.sh`); `None` (after saying why) when unset, a failure under
/// `CI`. Only the failover test may use it: it kills masters.
pub fn failover_urls() -> Option<Vec<String>> {
    var("IDEM_TEST_REDIS_FAILOVER_URLS").map(|v| {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

/// The TLS-only standalone server's URL from `IDEM_TEST_REDIS_TLS_URL` (`rediss://…`,
/// scripts/services/tls.sh); `None` (after saying why) when unset, a failure under `CI`.
pub fn tls_url() -> Option<String> {
    var("IDEM_TEST_REDIS_TLS_URL")
}

/// The TLS-only cluster's node URLs from `IDEM_TEST_REDIS_TLS_CLUSTER_URLS` (comma-separated).
pub fn tls_cluster_urls() -> Option<Vec<String>> {
    var("IDEM_TEST_REDIS_TLS_CLUSTER_URLS").map(|v| {
        v.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect()
    })
}

/// `IDEM_TEST_TLS_CA` (the CA that signed the TLS servers' certificate) and
/// `IDEM_TEST_TLS_UNTRUSTED_CA` (one that signed nothing there).
pub fn tls_cas() -> Option<(String, String)> {
    Some((var("IDEM_TEST_TLS_CA")?, var("IDEM_TEST_TLS_UNTRUSTED_CA")?))
}

fn var(name: &str) -> Option<String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => Some(v),
        _ => {
            let why = format!(
                "{name} is not set: skipping (scripts/test starts the servers and sets it)"
            );
            if std::env::var_os("CI").is_some() {
                panic!("{why}; under CI a missing server is a failure");
            }
            eprintln!("{why}");
            None
        }
    }
}

/// A name no other test or run uses.
pub fn unique(prefix: &str) -> String {
    format!("{prefix}-{:016x}", rand::random::<u64>())
}
