//! `idem bench`: idem's first execution and replay against the bare engine operations on the
//! same store, at p50, p99 and mean, for one or many callers, at growing numbers of live
//! records, as a table, JSON or an SVG plot.

pub(crate) mod command;
mod cpu;
mod measure;
mod plot;
mod purge;
mod raw;
mod report;
mod saturation;

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_conformance::kit::{FaultStore, Op};
use idem_core::machine::ClaimAnswer;
use idem_core::store::ReplayCache;
use idem_core::{
    Clock, Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, SystemClock,
    Timestamp,
};
use serde_json::json;
use tokio::task::JoinSet;

pub use plot::{plot, plot_saturation};
pub use report::{BenchReport, Comparison, Point, PurgePoint, Stats};
pub use saturation::{SaturationOptions, SaturationReport, saturation};

use crate::exit::Failure;
use crate::store::open;
use idemkit::StoreUrl;
use measure::measure;
use purge::purge_under_load;
use raw::Raw;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How much to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Operations of each kind in all, shared among the callers (ignored with `duration`).
    pub operations: usize,
    /// Concurrent callers, each with keys of its own, on the same pool.
    pub concurrency: usize,
    /// Live records to prefill before each measurement, ascending (`[0]`: none).
    pub records: Vec<u64>,
    /// Measure first executions for this long (then replay as many), instead of `operations`.
    pub duration: Option<Duration>,
    /// After the measurements: fill this many expired records, then measure claims while the
    /// purge alternates windows of deleting them (in batches of [`BenchOptions::purge_batch`])
    /// and resting: the claims of the idle windows against those of the purge windows.
    pub purge: Option<u64>,
    /// Records per `purge_expired` call in the purge measurement.
    pub purge_batch: usize,
    /// The purge's pace: the share of the time it may spend in `purge_expired` (1: flat out).
    pub purge_duty: f64,
    /// idem's store wrapped in a [`ReplayCache`] holding every key measured: replays are
    /// measured after one unmeasured replay of each key has filled it.
    pub replay_cache: bool,
}

/// `idem bench --store URL`: for each `records` value in turn, prefills the store up to that
/// many live records, then measures idem against the bare engine operations; then, with
/// `purge`, measures claims while expired records are purged.
pub async fn bench(url: &StoreUrl, opts: &BenchOptions) -> Result<BenchReport, Failure> {
    let (store, raw, run, reached) =
        open_bench(url, opts.replay_cache.then_some(opts.operations)).await?;
    self::run(store, raw, run, reached, opts)
        .await
        .map_err(Failure::store)
}

/// The store to measure, the bare engine beside it and a fresh run id. With `cache_keys`, the
/// store is wrapped in a [`ReplayCache`] with room for that many measured keys (and the purge's
/// claims), so none is evicted, over a [`FaultStore`] that counts the calls the cache lets
/// through (no fault is programmed).
async fn open_bench(
    url: &StoreUrl,
    cache_keys: Option<usize>,
) -> Result<(Arc<dyn KeyStore>, Raw, String, Option<Reached>), Failure> {
    let opened = open(url).await?;
    let raw = Raw::open(&opened).await.map_err(Failure::store)?;
    let run = format!("{:016x}", rand::random::<u64>());
    let mut store = raw.bench_store(&opened, &run).map_err(Failure::store)?;
    let mut reached = None;
    if let Some(keys) = cache_keys {
        let entries = keys
            .saturating_mul(4)
            .max(ReplayCache::<Arc<dyn KeyStore>>::DEFAULT_MAX_ENTRIES);
        // Between the cache and the store, counting what the cache lets through.
        let counted = FaultStore::new(store);
        reached = Some(counted.clone());
        store = Arc::new(ReplayCache::new(counted).max_entries(entries));
    }
    Ok((store, raw, run, reached))
}

/// The store under a [`ReplayCache`], counting the calls that reach it.
type Reached = FaultStore<Arc<dyn KeyStore>>;

/// The bench's shared inputs.
struct Setup {
    store: Arc<dyn KeyStore>,
    raw: Raw,
    run: String,
    fp: Fingerprint,
    policy: Policy,
    outcome: Outcome,
    /// `store` is wrapped in a [`ReplayCache`]: fill it before measuring replays.
    replay_cache: bool,
    /// With the cache: the store under it, counting the claims that reach it.
    reached: Option<Reached>,
}

impl Setup {
    /// The bench's call: one fingerprint, the default policy, a small JSON answer.
    fn new(
        store: Arc<dyn KeyStore>,
        raw: Raw,
        run: String,
        reached: Option<Reached>,
    ) -> Result<Setup, BoxError> {
        Ok(Setup {
            store,
            raw,
            fp: Fingerprint::of("create_ticket", &json!({"title": "bench", "priority": 2}))?,
            policy: Policy::default(),
            outcome: Outcome::definitive(201, &json!({"ticket_id": "T-1", "status": "open"}))?,
            run,
            replay_cache: reached.is_some(),
            reached,
        })
    }

    /// With the cache: how many claims have reached the store under it so far.
    fn claims_reached(&self) -> Option<usize> {
        self.reached.as_ref().map(|r| r.calls(Op::Claim))
    }
}

async fn run(
    store: Arc<dyn KeyStore>,
    raw: Raw,
    run: String,
    reached: Option<Reached>,
    opts: &BenchOptions,
) -> Result<BenchReport, BoxError> {
    let args = json!({"title": "bench", "priority": 2});
    let fingerprint_us = {
        let t = Instant::now();
        for _ in 0..1000 {
            std::hint::black_box(Fingerprint::of("create_ticket", &args)?);
        }
        t.elapsed().as_secs_f64() * 1e6 / 1000.0
    };
    let setup = Arc::new(Setup::new(store, raw, run, reached)?);
    let fill_scope = format!("idem-bench/{}/fill", setup.run);
    let purge_scope = format!("idem-bench/{}/expired", setup.run);
    let mut report = BenchReport {
        engine: setup.raw.engine().to_owned(),
        concurrency: opts.concurrency.max(1),
        replay_cache: opts.replay_cache,
        fingerprint_us,
        points: Vec::new(),
        purge: None,
    };
    let result = async {
        let base_bytes = setup.raw.store_bytes().await?;
        let mut filled = 0;
        let mut records = opts.records.clone();
        records.sort_unstable();
        records.dedup();
        for (i, &target) in records.iter().enumerate() {
            if target > filled {
                prefill(&setup, &fill_scope, (filled, target), Timestamp::now()).await?;
                setup.raw.settle().await?;
                filled = target;
            }
            let store_bytes = setup.raw.store_bytes().await?;
            let mut point = measure(&setup, &format!("p{i}"), opts).await?;
            point.records = filled;
            point.store_bytes = store_bytes;
            point.bytes_per_record =
                (filled > 0).then(|| store_bytes.saturating_sub(base_bytes) as f64 / filled as f64);
            report.points.push(point);
        }
        if let Some(expired) = opts.purge {
            report.purge = Some(purge_under_load(&setup, &purge_scope, expired, opts).await?);
        }
        Ok::<_, BoxError>(())
    }
    .await;
    setup
        .raw
        .clean(&setup.run, &[fill_scope.as_str(), purge_scope.as_str()])
        .await?;
    result.map(|()| report)
}

/// Brings the records prefilled in `scope` from `from` to `to`, written at `at` (expired when
/// `at` is over [`raw::FILL_TTL`] ago): in SQL statements of a million rows each on SQLite and
/// PostgreSQL; through the store (claim + complete, many at a time on the multiplexed
/// connection) on Redis, whose record format belongs to its scripts. Large fills report their
/// progress on standard error.
async fn prefill(
    setup: &Arc<Setup>,
    scope: &str,
    (from, to): (u64, u64),
    at: Timestamp,
) -> Result<(), BoxError> {
    const CHUNK: u64 = 1_000_000;
    let started = Instant::now();
    let progress = |done: u64| {
        if to - from >= CHUNK {
            eprintln!(
                "idem bench: {done} of {to} records in {scope} ({:.0} s)",
                started.elapsed().as_secs_f64()
            );
        }
    };
    let mut start = from;
    while start < to {
        let end = (start + CHUNK).min(to);
        if !setup
            .raw
            .prefill(&setup.run, scope, &setup.fp, (start, end), at)
            .await?
        {
            break;
        }
        progress(end);
        start = end;
    }
    if start >= to {
        return Ok(());
    }
    const WORKERS: u64 = 256;
    let policy = Policy::builder().ttl(raw::FILL_TTL).build()?;
    let scope = Scope::new(scope)?;
    let done = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = JoinSet::new();
    for w in 0..WORKERS {
        let (setup, policy, scope, done) = (setup.clone(), policy, scope.clone(), done.clone());
        workers.spawn(async move {
            let mut i = from + w;
            while i < to {
                let key = IdempotencyKey::new(format!("f-{i}"))?;
                let id = RecordId::new(scope.clone(), key.clone());
                if let ClaimAnswer::Claimed { token, .. } =
                    setup.store.claim(&id, &setup.fp, &policy, at).await?
                {
                    setup
                        .store
                        .complete(&id, token, &setup.outcome, &policy, at)
                        .await?;
                }
                i += WORKERS;
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            Ok::<_, BoxError>(())
        });
    }
    let mut reported = from;
    loop {
        tokio::select! {
            joined = workers.join_next() => match joined {
                Some(result) => result??,
                None => break,
            },
            () = tokio::time::sleep(Duration::from_secs(10)) => {
                let now = from + done.load(std::sync::atomic::Ordering::Relaxed);
                if now >= reported + CHUNK {
                    progress(now);
                    reported = now;
                }
            }
        }
    }
    Ok(())
}

/// One first execution of a new key through the store: (the claim's latency, the whole).
async fn first_execution(
    setup: &Setup,
    scope: &Scope,
    key: &IdempotencyKey,
) -> Result<(Duration, Duration), BoxError> {
    let t = Instant::now();
    let id = RecordId::new(scope.clone(), key.clone());
    let ClaimAnswer::Claimed { token, .. } = setup
        .store
        .claim(&id, &setup.fp, &setup.policy, SystemClock.now())
        .await?
    else {
        return Err("a fresh bench key was not claimed".into());
    };
    let claimed = t.elapsed();
    setup
        .store
        .complete(&id, token, &setup.outcome, &setup.policy, SystemClock.now())
        .await?;
    Ok((claimed, t.elapsed()))
}

/// This process's resident set, KiB (Linux; `None` elsewhere).
fn resident_kib() -> Option<u64> {
    std::fs::read_to_string("/proc/self/status")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// A migrated SQLite file in a directory of its own, for tests: the directory and the file's URL.
#[cfg(test)]
async fn scratch_sqlite() -> (std::path::PathBuf, StoreUrl) {
    let dir = std::env::temp_dir().join(format!("idem-bench-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).unwrap();
    let url: StoreUrl = format!("sqlite://{}", dir.join("b.db").display())
        .parse()
        .unwrap();
    idemkit::OpenOptions::new()
        .migrate(true)
        .open(&url)
        .await
        .unwrap();
    (dir, url)
}

#[cfg(test)]
mod tests;
