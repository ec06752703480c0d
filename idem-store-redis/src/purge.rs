//! Purging expired records, bucket by bucket, from the index.
//!
//! The index scores a `processing` record by its lease, so the range `-inf..now` also holds the
//! live records whose lease has passed and that nobody reconciled yet: the script leaves them
//! (`list_in_flight` must still find them) and the walk skips them with an offset. A call's cost
//! is proportional to what it deletes plus that unreconciled stale backlog, never more than the
//! bucket's index.

use idem_core::{StoreError, Timestamp};

use crate::RedisStore;
use crate::error::classify;
use crate::keys::{BUCKETS, BucketKeys};
use crate::scripts::PURGE_SCRIPT;

/// How many index entries one `purge_expired` script handles at most.
const PURGE_BATCH: usize = 256;

impl RedisStore {
    /// [`idem_core::KeyStore::purge_expired`].
    pub(crate) async fn purge(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        let mut conn = self.conn();
        let mut deleted = 0usize;
        for bucket in 0..BUCKETS {
            if deleted >= limit {
                break;
            }
            let keys = BucketKeys::new(&self.prefix, bucket);
            // Entries left in the range (stale `processing` records): skipped.
            let mut offset = 0usize;
            while deleted < limit {
                let want = (limit - deleted).min(PURGE_BATCH);
                let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                    .arg(&keys.expiry_index)
                    .arg("-inf")
                    .arg(now.as_millis())
                    .arg("LIMIT")
                    .arg(offset)
                    .arg(want)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| classify("purge_expired", e))?;
                if members.is_empty() {
                    break;
                }
                // The script re-checks each candidate against `now`: the index was read outside it.
                let mut invocation = PURGE_SCRIPT.prepare_invoke();
                invocation.key(&keys.expiry_index).key(&keys.lease_index);
                for m in &members {
                    invocation.key(keys.record(m));
                }
                invocation.arg(now.as_millis());
                for m in &members {
                    invocation.arg(m);
                }
                let (n, kept): (usize, usize) = invocation
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| classify("purge_expired", e))?;
                deleted += n;
                offset += kept;
                if members.len() < want {
                    break;
                }
            }
        }
        Ok(deleted)
    }
}
