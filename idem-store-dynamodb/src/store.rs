//! [`KeyStore`] and [`CheckpointStore`] for [`DynamoStore`]: a claim is one conditional write (a
//! retry or a takeover, a compare-and-set after it); completion, release and checkpoints are one
//! fenced update each; extend is a compare-and-set on the record read.

use std::collections::HashMap;
use std::time::Duration;

use aws_sdk_dynamodb::types::AttributeValue;
use idem_core::machine::{
    self, CheckpointAnswer, ClaimAnswer, ClaimRequest, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::store::{CheckpointStore, ListFilter};
use idem_core::{
    Checkpoint, Fingerprint, KeyStore, Outcome, Policy, Record, RecordId, RecordState, StoreError,
    Timestamp, Token, async_trait,
};

use crate::DynamoStore;
use crate::item::{self, n, s, ts};
use crate::ops::{Fenced, FirstClaim, Update, claim_rule};
use crate::schema::{CHECKPOINT_ROOM, INLINE_OUTCOME_BYTES};

#[async_trait]
impl KeyStore for DynamoStore {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let req = ClaimRequest::new(id, fingerprint);
        let inner = &self.inner;
        match inner
            .claim_first(id, fingerprint, req.token_id, policy, now)
            .await?
        {
            FirstClaim::Claimed(answer) => Ok(answer),
            // Replay, in flight and mismatch are decided on the returned record without
            // another request; a retry or a takeover writes it over with a compare-and-set.
            FirstClaim::Found(found) => {
                inner
                    .rewrite("claim", found, claim_rule(req, now, policy))
                    .await
            }
        }
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        machine::check_outcome_size(outcome, policy)?;
        let state = machine::completed_state(outcome, policy);
        let expires_at = now + policy.ttl();
        let pk = item::pk_of(id);
        let mut values = HashMap::from([
            (":st".into(), s(state.as_str())),
            (":ost".into(), n(outcome.status())),
            (":ocls".into(), s(outcome.class().as_str())),
            (":exp".into(), ts(expires_at)),
            (":ttl".into(), item::ttl(expires_at)),
            (":gs".into(), item::state_partition(&pk, state)),
        ]);
        let mut set = String::from(
            "#st = :st, #ost = :ost, #ocls = :ocls, #upd = :now, #exp = :exp, #ttl = :ttl, \
             #gs = :gs",
        );
        let mut remove = Vec::new();
        if outcome.size() <= INLINE_OUTCOME_BYTES {
            set.push_str(", #obody = :obody");
            values.insert(":obody".into(), s(outcome.body()));
            remove.extend(["#ochunks", "#owid"]);
        } else {
            // Written before the record names them: the update below is the commit.
            let write = item::write_id();
            let count = self
                .inner
                .put_chunks(&pk, &write, outcome.body(), expires_at)
                .await?;
            set.push_str(", #ochunks = :ochunks, #owid = :owid");
            values.insert(":ochunks".into(), n(count));
            values.insert(":owid".into(), s(write));
            remove.push("#obody");
        }
        // A completed operation's checkpoints end with it; a retryable outcome keeps them.
        if state == RecordState::Completed {
            remove.extend(["#cps", "#cpb"]);
        }
        let update = Update {
            op: "complete",
            set: &set,
            remove: &remove.join(", "),
            condition: "",
            values,
        };
        Ok(
            match (self.inner.fenced(id, token, now, update).await?, state) {
                (Fenced::Refused(_), _) => CompleteAnswer::Fenced,
                (Fenced::Written, RecordState::Completed) => CompleteAnswer::Completed,
                (Fenced::Written, _) => CompleteAnswer::MarkedRetryable,
            },
        )
    }

    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        let state = RecordState::FailedRetryable;
        let update = Update {
            op: "release",
            set: "#st = :st, #upd = :now, #gs = :gs",
            remove: "#ost, #obody, #ocls, #ochunks, #owid",
            condition: "",
            values: HashMap::from([
                (":st".into(), s(state.as_str())),
                (":gs".into(), item::state_partition(&item::pk_of(id), state)),
            ]),
        };
        Ok(match self.inner.fenced(id, token, now, update).await? {
            Fenced::Written => ReleaseAnswer::Released,
            Fenced::Refused(_) => ReleaseAnswer::Fenced,
        })
    }

    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        // Refused before anything is read.
        machine::check_lease(lease)?;
        // The later of two deadlines and the expiry that follows it are not expressions
        // DynamoDB can compute: read, decide, compare-and-set.
        let found = self.inner.read(id).await?;
        self.inner
            .rewrite("extend", found, |found| {
                Ok(machine::extend(found, token, lease, now)?)
            })
            .await
    }

    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        Ok(self
            .inner
            .read(id)
            .await?
            .map(|stored| stored.record)
            .filter(|r| !r.is_expired(now)))
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list_in_flight(older_than, limit).await
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.inner.list(filter, now, limit).await
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.inner.purge_expired(now, limit).await
    }

    fn backend(&self) -> &'static str {
        "dynamodb"
    }

    fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        Some(self)
    }
}

#[async_trait]
impl CheckpointStore for DynamoStore {
    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError> {
        machine::check_checkpoint_size(checkpoint, policy)?;
        let element = item::checkpoint_element(checkpoint);
        // What the element adds to the checkpoint's own size (its JSON wrapping).
        let overhead = element.len().saturating_sub(checkpoint.size());
        let Some(room) = CHECKPOINT_ROOM.checked_sub(element.len()) else {
            return Err(too_large(checkpoint, CHECKPOINT_ROOM - overhead));
        };
        let len = element.len();
        let update = Update {
            op: "checkpoint",
            set: "#cps = list_append(if_not_exists(#cps, :empty), :item), \
                  #cpb = if_not_exists(#cpb, :zero) + :len, #upd = :now",
            remove: "",
            // The checkpoints of one record stay within their room, so every write of the item
            // fits.
            condition: " AND (attribute_not_exists(#cpb) OR #cpb <= :room)",
            values: HashMap::from([
                (":empty".into(), AttributeValue::L(Vec::new())),
                (":item".into(), AttributeValue::L(vec![s(element)])),
                (":zero".into(), n(0)),
                (":len".into(), n(len)),
                (":room".into(), n(room)),
            ]),
        };
        let now = checkpoint.saved_at();
        match self.inner.fenced(id, token, now, update).await? {
            Fenced::Written => Ok(CheckpointAnswer::Saved),
            Fenced::Refused(found) => {
                let held = found.as_ref().is_some_and(|f| {
                    let r = &f.record;
                    !r.is_expired(now) && r.state == RecordState::Processing && r.token == token
                });
                if !held {
                    return Ok(CheckpointAnswer::Fenced);
                }
                // The holder's record has no room left for it.
                let used: usize = found
                    .iter()
                    .flat_map(|f| &f.record.checkpoints)
                    .map(|c| item::checkpoint_element(c).len())
                    .sum();
                let left = CHECKPOINT_ROOM.saturating_sub(used);
                Err(too_large(checkpoint, left.saturating_sub(overhead)))
            }
        }
    }
}

/// A checkpoint refused for the store's own room (`limit`: what is left, in the units of
/// [`Checkpoint::size`]).
fn too_large(checkpoint: &Checkpoint, limit: usize) -> StoreError {
    machine::CheckpointTooLarge {
        size: checkpoint.size(),
        limit,
    }
    .into()
}
