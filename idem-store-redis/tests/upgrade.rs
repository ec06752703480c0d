//! Records written by earlier versions (format 1: one hash field per column, `s k fp st seq tid
//! att ck lu ca ua ea os ob oc n`) still claim, replay, complete, release, extend, list and purge
//! correctly, and their first write rewrites them in format 2 (fields `m` and `o`) keeping their
//! native expiry. The format-1 hashes are written here by hand, exactly as the old scripts wrote
//! them, under a key prefix of the test's own, against the server named by `IDEM_TEST_REDIS_URL`.

mod common;

use idem_core::store::CheckpointStore;
use std::time::Duration;

use idem_core::machine::ClaimAnswer;
use idem_core::machine::{
    CheckpointAnswer, ClaimKind, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::store::ListFilter;
use idem_core::{
    Checkpoint, Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, RecordState,
    Scope, Timestamp, Token,
};
use idem_store_redis::{BUCKETS, redis};

const NOW: u64 = 1_800_000_000_000;
const TID: u128 = 0x0123_4567_89ab_cdef_0123_4567_89ab_cdef;

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The record's name and index member, computed as format 1 did (FNV-1a bucket, hex names).
fn names(prefix: &str, scope: &str, key: &str) -> (String, String, String) {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in scope.as_bytes().iter().chain(&[0x1f]).chain(key.as_bytes()) {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
    }
    let base = format!("{prefix}:{{b{:02}}}", hash % u64::from(BUCKETS));
    let member = format!("{}:{}", hex(scope.as_bytes()), hex(key.as_bytes()));
    (format!("{base}:r:{member}"), base, member)
}

fn fingerprint() -> Fingerprint {
    Fingerprint::of("create_ticket", &serde_json::json!({"title": "old"})).unwrap()
}

/// Writes a format-1 record as the old claim and complete scripts left it.
async fn write_v1(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    key: &str,
    state: &str,
    lease_until: u64,
    expires_at: u64,
    outcome: Option<(&str, &str, &str)>,
) {
    let (record, base, member) = names(prefix, "tenant/tool", key);
    let mut cmd = redis::cmd("HSET");
    cmd.arg(&record);
    for (f, v) in [
        ("s", "tenant/tool".to_owned()),
        ("k", key.to_owned()),
        ("fp", fingerprint().as_str().to_owned()),
        ("ca", (NOW - 5000).to_string()),
        ("st", state.to_owned()),
        ("seq", "1".to_owned()),
        ("tid", format!("{TID:032x}")),
        ("att", "1".to_owned()),
        ("ck", "new".to_owned()),
        ("lu", lease_until.to_string()),
        ("ua", (NOW - 4000).to_string()),
        ("ea", expires_at.to_string()),
        ("n", format!("{:032x}", 7u128)),
    ] {
        cmd.arg(f).arg(v);
    }
    if let Some((status, body, class)) = outcome {
        cmd.arg("os")
            .arg(status)
            .arg("ob")
            .arg(body)
            .arg("oc")
            .arg(class);
    }
    let _: () = cmd.query_async(conn).await.unwrap();
    let _: () = redis::cmd("PEXPIRE")
        .arg(&record)
        .arg(3_600_000)
        .query_async(conn)
        .await
        .unwrap();
    let _: () = redis::cmd("ZADD")
        .arg(format!("{base}:exp"))
        .arg(expires_at)
        .arg(&member)
        .query_async(conn)
        .await
        .unwrap();
    if state == "processing" {
        let _: () = redis::cmd("ZADD")
            .arg(format!("{base}:lease"))
            .arg(lease_until)
            .arg(&member)
            .query_async(conn)
            .await
            .unwrap();
    }
}

async fn fields(
    conn: &mut redis::aio::MultiplexedConnection,
    prefix: &str,
    key: &str,
) -> Vec<String> {
    let (record, _, _) = names(prefix, "tenant/tool", key);
    let mut f: Vec<String> = redis::cmd("HKEYS")
        .arg(&record)
        .query_async(conn)
        .await
        .unwrap();
    f.sort();
    f
}

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, prefix: &str, key: &str) -> i64 {
    let (record, _, _) = names(prefix, "tenant/tool", key);
    redis::cmd("PTTL")
        .arg(&record)
        .query_async(conn)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_1_records_keep_working() {
    let Some((store, prefix, mut conn)) = common::prefixed_store("idem-upgrade").await else {
        return;
    };
    let scope = Scope::new("tenant/tool").unwrap();
    let k = |s: &str| IdempotencyKey::new(s).unwrap();
    let now = Timestamp::from_millis(NOW);
    let policy = Policy::builder()
        .ttl(Duration::from_secs(600))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let live = NOW + 500_000;
    let body = r#"{"ticket_id":"T-1","note":"é ✓"}"#;
    let old_token = Token::with_id(1, TID);

    // A completed record replays its outcome byte for byte; get and list read it.
    write_v1(
        &mut conn,
        &prefix,
        "done",
        "completed",
        NOW - 4000,
        live,
        Some(("201", body, "definitive")),
    )
    .await;
    let ClaimAnswer::Replay(o) = store
        .claim(
            &RecordId::new(scope.clone(), k("done")),
            &fingerprint(),
            &policy,
            now,
        )
        .await
        .unwrap()
    else {
        panic!("a format-1 completed record replays")
    };
    assert_eq!((o.status(), o.body()), (201, body));
    let other = Fingerprint::of("create_ticket", &serde_json::json!({"title": "new"})).unwrap();
    assert!(matches!(
        store
            .claim(
                &RecordId::new(scope.clone(), k("done")),
                &other,
                &policy,
                now
            )
            .await
            .unwrap(),
        ClaimAnswer::FingerprintMismatch
    ));
    let r = store
        .get(&RecordId::new(scope.clone(), k("done")), now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.state, RecordState::Completed);
    assert_eq!(r.token, old_token);
    assert_eq!(r.created_at, Timestamp::from_millis(NOW - 5000));
    assert_eq!(r.outcome.as_ref().unwrap().body(), body);

    // A processing record: in flight, listed when stale, completed by its old holder.
    write_v1(
        &mut conn,
        &prefix,
        "running",
        "processing",
        NOW + 10_000,
        live,
        None,
    )
    .await;
    assert!(matches!(
        store
            .claim(
                &RecordId::new(scope.clone(), k("running")),
                &fingerprint(),
                &policy,
                now
            )
            .await
            .unwrap(),
        ClaimAnswer::InFlight { stale: false, .. }
    ));
    let later = Timestamp::from_millis(NOW + 20_000);
    let stale = store.list_in_flight(later, 10).await.unwrap();
    assert_eq!(stale.len(), 1);
    assert_eq!(stale[0].key.as_str(), "running");
    assert!(matches!(
        store
            .extend(
                &RecordId::new(scope.clone(), k("running")),
                old_token,
                Duration::from_secs(60),
                now
            )
            .await
            .unwrap(),
        ExtendAnswer::Extended { .. }
    ));
    assert_eq!(fields(&mut conn, &prefix, "running").await, ["m"]);
    assert!(pttl(&mut conn, &prefix, "running").await > 0);
    let outcome = Outcome::definitive(200, &serde_json::json!({"ok": 1})).unwrap();
    assert_eq!(
        store
            .complete(
                &RecordId::new(scope.clone(), k("running")),
                old_token,
                &outcome,
                &policy,
                now
            )
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    let ClaimAnswer::Replay(o) = store
        .claim(
            &RecordId::new(scope.clone(), k("running")),
            &fingerprint(),
            &policy,
            now,
        )
        .await
        .unwrap()
    else {
        panic!("completed after the upgrade")
    };
    assert_eq!(o.body(), outcome.body());
    let r = store
        .get(&RecordId::new(scope.clone(), k("running")), now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!((r.token, r.attempt), (old_token, 1));
    assert_eq!(r.created_at, Timestamp::from_millis(NOW - 5000));
    assert_eq!(r.fingerprint, fingerprint());

    // A processing record completed straight away (no extend first) is rewritten as well.
    write_v1(
        &mut conn,
        &prefix,
        "quick",
        "processing",
        NOW + 10_000,
        live,
        None,
    )
    .await;
    assert_eq!(
        store
            .complete(
                &RecordId::new(scope.clone(), k("quick")),
                old_token,
                &outcome,
                &policy,
                now
            )
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    assert_eq!(fields(&mut conn, &prefix, "quick").await, ["m", "o"]);
    assert!(pttl(&mut conn, &prefix, "quick").await > 0);
    // A stale old token is still fenced.
    write_v1(
        &mut conn,
        &prefix,
        "fenced",
        "processing",
        NOW + 10_000,
        live,
        None,
    )
    .await;
    assert_eq!(
        store
            .complete(
                &RecordId::new(scope.clone(), k("fenced")),
                Token::with_id(1, 99),
                &outcome,
                &policy,
                now
            )
            .await
            .unwrap(),
        CompleteAnswer::Fenced
    );
    assert_eq!(
        fields(&mut conn, &prefix, "fenced").await.len(),
        13,
        "nothing written"
    );

    // Released by its old holder, then claimed again with the next token.
    write_v1(
        &mut conn,
        &prefix,
        "given-back",
        "processing",
        NOW + 10_000,
        live,
        None,
    )
    .await;
    assert_eq!(
        store
            .release(
                &RecordId::new(scope.clone(), k("given-back")),
                old_token,
                now
            )
            .await
            .unwrap(),
        ReleaseAnswer::Released
    );
    assert!(pttl(&mut conn, &prefix, "given-back").await > 0);
    let ClaimAnswer::Claimed {
        token,
        attempt,
        kind,
    } = store
        .claim(
            &RecordId::new(scope.clone(), k("given-back")),
            &fingerprint(),
            &policy,
            now,
        )
        .await
        .unwrap()
    else {
        panic!("a released record is claimed again")
    };
    assert_eq!((token.seq, attempt, kind), (2, 2, ClaimKind::Retry));

    // A failed_retryable record with its retryable outcome: claimed again, the outcome dropped.
    write_v1(
        &mut conn,
        &prefix,
        "failed",
        "failed_retryable",
        NOW - 4000,
        live,
        Some(("503", "{}", "retryable")),
    )
    .await;
    let ClaimAnswer::Claimed {
        token,
        attempt,
        kind,
    } = store
        .claim(
            &RecordId::new(scope.clone(), k("failed")),
            &fingerprint(),
            &policy,
            now,
        )
        .await
        .unwrap()
    else {
        panic!("a failed_retryable record is claimed again")
    };
    assert_eq!((token.seq, attempt, kind), (2, 2, ClaimKind::Retry));
    assert_eq!(fields(&mut conn, &prefix, "failed").await, ["m"]);
    let r = store
        .get(&RecordId::new(scope.clone(), k("failed")), now)
        .await
        .unwrap()
        .unwrap();
    assert!(r.outcome.is_none());
    assert_eq!(r.created_at, Timestamp::from_millis(NOW - 5000));

    // An expired record is replaced (its token continues), another one is purged.
    write_v1(
        &mut conn,
        &prefix,
        "old",
        "completed",
        NOW - 4000,
        NOW - 1,
        Some(("200", "{}", "definitive")),
    )
    .await;
    let ClaimAnswer::Claimed { token, kind, .. } = store
        .claim(
            &RecordId::new(scope.clone(), k("old")),
            &fingerprint(),
            &policy,
            now,
        )
        .await
        .unwrap()
    else {
        panic!("an expired record is replaced")
    };
    assert_eq!((token.seq, kind), (2, ClaimKind::ExpiredReplaced));
    assert_eq!(fields(&mut conn, &prefix, "old").await, ["m"]);
    write_v1(
        &mut conn,
        &prefix,
        "gone",
        "completed",
        NOW - 4000,
        NOW - 1,
        Some(("200", "{}", "definitive")),
    )
    .await;
    let listed = store.list(&ListFilter::default(), now, 100).await.unwrap();
    let mut names: Vec<&str> = listed.iter().map(|r| r.key.as_str()).collect();
    names.sort_unstable();
    assert_eq!(
        names,
        [
            "done",
            "failed",
            "fenced",
            "given-back",
            "old",
            "quick",
            "running"
        ]
    );
    assert_eq!(store.purge_expired(now, 100).await.unwrap(), 1);
    assert!(
        store
            .get(&RecordId::new(scope.clone(), k("gone")), now)
            .await
            .unwrap()
            .is_none()
    );

    // Clean up what is left.
    let end = Timestamp::from_millis(u64::MAX - 1);
    while store.purge_expired(end, 1000).await.unwrap() > 0 {}
}

/// Outcomes written before the replay header (format 2's `o` as `status|class|body`, no state,
/// fingerprint and expiry in front) replay and read as before, through the general path;
/// a completion now writes the header, and a replay reads it alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outcomes_without_the_replay_header_keep_working() {
    let Some((store, prefix, mut conn)) = common::prefixed_store("idem-upgrade-o").await else {
        return;
    };
    let scope = Scope::new("tenant/tool").unwrap();
    let k = |s: &str| IdempotencyKey::new(s).unwrap();
    let now = Timestamp::from_millis(NOW);
    let policy = Policy::builder()
        .ttl(Duration::from_secs(600))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    let live = NOW + 500_000;
    let body = r#"{"ticket_id":"T-7","note":"é ✓"}"#;
    let fp = fingerprint();

    // Completed as the earlier format-2 complete script left it.
    let (record, _, _) = names(&prefix, "tenant/tool", "old-o");
    let tid = format!("{TID:032x}");
    let m = format!(
        "cn{}{tid}{tid}1|1|{}|{}|{live}|{}",
        fp.as_str(),
        NOW - 1000,
        NOW - 5000,
        NOW - 4000
    );
    let _: () = redis::cmd("HSET")
        .arg(&record)
        .arg("m")
        .arg(&m)
        .arg("o")
        .arg(format!("201|d|{body}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    let ClaimAnswer::Replay(o) = store
        .claim(&RecordId::new(scope.clone(), k("old-o")), &fp, &policy, now)
        .await
        .unwrap()
    else {
        panic!("an outcome without the header replays")
    };
    assert_eq!((o.status(), o.body()), (201, body));
    let r = store
        .get(&RecordId::new(scope.clone(), k("old-o")), now)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(r.outcome.as_ref().map(|o| o.body()), Some(body));
    let other = Fingerprint::of("create_ticket", &serde_json::json!({"title": "new"})).unwrap();
    assert!(matches!(
        store
            .claim(
                &RecordId::new(scope.clone(), k("old-o")),
                &other,
                &policy,
                now
            )
            .await
            .unwrap(),
        ClaimAnswer::FingerprintMismatch
    ));

    // A new completion stores the header: state, fingerprint, expires_at in 20 digits.
    let ClaimAnswer::Claimed { token, .. } = store
        .claim(&RecordId::new(scope.clone(), k("new-o")), &fp, &policy, now)
        .await
        .unwrap()
    else {
        panic!("a fresh key claims")
    };
    let outcome = Outcome::definitive(201, &serde_json::json!({"ticket_id": "T-8"})).unwrap();
    assert_eq!(
        store
            .complete(
                &RecordId::new(scope.clone(), k("new-o")),
                token,
                &outcome,
                &policy,
                now
            )
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    let (record, _, _) = names(&prefix, "tenant/tool", "new-o");
    let stored: Vec<u8> = redis::cmd("HGET")
        .arg(&record)
        .arg("o")
        .query_async(&mut conn)
        .await
        .unwrap();
    let expires_at = NOW + 600_000;
    let header = format!("c{}{expires_at:020}", fp.as_str());
    assert_eq!(
        String::from_utf8(stored).unwrap(),
        format!("{header}201|d|{}", outcome.body())
    );
    let ClaimAnswer::Replay(o) = store
        .claim(&RecordId::new(scope.clone(), k("new-o")), &fp, &policy, now)
        .await
        .unwrap()
    else {
        panic!("a completed record replays")
    };
    assert_eq!(o, outcome);
    // At its expiry the header no longer replays: the claim replaces the record.
    let at_expiry = Timestamp::from_millis(expires_at);
    assert!(matches!(
        store
            .claim(
                &RecordId::new(scope.clone(), k("new-o")),
                &fp,
                &policy,
                at_expiry
            )
            .await
            .unwrap(),
        ClaimAnswer::Claimed {
            kind: ClaimKind::ExpiredReplaced,
            ..
        }
    ));
    let _: () = redis::cmd("DEL")
        .arg(&record)
        .query_async(&mut conn)
        .await
        .unwrap();
}

/// A format-1 processing record takes a checkpoint from its old holder: the write rewrites it in
/// format 2 (fields `m` and `c`), keeps its native expiry, and the checkpoint reads back byte for
/// byte; a second one appends; the completion drops them (field `c` gone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn format_1_records_take_checkpoints() {
    let Some((store, prefix, mut conn)) = common::prefixed_store("idem-upgrade-cp").await else {
        return;
    };
    let scope = Scope::new("tenant/tool").unwrap();
    let id = RecordId::new(scope.clone(), IdempotencyKey::new("charging").unwrap());
    let now = Timestamp::from_millis(NOW);
    let policy = Policy::builder()
        .ttl(Duration::from_secs(600))
        .lease(Duration::from_secs(30))
        .build()
        .unwrap();
    write_v1(
        &mut conn,
        &prefix,
        "charging",
        "processing",
        NOW + 10_000,
        NOW + 500_000,
        None,
    )
    .await;
    let token = Token::with_id(1, TID);
    let first = Checkpoint::new("charged", r#"{ "id": "ch_1", "n": "é" }"#, now).unwrap();
    assert_eq!(
        store.checkpoint(&id, token, &first, &policy).await.unwrap(),
        CheckpointAnswer::Saved
    );
    assert_eq!(fields(&mut conn, &prefix, "charging").await, ["c", "m"]);
    assert!(
        pttl(&mut conn, &prefix, "charging").await > 0,
        "native expiry kept"
    );
    let second = Checkpoint::new("emailed", "true", now).unwrap();
    store
        .checkpoint(&id, token, &second, &policy)
        .await
        .unwrap();
    let r = store.get(&id, now).await.unwrap().unwrap();
    assert_eq!(r.checkpoints, vec![first, second]);
    let stale = Token::with_id(1, TID ^ 1);
    let late = Checkpoint::new("late", "1", now).unwrap();
    assert_eq!(
        store.checkpoint(&id, stale, &late, &policy).await.unwrap(),
        CheckpointAnswer::Fenced
    );
    let outcome = Outcome::definitive(200, &serde_json::json!({"ok": true})).unwrap();
    assert_eq!(
        store
            .complete(&id, token, &outcome, &policy, now)
            .await
            .unwrap(),
        CompleteAnswer::Completed
    );
    assert_eq!(fields(&mut conn, &prefix, "charging").await, ["m", "o"]);
    assert!(
        store
            .get(&id, now)
            .await
            .unwrap()
            .unwrap()
            .checkpoints
            .is_empty()
    );
}
