//! [`KeyStore`] for [`RedisStore`]: each write is one Lua script (see `scripts.rs`) deciding by
//! the rules of [`idem_core::machine`] on the server; the lists and purge walk the indexes.

use std::time::Duration;

use idem_core::machine::{
    self, ClaimAnswer, ClaimKind, CompleteAnswer, ExtendAnswer, ReleaseAnswer,
};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, ListFilter, Outcome, Policy, Record, Scope, StalePolicy,
    StoreError, Timestamp, Token, async_trait,
};

use crate::error::classify;
use crate::keys::RecordKeys;
use crate::record::{self, Fields, utf8};
use crate::scripts::{CLAIM_SCRIPT, COMPLETE_SCRIPT, EXTEND_SCRIPT, RELEASE_SCRIPT};
use crate::{RedisStore, millis};

impl RedisStore {
    async fn release_script(
        &self,
        keys: &RecordKeys,
        token: Token,
        now: Timestamp,
        nonce: &str,
    ) -> Result<String, StoreError> {
        RELEASE_SCRIPT
            .key(&keys.record)
            .key(&keys.lease_index)
            .arg(nonce)
            .arg(now.as_millis())
            .arg(token.seq)
            .arg(token.id_hex())
            .arg(&keys.member)
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| classify("release", e))
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
        self.release_script(keys, token, now, &nonce()).await
    }
}

fn nonce() -> String {
    format!("{:032x}", rand::random::<u128>())
}

fn parse_claim(reply: &[Vec<u8>], token_id: u128) -> Result<ClaimAnswer, StoreError> {
    let field = |i: usize| -> Result<String, StoreError> {
        let bytes = reply
            .get(i)
            .ok_or_else(|| StoreError::corrupt("redis claim script: short answer"))?;
        utf8("answer", bytes)
    };
    match field(0)?.as_str() {
        "claimed" => {
            let seq = record::number("token seq", &field(1)?)?;
            let attempt = record::number("attempt", &field(2)?)?;
            let kind = match field(3)?.as_str() {
                "new" => ClaimKind::New,
                "expired_replaced" => ClaimKind::ExpiredReplaced,
                "retry" => ClaimKind::Retry,
                "taken_over" => ClaimKind::TakenOver,
                other => {
                    return Err(StoreError::corrupt(format!(
                        "redis record: claim kind {other:?}"
                    )));
                }
            };
            Ok(ClaimAnswer::Claimed {
                token: Token::with_id(seq, token_id),
                attempt,
                kind,
            })
        }
        "replay" => {
            let body = reply
                .get(2)
                .ok_or_else(|| StoreError::corrupt("redis claim script: short answer"))?;
            Ok(ClaimAnswer::Replay(record::outcome(
                &field(1)?,
                body,
                &field(3)?,
            )?))
        }
        "in_flight" => {
            let ms: u64 = record::number("retry_after", &field(1)?)?;
            Ok(ClaimAnswer::InFlight {
                retry_after: Duration::from_millis(ms.max(1)),
                stale: field(2)? == "1",
            })
        }
        "mismatch" => Ok(ClaimAnswer::FingerprintMismatch),
        "corrupt" => Err(StoreError::corrupt(format!("redis record: {}", field(1)?))),
        other => Err(StoreError::corrupt(format!(
            "redis claim script: unknown answer {other:?}"
        ))),
    }
}

#[async_trait]
impl KeyStore for RedisStore {
    async fn claim(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let token_id: u128 = rand::random();
        let takeover = match policy.stale() {
            StalePolicy::Takeover => "1",
            StalePolicy::Reconcile => "0",
        };
        let reply: Vec<Vec<u8>> = CLAIM_SCRIPT
            .key(&keys.record)
            .key(&keys.expiry_index)
            .key(&keys.lease_index)
            .arg(format!("{token_id:032x}"))
            .arg(fingerprint.as_str())
            .arg(now.as_millis())
            .arg((now + policy.lease()).as_millis())
            .arg((now + policy.ttl()).as_millis())
            .arg(millis(policy.lease()).max(1))
            .arg(takeover)
            .arg(scope.as_str())
            .arg(key.as_str())
            .arg(&keys.member)
            .arg(self.native_ttl(policy.ttl()))
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| classify("claim", e))?;
        let answer = parse_claim(&reply, token_id)?;
        if let ClaimAnswer::Claimed { token, .. } = &answer
            && let Err(e) = self
                .confirm("claim", &keys.record, &format!("{token_id:032x}"))
                .await
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
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        machine::check_outcome_size(outcome, policy)?;
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let state = machine::completed_state(outcome, policy);
        let nonce = nonce();
        let reply: String = COMPLETE_SCRIPT
            .key(&keys.record)
            .key(&keys.expiry_index)
            .key(&keys.lease_index)
            .arg(&nonce)
            .arg(now.as_millis())
            .arg(token.seq)
            .arg(token.id_hex())
            .arg(state.as_str())
            .arg(outcome.status())
            .arg(outcome.body())
            .arg(outcome.class().as_str())
            .arg((now + policy.ttl()).as_millis())
            .arg(&keys.member)
            .arg(self.native_ttl(policy.ttl()))
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| classify("complete", e))?;
        if matches!(reply.as_str(), "completed" | "marked_retryable") {
            self.confirm("complete", &keys.record, &nonce).await?;
        }
        match reply.as_str() {
            "completed" => Ok(CompleteAnswer::Completed),
            "marked_retryable" => Ok(CompleteAnswer::MarkedRetryable),
            "fenced" => Ok(CompleteAnswer::Fenced),
            other => Err(StoreError::corrupt(format!(
                "redis complete script: unknown answer {other:?}"
            ))),
        }
    }

    async fn release(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let nonce = nonce();
        let reply = self.release_script(&keys, token, now, &nonce).await?;
        if reply == "released" {
            self.confirm("release", &keys.record, &nonce).await?;
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
        scope: &Scope,
        key: &IdempotencyKey,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        machine::check_lease(lease)?;
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let lease_until = now + lease;
        let nonce = nonce();
        let reply: Vec<String> = EXTEND_SCRIPT
            .key(&keys.record)
            .key(&keys.expiry_index)
            .key(&keys.lease_index)
            .arg(&nonce)
            .arg(now.as_millis())
            .arg(token.seq)
            .arg(token.id_hex())
            .arg(lease_until.as_millis())
            .arg(&keys.member)
            .arg(millis(self.gc_margin))
            .invoke_async(&mut self.conn())
            .await
            .map_err(|e| classify("extend", e))?;
        if reply.first().map(String::as_str) == Some("extended") {
            self.confirm("extend", &keys.record, &nonce).await?;
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

    async fn get(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        now: Timestamp,
    ) -> Result<Option<Record>, StoreError> {
        let keys = RecordKeys::new(&self.prefix, scope, key);
        let fields: Fields = redis::cmd("HGETALL")
            .arg(&keys.record)
            .query_async(&mut self.conn())
            .await
            .map_err(|e| classify("get", e))?;
        Ok(record::record(&fields)?.filter(|r| !r.is_expired(now)))
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
}
