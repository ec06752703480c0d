//! `idem demo --mcp-tasks`: a tool that works longer than its clients wait, served as MCP tasks
//! (MCP 2026-07-28) by two replicas behind no sticky routing, one of which is killed mid-task;
//! with idem (the task is the record, in one store) and, side by side, with rmcp's in-memory
//! `TaskManager` in each replica. Effects are counted at the sink.
//!
//! Each replica runs on a tokio runtime of its own, serving stateless streamable HTTP; killing
//! it shuts the runtime down at once: its listener, its store handle and every tool it was
//! running are gone, as in a crash. The clients (real rmcp clients declaring the tasks
//! extension) do what a task-aware client does: call, and on no answer within their deadline (or
//! an answer lost on the way) call again; poll `tasks/get`, each poll to whichever replica the
//! balancer picks; call again when a task is unknown (a replica forgot it or never had it) or is
//! reported stale (its holder stopped renewing). The demo loses the first answer of every third
//! operation.

mod client;
mod options;
mod replica;
mod tool;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use idemkit::StoreUrl;

use super::orchestrated::demo_failure;
use crate::exit::Failure;
use crate::serve::BoxError;
use client::{Counters, connect, operate};
use options::Sink;
pub(crate) use options::{Mode, TasksOptions};
use replica::Replica;

/// What one run produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TasksReport {
    /// Operations meant.
    pub operations: usize,
    /// Effects at the sink.
    pub effects: usize,
    /// Operations whose effect happened more than once.
    pub doubled: usize,
    /// Operations that never got a result.
    pub unfinished: usize,
    /// `tools/call` requests sent.
    pub calls: usize,
    /// Distinct task ids the clients were given.
    pub tasks_created: usize,
    /// Polls answered "unknown task": a task the replica polled does not have.
    pub lost: usize,
    /// `tasks/get` requests sent.
    pub polls: usize,
    /// Time to the result, median and slowest, in milliseconds.
    pub p50_ms: u64,
    /// The slowest.
    pub max_ms: u64,
}

/// `idem demo --mcp-tasks`: both runs, side by side, then the verdict (exit 6 on a double
/// effect with idem).
pub async fn run_cli(store: Option<StoreUrl>, options: TasksOptions) -> Result<(), Failure> {
    let dir = std::env::temp_dir().join(format!("idem-demo-tasks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(Failure::other)?;
    let store = match store {
        Some(store) => store,
        None => format!("sqlite://{}", dir.join("demo.db").display())
            .parse()
            .map_err(Failure::usage)?,
    };
    println!(
        "{} operations, a {} ms tool, clients that call again after {} ms and lose the first answer of every third operation, polls over two replicas, the first killed at {} ms",
        options.operations,
        options.tool_latency.as_millis(),
        options.client_deadline.as_millis(),
        options.kill_after.as_millis()
    );
    let with = run(Mode::Idem(store), &options)
        .await
        .map_err(demo_failure)?;
    let without = run(Mode::TaskManager, &options)
        .await
        .map_err(demo_failure)?;
    let _ = std::fs::remove_dir_all(&dir);
    println!("{}", table(&with, &without));
    if with.doubled > 0 || with.unfinished > 0 {
        return Err(Failure::suite_failed(format!(
            "with idem: {} operations doubled, {} unfinished",
            with.doubled, with.unfinished
        )));
    }
    Ok(())
}

fn table(with: &TasksReport, without: &TasksReport) -> String {
    let row = |name: &str, f: &dyn Fn(&TasksReport) -> String| {
        format!("{name:<34} {:>14} {:>22}\n", f(with), f(without))
    };
    let mut out = format!("{:<34} {:>14} {:>22}\n", "", "idem", "TaskManager alone");
    out += &row("operations", &|r| r.operations.to_string());
    out += &row("effects at the sink", &|r| r.effects.to_string());
    out += &row("operations with a double effect", &|r| {
        r.doubled.to_string()
    });
    out += &row("operations without a result", &|r| r.unfinished.to_string());
    out += &row("tools/call sent", &|r| r.calls.to_string());
    out += &row("tasks created", &|r| r.tasks_created.to_string());
    out += &row("polls of an unknown task (lost)", &|r| r.lost.to_string());
    out += &row("polls per operation", &|r| {
        format!("{:.1}", r.polls as f64 / r.operations.max(1) as f64)
    });
    out += &row("time to result p50 / max, ms", &|r| {
        format!("{} / {}", r.p50_ms, r.max_ms)
    });
    out
}

pub(crate) async fn run(mode: Mode, options: &TasksOptions) -> Result<TasksReport, BoxError> {
    let sink = Sink::default();
    let mut replicas = Vec::new();
    for _ in 0..2 {
        replicas.push(Replica::start(&mode, &sink, options).await?);
    }
    let alive = Arc::new([AtomicBool::new(true), AtomicBool::new(true)]);
    // A tenant of its own for each run: records of an earlier run on the same store are not
    // this run's.
    let tenant = format!("demo-{}", &idem_core::Token::new(0).id_hex()[..12]);
    let mut clients = Vec::new();
    for replica in &replicas {
        clients.push(connect(&replica.url, &tenant).await?);
    }
    let clients = Arc::new(clients);
    let counters = Arc::new(Counters::default());
    let mut operations = tokio::task::JoinSet::new();
    for op in 0..options.operations {
        let (clients, alive, counters, options) = (
            clients.clone(),
            alive.clone(),
            counters.clone(),
            options.clone(),
        );
        operations.spawn(async move { operate(op, &clients, &alive, &counters, &options).await });
    }
    tokio::time::sleep(options.kill_after).await;
    alive[0].store(false, Ordering::SeqCst);
    replicas[0].kill();
    let mut times = Vec::new();
    while let Some(done) = operations.join_next().await {
        if let Some(took) = done? {
            times.push(took);
        }
    }
    // Whatever is still running finishes before the sink is read.
    tokio::time::sleep(options.tool_latency / 4).await;
    times.sort();
    let effects = sink.lock().map_err(|_| "the sink's lock")?.clone();
    let report = TasksReport {
        operations: options.operations,
        effects: effects.values().sum(),
        doubled: effects.values().filter(|n| **n > 1).count(),
        unfinished: options.operations - times.len(),
        calls: counters.calls.load(Ordering::SeqCst),
        tasks_created: counters.ids.lock().map_err(|_| "the ids' lock")?.len(),
        lost: counters.lost.load(Ordering::SeqCst),
        polls: counters.polls.load(Ordering::SeqCst),
        p50_ms: times
            .get(times.len() / 2)
            .map_or(0, |d| d.as_millis() as u64),
        max_ms: times.last().map_or(0, |d| d.as_millis() as u64),
    };
    for replica in &mut replicas {
        replica.kill();
    }
    Ok(report)
}
