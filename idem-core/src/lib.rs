#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

/// One `tracing` event per transition ([contract §8](crate::contract#observability)): the event's
/// name is the transition's, and the same name is in the structured field `idem.event`, so every
/// formatter prints it.
macro_rules! transition {
    ($level:ident, $name:literal $(, $($rest:tt)*)?) => {
        tracing::event!(name: $name, tracing::Level::$level, idem.event = $name $(, $($rest)*)?)
    };
}

pub mod codec;
pub mod contract;
pub mod machine;
pub mod metrics;
pub mod reconcile;
pub mod retry;
pub mod store;
pub mod wait;

mod checkpoint;
mod clock;
mod downstream;
mod error;
mod executor;
mod fingerprint;
mod key;
mod key_source;
mod maintenance;
mod memory;
mod outcome;
mod policy;
mod record;
mod refusal;
mod timer;
mod token;
mod tool;
mod typed;

pub use async_trait::async_trait;
pub use checkpoint::{Checkpoint, CheckpointError};
pub use clock::{Clock, ManualClock, SystemClock, Timestamp};
pub use contract::ToolContract;
pub use downstream::downstream_key;
pub use error::Error;
pub use executor::{Answer, Attempt, BackgroundTask, Call, Execution, Executor, Reply, Started};
pub use fingerprint::{Fingerprint, FingerprintError, canonical_json};
pub use key::{IdempotencyKey, KeyError, KeyOrigin, Scope, ScopeError};
pub use key_source::KeySource;
pub use machine::ClaimKind;
pub use maintenance::{ConfigWarning, Maintenance};
pub use memory::MemoryStore;
pub use outcome::{OUTCOME_NOT_KEPT, Outcome, OutcomeClass};
pub use policy::{CachePolicy, Policy, PolicyBuilder, PolicyError, StalePolicy};
pub use record::{Record, RecordId, RecordState};
pub use refusal::{ErrorAnswer, Refusal};
pub use store::{KeyStore, StoreError};
pub use token::Token;
pub use tool::{CallKey, Tool, ToolBuilder, ToolError};
pub use typed::{OperationError, TypedExecution};
pub use wait::Timer;
