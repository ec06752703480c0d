//! The `idem` binary's library: the reference tool server and store URLs, usable from tests.

pub mod bench;
pub mod demo;
pub mod demo_stock;
pub mod exit;
pub mod ops;
pub mod serve;
pub mod tokens;
