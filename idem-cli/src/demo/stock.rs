//! `idem demo --callers stock`: agents that send no key ([contract
//! §5.1](idem_core::contract#keyless)) retrying the same tool, once with keys derived from the
//! arguments and, side by side, with the key refused and with the tool unprotected; effects counted
//! at the sink.
//!
//! The agents are what a generic stack does without an orchestrator's key: an HTTP client with a
//! retry policy (it re-sends the same body after a timeout, a 409 or a 5xx), duplicate sends of
//! one call, and a model that calls again after it got its answer.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_core::KeySource;
use serde_json::{Value, json};
use tokio::sync::Semaphore;

use super::orchestrated::DemoOptions;
use crate::exit::Failure;
use crate::serve::{Backend, BoxError, ServeOptions, TENANT_HEADER, router};
use idemkit::StoreUrl;

/// What one run of the stock callers produced, under one key source.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StockReport {
    /// Operations the agents meant to perform (each once).
    pub operations: usize,
    /// HTTP requests sent.
    pub attempts: usize,
    /// Answers that were first executions (2xx, not replayed).
    pub executed: usize,
    /// Answers that were replays (`Idempotency-Replayed: true`).
    pub replays: usize,
    /// 409 answers (in flight), each retried.
    pub conflicts: usize,
    /// Calls refused for want of a key (400).
    pub refused: usize,
    /// Calls that got no answer within their deadline.
    pub unanswered: usize,
    /// Tickets at the sink.
    pub tickets: i64,
    /// Tickets beyond one per operation: effects that happened twice.
    pub double_effects: i64,
}

/// The faults, one per operation in turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// The attempt deadline is shorter than the tool: the client re-sends after each timeout.
    RepeatAfterTimeout,
    /// The call is sent twice at once.
    DuplicateSend,
    /// Answered, then the model calls again with the same arguments.
    RepeatAfterSuccess,
}

impl Fault {
    fn of(i: usize) -> Self {
        match i % 3 {
            0 => Self::RepeatAfterTimeout,
            1 => Self::DuplicateSend,
            _ => Self::RepeatAfterSuccess,
        }
    }
}

#[derive(Default)]
struct Counters {
    attempts: AtomicUsize,
    executed: AtomicUsize,
    replays: AtomicUsize,
    conflicts: AtomicUsize,
    refused: AtomicUsize,
    unanswered: AtomicUsize,
}

/// A stock HTTP client: no key; re-sends the same body after a timeout, a 409 or a 5xx.
struct StockClient {
    http: reqwest::Client,
    url: String,
    tenant: String,
    attempt_timeout: Duration,
    deadline: Duration,
}

impl StockClient {
    async fn call(&self, body: &Value, counters: &Counters) {
        let started = tokio::time::Instant::now();
        let mut backoff = Duration::from_millis(20);
        while started.elapsed() < self.deadline {
            counters.attempts.fetch_add(1, Ordering::Relaxed);
            let sent = self
                .http
                .post(&self.url)
                .header(TENANT_HEADER, &self.tenant)
                .json(body)
                .timeout(self.attempt_timeout)
                .send()
                .await;
            match sent {
                Ok(answer) if answer.status().is_success() => {
                    let replayed = answer
                        .headers()
                        .get(idem_http::IDEMPOTENCY_REPLAYED)
                        .is_some_and(|v| v == "true");
                    let counter = match replayed {
                        true => &counters.replays,
                        false => &counters.executed,
                    };
                    counter.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Ok(answer) if answer.status() == reqwest::StatusCode::BAD_REQUEST => {
                    counters.refused.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                Ok(answer) if answer.status() == reqwest::StatusCode::CONFLICT => {
                    counters.conflicts.fetch_add(1, Ordering::Relaxed);
                }
                // A timeout, a 5xx, a broken connection: the retry policy re-sends.
                _ => {}
            }
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(Duration::from_millis(200));
        }
        counters.unanswered.fetch_add(1, Ordering::Relaxed);
    }
}

/// Runs the stock callers against the tool with `source` for calls without a key, and counts.
pub async fn run(options: &DemoOptions, source: KeySource) -> Result<StockReport, BoxError> {
    let backend = Backend::open(&options.store).await?;
    let serve = ServeOptions {
        tool_latency: options.tool_latency,
        key_source: source,
        ..ServeOptions::default()
    };
    let min_deadline = serve.min_client_deadline();
    let app = router(backend.clone(), serve)?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let base = format!("http://{}", listener.local_addr()?);
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let tenant = format!("stock-{:016x}", rand::random::<u64>());
    let run_id = format!("{:08x}", rand::random::<u32>());
    let client = |attempt_timeout| {
        Ok::<_, BoxError>(StockClient {
            http: idem_http::client::http_client_builder().build()?,
            url: format!("{base}/tools/create_ticket"),
            tenant: tenant.clone(),
            attempt_timeout,
            deadline: min_deadline * 4,
        })
    };
    let patient = Arc::new(client(min_deadline + Duration::from_millis(500))?);
    let hasty = Arc::new(client(options.tool_latency / 2)?);

    let counters = Arc::new(Counters::default());
    let slots = Arc::new(Semaphore::new(options.concurrency.max(1)));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..options.operations {
        let permit = slots.clone().acquire_owned().await?;
        let (patient, hasty, counters) = (patient.clone(), hasty.clone(), counters.clone());
        let body = json!({
            "title": format!("Stock {run_id} ticket {i}"),
            "account_id": format!("A-{}", i % 17),
        });
        tasks.spawn(async move {
            let _permit = permit;
            match Fault::of(i) {
                Fault::RepeatAfterTimeout => hasty.call(&body, &counters).await,
                Fault::DuplicateSend => {
                    tokio::join!(
                        patient.call(&body, &counters),
                        patient.call(&body, &counters)
                    );
                }
                Fault::RepeatAfterSuccess => {
                    patient.call(&body, &counters).await;
                    patient.call(&body, &counters).await;
                }
            }
        });
    }
    while tasks.join_next().await.is_some() {}
    // A request cut off by its client's timeout may still be working: let the tool finish.
    tokio::time::sleep(min_deadline).await;
    server.abort();
    let tickets = backend.ticket_count(&tenant).await?;
    let c = |n: &AtomicUsize| n.load(Ordering::Relaxed);
    Ok(StockReport {
        operations: options.operations,
        attempts: c(&counters.attempts),
        executed: c(&counters.executed),
        replays: c(&counters.replays),
        conflicts: c(&counters.conflicts),
        refused: c(&counters.refused),
        unanswered: c(&counters.unanswered),
        tickets,
        double_effects: (tickets - options.operations as i64).max(0),
    })
}

/// The closing table: one column per key source.
pub fn table(columns: &[(&str, StockReport)]) -> String {
    let names = [
        "operations",
        "attempts (HTTP requests)",
        "answered: executed",
        "answered: replayed",
        "409 in flight",
        "refused: no key (400)",
        "unanswered",
        "tickets at the sink",
        "double effects",
    ];
    let mut out = format!("{:<26}", "key source");
    for (name, _) in columns {
        out.push_str(&format!("{name:>14}"));
    }
    out.push('\n');
    for (row, name) in names.iter().enumerate() {
        out.push_str(&format!("{name:<26}"));
        for (_, r) in columns {
            let cells = [
                r.operations as i64,
                r.attempts as i64,
                r.executed as i64,
                r.replays as i64,
                r.conflicts as i64,
                r.refused as i64,
                r.unanswered as i64,
                r.tickets,
                r.double_effects,
            ];
            out.push_str(&format!("{:>14}", cells[row]));
        }
        out.push('\n');
    }
    out
}

/// `idem demo --callers stock`: the same stock traffic with keys derived from the arguments,
/// with calls without a key refused, and unprotected, on `store` (a fresh SQLite file in a temp
/// directory, removed afterwards, when `None`); prints the table and fails if the derived keys
/// let an effect happen twice.
pub async fn run_cli(
    store: Option<StoreUrl>,
    options: impl FnOnce(StoreUrl) -> DemoOptions,
) -> Result<(), Failure> {
    let temp = match &store {
        Some(_) => None,
        None => Some(std::env::temp_dir().join(format!("idem-demo-stock-{}", std::process::id()))),
    };
    let store = match (store, &temp) {
        (Some(store), _) => store,
        (None, Some(dir)) => {
            std::fs::create_dir_all(dir).map_err(Failure::other)?;
            format!("sqlite://{}", dir.join("demo.db").display()).parse()?
        }
        (None, None) => unreachable!("a temp directory when no store is given"),
    };
    let result = run_all(&options(store)).await;
    if let Some(dir) = temp {
        let _ = std::fs::remove_dir_all(dir);
    }
    result
}

async fn run_all(options: &DemoOptions) -> Result<(), Failure> {
    println!(
        "idem demo --callers stock: {} operations, {} at a time, tool latency {} ms, store {}",
        options.operations,
        options.concurrency,
        options.tool_latency.as_millis(),
        options.store
    );
    println!(
        "callers that send no key: a retry policy re-sending after a timeout, duplicate sends, a repeat after success"
    );
    let failed = |e| Failure::other(e);
    let arguments = run(options, KeySource::arguments_at(["/title", "/account_id"]))
        .await
        .map_err(failed)?;
    let refused = run(options, KeySource::Refuse).await.map_err(failed)?;
    let unprotected = run(options, KeySource::Unprotected).await.map_err(failed)?;
    println!();
    print!(
        "{}",
        table(&[
            ("arguments", arguments),
            ("refuse", refused),
            ("unprotected", unprotected),
        ])
    );
    if arguments.double_effects > 0 {
        return Err(Failure::suite_failed(format!(
            "with keys derived from the arguments, {} effects happened twice",
            arguments.double_effects
        )));
    }
    println!(
        "\nwith derived keys: one ticket per operation; refused: no ticket and {} calls failed; unprotected: {} duplicate tickets.",
        refused.refused, unprotected.double_effects
    );
    Ok(())
}
