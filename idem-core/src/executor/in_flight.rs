//! What a call that finds its operation in flight gets ([contract §4](crate::contract#refusals),
//! [§5.1](crate::contract#keyless)): when to ask again (from the tool's processing window, not
//! the whole lease), and whether a caller that cannot ask to wait (its key was derived) is waited
//! for.

use std::time::Duration;

use super::Executor;
use crate::KeyOrigin;

impl Executor {
    /// The tool's published processing window (its p99): an in-flight answer tells the caller to
    /// ask again when the answer is likely ready, what is left of this window since the holder's
    /// claim (bounded by the holder's remaining lease), instead of the whole remaining lease.
    /// Without it the policy's lease counts as the window, so the hint is the remaining lease.
    pub fn with_processing_window(mut self, window: Duration) -> Self {
        self.waiting.window = Some(window);
        self
    }

    /// Whether a call under a derived key ([`KeyOrigin`] other than `Sent`) that asked for no
    /// wait is waited for ([contract §5.1](crate::contract#keyless)): on by default, such a call
    /// that finds its operation in flight waits as if it had asked for the [maximum
    /// wait](Executor::with_max_wait), because its caller (a stock client) cannot ask. `false`:
    /// it is answered [`Error::InFlight`](crate::Error::InFlight) at once, as a keyed call that
    /// did not ask to wait is.
    pub fn with_derived_key_wait(mut self, on: bool) -> Self {
        self.waiting.derived_key_wait_off = !on;
        self
    }

    /// The bound of the wait of a call under a key from `origin`: the one it asked for
    /// ([`wait_bound`](Executor::wait_bound)); for a derived key that asked for none, the maximum
    /// wait unless [turned off](Executor::with_derived_key_wait).
    pub(super) fn wait_bound_for(&self, origin: KeyOrigin) -> Duration {
        let asked = self.wait_bound();
        if asked.is_zero() && origin != KeyOrigin::Sent && !self.waiting.derived_key_wait_off {
            self.max_wait()
        } else {
            asked
        }
    }

    /// When a call that found its operation in flight under a running lease should ask again:
    /// [`retry_hint`] of the holder's remaining lease.
    pub(super) fn retry_hint(&self, lease_left: Duration) -> Duration {
        let lease = self.policy.lease();
        retry_hint(lease_left, lease, self.waiting.window.unwrap_or(lease))
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
