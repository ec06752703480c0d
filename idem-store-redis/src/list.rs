//! Listing by walking the per-bucket indexes: the lease index for `processing` records, the
//! expiry index for the others; the records read back decide.

use idem_core::{ListFilter, Record, StoreError, Timestamp};

use crate::RedisStore;
use crate::error::classify;
use crate::keys::{self, BUCKETS, BucketKeys};
use crate::record::{self, Fields};

/// The scope and key of the record an index entry names.
fn names(member: &str) -> Result<(String, String), StoreError> {
    keys::names_of_member(member).ok_or_else(|| {
        StoreError::corrupt(format!(
            "redis index entry {member:?} names no scope and key"
        ))
    })
}

/// How many index entries a list reads per page.
const LIST_PAGE: usize = 256;

impl RedisStore {
    /// [`idem_core::KeyStore::list_in_flight`].
    pub(crate) async fn list_stale(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut conn = self.conn();
        let mut stale = Vec::new();
        if limit == 0 {
            return Ok(stale);
        }
        for bucket in 0..BUCKETS {
            let keys = BucketKeys::new(&self.prefix, bucket);
            let (mut found, mut offset) = (0usize, 0usize);
            loop {
                // The index holds the `processing` records by lease; the records decide.
                let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                    .arg(&keys.lease_index)
                    .arg("-inf")
                    .arg(older_than.as_millis())
                    .arg("LIMIT")
                    .arg(offset)
                    .arg(LIST_PAGE)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| classify("list_in_flight", e))?;
                if members.is_empty() {
                    break;
                }
                let mut pipe = redis::pipe();
                for m in &members {
                    pipe.cmd("HGETALL").arg(keys.record(m));
                }
                let replies: Vec<Fields> = pipe
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| classify("list_in_flight", e))?;
                for (m, fields) in members.iter().zip(replies) {
                    match record::record(fields, || names(m)) {
                        Ok(Some(r)) if r.is_stale_processing(older_than) => {
                            found += 1;
                            stale.push(r);
                        }
                        Ok(_) => {}
                        // One unreadable record must not stop reconciliation of the others.
                        Err(e) => {
                            tracing::warn!(backend = "redis", error = %e, "list_in_flight skipped a corrupt record")
                        }
                    }
                }
                if found >= limit || members.len() < LIST_PAGE {
                    break;
                }
                offset += members.len();
            }
        }
        stale.sort_by(|a, b| {
            (a.lease_until, &a.scope, &a.key).cmp(&(b.lease_until, &b.scope, &b.key))
        });
        stale.truncate(limit);
        Ok(stale)
    }

    /// [`idem_core::KeyStore::list`].
    pub(crate) async fn list_selected(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let mut conn = self.conn();
        let mut found = Vec::new();
        if limit == 0 {
            return Ok(found);
        }
        // A member is `<hex scope>:<hex key>`, so a scope filters members before any record is
        // read. `processing` records are read from the lease index, the others from the expiry
        // index (all of it: an entry's score is at most its record's expiry, which a completion
        // moves later without rewriting the entry; expired records are skipped once read).
        let scope_prefix = filter
            .scope
            .as_ref()
            .map(|s| format!("{}:", keys::hex(s.as_str().as_bytes())));
        for bucket in 0..BUCKETS {
            let bucket_keys = BucketKeys::new(&self.prefix, bucket);
            let (index, min) = match filter.state {
                Some(idem_core::RecordState::Processing) => {
                    (&bucket_keys.lease_index, "-inf".to_owned())
                }
                // From the start: an entry's score may lag behind its record's later expiry.
                _ => (&bucket_keys.expiry_index, "-inf".to_owned()),
            };
            let mut offset = 0usize;
            loop {
                let members: Vec<String> = redis::cmd("ZRANGEBYSCORE")
                    .arg(index)
                    .arg(&min)
                    .arg("+inf")
                    .arg("LIMIT")
                    .arg(offset)
                    .arg(LIST_PAGE)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| classify("list", e))?;
                let wanted: Vec<&String> = members
                    .iter()
                    .filter(|m| scope_prefix.as_ref().is_none_or(|p| m.starts_with(p)))
                    .collect();
                if !wanted.is_empty() {
                    let mut pipe = redis::pipe();
                    for m in &wanted {
                        pipe.cmd("HGETALL").arg(bucket_keys.record(m));
                    }
                    let replies: Vec<Fields> = pipe
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| classify("list", e))?;
                    for (m, fields) in wanted.iter().zip(replies) {
                        match record::record(fields, || names(m)) {
                            Ok(Some(r)) if filter.matches(&r, now) => found.push(r),
                            Ok(_) => {}
                            Err(e) => {
                                tracing::warn!(backend = "redis", error = %e, "list skipped a corrupt record")
                            }
                        }
                    }
                }
                if members.len() < LIST_PAGE {
                    break;
                }
                offset += members.len();
            }
        }
        ListFilter::order_and_truncate(&mut found, limit);
        Ok(found)
    }
}
