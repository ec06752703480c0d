//! The command line itself, run as the `idem` binary: where `--store` goes, `IDEM_STORE`,
//! read-only commands that never change the schema, `idem migrate`, `--force`, the exit codes,
//! `--json`, streaming conformance output, no carriage returns in pipes, and store URLs without
//! a scheme. Effects are checked in the store itself (SQLite files, a fresh PostgreSQL database).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use idem_conformance::kit::{self, TempDir};
use idem_core::machine::{ClaimAnswer, CompleteAnswer};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope, Timestamp,
};
use idemkit::OpenOptions;
use idemkit::sqlite::rusqlite::Connection;
use serde_json::{Value, json};

/// Exit codes, as `idem --help` documents them.
const USAGE: i32 = 2;
const STORE_UNAVAILABLE: i32 = 3;
const NOT_FOUND: i32 = 4;
const REFUSED: i32 = 5;
const SUITE_FAILED: i32 = 6;

/// A temporary directory of the test's own, removed on drop.
struct Dir(TempDir);

impl Dir {
    fn new() -> Self {
        Self(kit::temp_dir("idem-cli"))
    }

    fn db(&self, name: &str) -> (PathBuf, String) {
        let path = self.0.path().join(name);
        let url = format!("sqlite://{}", path.display());
        (path, url)
    }
}

fn idem() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_idem"));
    c.env_remove("IDEM_STORE").env_remove("RUST_LOG");
    c
}

fn run(args: &[&str]) -> Output {
    idem().args(args).output().unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited")
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Names of the tables and indexes in an SQLite file.
fn schema_objects(path: &Path) -> i64 {
    Connection::open(path)
        .unwrap()
        .query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get(0))
        .unwrap()
}

fn scope() -> Scope {
    Scope::from_parts(["cli-test", "/tools/create_ticket"]).unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of("t", &json!({})).unwrap()
}

/// The holder of `running` was alive after all: its late completion is refused (`Fenced`).
async fn assert_late_completion_fenced(store: &dyn KeyStore, holder: idem_core::Token) {
    let late = Outcome::definitive(201, &json!({"ticket_id": "T-late"})).unwrap();
    let answer = store
        .complete(
            &RecordId::new(scope(), key("running")),
            holder,
            &late,
            &Policy::default(),
            Timestamp::now(),
        )
        .await
        .unwrap();
    assert_eq!(answer, CompleteAnswer::Fenced);
}

/// A migrated SQLite store holding `running` (a live holder, lease for an hour) and `done`
/// (completed); returns the store and the holder's token for `running`.
async fn migrated(url: &str) -> (std::sync::Arc<dyn KeyStore>, idem_core::Token) {
    let store = OpenOptions::new()
        .migrate(true)
        .open(url)
        .await
        .unwrap()
        .into_store();
    let long = Policy::builder()
        .lease(Duration::from_secs(3600))
        .ttl(Duration::from_secs(7200))
        .build()
        .unwrap();
    let now = Timestamp::now();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&RecordId::new(scope(), key("running")), &fp(), &long, now)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let ClaimAnswer::Claimed { token: t, .. } = store
        .claim(&RecordId::new(scope(), key("done")), &fp(), &long, now)
        .await
        .unwrap()
    else {
        panic!("claimed")
    };
    let ok = Outcome::definitive(201, &json!({"ticket_id": "T-1"})).unwrap();
    store
        .complete(&RecordId::new(scope(), key("done")), t, &ok, &long, now)
        .await
        .unwrap();
    (store, token)
}

mod output;
mod schema;
mod store;
