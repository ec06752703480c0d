//! `idem bench` end to end on scratch SQLite files: the reports it measures and reads back.

use super::*;

/// With `--replay-cache` every measured replay is still a replay of the record (the bench
/// checks each answer), answered by the cache (the claims that reach the store under it are
/// counted), the report says so, and it reads back so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_replays_through_the_replay_cache() {
    let (dir, url) = super::scratch_sqlite().await;
    let opts = BenchOptions {
        operations: 12,
        concurrency: 2,
        records: vec![0, 4],
        duration: None,
        purge: None,
        purge_batch: 64,
        purge_duty: 1.0,
        replay_cache: true,
    };
    let report = bench(&url, &opts).await.unwrap();
    assert!(report.replay_cache);
    let point = &report.points[0];
    assert_eq!((point.replay.idem.n, point.replay.raw.n), (12, 12));
    // Counted under the cache, at each point: none of the measured replays reached the
    // store.
    let missed: Vec<_> = report.points.iter().map(|p| p.replays_from_store).collect();
    assert_eq!(missed, [Some(0), Some(0)]);
    let json = report.to_json();
    assert_eq!(json["replay_cache"], true);
    assert!(BenchReport::from_json(&json).unwrap().replay_cache);
    assert!(report.to_string().contains("replay cache"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn percentiles_are_nearest_rank() {
    let mut samples: Vec<Duration> = (1..=100).rev().map(Duration::from_micros).collect();
    let s = Stats::of(&mut samples);
    assert_eq!((s.n, s.p50, s.p99, s.mean), (100, 50.0, 99.0, 50.5));
    assert_eq!(Stats::of(&mut []), Stats::default());
}

/// Prefills on SQLite, measures several callers at two sizes, plots, and cleans up: the
/// prefilled records were there while measuring and are gone after; the measured ones stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_prefill_measure_plot_and_clean() {
    let (dir, url) = super::scratch_sqlite().await;
    let opts = BenchOptions {
        operations: 10,
        concurrency: 3,
        records: vec![300, 0],
        duration: None,
        purge: Some(500),
        purge_batch: 64,
        // Rests long enough between batches that claims run beside the purge.
        purge_duty: 0.05,
        replay_cache: false,
    };
    let report = bench(&url, &opts).await.unwrap();
    assert_eq!(report.engine, "sqlite");
    let sizes: Vec<u64> = report.points.iter().map(|p| p.records).collect();
    assert_eq!(sizes, [0, 300], "ascending");
    for p in &report.points {
        assert_eq!((p.first.idem.n, p.first.raw.n), (10, 10));
        assert_eq!((p.replay.idem.n, p.replay.raw.n), (10, 10));
        assert!(p.first.idem.p50 > 0.0 && p.first.idem.p99 >= p.first.idem.p50);
        assert_eq!(p.read_idem_row.map(|s| s.n), Some(10));
        assert!(p.first_floor.is_none(), "no EVALSHA floor on SQL");
    }
    assert!(report.points[1].bytes_per_record.unwrap() > 50.0);
    let json = report.to_json();
    assert_eq!(json["operations"], 10);
    assert_eq!(BenchReport::from_json(&json).unwrap().points.len(), 2);

    let conn = rusqlite_count(&dir.join("b.db"));
    assert_eq!(
        conn,
        (20, 0),
        "20 measured records stay, the 300 prefilled are gone"
    );
    // The purge deleted exactly the 500 expired records (nothing else had expired), in
    // batches of 64, in windows between which it rested, while claims ran; each claim it
    // measured (idle or purging, by its window) is a record in the file.
    let purge = report.purge.as_ref().unwrap();
    assert_eq!((purge.expired, purge.deleted, purge.batches), (500, 500, 8));
    assert_eq!(purge.duty, 0.05);
    assert!(purge.idle_claim.n >= 1, "claims in the idle windows");
    assert!(purge.busy_claim.n >= 1, "claims while purging");
    assert_eq!(
        (purge.idle_first.n, purge.busy_first.n),
        (purge.idle_claim.n, purge.busy_claim.n)
    );
    assert!(purge.store_bytes[1] > purge.store_bytes[0]);
    let claims = |pattern: &str| {
        let store = idemkit::sqlite::SqliteStore::open(dir.join("b.db")).unwrap();
        let conn = store.connection().unwrap();
        conn.query_row(
            "SELECT count(*) FROM idem_records WHERE scope LIKE ?1",
            [pattern],
            |r| r.get::<_, i64>(0),
        )
        .unwrap()
    };
    // A claim that straddled two windows is a record but no sample.
    let made = claims("idem-bench/%/claims-purge") as usize;
    assert!(
        made >= purge.idle_claim.n + purge.busy_claim.n,
        "{made} records for {} + {} samples",
        purge.idle_claim.n,
        purge.busy_claim.n
    );
    assert_eq!(claims("idem-bench/%/expired"), 0);
    assert!(json["purge"]["claim"]["ratio_p99"].as_f64().is_some());

    let svg = dir.join("plot.svg");
    plot(&svg, &[report.clone(), report]).unwrap();
    let drawn = std::fs::read_to_string(&svg).unwrap();
    assert!(drawn.starts_with("<svg") && drawn.contains("sqlite ×3 idem p50"));
    std::fs::remove_dir_all(dir).unwrap();
}

/// (measured records, prefilled records) in the bench file.
fn rusqlite_count(path: &std::path::Path) -> (i64, i64) {
    let store = idemkit::sqlite::SqliteStore::open(path).unwrap();
    let conn = store.connection().unwrap();
    let count = |pattern: &str| {
        conn.query_row(
            "SELECT count(*) FROM idem_records WHERE scope LIKE ?1",
            [pattern],
            |r| r.get(0),
        )
        .unwrap()
    };
    (count("idem-bench/%/p%"), count("idem-bench/%/fill"))
}
