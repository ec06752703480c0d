//! Purging expired records, bucket by bucket, from the expiry index.

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
            while deleted < limit {
                let want = (limit - deleted).min(PURGE_BATCH);
                let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                    .arg(&keys.expiry_index)
                    .arg("-inf")
                    .arg(now.as_millis())
                    .arg("LIMIT")
                    .arg(0)
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
                let n: usize = invocation
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| classify("purge_expired", e))?;
                deleted += n;
                if members.len() < want {
                    break;
                }
            }
        }
        Ok(deleted)
    }
}
