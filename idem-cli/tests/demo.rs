//! `idem demo` does its job: no double effect with idem, duplicates without, on every backend.

use std::time::Duration;

use idem_cli::demo::{self, DemoOptions};
use idemkit::StoreUrl;

fn options(store: StoreUrl) -> DemoOptions {
    DemoOptions {
        store,
        operations: 24,
        concurrency: 8,
        tool_latency: Duration::from_millis(40),
        progress: false,
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
    assert!(
        with.replays > 0 && with.conflicts > 0,
        "the faults happened: {with:?}"
    );
    let without = demo::run(&options, false).await.unwrap();
    assert!(
        without.double_effects > 0,
        "the same traffic without idem duplicates: {without:?}"
    );
    assert!(without.tickets > options.operations as i64);
    println!("{}", demo::table(&with, Some(&without)));
}

fn temp_sqlite() -> (StoreUrl, std::path::PathBuf) {
    let dir = std::env::temp_dir().join(format!(
        "idem-demo-test-{}-{:x}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    (
        format!("sqlite://{}", dir.join("demo.db").display())
            .parse()
            .unwrap(),
        dir,
    )
}

fn rand_suffix() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_on_sqlite() {
    let (store, dir) = temp_sqlite();
    check(store).await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_on_postgres() {
    match std::env::var("IDEM_TEST_POSTGRES_URL") {
        Ok(url) => check(url.parse().unwrap()).await,
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("IDEM_TEST_POSTGRES_URL is not set under CI: run scripts/test")
        }
        Err(_) => eprintln!("skipped: IDEM_TEST_POSTGRES_URL is not set (scripts/test sets it)"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn demo_on_redis() {
    match std::env::var("IDEM_TEST_REDIS_URL") {
        Ok(url) => check(url.parse().unwrap()).await,
        Err(_) if std::env::var_os("CI").is_some() => {
            panic!("IDEM_TEST_REDIS_URL is not set under CI: run scripts/test")
        }
        Err(_) => eprintln!("skipped: IDEM_TEST_REDIS_URL is not set (scripts/test sets it)"),
    }
}

#[test]
fn the_binary_prints_the_table_and_exits_zero() {
    let (store, dir) = temp_sqlite();
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
        .args(["--store", &store.to_string()])
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(dir);
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
