//! Purging under load: first executions of new keys while the purge of expired records
//! alternates with idle windows, compared window by window.

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use idem_core::reconcile::{PurgePace, PurgeReport, purge_expired_paced};
use idem_core::{IdempotencyKey, Scope, SystemClock, Timestamp};
use tokio::task::JoinSet;

use super::{
    BenchOptions, BoxError, PurgePoint, Setup, Stats, first_execution, prefill, raw, resident_kib,
};

/// How long each purge window and each idle window of [`purge_under_load`] lasts.
const PURGE_WINDOW: Duration = Duration::from_millis(500);

/// The phase [`purge_under_load`]'s callers see: which window a claim ran in.
const IDLE: u8 = 0;
const PURGING: u8 = 1;
const DONE: u8 = 2;

/// Fills `expired` records that expired an hour ago, then measures first executions of new keys
/// while the purge alternates windows of [`PURGE_WINDOW`]: deleting (paced by
/// `purge_batch`/`purge_duty`, with a deadline at the window's end) and resting, until the
/// expired records are gone, then one more idle window. A first execution counts as idle or as
/// purging by the window it began and ended in (one that straddles two is dropped): the two sets
/// span the same stretch of time, so a shared machine's drift hits both alike.
pub(super) async fn purge_under_load(
    setup: &Arc<Setup>,
    scope: &str,
    expired: u64,
    opts: &BenchOptions,
) -> Result<PurgePoint, BoxError> {
    let before_fill = setup.raw.store_bytes().await?;
    let written = Timestamp::now() - raw::FILL_TTL - Duration::from_secs(3600);
    prefill(setup, scope, (0, expired), written).await?;
    setup.raw.settle().await?;
    let after_fill = setup.raw.store_bytes().await?;
    let pace = PurgePace::new(opts.purge_batch).duty(opts.purge_duty)?;
    let phase = Arc::new(AtomicU8::new(IDLE));
    let rss_before = resident_kib();
    let purge = {
        let (store, phase) = (setup.store.clone(), phase.clone());
        tokio::spawn(async move {
            let (mut total, mut purging, mut peak_rss) =
                (PurgeReport::default(), Duration::ZERO, 0);
            let result = async {
                loop {
                    tokio::time::sleep(PURGE_WINDOW).await;
                    phase.store(PURGING, Ordering::Release);
                    let t = Instant::now();
                    let window = pace.deadline(Timestamp::now() + PURGE_WINDOW);
                    let report = purge_expired_paced(
                        &*store,
                        &SystemClock,
                        window,
                        tokio::time::sleep,
                        |_| peak_rss = peak_rss.max(resident_kib().unwrap_or(0)),
                    )
                    .await;
                    phase.store(IDLE, Ordering::Release);
                    purging += t.elapsed();
                    let report = report?;
                    total.deleted += report.deleted;
                    total.batches += report.batches;
                    if !report.stopped_at_deadline {
                        tokio::time::sleep(PURGE_WINDOW).await;
                        return Ok::<_, idem_core::StoreError>(());
                    }
                }
            }
            .await;
            phase.store(DONE, Ordering::Release);
            result.map(|()| (total, purging, peak_rss))
        })
    };
    let measured = claims(setup, "claims-purge", opts.concurrency.max(1), phase).await;
    let (report, took, peak_rss) = purge.await??;
    let [idle, during] = measured?;
    let after_purge = setup.raw.store_bytes().await?;
    Ok(PurgePoint {
        expired,
        deleted: report.deleted,
        batches: report.batches,
        batch: opts.purge_batch,
        duty: opts.purge_duty,
        seconds: took.as_secs_f64(),
        idle_claim: Stats::of(&mut idle.claim.clone()),
        busy_claim: Stats::of(&mut during.claim.clone()),
        idle_first: Stats::of(&mut idle.first.clone()),
        busy_first: Stats::of(&mut during.first.clone()),
        store_bytes: [before_fill, after_fill, after_purge],
        client_rss_growth_kib: rss_before.map(|before| peak_rss.saturating_sub(before)),
    })
}

/// Latencies of first executions of new keys and of their claims.
#[derive(Default)]
struct Claims {
    first: Vec<Duration>,
    claim: Vec<Duration>,
}

/// `callers` callers making first executions (claim + complete) of new keys of their own until
/// `phase` says [`DONE`]: the ones in an idle window, and the ones in a purge window.
async fn claims(
    setup: &Arc<Setup>,
    tag: &str,
    callers: usize,
    phase: Arc<AtomicU8>,
) -> Result<[Claims; 2], BoxError> {
    let mut tasks = JoinSet::new();
    for c in 0..callers {
        let (setup, phase) = (setup.clone(), phase.clone());
        let scope = Scope::new(format!("idem-bench/{}/{tag}", setup.run))?;
        tasks.spawn(async move {
            let mut out = [Claims::default(), Claims::default()];
            for i in 0.. {
                let before = phase.load(Ordering::Acquire);
                if before == DONE {
                    break;
                }
                let key = IdempotencyKey::new(format!("c{c}-{i}"))?;
                let (claim, all) = first_execution(&setup, &scope, &key).await?;
                if phase.load(Ordering::Acquire) == before {
                    let into = &mut out[usize::from(before == PURGING)];
                    into.claim.push(claim);
                    into.first.push(all);
                }
            }
            Ok::<_, BoxError>(out)
        });
    }
    let mut all = [Claims::default(), Claims::default()];
    while let Some(done) = tasks.join_next().await {
        for (all, done) in all.iter_mut().zip(done??) {
            all.first.extend(done.first);
            all.claim.extend(done.claim);
        }
    }
    Ok(all)
}
