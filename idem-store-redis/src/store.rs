//! [`KeyStore`] for [`RedisStore`]: each write is one Lua script (see `scripts.rs`) deciding by
//! the rules of [`idem_core::machine`] on the server; the lists and purge walk the indexes.

use std::time::Duration;

use idem_core::machine::{
    self, CheckpointAnswer, ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::store::{CheckpointStore, ListFilter};
use idem_core::wait::Timer;
use idem_core::{
    Checkpoint, Clock, Fingerprint, KeyStore, Outcome, Policy, Record, RecordId, RecordState,
    StalePolicy, StoreError, Timestamp, Token, async_trait,
};
use redis::{Cmd, Value};

use crate::command::{ClaimSettings, Hex32, NewMeta, PackedOutcome, evalsha, evalsha_filing, run};
use crate::error::classify;
use crate::keys::RecordKeys;
use crate::record::{self, Fields};
use crate::reply::parse_claim;
use crate::scripts::{CHECKPOINT_SCRIPT, EXTEND_SCRIPT, publishing};
use crate::{RedisStore, millis};

impl RedisStore {
    async fn release_script(
        &self,
        keys: &RecordKeys,
        token: Token,
        now: Timestamp,
        nonce: Hex32,
    ) -> Result<String, StoreError> {
        let script = &publishing(self.is_cluster()).release;
        let mut cmd = evalsha(script, keys);
        cmd.arg(nonce)
            .arg(now.as_millis())
            .arg(token.seq)
            .arg(Hex32(token.id));
        run(script, &cmd, &mut self.conn(), "release").await
    }

    /// Gives back a claim whose confirmation failed, without waiting for replicas: if this
    /// release is lost too, the claim stays `processing` for its lease and reconciliation,
    /// which is safe (the operation never ran).
    async fn release_unconfirmed(
        &self,
        keys: &RecordKeys,
        token: Token,
        now: Timestamp,
    ) -> Result<String, StoreError> {
        self.release_script(keys, token, now, Hex32::random()).await
    }

    /// Appends the native expiry argument: milliseconds, or `''` for none.
    fn native_ttl_arg(&self, cmd: &mut Cmd, ttl: Duration) {
        match self.native_ttl(ttl) {
            Some(ms) => cmd.arg(ms),
            None => cmd.arg(""),
        };
    }
}

#[async_trait]
impl KeyStore for RedisStore {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let token_id = Hex32::random();
        let takeover = match policy.stale() {
            StalePolicy::Takeover => "1",
            StalePolicy::Reconcile => "0",
        };
        let expires_at = (now + policy.ttl()).as_millis();
        let script = &publishing(self.is_cluster()).claim;
        let mut cmd = evalsha_filing(script, &keys, expires_at);
        cmd.arg(fingerprint.as_str())
            .arg(now.as_millis())
            .arg(NewMeta {
                fingerprint,
                token_id,
                lease_until: (now + policy.lease()).as_millis(),
                now: now.as_millis(),
                expires_at,
            })
            .arg(ClaimSettings {
                native_ttl: self.native_ttl(policy.ttl()),
                lease: millis(policy.lease()).max(1),
                takeover,
            });
        let reply: Value = run(script, &cmd, &mut self.conn(), "claim").await?;
        let answer = parse_claim(reply, token_id.0)?;
        if let ClaimAnswer::Claimed { token, .. } = &answer
            && self.wait.is_some()
            && let Err(e) = self.confirm("claim", &keys.record, &token_id.text()).await
        {
            // Nothing ran on this claim: give it back (best effort, unconfirmed) so the next
            // retry claims at once instead of waiting for the lease.
            let _ = self.release_unconfirmed(&keys, *token, now).await;
            return Err(e);
        }
        Ok(answer)
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
        let keys = RecordKeys::new(&self.prefix, id);
        let state = match machine::completed_state(outcome, policy) {
            RecordState::Completed => "c",
            _ => "f",
        };
        let nonce = Hex32::random();
        let expires_at = (now + policy.ttl()).as_millis();
        let script = &publishing(self.is_cluster()).complete;
        let mut cmd = evalsha_filing(script, &keys, expires_at);
        cmd.arg(nonce)
            .arg(now.as_millis())
            .arg(token.seq)
            .arg(Hex32(token.id))
            .arg(state)
            .arg(PackedOutcome {
                outcome,
                expires_at,
            })
            .arg(expires_at);
        self.native_ttl_arg(&mut cmd, policy.ttl());
        let reply: Value = run(script, &cmd, &mut self.conn(), "complete").await?;
        let answer = match &reply {
            Value::BulkString(b) if b == b"completed" => CompleteAnswer::Completed,
            Value::BulkString(b) if b == b"marked_retryable" => CompleteAnswer::MarkedRetryable,
            Value::BulkString(b) if b == b"fenced" => return Ok(CompleteAnswer::Fenced),
            other => {
                return Err(StoreError::corrupt(format!(
                    "redis complete script: unknown answer {other:?}"
                )));
            }
        };
        if self.wait.is_some() {
            self.confirm("complete", &keys.record, &nonce.text())
                .await?;
        }
        Ok(answer)
    }

    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let nonce = Hex32::random();
        let reply = self.release_script(&keys, token, now, nonce).await?;
        if reply == "released" {
            self.confirm("release", &keys.record, &nonce.text()).await?;
        }
        match reply.as_str() {
            "released" => Ok(ReleaseAnswer::Released),
            "fenced" => Ok(ReleaseAnswer::Fenced),
            other => Err(StoreError::corrupt(format!(
                "redis release script: unknown answer {other:?}"
            ))),
        }
    }

    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        machine::check_lease(lease)?;
        let keys = RecordKeys::new(&self.prefix, id);
        let lease_until = now + lease;
        let nonce = Hex32::random();
        let mut cmd = evalsha(&EXTEND_SCRIPT, &keys);
        cmd.arg(nonce)
            .arg(now.as_millis())
            .arg(token.seq)
            .arg(Hex32(token.id))
            .arg(lease_until.as_millis())
            .arg(millis(self.gc_margin));
        let reply: Vec<String> = run(&EXTEND_SCRIPT, &cmd, &mut self.conn(), "extend").await?;
        if reply.first().map(String::as_str) == Some("extended") {
            self.confirm("extend", &keys.record, &nonce.text()).await?;
        }
        match reply.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["extended", stored] => match stored.parse::<u64>() {
                Ok(ms) => Ok(ExtendAnswer::Extended {
                    lease_until: Timestamp::from_millis(ms),
                }),
                Err(_) => Err(StoreError::corrupt(format!(
                    "redis extend script: lease_until {stored:?} is not a number"
                ))),
            },
            ["fenced"] => Ok(ExtendAnswer::Fenced),
            ["corrupt", why] => Err(StoreError::corrupt(format!("redis record: {why}"))),
            _ => Err(StoreError::corrupt(format!(
                "redis extend script: unknown answer {reply:?}"
            ))),
        }
    }

    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        let keys = RecordKeys::new(&self.prefix, id);
        let fields: Fields = redis::cmd("HGETALL")
            .arg(&keys.record)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| classify("get", e))?;
        let names = || Ok((id.scope().as_str().to_owned(), id.key().as_str().to_owned()));
        Ok(record::record(fields, names)?.filter(|r| !r.is_expired(now)))
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.list_stale(older_than, limit).await
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.list_selected(filter, now, limit).await
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.purge(now, limit).await
    }

    fn backend(&self) -> &'static str {
        "redis"
    }

    fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        Some(self)
    }

    async fn wait_for_change(
        &self,
        seen: &Record,
        clock: &dyn Clock,
        timer: &Timer,
    ) -> Result<(), StoreError> {
        crate::wake::wait_for_change(self, seen, clock, timer).await
    }
}

#[async_trait]
impl CheckpointStore for RedisStore {
    async fn checkpoint(
        &self,
        id: &RecordId,
        token: Token,
        checkpoint: &Checkpoint,
        policy: &Policy,
    ) -> Result<CheckpointAnswer, StoreError> {
        machine::check_checkpoint_size(checkpoint, policy)?;
        let keys = RecordKeys::new(&self.prefix, id);
        let nonce = Hex32::random();
        let mut cmd = evalsha(&CHECKPOINT_SCRIPT, &keys);
        cmd.arg(nonce)
            .arg(checkpoint.saved_at().as_millis())
            .arg(token.seq)
            .arg(Hex32(token.id))
            .arg(idem_core::store::columns::checkpoint_item(checkpoint));
        let reply: String = run(&CHECKPOINT_SCRIPT, &cmd, &mut self.conn(), "checkpoint").await?;
        match reply.as_str() {
            "saved" => {
                self.confirm("checkpoint", &keys.record, &nonce.text())
                    .await?;
                Ok(CheckpointAnswer::Saved)
            }
            "fenced" => Ok(CheckpointAnswer::Fenced),
            other => Err(StoreError::corrupt(format!(
                "redis checkpoint script: unknown answer {other:?}"
            ))),
        }
    }
}
