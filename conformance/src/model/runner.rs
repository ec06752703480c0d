//! The run: proptest drives sequences, each on a namespace kept from the last passing one (or a
//! fresh one after a failure), within a time limit, and shrinks a failing one.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use idem_core::{KeyStore, Timestamp};
use proptest::test_runner::{Config, TestCaseError, TestError, TestRunner};

use super::ops::{Op, render, sequence_strategy};
use super::world::World;
use super::{
    EPOCH, EXTENDS, ModelConfig, ModelFailure, ModelStats, PROGRESS_EVERY, SEQUENCE_TIMEOUT, TTLS,
};
use crate::harness::StoreFactory;

/// [`run_model`](crate::run_model) with `config`: returns the minimal failing sequence instead of
/// panicking, and reads nothing from the environment.
pub fn check_model(
    fresh_namespace: impl StoreFactory,
    config: &ModelConfig,
) -> Result<ModelStats, ModelFailure> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let runner = Runner {
        factory: Arc::new(fresh_namespace),
        store: std::sync::Mutex::new(None),
        next_start: AtomicU64::new(EPOCH.as_millis() + rand::random::<u32>() as u64),
        sequence: AtomicU64::new(0),
        steps: AtomicU64::new(0),
        run: rand::random(),
        started: std::time::Instant::now(),
        runtime,
    };
    let mut proptest = TestRunner::new(Config {
        cases: config.cases,
        failure_persistence: None,
        max_shrink_iters: 100_000,
        ..Config::default()
    });
    let result = proptest.run(&sequence_strategy(config.max_steps), |ops| {
        runner.run_sequence(&ops).map_err(TestCaseError::fail)
    });
    match result {
        Ok(()) => Ok(ModelStats {
            cases: config.cases,
            steps: runner.steps.load(Ordering::Relaxed),
        }),
        Err(TestError::Fail(reason, ops)) => Err(ModelFailure {
            sequence: render(&ops),
            message: reason.message().to_owned(),
        }),
        Err(TestError::Abort(reason)) => Err(ModelFailure {
            sequence: String::new(),
            message: format!("aborted: {}", reason.message()),
        }),
    }
}

/// What the run keeps between sequences.
struct Runner {
    factory: Arc<dyn StoreFactory>,
    /// The namespace in use; `None` after a failed sequence (it may be dirty).
    store: std::sync::Mutex<Option<Arc<dyn KeyStore>>>,
    next_start: AtomicU64,
    sequence: AtomicU64,
    steps: AtomicU64,
    run: u64,
    started: std::time::Instant,
    runtime: tokio::runtime::Runtime,
}

impl Runner {
    fn run_sequence(&self, ops: &[Op]) -> Result<(), String> {
        let n = self.sequence.fetch_add(1, Ordering::Relaxed);
        if n > 0 && n.is_multiple_of(PROGRESS_EVERY) {
            eprintln!(
                "idem-conformance model: {n} sequences run in {:.1?}",
                self.started.elapsed()
            );
        }
        let start = Timestamp::from_millis(self.next_start.load(Ordering::Relaxed));
        let existing = self.store.lock().unwrap_or_else(|e| e.into_inner()).take();
        let factory = self.factory.clone();
        let run = self.run;
        let ops_owned = ops.to_vec();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            self.runtime.block_on(async move {
                let store = match existing {
                    Some(store) => store,
                    None => factory.make().await,
                };
                let world = World::new(store.clone(), run, n, start);
                let result = tokio::time::timeout(SEQUENCE_TIMEOUT, world.play(ops_owned)).await;
                (store, result)
            })
        }));
        match outcome {
            Ok((store, Ok(Ok((end, steps))))) => {
                self.steps.fetch_add(steps, Ordering::Relaxed);
                // Past the end by more than any ttl, so nothing of this sequence is near.
                let next = end + TTLS[TTLS.len() - 1] + EXTENDS[EXTENDS.len() - 1];
                self.next_start.store(next.as_millis(), Ordering::Relaxed);
                *self.store.lock().unwrap_or_else(|e| e.into_inner()) = Some(store);
                Ok(())
            }
            failed => {
                // The namespace may be dirty: the next sequence gets a fresh one, and starts a
                // day later.
                self.next_start.store(
                    (start + Duration::from_secs(24 * 3600)).as_millis(),
                    Ordering::Relaxed,
                );
                Err(match failed {
                    Ok((_, Ok(Err(why)))) => why,
                    Ok((_, Err(_))) => {
                        format!("the sequence did not finish within {SEQUENCE_TIMEOUT:?}")
                    }
                    Err(payload) => format!(
                        "the store panicked: {}",
                        crate::report::panic_message(payload.as_ref())
                    ),
                    Ok((_, Ok(Ok(_)))) => unreachable!(),
                })
            }
        }
    }
}
