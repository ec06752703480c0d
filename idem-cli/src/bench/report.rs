//! What `idem bench` measured, as a table and as JSON.

use std::fmt;
use std::time::Duration;

use serde_json::{Value, json};

/// Latencies of one operation, in microseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Stats {
    /// Operations timed.
    pub n: usize,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Mean.
    pub mean: f64,
}

impl Stats {
    /// The statistics of `samples` (sorted here).
    pub fn of(samples: &mut [Duration]) -> Stats {
        if samples.is_empty() {
            return Stats::default();
        }
        samples.sort_unstable();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        // Nearest rank: the smallest sample with at least q of them at or below it.
        let rank = |q: f64| {
            us(samples[((q * samples.len() as f64).ceil() as usize).clamp(1, samples.len()) - 1])
        };
        Stats {
            n: samples.len(),
            p50: rank(0.50),
            p99: rank(0.99),
            mean: samples.iter().map(|d| us(*d)).sum::<f64>() / samples.len() as f64,
        }
    }

    fn to_json(self) -> Value {
        json!({"n": self.n, "p50_us": self.p50, "p99_us": self.p99, "mean_us": self.mean})
    }

    fn from_json(v: &Value) -> Stats {
        let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
        Stats {
            n: v["n"].as_u64().unwrap_or(0) as usize,
            p50: f("p50_us"),
            p99: f("p99_us"),
            mean: f("mean_us"),
        }
    }
}

/// idem's operation next to its bare engine counterpart.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Comparison {
    /// idem.
    pub idem: Stats,
    /// The bare engine operations.
    pub raw: Stats,
}

impl Comparison {
    fn to_json(self) -> Value {
        json!({
            "idem": self.idem.to_json(),
            "raw": self.raw.to_json(),
            "ratio": self.idem.p50 / self.raw.p50,
            "ratio_p99": self.idem.p99 / self.raw.p99,
            "ratio_mean": self.idem.mean / self.raw.mean,
        })
    }

    fn from_json(v: &Value) -> Comparison {
        Comparison {
            idem: Stats::from_json(&v["idem"]),
            raw: Stats::from_json(&v["raw"]),
        }
    }
}

/// One measurement at one number of live records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Point {
    /// Records prefilled before measuring (live: unexpired, completed).
    pub records: u64,
    /// First execution: idem claim + complete of a new key, against the bare insert-if-absent +
    /// update.
    pub first: Comparison,
    /// Replay: idem claim of a completed key, against the bare read.
    pub replay: Comparison,
    /// Redis: the first execution against two trivial `EVALSHA`.
    pub first_floor: Option<Stats>,
    /// Where a first execution's time goes: the claim alone.
    pub claim: Stats,
    /// The complete alone.
    pub complete: Stats,
    /// SQL: the bare `SELECT *` of an idem record by primary key (a replay's statement).
    pub read_idem_row: Option<Stats>,
    /// Bytes the store occupies (see `Raw::store_bytes`).
    pub store_bytes: u64,
    /// Bytes per prefilled record: growth of `store_bytes` over the records added.
    pub bytes_per_record: Option<f64>,
    /// With `--replay-cache`: idem's measured replays that reached the store (the cache did not
    /// answer them).
    pub replays_from_store: Option<u64>,
}

/// Claims while expired records are purged (`idem bench --purge N`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PurgePoint {
    /// Expired records filled before purging.
    pub expired: u64,
    /// Records `purge_expired` deleted (all expired records of the store, the filled ones
    /// included).
    pub deleted: usize,
    /// `purge_expired` calls made.
    pub batches: usize,
    /// Records per call asked for.
    pub batch: usize,
    /// The purge's duty cycle: the share of the time it spent in `purge_expired` (1: flat out).
    pub duty: f64,
    /// How long the purge's windows took in all, seconds (its rests between batches included,
    /// the idle windows not).
    pub seconds: f64,
    /// A claim of a new key in an idle window (the purge resting between its windows).
    pub idle_claim: Stats,
    /// A claim of a new key in a purge window.
    pub busy_claim: Stats,
    /// A whole first execution (claim + complete), in an idle window.
    pub idle_first: Stats,
    /// A whole first execution, in a purge window.
    pub busy_first: Stats,
    /// `store_bytes` before the fill, after it, and after the purge.
    pub store_bytes: [u64; 3],
    /// How far this process's resident set grew while purging, KiB (Linux).
    pub client_rss_growth_kib: Option<u64>,
}

impl PurgePoint {
    fn to_json(&self) -> Value {
        json!({
            "expired": self.expired,
            "deleted": self.deleted,
            "batches": self.batches,
            "batch": self.batch,
            "duty": self.duty,
            "seconds": self.seconds,
            "records_per_second": self.deleted as f64 / self.seconds,
            "claim": {
                "idle": self.idle_claim.to_json(),
                "purging": self.busy_claim.to_json(),
                "ratio": self.busy_claim.p50 / self.idle_claim.p50,
                "ratio_p99": self.busy_claim.p99 / self.idle_claim.p99,
            },
            "first_execution": {
                "idle": self.idle_first.to_json(),
                "purging": self.busy_first.to_json(),
                "ratio": self.busy_first.p50 / self.idle_first.p50,
                "ratio_p99": self.busy_first.p99 / self.idle_first.p99,
            },
            "store_bytes": {
                "before_fill": self.store_bytes[0],
                "after_fill": self.store_bytes[1],
                "after_purge": self.store_bytes[2],
            },
            "client_rss_growth_kib": self.client_rss_growth_kib,
        })
    }
}

impl fmt::Display for PurgePoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "\npurge: {} expired records filled; purge_expired deleted {} in {} batches of {} at duty cycle {} in {:.1} s ({:.0}/s)",
            self.expired,
            self.deleted,
            self.batches,
            self.batch,
            self.duty,
            self.seconds,
            self.deleted as f64 / self.seconds
        )?;
        writeln!(
            f,
            "{:<20}{:>10}{:>10}{:>10}{:>10}{:>8}{:>8}",
            "", "idle p50", "purge p50", "idle p99", "purge p99", "p50 ×", "p99 ×"
        )?;
        for (name, idle, busy) in [
            ("claim (new key)", self.idle_claim, self.busy_claim),
            ("first execution", self.idle_first, self.busy_first),
        ] {
            writeln!(
                f,
                "{name:<20}{:>10.1}{:>10.1}{:>10.1}{:>10.1}{:>7.2}×{:>7.2}×",
                idle.p50,
                busy.p50,
                idle.p99,
                busy.p99,
                busy.p50 / idle.p50,
                busy.p99 / idle.p99
            )?;
        }
        let [before, filled, purged] = self.store_bytes;
        write!(
            f,
            "store bytes: {before} before the fill, {filled} after it, {purged} after the purge"
        )?;
        match self.client_rss_growth_kib {
            Some(kib) => writeln!(f, "; this process grew by {kib} KiB while purging"),
            None => writeln!(f),
        }
    }
}

/// What `idem bench` measured.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BenchReport {
    /// `sqlite`, `postgres` or `redis`.
    pub engine: String,
    /// Concurrent callers.
    pub concurrency: usize,
    /// idem's replays were answered by a `ReplayCache` (`--replay-cache`).
    pub replay_cache: bool,
    /// CPU time of one `Fingerprint::of` of the bench's arguments, µs (mean).
    pub fingerprint_us: f64,
    /// One entry per `--records` value, ascending.
    pub points: Vec<Point>,
    /// Claims while purging, with `--purge`.
    pub purge: Option<PurgePoint>,
}

impl BenchReport {
    /// The report as JSON. The top-level `operations`, `first_execution` and `replay` are those
    /// of the first point; `ratio` is at p50, `ratio_p99` at p99.
    pub fn to_json(&self) -> Value {
        let first = self.points.first().cloned().unwrap_or_default();
        let points: Vec<Value> = self
            .points
            .iter()
            .map(|p| {
                json!({
                    "records": p.records,
                    "first_execution": p.first.to_json(),
                    "replay": p.replay.to_json(),
                    "first_execution_floor": p.first_floor.map(|f| json!({
                        "floor": f.to_json(), "what": "two trivial EVALSHA",
                        "ratio": p.first.idem.p50 / f.p50, "ratio_p99": p.first.idem.p99 / f.p99,
                    })),
                    "claim": p.claim.to_json(),
                    "complete": p.complete.to_json(),
                    "read_idem_row": p.read_idem_row.map(Stats::to_json),
                    "store_bytes": p.store_bytes,
                    "bytes_per_record": p.bytes_per_record,
                    "replays_from_store": p.replays_from_store,
                })
            })
            .collect();
        json!({
            "engine": self.engine,
            "concurrency": self.concurrency,
            "replay_cache": self.replay_cache,
            "operations": first.first.idem.n,
            "fingerprint_us": self.fingerprint_us,
            "first_execution": first.first.to_json(),
            "replay": first.replay.to_json(),
            "points": points,
            "purge": self.purge.as_ref().map(PurgePoint::to_json),
        })
    }

    /// Reads back what [`BenchReport::to_json`] wrote (for `--plot-with`): engine, concurrency
    /// and the comparisons per point.
    pub fn from_json(v: &Value) -> Result<BenchReport, String> {
        let points = v["points"]
            .as_array()
            .ok_or("not an `idem bench --json` report: no points")?;
        Ok(BenchReport {
            engine: v["engine"].as_str().unwrap_or("?").to_owned(),
            concurrency: v["concurrency"].as_u64().unwrap_or(1) as usize,
            replay_cache: v["replay_cache"].as_bool().unwrap_or(false),
            fingerprint_us: v["fingerprint_us"].as_f64().unwrap_or(f64::NAN),
            points: points
                .iter()
                .map(|p| Point {
                    records: p["records"].as_u64().unwrap_or(0),
                    first: Comparison::from_json(&p["first_execution"]),
                    replay: Comparison::from_json(&p["replay"]),
                    ..Point::default()
                })
                .collect(),
            purge: None,
        })
    }
}

impl fmt::Display for BenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "{} caller(s), idem and raw interleaved on the same pool; µs; ratio = idem / raw{}",
            self.concurrency,
            if self.replay_cache {
                "; idem's replays from its replay cache"
            } else {
                ""
            }
        )?;
        writeln!(
            f,
            "fingerprint (CPU, one call): {:.2} µs",
            self.fingerprint_us
        )?;
        for p in &self.points {
            write!(f, "\n{} live records", p.records)?;
            if let Some(b) = p.bytes_per_record {
                write!(f, ", {b:.0} bytes per record")?;
            }
            writeln!(f, " ({} operations of each kind)", p.first.idem.n)?;
            writeln!(
                f,
                "{:<20}{:>9}{:>9}{:>9}{:>9}{:>9}{:>9}{:>8}{:>8}",
                "",
                "idem p50",
                "raw p50",
                "idem p99",
                "raw p99",
                "idem avg",
                "raw avg",
                "p50 ×",
                "p99 ×"
            )?;
            let mut row = |name: &str, idem: Stats, raw: Stats| {
                writeln!(
                    f,
                    "{name:<20}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>9.1}{:>7.2}×{:>7.2}×",
                    idem.p50,
                    raw.p50,
                    idem.p99,
                    raw.p99,
                    idem.mean,
                    raw.mean,
                    idem.p50 / raw.p50,
                    idem.p99 / raw.p99
                )
            };
            row("first execution", p.first.idem, p.first.raw)?;
            row("replay", p.replay.idem, p.replay.raw)?;
            if let Some(floor) = p.first_floor {
                row("first vs 2 EVALSHA", p.first.idem, floor)?;
            }
            let mut alone = |name: &str, s: Stats| {
                writeln!(
                    f,
                    "{name:<20}{:>9.1}{:>9}{:>9.1}{:>9}{:>9.1}",
                    s.p50, "", s.p99, "", s.mean
                )
            };
            alone("  claim (new key)", p.claim)?;
            alone("  complete", p.complete)?;
            if let Some(read) = p.read_idem_row {
                alone("  SELECT * record", read)?;
            }
            if let Some(missed) = p.replays_from_store {
                writeln!(
                    f,
                    "replays that reached the store past the cache: {missed} of {}",
                    p.replay.idem.n
                )?;
            }
        }
        if let Some(purge) = &self.purge {
            write!(f, "{purge}")?;
        }
        Ok(())
    }
}
