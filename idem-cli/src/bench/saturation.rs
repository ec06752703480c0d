//! `idem bench --saturation 1,8,32,128`: operations per second at each number of callers, idem
//! against the bare engine statements, each in a phase of its own (so each has a throughput of
//! its own, and the engine's CPU in that phase is that kind's), with p50, p99 and the CPU each
//! operation cost.

use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use idem_core::machine::ClaimAnswer;
use idem_core::{Clock, IdempotencyKey, RecordId, Scope, SystemClock};
use serde::{Deserialize, Serialize};
use tokio::task::JoinSet;

use super::cpu::Cpu;
use super::{BoxError, Setup, Stats, first_execution, open_bench};
use crate::exit::Failure;
use idemkit::StoreUrl;

/// What `--saturation` measures.
#[derive(Debug, Clone)]
pub struct SaturationOptions {
    /// The numbers of concurrent callers, one level each, in this order.
    pub callers: Vec<usize>,
    /// Operations of each kind per level, shared among its callers.
    pub operations: usize,
    /// idem's store behind a `ReplayCache` (its replays measured after one unmeasured replay).
    pub replay_cache: bool,
}

/// What `idem bench --saturation` measured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SaturationReport {
    /// `sqlite`, `postgres` or `redis`.
    pub engine: String,
    /// idem's replays came from a `ReplayCache`.
    pub replay_cache: bool,
    /// Operations of each kind per level.
    pub operations: usize,
    /// Whose CPU `cpu_us_per_op` is, or `null` when it cannot be read.
    pub cpu: Option<String>,
    /// One per number of callers.
    pub levels: Vec<Level>,
}

/// One number of callers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Level {
    /// Concurrent callers.
    pub callers: usize,
    /// Claim + complete of a new key, against insert-if-absent + update.
    pub first_execution: Pair,
    /// Claim of a completed key, against the bare read.
    pub replay: Pair,
}

/// idem and the bare statements, one phase each.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Pair {
    /// idem's phase.
    pub idem: Phase,
    /// The bare statements' phase.
    pub raw: Phase,
}

/// One phase: `operations` operations of one kind by the level's callers.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Phase {
    /// Operations completed per second of the phase's wall time.
    pub ops_per_s: f64,
    /// Median latency, µs.
    pub p50_us: f64,
    /// 99th percentile latency, µs.
    pub p99_us: f64,
    /// CPU time of the engine (see [`SaturationReport::cpu`]) per operation, µs.
    pub cpu_us_per_op: Option<f64>,
}

/// The four kinds of phase.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    IdemFirst,
    RawFirst,
    IdemReplay,
    RawReplay,
}

/// Measures each level in turn on `url`'s store.
pub async fn saturation(
    url: &StoreUrl,
    opts: &SaturationOptions,
) -> Result<SaturationReport, Failure> {
    let (store, raw, run, reached) =
        open_bench(url, opts.replay_cache.then_some(opts.operations)).await?;
    let cpu = Cpu::of(&raw, url);
    let setup = Arc::new(Setup::new(store, raw, run, reached).map_err(Failure::store)?);
    let mut report = SaturationReport {
        engine: setup.raw.engine().to_owned(),
        replay_cache: opts.replay_cache,
        operations: opts.operations,
        cpu: cpu.as_ref().map(|c| c.whose().to_owned()),
        levels: Vec::new(),
    };
    // The run's scratch rows are removed whether or not every level was measured.
    let measured = async {
        for (i, &callers) in opts.callers.iter().enumerate() {
            let callers = callers.max(1);
            let scope =
                Scope::new(format!("idem-bench/{}/s{i}", setup.run)).map_err(Failure::store)?;
            // Keys of each caller: a share of `operations` (the first callers take one more).
            let keys: Vec<Vec<IdempotencyKey>> = (0..callers)
                .map(|c| {
                    (c..opts.operations)
                        .step_by(callers)
                        .map(|k| IdempotencyKey::new(format!("k{k}")))
                        .collect::<Result<_, _>>()
                })
                .collect::<Result<_, _>>()
                .map_err(Failure::store)?;
            let keys = Arc::new(keys);
            // Which of the two goes first alternates by level, so neither always meets the state
            // the other left (a WAL to checkpoint, dirty pages).
            let order = if i % 2 == 0 {
                [
                    Kind::RawFirst,
                    Kind::IdemFirst,
                    Kind::IdemReplay,
                    Kind::RawReplay,
                ]
            } else {
                [
                    Kind::IdemFirst,
                    Kind::RawFirst,
                    Kind::RawReplay,
                    Kind::IdemReplay,
                ]
            };
            let mut phases = [None; 4];
            for kind in order {
                if kind == Kind::IdemReplay && opts.replay_cache {
                    // The replay that reaches the store and keeps the record, unmeasured.
                    phase(&setup, &scope, &keys, Kind::IdemReplay, None)
                        .await
                        .map_err(Failure::store)?;
                }
                let measured = phase(&setup, &scope, &keys, kind, cpu.as_ref())
                    .await
                    .map_err(Failure::store)?;
                phases[kind as usize] = Some(measured);
            }
            let [
                Some(idem_first),
                Some(raw_first),
                Some(idem_replay),
                Some(raw_replay),
            ] = phases
            else {
                unreachable!("every kind is measured once per level");
            };
            report.levels.push(Level {
                callers,
                first_execution: Pair {
                    idem: idem_first,
                    raw: raw_first,
                },
                replay: Pair {
                    idem: idem_replay,
                    raw: raw_replay,
                },
            });
        }
        Ok::<_, Failure>(())
    }
    .await;
    setup
        .raw
        .clean(&setup.run, &[])
        .await
        .map_err(Failure::store)?;
    measured.map(|()| report)
}

/// Runs one phase: every caller does its keys' operations of `kind`, and the phase's wall time,
/// latencies and (with `cpu`) the engine's CPU are taken.
async fn phase(
    setup: &Arc<Setup>,
    scope: &Scope,
    keys: &Arc<Vec<Vec<IdempotencyKey>>>,
    kind: Kind,
    cpu: Option<&Cpu>,
) -> Result<Phase, BoxError> {
    let cpu_before = match cpu {
        Some(cpu) => cpu.read().await?,
        None => None,
    };
    let started = Instant::now();
    let mut callers = JoinSet::new();
    for c in 0..keys.len() {
        let (setup, scope, keys) = (setup.clone(), scope.clone(), keys.clone());
        callers.spawn(async move {
            let mut samples = Vec::with_capacity(keys[c].len());
            for key in &keys[c] {
                let t = Instant::now();
                one(&setup, &scope, key, kind).await?;
                samples.push(t.elapsed());
            }
            Ok::<_, BoxError>(samples)
        });
    }
    let mut samples = Vec::new();
    while let Some(done) = callers.join_next().await {
        samples.extend(done??);
    }
    let wall = started.elapsed();
    let cpu_after = match cpu {
        Some(cpu) => cpu.read().await?,
        None => None,
    };
    let n = samples.len();
    let stats = Stats::of(&mut samples);
    Ok(Phase {
        ops_per_s: n as f64 / wall.as_secs_f64(),
        p50_us: stats.p50,
        p99_us: stats.p99,
        cpu_us_per_op: cpu_before
            .zip(cpu_after)
            .map(|(b, a)| a.saturating_sub(b).as_secs_f64() * 1e6 / n.max(1) as f64),
    })
}

/// One operation of `kind` on `key`.
async fn one(
    setup: &Setup,
    scope: &Scope,
    key: &IdempotencyKey,
    kind: Kind,
) -> Result<(), BoxError> {
    let raw_key = || format!("idem-bench:{}:{}:{key}", setup.run, scope.as_str());
    match kind {
        Kind::IdemFirst => {
            first_execution(setup, scope, key).await?;
        }
        Kind::RawFirst => setup.raw.write(&raw_key()).await?,
        Kind::IdemReplay => {
            let id = RecordId::new(scope.clone(), key.clone());
            let answer = setup
                .store
                .claim(&id, &setup.fp, &setup.policy, SystemClock.now())
                .await?;
            if !matches!(answer, ClaimAnswer::Replay(_)) {
                return Err(format!("expected a replay, got {answer:?}").into());
            }
        }
        Kind::RawReplay => setup.raw.read(&raw_key()).await?,
    }
    Ok(())
}

impl SaturationReport {
    /// The report as JSON.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).expect("a report of numbers and strings serialises")
    }

    /// A report written by [`SaturationReport::to_json`].
    pub fn from_json(v: &serde_json::Value) -> Result<SaturationReport, String> {
        serde_json::from_value(v.clone()).map_err(|e| format!("not a --saturation report: {e}"))
    }
}

impl fmt::Display for SaturationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} operations of each kind per level, each kind in a phase of its own; ops/s over \
             the phase's wall time; ratio = idem ops/s ÷ raw ops/s{}",
            self.operations,
            if self.replay_cache {
                "; idem's replays from its replay cache"
            } else {
                ""
            }
        )?;
        match &self.cpu {
            Some(whose) => writeln!(f, "CPU µs/op: {whose}")?,
            None => writeln!(f, "CPU µs/op: not readable for this engine from here")?,
        }
        writeln!(
            f,
            "callers kind             idem ops/s  raw ops/s   ratio  idem p50   raw p50  idem p99   raw p99  idem CPU   raw CPU"
        )?;
        let cpu = |c: Option<f64>| c.map_or_else(|| "-".to_owned(), |c| format!("{c:.1}"));
        for level in &self.levels {
            for (kind, pair) in [
                ("first execution", level.first_execution),
                ("replay", level.replay),
            ] {
                writeln!(
                    f,
                    "{:>7} {kind:<16} {:>10.0} {:>10.0} {:>6.2}× {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9} {:>9}",
                    level.callers,
                    pair.idem.ops_per_s,
                    pair.raw.ops_per_s,
                    pair.idem.ops_per_s / pair.raw.ops_per_s,
                    pair.idem.p50_us,
                    pair.raw.p50_us,
                    pair.idem.p99_us,
                    pair.raw.p99_us,
                    cpu(pair.idem.cpu_us_per_op),
                    cpu(pair.raw.cpu_us_per_op),
                )?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every level measures every kind once: the counts of operations are the sink (a first
    /// execution that did not claim, or a replay that was not one, fails the run), and the
    /// report reads back.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sqlite_saturation_measures_each_level_and_reads_back() {
        let (dir, url) = crate::bench::scratch_sqlite().await;
        let opts = SaturationOptions {
            callers: vec![1, 3],
            operations: 10,
            replay_cache: false,
        };
        let report = saturation(&url, &opts).await.unwrap();
        assert_eq!(report.engine, "sqlite");
        assert_eq!(
            report.levels.iter().map(|l| l.callers).collect::<Vec<_>>(),
            [1, 3]
        );
        for level in &report.levels {
            for phase in [
                level.first_execution.idem,
                level.first_execution.raw,
                level.replay.idem,
                level.replay.raw,
            ] {
                assert!(phase.ops_per_s > 0.0 && phase.p99_us >= phase.p50_us);
                assert!(
                    phase.cpu_us_per_op.is_some(),
                    "this process's CPU is readable"
                );
            }
        }
        // Ten records per level, each completed once: the store holds exactly what was run.
        let store = idemkit::open(&url).await.unwrap();
        let listed = store
            .list(
                &idem_core::store::ListFilter::default(),
                SystemClock.now(),
                100,
            )
            .await
            .unwrap();
        assert_eq!(listed.len(), 20);
        assert!(
            listed
                .iter()
                .all(|r| r.state == idem_core::RecordState::Completed)
        );
        let json = report.to_json();
        assert_eq!(SaturationReport::from_json(&json).unwrap(), report);
        assert!(report.to_string().contains("first execution"));
        let svg = dir.join("saturation.svg");
        crate::bench::plot_saturation(&svg, &[report]).unwrap();
        let drawn = std::fs::read_to_string(&svg).unwrap();
        assert!(drawn.contains("first executions per second") && drawn.contains("sqlite idem"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
