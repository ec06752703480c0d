//! `with_wait_for_replicas` against servers the tests start themselves: a master alone (nothing
//! can confirm) and a master with one replica. What must hold: a write the replicas did not
//! confirm is `Unavailable` (never "proceed") and a claim so refused is given back; replays are
//! not waited for; with the replica online every operation succeeds; the configuration check
//! sees replicas the store does not wait for; nonsense settings are refused.

mod common;

use std::time::Duration;

use common::server::TestServer;
use idem_core::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Maintenance, Outcome, Policy, RecordId, RecordState,
    Scope, Timestamp,
};
use idem_store_redis::{InvalidWait, RedisStore, redis};

fn fingerprint() -> Fingerprint {
    Fingerprint::of("charge", &serde_json::json!({"cents": 500})).unwrap()
}

fn outcome() -> Outcome {
    Outcome::definitive(200, &serde_json::json!({"charged": true})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nonsense_settings_are_refused() {
    let Some(server) = TestServer::start(&[]).await else {
        return;
    };
    let store = RedisStore::connect(&server.url()).await.unwrap();
    assert_eq!(
        store
            .clone()
            .with_wait_for_replicas(0, Duration::from_secs(1))
            .unwrap_err(),
        InvalidWait::NoReplicas
    );
    assert_eq!(
        store
            .clone()
            .with_wait_for_replicas(1, Duration::from_micros(999))
            .unwrap_err(),
        InvalidWait::NoTimeout
    );
    assert!(store.wait_for_replicas().is_none());
    let w = store
        .with_wait_for_replicas(2, Duration::from_millis(300))
        .unwrap()
        .with_wait_aof(true)
        .wait_for_replicas()
        .unwrap();
    assert_eq!(
        (w.replicas(), w.timeout(), w.aof()),
        (2, Duration::from_millis(300), true)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfirmed_write_is_unavailable_and_the_claim_is_given_back() {
    let Some(server) = TestServer::start(&[]).await else {
        return;
    };
    let plain = RedisStore::connect(&server.url()).await.unwrap();
    let waiting = plain
        .clone()
        .with_wait_for_replicas(1, Duration::from_millis(50))
        .unwrap();
    let warnings = waiting.check_config().await.unwrap();
    assert!(
        warnings.iter().any(|w| w
            .setting
            .starts_with("the store waits for 1 replica(s) but only 0 are connected")),
        "{warnings:#?}"
    );
    let scope = Scope::new(common::unique("wait")).unwrap();
    let (key, done) = (
        IdempotencyKey::new("charge-1").unwrap(),
        IdempotencyKey::new("done").unwrap(),
    );
    let policy = Policy::default();
    let now = Timestamp::from_millis(1_800_000_000_000);

    // No replica can confirm the claim: Unavailable, and the claim is given back.
    let id = RecordId::new(scope.clone(), key.clone());
    let err = waiting
        .claim(&id, &fingerprint(), &policy, now)
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    let record = plain.get(&id, now).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::FailedRetryable);
    // The next retry (without the option here) claims at once: nothing is stuck.
    assert!(matches!(
        plain
            .claim(&id, &fingerprint(), &policy, now)
            .await
            .unwrap(),
        ClaimAnswer::Claimed { attempt: 2, .. }
    ));

    let id = RecordId::new(scope.clone(), done.clone());
    // A completion, a release and an extension that write are unconfirmed too.
    let ClaimAnswer::Claimed { token, .. } = plain
        .claim(&id, &fingerprint(), &policy, now)
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    let err = waiting
        .extend(&id, token, Duration::from_secs(60), now)
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    let err = waiting
        .complete(&id, token, &outcome(), &policy, now)
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err:?}");
    // (The write itself reached the master: the record is completed there, unconfirmed.)
    assert_eq!(
        plain.get(&id, now).await.unwrap().unwrap().state,
        RecordState::Completed
    );
    // A replay writes nothing and is not waited for.
    assert!(matches!(
        waiting
            .claim(&id, &fingerprint(), &policy, now)
            .await
            .unwrap(),
        ClaimAnswer::Replay(_)
    ));
    // A fenced release writes nothing either: its answer stands.
    assert_eq!(
        waiting.release(&id, token, now).await.unwrap(),
        ReleaseAnswer::Fenced
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_replica_online_every_write_is_confirmed() {
    let Some(master) = TestServer::start(&["--repl-diskless-sync-delay", "0"]).await else {
        return;
    };
    let port = master.url().rsplit(':').next().unwrap().to_owned();
    let Some(replica_server) = TestServer::start(&["--replicaof", "127.0.0.1", &port]).await else {
        return;
    };
    let client = redis::Client::open(master.url()).unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    for _ in 0..600 {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query_async(&mut c)
            .await
            .unwrap();
        if info.contains("state=online") {
            break;
        }
        // A real replica syncing: nothing to inject.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let plain = RedisStore::connect(&master.url()).await.unwrap();
    let warnings = plain.check_config().await.unwrap();
    assert!(
        warnings
            .iter()
            .any(|w| w.setting.starts_with("1 replica(s) of ")
                && w.setting.contains("replicate asynchronously")),
        "{warnings:#?}"
    );
    let waiting = plain
        .with_wait_for_replicas(1, Duration::from_secs(5))
        .unwrap();
    let warnings = waiting.check_config().await.unwrap();
    assert!(
        !warnings.iter().any(|w| w.setting.contains("replica")),
        "{warnings:#?}"
    );
    let scope = Scope::new(common::unique("wait-ok")).unwrap();
    let key = IdempotencyKey::new("charge-1").unwrap();
    let id = RecordId::new(scope.clone(), key.clone());
    let policy = Policy::default();
    let now = Timestamp::from_millis(1_800_000_000_000);
    let ClaimAnswer::Claimed { token, .. } = waiting
        .claim(&id, &fingerprint(), &policy, now)
        .await
        .unwrap()
    else {
        panic!("fresh key")
    };
    assert!(matches!(
        waiting
            .extend(&id, token, Duration::from_secs(60), now)
            .await
            .unwrap(),
        ExtendAnswer::Extended { .. }
    ));
    assert_eq!(
        waiting.release(&id, token, now).await.unwrap(),
        ReleaseAnswer::Released
    );
    let ClaimAnswer::Claimed { token, .. } = waiting
        .claim(&id, &fingerprint(), &policy, now)
        .await
        .unwrap()
    else {
        panic!("retry")
    };
    assert_eq!(
        waiting
            .complete(&id, token, &outcome(), &policy, now)
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    // The replica has it.
    let replica = RedisStore::connect(&replica_server.url()).await.unwrap();
    assert_eq!(
        replica.get(&id, now).await.unwrap().unwrap().state,
        RecordState::Completed
    );
}
