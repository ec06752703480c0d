//! One test per row of the state table, and a model-based property test.

use super::*;
use crate::{OutcomeClass, RecordState};
use proptest::prelude::*;

const LEASE: Duration = Duration::from_secs(30);
const TTL: Duration = Duration::from_secs(3600);

fn policy() -> Policy {
    Policy::builder().lease(LEASE).ttl(TTL).build().unwrap()
}

fn takeover() -> Policy {
    policy()
        .to_builder()
        .stale(StalePolicy::Takeover)
        .build()
        .unwrap()
}

fn t(ms: u64) -> Timestamp {
    Timestamp::from_millis(1_000_000 + ms)
}

struct Ids {
    scope: Scope,
    key: IdempotencyKey,
    fp: Fingerprint,
    other_fp: Fingerprint,
}

fn ids() -> Ids {
    Ids {
        scope: Scope::new("tenant/tool").unwrap(),
        key: IdempotencyKey::new("k-1").unwrap(),
        fp: Fingerprint::of_bytes(b"request"),
        other_fp: Fingerprint::of_bytes(b"other request"),
    }
}

fn req<'a>(ids: &'a Ids, fp: &'a Fingerprint, token_id: u128) -> ClaimRequest<'a> {
    ClaimRequest {
        scope: &ids.scope,
        key: &ids.key,
        fingerprint: fp,
        token_id,
    }
}

fn ok_outcome() -> Outcome {
    Outcome::definitive(201, &serde_json::json!({"id": 1})).unwrap()
}

fn retry_outcome() -> Outcome {
    Outcome::retryable(503, &serde_json::json!({"error": "down"})).unwrap()
}

/// A processing record claimed at `at`.
fn claimed(ids: &Ids, at: Timestamp) -> Record {
    claim(None, req(ids, &ids.fp, 7), at, &policy())
        .write
        .unwrap()
}

#[test]
fn none_is_claimed_as_attempt_one() {
    let ids = ids();
    let tr = claim(None, req(&ids, &ids.fp, 42), t(0), &policy());
    let token = Token::with_id(1, 42);
    assert_eq!(
        tr.answer,
        ClaimAnswer::Claimed {
            token,
            attempt: 1,
            kind: ClaimKind::New
        }
    );
    let r = tr.write.unwrap();
    assert_eq!(r.state, RecordState::Processing);
    assert_eq!(r.token, token);
    assert_eq!(r.fingerprint, ids.fp);
    assert_eq!(r.lease_until, t(0) + LEASE);
    assert_eq!(r.expires_at, t(0) + TTL);
    assert_eq!((r.created_at, r.updated_at), (t(0), t(0)));
    assert_eq!(r.outcome, None);
}

#[test]
fn expired_record_is_replaced_and_token_continues_upward() {
    let ids = ids();
    let mut old = claimed(&ids, t(0));
    old.state = RecordState::Completed;
    old.outcome = Some(ok_outcome());
    old.token = Token::with_id(5, 1);
    old.attempt = 3;
    // At expires_at exactly the record is gone; even another request may claim the key.
    let tr = claim(
        Some(&old),
        req(&ids, &ids.other_fp, 9),
        old.expires_at,
        &policy(),
    );
    assert_eq!(
        tr.answer,
        ClaimAnswer::Claimed {
            token: Token::with_id(6, 9),
            attempt: 1,
            kind: ClaimKind::ExpiredReplaced
        }
    );
    let r = tr.write.unwrap();
    assert_eq!(r.fingerprint, ids.other_fp);
    assert_eq!(r.created_at, old.expires_at);
}

#[test]
fn one_millisecond_before_expiry_the_record_still_counts() {
    let ids = ids();
    let mut old = claimed(&ids, t(0));
    old.state = RecordState::Completed;
    old.outcome = Some(ok_outcome());
    let at = old.expires_at - Duration::from_millis(1);
    let tr = claim(Some(&old), req(&ids, &ids.fp, 9), at, &policy());
    assert_eq!(tr.answer, ClaimAnswer::Replay(ok_outcome()));
    assert_eq!(tr.write, None);
}

#[test]
fn mismatch_in_every_state_writes_nothing() {
    let ids = ids();
    let processing = claimed(&ids, t(0));
    let completed = Record {
        state: RecordState::Completed,
        outcome: Some(ok_outcome()),
        ..processing.clone()
    };
    let failed = Record {
        state: RecordState::FailedRetryable,
        ..processing.clone()
    };
    for r in [&processing, &completed, &failed] {
        for at in [t(1), t(0) + LEASE + Duration::from_secs(1)] {
            for p in [policy(), takeover()] {
                let tr = claim(Some(r), req(&ids, &ids.other_fp, 9), at, &p);
                assert_eq!(tr.answer, ClaimAnswer::FingerprintMismatch, "{:?}", r.state);
                assert_eq!(tr.write, None);
            }
        }
    }
}

#[test]
fn processing_with_running_lease_is_in_flight() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let tr = claim(Some(&r), req(&ids, &ids.fp, 9), t(10_000), &takeover());
    assert_eq!(
        tr.answer,
        ClaimAnswer::InFlight {
            retry_after: Duration::from_secs(20),
            stale: false
        }
    );
    assert_eq!(tr.write, None);
    // One millisecond before the lease ends: still in flight, never a zero wait.
    let tr = claim(
        Some(&r),
        req(&ids, &ids.fp, 9),
        r.lease_until - Duration::from_millis(1),
        &policy(),
    );
    assert_eq!(
        tr.answer,
        ClaimAnswer::InFlight {
            retry_after: Duration::from_millis(1),
            stale: false
        }
    );
}

#[test]
fn stale_processing_under_reconcile_is_stale_in_flight() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let tr = claim(Some(&r), req(&ids, &ids.fp, 9), r.lease_until, &policy());
    assert_eq!(
        tr.answer,
        ClaimAnswer::InFlight {
            retry_after: LEASE,
            stale: true
        }
    );
    assert_eq!(tr.write, None);
}

#[test]
fn stale_processing_under_takeover_is_claimed_with_next_token() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let at = r.lease_until + Duration::from_secs(1);
    let tr = claim(Some(&r), req(&ids, &ids.fp, 9), at, &takeover());
    let token = Token::with_id(2, 9);
    assert_eq!(
        tr.answer,
        ClaimAnswer::Claimed {
            token,
            attempt: 2,
            kind: ClaimKind::TakenOver
        }
    );
    let w = tr.write.unwrap();
    assert_eq!(
        (w.token, w.attempt, w.state),
        (token, 2, RecordState::Processing)
    );
    assert_eq!(w.lease_until, at + LEASE);
    assert_eq!(w.created_at, r.created_at);
}

#[test]
fn completed_replays_and_writes_nothing() {
    let ids = ids();
    let r = Record {
        state: RecordState::Completed,
        outcome: Some(ok_outcome()),
        ..claimed(&ids, t(0))
    };
    let tr = claim(Some(&r), req(&ids, &ids.fp, 9), t(100_000), &takeover());
    assert_eq!(tr.answer, ClaimAnswer::Replay(ok_outcome()));
    assert_eq!(tr.write, None);
}

#[test]
fn failed_retryable_is_claimed_again() {
    let ids = ids();
    let r = Record {
        state: RecordState::FailedRetryable,
        outcome: Some(retry_outcome()),
        ..claimed(&ids, t(0))
    };
    let tr = claim(Some(&r), req(&ids, &ids.fp, 9), t(5), &policy());
    assert_eq!(
        tr.answer,
        ClaimAnswer::Claimed {
            token: Token::with_id(2, 9),
            attempt: 2,
            kind: ClaimKind::Retry
        }
    );
    let w = tr.write.unwrap();
    assert_eq!(w.state, RecordState::Processing);
    assert_eq!(w.outcome, None);
}

#[test]
fn complete_definitive_completes() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    for p in [
        policy(),
        policy()
            .to_builder()
            .cache(CachePolicy::CacheAll)
            .build()
            .unwrap(),
    ] {
        let tr = complete(Some(&r), r.token, &ok_outcome(), t(50), &p).unwrap();
        assert_eq!(tr.answer, CompleteAnswer::Completed);
        let w = tr.write.unwrap();
        assert_eq!(w.state, RecordState::Completed);
        assert_eq!(w.outcome, Some(ok_outcome()));
        assert_eq!(w.fingerprint, r.fingerprint);
        assert_eq!(w.expires_at, t(50) + TTL);
    }
}

#[test]
fn complete_retryable_depends_on_cache_policy() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let tr = complete(Some(&r), r.token, &retry_outcome(), t(50), &policy()).unwrap();
    assert_eq!(tr.answer, CompleteAnswer::MarkedRetryable);
    assert_eq!(tr.write.unwrap().state, RecordState::FailedRetryable);
    let all = policy()
        .to_builder()
        .cache(CachePolicy::CacheAll)
        .build()
        .unwrap();
    let tr = complete(Some(&r), r.token, &retry_outcome(), t(50), &all).unwrap();
    assert_eq!(tr.answer, CompleteAnswer::Completed);
    let w = tr.write.unwrap();
    assert_eq!(w.state, RecordState::Completed);
    assert_eq!(w.outcome.unwrap().class(), OutcomeClass::Retryable);
}

#[test]
fn complete_release_extend_are_fenced_unless_current_processing_token() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let other = Token::with_id(r.token.seq, r.token.id ^ 1);
    let older = Token::with_id(r.token.seq - 1, r.token.id);
    let completed = Record {
        state: RecordState::Completed,
        outcome: Some(ok_outcome()),
        ..r.clone()
    };
    let failed = Record {
        state: RecordState::FailedRetryable,
        ..r.clone()
    };
    let cases: Vec<(Option<&Record>, Token, Timestamp)> = vec![
        (None, r.token, t(1)),
        (Some(&r), other, t(1)),
        (Some(&r), older, t(1)),
        (Some(&completed), r.token, t(1)),
        (Some(&failed), r.token, t(1)),
        (Some(&r), r.token, r.expires_at), // expired: as if absent
    ];
    for (found, token, at) in cases {
        let c = complete(found, token, &ok_outcome(), at, &policy()).unwrap();
        assert_eq!((c.answer, &c.write), (CompleteAnswer::Fenced, &None));
        let rl = release(found, token, at);
        assert_eq!((rl.answer, &rl.write), (ReleaseAnswer::Fenced, &None));
        let e = extend(found, token, LEASE, at).unwrap();
        assert_eq!((e.answer, &e.write), (ExtendAnswer::Fenced, &None));
    }
}

#[test]
fn holder_may_act_after_its_lease_elapsed_if_nobody_took_over() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let late = r.lease_until + Duration::from_secs(5);
    let tr = complete(Some(&r), r.token, &ok_outcome(), late, &policy()).unwrap();
    assert_eq!(tr.answer, CompleteAnswer::Completed);
}

#[test]
fn release_marks_failed_retryable() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let tr = release(Some(&r), r.token, t(10));
    assert_eq!(tr.answer, ReleaseAnswer::Released);
    let w = tr.write.unwrap();
    assert_eq!(
        (w.state, w.token, w.updated_at),
        (RecordState::FailedRetryable, r.token, t(10))
    );
}

#[test]
fn extend_moves_lease_and_keeps_expiry_margin() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let at = t(0) + Duration::from_secs(20);
    let tr = extend(Some(&r), r.token, Duration::from_secs(600), at).unwrap();
    let lease_until = at + Duration::from_secs(600);
    assert_eq!(tr.answer, ExtendAnswer::Extended { lease_until });
    let w = tr.write.unwrap();
    assert_eq!(w.lease_until, lease_until);
    // Margin between lease end and expiry was TTL - LEASE; it is kept.
    assert_eq!(w.expires_at, lease_until + (TTL - LEASE));
    // A short extension never shortens the life of the record, nor its lease.
    let tr = extend(Some(&r), r.token, Duration::from_millis(1), at).unwrap();
    assert_eq!(
        tr.answer,
        ExtendAnswer::Extended {
            lease_until: r.lease_until
        }
    );
    let w = tr.write.unwrap();
    assert_eq!((w.lease_until, w.expires_at), (r.lease_until, r.expires_at));
}

#[test]
fn extend_never_shortens_the_lease() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let long = extend(Some(&r), r.token, Duration::from_secs(600), t(10))
        .unwrap()
        .write
        .unwrap();
    // A later, shorter heartbeat keeps the later deadline.
    let tr = extend(Some(&long), r.token, Duration::from_secs(5), t(20)).unwrap();
    assert_eq!(
        tr.answer,
        ExtendAnswer::Extended {
            lease_until: long.lease_until
        }
    );
    let w = tr.write.unwrap();
    assert_eq!(
        (w.lease_until, w.expires_at, w.updated_at),
        (long.lease_until, long.expires_at, t(20))
    );
    // A longer one moves it.
    let tr = extend(Some(&long), r.token, Duration::from_secs(900), t(20)).unwrap();
    assert_eq!(
        tr.answer,
        ExtendAnswer::Extended {
            lease_until: t(20) + Duration::from_secs(900)
        }
    );
}

#[test]
fn extend_refuses_a_zero_lease_whatever_the_record() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let other = Token::with_id(r.token.seq + 1, 7);
    for lease in [Duration::ZERO, Duration::from_micros(999)] {
        for (found, token) in [(Some(&r), r.token), (Some(&r), other), (None, r.token)] {
            assert_eq!(extend(found, token, lease, t(1)), Err(ZeroLease { lease }));
        }
    }
    assert!(extend(Some(&r), r.token, Duration::from_millis(1), t(1)).is_ok());
}

#[test]
fn outcome_over_limit_is_refused_whatever_the_record() {
    let ids = ids();
    let r = claimed(&ids, t(0));
    let small = policy().to_builder().max_outcome_bytes(10).build().unwrap();
    let big = Outcome::from_json_text(200, "\"0123456789\"", OutcomeClass::Definitive).unwrap();
    assert_eq!(
        complete(Some(&r), r.token, &big, t(1), &small),
        Err(OutcomeTooLarge {
            size: 12,
            limit: 10
        })
    );
    assert_eq!(
        complete(None, r.token, &big, t(1), &small),
        Err(OutcomeTooLarge {
            size: 12,
            limit: 10
        })
    );
    let exact = Outcome::from_json_text(200, "\"01234567\"", OutcomeClass::Definitive).unwrap();
    assert!(complete(Some(&r), r.token, &exact, t(1), &small).is_ok());
}

#[test]
fn completed_record_without_outcome_is_never_rerun() {
    let ids = ids();
    let r = Record {
        state: RecordState::Completed,
        outcome: None,
        ..claimed(&ids, t(0))
    };
    let tr = claim(Some(&r), req(&ids, &ids.fp, 9), t(1), &takeover());
    assert!(matches!(
        tr.answer,
        ClaimAnswer::InFlight { stale: true, .. }
    ));
}

// ---- Model-based property test -------------------------------------------------------------

#[derive(Debug, Clone)]
enum Step {
    Claim { same_fp: bool },
    Complete { holder: usize, retryable: bool },
    Release { holder: usize },
    Extend { holder: usize, lease_ms: u64 },
    Advance { ms: u64 },
    Purge,
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        4 => Just(Step::Claim { same_fp: true }),
        1 => Just(Step::Claim { same_fp: false }),
        3 => (0usize..8, any::<bool>()).prop_map(|(holder, retryable)| Step::Complete { holder, retryable }),
        1 => (0usize..8).prop_map(|holder| Step::Release { holder }),
        1 => (0usize..8, 1u64..60_000).prop_map(|(holder, lease_ms)| Step::Extend { holder, lease_ms }),
        3 => prop_oneof![1u64..40_000, 3_000_000u64..4_000_000].prop_map(|ms| Step::Advance { ms }),
        1 => Just(Step::Purge),
    ]
}

fn policies() -> impl Strategy<Value = Policy> {
    (any::<bool>(), any::<bool>()).prop_map(|(takeover, cache_all)| {
        Policy::builder()
            .lease(LEASE)
            .ttl(TTL)
            .stale(if takeover {
                StalePolicy::Takeover
            } else {
                StalePolicy::Reconcile
            })
            .cache(if cache_all {
                CachePolicy::CacheAll
            } else {
                CachePolicy::DefinitiveOnly
            })
            .build()
            .unwrap()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Drives random sequences against one record and checks the invariants of contract [§2](crate::contract#states)–[§3](crate::contract#guarantees):
    /// at most one live holder, tokens strictly increase (and are never reused, even across a
    /// purge), a completed outcome never changes while the record lives, a mismatched fingerprint
    /// changes nothing.
    #[test]
    fn invariants_hold_for_any_sequence(policy in policies(), steps in proptest::collection::vec(step(), 1..60)) {
        let ids = ids();
        let mut now = t(0);
        let mut record: Option<Record> = None;
        let mut holders: Vec<Token> = Vec::new();
        let mut seen: std::collections::HashSet<Token> = Default::default();
        let mut next_id: u128 = 1;
        let mut last_token: Option<Token> = None;

        for s in steps {
            let before = record.clone();
            match s {
                Step::Claim { same_fp } => {
                    let fp = if same_fp { &ids.fp } else { &ids.other_fp };
                    next_id += 1;
                    let tr = claim(record.as_ref(), req(&ids, fp, next_id), now, &policy);
                    let live = record.as_ref().filter(|r| !r.is_expired(now));
                    match &tr.answer {
                        ClaimAnswer::FingerprintMismatch => {
                            prop_assert!(tr.write.is_none());
                            prop_assert!(live.is_some_and(|r| &r.fingerprint != fp));
                        }
                        ClaimAnswer::Claimed { token, .. } => {
                            prop_assert!(seen.insert(*token), "token reused");
                            if let (Some(last), Some(_)) = (last_token, record.as_ref()) {
                                prop_assert!(*token > last, "token did not increase");
                            }
                            last_token = Some(*token);
                            holders.push(*token);
                            // Exactly one holder can act: every earlier token is now fenced.
                            let w = tr.write.clone().unwrap();
                            for old in holders.iter().filter(|h| *h != token) {
                                prop_assert_eq!(release(Some(&w), *old, now).answer, ReleaseAnswer::Fenced);
                            }
                        }
                        ClaimAnswer::Replay(o) => {
                            let r = live.unwrap();
                            prop_assert_eq!(r.state, RecordState::Completed);
                            prop_assert_eq!(Some(o), r.outcome.as_ref());
                        }
                        ClaimAnswer::InFlight { retry_after, .. } => {
                            prop_assert!(*retry_after > Duration::ZERO);
                            prop_assert_eq!(live.unwrap().state, RecordState::Processing);
                        }
                    }
                    if let Some(w) = tr.write { record = Some(w); }
                }
                Step::Complete { holder, retryable } => {
                    let Some(&token) = holders.get(holder % holders.len().max(1)) else { continue };
                    let o = if retryable { retry_outcome() } else { ok_outcome() };
                    let tr = complete(record.as_ref(), token, &o, now, &policy).unwrap();
                    if let Some(w) = tr.write { record = Some(w); }
                }
                Step::Release { holder } => {
                    let Some(&token) = holders.get(holder % holders.len().max(1)) else { continue };
                    if let Some(w) = release(record.as_ref(), token, now).write { record = Some(w); }
                }
                Step::Extend { holder, lease_ms } => {
                    let Some(&token) = holders.get(holder % holders.len().max(1)) else { continue };
                    let tr = extend(record.as_ref(), token, Duration::from_millis(lease_ms), now).unwrap();
                    let held_lease = record.as_ref().filter(|r| r.token == token && r.state == RecordState::Processing && !r.is_expired(now)).map(|r| r.lease_until);
                    if let (Some(old), Some(w)) = (held_lease, &tr.write) {
                        prop_assert!(w.lease_until >= old, "extend shortened a lease");
                    }
                    if let Some(w) = tr.write { record = Some(w); }
                }
                Step::Advance { ms } => now = now + Duration::from_millis(ms),
                Step::Purge => {
                    if record.as_ref().is_some_and(|r| r.is_expired(now)) {
                        record = None;
                        last_token = None; // seq may restart; uniqueness still holds via `seen`
                    }
                }
            }

            // A completed outcome never changes while the record lives.
            if let (Some(b), Some(a)) = (&before, &record) {
                if b.state == RecordState::Completed && !b.is_expired(now) {
                    prop_assert_eq!(a, b, "a live completed record changed");
                }
                if !b.is_expired(now) {
                    prop_assert_eq!(&a.fingerprint, &b.fingerprint, "fingerprint changed on a live record");
                }
            }
            // At most one live holder: only the record's token can act, and only when processing.
            if let Some(r) = &record {
                let able: Vec<_> = holders.iter()
                    .filter(|h| extend(Some(r), **h, LEASE, now).unwrap().answer != ExtendAnswer::Fenced)
                    .collect();
                prop_assert!(able.len() <= 1);
                if let Some(h) = able.first() {
                    prop_assert_eq!(**h, r.token);
                    prop_assert_eq!(r.state, RecordState::Processing);
                }
            }
        }
    }
}
