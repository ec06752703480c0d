//! One measurement: callers running idem's first execution and replay beside the bare engine
//! operations, for a fixed time, and their samples summed up.

use std::sync::Arc;
use std::time::{Duration, Instant};

use idem_core::machine::ClaimAnswer;
use idem_core::{Clock, IdempotencyKey, RecordId, Scope, SystemClock};
use tokio::task::JoinSet;

use super::{BenchOptions, BoxError, Comparison, Point, Setup, Stats, first_execution};

/// Samples of one caller.
#[derive(Default)]
struct Samples {
    idem_first: Vec<Duration>,
    claim: Vec<Duration>,
    complete: Vec<Duration>,
    raw_first: Vec<Duration>,
    floor_first: Vec<Duration>,
    idem_replay: Vec<Duration>,
    raw_replay: Vec<Duration>,
    read_idem_row: Vec<Duration>,
}

impl Samples {
    fn extend(&mut self, other: Samples) {
        self.idem_first.extend(other.idem_first);
        self.claim.extend(other.claim);
        self.complete.extend(other.complete);
        self.raw_first.extend(other.raw_first);
        self.floor_first.extend(other.floor_first);
        self.idem_replay.extend(other.idem_replay);
        self.raw_replay.extend(other.raw_replay);
        self.read_idem_row.extend(other.read_idem_row);
    }
}

/// Runs `opts.concurrency` callers at once, each interleaving idem and raw operations on keys
/// of its own, and gathers their latencies.
pub(super) async fn measure(
    setup: &Arc<Setup>,
    tag: &str,
    opts: &BenchOptions,
) -> Result<Point, BoxError> {
    let callers = opts.concurrency.max(1);
    let per_caller = opts.operations.div_ceil(callers).max(1);
    let deadline = opts.duration.map(|d| Instant::now() + d);
    let mut tasks = JoinSet::new();
    for c in 0..callers {
        let setup = setup.clone();
        let scope = Scope::new(format!("idem-bench/{}/{tag}", setup.run))?;
        let prefix = format!("c{c}-");
        // Operations of this caller: a share of `operations` (the first callers take one more).
        let share = if deadline.is_some() {
            usize::MAX
        } else {
            per_caller.min(opts.operations.saturating_sub(c * per_caller))
        };
        tasks.spawn(async move { caller(&setup, &scope, &prefix, share, deadline).await });
    }
    let reached = setup.claims_reached();
    let mut all = Samples::default();
    while let Some(done) = tasks.join_next().await {
        all.extend(done??);
    }
    // With the cache, each key's claims that reach the store are its first execution's and
    // the unmeasured replay that fills the cache; any more is a measured replay it missed.
    // Fewer is a miscount: no figure rather than a wrong one.
    let replays_from_store = reached
        .zip(setup.claims_reached())
        .and_then(|(before, after)| (after - before).checked_sub(2 * all.idem_first.len()))
        .map(|missed| missed as u64);
    let optional = |v: &mut Vec<Duration>| (!v.is_empty()).then(|| Stats::of(v));
    Ok(Point {
        first: Comparison {
            idem: Stats::of(&mut all.idem_first),
            raw: Stats::of(&mut all.raw_first),
        },
        replay: Comparison {
            idem: Stats::of(&mut all.idem_replay),
            raw: Stats::of(&mut all.raw_replay),
        },
        first_floor: optional(&mut all.floor_first),
        claim: Stats::of(&mut all.claim),
        complete: Stats::of(&mut all.complete),
        read_idem_row: optional(&mut all.read_idem_row),
        replays_from_store,
        ..Point::default()
    })
}

/// One caller: first executions of `count` new keys (or until `deadline`), then a replay of
/// each; idem and raw alternate which goes first, so neither always follows the other.
async fn caller(
    setup: &Setup,
    scope: &Scope,
    prefix: &str,
    count: usize,
    deadline: Option<Instant>,
) -> Result<Samples, BoxError> {
    let (store, raw) = (&setup.store, &setup.raw);
    let mut s = Samples::default();
    let mut keys = Vec::new();
    let raw_key =
        |key: &IdempotencyKey| format!("idem-bench:{}:{}:{key}", setup.run, scope.as_str());
    let mut i = 0;
    while i < count && deadline.is_none_or(|d| Instant::now() < d) {
        let key = IdempotencyKey::new(format!("{prefix}{i}"))?;
        let rk = raw_key(&key);
        for idem_turn in [i % 2 == 0, i % 2 != 0] {
            let t = Instant::now();
            if idem_turn {
                let (claimed, all) = first_execution(setup, scope, &key).await?;
                s.idem_first.push(all);
                s.claim.push(claimed);
                s.complete.push(all - claimed);
            } else {
                raw.write(&rk).await?;
                s.raw_first.push(t.elapsed());
                let t = Instant::now();
                if raw.floor_first(&rk).await?.is_some() {
                    s.floor_first.push(t.elapsed());
                }
            }
        }
        keys.push((key, rk));
        i += 1;
    }
    if setup.replay_cache {
        // The replay that reaches the store and keeps the record; the measured ones follow.
        for (key, _) in &keys {
            let id = RecordId::new(scope.clone(), key.clone());
            store
                .claim(&id, &setup.fp, &setup.policy, SystemClock.now())
                .await?;
        }
    }
    for (i, (key, rk)) in keys.iter().enumerate() {
        for idem_turn in [i % 2 == 0, i % 2 != 0] {
            let t = Instant::now();
            if idem_turn {
                let answer = store
                    .claim(
                        &RecordId::new(scope.clone(), key.clone()),
                        &setup.fp,
                        &setup.policy,
                        SystemClock.now(),
                    )
                    .await?;
                s.idem_replay.push(t.elapsed());
                if !matches!(answer, ClaimAnswer::Replay(_)) {
                    return Err(format!("expected a replay, got {answer:?}").into());
                }
            } else {
                raw.read(rk).await?;
                s.raw_replay.push(t.elapsed());
                let t = Instant::now();
                if raw
                    .read_idem_row(scope.as_str(), key.as_str())
                    .await?
                    .is_some()
                {
                    s.read_idem_row.push(t.elapsed());
                }
            }
        }
    }
    Ok(s)
}
