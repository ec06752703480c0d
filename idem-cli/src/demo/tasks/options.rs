//! What a run of `idem demo --mcp-tasks` is given: its settings, who serves the tasks, and the
//! sink the tool acts on.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idemkit::StoreUrl;

/// What `idem demo --mcp-tasks` runs.
#[derive(Debug, Clone)]
pub struct TasksOptions {
    /// Operations, each one provisioning, meant once.
    pub operations: usize,
    /// How long the tool works.
    pub tool_latency: Duration,
    /// How long a client waits for the answer to a call before it calls again.
    pub client_deadline: Duration,
    /// When the first replica is killed, after the start.
    pub kill_after: Duration,
}

impl TasksOptions {
    /// The demo's defaults for `operations`: a 12 s tool, a 5 s client deadline, the first
    /// replica killed halfway through the tool.
    pub fn new(operations: usize, tool_latency: Duration) -> Self {
        Self {
            operations,
            tool_latency,
            client_deadline: (tool_latency * 5 / 12).max(Duration::from_millis(100)),
            kill_after: tool_latency / 2,
        }
    }

    /// The lease of the idem replicas: short enough that a killed holder's task is taken over
    /// soon, renewed by the heartbeat while the holder lives. Not below a second: a lease covers
    /// the store's writes too (contract §1), and on a loaded machine one commit can take a few
    /// hundred milliseconds (a 300 ms lease let a live holder be taken over there).
    pub(super) fn lease(&self) -> Duration {
        (self.tool_latency / 4).max(Duration::from_secs(1))
    }

    pub(super) fn poll_interval(&self) -> Duration {
        (self.tool_latency / 24).max(Duration::from_millis(20))
    }
}

/// Who serves the tasks.
#[derive(Clone)]
pub(crate) enum Mode {
    /// `IdempotentTools` over the store at this URL, one handle per replica.
    Idem(StoreUrl),
    /// rmcp's `TaskManager`, in each replica's memory.
    TaskManager,
}

/// The system the tool acts on: how often each name was provisioned.
pub(super) type Sink = Arc<Mutex<HashMap<String, usize>>>;
