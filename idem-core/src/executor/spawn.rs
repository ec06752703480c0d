//! Where the executor runs its claim and completion tasks: on the current tokio runtime (the
//! default with the `tokio` feature), through the caller's spawner, or inline.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// A future handed to a [`Executor::with_spawner`](super::Executor::with_spawner) spawner.
pub type BackgroundTask = Pin<Box<dyn Future<Output = ()> + Send + 'static>>;

/// A spawner: starts a background task.
pub(super) type Spawner = Arc<dyn Fn(BackgroundTask) + Send + Sync>;

/// How the executor runs its claim and completion tasks.
#[derive(Clone)]
pub(super) enum Spawn {
    /// Inline, in the caller's task.
    Inline,
    /// On the tokio runtime current when a task starts; inline where there is none.
    #[cfg(feature = "tokio")]
    Tokio,
    /// Through the caller's spawner.
    With(Spawner),
}

impl Spawn {
    /// The executor's default: [`Spawn::Tokio`] with the `tokio` feature, else [`Spawn::Inline`].
    pub(super) fn default_for_build() -> Self {
        #[cfg(feature = "tokio")]
        return Self::Tokio;
        #[cfg(not(feature = "tokio"))]
        return Self::Inline;
    }

    /// The spawner to start a task with here and now, if any. The tokio runtime is looked up
    /// now, not when the executor was built: an executor is often built before its runtime
    /// starts (in `main`, a static, a test's setup) or shared by several runtimes, and a handle
    /// kept from construction could outlive its runtime.
    pub(super) fn here(&self) -> Option<Spawner> {
        match self {
            Self::Inline => None,
            #[cfg(feature = "tokio")]
            Self::Tokio => tokio::runtime::Handle::try_current()
                .is_ok()
                .then(tokio_spawner),
            Self::With(spawner) => Some(spawner.clone()),
        }
    }

    /// The spawner to detach a whole call with ([`Executor::execute`](super::Executor::execute)):
    /// the caller's, else the current tokio runtime's, also for an executor that runs its claim
    /// and completion inline (the call's own task protects them); `None` where there is neither.
    pub(super) fn detached(&self) -> Option<Spawner> {
        match self {
            Self::With(spawner) => Some(spawner.clone()),
            #[cfg(feature = "tokio")]
            _ => tokio::runtime::Handle::try_current()
                .is_ok()
                .then(tokio_spawner),
            #[cfg(not(feature = "tokio"))]
            _ => None,
        }
    }

    /// For `Debug`: `inline`, `tokio` or `custom`.
    pub(super) fn name(&self) -> &'static str {
        match self {
            Self::Inline => "inline",
            #[cfg(feature = "tokio")]
            Self::Tokio => "tokio",
            Self::With(_) => "custom",
        }
    }
}

/// Spawns on the tokio runtime current when it is called. Outside one (a guard dropped after its
/// runtime ended) the task is dropped unstarted: a claim it would have released is left to its
/// lease, as without a spawner.
#[cfg(feature = "tokio")]
fn tokio_spawner() -> Spawner {
    Arc::new(|task| {
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(task);
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_a_runtime_the_default_spawns_nothing() {
        // Inline, as an executor without a spawner (and as every executor without the feature).
        assert!(Spawn::default_for_build().here().is_none());
    }

    #[cfg(feature = "tokio")]
    #[tokio::test]
    async fn inside_a_runtime_the_default_spawns_on_it() {
        assert_eq!(Spawn::default_for_build().name(), "tokio");
        let spawner = Spawn::default_for_build()
            .here()
            .expect("a runtime is current");
        let (tx, rx) = futures_channel::oneshot::channel();
        spawner(Box::pin(async move {
            let _ = tx.send(());
        }));
        rx.await.expect("the task ran on the runtime");
    }

    #[cfg(not(feature = "tokio"))]
    #[test]
    fn without_the_feature_the_default_is_inline() {
        assert_eq!(Spawn::default_for_build().name(), "inline");
    }
}
