//! `release` and `extend`: the holder's lease.

use super::*;

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
