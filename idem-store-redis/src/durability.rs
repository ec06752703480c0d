//! Acknowledging a write only once replicas have it: [`RedisStore::with_wait_for_replicas`].

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use idem_core::StoreError;
use redis::{ErrorKind, ServerErrorKind, Value};

use crate::error::classify;
use crate::scripts::CONFIRM_SCRIPT;
use crate::{RedisStore, millis};

/// How many replicas must confirm a write before the store acknowledges it, and for how long to
/// wait for them. Set with [`RedisStore::with_wait_for_replicas`]; off by default.
///
/// After each write (a claim that claimed, a completion, a release, an extension that extended)
/// the store checks, on the node that owns the record's slot, that its write is still there,
/// and sends `WAIT replicas timeout` on the same connection. Fewer confirmations in time, or a
/// write that is no longer there, is [`StoreError::Unavailable`]: the caller never runs an
/// operation on an unconfirmed claim. Answers that write nothing (a replay, in flight, a
/// mismatch, fenced) are not waited for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitForReplicas {
    replicas: u32,
    timeout: Duration,
    aof: bool,
}

impl WaitForReplicas {
    /// How many replicas must confirm.
    pub fn replicas(&self) -> u32 {
        self.replicas
    }

    /// How long the server waits for them.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Whether `WAITAOF 1 replicas timeout` is sent too (see [`RedisStore::with_wait_aof`]).
    pub fn aof(&self) -> bool {
        self.aof
    }
}

/// A [`RedisStore::with_wait_for_replicas`] setting that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidWait {
    /// Zero replicas: `WAIT 0` confirms nothing. Leave the option off instead.
    #[error("wait for replicas: at least one replica must confirm (WAIT 0 confirms nothing)")]
    NoReplicas,
    /// A timeout under one millisecond: `WAIT n 0` would block forever.
    #[error("wait for replicas: the timeout must be at least 1 ms (WAIT with 0 blocks forever)")]
    NoTimeout,
}

/// Whether the server has `WAITAOF` (Redis 7.2 and later), asked once per store.
#[derive(Default)]
pub(crate) struct WaitAofSupport(OnceLock<bool>);

impl fmt::Debug for WaitAofSupport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0.get(), f)
    }
}

impl RedisStore {
    /// The same store acknowledging each write only once `replicas` replicas confirmed it within
    /// `timeout` (`WAIT replicas timeout`); otherwise the operation answers
    /// [`StoreError::Unavailable`] (a claim then releases itself, best effort: nothing ran).
    ///
    /// Redis replicates asynchronously: without this a failover can promote a replica that never
    /// received an acknowledged claim, and the next retry runs the operation again. With it a
    /// write costs one more round trip plus the replicas' confirmation, and writes fail while
    /// fewer than `replicas` replicas are connected. Set `replicas` to the number of replicas
    /// each master has, so that whichever is promoted has the write.
    pub fn with_wait_for_replicas(
        mut self,
        replicas: u32,
        timeout: Duration,
    ) -> Result<Self, InvalidWait> {
        if replicas == 0 {
            return Err(InvalidWait::NoReplicas);
        }
        if timeout < Duration::from_millis(1) {
            return Err(InvalidWait::NoTimeout);
        }
        self.wait = Some(WaitForReplicas {
            replicas,
            timeout,
            aof: self.wait.is_some_and(|w| w.aof),
        });
        Ok(self)
    }

    /// With [`RedisStore::with_wait_for_replicas`] set: also wait until the master and the
    /// replicas have written each write to their append-only file (`WAITAOF 1 replicas timeout`),
    /// on servers that have `WAITAOF` (Redis 7.2 and later; it needs `appendonly yes` on the
    /// master). On older servers (7.0 has no `WAITAOF`) only `WAIT` runs, and the configuration
    /// check ([`Maintenance::check_config`](idem_core::Maintenance::check_config)) warns about
    /// it. Without `with_wait_for_replicas` this does nothing.
    pub fn with_wait_aof(mut self, on: bool) -> Self {
        if let Some(w) = &mut self.wait {
            w.aof = on;
        }
        self
    }

    /// The replica confirmation each write waits for, if any.
    pub fn wait_for_replicas(&self) -> Option<WaitForReplicas> {
        self.wait
    }

    /// Whether the server has `WAITAOF`, asked once (`COMMAND INFO WAITAOF`).
    pub(crate) async fn has_waitaof(&self) -> Result<bool, StoreError> {
        if let Some(known) = self.waitaof.0.get() {
            return Ok(*known);
        }
        let reply: Value = redis::cmd("COMMAND")
            .arg("INFO")
            .arg("WAITAOF")
            .query_async(&mut self.conn())
            .await
            .map_err(|e| classify("command info", e))?;
        let known = match reply {
            Value::Array(items) => items.iter().any(|v| !matches!(v, Value::Nil)),
            Value::Map(items) => !items.is_empty(),
            _ => false,
        };
        Ok(*self.waitaof.0.get_or_init(|| known))
    }

    /// After a write of `record` that left `nonce` in it: nothing without the option; with it,
    /// `Ok` only once the write is confirmed by the replicas.
    pub(crate) async fn confirm(
        &self,
        op: &'static str,
        record: &str,
        nonce: &str,
    ) -> Result<(), StoreError> {
        let Some(wait) = self.wait else {
            return Ok(());
        };
        let aof = wait.aof && self.has_waitaof().await?;
        let timeout = millis(wait.timeout).max(1);
        let mut pipe = redis::pipe();
        // The script's key routes the whole pipeline to the master of the record's slot (WAIT
        // has no key), so WAIT runs on the connection that made the confirming write.
        pipe.cmd("EVALSHA")
            .arg(CONFIRM_SCRIPT.get_hash())
            .arg(1)
            .arg(record)
            .arg(nonce)
            .cmd("WAIT")
            .arg(wait.replicas)
            .arg(timeout);
        if aof {
            pipe.cmd("WAITAOF").arg(1).arg(wait.replicas).arg(timeout);
        }
        let mut conn = self.conn();
        let replies: Vec<Value> = match pipe.query_async(&mut conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                // The script cache is volatile (a restart or failover empties it).
                CONFIRM_SCRIPT
                    .load_async(&mut conn)
                    .await
                    .map_err(|e| classify(op, e))?;
                pipe.query_async(&mut conn).await
            }
            other => other,
        }
        .map_err(|e| classify(op, e))?;
        let int = |v: Option<&Value>| match v {
            Some(Value::Int(n)) => Some(*n),
            _ => None,
        };
        let unconfirmed = |what: String| {
            Err(StoreError::Unavailable {
                message: format!("redis {op}: {what}"),
                source: None,
            })
        };
        match int(replies.first()) {
            Some(1) => {}
            Some(_) => {
                return unconfirmed(
                    "the write is no longer on the master of its slot (lost in a failover, or \
                     replaced): not confirmed"
                        .to_owned(),
                );
            }
            None => {
                return Err(StoreError::corrupt(format!(
                    "redis {op}: confirm script answered {:?}",
                    replies.first()
                )));
            }
        }
        let acked = int(replies.get(1)).unwrap_or(0);
        if acked < i64::from(wait.replicas) {
            return unconfirmed(format!(
                "{acked} of {} replicas confirmed the write within {timeout} ms",
                wait.replicas
            ));
        }
        if aof {
            let fsynced = match replies.get(2) {
                Some(Value::Array(v)) => (int(v.first()), int(v.get(1))),
                _ => (None, None),
            };
            if fsynced.0.unwrap_or(0) < 1 || fsynced.1.unwrap_or(0) < i64::from(wait.replicas) {
                return unconfirmed(format!(
                    "WAITAOF: the append-only files of the master and {} replicas did not all \
                     confirm within {timeout} ms ({fsynced:?})",
                    wait.replicas
                ));
            }
        }
        Ok(())
    }
}

/// Shared, lazily filled per store and its clones.
pub(crate) fn waitaof_cell() -> Arc<WaitAofSupport> {
    Arc::new(WaitAofSupport::default())
}
