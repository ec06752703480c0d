//! Waiting for an in-flight answer ([contract §5.2](crate::contract#waiting)): a repeat that
//! finds its operation in flight waits, within its bound, for the record to settle, then claims
//! again (and so replays, or claims what became claimable). The waiters of one record share
//! one round of [`KeyStore::wait_for_change`](crate::KeyStore::wait_for_change).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::{BoxFuture, Either, FutureExt, Shared, WeakShared, select};

use super::attempt::ReleaseOnDrop;
use super::observe::timed;
use super::{Executor, Terms};
use crate::machine::ClaimAnswer;
use crate::wait::Timer;
use crate::{Clock, Error, Fingerprint, KeyStore, RecordId, RecordState, Timestamp};

/// How a shared round of waiting ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RoundEnd {
    /// The record settled (or may have): claim again.
    Settled,
    /// The store failed; stop waiting.
    Failed,
}

type Round = Shared<BoxFuture<'static, RoundEnd>>;
/// A claim's answer, the guard that gives back a claim its caller abandons, and when it was made.
pub(super) type Claimed = (ClaimAnswer, Option<ReleaseOnDrop>, Timestamp);

/// What an executor's waits sleep on, and the rounds its waiters share.
#[derive(Clone, Default)]
pub(super) struct Waiting {
    /// What waits sleep on; `None`: no waiting.
    pub(super) timer: Option<Timer>,
    /// The live round of each record being waited on, shared by every clone of the executor.
    rounds: Arc<Mutex<HashMap<RecordId, WeakShared<BoxFuture<'static, RoundEnd>>>>>,
}

impl Waiting {
    pub(super) fn new() -> Self {
        Self {
            #[cfg(feature = "tokio")]
            timer: Some(Timer::tokio()),
            ..Self::default()
        }
    }
}

/// A waiter's share of a round; leaving forgets the round once nobody shares it, so a dropped
/// waiter leaves no entry, no subscription and no task behind.
struct Joined {
    rounds: Arc<Mutex<HashMap<RecordId, WeakShared<BoxFuture<'static, RoundEnd>>>>>,
    id: RecordId,
    round: Option<Round>,
}

impl Drop for Joined {
    fn drop(&mut self) {
        // Dropping the last share drops the round's future, and with it the store's wait.
        drop(self.round.take());
        let mut rounds = self.rounds.lock().unwrap_or_else(|e| e.into_inner());
        if rounds.get(&self.id).is_some_and(|w| w.upgrade().is_none()) {
            rounds.remove(&self.id);
        }
    }
}

impl Executor {
    /// This executor, for a caller of [`Executor::run`] that asks to wait up to `wait` for an
    /// in-flight answer ([contract §5.2](crate::contract#waiting)): a repeat that finds its
    /// operation in flight waits at most the least of `wait`, the tool's [maximum
    /// wait](crate::Tool::max_wait) and the holder's remaining lease, then replays, claims what
    /// became claimable, or answers [`Error::InFlight`]. Zero (the default): no waiting, except
    /// for a call under a derived key, which waits up to the maximum wait. A transport asks per
    /// call instead ([`Call::wait`](crate::Call::wait)).
    pub fn waiting(&self, wait: Duration) -> Self {
        let mut this = self.clone();
        this.wait = wait;
        this
    }

    /// Waits and heartbeats ([`Executor::with_heartbeat`]) sleep on `timer` (the default, with
    /// the `tokio` feature, is [`Timer::tokio`]; without a timer nothing waits and nothing renews
    /// a lease).
    pub fn with_timer(mut self, timer: Timer) -> Self {
        self.waiting.timer = Some(timer);
        self
    }

    /// Claims; if the answer is "in flight" and the call's terms let it wait, waits for the record to
    /// settle and claims again, until the bound passes. Says how long it waited (`None`: it did
    /// not).
    pub(super) async fn claim_or_wait(
        &self,
        terms: &Terms,
        id: &RecordId,
        fingerprint: &Fingerprint,
    ) -> Result<(Claimed, Option<Duration>), Error> {
        let first = self.claim(&terms.policy, id, fingerprint).await?;
        let bound = terms.wait;
        let timer = match (&first.0, &self.waiting.timer) {
            (ClaimAnswer::InFlight { stale: false, .. }, Some(timer))
                if !bound.is_zero() && timer.usable() =>
            {
                timer.clone()
            }
            _ => return Ok((first, None)),
        };
        let started = Instant::now();
        // The holder's remaining lease bounds the wait through the round, which settles when
        // the lease ends.
        let mut deadline = timer.sleep(bound);
        let mut last = first;
        let result = loop {
            let joined = self.join(id, &timer);
            let round = joined.round.clone().expect("joined");
            let end = match select(round, &mut deadline).await {
                Either::Left((end, _)) => Some(end),
                Either::Right(((), _)) => None,
            };
            drop(joined);
            if end == Some(RoundEnd::Failed) {
                break "timed_out";
            }
            last = self.claim(&terms.policy, id, fingerprint).await?;
            match (&last.0, end) {
                (ClaimAnswer::InFlight { stale: false, .. }, Some(_)) => continue,
                (ClaimAnswer::InFlight { .. }, _) => break "timed_out",
                (ClaimAnswer::Replay(_), _) => break "replayed",
                (ClaimAnswer::Claimed { .. }, _) => break "claimed",
                (ClaimAnswer::FingerprintMismatch, _) => break "",
            }
        };
        let waited = started.elapsed();
        transition!(
            DEBUG,
            "waited",
            result,
            waited_ms = waited.as_millis() as u64,
            "waited for the in-flight answer"
        );
        if !result.is_empty() {
            crate::metrics::count_wait(result, waited);
        }
        Ok((last, Some(waited)))
    }

    /// The live round of `id`, or a new one.
    fn join(&self, id: &RecordId, timer: &Timer) -> Joined {
        let rounds = self.waiting.rounds.clone();
        let id = id.clone();
        let mut map = rounds.lock().unwrap_or_else(|e| e.into_inner());
        let live = map
            .get(&id)
            .and_then(WeakShared::upgrade)
            .filter(|r| r.peek().is_none());
        let round = live.unwrap_or_else(|| {
            let round = round(
                self.store.clone(),
                self.clock.clone(),
                timer.clone(),
                id.clone(),
            )
            .boxed()
            .shared();
            if let Some(weak) = round.downgrade() {
                map.insert(id.clone(), weak);
            }
            round
        });
        drop(map);
        Joined {
            rounds,
            id,
            round: Some(round),
        }
    }
}

/// One round: reads the record and waits on the store until it is no longer `processing` under a
/// running lease. Every waiter of the key shares it; dropped by the last, it stops.
async fn round(
    store: Arc<dyn KeyStore>,
    clock: Arc<dyn Clock>,
    timer: Timer,
    id: RecordId,
) -> RoundEnd {
    loop {
        let now = clock.now();
        let seen = match timed(&*store, "get", store.get(&id, now)).await {
            Ok(Some(seen)) => seen,
            Ok(None) => return RoundEnd::Settled,
            Err(error) => {
                tracing::warn!(%error, "waiting: the record could not be read; waiters stop");
                return RoundEnd::Failed;
            }
        };
        if seen.state != RecordState::Processing || seen.lease_until <= now {
            return RoundEnd::Settled;
        }
        let lease_left = seen.lease_until.saturating_since(now);
        let changed = store.wait_for_change(&seen, &*clock, &timer);
        match select(changed, timer.sleep(lease_left)).await {
            Either::Left((Ok(()), _)) | Either::Right(((), _)) => {}
            Either::Left((Err(error), _)) => {
                tracing::warn!(%error, "waiting: the store's wait failed; waiters stop");
                return RoundEnd::Failed;
            }
        }
    }
}

#[cfg(all(test, feature = "tokio"))]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::{IdempotencyKey, MemoryStore, Outcome, Policy, Scope, SystemClock};

    /// A waiter dropped while it waits takes its round with it: an executor that many waiters
    /// leave (callers that time out) keeps no entry for their keys.
    #[tokio::test]
    async fn a_dropped_waiter_leaves_no_round_behind() {
        let store = MemoryStore::new();
        let executor = Executor::new(store.clone()).waiting(Duration::from_secs(30));
        let (scope, key) = (Scope::new("t").unwrap(), IdempotencyKey::new("k").unwrap());
        let fp = Fingerprint::of("tool", &json!({})).unwrap();
        let id = RecordId::new(scope.clone(), key.clone());
        let policy = Policy::default();
        let claimed = store.claim(&id, &fp, &policy, SystemClock.now()).await;
        assert!(matches!(claimed.unwrap(), ClaimAnswer::Claimed { .. }));
        let rounds = executor.waiting.rounds.clone();
        let waiter = tokio::spawn(async move {
            let ok = || async { Outcome::definitive(200, &json!({})).unwrap() };
            executor.run(&scope, &key, &fp, |_| ok()).await
        });
        while rounds.lock().unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
        assert!(rounds.lock().unwrap().is_empty(), "a round left behind");
    }
}
