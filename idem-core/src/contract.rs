//! The contract (rendered from `docs/contract.md`).
#![doc = include_str!("../docs/contract.md")]
