//! Purging expired records, bucket by bucket, from the expiry index: the slices that have begun,
//! oldest first, then what is left of the earlier versions' sorted index.

use idem_core::{StoreError, Timestamp};

use crate::RedisStore;
use crate::error::classify;
use crate::keys::{BUCKETS, BucketKeys, slice_of};
use crate::purge_scripts::{PURGE_SCRIPT, PURGE_SLICE_SCRIPT};

/// How many index entries one `purge_expired` script handles at most. A script blocks the
/// server while it runs (about 8 µs an entry: a read and three deletes), so this bounds how long
/// a claim can wait behind a purge: 16 entries keep each step near the cost of a claim, where 256
/// held claims up for about 2 ms (`idem bench --purge`: claim p99 24× idle with 256 on a purge
/// of 20 000 records). More round trips per purged record is the price, paid by the purge job,
/// not the callers.
const PURGE_BATCH: usize = 16;

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
            deleted += self.purge_slices(&keys, now, limit - deleted).await?;
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

    /// Purges bucket `keys`' expiry slices that have begun by `now`, oldest first, deleting at
    /// most `limit` records.
    async fn purge_slices(
        &self,
        keys: &BucketKeys,
        now: Timestamp,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let mut conn = self.conn();
        let slices: Vec<u64> = redis::cmd("ZRANGEBYSCORE")
            .arg(&keys.slices)
            .arg("-inf")
            .arg(slice_of(now.as_millis()))
            .query_async(&mut conn)
            .await
            .map_err(|e| classify("purge_expired", e))?;
        let mut deleted = 0usize;
        for slice in slices {
            let list = keys.slice(slice);
            // Live entries go to the tail of their slice, which may be this one: take no more
            // than the list held, so each entry is looked at once.
            let mut left: usize = redis::cmd("LLEN")
                .arg(&list)
                .query_async(&mut conn)
                .await
                .map_err(|e| classify("purge_expired", e))?;
            if left == 0 {
                // Registered without a list: a purge emptied it between the two (or an
                // interrupted script); one more call unregisters it.
                left = 1;
            }
            while left > 0 && deleted < limit {
                let (d, taken): (usize, usize) = PURGE_SLICE_SCRIPT
                    .key(&list)
                    .key(&keys.slices)
                    .key(&keys.lease_index)
                    .arg(now.as_millis())
                    .arg(left.min(PURGE_BATCH))
                    .arg(limit - deleted)
                    .arg(slice)
                    .arg(&keys.record_prefix)
                    .arg(&keys.slice_prefix)
                    .invoke_async(&mut conn)
                    .await
                    .map_err(|e| classify("purge_expired", e))?;
                deleted += d;
                if taken == 0 {
                    break;
                }
                left = left.saturating_sub(taken);
            }
            if deleted >= limit {
                break;
            }
        }
        Ok(deleted)
    }
}
