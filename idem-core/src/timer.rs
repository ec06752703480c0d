//! [`Timer`], what waits and heartbeats sleep on (re-exported as [`crate::wait::Timer`]).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

/// A future that sleeps, as a [`Timer`] returns it.
pub type Sleep = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// What waits and heartbeats sleep on: a function from a duration to a future that resolves
/// after it.
///
/// idem-core runs on any executor, so it takes its timer from the caller, as it takes its
/// spawner. With the `tokio` feature (on by default) [`Timer::tokio`] is the executor's default;
/// on another runtime pass its sleep to [`Executor::with_timer`](crate::Executor::with_timer).
#[derive(Clone)]
pub struct Timer {
    sleep: Arc<dyn Fn(Duration) -> Sleep + Send + Sync>,
    needs_tokio: bool,
}

impl fmt::Debug for Timer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Timer")
            .field("tokio", &self.needs_tokio)
            .finish_non_exhaustive()
    }
}

impl Timer {
    /// A timer that sleeps with `sleep`, e.g. `Timer::new(|d|
    /// Box::pin(async_io::Timer::after(d)))`.
    pub fn new(sleep: impl Fn(Duration) -> Sleep + Send + Sync + 'static) -> Self {
        Self {
            sleep: Arc::new(sleep),
            needs_tokio: false,
        }
    }

    /// `tokio::time::sleep`. Usable only inside a tokio runtime with its time driver enabled;
    /// outside one, the executor does not wait (it answers `InFlight` at once) and does not renew
    /// leases.
    #[cfg(feature = "tokio")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
    pub fn tokio() -> Self {
        Self {
            sleep: Arc::new(|d| Box::pin(tokio::time::sleep(d))),
            needs_tokio: true,
        }
    }

    /// A future that resolves after `duration`.
    pub fn sleep(&self, duration: Duration) -> Sleep {
        (self.sleep)(duration)
    }

    /// Whether this timer can sleep here (a tokio timer needs a current tokio runtime).
    pub(crate) fn usable(&self) -> bool {
        #[cfg(feature = "tokio")]
        if self.needs_tokio {
            return tokio::runtime::Handle::try_current().is_ok();
        }
        true
    }
}
