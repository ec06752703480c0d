//! Checkpoints inside an operation ([contract §6.1](crate::contract#checkpoints)): saving a step
//! ([`Attempt::checkpoint`]), and the steps a resumed attempt starts with
//! ([`Attempt::checkpoints`]).

use serde::Serialize;
use serde::de::DeserializeOwned;

use super::Executor;
use super::attempt::Attempt;
use super::observe::timed;
use crate::checkpoint::{decode_checkpoint, encode_checkpoint};
use crate::codec::CodecContext;
use crate::machine::{self, CheckpointAnswer, ClaimKind};
use crate::{Checkpoint, CheckpointError, Error, RecordId, Token};

impl Attempt {
    /// The steps earlier attempts of this operation saved, in order, decoded by the executor's
    /// codec: empty on a first attempt; on a retry (after a release or a retryable outcome) or a
    /// takeover, what the attempts before it saved with [`Attempt::checkpoint`]. An operation
    /// skips the effects they say were done. Steps this attempt saves are not added here.
    ///
    /// An attempt made with [`Executor::attempt_for`](super::Executor::attempt_for) starts with
    /// none.
    pub fn checkpoints(&self) -> &[Checkpoint] {
        &self.resumed
    }

    /// The value of the latest step named `name` in [`Attempt::checkpoints`], read as `T`;
    /// `Ok(None)` if no earlier attempt saved it.
    pub fn checkpoint_value<T: DeserializeOwned>(
        &self,
        name: &str,
    ) -> Result<Option<T>, serde_json::Error> {
        self.resumed
            .iter()
            .rev()
            .find(|c| c.name() == name)
            .map(|c| serde_json::from_str(c.value()))
            .transpose()
    }

    /// Saves the step `name` with `value` (as JSON, encoded by the executor's codec like an
    /// outcome), so that the attempt after a crash starts with it in [`Attempt::checkpoints`].
    /// Call it right after the effect the step records.
    ///
    /// ```
    /// use idem_core::{Executor, Fingerprint, IdempotencyKey, MemoryStore, Outcome, Scope};
    /// use serde_json::json;
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let executor = Executor::new(MemoryStore::new());
    /// let (scope, key) = (Scope::new("shop/checkout").unwrap(), IdempotencyKey::new("order-7").unwrap());
    /// let fp = Fingerprint::of("checkout", &json!({"order": 7})).unwrap();
    /// executor.run(&scope, &key, &fp, |attempt| async move {
    ///     let charge: String = match attempt.checkpoint_value("charged").unwrap() {
    ///         Some(charge) => charge, // an earlier attempt charged: do not charge again
    ///         None => {
    ///             let charge = "ch_1".to_string(); // charge the card here
    ///             attempt.checkpoint("charged", &charge).await.unwrap();
    ///             charge
    ///         }
    ///     };
    ///     // send the receipt here
    ///     Outcome::definitive(200, &json!({"charge": charge})).unwrap()
    /// }).await.unwrap();
    /// # });
    /// ```
    ///
    /// # Errors
    ///
    /// [`CheckpointError::Fenced`] when a newer attempt holds the claim (nothing was written:
    /// stop, and start no further effect); [`CheckpointError::TooLarge`] over
    /// [`Policy::max_checkpoint_bytes`](crate::Policy::max_checkpoint_bytes) (checked on the
    /// encoded value, before the store is called); [`CheckpointError::Unsupported`] when the
    /// store does not keep checkpoints (it is no [`CheckpointStore`](crate::store::CheckpointStore),
    /// so it is not called); otherwise the serialiser's, the codec's or the store's
    /// failure.
    pub async fn checkpoint<T: Serialize + ?Sized>(
        &self,
        name: &str,
        value: &T,
    ) -> Result<(), CheckpointError> {
        let text = serde_json::to_string(value).map_err(CheckpointError::Serialize)?;
        let plain =
            Checkpoint::new(name, text, self.clock.now()).map_err(CheckpointError::Serialize)?;
        let cx = CodecContext::new(self.id.scope(), self.id.key());
        let stored = encode_checkpoint(self.codec.as_deref(), &cx, &plain)
            .map_err(CheckpointError::Encode)?;
        machine::check_checkpoint_size(&stored, &self.policy).map_err(CheckpointError::TooLarge)?;
        // A store without the capability is never asked: the executor answers for it.
        let Some(store) = self.store.as_checkpoint_store() else {
            return Err(CheckpointError::Unsupported {
                backend: self.store.backend(),
            });
        };
        let answer = timed(
            store,
            "checkpoint",
            store.checkpoint(&self.id, self.token, &stored, &self.policy),
        )
        .await?;
        match answer {
            CheckpointAnswer::Saved => {
                transition!(
                    INFO,
                    "checkpointed",
                    step = name,
                    size = stored.size(),
                    "checkpoint saved"
                );
                crate::metrics::count_checkpoint("saved");
                Ok(())
            }
            CheckpointAnswer::Fenced => {
                self.lease.lose();
                transition!(
                    WARN,
                    "fenced",
                    op = "checkpoint",
                    step = name,
                    "claim lost to a newer attempt; checkpoint not saved"
                );
                crate::metrics::count_checkpoint("fenced");
                Err(CheckpointError::Fenced)
            }
        }
    }
}

impl Executor {
    /// The steps a claim of `kind` resumes from: on a retry or a takeover, the record's
    /// checkpoints, read right after the claim and decoded; none otherwise (a new or replaced
    /// record has none) or when the store keeps none.
    pub(super) async fn resumed_checkpoints(
        &self,
        id: &RecordId,
        token: Token,
        kind: ClaimKind,
    ) -> Result<Vec<Checkpoint>, Error> {
        if !matches!(kind, ClaimKind::Retry | ClaimKind::TakenOver)
            || self.store.as_checkpoint_store().is_none()
        {
            return Ok(Vec::new());
        }
        let now = self.clock.now();
        let record = timed(&*self.store, "get", self.store.get(id, now)).await?;
        // Another token means the claim is already lost: the operation will be fenced, and it
        // must not act on a newer holder's steps.
        let Some(record) = record.filter(|r| r.token == token) else {
            return Ok(Vec::new());
        };
        let cx = CodecContext::new(id.scope(), id.key());
        record
            .checkpoints
            .iter()
            .map(|c| decode_checkpoint(self.codec.as_deref(), &cx, c))
            .collect::<Result<_, _>>()
            .map_err(Error::Decode)
    }
}
