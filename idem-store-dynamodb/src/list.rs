//! `list`, `list_in_flight` and `purge_expired`, served by the table's two global secondary
//! indexes (never a scan): `by_state` (partition `{state}#{shard}`, sorted by `upd`) and
//! `by_expiry` (partition `x{shard}`, sorted by `exp`). Each reader queries every shard.
//!
//! DynamoDB keeps a global secondary index eventually consistent (usually within a second): a
//! record written a moment ago may be missing from these answers, or shown as it was. Nothing
//! decides on them without the record's own conditions: a purge deletes only what is still
//! expired, and a reconciler acts through fenced writes.

use std::collections::HashMap;

use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::store::ListFilter;
use idem_core::{Record, RecordState, StoreError, Timestamp};

use crate::error::classify;
use crate::expr::names;
use crate::item::{self, Item, s, ts};
use crate::ops::Inner;
use crate::schema::{self, BY_EXPIRY, BY_STATE, PK, SHARDS, attr};

/// One query of the `by_state` index.
struct StateQuery<'a> {
    state: RecordState,
    shard: u32,
    /// `upd <= this` (a key condition).
    updated_before: Option<Timestamp>,
    /// A filter the service applies after reading (and its values).
    filter: &'a str,
    values: &'a HashMap<String, AttributeValue>,
}

impl Inner {
    /// The records a [`StateQuery`] selects, in `upd` order, reading pages until `enough` says
    /// it has enough (given the records so far and the last `upd` read) or the partition ends.
    async fn query_state(
        &self,
        q: &StateQuery<'_>,
        enough: impl Fn(&[Record], i64) -> bool,
    ) -> Result<Vec<Record>, StoreError> {
        let mut key = String::from("#gs = :gs");
        let mut values = q.values.clone();
        values.insert(
            ":gs".into(),
            s(schema::state_partition(q.state.as_str(), q.shard)),
        );
        if let Some(t) = q.updated_before {
            key.push_str(" AND #upd <= :ub");
            values.insert(":ub".into(), ts(t));
        }
        let mut found = Vec::new();
        let mut start: Option<Item> = None;
        loop {
            let out = self
                .client
                .query()
                .table_name(self.table.as_str())
                .index_name(BY_STATE)
                .key_condition_expression(&key)
                .set_filter_expression((!q.filter.is_empty()).then(|| q.filter.to_owned()))
                .set_expression_attribute_names(Some(names(&[&key, q.filter])))
                .set_expression_attribute_values(Some(values.clone()))
                .set_exclusive_start_key(start.take())
                .send()
                .await
                .map_err(|e| classify("list", self.table.as_str(), e))?;
            for i in out.items() {
                found.push(self.stored(i).await?.record);
            }
            start = out.last_evaluated_key;
            let last = match &start {
                Some(k) => item::number(k, attr::UPDATED)?,
                None => return Ok(found),
            };
            if enough(&found, last) {
                return Ok(found);
            }
        }
    }

    /// [`idem_core::KeyStore::list`]: per state selected and shard, the first `limit` matching
    /// records in `upd` order (and any that tie with the last), merged and ordered.
    pub(crate) async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let mut text = String::from("#exp > :now");
        let mut values = HashMap::from([(":now".into(), ts(now))]);
        if let Some(scope) = &filter.scope {
            text.push_str(" AND #sc = :sc");
            values.insert(":sc".into(), s(scope.as_str()));
        }
        let states = match filter.state {
            Some(state) => vec![state],
            None => RecordState::ALL.to_vec(),
        };
        let mut all = Vec::new();
        for state in states {
            for shard in 0..SHARDS {
                let q = StateQuery {
                    state,
                    shard,
                    updated_before: filter.updated_before,
                    filter: &text,
                    values: &values,
                };
                // Enough once `limit` are found and the next page starts past the last of them.
                let enough = |found: &[Record], next_upd: i64| {
                    found.len() >= limit
                        && found.get(limit - 1).is_some_and(|r| {
                            idem_core::store::columns::timestamp_to_column(r.updated_at) < next_upd
                        })
                };
                all.extend(self.query_state(&q, enough).await?);
            }
        }
        all.retain(|r| filter.matches(r, now));
        ListFilter::order_and_truncate(&mut all, limit);
        Ok(all)
    }

    /// [`idem_core::KeyStore::list_in_flight`]: every `processing` record (the index holds each
    /// in its state's partitions), those stale at `older_than`, earliest lease first.
    pub(crate) async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let text = "#lease <= :t AND #exp > :t";
        let values = HashMap::from([(":t".into(), ts(older_than))]);
        let mut all = Vec::new();
        for shard in 0..SHARDS {
            let q = StateQuery {
                state: RecordState::Processing,
                shard,
                updated_before: None,
                filter: text,
                values: &values,
            };
            all.extend(self.query_state(&q, |_, _| false).await?);
        }
        all.retain(|r| r.is_stale_processing(older_than));
        all.sort_by(|a, b| {
            (a.lease_until, &a.scope, &a.key).cmp(&(b.lease_until, &b.scope, &b.key))
        });
        all.truncate(limit);
        Ok(all)
    }

    /// [`idem_core::KeyStore::purge_expired`]: up to `limit` records expired at `now`, found
    /// through `by_expiry` shard by shard and each deleted only if still expired; then up to
    /// `limit` expired outcome chunks, which are not records and are not counted.
    pub(crate) async fn purge_expired(
        &self,
        now: Timestamp,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let deleted = self
            .purge_partitions(schema::expiry_partition, now, limit)
            .await?;
        self.purge_partitions(schema::chunk_partition, now, limit)
            .await?;
        Ok(deleted)
    }

    /// Deletes up to `limit` items expired at `now` in the `by_expiry` partitions `partition`
    /// names, one per shard; how many.
    async fn purge_partitions(
        &self,
        partition: fn(u32) -> String,
        now: Timestamp,
        limit: usize,
    ) -> Result<usize, StoreError> {
        let key = "#gx = :gx AND #exp <= :now";
        let mut deleted = 0;
        for shard in 0..SHARDS {
            let mut start: Option<Item> = None;
            loop {
                if deleted >= limit {
                    return Ok(deleted);
                }
                let page = i32::try_from(limit - deleted).unwrap_or(i32::MAX).min(1000);
                let out = self
                    .client
                    .query()
                    .table_name(self.table.as_str())
                    .index_name(BY_EXPIRY)
                    .key_condition_expression(key)
                    .set_expression_attribute_names(Some(names(&[key])))
                    .expression_attribute_values(":gx", s(partition(shard)))
                    .expression_attribute_values(":now", ts(now))
                    .limit(page)
                    .set_exclusive_start_key(start.take())
                    .send()
                    .await
                    .map_err(|e| classify("purge", self.table.as_str(), e))?;
                for i in out.items() {
                    let Some(AttributeValue::S(pk)) = i.get(PK) else {
                        return Err(crate::error::corrupt("an index entry has no pk"));
                    };
                    if deleted < limit && self.delete_expired(pk.clone(), now).await? {
                        deleted += 1;
                    }
                }
                start = out.last_evaluated_key;
                if start.is_none() {
                    break;
                }
            }
        }
        Ok(deleted)
    }
}
