//! The typed API: operations that return `Result<T, E>` with your own types
//! ([`Executor::run_typed`]).
//!
//! An `Ok(T)` is stored as status 200, class definitive, body `T` as JSON. An `Err(E)` is stored
//! with the status and class `E` gives through [`OperationError`]: a definitive error is the
//! answer for good (replayed as `Err(E)`), a retryable one lets the next attempt run the
//! operation again (under the default [`CachePolicy::DefinitiveOnly`](crate::CachePolicy)). A
//! replay reads the stored body back as `T` (status 2xx) or `E` (any other status).

use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::Instrument;

use crate::executor::{Reply, Terms, Unserializable, refused_without_error};
use crate::{Attempt, Error, Executor, Fingerprint, IdempotencyKey, Outcome, OutcomeClass, Scope};

/// How an operation's error is recorded by [`Executor::run_typed`]: its class and status.
///
/// ```
/// use idem_core::{OperationError, OutcomeClass};
/// #[derive(Debug, serde::Serialize, serde::Deserialize)]
/// enum ChargeError { CardDeclined, GatewayDown }
///
/// impl OperationError for ChargeError {
///     fn class(&self) -> OutcomeClass {
///         match self {
///             // The bank said no: the answer for good, replayed to every retry.
///             Self::CardDeclined => OutcomeClass::Definitive,
///             // Nothing settled: the next attempt may charge again.
///             Self::GatewayDown => OutcomeClass::Retryable,
///         }
///     }
/// }
/// assert_eq!(ChargeError::CardDeclined.status(), 422);
/// assert_eq!(ChargeError::GatewayDown.status(), 503);
/// ```
pub trait OperationError {
    /// [`OutcomeClass::Definitive`] (a validation failure, a business rejection: the answer for
    /// good) or [`OutcomeClass::Retryable`] (an unresolved technical failure).
    fn class(&self) -> OutcomeClass;

    /// The status stored with the error: 422 for a definitive error and 503 for a retryable one
    /// unless you say otherwise. Must be 400–599 (a replay tells an error from a value by its
    /// status); any other value is replaced by the default.
    fn status(&self) -> u16 {
        match self.class() {
            OutcomeClass::Definitive => 422,
            OutcomeClass::Retryable => 503,
        }
    }
}

/// What [`Executor::run_typed`] returns when it has an answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TypedExecution<T, E> {
    /// This call ran the operation; `result` is what it returned (not a round trip through
    /// JSON), and it was recorded.
    Executed {
        /// What the operation returned.
        result: Result<T, E>,
        /// Which attempt ran it, from 1.
        attempt: u32,
    },
    /// An earlier call ran the operation; `result` is its stored answer, read back.
    Replayed {
        /// The stored answer.
        result: Result<T, E>,
    },
}

impl<T, E> TypedExecution<T, E> {
    /// The answer, executed or replayed.
    pub fn result(&self) -> Result<&T, &E> {
        match self {
            Self::Executed { result, .. } | Self::Replayed { result } => result.as_ref(),
        }
    }

    /// The answer, executed or replayed.
    pub fn into_result(self) -> Result<T, E> {
        match self {
            Self::Executed { result, .. } | Self::Replayed { result } => result,
        }
    }

    /// Whether this is a replay of an earlier execution.
    pub fn is_replay(&self) -> bool {
        matches!(self, Self::Replayed { .. })
    }
}

impl Outcome {
    /// The outcome [`Executor::run_typed`] records for `result`: `Ok(T)` as status 200,
    /// definitive, body `T`; `Err(E)` with `E`'s [`OperationError::status`] and class, body `E`.
    /// Use it with [`Attempt::encode`] to complete a record in your own transaction.
    pub fn from_result<T: Serialize, E: Serialize + OperationError>(
        result: &Result<T, E>,
    ) -> Result<Outcome, serde_json::Error> {
        let (status, class) = status_and_class(result);
        match result {
            Ok(value) => Outcome::new(status, value, class),
            Err(error) => Outcome::new(status, error, class),
        }
    }
}

fn status_and_class<T, E: OperationError>(result: &Result<T, E>) -> (u16, OutcomeClass) {
    match result {
        Ok(_) => (200, OutcomeClass::Definitive),
        Err(error) => {
            let class = error.class();
            let status = match error.status() {
                status @ 400..=599 => status,
                _ => match class {
                    OutcomeClass::Definitive => 422,
                    OutcomeClass::Retryable => 503,
                },
            };
            (status, class)
        }
    }
}

/// Reads a stored outcome back as `Ok(T)` (2xx) or `Err(E)`.
fn read_back<T: DeserializeOwned, E: DeserializeOwned>(
    outcome: Outcome,
) -> Result<Result<T, E>, Error> {
    if outcome.is_not_kept() {
        return Err(Error::NotKept {
            outcome: Box::new(outcome),
        });
    }
    let read = if (200..300).contains(&outcome.status()) {
        serde_json::from_str(outcome.body()).map(Ok)
    } else {
        serde_json::from_str(outcome.body()).map(Err)
    };
    read.map_err(|source| Error::Deserialize {
        outcome: Box::new(outcome),
        source,
    })
}

impl Executor {
    /// [`Executor::run`] for an operation that returns `Result<T, E>` with your own types: runs
    /// it at most once for (scope, key) and the request `fingerprint`; a replay hands back the
    /// stored `T`, or the stored `E` when that error was the answer (definitive, or any error
    /// under [`CachePolicy::CacheAll`](crate::CachePolicy)).
    ///
    /// An `Ok(T)` is stored as status 200, class definitive, body `T` as JSON. An `Err(E)` is
    /// stored with the status and class `E` gives through [`OperationError`]. A replay reads the
    /// stored body back as `T` (status 2xx) or `E` (any other status).
    ///
    /// ```
    /// use idem_core::{Executor, Fingerprint, IdempotencyKey, MemoryStore, OperationError, OutcomeClass, Scope};
    /// use serde::{Deserialize, Serialize};
    ///
    /// #[derive(Serialize)]
    /// struct NewTicket { title: String }
    /// #[derive(Debug, PartialEq, Serialize, Deserialize)]
    /// struct Ticket { id: String }
    /// #[derive(Debug, PartialEq, Serialize, Deserialize)]
    /// enum TicketError { Duplicate }
    /// impl OperationError for TicketError {
    ///     fn class(&self) -> OutcomeClass { OutcomeClass::Definitive }
    /// }
    ///
    /// # tokio::runtime::Runtime::new().unwrap().block_on(async {
    /// let executor = Executor::new(MemoryStore::new());
    /// let (scope, key) = (Scope::new("tenant-a/create_ticket").unwrap(), IdempotencyKey::new("wf-1:step-3").unwrap());
    /// let request = NewTicket { title: "Printer on fire".into() };
    /// let fp = Fingerprint::of("create_ticket", &request).unwrap();
    ///
    /// let first = executor
    ///     .run_typed(&scope, &key, &fp, |_attempt| async { Ok::<_, TicketError>(Ticket { id: "T-1".into() }) })
    ///     .await
    ///     .unwrap();
    /// let again = executor
    ///     .run_typed::<Ticket, TicketError, _, _>(&scope, &key, &fp, |_attempt| async { unreachable!("never runs twice") })
    ///     .await
    ///     .unwrap();
    /// assert!(again.is_replay());
    /// assert_eq!(again.into_result(), Ok(Ticket { id: "T-1".into() }));
    /// # });
    /// ```
    ///
    /// # Errors
    ///
    /// Those of [`Executor::run`], and: [`Error::Serialize`] (the operation ran, its value could
    /// not be serialised: the record holds "ran, answer not kept"), [`Error::Deserialize`] (the
    /// stored body does not read back as `T` or `E`; nothing ran), [`Error::NotKept`] (the
    /// stored answer was not kept; nothing ran). In [`Error::Fenced`], [`Error::OutcomeTooLarge`]
    /// and [`Error::NotRecorded`] the operation's value is carried as JSON in the outcome.
    pub async fn run_typed<T, E, F, Fut>(
        &self,
        scope: &Scope,
        key: &IdempotencyKey,
        fingerprint: &Fingerprint,
        operation: F,
    ) -> Result<TypedExecution<T, E>, Error>
    where
        T: Serialize + DeserializeOwned,
        E: Serialize + DeserializeOwned + OperationError,
        F: FnOnce(Attempt) -> Fut,
        Fut: Future<Output = Result<T, E>>,
    {
        let span = Self::span(scope, key, fingerprint);
        let (ran, _) = self
            .run_in_span(
                Terms::of(self.tool(), key.origin(), self.requested_wait()),
                scope,
                key,
                fingerprint,
                operation,
                |result| {
                    let outcome = Outcome::from_result(&result).map_err(|source| {
                        let (status, class) = status_and_class(&result);
                        Unserializable {
                            status,
                            class,
                            source,
                        }
                    });
                    (result, outcome)
                },
            )
            .instrument(span)
            .await;
        let ran = ran?;
        match ran {
            Reply::Executed {
                value,
                attempt,
                unrecorded: None,
                ..
            } => Ok(TypedExecution::Executed {
                result: value,
                attempt,
            }),
            Reply::Replayed { outcome } => Ok(TypedExecution::Replayed {
                result: read_back(outcome)?,
            }),
            Reply::Executed {
                unrecorded: Some(error),
                ..
            }
            | Reply::Refused {
                error: Some(error), ..
            } => Err(error),
            Reply::Refused {
                error: None,
                refusal,
            } => Err(refused_without_error(refusal)),
        }
    }
}
