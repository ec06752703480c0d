//! `idem serve --metrics ADDR`, run as the binary: tool calls over real HTTP, then a scrape of
//! `GET /metrics` whose Prometheus text must count exactly what happened (claims, replays,
//! refusals, store operations) and describe each metric (`# HELP`). The tickets are counted in
//! the SQLite file itself.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use idemkit::sqlite::rusqlite::Connection;
use serde_json::json;

/// The server process, killed on drop, and its temp directory, removed on drop.
struct Served {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The value of the sample `name{labels…}` in Prometheus text (labels in any order), if any.
fn sample(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|line| {
            let Some(rest) = line.strip_prefix(name) else {
                return false;
            };
            let (set, _) = rest.split_once(' ').unwrap_or(("", ""));
            if labels.is_empty() {
                return set.is_empty();
            }
            let Some(set) = set.strip_prefix('{').and_then(|s| s.strip_suffix('}')) else {
                return false;
            };
            let given: Vec<&str> = set.split(',').collect();
            given.len() == labels.len()
                && labels
                    .iter()
                    .all(|(k, v)| given.contains(&format!("{k}=\"{v}\"").as_str()))
        })
        .map(|line| line.rsplit(' ').next().unwrap().parse().unwrap())
}

#[tokio::test]
async fn serve_metrics_counts_claims_replays_and_refusals() {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let dir = std::env::temp_dir().join(format!("idem-metrics-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let db = dir.join("idem.db");
    let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
        .env_remove("IDEM_STORE")
        .env_remove("RUST_LOG")
        .args(["serve", "--addr", "127.0.0.1:0", "--metrics", "127.0.0.1:0"])
        .arg("--store")
        .arg(format!("sqlite://{}", db.display()))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let served = Served { child, dir };
    // Both addresses are printed on stderr; then keep draining it so the server never blocks.
    let (tx, rx) = std::sync::mpsc::channel();
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
    let (tool, metrics) = (tool.unwrap(), metrics.unwrap());

    let client = idem_http::client::http_client().unwrap();
    let post = |key: Option<&str>, body: serde_json::Value| {
        let mut req = client
            .post(&tool)
            .header("content-type", "application/json")
            .header("x-tenant-id", "acme")
            .body(body.to_string());
        if let Some(key) = key {
            req = req.header("idempotency-key", key);
        }
        req.send()
    };
    let args = json!({"title": "Printer on fire", "account_id": "A-7"});
    let first = post(Some("wf-1:step-1"), args.clone()).await.unwrap();
    assert_eq!(first.status(), 201, "{}", first.text().await.unwrap());
    let retry = post(Some("wf-1:step-1"), args.clone()).await.unwrap();
    assert_eq!(retry.headers()["idempotency-replayed"], "true");
    let other = json!({"title": "Printer on fire", "account_id": "B-9"});
    assert_eq!(
        post(Some("wf-1:step-1"), other).await.unwrap().status(),
        422
    );
    assert_eq!(post(None, args.clone()).await.unwrap().status(), 400);
    assert_eq!(post(Some("\"unclosed"), args).await.unwrap().status(), 400);
    let not_json = client
        .post(&tool)
        .header("x-tenant-id", "acme")
        .header("idempotency-key", "wf-1:step-3")
        .body("title=Printer")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 400);
    // Over the 1 MiB limit, on a connection of its own: the server answers 413 from the
    // declared length without reading the body and closes the connection, so the client may
    // see its write break instead of the answer. The count below proves the refusal either way.
    let huge = json!({"title": "x".repeat(2 << 20), "account_id": "A-7"});
    let alone = idem_http::client::http_client_builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap();
    let answer = alone
        .post(&tool)
        .header("content-type", "application/json")
        .header("x-tenant-id", "acme")
        .header("idempotency-key", "wf-1:step-2")
        .body(huge.to_string())
        .send()
        .await;
    if let Ok(answer) = answer {
        assert_eq!(answer.status(), 413);
    }

    // The effect at the sink: one ticket.
    let tickets: i64 = Connection::open(&db)
        .unwrap()
        .query_row("SELECT count(*) FROM tickets", [], |r| r.get(0))
        .unwrap();
    assert_eq!(tickets, 1);

    let scrape = client
        .get(&metrics)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let claims = |result| {
        sample(
            &scrape,
            "idem_claims_total",
            &[("result", result), ("key_source", "sent")],
        )
    };
    assert_eq!(claims("claimed"), Some(1.0), "{scrape}");
    assert_eq!(claims("replayed"), Some(1.0), "{scrape}");
    assert_eq!(claims("mismatch"), Some(1.0), "{scrape}");
    let refusals = |reason| {
        sample(
            &scrape,
            "idem_refusals_total",
            &[("transport", "http"), ("reason", reason)],
        )
    };
    assert_eq!(refusals("key-required"), Some(1.0), "{scrape}");
    assert_eq!(refusals("invalid-key"), Some(1.0), "{scrape}");
    assert_eq!(refusals("fingerprint-mismatch"), Some(1.0), "{scrape}");
    assert_eq!(refusals("body-too-large"), Some(1.0), "{scrape}");
    assert_eq!(refusals("invalid-body"), Some(1.0), "{scrape}");
    // Three claims reached the store (the first, the replay, the mismatch): each timed.
    let claim_ops = sample(
        &scrape,
        "idem_store_op_seconds_count",
        &[("backend", "sqlite"), ("op", "claim")],
    );
    assert_eq!(claim_ops, Some(3.0), "{scrape}");
    for name in [
        "idem_claims_total",
        "idem_refusals_total",
        "idem_store_op_seconds",
    ] {
        assert!(
            scrape
                .lines()
                .any(|l| l.starts_with(&format!("# HELP {name} "))),
            "no # HELP for {name}:\n{scrape}"
        );
    }
    drop(served);
}
