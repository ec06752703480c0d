//! The operator commands, run as the `idem` binary against a real SQLite file and a real
//! PostgreSQL (and the suite and the bench against Redis too when its URL is set).

use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use idem_conformance::kit::{self, TempDir, unique};
use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState, Scope, Timestamp,
};
use idemkit::OpenOptions;
use serde_json::{Value, json};

// The cases `on_sql_backends!` runs, found as `super::NAME`.
use keys::*;

struct Fixture {
    /// The SQLite file's directory, removed on drop.
    _dir: Option<TempDir>,
    url: String,
    store: Arc<dyn KeyStore>,
    scope: Scope,
}

fn idem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The URL of `backend`'s store: a fresh SQLite file (migrated by the fixture: operator commands
/// never do), or the PostgreSQL / Redis the test script provides (`None` when unset outside CI:
/// skipped).
fn store_url(backend: &str) -> Option<(String, Option<TempDir>)> {
    kit::store_url(backend, "ops.db")
}

/// Records in a scope of the test's own: `stuck-1`, `stuck-2` (processing, lease long elapsed),
/// `running` (lease runs for an hour), `done` (completed), and 3 expired ones.
async fn fixture(backend: &str) -> Option<Fixture> {
    let (url, dir) = store_url(backend)?;
    let store = OpenOptions::new()
        .migrate(true)
        .open(&url)
        .await
        .unwrap()
        .into_store();
    let scope = Scope::from_parts([unique("ops").as_str(), "/tools/create_ticket"]).unwrap();
    let fp = Fingerprint::of("t", &json!({})).unwrap();
    let now = Timestamp::now();
    let short = Policy::builder()
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let long = Policy::builder()
        .lease(Duration::from_secs(3600))
        .ttl(Duration::from_secs(7200))
        .build()
        .unwrap();
    let expiring = Policy::builder()
        .lease(Duration::from_secs(1))
        .ttl(Duration::from_secs(2))
        .build()
        .unwrap();
    let key = |k: &str| IdempotencyKey::new(k).unwrap();
    for (i, k) in ["stuck-1", "stuck-2"].iter().enumerate() {
        let at = now - Duration::from_secs(120 - i as u64);
        store
            .claim(&RecordId::new(scope.clone(), key(k)), &fp, &short, at)
            .await
            .unwrap();
    }
    store
        .claim(
            &RecordId::new(scope.clone(), key("running")),
            &fp,
            &long,
            now,
        )
        .await
        .unwrap();
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&RecordId::new(scope.clone(), key("done")), &fp, &short, now)
        .await
        .unwrap()
    else {
        panic!()
    };
    let ok = Outcome::definitive(201, &json!({"ticket_id": "T-9"})).unwrap();
    store
        .complete(
            &RecordId::new(scope.clone(), key("done")),
            token,
            &ok,
            &short,
            now,
        )
        .await
        .unwrap();
    for i in 0..3 {
        let at = now - Duration::from_secs(60);
        store
            .claim(
                &RecordId::new(scope.clone(), key(&format!("old-{i}"))),
                &fp,
                &expiring,
                at,
            )
            .await
            .unwrap();
    }
    Some(Fixture {
        url,
        _dir: dir,
        store,
        scope,
    })
}

impl Fixture {
    async fn state(&self, key: &str) -> Option<RecordState> {
        self.store
            .get(
                &RecordId::new(self.scope.clone(), IdempotencyKey::new(key).unwrap()),
                Timestamp::now(),
            )
            .await
            .unwrap()
            .map(|r| r.state)
    }

    fn keys(&self, args: &[&str]) -> Output {
        let mut all = vec!["keys", "--store", self.url.as_str()];
        all.extend_from_slice(args);
        idem(&all)
    }
}

async fn purge_deletes_the_expired_records(f: Fixture) {
    let out = idem(&["purge", "--store", &f.url, "--batch", "2"]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    // The storage may be shared: at least this test's 3 expired records went.
    let purged: usize = stdout
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(stdout.starts_with("purged ") && purged >= 3, "{stdout}");
    for i in 0..3 {
        let key = IdempotencyKey::new(format!("old-{i}")).unwrap();
        let seen_before_expiry = f
            .store
            .get(
                &RecordId::new(f.scope.clone(), key.clone()),
                Timestamp::from_millis(0),
            )
            .await
            .unwrap();
        assert!(
            seen_before_expiry.is_none(),
            "old-{i} is gone from the store"
        );
    }
    assert_eq!(
        f.state("done").await,
        Some(RecordState::Completed),
        "live records stay"
    );
}

macro_rules! on_sql_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::fixture("sqlite").await.unwrap()).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    if let Some(f) = super::fixture("postgres").await {
                        super::$name(f).await;
                    }
                }
            )*
        }
    };
}

on_sql_backends! {
    keys_ls_filters_by_state_scope_and_age,
    keys_show_prints_the_record,
    keys_show_says_encrypted,
    keys_show_lists_the_checkpoints,
    keys_release_gives_a_stuck_key_back,
    keys_resolve_completes_a_stuck_key,
    refusals_are_one_clear_line_and_change_nothing,
    purge_deletes_the_expired_records,
}

#[test]
fn bad_urls_and_unreachable_stores_are_one_clear_line() {
    for (args, expected) in [
        (
            vec!["keys", "--store", "mysql://x", "show", "s", "k"],
            "unknown store URL scheme",
        ),
        (
            vec![
                "keys",
                "--store",
                "sqlite:///no/such/dir/x.db",
                "show",
                "s",
                "k",
            ],
            "no SQLite file at /no/such/dir/x.db",
        ),
        (
            vec!["purge", "--store", "postgres://nobody@127.0.0.1:1/none"],
            "cannot open the store",
        ),
        (
            vec!["conformance", "--store", "redis://127.0.0.1:1"],
            "cannot open the store",
        ),
    ] {
        let out = idem(&args);
        let (_, stderr) = text(&out);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert!(stderr.trim().lines().count() <= 3, "{stderr}");
    }
}

mod keys;
mod live;
