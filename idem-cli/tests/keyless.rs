//! Callers that send no `Idempotency-Key` ([contract §5.1](idem_core::contract#keyless)): the
//! real `idem serve --key-source arguments` binary on a SQLite file, its tickets counted in the
//! file, its metrics scraped, its records read back with `idem keys`; and
//! `idem demo --callers stock` (its report per key source: the unit tests in src/tests/demo.rs).

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;

use idem_conformance::kit;
use serde_json::{Value, json};
use tokio::sync::Barrier;

const IDEM: &str = env!("CARGO_BIN_EXE_idem");

/// A running `idem serve`, killed and its directory removed on drop.
struct Served {
    child: Child,
    dir: PathBuf,
    store: String,
    tool: String,
    metrics: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn serve(key_source: &str) -> Served {
    serve_with(key_source, 0)
}

/// `idem serve --key-source KEY_SOURCE --tool-latency-ms LATENCY_MS` on a fresh SQLite file.
fn serve_with(key_source: &str, latency_ms: u64) -> Served {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("idem-keyless-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let store = format!("sqlite://{}", dir.join("idem.db").display());
    let mut child = Command::new(IDEM)
        .env_remove("IDEM_STORE")
        .env_remove("RUST_LOG")
        .args(["serve", "--addr", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
        .args(["--key-source", key_source, "--store", &store])
        .args(["--tool-latency-ms", &latency_ms.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    // Keep draining stderr so the server never blocks on it.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let _ = tx.send(line.unwrap());
        }
    });
    let (mut tool, mut metrics) = (None, None);
    while tool.is_none() || metrics.is_none() {
        let line = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("the server prints its addresses");
        let url = line.split_whitespace().find(|w| w.starts_with("http://"));
        if line.contains("/metrics") {
            metrics = url.map(str::to_owned);
        } else if line.contains("/tools/create_ticket") {
            tool = url.map(str::to_owned);
        }
    }
    Served {
        child,
        dir,
        store,
        tool: tool.unwrap(),
        metrics: metrics.unwrap(),
    }
}

impl Served {
    async fn post(&self, tenant: &str, key: Option<&str>, body: &Value) -> reqwest::Response {
        let mut request = idem_http::client::http_client_builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap()
            .post(&self.tool)
            .header("x-tenant-id", tenant)
            .json(body);
        if let Some(key) = key {
            request = request.header("idempotency-key", key);
        }
        request.send().await.unwrap()
    }

    fn tickets(&self, tenant: &str) -> i64 {
        let db = self.dir.join("idem.db");
        idemkit::sqlite::rusqlite::Connection::open(db)
            .unwrap()
            .query_row(
                "SELECT count(*) FROM tickets WHERE tenant = ?1",
                [tenant],
                |r| r.get(0),
            )
            .unwrap()
    }

    fn idem(&self, args: &[&str]) -> String {
        let out = Command::new(IDEM)
            .env_remove("IDEM_STORE")
            .args(args)
            .args(["--store", &self.store])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }
}

fn ticket(title: &str) -> Value {
    json!({"title": title, "account_id": "A-7"})
}

fn replayed(answer: &reqwest::Response) -> bool {
    answer.headers().contains_key("idempotency-replayed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_arguments_keys_makes_one_ticket_per_call() {
    let s = serve("arguments");
    let first = s.post("acme", None, &ticket("Printer on fire")).await;
    assert_eq!(first.status(), 201);
    assert_eq!(first.headers()["idempotency-key-source"], "arguments");
    let again = s.post("acme", None, &ticket("Printer on fire")).await;
    assert!(replayed(&again));
    assert_eq!(s.tickets("acme"), 1);

    // Other arguments: a new ticket; another tenant with identical arguments: its own.
    assert!(!replayed(
        &s.post("acme", None, &ticket("Printer out of toner")).await
    ));
    assert!(!replayed(
        &s.post("globex", None, &ticket("Printer on fire")).await
    ));
    assert_eq!((s.tickets("acme"), s.tickets("globex")), (2, 1));
    // A sent key wins: its own operation.
    let sent = s
        .post("acme", Some("wf-1:step-1"), &ticket("Printer on fire"))
        .await;
    assert!(!replayed(&sent) && !sent.headers().contains_key("idempotency-key-source"));
    assert_eq!(s.tickets("acme"), 3);

    // The operator sees where each key came from.
    let listed: Value = serde_json::from_str(&s.idem(&["keys", "ls", "--json"])).unwrap();
    let sources: Vec<&str> = listed
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["key_source"].as_str().unwrap())
        .collect();
    assert_eq!(
        sources.iter().filter(|s| **s == "arguments").count(),
        3,
        "{listed}"
    );
    assert_eq!(
        sources.iter().filter(|s| **s == "sent").count(),
        1,
        "{listed}"
    );
    let table = s.idem(&["keys", "ls"]);
    assert!(
        table.contains("KEY SOURCE") && table.contains("arguments"),
        "{table}"
    );
    let derived = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["key_source"] == "arguments")
        .unwrap();
    let shown = s.idem(&[
        "keys",
        "show",
        derived["scope"].as_str().unwrap(),
        derived["key"].as_str().unwrap(),
    ]);
    assert!(
        shown
            .lines()
            .any(|l| l.starts_with("key_source") && l.ends_with("arguments")),
        "{shown}"
    );

    // The claims are counted by key source.
    let scrape = idem_http::client::http_client()
        .unwrap()
        .get(&s.metrics)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let claimed = |source: &str| {
        scrape.lines().any(|l| {
            l.starts_with("idem_claims_total{")
                && l.contains("result=\"claimed\"")
                && l.contains(&format!("key_source=\"{source}\""))
        })
    };
    assert!(claimed("arguments") && claimed("sent"), "{scrape}");
}

/// Six identical requests without a key at once, to a tool that takes 300 ms (real latency, so
/// that they overlap): the five that find the first in flight are waited for, since a client
/// that sends no key cannot ask to wait. Six answers, no 409, one ticket in the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_arguments_keys_and_a_slow_tool_answers_six_identical_requests_at_once() {
    let s = Arc::new(serve_with("arguments", 300));
    let gate = Arc::new(Barrier::new(6));
    let mut calls = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let (s, gate) = (s.clone(), gate.clone());
        calls.spawn(async move {
            gate.wait().await;
            let answer = s.post("acme", None, &ticket("Six at once")).await;
            (answer.status().as_u16(), replayed(&answer))
        });
    }
    let answers = calls.join_all().await;
    assert!(answers.iter().all(|a| a.0 == 201), "no 409: {answers:?}");
    assert_eq!(
        answers.iter().filter(|a| !a.1).count(),
        1,
        "one ran, five replayed: {answers:?}"
    );
    assert_eq!(s.tickets("acme"), 1);
    assert!(replayed(
        &s.post("acme", None, &ticket("Six at once")).await
    ));
    assert_eq!(s.tickets("acme"), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_refuses_keyless_calls_by_default_and_unprotected_repeats() {
    let s = serve("client");
    assert_eq!(s.post("acme", None, &ticket("x")).await.status(), 400);
    assert_eq!(s.tickets("acme"), 0);
    drop(s);
    let s = serve("unprotected");
    for _ in 0..2 {
        assert_eq!(s.post("acme", None, &ticket("x")).await.status(), 201);
    }
    assert_eq!(
        s.tickets("acme"),
        2,
        "unprotected: the repeat is a second ticket"
    );
}

#[test]
fn the_binary_runs_the_stock_demo_and_exits_zero() {
    let (store, dir) = kit::store_url("sqlite", "demo.db").unwrap();
    let out = Command::new(IDEM)
        .args([
            "demo",
            "--callers",
            "stock",
            "--operations",
            "9",
            "--concurrency",
            "3",
        ])
        .args(["--tool-latency-ms", "30", "--store", &store])
        .output()
        .unwrap();
    drop(dir);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let row = |name: &str| -> Vec<String> {
        stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no {name} row: {stdout}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    let double = row("double effects");
    let n = double.len();
    // Columns: arguments, refuse, unprotected.
    assert_eq!(double[n - 3], "0", "{stdout}");
    assert_ne!(
        double[n - 1],
        "0",
        "without protection the repeats duplicate: {stdout}"
    );
    let tickets = row("tickets at the sink");
    assert_eq!(tickets[tickets.len() - 3], "9", "{stdout}");
}
