#![doc = include_str!("../README.md")]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod client;
pub mod key;
pub mod server;
mod wait;

pub use client::{CallAnswer, CallError, IdempotentCaller, RetryPolicy};
pub use idem_core;
pub use key::{KeyRefusal, META_KEY, key_of};
pub use rmcp;
pub use server::{
    FINGERPRINT_MISMATCH, IN_FLIGHT, IdempotentServer, IdempotentTools, KEY_SOURCE_META_KEY,
    NOT_KEPT_META_KEY, Principal, REPLAYED_META_KEY, STORE_UNAVAILABLE, ToolSettings,
    UNAUTHENTICATED, is_replay,
};
pub use wait::WAIT_META_KEY;
