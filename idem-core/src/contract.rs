//! The contract (rendered from `docs/contract.md`), and the value a tool publishes from it
//! ([`ToolContract`], [§5](#http)): its processing window and the minimum client retry
//! deadline, and the tool listing (`GET /tools`, [`ToolListing`]) that carries them.
#![doc = include_str!("../docs/contract.md")]

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// What a side-effecting tool promises its callers ([contract §5](crate::contract#http)): it
/// answers within its processing window, and recording the answer costs at most the store write
/// budget, so a client attempt shorter than their sum (the minimum client retry deadline) is cut
/// off while the tool is still working.
///
/// ```
/// use std::time::Duration;
/// use idem_core::contract::ToolContract;
/// let contract = ToolContract::new(Duration::from_secs(1));
/// assert_eq!(contract.min_client_deadline(), Duration::from_millis(1500));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolContract {
    processing_window: Duration,
    store_write: Duration,
    max_wait: Option<Duration>,
}

impl ToolContract {
    /// What the store write costs at most by default: 500 ms.
    pub const DEFAULT_STORE_WRITE: Duration = Duration::from_millis(500);

    /// A tool answering within `processing_window` (its p99), with the
    /// [default store write budget](Self::DEFAULT_STORE_WRITE).
    pub fn new(processing_window: Duration) -> Self {
        Self {
            processing_window,
            store_write: Self::DEFAULT_STORE_WRITE,
            max_wait: None,
        }
    }

    /// The same contract publishing `max_wait`, the longest a repeat may wait for an in-flight
    /// answer ([§5.2](crate::contract#waiting),
    /// [`Executor::with_max_wait`](crate::Executor::with_max_wait)).
    pub fn with_max_wait(mut self, max_wait: Duration) -> Self {
        self.max_wait = Some(max_wait);
        self
    }

    /// The maximum wait the tool publishes, if it publishes one.
    pub fn max_wait(&self) -> Option<Duration> {
        self.max_wait
    }

    /// The same contract with another store write budget.
    pub fn with_store_write(mut self, budget: Duration) -> Self {
        self.store_write = budget;
        self
    }

    /// The processing window.
    pub fn processing_window(&self) -> Duration {
        self.processing_window
    }

    /// The store write budget.
    pub fn store_write(&self) -> Duration {
        self.store_write
    }

    /// The minimum client retry deadline: processing window + store write. A lease at least this
    /// long keeps a working holder's claim.
    pub fn min_client_deadline(&self) -> Duration {
        self.processing_window + self.store_write
    }
}

/// The tools an HTTP tool server lists at `GET /tools` (`{"tools": [...]}`): served by
/// `idem serve`, read by `idem_http::client::ToolClient::discover`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolListing {
    /// The tools.
    pub tools: Vec<ListedTool>,
}

impl ToolListing {
    /// The tool called `name`.
    pub fn tool(&self, name: &str) -> Option<&ListedTool> {
        self.tools.iter().find(|t| t.name == name)
    }
}

/// One tool of a [`ToolListing`], with its [`ToolContract`] in milliseconds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ListedTool {
    /// The tool's name.
    pub name: String,
    /// What it does and how to call it, for the model and for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// The JSON Schema of its arguments.
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    pub input_schema: serde_json::Value,
    /// [`ToolContract::processing_window`] in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processing_window_ms: Option<u64>,
    /// [`ToolContract::min_client_deadline`] in milliseconds (a listing may leave it out: the
    /// tool publishes none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_client_deadline_ms: Option<u64>,
    /// [`ToolContract::max_wait`] in milliseconds: the longest the tool lets a repeat wait for
    /// an in-flight answer (`Prefer: wait`); absent when the tool publishes none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_wait_ms: Option<u64>,
}

impl ListedTool {
    /// Tool `name` under `contract`, with no description or schema yet.
    pub fn new(name: impl Into<String>, contract: &ToolContract) -> Self {
        Self {
            name: name.into(),
            description: String::new(),
            input_schema: serde_json::Value::Null,
            processing_window_ms: Some(contract.processing_window().as_millis() as u64),
            min_client_deadline_ms: Some(contract.min_client_deadline().as_millis() as u64),
            max_wait_ms: contract.max_wait().map(|d| d.as_millis() as u64),
        }
    }

    /// The maximum wait the tool publishes, if it does.
    pub fn max_wait(&self) -> Option<Duration> {
        self.max_wait_ms.map(Duration::from_millis)
    }

    /// The minimum client retry deadline the tool publishes, if it does.
    pub fn min_client_deadline(&self) -> Option<Duration> {
        self.min_client_deadline_ms.map(Duration::from_millis)
    }
}
