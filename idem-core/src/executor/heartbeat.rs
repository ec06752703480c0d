//! Heartbeats: while an operation runs, the executor renews its lease at a fraction of it, beside
//! the operation's future, so a holder whose work outlives its lease is not taken over while it is
//! alive ([contract §2](crate::contract#extend), [§7](crate::contract#traps)).
//!
//! The renewal lives in the call's future, not in a task of its own: dropping the call stops it,
//! and the lease then runs out as for a crashed holder (contract §2, cancellation). It stops when
//! the operation returns, when the outcome was recorded by the operation's own transaction, and
//! when a renewal is fenced; the operation learns that through [`Attempt::lost`].

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use futures_util::future::{Either, select};

use super::{Attempt, Executor};
use crate::wait::Timer;

/// How often the executor renews a running operation's lease.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Heartbeat {
    /// Every third of the policy's lease (the policy in force when the operation starts).
    #[default]
    LeaseThird,
    /// At this interval.
    Every(Duration),
    /// Never.
    Off,
}

/// The shortest interval: the unit stores keep time in.
const MIN_INTERVAL: Duration = Duration::from_millis(1);

impl Executor {
    /// Renews the lease of a running operation every `every` (`None`: never). By default the
    /// executor renews it every third of the [policy's lease](crate::Policy::lease), to
    /// `now + lease`, for as long as the operation runs, so a holder whose work outlives its
    /// lease is not taken over while it is alive. The interval counts from the time the lease
    /// was last set (the claim's or the renewal's `now`), not from when the store answered: a
    /// claim slow to answer is renewed as its operation starts. Renewal stops when the operation returns, when
    /// it is fenced (the operation learns it through [`Attempt::is_lost`] and [`Attempt::lost`]),
    /// and when the caller's future is dropped: the lease then runs out as for a crashed holder.
    /// An interval below 1 ms is taken as 1 ms; one that is not well below the lease lets the
    /// lease end between two renewals.
    ///
    /// Turn it off for a tool that renews its lease itself ([`Attempt::extend`]) or whose slow
    /// holders should be taken over. A hung operation keeps its claim while its call lives:
    /// bound the work with a timeout of its own.
    ///
    /// Heartbeats sleep on the executor's [`Timer`] ([`Executor::with_timer`]); without one
    /// (no `tokio` feature and no timer given, or outside a tokio runtime with the default
    /// timer) nothing renews the lease.
    pub fn with_heartbeat(mut self, every: Option<Duration>) -> Self {
        self.heartbeat = every.map_or(Heartbeat::Off, |every| {
            Heartbeat::Every(every.max(MIN_INTERVAL))
        });
        self
    }

    /// The heartbeat of `attempt`, to run beside its operation; `None` when heartbeats are off
    /// or there is no usable timer.
    pub(super) fn heartbeat_of(
        &self,
        attempt: &Attempt,
    ) -> Option<impl Future<Output = ()> + use<>> {
        let lease = attempt.policy.lease();
        let every = match self.heartbeat {
            Heartbeat::LeaseThird => (lease / 3).max(MIN_INTERVAL),
            Heartbeat::Every(every) => every,
            Heartbeat::Off => return None,
        };
        let timer = self.waiting.timer.clone().filter(Timer::usable)?;
        Some(beat(attempt.clone(), timer, every, lease))
    }
}

/// Renews `attempt`'s lease to `now + lease` every `every`, until it is lost or recorded.
async fn beat(attempt: Attempt, timer: Timer, every: Duration, lease: Duration) {
    let mut wait = next_renewal(&attempt, every, lease);
    loop {
        timer.sleep(wait).await;
        // Recorded by the operation's own transaction: the claim ended well, nothing to renew
        // (a renewal racing that commit is fenced, and only logged).
        if attempt.recorded.is_marked() || attempt.is_lost() {
            return;
        }
        match attempt.extend(lease).await {
            Ok(true) => wait = next_renewal(&attempt, every, lease),
            // Fenced: `extend` marked the attempt lost and said so.
            Ok(false) => return,
            Err(error) => {
                tracing::warn!(%error, "heartbeat: the lease could not be renewed; trying again at the next beat");
                wait = every;
            }
        }
    }
}

/// How long until the next renewal: `every` after the lease was last set (its deadline less
/// `lease`), counted from the time that write was asked for, not from when its answer came. A
/// claim or renewal slow to answer (a commit held up by the disk, a queue before the store) has
/// already spent part of the lease; the next renewal comes that much sooner, at once if it is
/// due.
fn next_renewal(attempt: &Attempt, every: Duration, lease: Duration) -> Duration {
    let set_at = attempt.lease_until() - lease;
    (set_at + every).saturating_since(attempt.now())
}

/// Runs `operation` to its end with `heartbeat` beside it; the heartbeat stops with it.
pub(super) async fn beside<T>(
    operation: impl Future<Output = T>,
    heartbeat: Option<impl Future<Output = ()>>,
) -> T {
    let Some(heartbeat) = heartbeat else {
        return operation.await;
    };
    match select(pin!(operation), pin!(heartbeat)).await {
        Either::Left((out, _)) => out,
        // The heartbeat ended (the claim is lost): the operation runs on, and learns it.
        Either::Right(((), operation)) => operation.await,
    }
}
