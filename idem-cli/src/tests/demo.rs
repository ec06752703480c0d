//! `idem demo` does its job: no double effect with idem, duplicates without, on every backend
//! (the demo's own report, which the binary prints as a table); and `idem demo --callers stock`.

use std::time::Duration;

use idem_conformance::kit;
use idemkit::StoreUrl;

use crate::demo::orchestrated::{self as demo, DemoOptions};
use crate::demo::stock as demo_stock;

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
    // What waiting changes, whatever the machine's timing: a call sent twice at once is told
    // 409 without it (the second copy arrives while the first runs), never with it (asserted
    // above). The hung holders' retries are 409s or not by when their backoff falls against the
    // lease, in both runs alike, so the totals are not compared.
    assert!(
        no_wait.conflicts_sent_twice > 0,
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

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn stock_callers_cause_no_double_effect_with_derived_keys() {
    let (store, _dir) = kit::store_url("sqlite", "stock.db").unwrap();
    let options = DemoOptions {
        store: store.parse().unwrap(),
        operations: 12,
        concurrency: 6,
        tool_latency: std::time::Duration::from_millis(40),
        progress: false,
        wait: true,
    };
    let arguments = demo_stock::run(&options, idem_core::KeySource::arguments())
        .await
        .unwrap();
    assert_eq!(arguments.double_effects, 0, "{arguments:?}");
    assert_eq!(
        arguments.tickets, 12,
        "one ticket per operation: {arguments:?}"
    );
    assert_eq!(arguments.unanswered, 0, "{arguments:?}");
    assert!(
        arguments.replays > 0,
        "the repeats were replayed: {arguments:?}"
    );
    let refused = demo_stock::run(&options, idem_core::KeySource::Refuse)
        .await
        .unwrap();
    assert_eq!(
        (refused.tickets, refused.refused > 0),
        (0, true),
        "{refused:?}"
    );
    let unprotected = demo_stock::run(&options, idem_core::KeySource::Unprotected)
        .await
        .unwrap();
    assert!(unprotected.double_effects > 0, "{unprotected:?}");
    println!(
        "{}",
        demo_stock::table(&[
            ("arguments", arguments),
            ("refuse", refused),
            ("unprotected", unprotected)
        ])
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_on_dynamodb() {
    check_on("dynamodb").await;
}
