//! `idem demo --crash-between-effects`: a two-effect checkout whose holder crashes between the
//! payment and the email; without checkpoints every retry pays again, with them none does.
//! Counted at the sinks, by the binary, on SQLite, and on PostgreSQL and DynamoDB when their URLs
//! are set.

use std::process::Command;

use idem_conformance::kit;

/// Runs the binary on `store` and returns its table's rows `payments`, `emails` and
/// `double payments`, each as (without checkpoints, with them).
fn crash_between(store: &str, operations: u32) -> [[String; 2]; 3] {
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["demo", "--crash-between-effects", "--operations"])
        .arg(operations.to_string())
        .args(["--store", store])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |label: &str| -> [String; 2] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(label))
            .unwrap_or_else(|| panic!("no {label} row in\n{stdout}"));
        let cells: Vec<String> = line[label.len()..]
            .split_whitespace()
            .map(str::to_owned)
            .collect();
        cells
            .try_into()
            .unwrap_or_else(|c| panic!("{label}: two columns, not {c:?}\n{stdout}"))
    };
    [row("payments"), row("emails"), row("double payments")]
}

#[test]
fn the_binary_shows_double_payments_without_checkpoints_and_none_with() {
    let (store, _dir) = kit::store_url("sqlite", "crash.db").unwrap();
    assert_eq!(
        crash_between(&store, 25),
        [["50", "25"], ["25", "25"], ["25", "0"]].map(|r| r.map(str::to_owned))
    );
}

#[test]
fn on_postgres_too() {
    let Some((store, _dir)) = kit::store_url("postgres", "crash.db") else {
        return;
    };
    assert_eq!(
        crash_between(&store, 10),
        [["20", "10"], ["10", "10"], ["10", "0"]].map(|r| r.map(str::to_owned))
    );
}

#[test]
fn on_dynamodb_too() {
    let Some((store, _dir)) = kit::store_url("dynamodb", "crash.db") else {
        return;
    };
    assert_eq!(
        crash_between(&store, 10),
        [["20", "10"], ["10", "10"], ["10", "0"]].map(|r| r.map(str::to_owned))
    );
}
