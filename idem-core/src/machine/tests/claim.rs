//! `claim`: one test per row of the state table.

use super::*;

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
