//! **The rule the model states itself**, at the level of the SPEC: how long a repeat waits for an
//! in-flight answer ([contract §5.2](idem_core::contract#waiting)). The executor computes that
//! bound inside its waiting loop (`Executor::wait_bound` for the caller's and the tool's part, the
//! holder's remaining lease in its private wait round) and exposes no pure function of a record for
//! it, so the model states it here. When a waiter wakes is `idem_core::wait::changed`, the
//! executor's own rule; every other rule the model runs (checkpoints included) is
//! `idem_core::machine`'s.

use std::time::Duration;

use idem_core::{Record, Timestamp};

/// [contract §5.2](idem_core::contract#waiting): a repeat that finds the operation in flight (lease
/// running) waits at most the least of its wait, the tool's maximum and the holder's remaining
/// lease.
pub fn wait_until(record: &Record, now: Timestamp, max_wait: Duration) -> Timestamp {
    record.lease_until.min(now + max_wait)
}

/// [contract §5.2](idem_core::contract#waiting): a waiter re-reads when the record changed
/// (`idem_core::wait::changed`: gone, or another state, holder, lease or write) or its wait is
/// over; it then claims like any retry.
pub fn wakes(seen: &Record, current: Option<&Record>, until: Timestamp, now: Timestamp) -> bool {
    let current = current.filter(|r| !r.is_expired(now));
    idem_core::wait::changed(seen, current) || now >= until
}
