//! The suite and the bench against every live store whose URL is set.

use super::*;

fn conformance_passes(url: &str) {
    let out = idem(&["conformance", "--store", url]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains(" passed, 0 failed"), "{stdout}");
    assert!(stdout.lines().filter(|l| l.starts_with("pass ")).count() >= 30);
}

/// A short bench with prefilled and purged records: it prints its ratios, saves its report, the
/// purge deleted the expired records it filled, and on Redis nothing of the run is left.
async fn bench_prints_ratios(url: &str) {
    let dir = kit::temp_dir("bench");
    let saved = dir.path().join("report.json");
    let out = idem(&[
        "bench",
        "--store",
        url,
        "--operations",
        "20",
        "--records",
        "30",
        "--purge",
        "40",
        "--purge-batch",
        "16",
        // Long rests between batches: claims run beside even a purge this small.
        "--purge-duty",
        "0.02",
        "--save",
        saved.to_str().unwrap(),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let report: Value = serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    assert_eq!(report["points"][0]["records"], 30, "{report}");
    assert_eq!(report["purge"]["expired"], 40, "{report}");
    // A shared server may hold other expired records: the purge deletes those too.
    assert!(
        report["purge"]["deleted"].as_u64().unwrap() >= 40,
        "{report}"
    );
    assert!(report["purge"]["claim"]["purging"]["n"].as_u64().unwrap() >= 1);
    if url.starts_with("redis") {
        let client = idemkit::redis::redis::Client::open(url).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let left: Vec<String> = idemkit::redis::redis::cmd("KEYS")
            .arg("idem-bench-[0-9a-f][0-9a-f]*:*")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(left.is_empty(), "the bench's Redis keys are gone: {left:?}");
    }
    for row in ["first execution", "replay"] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(row))
            .unwrap_or_else(|| panic!("{stdout}"));
        let ratio: f64 = line
            .split_whitespace()
            .last()
            .unwrap()
            .trim_end_matches('×')
            .parse()
            .unwrap();
        // A ratio, not a speed: one outlier of the shared machine can round it to 0.00×.
        assert!(ratio.is_finite() && ratio >= 0.0, "{line}");
    }
}

#[tokio::test]
async fn conformance_and_bench_run_against_every_live_store() {
    for backend in ["sqlite", "postgres", "redis"] {
        if let Some((url, _dir)) = store_url(backend) {
            let migrated = idem(&["migrate", "--store", &url]);
            assert!(migrated.status.success(), "{:?}", text(&migrated));
            conformance_passes(&url);
            bench_prints_ratios(&url).await;
        }
    }
}
