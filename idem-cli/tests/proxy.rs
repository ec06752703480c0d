//! `idem proxy` in front of an HTTP tool server nobody here wrote (tests/upstreams/http_tool.py,
//! Python's standard library): the real binary on a SQLite file, every effect counted in the
//! upstream's own sink, with the `Idempotency-Key` it received.

mod proxy_kit;

use std::sync::Arc;

use proxy_kit::{
    Answer, Scratch, arrived, client, effects, http_tool, idem, keys_received, post, proxy, release,
};
use tokio::sync::Barrier;

const BODY: &str = r#"{"title": "Printer on fire", "account_id": "a-1"}"#;

#[tokio::test]
async fn the_same_key_twice_is_one_effect_and_the_repeat_is_the_first_answer_verbatim() {
    let dir = Scratch::new("proxy-verbatim");
    let up = http_tool(&dir.0, &[]);
    let p = proxy(&up.url, &dir.sqlite(), &[]);
    let url = format!("{}/tools/create_ticket", p.url);
    let first = post(&url, "acme", Some("wf-1:s-1"), &[], BODY).await;
    // Key order and white space do not make another request.
    let same = r#"{"account_id":"a-1","title":"Printer on fire"}"#;
    let again = post(&url, "acme", Some("wf-1:s-1"), &[], same).await;
    assert_eq!(effects(&up.url).await, 1, "two requests, one effect");
    assert_eq!(first.status, 201);
    assert!(!first.replayed());
    assert!(again.replayed());
    assert_eq!(again.status, first.status);
    assert_eq!(again.body, first.body, "the body byte for byte");
    // Every header of the upstream's answer, the one unique per answer included.
    for name in ["x-upstream-answer", "location", "content-type", "server"] {
        assert_eq!(again.header(name), first.header(name), "{name}");
    }
    let cookies = |a: &Answer| -> Vec<String> {
        let values = a.headers.get_all("set-cookie").iter();
        values.map(|v| v.to_str().unwrap().to_owned()).collect()
    };
    assert_eq!(cookies(&again), cookies(&first));
    assert_eq!(cookies(&again).len(), 2);
}

#[tokio::test]
async fn another_body_with_the_key_is_422_and_no_effect() {
    let dir = Scratch::new("proxy-mismatch");
    let up = http_tool(&dir.0, &[]);
    let p = proxy(&up.url, &dir.sqlite(), &[]);
    let url = format!("{}/tools/create_ticket", p.url);
    assert_eq!(post(&url, "acme", Some("k-1"), &[], BODY).await.status, 201);
    let other = post(&url, "acme", Some("k-1"), &[], r#"{"title": "other"}"#).await;
    assert_eq!(other.status, 422);
    assert_eq!(
        other.problem().as_deref(),
        Some("urn:idem:problem:fingerprint-mismatch")
    );
    // Another query string is another request too.
    let query = post(&format!("{url}?dry_run=1"), "acme", Some("k-1"), &[], BODY).await;
    assert_eq!(query.status, 422);
    assert_eq!(effects(&up.url).await, 1);
}

#[tokio::test]
async fn reads_pass_through_every_time_unrecorded() {
    let dir = Scratch::new("proxy-reads");
    let up = http_tool(&dir.0, &[]);
    let p = proxy(&up.url, &dir.sqlite(), &[]);
    let mut seen = Vec::new();
    for _ in 0..3 {
        let read = client()
            .get(format!("{}/items/7", p.url))
            .header("idempotency-key", "k-read")
            .send()
            .await
            .unwrap();
        assert!(read.headers().get("idempotency-replayed").is_none());
        let body: serde_json::Value = read.json().await.unwrap();
        seen.push(body["read"].as_u64().unwrap());
    }
    assert_eq!(seen, [1, 2, 3], "each read reached the upstream");
    let head = client().head(format!("{}/items/7", p.url)).send().await;
    assert_eq!(head.unwrap().status(), 200);
    let sink = proxy_kit::sink(&up.url).await;
    assert_eq!(sink["reads"], 3);
    assert_eq!(sink["effects"], 0);
    let records = idem(&dir.sqlite(), &["keys", "ls", "--json"]);
    assert_eq!(records.trim(), "[]", "nothing recorded: {records}");
}

#[tokio::test]
async fn eight_concurrent_requests_with_one_key_are_one_effect() {
    let dir = Scratch::new("proxy-eight");
    let up = http_tool(&dir.0, &[]);
    let p = proxy(&up.url, &dir.sqlite(), &[]);
    let url = format!("{}/tools/create_ticket", p.url);
    let barrier = Arc::new(Barrier::new(8));
    let mut sent = Vec::new();
    for _ in 0..8 {
        let (url, barrier) = (url.clone(), barrier.clone());
        sent.push(tokio::spawn(async move {
            barrier.wait().await;
            // The one that reaches the upstream waits there until the test lets it answer; the
            // others wait for its answer at the proxy.
            let headers = [("x-fixture-block", "eight"), ("prefer", "wait=30")];
            post(&url, "acme", Some("k-8"), &headers, BODY).await
        }));
    }
    arrived(&up.url, "eight").await;
    release(&up.url, "eight").await;
    let mut answers = Vec::new();
    for s in sent {
        answers.push(s.await.unwrap());
    }
    assert_eq!(effects(&up.url).await, 1, "eight requests, one effect");
    assert!(
        answers.iter().all(|a| a.status == 201),
        "every caller got the answer"
    );
    assert_eq!(answers.iter().filter(|a| !a.replayed()).count(), 1);
    assert!(answers.iter().all(|a| a.body == answers[0].body));
}

#[tokio::test]
async fn the_upstream_gets_one_downstream_key_per_operation_on_every_attempt() {
    let dir = Scratch::new("proxy-downstream");
    let up = http_tool(&dir.0, &[]);
    let p = proxy(&up.url, &dir.sqlite(), &[]);
    let url = format!("{}/tools/create_ticket", p.url);
    // The first attempt fails upstream (503: retryable, not kept), the second runs, the third
    // is the replay and does not reach the upstream.
    let failed = post(
        &url,
        "acme",
        Some("k-1"),
        &[("x-fixture-status", "503")],
        BODY,
    )
    .await;
    assert_eq!(failed.status, 503);
    assert!(!failed.replayed());
    let ran = post(&url, "acme", Some("k-1"), &[], BODY).await;
    assert_eq!((ran.status, ran.replayed()), (201, false));
    assert!(post(&url, "acme", Some("k-1"), &[], BODY).await.replayed());
    // The same key from another tenant is another operation.
    assert_eq!(
        post(&url, "globex", Some("k-1"), &[], BODY).await.status,
        201
    );
    let keys = keys_received(&up.url).await;
    assert_eq!(
        keys.len(),
        3,
        "two attempts of one operation, one of another"
    );
    let acme = keys[0].clone().expect("a downstream key");
    assert!(acme.starts_with("idem-") && acme != "k-1", "{acme}");
    assert_eq!(
        keys[1].as_deref(),
        Some(acme.as_str()),
        "the same on every attempt"
    );
    assert_ne!(
        keys[2].as_deref(),
        Some(acme.as_str()),
        "distinct per scope"
    );
    assert_eq!(effects(&up.url).await, 2);
}

#[tokio::test]
async fn a_request_without_a_key_is_refused_or_keyed_by_its_body() {
    let dir = Scratch::new("proxy-keyless");
    let up = http_tool(&dir.0, &[]);
    let refusing = proxy(&up.url, &dir.sqlite(), &[]);
    let refused = post(
        &format!("{}/tools/x", refusing.url),
        "acme",
        None,
        &[],
        BODY,
    )
    .await;
    assert_eq!(refused.status, 400);
    assert_eq!(
        refused.problem().as_deref(),
        Some("urn:idem:problem:key-required")
    );
    let deriving = proxy(&up.url, &dir.sqlite(), &["--key-source", "arguments"]);
    let url = format!("{}/tools/x", deriving.url);
    let first = post(&url, "acme", None, &[], BODY).await;
    let again = post(&url, "acme", None, &[], BODY).await;
    assert_eq!((first.status, again.replayed()), (201, true));
    assert_eq!(first.header("idempotency-key-source"), Some("arguments"));
    // A body that is not JSON, and no body at all, are requests too.
    let form = [("content-type", "application/x-www-form-urlencoded")];
    assert_eq!(post(&url, "acme", None, &form, "a=1&b=2").await.status, 201);
    assert!(post(&url, "acme", None, &form, "a=1&b=2").await.replayed());
    let delete = |key| {
        let request = client().delete(format!("{}/tickets/9", deriving.url));
        let request = request.header("x-tenant-id", "acme");
        async move { Answer::of(request.header("idempotency-key", key).send().await.unwrap()).await }
    };
    assert_eq!(delete("d-1").await.status, 201);
    assert!(delete("d-1").await.replayed());
    assert_eq!(effects(&up.url).await, 3);
    let bodies: Vec<String> = proxy_kit::sink(&up.url).await["requests"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["body"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(bodies[1], "a=1&b=2", "the upstream gets the bytes sent");
}

#[tokio::test]
async fn with_tokens_a_protected_request_needs_one_and_it_is_not_passed_on() {
    let dir = Scratch::new("proxy-tokens");
    let tokens = dir.0.join("tokens");
    std::fs::write(&tokens, "tok-acme-0123456789abcdef acme\n").unwrap();
    let up = http_tool(&dir.0, &[]);
    let p = proxy(
        &up.url,
        &dir.sqlite(),
        &["--tokens", tokens.to_str().unwrap()],
    );
    let url = format!("{}/tools/x", p.url);
    let anonymous = post(&url, "acme", Some("k-1"), &[], BODY).await;
    assert_eq!(anonymous.status, 401);
    let bearer = [("authorization", "Bearer tok-acme-0123456789abcdef")];
    assert_eq!(
        post(&url, "x", Some("k-1"), &bearer, BODY).await.status,
        201
    );
    assert!(post(&url, "y", Some("k-1"), &bearer, BODY).await.replayed());
    assert_eq!(effects(&up.url).await, 1);
    let sink = proxy_kit::sink(&up.url).await;
    assert_eq!(
        sink["requests"][0]["authorization"], false,
        "the proxy's token stays here"
    );
}

#[tokio::test]
async fn an_upstream_that_refuses_the_connection_gets_502_and_the_claim_back() {
    let dir = Scratch::new("proxy-refused");
    // A port nobody listens on, then the upstream started on it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let p = proxy(&format!("http://127.0.0.1:{port}"), &dir.sqlite(), &[]);
    let url = format!("{}/tools/x", p.url);
    let down = post(&url, "acme", Some("k-1"), &[], BODY).await;
    assert_eq!(down.status, 502);
    assert_eq!(
        down.problem().as_deref(),
        Some("urn:idem:problem:upstream-unreachable")
    );
    let record = idem(&dir.sqlite(), &["keys", "ls", "--json"]);
    assert!(record.contains("failed_retryable"), "released: {record}");
    let up = http_tool(&dir.0, &["--port", &port.to_string()]);
    let ran = post(&url, "acme", Some("k-1"), &[], BODY).await;
    assert_eq!((ran.status, ran.replayed()), (201, false));
    assert_eq!(effects(&up.url).await, 1);
}

#[tokio::test]
async fn an_answer_that_is_not_http_is_502_and_not_recorded_as_done() {
    let dir = Scratch::new("proxy-garbage");
    let up = http_tool(&dir.0, &[]);
    let p = proxy(&up.url, &dir.sqlite(), &[]);
    let url = format!("{}/tools/x", p.url);
    let garbage = [("x-fixture-garbage", "1")];
    let answer = post(&url, "acme", Some("k-1"), &garbage, BODY).await;
    assert_eq!(answer.status, 502);
    assert_eq!(
        answer.problem().as_deref(),
        Some("urn:idem:problem:upstream-no-answer")
    );
    let record = idem(&dir.sqlite(), &["keys", "ls", "--json"]);
    assert!(
        record.contains("\"processing\""),
        "may have happened: {record}"
    );
    // It may have happened: a retry does not run it again.
    let retry = post(&url, "acme", Some("k-1"), &[], BODY).await;
    assert_eq!(retry.status, 409);
    assert_eq!(effects(&up.url).await, 1);
}

#[tokio::test]
async fn a_response_over_the_store_limit_ran_and_is_not_kept() {
    let dir = Scratch::new("proxy-large");
    let up = http_tool(&dir.0, &[]);
    let p = proxy(&up.url, &dir.sqlite(), &[]);
    let url = format!("{}/tools/export", p.url);
    let large = [("x-fixture-bytes", "2000000")];
    let first = post(&url, "acme", Some("k-1"), &large, BODY).await;
    assert_eq!((first.status, first.body.len()), (201, 2_000_000));
    let again = post(&url, "acme", Some("k-1"), &large, BODY).await;
    assert!(again.replayed());
    assert_eq!(
        again.problem().as_deref(),
        Some("urn:idem:problem:outcome-not-kept")
    );
    assert_eq!(effects(&up.url).await, 1);
}

#[test]
fn a_config_file_with_an_error_is_refused_at_start_with_the_line() {
    let dir = Scratch::new("proxy-config");
    let config = dir.0.join("proxy.toml");
    std::fs::write(&config, "[[route]]\npath = \"/pay/*\"\nstale = \"later\"\n").unwrap();
    let out = std::process::Command::new(proxy_kit::IDEM)
        .args([
            "proxy",
            "--upstream",
            "http://127.0.0.1:9",
            "--store",
            &dir.sqlite(),
        ])
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "a usage error: {stderr}");
    for wanted in ["line 3", "in-doubt", "takeover"] {
        assert!(stderr.contains(wanted), "{wanted:?} in {stderr}");
    }
    assert!(
        !dir.0.join("idem.db").exists(),
        "refused before the store was touched"
    );
}

#[tokio::test]
async fn busy_answers_are_retried_unless_the_route_keeps_every_answer() {
    let dir = Scratch::new("proxy-keep");
    let config = dir.0.join("proxy.toml");
    std::fs::write(
        &config,
        "[[route]]\npath = \"/kept/*\"\nkeep_every_answer = true\n",
    )
    .unwrap();
    let up = http_tool(&dir.0, &[]);
    let p = proxy(
        &up.url,
        &dir.sqlite(),
        &["--config", config.to_str().unwrap()],
    );
    // 425, 429 and 5xx are not kept: the next attempt reaches the upstream.
    for (i, status) in ["425", "429", "500"].into_iter().enumerate() {
        let url = format!("{}/tools/busy", p.url);
        let key = format!("k-{i}");
        let busy = post(
            &url,
            "acme",
            Some(&key),
            &[("x-fixture-status", status)],
            BODY,
        )
        .await;
        assert_eq!(busy.status.to_string(), status);
        let ran = post(&url, "acme", Some(&key), &[], BODY).await;
        assert_eq!((ran.status, ran.replayed()), (201, false), "{status}");
    }
    // On the route that keeps every answer, the 503 is the answer for good.
    let url = format!("{}/kept/x", p.url);
    let busy = post(
        &url,
        "acme",
        Some("k-kept"),
        &[("x-fixture-status", "503")],
        BODY,
    )
    .await;
    let again = post(&url, "acme", Some("k-kept"), &[], BODY).await;
    assert_eq!((again.status, again.replayed()), (503, true));
    assert_eq!(again.body, busy.body);
    let requests = proxy_kit::sink(&up.url).await["requests"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(
        requests, 7,
        "three busy and three runs, and the kept 503 only once"
    );
}
