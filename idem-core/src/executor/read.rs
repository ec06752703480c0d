//! [`Executor::read`]: a record as the executor replays it, its outcome decoded.

use super::Executor;
use crate::codec::{CodecContext, decode_outcome};
use crate::{Error, IdempotencyKey, Record, RecordId, Scope};

impl Executor {
    /// The record of (`scope`, `key`) at the executor's clock, `None` if there is none or it
    /// has expired, with its stored outcome decoded by the executor's [codec](crate::codec) as
    /// a replay would be: what a status read answers (MCP's `tasks/get`, an operator's view).
    /// Nothing is claimed or changed. A stored outcome that does not decode is
    /// [`Error::Decode`]; a store that cannot answer, [`Error::Store`].
    pub async fn read(&self, scope: &Scope, key: &IdempotencyKey) -> Result<Option<Record>, Error> {
        let now = self.clock.now();
        let Some(mut record) = self
            .store
            .get(&RecordId::new(scope.clone(), key.clone()), now)
            .await?
        else {
            return Ok(None);
        };
        if let Some(stored) = record.outcome.take() {
            let cx = CodecContext::new(scope, key);
            record.outcome =
                Some(decode_outcome(self.codec.as_deref(), &cx, stored).map_err(Error::Decode)?);
        }
        Ok(Some(record))
    }
}
