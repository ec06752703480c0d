//! What the executor tests on tokio's paused clock share: that clock as the record's clock, and
//! the sink where the effect lands.

#![allow(dead_code)] // each test binary uses its own part

use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::{Clock, Outcome, Timestamp};
use serde_json::json;

/// tokio's clock as a wall clock: moves with paused time.
#[derive(Debug, Clone)]
pub struct TokioClock(pub tokio::time::Instant);

impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        Timestamp::from_millis(1_700_000_000_000) + self.0.elapsed()
    }
}

/// Where the effect lands: tickets created.
#[derive(Debug, Default)]
pub struct Sink(AtomicUsize);

impl Sink {
    /// Creates a ticket (the effect) and answers it.
    pub fn create_ticket(&self) -> Outcome {
        let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
        Outcome::definitive(201, &json!({"ticket_id": format!("T-{n}")})).unwrap()
    }

    /// How many tickets were created.
    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}
