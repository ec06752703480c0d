//! What a call runs under ([`Terms`]), and what it gets when it finds its operation in flight
//! ([contract §4](crate::contract#refusals)): when to ask again, from the tool's processing
//! window, not the whole lease.

use std::time::Duration;

use crate::{KeyOrigin, Policy, Tool};

/// What one call runs under: its tool's settings as they apply to its key, and the bound of its
/// wait.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Terms {
    /// The policy its record is kept under (a derived key's: for the key window).
    pub(crate) policy: Policy,
    /// The tool's processing window, for the retry hint.
    window: Duration,
    /// How long it waits for an in-flight answer, before the holder's lease; zero: not at all.
    pub(crate) wait: Duration,
}

impl Terms {
    /// The terms of a call of `tool` under a key from `origin` that asked to wait `wait`.
    pub(crate) fn of(tool: &Tool, origin: KeyOrigin, wait: Duration) -> Self {
        Self {
            policy: *tool.policy_for(origin),
            window: tool.processing_window(),
            wait: tool.wait_bound(origin, wait),
        }
    }

    /// These terms for a call that is answered at once, waited for or not.
    pub(crate) fn without_wait(mut self) -> Self {
        self.wait = Duration::ZERO;
        self
    }

    /// When a call that found its operation in flight under a running lease should ask again:
    /// [`retry_hint`] of the holder's remaining lease.
    pub(crate) fn retry_hint(&self, lease_left: Duration) -> Duration {
        retry_hint(lease_left, self.policy.lease(), self.window)
    }
}

/// The retry hint of an in-flight answer ([contract §4](crate::contract#refusals)): what is left
/// of the processing `window` since the holder's claim, or, once the window has passed (the
/// holder is late), one more window; never beyond the holder's remaining lease, never zero.
///
/// The claim's age is read from the lease: `lease - lease_left` (a holder that extended its lease
/// looks younger, so the hint errs towards later, still within the lease).
pub(crate) fn retry_hint(lease_left: Duration, lease: Duration, window: Duration) -> Duration {
    let age = lease.saturating_sub(lease_left);
    let window_left = window.saturating_sub(age);
    let hint = if window_left.is_zero() {
        window
    } else {
        window_left
    };
    hint.min(lease_left).max(Duration::from_millis(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn the_hint_is_what_is_left_of_the_window_not_of_the_lease() {
        let lease = ms(30_000);
        // A 20 ms tool claimed 5 ms ago: ask again in 15 ms, not in 30 s.
        assert_eq!(retry_hint(ms(29_995), lease, ms(20)), ms(15));
        // Claimed just now: one window.
        assert_eq!(retry_hint(lease, lease, ms(20)), ms(20));
        // Late (past its window): one more window.
        assert_eq!(retry_hint(ms(20_000), lease, ms(20)), ms(20));
        // Never beyond the remaining lease, never zero.
        assert_eq!(retry_hint(ms(7), ms(1_500), ms(1_000)), ms(7));
        assert_eq!(retry_hint(Duration::ZERO, lease, ms(20)), ms(1));
        // An extended lease (more left than a whole lease): the claim counts as new.
        assert_eq!(retry_hint(ms(45_000), lease, ms(20)), ms(20));
        // Without a window of its own the lease is the window: the remaining lease.
        assert_eq!(retry_hint(ms(12_000), lease, lease), ms(12_000));
    }
}
