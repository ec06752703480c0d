//! `idem demo`: what idem changes, shown on a real tool under injected faults, with effects
//! counted at the sink. One module per demo:
//!
//! - [`orchestrated`]: agents that send a key made from their workflow step (the default);
//! - [`stock`]: agents that send none (`--callers stock`);
//! - [`crash_between`]: a holder that crashes between two effects (`--crash-between-effects`);
//! - [`tasks`]: MCP tasks over two replicas, one killed mid-task (`--mcp-tasks`).

pub(crate) mod crash_between;
pub(crate) mod orchestrated;
pub(crate) mod report;
pub(crate) mod stock;
pub(crate) mod tasks;

use std::time::Duration;

use idemkit::StoreUrl;

use crate::cli::{DEMO_DEFAULT_LATENCY_MS, DemoArgs};
use crate::exit::Failure;
use orchestrated::DemoOptions;

/// `idem demo` on `store` (`None`: a fresh SQLite file of the demo's own).
pub(crate) async fn run(store: Option<StoreUrl>, args: DemoArgs) -> Result<(), Failure> {
    let DemoArgs {
        operations,
        concurrency,
        tool_latency_ms,
        without_idem,
        callers,
        crash_between_effects,
        mcp_tasks,
        no_wait,
    } = args;
    if crash_between_effects {
        return crash_between::run_cli(store, operations).await;
    }
    if mcp_tasks {
        // The tool outlives its clients' 5 s deadline: 12 s unless given.
        let latency = match tool_latency_ms {
            DEMO_DEFAULT_LATENCY_MS => 12_000,
            given => given,
        };
        let options = tasks::TasksOptions::new(operations, Duration::from_millis(latency));
        return tasks::run_cli(store, options).await;
    }
    let options = |store| DemoOptions {
        store,
        operations,
        concurrency,
        tool_latency: Duration::from_millis(tool_latency_ms),
        progress: true,
        wait: !no_wait,
    };
    match callers.as_str() {
        "stock" => stock::run_cli(store, options).await,
        _ => orchestrated::run_cli(store, options, without_idem).await,
    }
}
