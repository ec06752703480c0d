//! Plays a checkpoint step on the store and on the model
//! ([contract §6.1](idem_core::contract#checkpoints)). A store that does not keep checkpoints
//! (no [`CheckpointStore`](idem_core::store::CheckpointStore)) is not asked; the model then
//! writes nothing either, and the record must be unchanged.

use idem_core::machine;
use idem_core::{Checkpoint, Policy, StoreError};

use super::{Checked, World};
use crate::model::SMALL_LIMIT;
use crate::model::ops::{Addr, Holder};

impl World {
    pub(super) async fn checkpoint(
        &mut self,
        at: Addr,
        holder: &Holder,
        step: u8,
        too_large: bool,
    ) -> Checked {
        let limit = if too_large {
            SMALL_LIMIT
        } else {
            Policy::DEFAULT_MAX_CHECKPOINT_BYTES
        };
        let policy = Policy::builder()
            .max_checkpoint_bytes(limit)
            .build()
            .expect("valid policy");
        let value = if too_large {
            format!("\"{}\"", "x".repeat(SMALL_LIMIT))
        } else {
            format!("{{ \"step\": {step}, \"note\": \"é 😀 \\\"q\\\"\" }}")
        };
        let checkpoint =
            Checkpoint::new(format!("step-{step}"), value, self.now).expect("JSON value");
        let (st, mt) = self.token(at, holder);
        let Some(store) = self.store.as_checkpoint_store() else {
            return self.compare_record(at).await;
        };
        let got = store
            .checkpoint(&self.id(at), st, &checkpoint, &policy)
            .await;
        let want = machine::checkpoint(self.model.get(&at), mt, &checkpoint, &policy);
        match (got, want) {
            (Ok(got), Ok(t)) if got == t.answer => {
                self.write(at, t);
            }
            (Err(StoreError::CheckpointTooLarge(got)), Err(want)) if got == want => {}
            (got, want) => {
                let want = want.map(|t| t.answer);
                return self.fail(format!(
                    "checkpoint {at}: the store answered\n    {got:?}\n  the model\n    {want:?}"
                ));
            }
        }
        self.compare_record(at).await
    }
}
