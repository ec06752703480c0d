//! Checkpoints: the named steps an operation with several effects saves as it goes, so that the
//! attempt after a crash resumes instead of starting over
//! ([contract §6.1](crate::contract#checkpoints)).
//!
//! A [`Checkpoint`] is a name, a small JSON value and the instant it was saved. A record keeps
//! its checkpoints in the order they were saved (saving a name again adds another entry; a lookup
//! by name sees the latest). The rules (fencing, size limit, what keeps and what ends them) are
//! [`machine::checkpoint`](crate::machine::checkpoint)'s; the store operation is
//! [`CheckpointStore::checkpoint`](crate::store::CheckpointStore::checkpoint); operations save and read them through
//! [`Attempt::checkpoint`](crate::Attempt::checkpoint) and
//! [`Attempt::checkpoints`](crate::Attempt::checkpoints).
//!
//! Stores keep the list in one text column, written and read by
//! [`store::columns`](crate::store::columns).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::codec::{CodecContext, CodecError, OutcomeCodec, decode_outcome, encode_outcome};
use crate::store::error::CheckpointTooLarge;
use crate::{Outcome, OutcomeClass, StoreError, Timestamp};

/// One saved step: a name, a JSON value (as the exact text stored: encoded by the executor's
/// codec where there is one) and when it was saved.
///
/// Checkpoints are the named steps an operation with several effects saves as it goes, so that the
/// attempt after a crash resumes instead of starting over ([contract
/// §6.1](crate::contract#checkpoints)). A record keeps its checkpoints in the order they were saved
/// (saving a name again adds another entry; a lookup by name sees the latest). The rules (fencing,
/// size limit, what keeps and what ends them) are
/// [`machine::checkpoint`](crate::machine::checkpoint)'s; the store operation is
/// [`CheckpointStore::checkpoint`](crate::store::CheckpointStore::checkpoint); operations save and read them through
/// [`Attempt::checkpoint`](crate::Attempt::checkpoint) and
/// [`Attempt::checkpoints`](crate::Attempt::checkpoints).
///
/// Its `Debug` shows the name, the value's size and the time, never the value: stored values
/// are never logged.
///
/// ```
/// use idem_core::{Checkpoint, Timestamp};
/// let c = Checkpoint::new("charged", r#"{"charge_id":"ch_1"}"#, Timestamp::from_millis(5)).unwrap();
/// assert_eq!((c.name(), c.value(), c.size()), ("charged", r#"{"charge_id":"ch_1"}"#, 27));
/// assert!(Checkpoint::new("charged", "not json", Timestamp::from_millis(5)).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    name: String,
    value: String,
    saved_at: Timestamp,
}

impl Checkpoint {
    /// A checkpoint whose value is the JSON text `value`, kept exactly as given; refused if it
    /// is not JSON that reads back as a value.
    pub fn new(
        name: impl Into<String>,
        value: impl Into<String>,
        saved_at: Timestamp,
    ) -> Result<Self, serde_json::Error> {
        let value = value.into();
        serde_json::from_str::<serde_json::Value>(&value)?;
        Ok(Self {
            name: name.into(),
            value,
            saved_at,
        })
    }

    /// The step's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The value, as the exact JSON text stored.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The value parsed as a JSON value.
    pub fn value_json(&self) -> serde_json::Value {
        // Validated at construction.
        serde_json::from_str(&self.value).unwrap_or(serde_json::Value::Null)
    }

    /// When it was saved (the caller's clock).
    pub fn saved_at(&self) -> Timestamp {
        self.saved_at
    }

    /// The size counted against [`Policy::max_checkpoint_bytes`](crate::Policy): the name's
    /// bytes plus the value's.
    pub fn size(&self) -> usize {
        self.name.len() + self.value.len()
    }

    /// The same step with another value (JSON text, already checked by the caller).
    fn with_value(&self, value: String) -> Self {
        Self {
            value,
            ..self.clone()
        }
    }
}

/// The status of the outcome a checkpoint value travels in through a codec: no response has
/// it, so an encrypted checkpoint value does not open as an outcome (the codec binds the status).
const CODEC_STATUS: u16 = 0;

/// The checkpoint to store for `checkpoint`: its value encoded by `codec` as an outcome body
/// would be. Without a codec, `checkpoint` itself.
pub(crate) fn encode_checkpoint(
    codec: Option<&dyn OutcomeCodec>,
    cx: &CodecContext<'_>,
    checkpoint: &Checkpoint,
) -> Result<Checkpoint, CodecError> {
    let Some(codec) = codec else {
        return Ok(checkpoint.clone());
    };
    let carrier = carrier(checkpoint)?;
    let encoded = encode_outcome(Some(codec), cx, &carrier)?;
    Ok(checkpoint.with_value(encoded.body().to_owned()))
}

/// The checkpoint as the operation saved it, for the stored `checkpoint`: its value decoded by
/// `codec`. Without a codec, `checkpoint` itself.
pub(crate) fn decode_checkpoint(
    codec: Option<&dyn OutcomeCodec>,
    cx: &CodecContext<'_>,
    checkpoint: &Checkpoint,
) -> Result<Checkpoint, CodecError> {
    let Some(codec) = codec else {
        return Ok(checkpoint.clone());
    };
    let decoded = decode_outcome(Some(codec), cx, carrier(checkpoint)?)?;
    Ok(checkpoint.with_value(decoded.body().to_owned()))
}

fn carrier(checkpoint: &Checkpoint) -> Result<Outcome, CodecError> {
    Outcome::from_json_text(CODEC_STATUS, checkpoint.value(), OutcomeClass::Definitive)
        .map_err(CodecError::InvalidJson)
}

impl fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Checkpoint")
            .field("name", &self.name)
            .field("value_bytes", &self.value.len())
            .field("saved_at", &self.saved_at)
            .finish()
    }
}

/// Why [`Attempt::checkpoint`](crate::Attempt::checkpoint) saved nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CheckpointError {
    /// A newer attempt holds the claim: nothing was written. Stop, and start no further effect.
    #[error("the attempt lost its claim to a newer attempt; the checkpoint was not saved")]
    Fenced,
    /// The value (with its name) is over [`Policy::max_checkpoint_bytes`](crate::Policy): nothing
    /// was written.
    #[error(transparent)]
    TooLarge(CheckpointTooLarge),
    /// The store does not keep checkpoints (it is no
    /// [`CheckpointStore`](crate::store::CheckpointStore)): the executor did not ask it, and
    /// nothing was written.
    #[error("the store ({backend}) does not support checkpoints; nothing was saved")]
    Unsupported {
        /// The store's [`KeyStore::backend`](crate::KeyStore::backend).
        backend: &'static str,
    },
    /// The value could not be serialised as JSON.
    #[error("the checkpoint value could not be serialised as JSON")]
    Serialize(#[source] serde_json::Error),
    /// The executor's codec could not encode the value, so nothing was stored.
    #[error("the checkpoint value could not be encoded")]
    Encode(#[source] CodecError),
    /// The store failed; the checkpoint may or may not have been saved.
    #[error(transparent)]
    Store(StoreError),
}

impl From<StoreError> for CheckpointError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::CheckpointTooLarge(e) => Self::TooLarge(e),
            e => Self::Store(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cp(name: &str, value: &str, at: u64) -> Checkpoint {
        Checkpoint::new(name, value, Timestamp::from_millis(at)).unwrap()
    }

    #[test]
    fn debug_hides_the_value() {
        let shown = format!("{:?}", cp("charged", "\"4242-secret\"", 1));
        assert!(
            shown.contains("charged") && !shown.contains("secret"),
            "{shown}"
        );
    }
}
