//! The steps of a sequence, how they print, and the strategies that generate them.

use std::fmt;

use idem_core::machine::{CompleteAnswer, ExtendAnswer, ReleaseAnswer};
use idem_core::{CachePolicy, Policy, RecordState, StalePolicy};
use proptest::prelude::*;
use proptest::sample::Index;

use super::{EXTENDS, KEYS, LEASES, SCOPES, SMALL_LIMIT, TTLS};

/// One record's address: indexes into [`SCOPES`] and [`KEYS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct Addr {
    pub(super) scope: usize,
    pub(super) key: usize,
}

/// A policy, by its parts.
#[derive(Debug, Clone, Copy)]
pub(super) struct Pol {
    pub(super) lease: usize,
    pub(super) ttl: usize,
    pub(super) takeover: bool,
    pub(super) cache_all: bool,
}

impl Pol {
    pub(super) fn policy(self, max_outcome_bytes: usize) -> Policy {
        Policy::builder()
            .lease(LEASES[self.lease])
            .ttl(TTLS[self.ttl])
            .stale(if self.takeover {
                StalePolicy::Takeover
            } else {
                StalePolicy::Reconcile
            })
            .cache(if self.cache_all {
                CachePolicy::CacheAll
            } else {
                CachePolicy::DefinitiveOnly
            })
            .max_outcome_bytes(max_outcome_bytes)
            .build()
            .expect("valid policy")
    }
}

/// Which token a holder acts with.
#[derive(Debug, Clone)]
pub(super) enum Holder {
    /// The latest token handed out for the address.
    Latest,
    /// Any token handed out for the address.
    Earlier(Index),
    /// The latest token's `seq` with another id.
    Forged,
    /// A token nobody was handed.
    Never,
}

#[derive(Debug, Clone, Copy)]
pub(super) enum Out {
    Definitive(u8),
    Retryable,
    TooLarge,
}

/// What the holder does in a [`Op::HolderRace`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Act {
    Complete(Out),
    Release,
    Extend(usize),
}

/// The holder's answer in a [`Op::HolderRace`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Acted {
    Complete(CompleteAnswer),
    Release(ReleaseAnswer),
    Extend(ExtendAnswer),
}

#[derive(Debug, Clone)]
pub(super) enum Op {
    Claim {
        at: Addr,
        other_request: bool,
        pol: Pol,
    },
    Complete {
        at: Addr,
        holder: Holder,
        out: Out,
        pol: Pol,
    },
    Release {
        at: Addr,
        holder: Holder,
    },
    Extend {
        at: Addr,
        holder: Holder,
        lease: usize,
    },
    /// A holder's complete, release or extend at the same time as `n` identical claims.
    HolderRace {
        at: Addr,
        holder: Holder,
        act: Act,
        n: usize,
        pol: Pol,
    },
    /// `n` identical claims at once, from `n` tasks.
    ClaimRace {
        at: Addr,
        n: usize,
        pol: Pol,
    },
    /// A holder saves checkpoint `step` (a value over a small limit when `too_large`).
    Checkpoint {
        at: Addr,
        holder: Holder,
        step: u8,
        too_large: bool,
    },
    Get {
        at: Addr,
    },
    List {
        state: Option<RecordState>,
        scope: Option<usize>,
        age_ms: Option<u64>,
        limit: usize,
    },
    ListInFlight {
        back_ms: u64,
        limit: usize,
    },
    Purge {
        limit: usize,
    },
    Advance {
        ms: u64,
    },
}

impl fmt::Display for Addr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "({:?}, {:?})", SCOPES[self.scope], KEYS[self.key])
    }
}

impl fmt::Display for Pol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "lease {:?}, ttl {:?}, {}, {}",
            LEASES[self.lease],
            TTLS[self.ttl],
            if self.takeover {
                "takeover"
            } else {
                "reconcile"
            },
            if self.cache_all {
                "cache_all"
            } else {
                "definitive_only"
            }
        )
    }
}

impl fmt::Display for Holder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Latest => f.write_str("latest token"),
            Self::Earlier(_) => f.write_str("an earlier token"),
            Self::Forged => f.write_str("latest seq, forged id"),
            Self::Never => f.write_str("token never handed out"),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Claim {
                at,
                other_request,
                pol,
            } => write!(
                f,
                "claim {at} request {} [{pol}]",
                if *other_request { "B" } else { "A" }
            ),
            Self::Complete {
                at,
                holder,
                out,
                pol,
            } => {
                let out = match out {
                    Out::Definitive(n) => format!("definitive 201 T-{n}"),
                    Out::Retryable => "retryable 503".to_owned(),
                    Out::TooLarge => format!("over a {SMALL_LIMIT}-byte limit"),
                };
                write!(f, "complete {at} with {holder}: {out} [{pol}]")
            }
            Self::Release { at, holder } => write!(f, "release {at} with {holder}"),
            Self::Extend { at, holder, lease } => {
                write!(f, "extend {at} with {holder} by {:?}", EXTENDS[*lease])
            }
            Self::HolderRace {
                at,
                holder,
                act,
                n,
                pol,
            } => {
                let act = match act {
                    Act::Complete(Out::Definitive(n)) => format!("complete (definitive 201 T-{n})"),
                    Act::Complete(_) => "complete (retryable 503)".to_owned(),
                    Act::Release => "release".to_owned(),
                    Act::Extend(l) => format!("extend by {:?}", EXTENDS[*l]),
                };
                write!(
                    f,
                    "{act} of {at} with {holder}, at the same time as {n} claims, request A [{pol}]"
                )
            }
            Self::ClaimRace { at, n, pol } => {
                write!(f, "{n} concurrent claims of {at}, request A [{pol}]")
            }
            Self::Checkpoint {
                at,
                holder,
                step,
                too_large,
            } => {
                write!(f, "checkpoint {at} with {holder}: step-{step}")?;
                if *too_large {
                    write!(f, " over a {SMALL_LIMIT}-byte limit")?;
                }
                Ok(())
            }
            Self::Get { at } => write!(f, "get {at}"),
            Self::List {
                state,
                scope,
                age_ms,
                limit,
            } => {
                write!(f, "list limit {limit}")?;
                if let Some(s) = state {
                    write!(f, ", state {s}")?;
                }
                if let Some(s) = scope {
                    write!(f, ", scope {:?}", SCOPES[*s])?;
                }
                if let Some(a) = age_ms {
                    write!(f, ", updated at least {a} ms ago")?;
                }
                Ok(())
            }
            Self::ListInFlight { back_ms, limit } => {
                write!(
                    f,
                    "list_in_flight older than now - {back_ms} ms, limit {limit}"
                )
            }
            Self::Purge { limit } => write!(f, "purge_expired in batches of {limit}"),
            Self::Advance { ms } => write!(f, "advance the clock {ms} ms"),
        }
    }
}

pub(super) fn render(ops: &[Op]) -> String {
    let mut out = String::new();
    for (i, op) in ops.iter().enumerate() {
        out.push_str(&format!("  {:>2}. {op}\n", i + 1));
    }
    out.push_str("  (then: the clock moves to the last expiry and everything is purged)");
    out
}

fn addr() -> impl Strategy<Value = Addr> {
    (0..SCOPES.len(), 0..KEYS.len()).prop_map(|(scope, key)| Addr { scope, key })
}

fn pol() -> impl Strategy<Value = Pol> {
    (0..LEASES.len(), 0..TTLS.len(), any::<bool>(), any::<bool>()).prop_map(
        |(lease, ttl, takeover, cache_all)| Pol {
            lease,
            ttl,
            takeover,
            cache_all,
        },
    )
}

fn holder() -> impl Strategy<Value = Holder> {
    prop_oneof![
        6 => Just(Holder::Latest),
        2 => any::<Index>().prop_map(Holder::Earlier),
        1 => Just(Holder::Forged),
        1 => Just(Holder::Never),
    ]
}

fn out() -> impl Strategy<Value = Out> {
    prop_oneof![
        4 => (0u8..4).prop_map(Out::Definitive),
        3 => Just(Out::Retryable),
        1 => Just(Out::TooLarge),
    ]
}

fn act() -> impl Strategy<Value = Act> {
    prop_oneof![
        2 => (0u8..4).prop_map(|n| Act::Complete(Out::Definitive(n))),
        1 => Just(Act::Complete(Out::Retryable)),
        1 => Just(Act::Release),
        1 => (0..EXTENDS.len()).prop_map(Act::Extend),
    ]
}

fn clock_move() -> impl Strategy<Value = u64> {
    // Steps that land on lease and expiry boundaries (5 s, 30 s, 60 s, 300 s), just short of and
    // just past them, and anything else.
    prop_oneof![
        Just(1u64),
        Just(999),
        Just(1_000),
        Just(4_999),
        Just(5_000),
        Just(25_000),
        Just(30_000),
        Just(60_000),
        Just(300_000),
        0u64..400_000,
    ]
}

fn op() -> impl Strategy<Value = Op> {
    let state = prop_oneof![
        Just(None),
        Just(Some(RecordState::Processing)),
        Just(Some(RecordState::Completed)),
        Just(Some(RecordState::FailedRetryable)),
    ];
    let limit = prop_oneof![1usize..4, Just(100)];
    prop_oneof![
        5 => (addr(), prop::bool::weighted(0.15), pol()).prop_map(|(at, other_request, pol)| {
            Op::Claim { at, other_request, pol }
        }),
        3 => (addr(), holder(), out(), pol()).prop_map(|(at, holder, out, pol)| {
            Op::Complete { at, holder, out, pol }
        }),
        1 => (addr(), holder()).prop_map(|(at, holder)| Op::Release { at, holder }),
        2 => (addr(), holder(), 0..EXTENDS.len())
            .prop_map(|(at, holder, lease)| Op::Extend { at, holder, lease }),
        1 => (addr(), 2usize..9, pol()).prop_map(|(at, n, pol)| Op::ClaimRace { at, n, pol }),
        1 => (addr(), holder(), act(), 1usize..5, pol()).prop_map(|(at, holder, act, n, pol)| {
            Op::HolderRace { at, holder, act, n, pol }
        }),
        2 => (addr(), holder(), 0u8..3, prop::bool::weighted(0.1)).prop_map(
            |(at, holder, step, too_large)| Op::Checkpoint { at, holder, step, too_large },
        ),
        2 => addr().prop_map(|at| Op::Get { at }),
        1 => (
            state,
            prop::option::of(0..SCOPES.len()),
            prop::option::of(prop_oneof![Just(0u64), Just(1_000), 0u64..100_000]),
            limit.clone(),
        )
            .prop_map(|(state, scope, age_ms, limit)| Op::List { state, scope, age_ms, limit }),
        1 => (prop_oneof![Just(0u64), Just(1_000), 0u64..60_000], limit.clone())
            .prop_map(|(back_ms, limit)| Op::ListInFlight { back_ms, limit }),
        1 => (1usize..4).prop_map(|limit| Op::Purge { limit }),
        4 => clock_move().prop_map(|ms| Op::Advance { ms }),
    ]
}

pub(super) fn sequence_strategy(max_steps: usize) -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(op(), 1..=max_steps.max(1))
}
