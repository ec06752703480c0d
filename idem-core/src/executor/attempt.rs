//! [`Attempt`], the claim an operation runs under (with what it knows of its lease), and the guard
//! that gives a claim back when the caller goes away before the operation starts.

use std::fmt;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_channel::oneshot;
use futures_util::future::{FutureExt, Shared};

use super::observe::{count_completion, timed};
use super::spawn::Spawner;
use crate::codec::{CodecContext, CodecError, OutcomeCodec, encode_outcome};
use crate::machine::{ClaimKind, ExtendAnswer};
use crate::{
    Checkpoint, Clock, IdempotencyKey, KeyStore, Outcome, Policy, RecordId, Scope, StoreError,
    Timestamp, Token, downstream_key,
};

/// The claim an operation runs under, handed to the operation by
/// [`Executor::run`](super::Executor::run).
#[derive(Clone)]
pub struct Attempt {
    pub(super) store: Arc<dyn KeyStore>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) id: RecordId,
    pub(super) token: Token,
    pub(super) number: u32,
    pub(super) kind: ClaimKind,
    pub(super) recorded: Arc<Recorded>,
    pub(super) policy: Policy,
    pub(super) codec: Option<Arc<dyn OutcomeCodec>>,
    /// The steps earlier attempts saved, decoded ([`Attempt::checkpoints`]).
    pub(super) resumed: Arc<[Checkpoint]>,
    /// The lease deadline and whether the claim was lost, shared by every clone.
    pub(super) lease: Arc<Lease>,
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt")
            .field("scope", self.id.scope())
            .field("key", self.id.key())
            .field("token", &self.token)
            .field("number", &self.number)
            .field("kind", &self.kind)
            .field("checkpoints", &self.resumed.len())
            .field("lease_until", &self.lease_until())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl Attempt {
    /// The record this attempt holds the claim of.
    pub fn id(&self) -> &RecordId {
        &self.id
    }

    /// The scope.
    pub fn scope(&self) -> &Scope {
        self.id.scope()
    }

    /// The key.
    pub fn key(&self) -> &IdempotencyKey {
        self.id.key()
    }

    /// The fencing token of this claim.
    pub fn token(&self) -> Token {
        self.token
    }

    /// Which attempt this is, from 1.
    pub fn number(&self) -> u32 {
        self.number
    }

    /// How the claim was won.
    pub fn kind(&self) -> ClaimKind {
        self.kind
    }

    /// Now, by the executor's clock: the time a store's transactional completion writes at.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// The lease deadline as this attempt last stored it: the claim's `now + lease`, moved by
    /// every heartbeat and [`extend`](Attempt::extend) of the attempt and its clones. Past it,
    /// and until the next renewal lands, a caller under
    /// [`StalePolicy::Takeover`](crate::StalePolicy::Takeover) may take the claim over. Work
    /// that outlives the call (spawned, detached) is not renewed by the executor's heartbeat:
    /// it must finish before this, or renew it itself.
    ///
    /// An attempt made with [`Executor::attempt_for`](super::Executor::attempt_for) starts from
    /// the time it was made, a little after the claim's.
    pub fn lease_until(&self) -> Timestamp {
        self.lease.until()
    }

    /// Whether the claim is known to be lost: a heartbeat, an [`extend`](Attempt::extend) or a
    /// [`checkpoint`](Attempt::checkpoint) of this attempt (or a clone) was fenced, because a
    /// newer attempt holds the claim. Check it before each effect and stop if it is `true`.
    /// `false` is not a promise: the claim may have been taken over since the last renewal.
    pub fn is_lost(&self) -> bool {
        self.lease.is_lost()
    }

    /// Resolves once the claim is known to be lost ([`is_lost`](Attempt::is_lost)); pending for
    /// as long as it is not. For long work that can stop midway: select on it, and start no
    /// further effect once it resolves.
    pub fn lost(&self) -> impl Future<Output = ()> + Send + 'static {
        self.lease.lost.clone().map(|_| ())
    }

    /// Renews the lease to `now + lease` (a heartbeat for long work); it never shortens the lease
    /// (the later deadline wins). `Ok(false)` means the claim was lost: stop, and do not start
    /// any further effect. A lease of zero whole milliseconds is refused with
    /// [`StoreError::ZeroLease`] before the store is called. The executor renews the lease by
    /// itself while the operation runs
    /// ([`Executor::with_heartbeat`](super::Executor::with_heartbeat)); call this for work it
    /// does not renew (work that outlives the call).
    pub async fn extend(&self, lease: Duration) -> Result<bool, StoreError> {
        crate::machine::check_lease(lease)?;
        let now = self.clock.now();
        let answer = timed(
            &*self.store,
            "extend",
            self.store.extend(&self.id, self.token, lease, now),
        )
        .await?;
        Ok(match answer {
            ExtendAnswer::Extended { lease_until } => {
                self.lease.renewed(lease_until);
                transition!(
                    DEBUG,
                    "extended",
                    lease_until = lease_until.as_millis(),
                    "lease extended"
                );
                true
            }
            ExtendAnswer::Fenced => {
                self.lease.lose();
                transition!(
                    WARN,
                    "fenced",
                    op = "extend",
                    "lease lost to a newer attempt"
                );
                count_completion("fenced");
                false
            }
        })
    }

    /// Tells the executor that the operation has completed the record itself, in the same committed
    /// transaction as its effect ([contract §6](crate::contract#transactional-completion),
    /// transactional completion: e.g. `SqliteStore`'s or `PostgresStore`'s completion on the
    /// caller's transaction), so the executor must not complete it again. Call it only after that
    /// transaction committed. Clones of the attempt share the mark.
    ///
    /// It also wakes the requests of this process waiting on the record, when the store's
    /// transactional completion left a wake-up for the commit
    /// ([`wake_when_recorded`](crate::wait::wake_when_recorded)).
    pub fn mark_recorded(&self) {
        self.recorded.mark();
    }

    /// Leaves `wake` for [`Attempt::mark_recorded`] (see
    /// [`wake_when_recorded`](crate::wait::wake_when_recorded)).
    pub(crate) fn wake_when_recorded(&self, wake: Wake) {
        self.recorded.wake_when_marked(wake);
    }

    /// The executor's policy: the one a store's transactional completion (e.g.
    /// `SqliteStore::complete_in`, `PostgresStore::complete_in`, which take the attempt) completes
    /// under, so the record gets the same ttl, cache policy and size limit as the executor's own
    /// completions.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// The outcome to store for `outcome`: encoded by the executor's [codec](crate::codec)
    /// (e.g. encrypted), or `outcome` itself without one. Pass this, not the plain outcome, to a
    /// store's transactional completion, so a record completed in your transaction is stored as
    /// the executor would store it (and replays through the codec). Return the plain outcome
    /// from the operation.
    pub fn encode(&self, outcome: &Outcome) -> Result<Outcome, CodecError> {
        encode_outcome(
            self.codec.as_deref(),
            &CodecContext::new(self.id.scope(), self.id.key()),
            outcome,
        )
        .map(|o| o.into_owned())
    }

    /// The stable key to pass to `provider`'s own idempotency contract; see [`downstream_key`].
    pub fn downstream_key(&self, provider: &str) -> String {
        downstream_key(self.id.scope(), self.id.key(), provider)
    }
}

/// A store's wake-up of the waiters of a record, for when the caller reports its commit.
pub(crate) type Wake = Arc<dyn Fn() + Send + Sync>;

/// Whether the operation recorded its outcome itself ([`Attempt::mark_recorded`]), and the
/// wake-up a store's transactional completion left for that moment. Shared by the attempt's
/// clones and the executor.
#[derive(Default)]
pub(super) struct Recorded {
    marked: AtomicBool,
    wake: Mutex<Option<Wake>>,
}

impl Recorded {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Wake>> {
        self.wake.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn mark(&self) {
        self.marked.store(true, Ordering::SeqCst);
        let wake = self.lock().clone();
        if let Some(wake) = wake {
            wake();
        }
    }

    fn wake_when_marked(&self, wake: Wake) {
        let mut slot = self.lock();
        *slot = Some(wake.clone());
        // Read under the lock `mark` takes after setting the flag: the wake-up runs once the
        // mark is set, whichever comes first.
        let marked = self.marked.load(Ordering::SeqCst);
        drop(slot);
        if marked {
            wake();
        }
    }

    /// Whether the operation said it recorded its outcome ([`Attempt::mark_recorded`]).
    pub(super) fn is_marked(&self) -> bool {
        self.marked.load(Ordering::SeqCst)
    }

    /// Whether the operation said it recorded its outcome. If it did, wakes the waiters once
    /// more: the operation has returned, so its transaction has committed even if it said so
    /// before the commit.
    pub(super) fn settle(&self) -> bool {
        let marked = self.marked.load(Ordering::SeqCst);
        if marked {
            let wake = self.lock().clone();
            if let Some(wake) = wake {
                wake();
            }
        }
        marked
    }
}

/// What an attempt knows of its lease: the deadline it last stored, and whether the claim was
/// lost (a fenced answer: tokens never come back, so lost is for good).
pub(super) struct Lease {
    until: AtomicU64,
    /// Taken and fired when the claim is lost; kept until then, so `lost` never resolves early.
    lose: Mutex<Option<oneshot::Sender<()>>>,
    lost: Shared<oneshot::Receiver<()>>,
}

impl Lease {
    /// A lease that runs until `until`, not lost.
    pub(super) fn new(until: Timestamp) -> Arc<Self> {
        let (lose, lost) = oneshot::channel();
        Arc::new(Self {
            until: AtomicU64::new(until.as_millis()),
            lose: Mutex::new(Some(lose)),
            lost: lost.shared(),
        })
    }

    fn until(&self) -> Timestamp {
        Timestamp::from_millis(self.until.load(Ordering::SeqCst))
    }

    /// The store now keeps the lease until `until` (a deadline only moves later).
    fn renewed(&self, until: Timestamp) {
        self.until.fetch_max(until.as_millis(), Ordering::SeqCst);
    }

    /// The claim is lost: wakes every `lost` future.
    pub(super) fn lose(&self) {
        let sender = self.lose.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(sender) = sender {
            let _ = sender.send(());
        }
    }

    fn is_lost(&self) -> bool {
        self.lose
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }
}

/// Gives a won claim back if dropped before being disarmed (needs a spawner: the release is
/// asynchronous).
pub(super) struct ReleaseOnDrop {
    pub(super) store: Arc<dyn KeyStore>,
    pub(super) clock: Arc<dyn Clock>,
    pub(super) spawner: Spawner,
    pub(super) id: RecordId,
    pub(super) token: Token,
    pub(super) armed: bool,
}

impl Drop for ReleaseOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (store, clock) = (self.store.clone(), self.clock.clone());
        let (id, token) = (self.id.clone(), self.token);
        (self.spawner)(Box::pin(async move {
            match timed(&*store, "release", store.release(&id, token, clock.now())).await {
                Ok(answer) => {
                    transition!(INFO, "released", scope = %id.scope(), key = %id.key(), token = %token.short(), ?answer,
                        "caller went away before the operation started; claim released"
                    )
                }
                Err(error) => {
                    transition!(WARN, "released", scope = %id.scope(), key = %id.key(), token = %token.short(), %error,
                        "caller went away before the operation started; release failed, the lease will run out"
                    )
                }
            }
        }));
    }
}
