//! `idem proxy` SIGKILLed while the upstream works on a request (the Python HTTP tool server of
//! tests/upstreams, holding its answer until the test lets it go): the effect happened, the
//! proxy cannot know. A retry through a second proxy on the same SQLite file gets 409 while the
//! lease runs, then the in-doubt answer (or, on a route that opted into takeover in front of an
//! upstream that deduplicates by the forwarded key, the upstream's first answer); never a second
//! effect at the upstream's sink.
//!
//! Waiting for the lease to end is waiting for the engine's clock (the store decides with
//! wall-clock time that a lease has ended): the test polls the answer until it changes, with a
//! short `--lease`, and asserts every answer on the way.

mod proxy_kit;

use std::time::{Duration, Instant};

use proxy_kit::{Answer, Scratch, arrived, client, effects, http_tool, idem, post, proxy, release};

const BODY: &str = r#"{"title": "Printer on fire"}"#;
const LEASE: &str = "2s";

/// Sends the request that the upstream holds, through `proxy`, in a task of its own (its caller
/// is cut off when the proxy dies), and returns once the upstream recorded its effect.
async fn hold_a_request(proxy: &str, upstream: &str, gate: &'static str) {
    let url = format!("{proxy}/tools/charge");
    tokio::spawn(async move {
        let _ = client()
            .post(url)
            .header("x-tenant-id", "acme")
            .header("idempotency-key", "k-1")
            .header("x-fixture-block", gate)
            .body(BODY)
            .send()
            .await;
    });
    arrived(upstream, gate).await;
}

/// Retries through `url` until the answer is no longer `in-flight` (the lease ended), checking
/// that each one on the way is the in-flight 409.
async fn retry_until_the_lease_ends(url: &str) -> Answer {
    let start = Instant::now();
    loop {
        let retry = post(url, "acme", Some("k-1"), &[], BODY).await;
        if retry.problem().as_deref() != Some("urn:idem:problem:in-flight") {
            return retry;
        }
        assert_eq!(retry.status, 409);
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the lease never ended"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_proxy_killed_mid_request_leaves_the_key_in_flight_then_in_doubt_never_run_twice() {
    let dir = Scratch::new("proxy-kill");
    let up = http_tool(&dir.0, &[]);
    let mut first = proxy(&up.url, &dir.sqlite(), &["--lease", LEASE]);
    let second = proxy(&up.url, &dir.sqlite(), &["--lease", LEASE]);
    hold_a_request(&first.url, &up.url, "kill").await;
    first.child.kill().unwrap(); // SIGKILL
    first.child.wait().unwrap();
    let url = format!("{}/tools/charge", second.url);
    let during = post(&url, "acme", Some("k-1"), &[], BODY).await;
    assert_eq!(during.status, 409);
    assert_eq!(
        during.problem().as_deref(),
        Some("urn:idem:problem:in-flight")
    );
    assert!(during.header("retry-after").is_some());
    let after = retry_until_the_lease_ends(&url).await;
    assert_eq!(after.status, 409);
    assert_eq!(
        after.problem().as_deref(),
        Some("urn:idem:problem:in-doubt")
    );
    assert_eq!(after.header("retry-after"), None, "waiting changes nothing");
    // The upstream answers the dead proxy: still one effect, still in doubt.
    release(&up.url, "kill").await;
    let again = post(&url, "acme", Some("k-1"), &[], BODY).await;
    assert_eq!(
        again.problem().as_deref(),
        Some("urn:idem:problem:in-doubt")
    );
    assert_eq!(effects(&up.url).await, 1, "never a second effect");
    // An operator who checked the upstream settles the key: retries get that answer.
    let listed: serde_json::Value =
        serde_json::from_str(&idem(&dir.sqlite(), &["keys", "ls", "--json"])).unwrap();
    let record = &listed[0];
    assert_eq!(record["state"], "processing");
    let scope = record["scope"].as_str().unwrap();
    let outcome = dir.0.join("outcome.json");
    std::fs::write(&outcome, r#"{"status": 201, "body": {"charged": true}}"#).unwrap();
    idem(
        &dir.sqlite(),
        &[
            "keys",
            "resolve",
            scope,
            "k-1",
            "--outcome",
            outcome.to_str().unwrap(),
        ],
    );
    let settled = post(&url, "acme", Some("k-1"), &[], BODY).await;
    assert_eq!((settled.status, settled.replayed()), (201, true));
    let body: serde_json::Value = serde_json::from_slice(&settled.body).unwrap();
    assert_eq!(body["charged"], true);
    assert_eq!(effects(&up.url).await, 1);
}

#[tokio::test]
async fn on_a_takeover_route_a_retry_after_the_lease_goes_again_with_the_same_downstream_key() {
    let dir = Scratch::new("proxy-takeover");
    let config = dir.0.join("proxy.toml");
    let route = "[[route]]\npath = \"/tools/*\"\nstale = \"takeover\"\n";
    std::fs::write(&config, route).unwrap();
    let config = config.to_str().unwrap();
    // An upstream that deduplicates by the key it receives, as a payment provider does.
    let up = http_tool(&dir.0, &["--dedupe"]);
    let args = ["--lease", LEASE, "--config", config];
    let mut first = proxy(&up.url, &dir.sqlite(), &args);
    let second = proxy(&up.url, &dir.sqlite(), &args);
    hold_a_request(&first.url, &up.url, "takeover").await;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    let url = format!("{}/tools/charge", second.url);
    let taken = retry_until_the_lease_ends(&url).await;
    assert_eq!((taken.status, taken.replayed()), (201, false));
    assert_eq!(taken.header("x-deduplicated"), Some("true"));
    let sink = proxy_kit::sink(&up.url).await;
    let requests = sink["requests"].as_array().unwrap();
    assert_eq!(
        sink["effects"], 1,
        "the upstream deduplicated the second attempt"
    );
    assert_eq!(
        requests.len(),
        1,
        "the deduplicated attempt recorded nothing"
    );
    release(&up.url, "takeover").await;
    let replay = post(&url, "acme", Some("k-1"), &[], BODY).await;
    assert!(replay.replayed());
    assert_eq!(replay.body, taken.body);
    assert_eq!(effects(&up.url).await, 1);
}
