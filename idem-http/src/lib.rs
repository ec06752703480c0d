#![doc = include_str!("../README.md")]

mod answer;
#[cfg(feature = "client")]
pub mod client;
mod key;
mod keyless;
mod layer;
mod prefer;
mod prepare;
mod problem;
mod query;
mod replay;
mod service;

pub use answer::{IDEMPOTENCY_REPLAYED, default_classify};
pub use idem_core::Attempt;
pub use key::{IDEMPOTENCY_KEY, key_header, read_key};
pub use keyless::IDEMPOTENCY_KEY_SOURCE;
pub use layer::{DEFAULT_BODY_LIMIT, IdempotencyLayer};
pub use prefer::{PREFER, PREFERENCE_APPLIED};
pub use problem::{Problem, ProblemResponse};
pub use query::canonical_query;
pub use replay::Replay;
pub use service::Idempotent;
