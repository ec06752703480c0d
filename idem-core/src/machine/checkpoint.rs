//! The checkpoint rule ([contract §6.1](crate::contract#checkpoints)).

use crate::{Checkpoint, Policy, Record, Token};

use super::{Transition, held};

/// The answer to `checkpoint` ([contract §6.1](crate::contract#checkpoints)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckpointAnswer {
    /// The step is saved, after the record's earlier checkpoints.
    Saved,
    /// The caller does not hold the current claim; nothing was written.
    Fenced,
}

/// A checkpoint over [`Policy::max_checkpoint_bytes`]: refused, nothing written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("checkpoint is {size} bytes (name and value), over the limit of {limit} bytes; nothing was saved")]
pub struct CheckpointTooLarge {
    /// The checkpoint's size in bytes ([`Checkpoint::size`]).
    pub size: usize,
    /// The limit in bytes.
    pub limit: usize,
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
