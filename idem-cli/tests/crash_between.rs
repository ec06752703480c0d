//! `idem demo --crash-between-effects`: a two-effect checkout whose holder crashes between the
//! payment and the email; without checkpoints every retry pays again, with them none does.
//! Counted at the sinks, on SQLite (the binary) and on PostgreSQL when its URL is set.

use std::process::Command;

use idem_cli::crash_between;
use idem_conformance::kit;

#[test]
fn the_binary_shows_double_payments_without_checkpoints_and_none_with() {
    let (store, _dir) = kit::store_url("sqlite", "crash.db").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args([
            "demo",
            "--crash-between-effects",
            "--operations",
            "25",
            "--store",
            &store,
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |label: &str| -> Vec<String> {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} row in\n{stdout}"));
        line[label.len()..]
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    assert_eq!(row("payments"), ["50", "25"], "{stdout}");
    assert_eq!(row("emails"), ["25", "25"], "{stdout}");
    assert_eq!(row("double payments"), ["25", "0"], "{stdout}");
}

#[tokio::test]
async fn on_postgres_too() {
    let Some((url, _dir)) = kit::store_url("postgres", "crash.db") else {
        return;
    };
    let store = url.parse().unwrap();
    let without = crash_between::run(&store, 10, false).await.unwrap();
    let with = crash_between::run(&store, 10, true).await.unwrap();
    assert_eq!((without.payments, without.double_payments), (20, 10));
    assert_eq!(
        (with.payments, with.emails, with.double_payments),
        (10, 10, 0)
    );
}
