//! A model-based property test: random steps against a model of the state table.

use super::*;

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

    /// Drives random sequences against one record and checks the invariants of contract
    /// [§2](crate::contract#states)–[§3](crate::contract#guarantees): at most one live holder,
    /// tokens strictly increase (and are never reused, even across a purge), a completed outcome
    /// never changes while the record lives, a mismatched fingerprint changes nothing.
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
