//! Group commit: writes that queue for the file's write turn share one `IMMEDIATE` transaction
//! and one commit.
//!
//! SQLite commits one transaction at a time, and with `synchronous = FULL` each commit waits for
//! the disk. A write asks for its turn at the file's write lock ([`crate::pool::WriteLock`]) with
//! its work queued on its handle; whoever gets the turn first runs everything queued (up to
//! [`MAX_BATCH`]) in one transaction, each write in a savepoint of its own (a write that fails
//! rolls back only itself), commits once, then answers each caller. Only then is the turn given
//! back: a write is answered after its commit, never before (a claim is durable before its
//! operation runs, contract §2). A lone write runs at once, alone: nothing waits for company.
//!
//! A write whose caller went away before a batch took it is not run (as if cancelled before its
//! turn); once taken, it runs and commits like any other (contract §2 on cancellation).

use idem_core::StoreError;
use rusqlite::{Connection, TransactionBehavior};
use tokio::sync::oneshot;

use crate::SqliteStore;
use crate::error::at;
use crate::pool::{Inner, Job, Queue, WriteTurn};

/// The most writes one transaction takes; the rest wait for the next.
pub(crate) const MAX_BATCH: usize = 64;

impl Queue {
    fn push(&self, job: Job) {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(job);
    }

    fn take(&self) -> Vec<Job> {
        let mut queue = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let n = queue.len().min(MAX_BATCH);
        queue.drain(..n).collect()
    }
}

impl SqliteStore {
    /// Runs the write `f` in a transaction shared with the writes queued with it, and answers
    /// once that transaction has committed. `f` must not commit, roll back or open a
    /// transaction; its writes are undone if it returns an error.
    pub(crate) async fn run_batched<T, F>(&self, f: F) -> Result<T, StoreError>
    where
        F: FnOnce(&Inner, &Connection) -> Result<T, StoreError> + Send + 'static,
        T: Send + 'static,
    {
        let (tx, mut rx) = oneshot::channel::<Result<T, StoreError>>();
        self.inner.batch.push(Box::new(move |inner, on, poisoned| {
            let (conn, savepoint) = match on {
                _ if tx.is_closed() => return Box::new(|_| {}), // caller gone first: not run
                Err(e) => {
                    let _ = tx.send(Err(shared(e)));
                    return Box::new(|_| {});
                }
                Ok(on) => on,
            };
            let result = if savepoint {
                match in_savepoint(conn, || f(inner, conn)) {
                    Ok(result) => result,
                    Err(broken) => {
                        let result = Err(shared(&broken));
                        *poisoned = Some(broken);
                        result
                    }
                }
            } else {
                let result = f(inner, conn);
                if let Err(e) = &result {
                    // Alone in its transaction: its failure rolls the transaction back.
                    *poisoned = Some(shared(e));
                }
                result
            };
            Box::new(move |committed| {
                let _ = tx.send(match (committed, result) {
                    (Ok(()), result) | (Err(_), result @ Err(_)) => result,
                    (Err(e), Ok(_)) => Err(shared(e)),
                });
            })
        }));
        loop {
            tokio::select! {
                biased;
                answer = &mut rx => return answer.unwrap_or_else(|_| Err(StoreError::unavailable(
                    "sqlite: the write's batch ended without an answer",
                    "its blocking task was cancelled",
                ))),
                turn = self.inner.writer.clone().lock_owned() => {
                    let jobs = self.inner.batch.take();
                    if jobs.is_empty() {
                        continue; // a batch before this turn answered ours
                    }
                    // Answers are sent from the blocking task, whose result only says whether
                    // it ran (a lost task drops the answers: each caller is told above).
                    self.run(move |inner, conn| {
                        inner.run_batch(conn, &turn, jobs);
                        Ok(())
                    })
                    .await?;
                }
            }
        }
    }
}

impl Inner {
    /// Runs `jobs` in one `IMMEDIATE` transaction, commits, then answers each; `_turn` proves
    /// the write's turn at the file's write lock, held until every caller is answered.
    fn run_batch(&self, conn: &Connection, _turn: &WriteTurn, jobs: Vec<Job>) {
        let savepoints = jobs.len() > 1;
        let mut poisoned = None;
        let tx = match rusqlite::Transaction::new_unchecked(conn, TransactionBehavior::Immediate) {
            Ok(tx) => tx,
            Err(e) => {
                let e = at("begin immediate")(e);
                for job in jobs {
                    drop(job(self, Err(&e), &mut poisoned));
                }
                return;
            }
        };
        let mut answers = Vec::with_capacity(jobs.len());
        for job in jobs {
            answers.push(job(self, Ok((&tx, savepoints)), &mut poisoned));
        }
        // Dropping the transaction rolls it back.
        let committed = match poisoned {
            Some(broken) => Err(broken),
            None => tx.commit().map_err(at("commit")),
        };
        for answer in answers {
            answer(&committed);
        }
    }
}

/// `f` in a savepoint: released if it succeeds, rolled back to if it fails. The outer error: the
/// savepoint could not be opened or closed, and the transaction is not to be trusted.
fn in_savepoint<T>(
    conn: &Connection,
    f: impl FnOnce() -> Result<T, StoreError>,
) -> Result<Result<T, StoreError>, StoreError> {
    conn.execute_batch("SAVEPOINT idem_write")
        .map_err(at("savepoint"))?;
    let result = f();
    let end = if result.is_ok() {
        "RELEASE idem_write"
    } else {
        "ROLLBACK TO idem_write; RELEASE idem_write"
    };
    conn.execute_batch(end).map_err(at("savepoint end"))?;
    Ok(result)
}

/// The batch's commit error, for each of its callers (a [`StoreError`] has one owner).
fn shared(e: &StoreError) -> StoreError {
    let text = e.to_string();
    match e {
        StoreError::Unavailable { .. } => StoreError::unavailable(text.clone(), text),
        StoreError::Corrupt { .. } => StoreError::corrupt(text),
        _ => StoreError::backend(text.clone(), text),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use idem_core::machine::ClaimAnswer;
    use idem_core::{Fingerprint, IdempotencyKey, KeyStore, Policy, RecordId, Scope, Timestamp};

    use crate::SqliteStore;

    const NOW: Timestamp = Timestamp::from_millis(1_700_000_000_000);

    fn policy() -> Policy {
        Policy::builder()
            .lease(Duration::from_secs(30))
            .ttl(Duration::from_secs(3600))
            .build()
            .unwrap()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_write_whose_caller_left_before_its_batch_is_not_run() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(dir.path().join("idem.sqlite3")).unwrap();
        store.migrate().unwrap();
        let scope = Scope::new("tenant/tool").unwrap();
        let (left, next) = (
            IdempotencyKey::new("left").unwrap(),
            IdempotencyKey::new("next").unwrap(),
        );
        let fp = Fingerprint::of("tool", &serde_json::json!({})).unwrap();

        // Another write holds the file's turn: the claim queues, and its caller gives up.
        let turn = store.inner.writer.clone().lock_owned().await;
        let (left, next) = (
            RecordId::new(scope.clone(), left),
            RecordId::new(scope.clone(), next),
        );
        let claim = {
            let (store, left, fp) = (store.clone(), left.clone(), fp.clone());
            tokio::spawn(async move { store.claim(&left, &fp, &policy(), NOW).await })
        };
        while store.inner.batch.0.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        claim.abort();
        assert!(
            claim.await.unwrap_err().is_cancelled(),
            "the claim ran while the turn was held"
        );
        assert_eq!(store.inner.batch.0.lock().unwrap().len(), 1);
        drop(turn);

        // The next queued write (a release: a claim that finds the turn free goes alone) takes
        // the queue: the abandoned claim is dropped, not run.
        let ClaimAnswer::Claimed { token, .. } =
            store.claim(&next, &fp, &policy(), NOW).await.unwrap()
        else {
            panic!("not claimed")
        };
        store.release(&next, token, NOW).await.unwrap();
        assert!(store.inner.batch.0.lock().unwrap().is_empty());
        assert!(store.get(&left, NOW).await.unwrap().is_none());
        assert!(store.get(&next, NOW).await.unwrap().is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_queued_behind_one_turn_commit_together_and_each_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        // One connection, so every write runs where the commit counter below is installed.
        let store = SqliteStore::builder(dir.path().join("idem.sqlite3"))
            .max_connections(1)
            .open()
            .unwrap();
        store.migrate().unwrap();
        let commits = Arc::new(AtomicUsize::new(0));
        let counter = commits.clone();
        store.inner.idle.lock().unwrap()[0]
            .commit_hook(Some(move || {
                counter.fetch_add(1, Ordering::SeqCst);
                false // let it commit
            }))
            .unwrap();
        let scope = Scope::new("tenant/tool").unwrap();
        let fp = Fingerprint::of("tool", &serde_json::json!({})).unwrap();
        let n = super::MAX_BATCH + 6;

        // Another write holds the turn while every claim queues.
        let turn = store.inner.writer.clone().lock_owned().await;
        let claims: Vec<_> = (0..n)
            .map(|i| {
                let (store, scope, fp) = (store.clone(), scope.clone(), fp.clone());
                tokio::spawn(async move {
                    let id = RecordId::new(scope, IdempotencyKey::new(format!("k{i}")).unwrap());
                    store.claim(&id, &fp, &policy(), NOW).await
                })
            })
            .collect();
        while store.inner.batch.0.lock().unwrap().len() < n {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(turn);
        for claim in claims {
            assert!(matches!(
                claim.await.unwrap().unwrap(),
                ClaimAnswer::Claimed { .. }
            ));
        }
        // Two commits (MAX_BATCH claims, then the rest), and every claim is in the file.
        assert_eq!(commits.load(Ordering::SeqCst), 2);
        for i in 0..n {
            let id = RecordId::new(scope.clone(), IdempotencyKey::new(format!("k{i}")).unwrap());
            assert!(store.get(&id, NOW).await.unwrap().is_some());
        }
    }
}
