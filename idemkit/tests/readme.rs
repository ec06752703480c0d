//! The README's first example is `examples/axum_handler.rs`, word for word, and it does what the
//! README says: its router, on a real SQLite file behind real HTTP, makes one ticket per key and
//! tenant however often a request is sent, across a restart on the same file.

use std::sync::atomic::Ordering;

use idem_conformance::kit;
use idemkit::sqlite::SqliteStore;
use serde_json::{Value, json};

// Its `main` serves on a fixed port until stopped: the test serves its `app` on a free one.
#[allow(dead_code)]
#[path = "../examples/axum_handler.rs"]
mod axum_handler;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/..");

/// The text of the first block of `markdown` whose info string starts with `lang`.
fn first_block(markdown: &str, lang: &str) -> Option<String> {
    let mut lines = markdown.lines();
    lines.find(|l| {
        l.strip_prefix("```")
            .is_some_and(|info| info.starts_with(lang))
    })?;
    let block: Vec<&str> = lines.take_while(|l| *l != "```").collect();
    Some(block.join("\n") + "\n")
}

#[test]
fn the_readme_shows_the_example_file_word_for_word() {
    let readme = std::fs::read_to_string(format!("{ROOT}/README.md")).unwrap();
    let example =
        std::fs::read_to_string(format!("{ROOT}/idemkit/examples/axum_handler.rs")).unwrap();
    assert_eq!(
        first_block(&readme, "rust").as_deref(),
        Some(example.as_str()),
        "README.md's first rust block must be idemkit/examples/axum_handler.rs (copy it there)"
    );
    // Its Cargo.toml lines name both features the example needs: the layer and a backend.
    let toml = first_block(&readme, "toml").unwrap();
    assert!(
        toml.contains(r#"features = ["sqlite", "http"]"#),
        "README.md's Cargo.toml lines: {toml}"
    );
}

/// Serves the example's router on a free port on the store at `path`; returns its tool's URL.
async fn serve(path: &std::path::Path) -> String {
    let store = SqliteStore::open(path).unwrap();
    store.migrate().unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!(
        "http://{}/tools/create_ticket",
        listener.local_addr().unwrap()
    );
    let app = axum_handler::app(store);
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

async fn post(url: &str, tenant: Option<&str>, key: &str, title: &str) -> (u16, bool, Value) {
    // reqwest without a TLS provider of its own, as the workspace builds it: any will do.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut request = reqwest::Client::new()
        .post(url)
        .header("idempotency-key", key)
        .json(&json!({"title": title}));
    if let Some(tenant) = tenant {
        request = request.header("x-tenant-id", tenant);
    }
    let answer = request.send().await.unwrap();
    let replayed = answer.headers().contains_key("idempotency-replayed");
    (
        answer.status().as_u16(),
        replayed,
        answer.json().await.unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_makes_one_ticket_per_key_and_tenant() {
    let dir = kit::temp_dir("idem-readme");
    let path = dir.path().join("idem.sqlite3");
    let tickets = || axum_handler::TICKETS.load(Ordering::SeqCst);
    let url = serve(&path).await;

    let (status, replayed, first) =
        post(&url, Some("acme"), "wf-1:step-3", "Printer on fire").await;
    assert_eq!((status, replayed), (200, false), "{first}");
    assert_eq!(tickets(), 1);
    let (status, replayed, again) =
        post(&url, Some("acme"), "wf-1:step-3", "Printer on fire").await;
    assert_eq!((status, replayed), (200, true), "{again}");
    assert_eq!(again["original_response"], first["original_response"]);
    assert_eq!(tickets(), 1, "a retry makes no ticket");

    // Restarted: a new store on the same file; the retry still gets the stored answer.
    let restarted = serve(&path).await;
    let (_, replayed, after) =
        post(&restarted, Some("acme"), "wf-1:step-3", "Printer on fire").await;
    assert!(
        replayed && after["original_response"] == first["original_response"],
        "{after}"
    );
    // Other arguments under the key: refused, nothing runs. Another tenant's equal key: its own.
    let (status, _, _) = post(&restarted, Some("acme"), "wf-1:step-3", "Printer fixed").await;
    assert_eq!(status, 422);
    let (status, replayed, other) =
        post(&restarted, Some("globex"), "wf-1:step-3", "Printer on fire").await;
    assert_eq!((status, replayed), (200, false), "{other}");
    assert_ne!(
        other["original_response"]["ticket_id"],
        first["original_response"]["ticket_id"]
    );
    // No principal: 401, nothing runs.
    let (status, _, _) = post(&restarted, None, "wf-1:step-4", "Printer on fire").await;
    assert_eq!(status, 401);
    assert_eq!(tickets(), 2, "one ticket per (tenant, key)");
}
