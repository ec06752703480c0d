//! A takeover racing the old holder's checkpoints, from separate handles: every checkpoint the
//! holder was told is saved is on the record the takeover leaves, in order, and none it was told
//! is fenced ([contract §6.1](idem_core::contract#checkpoints): "a takeover keeps them").
//!
//! The holder saves a burst of checkpoints while another handle takes its claim over, both
//! started together, over [`ROUNDS`] rounds: a claim that reads the record, then writes back
//! the checkpoints it read under a compare-and-set that a checkpoint does not change (token,
//! state, lease, expiry) loses the checkpoints saved in between.

use idem_core::reconcile::takeover_policy;

use super::*;

/// Rounds each race runs, each on a key of its own.
const ROUNDS: usize = 12;
/// Checkpoints the holder tries to save per round, one after the other, until one is fenced.
const BURST: u32 = 6;

/// How the racing claim is made.
#[derive(Clone, Copy)]
enum Taker {
    /// A retry under [`StalePolicy::Takeover`].
    Retry,
    /// The [`Reconciler`](idem_core::reconcile::Reconciler)'s claim: the policy of
    /// [`takeover_policy`], made from the record it read (the record's own expiry).
    Reconciler,
}

/// Runs [`ROUNDS`] rounds of the race with `taker`; see the module docs.
async fn race_checkpoints(h: &Harness, taker: Taker) {
    let Some(holder_store) = supporting(h).await else {
        return;
    };
    let taker_store = h.store().await;
    let scope = h.scope("race");
    for round in 0..ROUNDS {
        let t0 = h.now();
        let id = RecordId::new(scope.clone(), h.key(&format!("race-{round}")));
        let holder = claim_new(&holder_store, &id, &fp("a"), &takeover(), t0).await;
        // Half the rounds start from a record with a checkpoint already, half from none.
        let mut saved = Vec::new();
        if round % 2 == 1 {
            let first = step("before", 0, t0);
            let a = save(&holder_store, &id, holder, &first).await;
            assert_eq!(
                a,
                CheckpointAnswer::Saved,
                "round {round}: the first checkpoint"
            );
            saved.push("before".to_owned());
        }
        // The lease has elapsed: nobody took over yet, so the holder still saves.
        let at = t0 + LEASE + Duration::from_millis(round as u64);
        let (taker_policy, own_expiry) = match taker {
            Taker::Retry => (takeover(), None),
            Taker::Reconciler => {
                let read = taker_store.get(&id, at).await.unwrap();
                let read = read.expect("the holder's record");
                let taker_policy =
                    takeover_policy(&policy(), &read, at, at).expect("a takeover policy");
                (taker_policy, Some(read.expires_at))
            }
        };
        let saving = async {
            let mut saved = Vec::new();
            for n in 1..=BURST {
                let name = format!("step-{n}");
                let checkpoint = step(&name, n, at);
                match save(&holder_store, &id, holder, &checkpoint).await {
                    CheckpointAnswer::Saved => saved.push(name),
                    _ => break,
                }
            }
            saved
        };
        let claiming = async {
            taker_store
                .claim(&id, &fp("a"), &taker_policy, at)
                .await
                .unwrap()
        };
        // The claim is sent first, so the burst falls between its read and its write.
        let (answer, burst) = tokio::join!(claiming, saving);
        saved.extend(burst);
        let context = format!("round {round}: a takeover racing the holder's checkpoints");
        let (token, attempt, kind) = won(&answer, &context);
        assert_eq!((kind, attempt), (ClaimKind::TakenOver, 2), "{context}");
        let r = read_back(h, &id).await;
        assert_eq!(r.token, token, "{context}: the record is the taker's");
        let kept: Vec<&str> = r.checkpoints.iter().map(|c| c.name()).collect();
        assert_eq!(
            kept, saved,
            "{context}: every checkpoint the holder was told is saved, and only those, is on the \
             record the takeover left (a takeover that writes back the checkpoints it read loses \
             the ones saved between its read and its write)"
        );
        let late = step("late", 99, at);
        let a = save(&holder_store, &id, holder, &late).await;
        assert_eq!(
            a,
            CheckpointAnswer::Fenced,
            "{context}: the old holder is fenced"
        );
        if let Some(expires_at) = own_expiry {
            assert_eq!(
                r.expires_at, expires_at,
                "{context}: the record's own expiry"
            );
        }
    }
}

/// The holder saves a burst of checkpoints while a retry under `Takeover` on another handle
/// takes its claim over, over [`ROUNDS`] rounds: the taken-over record holds exactly the
/// checkpoints the holder was told are saved, in order; the rest were fenced.
pub(crate) async fn checkpoint_kept_by_a_racing_takeover(h: Harness) {
    race_checkpoints(&h, Taker::Retry).await;
}

/// The same race with the claim a reconciler makes ([`takeover_policy`]: the record's own
/// expiry, a shorter lease): every checkpoint saved before it is kept, so the probe is asked
/// about the right step.
pub(crate) async fn checkpoint_kept_by_a_racing_reconciler_takeover(h: Harness) {
    race_checkpoints(&h, Taker::Reconciler).await;
}
