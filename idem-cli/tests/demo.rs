//! `idem demo` does its job: no double effect with idem, duplicates without, on every backend.

use std::time::Duration;

use idem_cli::demo::{self, DemoOptions};
use idem_conformance::kit;
use idemkit::StoreUrl;

fn options(store: StoreUrl) -> DemoOptions {
    DemoOptions {
        store,
        operations: 24,
        concurrency: 8,
        tool_latency: Duration::from_millis(40),
        progress: false,
        wait: true,
    }
}

async fn check(store: StoreUrl) {
    let options = options(store);
    let with = demo::run(&options, true).await.unwrap();
    assert_eq!(with.double_effects, 0, "{with:?}");
    assert_eq!(
        with.tickets, options.operations as i64,
        "one ticket per operation: {with:?}"
    );
    assert_eq!(with.unanswered, 0, "every operation answered: {with:?}");
    assert!(with.replays > 0, "the faults happened: {with:?}");
    // Every operation is timed, and the faults' own times count their operations: of 24, a
    // quarter time out, a quarter are sent twice, an eighth hang.
    assert_eq!(with.attempt_timed_out.operations, 6, "{with:?}");
    assert_eq!(with.sent_twice.operations, 6, "{with:?}");
    assert_eq!(with.retried_while_running.operations, 12, "{with:?}");
    assert_eq!(with.holder_hung.operations, 3, "{with:?}");
    // Retries wait for the in-flight answer: an operation sent twice at once is never told 409.
    // The other 409s go to attempts that have no answer to wait for within their deadline: the
    // hasty client's (shorter than the tool; `Prefer: wait` is whole seconds after a 500 ms
    // margin) and retries of a hung holder (no answer before its lease ends).
    assert_eq!(
        with.conflicts_sent_twice, 0,
        "waiting retries are not told 409: {with:?}"
    );
    assert_eq!(
        with.conflicts,
        with.conflicts_timed_out + with.conflicts_hung,
        "{with:?}"
    );
    let no_wait = demo::run(
        &DemoOptions {
            wait: false,
            ..options.clone()
        },
        true,
    )
    .await
    .unwrap();
    assert_eq!(no_wait.double_effects, 0, "{no_wait:?}");
    assert!(
        no_wait.conflicts > with.conflicts,
        "without waiting the overlap is 409s: {no_wait:?} vs {with:?}"
    );
    let without = demo::run(&options, false).await.unwrap();
    assert!(
        without.double_effects > 0,
        "the same traffic without idem duplicates: {without:?}"
    );
    assert!(without.tickets > options.operations as i64);
    println!("{}", demo::table(&with, Some(&without)));
}

/// Runs `check` against `backend`'s store (a fresh SQLite file, or the server the test script
/// provides; skipped without it outside CI).
async fn check_on(backend: &str) {
    if let Some((url, _dir)) = kit::store_url(backend, "demo.db") {
        check(url.parse().unwrap()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_on_sqlite() {
    check_on("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_on_postgres() {
    check_on("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_on_redis() {
    check_on("redis").await;
}

#[test]
fn the_binary_prints_the_table_and_exits_zero() {
    let (store, dir) = kit::store_url("sqlite", "demo.db").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "demo",
            "--operations",
            "16",
            "--concurrency",
            "8",
            "--tool-latency-ms",
            "30",
        ])
        .args(["--store", &store])
        .output()
        .unwrap();
    drop(dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    // stderr is a pipe here: progress as plain lines, never a bar redrawn with '\r'.
    assert!(
        !stderr.contains('\r') && !stdout.contains('\r'),
        "{stderr:?}"
    );
    assert!(stderr.contains("16/16 operations"), "{stderr}");
    let double = stdout
        .lines()
        .find(|l| l.starts_with("double effects"))
        .expect("the table has a double effects row");
    assert_eq!(double.split_whitespace().last(), Some("0"), "{stdout}");
    let tickets = stdout
        .lines()
        .find(|l| l.starts_with("tickets at the sink"))
        .unwrap();
    assert_eq!(tickets.split_whitespace().last(), Some("16"), "{stdout}");
    for row in ["retried while running p99 (ms)", "holder hung p99 (ms)"] {
        assert!(
            stdout.lines().any(|l| l.starts_with(row)),
            "{row}: {stdout}"
        );
    }
}

#[test]
fn bad_store_urls_get_one_clear_line_and_a_non_zero_exit() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["demo", "--store", "mysql://nope"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unknown store URL scheme"), "{stderr}");
}
