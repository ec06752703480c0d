//! `idem demo`, the binary: its table and its exit codes (the demo's own report on every backend
//! is checked by the unit tests in src/tests/demo.rs).

use idem_conformance::kit;

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
