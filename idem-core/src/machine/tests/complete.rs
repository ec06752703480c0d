//! `complete`: fencing, the cache policy, the size limit.

use super::*;

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
