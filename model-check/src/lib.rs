//! The idem protocol, model-checked ([contract §3](idem_core::contract#model-check);
//! `docs/model-check.md`).
//!
//! [`ProtocolModel`] puts 2–3 callers running the executor's steps, a reconciler, a store that may
//! fail over, and a clock into one [`stateright::Model`]. Every transition of a record is
//! `idem_core::machine`'s own rule (`claim`, `complete`, `release`, `extend`, `checkpoint`, the
//! expiry and lease tests of `Record`), called through [`machine::Machine`] so that tests can seed
//! a broken one; the reconciler's takeover is `idem_core::reconcile::takeover_policy`, and a
//! waiter wakes by `idem_core::wait::changed`, so a change of the rules is checked on the next run.
//! The one rule the executor keeps inside its waiting loop, the bound of a wait, is stated in
//! [`spec_rules`]. [`run::check`] searches every reachable state within the bounds of a [`Config`]
//! for a violation of the [`properties`], and stops at the first it finds;
//! [`liveness::always_can_settle`] checks that settling stays possible from every reachable state.
//!
//! Not published: nobody's dependency tree grows by it.

pub mod action;
pub mod caller;
pub mod config;
pub mod liveness;
pub mod machine;
pub mod model;
pub mod properties;
pub mod reconciler;
pub mod run;
pub mod spec_rules;
pub mod state;
pub mod store;

pub use action::{Action, Finding};
pub use config::{CallerSpec, Config, Replication};
pub use model::ProtocolModel;
