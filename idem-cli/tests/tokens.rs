//! `idem serve` run as the binary: with `--tokens FILE` every tool request needs a bearer token
//! and its tenant is the token's (`X-Tenant-Id` ignored); without, the server warns loudly that the
//! header is trusted as sent. Tickets are counted in the SQLite file.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use idem_conformance::kit;
use serde_json::{Value, json};

const ACME: &str = "tok-acme-7f3a9c1e5b";
const GLOBEX: &str = "tok-globex-2d8b6e4f0a";

/// A running `idem serve` child process and everything it wrote to stderr.
struct Serving {
    child: Child,
    base: String,
    log: Arc<Mutex<String>>,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serving {
    fn start(db: &Path, extra: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_idem"))
            .args(["serve", "--addr", "127.0.0.1:0", "--store"])
            .arg(format!("sqlite://{}", db.display()))
            .args(extra)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stderr = child.stderr.take().unwrap();
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.strip_prefix("idem: serving POST ") {
                    let url = rest.split_whitespace().next().unwrap_or("").to_owned();
                    let _ = tx.send(url.trim_end_matches("/tools/create_ticket").to_owned());
                }
                let mut log = sink.lock().unwrap();
                log.push_str(&line);
                log.push('\n');
            }
        });
        let base = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("no serving line: {}", log.lock().unwrap()));
        Self { child, base, log }
    }

    fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    async fn post(&self, key: &str, headers: &[(&str, &str)]) -> reqwest::Response {
        let mut req = idem_http::client::http_client()
            .unwrap()
            .post(format!("{}/tools/create_ticket", self.base))
            .header("idempotency-key", key)
            .header("content-type", "application/json")
            .body(json!({"title": "Printer on fire", "account_id": "A-7"}).to_string());
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        req.send().await.unwrap()
    }
}

/// `tenant`'s tickets: rows of the server's table `tickets` in the SQLite file.
async fn tickets(db: &Path, tenant: &str) -> i64 {
    idemkit::sqlite::rusqlite::Connection::open(db)
        .unwrap()
        .query_row(
            "SELECT count(*) FROM tickets WHERE tenant = ?1",
            [tenant],
            |r| r.get(0),
        )
        .unwrap()
}

async fn unauthenticated(resp: reqwest::Response) {
    assert_eq!(resp.status(), 401);
    assert_eq!(resp.headers()["content-type"], "application/problem+json");
    assert!(
        resp.headers()["www-authenticate"]
            .to_str()
            .unwrap()
            .starts_with("Bearer")
    );
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["type"], "urn:idem:problem:unauthenticated", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tokens_a_bearer_is_required_and_x_tenant_id_is_ignored() {
    let dir = kit::temp_dir("idem-tokens");
    let db = dir.path().join("idem.db");
    let file = dir.path().join("tokens.txt");
    std::fs::write(
        &file,
        format!("# token tenant\n{ACME} acme\n\n{GLOBEX}   globex\n"),
    )
    .unwrap();
    let s = Serving::start(&db, &["--tokens", file.to_str().unwrap()]);

    // No token, a wrong one, another scheme, the header alone: 401, nothing runs.
    unauthenticated(s.post("k-1", &[("x-tenant-id", "acme")]).await).await;
    unauthenticated(
        s.post("k-1", &[("authorization", "Bearer tok-acme-7f3a9c1e5c")])
            .await,
    )
    .await;
    unauthenticated(
        s.post("k-1", &[("authorization", &format!("Basic {ACME}"))])
            .await,
    )
    .await;
    unauthenticated(s.post("k-1", &[("authorization", "Bearer")]).await).await;
    assert_eq!(tickets(&db, "acme").await, 0);

    // acme's token with globex's header: acme's ticket.
    let acme = format!("Bearer {ACME}");
    let first = s
        .post(
            "k-1",
            &[("authorization", &acme), ("x-tenant-id", "globex")],
        )
        .await;
    assert_eq!(first.status(), 201);
    assert_eq!(
        (tickets(&db, "acme").await, tickets(&db, "globex").await),
        (1, 0)
    );

    // globex, same key: its own scope, its own ticket, no replay of acme's answer.
    let globex = format!("bearer {GLOBEX}");
    let other = s.post("k-1", &[("authorization", &globex)]).await;
    assert_eq!(other.status(), 201);
    assert!(other.headers().get("idempotency-replayed").is_none());
    // acme again, claiming to be globex: acme's replay.
    let again = s
        .post(
            "k-1",
            &[("authorization", &acme), ("x-tenant-id", "globex")],
        )
        .await;
    assert_eq!(again.headers()["idempotency-replayed"], "true");
    assert_eq!(
        (tickets(&db, "acme").await, tickets(&db, "globex").await),
        (1, 1)
    );

    // The description stays open.
    let listing = idem_http::client::http_client()
        .unwrap()
        .get(format!("{}/tools", s.base))
        .send()
        .await
        .unwrap();
    assert_eq!(listing.status(), 200);

    let log = s.log();
    assert!(log.contains("bearer tokens loaded"), "{log}");
    assert!(
        !log.contains(ACME) && !log.contains(GLOBEX),
        "a token was logged: {log}"
    );
    assert!(!log.contains("trusted AS SENT"), "{log}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_tokens_the_header_is_trusted_and_the_server_says_so() {
    let dir = kit::temp_dir("idem-tokens");
    let db = dir.path().join("idem.db");
    let s = Serving::start(&db, &[]);
    let resp = s.post("k-h", &[("x-tenant-id", "acme")]).await;
    assert_eq!(resp.status(), 201);
    assert_eq!(tickets(&db, "acme").await, 1);
    let log = s.log();
    assert!(log.contains("WARN"), "{log}");
    assert!(log.contains("X-Tenant-Id is trusted AS SENT"), "{log}");
    assert!(log.contains("authenticating proxy"), "{log}");

    let help = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("UNAUTHENTICATED"), "{help}");
    assert!(help.contains("authenticating proxy"), "{help}");
    assert!(help.contains("--tokens <FILE>"), "{help}");
}

#[test]
fn a_bad_tokens_file_is_refused_without_echoing_a_token() {
    let dir = kit::temp_dir("idem-tokens");
    let file = dir.path().join("tokens.txt");
    std::fs::write(&file, format!("{ACME} acme\n{ACME} again\n")).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--addr", "127.0.0.1:0", "--store"])
        .arg(format!("sqlite://{}", dir.path().join("idem.db").display()))
        .args(["--tokens", file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("line 2"), "{stderr}");
    assert!(!stderr.contains(ACME), "{stderr}");
}
