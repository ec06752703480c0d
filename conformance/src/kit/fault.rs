//! [`FaultStore`]: a store that forwards to yours and fails, waits or meddles when told to.

use std::collections::HashMap;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::machine::{ClaimAnswer, CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::store::{CheckpointStore, ListFilter};
use idem_core::{
    Fingerprint, IdempotencyKey, KeyStore, Outcome, Policy, Record, RecordId, Scope, StoreError,
    Timestamp, Token, async_trait,
};

use crate::harness::BoxFuture;

/// One operation of [`KeyStore`], as [`FaultStore`] counts and programs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Op {
    /// [`KeyStore::claim`].
    Claim,
    /// [`KeyStore::complete`].
    Complete,
    /// [`KeyStore::release`].
    Release,
    /// [`KeyStore::extend`].
    Extend,
    /// [`KeyStore::get`].
    Get,
    /// [`KeyStore::list_in_flight`].
    ListInFlight,
    /// [`KeyStore::list`].
    List,
    /// [`KeyStore::purge_expired`].
    PurgeExpired,
}

impl Op {
    /// Every operation.
    pub const ALL: [Op; 8] = [
        Op::Claim,
        Op::Complete,
        Op::Release,
        Op::Extend,
        Op::Get,
        Op::ListInFlight,
        Op::List,
        Op::PurgeExpired,
    ];
}

/// The error a programmed fault answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// [`StoreError::unavailable`]: the store cannot be reached (retryable).
    Unavailable,
    /// [`StoreError::backend`]: the store answered with an error.
    Backend,
}

impl Fault {
    fn error(self, op: Op) -> StoreError {
        let message = format!("kit: injected fault in {op:?}");
        match self {
            Fault::Unavailable => {
                StoreError::unavailable(message, std::io::Error::other("connection refused"))
            }
            Fault::Backend => StoreError::backend(message, std::io::Error::other("injected")),
        }
    }
}

/// A call as a hook of [`FaultStore`] sees it: the operation and the record it is about.
///
/// `scope` and `key` are the arguments of a call about one record (`claim` to `get`). A hook
/// after `list_in_flight` or `list` runs once per record listed, with that record's scope and
/// key; before them (and around `purge_expired`) both are `None`.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Call {
    /// The operation.
    pub op: Op,
    /// The scope of the record, if the call is about one.
    pub scope: Option<Scope>,
    /// The key of the record, if the call is about one.
    pub key: Option<IdempotencyKey>,
}

type BeforeHook = Arc<dyn Fn(Call) -> BoxFuture<'static, Result<(), StoreError>> + Send + Sync>;
type AfterHook = Arc<dyn Fn(Call) -> BoxFuture<'static, ()> + Send + Sync>;

struct Hook<F> {
    op: Op,
    once: bool,
    f: F,
}

#[derive(Default)]
struct State {
    calls: Mutex<HashMap<Op, usize>>,
    faults: Mutex<HashMap<Op, (usize, Fault)>>,
    before: Mutex<Vec<Hook<BeforeHook>>>,
    after: Mutex<Vec<Hook<AfterHook>>>,
}

/// A [`KeyStore`] that forwards every call to the store it wraps, and can be told to fail the
/// next calls of an operation ([`FaultStore::fail_next`]), to run a hook before or after one
/// ([`FaultStore::before`], [`FaultStore::after`]: wait at a gate, change the record between two
/// steps, signal a test), and counts the calls that reached the wrapped store
/// ([`FaultStore::calls`]).
///
/// Clones share the wrapped store, the faults, the hooks and the counts: hand one clone to the
/// code under test and program and read the other.
///
/// A call runs its before-hooks (an error from one is the call's answer), then answers a
/// programmed fault if one is left for its operation, then is forwarded and counted, then runs
/// its after-hooks (which see nothing of the answer and cannot change it).
pub struct FaultStore<S> {
    inner: Arc<S>,
    state: Arc<State>,
}

impl<S> Clone for FaultStore<S> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
            state: Arc::clone(&self.state),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for FaultStore<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultStore")
            .field("inner", &self.inner)
            .field("calls", &*self.state.calls.lock().unwrap())
            .field("faults", &*self.state.faults.lock().unwrap())
            .finish_non_exhaustive()
    }
}

impl<S: KeyStore> FaultStore<S> {
    /// Wraps `inner`, with no faults and no hooks.
    pub fn new(inner: S) -> Self {
        Self {
            inner: Arc::new(inner),
            state: Arc::default(),
        }
    }

    /// The wrapped store, shared: a hook can capture it to change records behind the caller's
    /// back (calls on it are neither counted nor faulted).
    pub fn inner(&self) -> Arc<S> {
        Arc::clone(&self.inner)
    }

    /// The next `n` calls of `op` answer `fault` without reaching the wrapped store (replacing
    /// whatever was programmed for `op`). `usize::MAX` fails them until [`FaultStore::heal`].
    pub fn fail_next(&self, op: Op, n: usize, fault: Fault) -> &Self {
        self.state.faults.lock().unwrap().insert(op, (n, fault));
        self
    }

    /// Every call of every operation answers `fault`, until [`FaultStore::heal`]: a store that
    /// is down.
    pub fn fail_all(&self, fault: Fault) -> &Self {
        for op in Op::ALL {
            self.fail_next(op, usize::MAX, fault);
        }
        self
    }

    /// Forgets every programmed fault.
    pub fn heal(&self) -> &Self {
        self.state.faults.lock().unwrap().clear();
        self
    }

    /// Runs `hook` before every call of `op`; an error it returns is the call's answer (the call
    /// is then not forwarded). Hooks of the same operation run in the order they were added.
    pub fn before<F, Fut>(&self, op: Op, hook: F) -> &Self
    where
        F: Fn(Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        self.add_before(op, false, hook)
    }

    /// Runs `hook` after every call of `op` that was forwarded (once per listed record for
    /// `list_in_flight` and `list`: see [`Call`]).
    pub fn after<F, Fut>(&self, op: Op, hook: F) -> &Self
    where
        F: Fn(Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.add_after(op, false, hook)
    }

    /// [`FaultStore::after`], for the next time only: the hook is removed as it runs.
    pub fn after_once<F, Fut>(&self, op: Op, hook: F) -> &Self
    where
        F: Fn(Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.add_after(op, true, hook)
    }

    /// Removes every hook.
    pub fn clear_hooks(&self) -> &Self {
        self.state.before.lock().unwrap().clear();
        self.state.after.lock().unwrap().clear();
        self
    }

    /// How many calls of `op` reached the wrapped store (faulted calls do not count).
    pub fn calls(&self, op: Op) -> usize {
        self.state
            .calls
            .lock()
            .unwrap()
            .get(&op)
            .copied()
            .unwrap_or(0)
    }

    fn add_before<F, Fut>(&self, op: Op, once: bool, hook: F) -> &Self
    where
        F: Fn(Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        let f: BeforeHook = Arc::new(move |call| Box::pin(hook(call)));
        self.state.before.lock().unwrap().push(Hook { op, once, f });
        self
    }

    fn add_after<F, Fut>(&self, op: Op, once: bool, hook: F) -> &Self
    where
        F: Fn(Call) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let f: AfterHook = Arc::new(move |call| Box::pin(hook(call)));
        self.state.after.lock().unwrap().push(Hook { op, once, f });
        self
    }

    /// The hooks of `op` to run now; one-shot hooks are taken out.
    fn due<F: Clone>(hooks: &Mutex<Vec<Hook<F>>>, op: Op) -> Vec<F> {
        let mut hooks = hooks.lock().unwrap();
        let due = hooks
            .iter()
            .filter(|h| h.op == op)
            .map(|h| h.f.clone())
            .collect();
        hooks.retain(|h| h.op != op || !h.once);
        due
    }

    /// Before-hooks, then a programmed fault: `Err` is the call's answer.
    async fn enter(
        &self,
        op: Op,
        scope: Option<&Scope>,
        key: Option<&IdempotencyKey>,
    ) -> Result<(), StoreError> {
        for hook in Self::due(&self.state.before, op) {
            hook(call(op, scope, key)).await?;
        }
        let fault = {
            let mut faults = self.state.faults.lock().unwrap();
            match faults.get_mut(&op) {
                Some((left, fault)) if *left > 0 => {
                    if *left != usize::MAX {
                        *left -= 1;
                    }
                    Some(*fault)
                }
                _ => None,
            }
        };
        fault.map_or(Ok(()), |fault| Err(fault.error(op)))
    }

    /// Counts a forwarded call, then runs the after-hooks.
    async fn leave(&self, op: Op, scope: Option<&Scope>, key: Option<&IdempotencyKey>) {
        *self.state.calls.lock().unwrap().entry(op).or_default() += 1;
        for hook in Self::due(&self.state.after, op) {
            hook(call(op, scope, key)).await;
        }
    }

    /// [`FaultStore::leave`] for a listing: after-hooks once per listed record.
    async fn leave_listed(&self, op: Op, listed: &Result<Vec<Record>, StoreError>) {
        *self.state.calls.lock().unwrap().entry(op).or_default() += 1;
        let Ok(records) = listed else { return };
        for record in records {
            for hook in Self::due(&self.state.after, op) {
                hook(call(op, Some(&record.scope), Some(&record.key))).await;
            }
        }
    }

    async fn one<T>(
        &self,
        op: Op,
        id: &RecordId,
        forward: impl Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        self.enter(op, Some(id.scope()), Some(id.key())).await?;
        let answer = forward.await;
        self.leave(op, Some(id.scope()), Some(id.key())).await;
        answer
    }
}

fn call(op: Op, scope: Option<&Scope>, key: Option<&IdempotencyKey>) -> Call {
    Call {
        op,
        scope: scope.cloned(),
        key: key.cloned(),
    }
}

#[async_trait]
impl<S: KeyStore> KeyStore for FaultStore<S> {
    async fn claim(
        &self,
        id: &RecordId,
        fingerprint: &Fingerprint,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ClaimAnswer, StoreError> {
        let forward = self.inner.claim(id, fingerprint, policy, now);
        self.one(Op::Claim, id, forward).await
    }

    async fn complete(
        &self,
        id: &RecordId,
        token: Token,
        outcome: &Outcome,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<CompleteAnswer, StoreError> {
        let forward = self.inner.complete(id, token, outcome, policy, now);
        self.one(Op::Complete, id, forward).await
    }

    async fn release(
        &self,
        id: &RecordId,
        token: Token,
        now: Timestamp,
    ) -> Result<ReleaseAnswer, StoreError> {
        let forward = self.inner.release(id, token, now);
        self.one(Op::Release, id, forward).await
    }

    async fn extend(
        &self,
        id: &RecordId,
        token: Token,
        lease: Duration,
        now: Timestamp,
    ) -> Result<ExtendAnswer, StoreError> {
        let forward = self.inner.extend(id, token, lease, now);
        self.one(Op::Extend, id, forward).await
    }

    async fn get(&self, id: &RecordId, now: Timestamp) -> Result<Option<Record>, StoreError> {
        let forward = self.inner.get(id, now);
        self.one(Op::Get, id, forward).await
    }

    async fn list_in_flight(
        &self,
        older_than: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.enter(Op::ListInFlight, None, None).await?;
        let listed = self.inner.list_in_flight(older_than, limit).await;
        self.leave_listed(Op::ListInFlight, &listed).await;
        listed
    }

    async fn list(
        &self,
        filter: &ListFilter,
        now: Timestamp,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.enter(Op::List, None, None).await?;
        let listed = self.inner.list(filter, now, limit).await;
        self.leave_listed(Op::List, &listed).await;
        listed
    }

    async fn purge_expired(&self, now: Timestamp, limit: usize) -> Result<usize, StoreError> {
        self.enter(Op::PurgeExpired, None, None).await?;
        let purged = self.inner.purge_expired(now, limit).await;
        self.leave(Op::PurgeExpired, None, None).await;
        purged
    }

    fn backend(&self) -> &'static str {
        self.inner.backend()
    }

    /// The wrapped store's checkpoints, without faults: the faults are planned on the other
    /// operations.
    fn as_checkpoint_store(&self) -> Option<&dyn CheckpointStore> {
        self.inner.as_checkpoint_store()
    }
}
