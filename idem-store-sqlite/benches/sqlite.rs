//! idem on SQLite against the raw rusqlite statements it stands for, on the same file and the
//! same settings (WAL, the same `synchronous`, the same table shape and indexes), printed as
//! ratios. Run with:
//!
//! ```text
//! cargo bench -p idem-store-sqlite --bench sqlite
//! ```
//!
//! - claim+complete: idem's `claim` then `complete` of a new key (two commits, through the async
//!   API and tokio's blocking pool) against a raw `INSERT … ON CONFLICT DO NOTHING` then `UPDATE`
//!   (two autocommit statements on a plain connection).
//! - replay: idem's `claim` of a completed key against a raw `SELECT` of the row.
//! - replay (hop): the same, but the raw `SELECT` too runs through `spawn_blocking`, to show how
//!   much of idem's replay time is the hand-off to the blocking pool.
//!
//! Each figure is the median over 5 rounds of the mean latency of sequential calls (one caller);
//! idem and raw calls alternate one by one so both meet the same WAL and checkpoints.

use std::time::{Duration, Instant};

use idem_core::machine::ClaimAnswer;
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, Timestamp,
};
use std::sync::{Arc, Mutex};

use idem_store_sqlite::rusqlite::{Connection, params};
use idem_store_sqlite::{SqliteStore, Synchronous};

const ROUNDS: usize = 5;

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn per_op(total: Duration, n: usize) -> Duration {
    total / u32::try_from(n).unwrap()
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

struct Figures {
    idem_write: Duration,
    raw_write: Duration,
    idem_replay: Duration,
    raw_replay: Duration,
    raw_replay_hop: Duration,
}

fn bench(sync: Synchronous, writes: usize, replays: usize) -> Figures {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.sqlite3");
    let store = SqliteStore::builder(&path)
        .synchronous(sync)
        .open()
        .unwrap();
    store.migrate().unwrap();
    // The raw side: the same table shape and indexes (built by the same migration), the same
    // file and pragmas.
    let raw_store = SqliteStore::builder(&path)
        .synchronous(sync)
        .table_name("raw_records")
        .unwrap()
        .open()
        .unwrap();
    raw_store.migrate().unwrap();
    let raw = Arc::new(Mutex::new(raw_store.connection().unwrap()));

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let policy = Policy::default();
    let fp = Fingerprint::of("create_ticket", &serde_json::json!({"title": "bench"})).unwrap();
    let scope = Scope::new("bench/create_ticket").unwrap();
    let outcome = Outcome::definitive(201, &serde_json::json!({"ticket_id": "T-1"})).unwrap();
    let now = Timestamp::from_millis(1_700_000_000_000);
    let key = |round: usize, i: usize| IdempotencyKey::new(format!("wf-{round}:step-{i}")).unwrap();

    let [
        mut idem_write,
        mut raw_write,
        mut idem_replay,
        mut raw_replay,
        mut raw_replay_hop,
    ] = [(); 5].map(|_| Vec::new());
    let insert_sql = "INSERT INTO raw_records (scope, key, fingerprint, state, token_seq, \
        token_id, attempt, lease_until, created_at, updated_at, expires_at) \
        VALUES (?1, ?2, ?3, 'processing', 1, ?4, 1, ?5, ?6, ?6, ?7) \
        ON CONFLICT (scope, key) DO NOTHING";
    let update_sql = "UPDATE raw_records SET state = 'completed', outcome_status = ?3, \
        outcome_body = ?4, outcome_class = 'definitive', updated_at = ?5 \
        WHERE scope = ?1 AND key = ?2 AND token_seq = 1";
    let raw_write_one = |raw: &Connection, k: &IdempotencyKey| {
        let inserted = raw
            .prepare_cached(insert_sql)
            .unwrap()
            .execute(params![
                scope.as_str(),
                k.as_str(),
                fp.as_str(),
                "0123456789abcdef0123456789abcdef",
                1_700_000_030_000_i64,
                1_700_000_000_000_i64,
                1_700_086_400_000_i64
            ])
            .unwrap();
        assert_eq!(inserted, 1);
        raw.prepare_cached(update_sql)
            .unwrap()
            .execute(params![
                scope.as_str(),
                k.as_str(),
                201,
                outcome.body(),
                1_700_000_000_000_i64
            ])
            .unwrap();
    };
    let raw_replay_one = {
        let (scope, body) = (scope.clone(), outcome.body().to_owned());
        move |raw: &Connection, k: &IdempotencyKey| raw_select(raw, &scope, k, &body)
    };
    // idem and raw alternate call by call, so both meet the same WAL size and checkpoints.
    for round in 0..ROUNDS {
        let [mut iw, mut rw, mut ir, mut rr, mut rh] = [Duration::ZERO; 5];
        rt.block_on(async {
            for i in 0..writes {
                let k = key(round, i);
                let t = Instant::now();
                let id = RecordId::new(scope.clone(), k.clone());
                let ClaimAnswer::Claimed { token, .. } =
                    store.claim(&id, &fp, &policy, now).await.unwrap()
                else {
                    panic!("new key")
                };
                store
                    .complete(&id, token, &outcome, &policy, now)
                    .await
                    .unwrap();
                iw += t.elapsed();
                let t = Instant::now();
                raw_write_one(&raw.lock().unwrap(), &k);
                rw += t.elapsed();
            }
            for i in 0..replays {
                let k = key(round, i % writes);
                let t = Instant::now();
                let answer = store
                    .claim(&RecordId::new(scope.clone(), k.clone()), &fp, &policy, now)
                    .await
                    .unwrap();
                ir += t.elapsed();
                assert!(matches!(answer, ClaimAnswer::Replay(_)));
                let t = Instant::now();
                raw_replay_one(&raw.lock().unwrap(), &k);
                rr += t.elapsed();
                // The same SELECT, handed to tokio's blocking pool as idem does.
                let (raw2, k2) = (raw.clone(), k.clone());
                let t = Instant::now();
                let replay = raw_replay_one.clone();
                tokio::task::spawn_blocking(move || replay(&raw2.lock().unwrap(), &k2))
                    .await
                    .unwrap();
                rh += t.elapsed();
            }
        });
        idem_write.push(per_op(iw, writes));
        raw_write.push(per_op(rw, writes));
        idem_replay.push(per_op(ir, replays));
        raw_replay.push(per_op(rr, replays));
        raw_replay_hop.push(per_op(rh, replays));
    }
    Figures {
        idem_write: median(idem_write),
        raw_write: median(raw_write),
        idem_replay: median(idem_replay),
        raw_replay: median(raw_replay),
        raw_replay_hop: median(raw_replay_hop),
    }
}

/// The raw replay: one `SELECT` of the row.
fn raw_select(raw: &Connection, scope: &Scope, k: &IdempotencyKey, expected: &str) {
    let body: String = raw
        .prepare_cached(
            "SELECT state, fingerprint, outcome_status, outcome_body FROM raw_records \
             WHERE scope = ?1 AND key = ?2",
        )
        .unwrap()
        .query_row(params![scope.as_str(), k.as_str()], |r| r.get(3))
        .unwrap();
    assert_eq!(body, expected);
}

fn main() {
    println!(
        "{:<9} {:<16} {:>10} {:>10} {:>7}",
        "sync", "operation", "idem µs", "raw µs", "ratio"
    );
    for (sync, writes, replays) in [
        (Synchronous::Full, 200, 2_000),
        (Synchronous::Normal, 1_000, 2_000),
    ] {
        let f = bench(sync, writes, replays);
        for (op, idem, raw) in [
            ("claim+complete", f.idem_write, f.raw_write),
            ("replay", f.idem_replay, f.raw_replay),
            ("replay (hop)", f.idem_replay, f.raw_replay_hop),
        ] {
            println!(
                "{:<9} {:<16} {:>10.1} {:>10.1} {:>6.2}x",
                format!("{sync:?}"),
                op,
                micros(idem),
                micros(raw),
                micros(idem) / micros(raw)
            );
        }
    }
}
