//! What `idem proxy`'s tests share: the Python HTTP tool server of tests/upstreams (its effects
//! counted in its own SQLite sink, read back through its `GET /_sink`) and the real `idem proxy`
//! binary in front of it.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;

pub const IDEM: &str = env!("CARGO_BIN_EXE_idem");

/// A scratch directory, removed on drop.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let dir = std::env::temp_dir().join(format!("idem-{name}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub fn sqlite(&self) -> String {
        format!("sqlite://{}", self.0.join("idem.db").display())
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The python that runs the fixtures: scripts/services/upstreams.sh's venv, else `python3` (the
/// HTTP tool server needs only the standard library).
fn python() -> String {
    std::env::var("IDEM_TEST_UPSTREAM_PYTHON").unwrap_or_else(|_| "python3".into())
}

/// A child process killed on drop, with the first line it printed on stdout.
pub struct Running {
    pub child: Child,
    pub url: String,
    /// Lines of stderr, as they come.
    pub stderr: mpsc::Receiver<String>,
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Running {
    /// Starts `command` and waits for its `listening on URL` line.
    pub fn start(command: Command) -> Self {
        start(command)
    }

    /// Both processes, `first` killed before `second` (a proxy before its upstream).
    pub fn start_pair(first: Running, second: Running) -> Pair {
        Pair(first, second)
    }
}

/// Two processes, the first dropped (killed) first.
pub struct Pair(pub Running, pub Running);

/// Starts `command` and waits for its `listening on URL` line.
fn start(mut command: Command) -> Running {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the command starts");
    let stdout = child.stdout.take().unwrap();
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let (first_tx, first_rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines().map_while(Result::ok);
        if let Some(first) = lines.next() {
            let _ = first_tx.send(first);
        }
        // Keep draining so the child never blocks on a full pipe.
        for _ in lines {}
    });
    let first = match first_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(line) => line,
        Err(_) => {
            let _ = child.kill();
            let said: Vec<String> = rx.try_iter().collect();
            panic!("no `listening on` line; stderr: {said:#?}");
        }
    };
    let url = first
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("first line {first:?}"))
        .to_owned();
    Running {
        child,
        url,
        stderr: rx,
    }
}

/// The Python HTTP tool server, its sink in `dir`.
pub fn http_tool(dir: &Path, args: &[&str]) -> Running {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/upstreams/http_tool.py");
    let mut command = Command::new(python());
    command
        .arg(script)
        .arg("--sink")
        .arg(dir.join("sink.db"))
        .args(args);
    start(command)
}

/// `idem proxy --upstream UPSTREAM --addr 127.0.0.1:0 --store STORE ARGS…`.
pub fn proxy(upstream: &str, store: &str, args: &[&str]) -> Running {
    let mut command = Command::new(IDEM);
    command
        .env_remove("IDEM_STORE")
        .env_remove("RUST_LOG")
        .args(["proxy", "--upstream", upstream, "--addr", "127.0.0.1:0"])
        .args(["--store", store])
        .args(args);
    start(command)
}

/// `idem ARGS… --store STORE`: its stdout, or a panic with its stderr.
pub fn idem(store: &str, args: &[&str]) -> String {
    let out = Command::new(IDEM)
        .env_remove("IDEM_STORE")
        .args(args)
        .args(["--store", store])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "idem {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// One HTTP client per test, without a pool (each request its own connection, as retries from
/// separate processes would be).
pub fn client() -> reqwest::Client {
    idem_http::client::http_client_builder()
        .pool_max_idle_per_host(0)
        .build()
        .unwrap()
}

/// What the upstream's sink holds.
pub async fn sink(upstream: &str) -> Value {
    client()
        .get(format!("{upstream}/_sink"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// How many effects the upstream's sink holds.
pub async fn effects(upstream: &str) -> u64 {
    sink(upstream).await["effects"].as_u64().unwrap()
}

/// The `Idempotency-Key` each request the upstream received carried, in order.
pub async fn keys_received(upstream: &str) -> Vec<Option<String>> {
    sink(upstream).await["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["idempotency_key"].as_str().map(str::to_owned))
        .collect()
}

/// Returns once a request carrying `x-fixture-block: NAME` has recorded its effect upstream.
pub async fn arrived(upstream: &str, name: &str) {
    client()
        .get(format!("{upstream}/_control/arrived?name={name}"))
        .send()
        .await
        .unwrap();
}

/// Lets the requests blocked on `name` answer.
pub async fn release(upstream: &str, name: &str) {
    client()
        .post(format!("{upstream}/_control/release?name={name}"))
        .send()
        .await
        .unwrap();
}

/// A response, read whole.
pub struct Answer {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Vec<u8>,
}

impl Answer {
    pub async fn of(response: reqwest::Response) -> Self {
        Self {
            status: response.status().as_u16(),
            headers: response.headers().clone(),
            body: response.bytes().await.unwrap().to_vec(),
        }
    }

    pub fn replayed(&self) -> bool {
        self.headers
            .get("idempotency-replayed")
            .is_some_and(|v| v == "true")
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The problem `type`, if the body is a problem.
    pub fn problem(&self) -> Option<String> {
        let value: Value = serde_json::from_slice(&self.body).ok()?;
        value["type"].as_str().map(str::to_owned)
    }
}

/// `POST url` with a tenant, a key (if any), extra headers and a body.
pub async fn post(
    url: &str,
    tenant: &str,
    key: Option<&str>,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let mut request = client()
        .post(url)
        .header("x-tenant-id", tenant)
        .header("content-type", "application/json")
        .body(body.to_owned());
    if let Some(key) = key {
        request = request.header("idempotency-key", key);
    }
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    Answer::of(request.send().await.unwrap()).await
}
