//! A takeover racing the old holder's own write (its completion, release or extension), from
//! separate handles, over [`ROUNDS`] rounds: one of the two wins, never both, and the record is
//! the winner's.
//!
//! A claim that reads the record, then writes under a compare-and-set that misses what the
//! holder's write changes (a state, a lease), overwrites it: a completion followed by a takeover
//! that runs the operation again, or a holder that extended its lease and is taken over anyway.

use idem_core::machine::{CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::{ClaimKind, RecordState};

use super::*;

/// Rounds each race runs, each on a key of its own.
const ROUNDS: usize = 12;

/// The holder's write in a race.
#[derive(Clone, Copy, Debug)]
enum HolderWrite {
    Complete,
    Release,
    Extend,
}

/// What the holder's write answered: whether it took effect.
async fn holder_writes(
    store: &Arc<dyn KeyStore>,
    id: &RecordId,
    holder: Token,
    write: HolderWrite,
    now: Timestamp,
) -> bool {
    match write {
        HolderWrite::Complete => {
            let a = store
                .complete(id, holder, &ok("holder"), &policy(), now)
                .await
                .unwrap();
            a == CompleteAnswer::Completed
        }
        HolderWrite::Release => {
            let a = store.release(id, holder, now).await.unwrap();
            a == ReleaseAnswer::Released
        }
        HolderWrite::Extend => {
            let a = store.extend(id, holder, LEASE, now).await.unwrap();
            matches!(a, ExtendAnswer::Extended { .. })
        }
    }
}

/// Runs [`ROUNDS`] rounds of a takeover racing the holder's `write`; see the module docs.
async fn takeover_racing(h: &Harness, write: HolderWrite) {
    let holder_store = h.store().await;
    let taker_store = h.store().await;
    let scope = h.scope("race");
    for round in 0..ROUNDS {
        let t0 = h.now();
        let key = h.key(&format!("{write:?}-{round}"));
        let id = RecordId::new(scope.clone(), key.clone());
        let holder = claim_new(&holder_store, &id, &fp("a"), &takeover(), t0).await;
        // The lease has elapsed and nobody took over: the holder's write still takes effect.
        let at = t0 + LEASE + Duration::from_millis(round as u64);
        let holding = holder_writes(&holder_store, &id, holder, write, at);
        let claiming = async {
            taker_store
                .claim(&id, &fp("a"), &takeover(), at)
                .await
                .unwrap()
        };
        // The claim is sent first, so the holder's write may fall between its read and its
        // write.
        let (answer, held) = tokio::join!(claiming, holding);
        let r = read_back(h, &id).await;
        let context = format!(
            "round {round}: a takeover racing the holder's {write:?} (holder's write took effect: \
             {held}; claim: {answer:?})"
        );
        let taker = match (write, held, &answer) {
            // The holder first: the claim sees what it wrote.
            (HolderWrite::Complete, true, ClaimAnswer::Replay(o)) => {
                assert_eq!(o, &ok("holder"), "{context}");
                assert_eq!(
                    (r.state, r.token),
                    (RecordState::Completed, holder),
                    "{context}: the holder's completion stands"
                );
                continue;
            }
            (HolderWrite::Extend, true, ClaimAnswer::InFlight { stale: false, .. }) => {
                assert_eq!(
                    (r.state, r.token, r.lease_until),
                    (RecordState::Processing, holder, at + LEASE),
                    "{context}: the holder's extended claim stands"
                );
                continue;
            }
            (HolderWrite::Release, true, ClaimAnswer::Claimed { .. }) => {
                won_as(&answer, (ClaimKind::Retry, 2), &context)
            }
            // The claim first: the holder is fenced.
            (_, false, ClaimAnswer::Claimed { .. }) => {
                won_as(&answer, (ClaimKind::TakenOver, 2), &context)
            }
            _ => panic!(
                "{context}: exactly one of the two must win, and the claim must see the holder's \
                 write if that one won"
            ),
        };
        assert_eq!(
            (r.state, r.token, r.attempt),
            (RecordState::Processing, taker, 2),
            "{context}: the record is the taker's"
        );
        assert_all_fenced(&holder_store, &id, holder, at).await;
    }
}

/// The token of a `Claimed` answer of the `expected` kind and attempt; panics otherwise.
#[track_caller]
fn won_as(answer: &ClaimAnswer, expected: (ClaimKind, u32), context: &str) -> Token {
    let (token, attempt, kind) = won(answer, context);
    assert_eq!(
        (kind, attempt),
        expected,
        "{context}: the claim's kind and attempt"
    );
    token
}

/// The holder completes (its lease elapsed, nobody took over yet) while another handle takes
/// its claim over, over [`ROUNDS`] rounds: the completion stands and the claim replays it, or
/// the claim wins and the completion is fenced; never both.
pub(crate) async fn concurrency_takeover_racing_the_holders_completion(h: Harness) {
    takeover_racing(&h, HolderWrite::Complete).await;
}

/// The holder releases while another handle takes its claim over, over [`ROUNDS`] rounds: the
/// release stands and the claim is a retry (`Retry`), or the claim takes over (`TakenOver`) and
/// the release is fenced; never a takeover of a released record.
pub(crate) async fn concurrency_takeover_racing_the_holders_release(h: Harness) {
    takeover_racing(&h, HolderWrite::Release).await;
}

/// The holder extends its elapsed lease while another handle takes its claim over, over
/// [`ROUNDS`] rounds: the extension stands and the claim sees the running lease (`InFlight`),
/// or the claim takes over and the extension is fenced; never both.
pub(crate) async fn concurrency_takeover_racing_the_holders_extension(h: Harness) {
    takeover_racing(&h, HolderWrite::Extend).await;
}
