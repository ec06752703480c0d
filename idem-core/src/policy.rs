//! How long records live, how long claims are trusted, and what is cached.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// Which outcomes become the permanent answer ([contract §2](crate::contract#complete),
/// `complete`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CachePolicy {
    /// A definitive outcome completes the record; a retryable one marks it `failed_retryable`, so
    /// the next attempt runs the operation again. The default.
    #[default]
    DefinitiveOnly,
    /// Every outcome completes the record: the first answer, whatever it was, is the answer
    /// forever (Stripe's behaviour).
    CacheAll,
}

/// What a claim does when it finds a `processing` record whose lease has elapsed ([contract
/// §2](crate::contract#states)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StalePolicy {
    /// Answer `InFlight { stale: true }` and leave the record to reconciliation, which asks the
    /// downstream system whether the effect happened. The default: the holder may have done the
    /// effect and died before writing it down.
    #[default]
    Reconcile,
    /// Take the claim over with the next token. Only safe where the operation's effect is itself
    /// deduplicated downstream or a double effect is acceptable.
    Takeover,
}

/// Why a policy was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PolicyError {
    /// The lease was zero in whole milliseconds (stores keep time in milliseconds, so a lease
    /// below 1 ms would be stored as none).
    #[error("policy: the lease must be at least 1 ms (stores keep it in whole milliseconds)")]
    ZeroLease,
    /// The ttl did not exceed the lease in whole milliseconds (which also refuses a ttl that is
    /// zero in milliseconds).
    #[error("policy: the ttl ({ttl:?}) must exceed the lease ({lease:?}) in whole milliseconds")]
    TtlNotAboveLease {
        /// The ttl given.
        ttl: Duration,
        /// The lease given.
        lease: Duration,
    },
    /// The outcome limit was zero.
    #[error("policy: max_outcome_bytes must be at least 1")]
    ZeroOutcomeLimit,
    /// The checkpoint limit was zero.
    #[error("policy: max_checkpoint_bytes must be at least 1")]
    ZeroCheckpointLimit,
}

/// The knobs of contract [§1](crate::contract#words)–[§2](crate::contract#states). Always valid:
/// build one with [`Policy::builder`] or take [`Policy::default`].
///
/// ```
/// use idem_core::{Policy, StalePolicy};
/// use std::time::Duration;
/// let p = Policy::builder()
///     .lease(Duration::from_secs(10))
///     .stale(StalePolicy::Takeover)
///     .build()
///     .unwrap();
/// assert_eq!(p.ttl(), Duration::from_secs(24 * 3600));
/// assert!(Policy::builder().ttl(Duration::from_secs(5)).lease(Duration::from_secs(10)).build().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Policy {
    ttl: Duration,
    lease: Duration,
    cache: CachePolicy,
    stale: StalePolicy,
    max_outcome_bytes: usize,
    max_checkpoint_bytes: usize,
}

impl Policy {
    /// Default ttl: 24 hours.
    pub const DEFAULT_TTL: Duration = Duration::from_secs(24 * 3600);
    /// Default lease: 30 seconds.
    pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
    /// Default outcome limit: 1 MiB.
    pub const DEFAULT_MAX_OUTCOME_BYTES: usize = 1024 * 1024;
    /// Default checkpoint limit: 64 KiB.
    pub const DEFAULT_MAX_CHECKPOINT_BYTES: usize = 64 * 1024;

    /// A builder starting from the defaults.
    pub fn builder() -> PolicyBuilder {
        PolicyBuilder(Self::default())
    }

    /// How long a record is kept after its last claim or completion.
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// How long a claim is presumed alive: the tool's processing window plus the store write.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// Which outcomes are cached.
    pub fn cache(&self) -> CachePolicy {
        self.cache
    }

    /// What a claim does with a stale `processing` record.
    pub fn stale(&self) -> StalePolicy {
        self.stale
    }

    /// The largest outcome body stored, in bytes.
    pub fn max_outcome_bytes(&self) -> usize {
        self.max_outcome_bytes
    }

    /// The largest checkpoint stored, in bytes: its name plus its value as stored (encoded by
    /// the executor's codec where there is one) ([contract §6.1](crate::contract#checkpoints)).
    pub fn max_checkpoint_bytes(&self) -> usize {
        self.max_checkpoint_bytes
    }

    /// A builder starting from this policy.
    pub fn to_builder(self) -> PolicyBuilder {
        PolicyBuilder(self)
    }
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            ttl: Self::DEFAULT_TTL,
            lease: Self::DEFAULT_LEASE,
            cache: CachePolicy::default(),
            stale: StalePolicy::default(),
            max_outcome_bytes: Self::DEFAULT_MAX_OUTCOME_BYTES,
            max_checkpoint_bytes: Self::DEFAULT_MAX_CHECKPOINT_BYTES,
        }
    }
}

/// Builds a [`Policy`]; [`PolicyBuilder::build`] checks it.
#[derive(Debug, Clone, Copy)]
pub struct PolicyBuilder(Policy);

impl PolicyBuilder {
    /// Sets the ttl (must exceed the lease by at least 1 ms).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.0.ttl = ttl;
        self
    }

    /// Sets the lease (at least 1 ms).
    pub fn lease(mut self, lease: Duration) -> Self {
        self.0.lease = lease;
        self
    }

    /// Sets the cache policy.
    pub fn cache(mut self, cache: CachePolicy) -> Self {
        self.0.cache = cache;
        self
    }

    /// Sets the stale-claim policy.
    pub fn stale(mut self, stale: StalePolicy) -> Self {
        self.0.stale = stale;
        self
    }

    /// Sets the outcome size limit, in bytes (at least 1).
    pub fn max_outcome_bytes(mut self, bytes: usize) -> Self {
        self.0.max_outcome_bytes = bytes;
        self
    }

    /// Sets the checkpoint size limit, in bytes (at least 1).
    pub fn max_checkpoint_bytes(mut self, bytes: usize) -> Self {
        self.0.max_checkpoint_bytes = bytes;
        self
    }

    /// Checks and returns the policy. Durations are compared as stores keep them, in whole
    /// milliseconds: a lease below 1 ms is [`PolicyError::ZeroLease`], and a ttl that is not at
    /// least 1 ms longer than the lease once both are truncated to milliseconds is
    /// [`PolicyError::TtlNotAboveLease`].
    pub fn build(self) -> Result<Policy, PolicyError> {
        let p = self.0;
        if p.lease.as_millis() == 0 {
            return Err(PolicyError::ZeroLease);
        }
        if p.ttl.as_millis() <= p.lease.as_millis() {
            return Err(PolicyError::TtlNotAboveLease {
                ttl: p.ttl,
                lease: p.lease,
            });
        }
        if p.max_outcome_bytes == 0 {
            return Err(PolicyError::ZeroOutcomeLimit);
        }
        if p.max_checkpoint_bytes == 0 {
            return Err(PolicyError::ZeroCheckpointLimit);
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals() {
        assert_eq!(
            Policy::builder().lease(Duration::ZERO).build(),
            Err(PolicyError::ZeroLease)
        );
        assert!(matches!(
            Policy::builder()
                .ttl(Duration::from_secs(30))
                .lease(Duration::from_secs(30))
                .build(),
            Err(PolicyError::TtlNotAboveLease { .. })
        ));
        assert_eq!(
            Policy::builder().max_outcome_bytes(0).build(),
            Err(PolicyError::ZeroOutcomeLimit)
        );
        assert_eq!(
            Policy::builder().max_checkpoint_bytes(0).build(),
            Err(PolicyError::ZeroCheckpointLimit)
        );
        assert_eq!(
            Policy::default().to_builder().build(),
            Ok(Policy::default())
        );
    }

    /// Stores keep durations in whole milliseconds: what rounds to 0 ms there is refused here.
    #[test]
    fn durations_that_round_to_zero_ms_are_refused() {
        for lease in [Duration::from_nanos(1), Duration::from_micros(999)] {
            assert_eq!(
                Policy::builder().lease(lease).build(),
                Err(PolicyError::ZeroLease)
            );
        }
        assert!(
            Policy::builder()
                .lease(Duration::from_millis(1))
                .build()
                .is_ok()
        );
        // A ttl 0.5 ms above the lease is the same whole millisecond: refused.
        assert!(matches!(
            Policy::builder()
                .lease(Duration::from_millis(5))
                .ttl(Duration::from_micros(5_500))
                .build(),
            Err(PolicyError::TtlNotAboveLease { .. })
        ));
        assert!(matches!(
            Policy::builder()
                .lease(Duration::from_millis(1))
                .ttl(Duration::from_micros(1_900))
                .build(),
            Err(PolicyError::TtlNotAboveLease { .. })
        ));
        assert!(
            Policy::builder()
                .lease(Duration::from_millis(1))
                .ttl(Duration::from_millis(2))
                .build()
                .is_ok()
        );
    }
}
