//! Listing by walking the per-bucket indexes: the lease index for `processing` records, the
//! expiry index for the others; the records read back decide.

use std::collections::HashSet;

use idem_core::store::ListFilter;
use idem_core::{Record, StoreError, Timestamp};

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
        // index (all of it: an entry is filed at most at its record's expiry, which a completion
        // moves later without moving the entry; expired records are skipped once read). A
        // record can have more than one entry (the slices and the earlier sorted index): each
        // is read once.
        let scope_prefix = filter
            .scope
            .as_ref()
            .map(|s| format!("{}:", keys::hex(s.as_str().as_bytes())));
        let mut page = Page {
            filter,
            now,
            scope_prefix: scope_prefix.as_deref(),
            seen: HashSet::new(),
            found: Vec::new(),
        };
        for bucket in 0..BUCKETS {
            let bucket_keys = BucketKeys::new(&self.prefix, bucket);
            page.seen.clear();
            let processing = filter.state == Some(idem_core::RecordState::Processing);
            let sorted = if processing {
                &bucket_keys.lease_index
            } else {
                &bucket_keys.expiry_index
            };
            let mut offset = 0usize;
            loop {
                let members: Vec<String> = redis::cmd("ZRANGE")
                    .arg(sorted)
                    .arg(offset)
                    .arg(offset + LIST_PAGE - 1)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| classify("list", e))?;
                page.read(&mut conn, &bucket_keys, &members).await?;
                if members.len() < LIST_PAGE {
                    break;
                }
                offset += members.len();
            }
            if processing {
                continue;
            }
            let slices: Vec<u64> = redis::cmd("ZRANGE")
                .arg(&bucket_keys.slices)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .map_err(|e| classify("list", e))?;
            for slice in slices {
                let list = bucket_keys.slice(slice);
                let mut offset = 0usize;
                loop {
                    let members: Vec<String> = redis::cmd("LRANGE")
                        .arg(&list)
                        .arg(offset)
                        .arg(offset + LIST_PAGE - 1)
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| classify("list", e))?;
                    page.read(&mut conn, &bucket_keys, &members).await?;
                    if members.len() < LIST_PAGE {
                        break;
                    }
                    offset += members.len();
                }
            }
        }
        found = page.found;
        ListFilter::order_and_truncate(&mut found, limit);
        Ok(found)
    }
}

/// What a listing gathers as it reads pages of index entries.
struct Page<'a> {
    filter: &'a ListFilter,
    now: Timestamp,
    scope_prefix: Option<&'a str>,
    /// The members of the current bucket read so far.
    seen: HashSet<String>,
    found: Vec<Record>,
}

impl Page<'_> {
    /// Reads the records of `members` (entries of bucket `keys`) not read yet, keeping those the
    /// filter selects.
    async fn read(
        &mut self,
        conn: &mut crate::conn::Conn,
        keys: &BucketKeys,
        members: &[String],
    ) -> Result<(), StoreError> {
        let wanted: Vec<&String> = members
            .iter()
            .filter(|m| self.scope_prefix.is_none_or(|p| m.starts_with(p)))
            .filter(|m| self.seen.insert((*m).clone()))
            .collect();
        if wanted.is_empty() {
            return Ok(());
        }
        let mut pipe = redis::pipe();
        for m in &wanted {
            pipe.cmd("HGETALL").arg(keys.record(m));
        }
        let replies: Vec<Fields> = pipe
            .query_async(conn)
            .await
            .map_err(|e| classify("list", e))?;
        for (m, fields) in wanted.iter().zip(replies) {
            match record::record(fields, || names(m)) {
                Ok(Some(r)) if self.filter.matches(&r, self.now) => self.found.push(r),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(backend = "redis", error = %e, "list skipped a corrupt record")
                }
            }
        }
        Ok(())
    }
}
