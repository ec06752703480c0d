//! Two worker processes, a 50 ms lease, `Takeover`, one worker SIGKILLed every 0.2–0.8 s: every
//! checkpoint saved is one the next attempt starts with, on SQLite, PostgreSQL, Redis and DynamoDB. A short
//! run (a few seconds each); `cargo run -p idemkit --example takeover_chaos --features
//! sqlite,postgres,redis,dynamodb -- 200` is the long one. The test binary re-spawns itself as the
//! workers (`--exact <test>`); the workers and the check are the example's
//! (`examples/takeover_chaos.rs`).

#[path = "../examples/takeover_chaos.rs"]
#[allow(dead_code)]
mod example;

/// Orders per test: enough for several kills and takeovers, short enough for CI.
const ORDERS: usize = 30;

fn worker_args(test: &'static str) -> [&'static str; 4] {
    ["--exact", test, "--nocapture", "--test-threads=1"]
}

fn run(backend: &str, test: &'static str) {
    if example::is_worker() {
        return example::worker_main();
    }
    let Some((url, _dir)) = idem_conformance::kit::store_url(backend, "chaos.db") else {
        return;
    };
    let figures = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(example::chaos(&url, &worker_args(test), ORDERS))
        .unwrap();
    eprintln!("{backend}: {figures}");
    assert!(
        figures.lost.is_empty(),
        "saved checkpoints a later attempt did not start with:\n{}",
        figures.lost.join("\n")
    );
    assert_eq!(figures.unfinished, 0, "every order completes: {figures}");
    assert!(figures.kills > 0, "workers were killed: {figures}");
}

#[test]
fn sqlite_every_saved_checkpoint_survives_takeovers_and_kills() {
    run(
        "sqlite",
        "sqlite_every_saved_checkpoint_survives_takeovers_and_kills",
    );
}

#[test]
fn postgres_every_saved_checkpoint_survives_takeovers_and_kills() {
    run(
        "postgres",
        "postgres_every_saved_checkpoint_survives_takeovers_and_kills",
    );
}

#[test]
fn redis_every_saved_checkpoint_survives_takeovers_and_kills() {
    run(
        "redis",
        "redis_every_saved_checkpoint_survives_takeovers_and_kills",
    );
}

#[test]
fn dynamodb_every_saved_checkpoint_survives_takeovers_and_kills() {
    run(
        "dynamodb",
        "dynamodb_every_saved_checkpoint_survives_takeovers_and_kills",
    );
}
