//! The checkpoint rule ([contract §6.1](crate::contract#checkpoints)).

use crate::{Checkpoint, Policy, Record, Token};

use super::{CheckpointTooLarge, Transition, held};

/// The answer to `checkpoint` ([contract §6.1](crate::contract#checkpoints)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckpointAnswer {
    /// The step is saved, after the record's earlier checkpoints.
    Saved,
    /// The caller does not hold the current claim; nothing was written.
    Fenced,
}

/// Checks a checkpoint against the policy's size limit.
pub fn check_checkpoint_size(
    checkpoint: &Checkpoint,
    policy: &Policy,
) -> Result<(), CheckpointTooLarge> {
    if checkpoint.size() > policy.max_checkpoint_bytes() {
        return Err(CheckpointTooLarge {
            size: checkpoint.size(),
            limit: policy.max_checkpoint_bytes(),
        });
    }
    Ok(())
}

/// The checkpoint rule: refuses a checkpoint over the size limit whatever the record; then, for
/// the holder of `token` (a live `processing` record with exactly this token, as for
/// [`complete`](super::complete)), appends `checkpoint` to the record's checkpoints and sets
/// `updated_at`; anything else is `Fenced` and writes nothing. `now` is
/// [`Checkpoint::saved_at`].
///
/// The other rules keep the checkpoints through a release, a retryable outcome kept as
/// `failed_retryable`, an extend and a claim that takes the record over or retries it; a
/// completion that leaves the record `completed` drops them, and an expired record is replaced
/// without them.
pub fn checkpoint(
    found: Option<&Record>,
    token: Token,
    checkpoint: &Checkpoint,
    policy: &Policy,
) -> Result<Transition<CheckpointAnswer>, CheckpointTooLarge> {
    check_checkpoint_size(checkpoint, policy)?;
    let now = checkpoint.saved_at();
    let Some(record) = held(found, token, now) else {
        return Ok(Transition::answer(CheckpointAnswer::Fenced));
    };
    let mut write = record.clone();
    write.checkpoints.push(checkpoint.clone());
    write.updated_at = now;
    Ok(Transition {
        answer: CheckpointAnswer::Saved,
        write: Some(write),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::machine::{ClaimAnswer, ClaimRequest, claim, complete, extend, release};
    use crate::{
        Fingerprint, IdempotencyKey, Outcome, RecordId, RecordState, Scope, StalePolicy, Timestamp,
    };

    const LEASE: Duration = Duration::from_secs(30);

    fn policy() -> Policy {
        Policy::builder()
            .lease(LEASE)
            .stale(StalePolicy::Takeover)
            .max_checkpoint_bytes(32)
            .build()
            .unwrap()
    }

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(1_000_000 + ms)
    }

    fn cp(name: &str, at: Timestamp) -> Checkpoint {
        Checkpoint::new(name, "{\"n\": 1}", at).unwrap()
    }

    /// A processing record claimed at `t(0)`, with its token.
    fn claimed(scope: &Scope, key: &IdempotencyKey, fp: &Fingerprint) -> (Record, Token) {
        let tr = claim(
            None,
            ClaimRequest::new(&RecordId::new(scope.clone(), key.clone()), fp),
            t(0),
            &policy(),
        );
        let ClaimAnswer::Claimed { token, .. } = tr.answer else {
            unreachable!()
        };
        (tr.write.unwrap(), token)
    }

    fn saved(record: &Record, token: Token, name: &str, at: Timestamp) -> Record {
        let tr = checkpoint(Some(record), token, &cp(name, at), &policy()).unwrap();
        assert_eq!(tr.answer, CheckpointAnswer::Saved);
        tr.write.unwrap()
    }

    #[test]
    fn only_the_holder_saves_and_in_order() {
        let (s, k, fp) = (
            Scope::new("s").unwrap(),
            IdempotencyKey::new("k").unwrap(),
            Fingerprint::of_bytes(b"r"),
        );
        let (r, token) = claimed(&s, &k, &fp);
        let r = saved(&r, token, "a", t(1));
        let r = saved(&r, token, "b", t(2));
        assert_eq!(r.updated_at, t(2));
        let names: Vec<&str> = r.checkpoints.iter().map(|c| c.name()).collect();
        assert_eq!(names, ["a", "b"]);

        let other = Token::with_id(token.seq, token.id ^ 1);
        let completed = Record {
            state: RecordState::Completed,
            ..r.clone()
        };
        for (found, token, at) in [
            (None, token, t(3)),
            (Some(&r), other, t(3)),
            (Some(&completed), token, t(3)),
            (Some(&r), token, r.expires_at),
        ] {
            let tr = checkpoint(found, token, &cp("c", at), &policy()).unwrap();
            assert_eq!(tr.answer, CheckpointAnswer::Fenced);
            assert_eq!(tr.write, None);
        }
        // Too large: refused whatever the record.
        let big = Checkpoint::new("big", format!("\"{}\"", "x".repeat(40)), t(3)).unwrap();
        assert_eq!(
            checkpoint(None, token, &big, &policy()).unwrap_err(),
            CheckpointTooLarge {
                size: 45,
                limit: 32
            }
        );
    }

    #[test]
    fn release_retry_takeover_and_extend_keep_them_completion_and_expiry_end_them() {
        let (s, k, fp) = (
            Scope::new("s").unwrap(),
            IdempotencyKey::new("k").unwrap(),
            Fingerprint::of_bytes(b"r"),
        );
        let p = policy();
        let (r, token) = claimed(&s, &k, &fp);
        let r = saved(&r, token, "a", t(1));
        let kept = |r: &Record| assert_eq!(r.checkpoints.len(), 1, "{r:?}");

        let extended = extend(Some(&r), token, LEASE, t(2)).unwrap().write.unwrap();
        kept(&extended);
        let released = release(Some(&r), token, t(2)).write.unwrap();
        kept(&released);
        let id = RecordId::new(s.clone(), k.clone());
        let retried = claim(Some(&released), ClaimRequest::new(&id, &fp), t(3), &p);
        kept(retried.write.as_ref().unwrap());
        let late = t(0) + LEASE + Duration::from_millis(1);
        let taken = claim(Some(&r), ClaimRequest::new(&id, &fp), late, &p);
        kept(taken.write.as_ref().unwrap());
        let retryable = Outcome::retryable(503, &serde_json::json!({})).unwrap();
        let marked = complete(Some(&r), token, &retryable, t(2), &p).unwrap();
        kept(marked.write.as_ref().unwrap());

        let ok = Outcome::definitive(200, &serde_json::json!({})).unwrap();
        let done = complete(Some(&r), token, &ok, t(2), &p)
            .unwrap()
            .write
            .unwrap();
        assert!(done.checkpoints.is_empty());
        let replaced = claim(Some(&r), ClaimRequest::new(&id, &fp), r.expires_at, &p);
        assert!(replaced.write.unwrap().checkpoints.is_empty());
    }
}
