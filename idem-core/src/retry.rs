//! The client side's retry schedule ([contract §6](crate::contract#beyond-one-call)): shared by
//! every transport's client (HTTP, MCP).
//!
//! The caller reuses one key on every attempt; this module only decides how long an attempt may
//! take, how long to wait between attempts, and when to give up.

use std::time::Duration;

/// How a client retries one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// How long one attempt may take before the client gives up on it and retries.
    pub attempt_timeout: Duration,
    /// How long the whole call may take, all attempts and waits included.
    pub overall_deadline: Duration,
    /// The first backoff; it doubles after each retry, up to `max_backoff`, with jitter.
    pub initial_backoff: Duration,
    /// The largest backoff.
    pub max_backoff: Duration,
    /// Allow an `attempt_timeout` below the tool's published minimum client deadline. Off by
    /// default: such attempts are cut off while the tool still works, so every one of them ends
    /// in a timeout and a retry.
    pub allow_short_attempts: bool,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempt_timeout: Duration::from_secs(30),
            overall_deadline: Duration::from_secs(120),
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(5),
            allow_short_attempts: false,
        }
    }
}

/// An attempt timeout below the tool's published minimum client deadline (processing window plus
/// store write): every attempt would be cut off while the tool works.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "attempt timeout {attempt_timeout:?} is below the tool's minimum client deadline {min_client_deadline:?}; raise it (or opt out with allow_short_attempts)"
)]
pub struct ShortAttempt {
    /// The configured per-attempt deadline.
    pub attempt_timeout: Duration,
    /// The tool's published minimum.
    pub min_client_deadline: Duration,
}

/// The overall deadline passed before an answer: the operation may still complete, and a later
/// call with the same key gets its answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no answer within the overall deadline after {attempts} attempts (last: {last})")]
pub struct DeadlineExceeded {
    /// Attempts made.
    pub attempts: u32,
    /// What the last attempt got.
    pub last: String,
}

impl RetryPolicy {
    /// Refuses an attempt timeout below the tool's published minimum (when it is known), unless
    /// `allow_short_attempts`.
    ///
    /// ```
    /// use idem_core::retry::RetryPolicy;
    /// use std::time::Duration;
    /// let short = RetryPolicy { attempt_timeout: Duration::from_millis(500), ..RetryPolicy::default() };
    /// assert!(short.check_minimum(Some(Duration::from_millis(1500))).is_err());
    /// assert!(short.check_minimum(None).is_ok());
    /// ```
    pub fn check_minimum(&self, min_client_deadline: Option<Duration>) -> Result<(), ShortAttempt> {
        match min_client_deadline {
            Some(min) if self.attempt_timeout < min && !self.allow_short_attempts => {
                Err(ShortAttempt {
                    attempt_timeout: self.attempt_timeout,
                    min_client_deadline: min,
                })
            }
            _ => Ok(()),
        }
    }

    /// The waits between this policy's attempts.
    pub fn backoff(&self) -> Backoff {
        Backoff {
            next: self.initial_backoff,
            max: self.max_backoff,
        }
    }
}

/// Exponential backoff with "equal jitter" (a random wait between half the step and the whole of
/// it), never shorter than the delay the server asked for.
#[derive(Debug, Clone)]
pub struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    /// The wait before the next attempt; `retry_after` is the server's own delay, if it gave one
    /// (`Retry-After`, an MCP in-flight error's `retryAfterMs`).
    pub fn next_wait(&mut self, retry_after: Option<Duration>) -> Duration {
        let half = self.next / 2;
        let jittered = half + half.mul_f64(rand::random::<f64>());
        self.next = (self.next * 2).min(self.max);
        retry_after.map_or(jittered, |r| r.max(jittered))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_double_with_jitter_up_to_the_max_and_honour_the_server() {
        let policy = RetryPolicy {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(300),
            ..RetryPolicy::default()
        };
        for _ in 0..50 {
            let mut b = policy.backoff();
            let steps: Vec<Duration> = (0..4).map(|_| b.next_wait(None)).collect();
            let bounds = [(50, 100), (100, 200), (150, 300), (150, 300)];
            for (step, (lo, hi)) in steps.iter().zip(bounds) {
                assert!(
                    *step >= Duration::from_millis(lo) && *step <= Duration::from_millis(hi),
                    "{steps:?}"
                );
            }
            assert_eq!(
                b.next_wait(Some(Duration::from_secs(2))),
                Duration::from_secs(2)
            );
        }
    }

    #[test]
    fn the_minimum_is_enforced_unless_opted_out() {
        let short = RetryPolicy {
            attempt_timeout: Duration::from_millis(500),
            ..RetryPolicy::default()
        };
        let min = Some(Duration::from_millis(1500));
        let err = short.check_minimum(min).unwrap_err();
        assert!(err.to_string().contains("minimum client deadline"));
        // The minimum itself is enough: a deadline of exactly the published minimum covers the
        // window and the store's write.
        let exact = RetryPolicy {
            attempt_timeout: Duration::from_millis(1500),
            ..short
        };
        assert!(exact.check_minimum(min).is_ok());
        let under = RetryPolicy {
            attempt_timeout: Duration::from_millis(1499),
            ..short
        };
        assert!(under.check_minimum(min).is_err());
        let opted = RetryPolicy {
            allow_short_attempts: true,
            ..short
        };
        assert!(opted.check_minimum(min).is_ok());
    }
}
