//! The tests that drive the binary's insides in process (a manual clock, the demo's own report);
//! those in `tests/` drive the binary itself.

mod demo;
mod demo_tasks;
mod serve;
