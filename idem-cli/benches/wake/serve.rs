//! Measured through `idem serve` itself: a retry of a slow tool, from a client of its own.

use super::*;

/// The store URLs `idem serve` is measured on: a fresh SQLite file, and PostgreSQL if configured.
pub(super) fn serve_urls() -> Vec<(&'static str, String)> {
    let file = std::env::temp_dir().join(format!("idem-wake-serve-{}.db", std::process::id()));
    let mut out = vec![("sqlite", format!("sqlite://{}", file.display()))];
    if let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") {
        out.push(("postgres", url));
    }
    out
}

/// A running `idem serve` child process, killed on drop.
pub(super) struct Served(std::process::Child);

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `idem serve` on `url` with a 300 ms tool, the binary itself: the first request, and 10 ms
/// later a retry from a client of its own, both with `Prefer: wait=5`; the gap between their
/// answers.
pub(super) async fn serve_pairs(url: &str) -> Vec<Duration> {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_idem"))
        .args(["serve", "--addr", "127.0.0.1:0", "--store", url])
        .args(["--tool-latency-ms", &TOOL.as_millis().to_string()])
        .env("RUST_LOG", "error")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let _served = Served(child);
    let (tx, rx) = std::sync::mpsc::channel();
    // Keep draining stderr so the server never blocks on it.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("idem: serving POST ") {
                let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_owned());
            }
        }
    });
    let base = rx
        .recv_timeout(Duration::from_secs(60))
        .expect("idem serve prints its address");
    let client = || reqwest::Client::builder().build().unwrap();
    let (first, retry) = (client(), client());
    let run = format!("{:x}", std::process::id());
    let mut out = Vec::with_capacity(SAMPLES);
    for batch in 0..SAMPLES / BATCH {
        let tasks: Vec<_> = (0..BATCH)
            .map(|i| {
                let (first, retry, base) = (first.clone(), retry.clone(), base.clone());
                let (_, key, _) = ids(&format!("serve-{run}"), batch * BATCH + i);
                tokio::spawn(async move {
                    // Both ask to wait: on a busy machine the retry can come first.
                    let send = |client: reqwest::Client| {
                        let (base, key) = (base.clone(), key.clone());
                        async move {
                            let answer = client
                                .post(base)
                                .header("content-type", "application/json")
                                .header("x-tenant-id", "bench")
                                .header("idempotency-key", key.as_str())
                                .header("prefer", "wait=5")
                                .body(r#"{"title": "Printer on fire", "account_id": "A-7"}"#)
                                .send()
                                .await
                                .unwrap();
                            assert_eq!(answer.status(), 201);
                            let replayed = answer.headers().contains_key("idempotency-replayed");
                            answer.bytes().await.unwrap();
                            (replayed, Instant::now())
                        }
                    };
                    let first = tokio::spawn(send(first));
                    tokio::time::sleep(RETRY_AFTER).await;
                    let (again, again_at) = send(retry).await;
                    let (first, first_at) = first.await.unwrap();
                    assert!(first != again, "one execution and one replay");
                    if again {
                        again_at.saturating_duration_since(first_at)
                    } else {
                        first_at.saturating_duration_since(again_at)
                    }
                })
            })
            .collect();
        for t in tasks {
            out.push(t.await.unwrap());
        }
    }
    out
}
