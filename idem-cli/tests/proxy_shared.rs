//! Two `idem proxy` processes on one PostgreSQL store (`IDEM_TEST_POSTGRES_URL`) in front of one
//! Python HTTP tool server: calls alternate between them, and race across them, and every
//! operation is one effect at the upstream's sink. A tenant of its own per run keeps the
//! records apart from other tests on the same database.

mod proxy_kit;

use std::sync::Arc;

use idem_conformance::kit;
use proxy_kit::{Scratch, arrived, effects, http_tool, post, proxy, release};
use tokio::sync::Barrier;

const BODY: &str = r#"{"title": "Printer on fire"}"#;

fn tenant() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!("proxy-shared-{}-{nanos}", std::process::id())
}

#[tokio::test]
async fn two_proxies_on_one_postgres_store_answer_each_others_repeats() {
    let Some(store) = kit::postgres_url() else {
        return;
    };
    let dir = Scratch::new("proxy-shared");
    let up = http_tool(&dir.0, &[]);
    let a = proxy(&up.url, &store, &[]);
    let b = proxy(&up.url, &store, &[]);
    let tenant = tenant();
    let proxies = [&a.url, &b.url];
    // Each operation's first attempt on one proxy, its repeats alternating.
    for op in 0..4 {
        let key = format!("op-{op}");
        let mut answers = Vec::new();
        for attempt in 0..3 {
            let url = format!("{}/tools/create", proxies[(op + attempt) % 2]);
            answers.push(post(&url, &tenant, Some(&key), &[], BODY).await);
        }
        assert_eq!(answers[0].status, 201);
        assert!(!answers[0].replayed());
        for repeat in &answers[1..] {
            assert!(repeat.replayed(), "{key}");
            assert_eq!(repeat.body, answers[0].body);
            assert_eq!(
                repeat.header("x-upstream-answer"),
                answers[0].header("x-upstream-answer")
            );
        }
    }
    assert_eq!(effects(&up.url).await, 4, "four operations, four effects");
    // One key raced on both proxies at once: the one that reaches the upstream waits there.
    let barrier = Arc::new(Barrier::new(6));
    let mut sent = Vec::new();
    for i in 0..6 {
        let (url, tenant, barrier) = (
            format!("{}/tools/create", proxies[i % 2]),
            tenant.clone(),
            barrier.clone(),
        );
        sent.push(tokio::spawn(async move {
            barrier.wait().await;
            let headers = [("x-fixture-block", "race"), ("prefer", "wait=30")];
            post(&url, &tenant, Some("raced"), &headers, BODY).await
        }));
    }
    arrived(&up.url, "race").await;
    release(&up.url, "race").await;
    let mut answers = Vec::new();
    for s in sent {
        answers.push(s.await.unwrap());
    }
    assert!(answers.iter().all(|a| a.status == 201));
    assert_eq!(answers.iter().filter(|a| !a.replayed()).count(), 1);
    assert_eq!(
        effects(&up.url).await,
        5,
        "the raced key is one more effect"
    );
}
