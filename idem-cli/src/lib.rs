//! The `idem` binary's library: the reference tool server and store URLs, usable from tests.

pub mod bench;
pub mod crash_between;
pub mod demo;
mod demo_report;
pub mod demo_stock;
pub mod exit;
pub mod ops;
pub mod serve;
mod steps;
pub mod tokens;
