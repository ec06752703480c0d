//! Purge: the garbage collection of expired records, flat out ([`purge_expired_all`]) or paced
//! ([`purge_expired_paced`]).

use std::future::Future;
use std::time::Duration;

use crate::metrics::timed;
use crate::{Clock, KeyStore, StoreError, Timestamp};

/// What a purge did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PurgeReport {
    /// Records deleted.
    pub deleted: usize,
    /// Batches run.
    pub batches: usize,
    /// Whether it stopped at the deadline with expired records possibly left.
    pub stopped_at_deadline: bool,
}

/// Deletes the records expired at `now` in batches of `batch` until a batch comes back short or
/// `deadline` (on `clock`) passes; `on_batch` sees the running total after each batch (for a
/// progress bar). Runs flat out: one batch straight after the other. Usable as a periodic task;
/// where claims run at the same time, [`purge_expired_paced`] leaves them room.
pub async fn purge_expired_all(
    store: &dyn KeyStore,
    clock: &dyn Clock,
    batch: usize,
    deadline: Option<Timestamp>,
    on_batch: impl FnMut(&PurgeReport),
) -> Result<PurgeReport, StoreError> {
    let mut pace = PurgePace::new(batch);
    if let Some(deadline) = deadline {
        pace = pace.deadline(deadline);
    }
    purge_expired_paced(store, clock, pace, |_| std::future::ready(()), on_batch).await
}

/// How [`purge_expired_paced`] goes: batch size, share of the time spent in the store, deadline.
///
/// A batch holds what the engine holds while it deletes: SQLite's one write lock for the whole
/// batch, Redis's one thread for each script, PostgreSQL only the rows. A claim that arrives
/// meanwhile waits for the rest of the batch, so on SQLite and Redis a purge running flat out
/// stretches the claims' tail. Small batches keep each wait short; a duty cycle below 1 keeps
/// most claims from meeting a batch at all.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PurgePace {
    batch: usize,
    duty: f64,
    deadline: Option<Timestamp>,
}

/// A duty cycle outside `(0, 1]` (or not a number).
#[derive(Debug, Clone, Copy, PartialEq, thiserror::Error)]
#[error("purge duty cycle must be greater than 0 and at most 1, got {0}")]
pub struct InvalidDuty(pub f64);

impl PurgePace {
    /// Batches of `batch` records (at least 1), flat out (duty cycle 1), no deadline.
    pub fn new(batch: usize) -> Self {
        PurgePace {
            batch: batch.max(1),
            duty: 1.0,
            deadline: None,
        }
    }

    /// The share of wall-clock time the purge may spend in `purge_expired`: after a batch that
    /// took `t`, it rests `t × (1 − duty) / duty` before the next. `0.5` rests as long as each
    /// batch took; `1.0` does not rest. Refuses anything outside `(0, 1]`.
    pub fn duty(self, duty: f64) -> Result<Self, InvalidDuty> {
        if duty > 0.0 && duty <= 1.0 {
            Ok(PurgePace { duty, ..self })
        } else {
            Err(InvalidDuty(duty))
        }
    }

    /// Stops once `deadline` (on the purge's clock) has passed, checked before each batch.
    pub fn deadline(self, deadline: Timestamp) -> Self {
        PurgePace {
            deadline: Some(deadline),
            ..self
        }
    }

    /// Records per batch.
    pub fn batch_size(&self) -> usize {
        self.batch
    }

    /// The duty cycle, in `(0, 1]`.
    pub fn duty_cycle(&self) -> f64 {
        self.duty
    }

    /// How long to rest after a batch that took `took`.
    fn rest_after(&self, took: Duration) -> Duration {
        if self.duty >= 1.0 {
            Duration::ZERO
        } else {
            took.mul_f64((1.0 - self.duty) / self.duty)
        }
    }
}

/// Deletes the records expired at `now` as [`purge_expired_all`] does, paced by `pace`: after
/// each batch it rests (with `sleep`, the runtime's sleep, e.g. `tokio::time::sleep`) in
/// proportion to the time the batch took, so the purge holds the store at most `pace`'s duty
/// cycle of the time. The batch time is measured on the monotonic clock, not on `clock` (whose
/// milliseconds are too coarse for batches of a few records); `clock` gives `now` and the
/// deadline. `on_batch` sees the running total after each batch. A short batch ends it without a
/// rest.
///
/// ```
/// use idem_core::{KeyStore, StoreError, SystemClock};
/// use idem_core::reconcile::{PurgePace, purge_expired_paced};
///
/// /// What `idem purge` does: 250 records a batch, deleting at most a quarter of the time.
/// async fn purge(store: &dyn KeyStore) -> Result<usize, StoreError> {
///     let pace = PurgePace::new(250).duty(0.25).expect("a duty cycle in (0, 1]");
///     let report =
///         purge_expired_paced(store, &SystemClock, pace, tokio::time::sleep, |_| {}).await?;
///     Ok(report.deleted)
/// }
/// # let store = idem_core::MemoryStore::new();
/// # let deleted = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap()
/// #     .block_on(purge(&store)).unwrap();
/// # assert_eq!(deleted, 0);
/// ```
pub async fn purge_expired_paced<S, F>(
    store: &dyn KeyStore,
    clock: &dyn Clock,
    pace: PurgePace,
    sleep: S,
    mut on_batch: impl FnMut(&PurgeReport),
) -> Result<PurgeReport, StoreError>
where
    S: Fn(Duration) -> F,
    F: Future<Output = ()>,
{
    let batch = pace.batch;
    let now = clock.now();
    let mut report = PurgeReport::default();
    loop {
        if pace.deadline.is_some_and(|d| clock.now() >= d) {
            report.stopped_at_deadline = true;
            return Ok(report);
        }
        let started = std::time::Instant::now();
        let n = timed(
            store.backend(),
            "purge_expired",
            store.purge_expired(now, batch),
        )
        .await?;
        let took = started.elapsed();
        report.deleted += n;
        report.batches += 1;
        on_batch(&report);
        if n < batch {
            return Ok(report);
        }
        let rest = pace.rest_after(took);
        if !rest.is_zero() {
            sleep(rest).await;
        }
    }
}
