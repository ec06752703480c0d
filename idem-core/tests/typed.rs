//! The typed API ([`Executor::run_typed`]): values and errors of the caller's own types, stored
//! and replayed. Every test counts the operation's runs at the sink.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::{
    Clock, Error, Executor, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, OperationError,
    OutcomeClass, RecordId, RecordState, Scope, SystemClock, TypedExecution,
};
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Ticket {
    id: String,
    priority: u8,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum TicketError {
    /// A business rejection: the answer for good.
    AccountClosed { account: String },
    /// The helpdesk was down: a retry may run again.
    HelpdeskDown,
}

impl OperationError for TicketError {
    fn class(&self) -> OutcomeClass {
        match self {
            Self::AccountClosed { .. } => OutcomeClass::Definitive,
            Self::HelpdeskDown => OutcomeClass::Retryable,
        }
    }
}

#[derive(Serialize)]
struct NewTicket<'a> {
    title: &'a str,
    account: &'a str,
}

fn scope() -> Scope {
    Scope::new("tenant-a/create_ticket").unwrap()
}

fn key(k: &str) -> IdempotencyKey {
    IdempotencyKey::new(k).unwrap()
}

fn fp() -> Fingerprint {
    Fingerprint::of(
        "create_ticket",
        &NewTicket {
            title: "Printer on fire",
            account: "A-7",
        },
    )
    .unwrap()
}

async fn create(
    executor: &Executor,
    k: &str,
    runs: &Arc<AtomicUsize>,
    answer: Result<Ticket, TicketError>,
) -> Result<TypedExecution<Ticket, TicketError>, Error> {
    let runs = runs.clone();
    executor
        .run_typed(&scope(), &key(k), &fp(), |_| async move {
            runs.fetch_add(1, Ordering::SeqCst);
            answer
        })
        .await
}

fn ticket() -> Ticket {
    Ticket {
        id: "T-1".into(),
        priority: 2,
    }
}

#[tokio::test]
async fn a_value_runs_once_and_replays_as_the_type() {
    let executor = Executor::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let first = create(&executor, "k-1", &runs, Ok(ticket())).await.unwrap();
    assert!(matches!(first, TypedExecution::Executed { attempt: 1, .. }));
    assert!(!first.is_replay(), "the first call executed");
    assert_eq!(first.result(), Ok(&ticket()));
    let other = Ticket {
        id: "T-2".into(),
        priority: 9,
    };
    let again = create(&executor, "k-1", &runs, Ok(other)).await.unwrap();
    assert!(again.is_replay());
    assert_eq!(again.into_result(), Ok(ticket()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_definitive_error_is_stored_and_replayed_as_the_error_type() {
    let store = MemoryStore::new();
    let executor = Executor::new(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let closed = TicketError::AccountClosed {
        account: "A-7".into(),
    };
    let first = create(&executor, "k-1", &runs, Err(closed.clone()))
        .await
        .unwrap();
    assert_eq!(first.result(), Err(&closed));
    let record = store
        .get(&RecordId::new(scope(), key("k-1")), SystemClock.now())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(record.state, RecordState::Completed);
    assert_eq!(record.outcome.as_ref().unwrap().status(), 422);
    // The status an error type gets without saying one, as its callers read it.
    assert_eq!(
        (closed.status(), TicketError::HelpdeskDown.status()),
        (422, 503)
    );

    let again = create(&executor, "k-1", &runs, Ok(ticket())).await.unwrap();
    assert!(again.is_replay());
    assert_eq!(again.into_result(), Err(closed));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_retryable_error_lets_the_next_attempt_run() {
    let executor = Executor::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let first = create(&executor, "k-1", &runs, Err(TicketError::HelpdeskDown))
        .await
        .unwrap();
    assert_eq!(first.result(), Err(&TicketError::HelpdeskDown));
    let second = create(&executor, "k-1", &runs, Ok(ticket())).await.unwrap();
    assert!(matches!(
        second,
        TypedExecution::Executed { attempt: 2, .. }
    ));
    let third = create(&executor, "k-1", &runs, Err(TicketError::HelpdeskDown))
        .await
        .unwrap();
    assert_eq!(third.into_result(), Ok(ticket()));
    assert_eq!(runs.load(Ordering::SeqCst), 2);
}

/// A map with non-string keys cannot be JSON.
#[derive(Debug, Serialize, Deserialize)]
struct Unserializable {
    by_pair: HashMap<(u8, u8), u8>,
}

#[tokio::test]
async fn a_value_that_cannot_be_serialised_is_a_typed_error_and_never_runs_again() {
    let store = MemoryStore::new();
    let executor = Executor::new(store.clone());
    let runs = Arc::new(AtomicUsize::new(0));
    let (scope, key, fp) = (scope(), key("k-1"), fp());
    let id = RecordId::new(scope.clone(), key.clone());
    let attempt = |runs: Arc<AtomicUsize>| {
        executor.run_typed::<Unserializable, TicketError, _, _>(
            &scope,
            &key,
            &fp,
            move |_| async move {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok(Unserializable {
                    by_pair: HashMap::from([((1, 2), 3)]),
                })
            },
        )
    };
    let err = attempt(runs.clone()).await.unwrap_err();
    assert!(matches!(err, Error::Serialize(_)), "{err:?}");
    assert!(err.operation_ran());
    let record = store.get(&id, SystemClock.now()).await.unwrap().unwrap();
    assert_eq!(record.state, RecordState::Completed, "not left processing");
    let kept = record.outcome.unwrap();
    assert!(kept.is_not_kept());
    assert_eq!(kept.status(), 200);

    let again = attempt(runs.clone()).await.unwrap_err();
    assert!(matches!(again, Error::NotKept { .. }), "{again:?}");
    assert!(!again.operation_ran());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_stored_body_of_another_shape_is_a_typed_error_not_a_run() {
    let executor = Executor::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    create(&executor, "k-1", &runs, Ok(ticket())).await.unwrap();

    #[derive(Debug, Serialize, Deserialize)]
    struct TicketV2 {
        id: u64,
    }
    let r = runs.clone();
    let err = executor
        .run_typed::<TicketV2, TicketError, _, _>(&scope(), &key("k-1"), &fp(), |_| async move {
            r.fetch_add(1, Ordering::SeqCst);
            Ok(TicketV2 { id: 1 })
        })
        .await
        .unwrap_err();
    assert!(matches!(err, Error::Deserialize { .. }), "{err:?}");
    assert!(!err.operation_ran());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn a_typed_request_fingerprints_as_its_json() {
    let typed = fp();
    let value = Fingerprint::of(
        "create_ticket",
        &serde_json::json!({"account": "A-7", "title": "Printer on fire"}),
    )
    .unwrap();
    assert_eq!(typed, value);
    let bad = Fingerprint::of("x", &HashMap::from([((1u8, 2u8), 3u8)]));
    assert!(matches!(
        bad,
        Err(idem_core::FingerprintError::Canonicalize(_))
    ));
}

/// An error type whose status is out of 400–599 is stored with the default for its class, so a
/// replay never mistakes it for a value.
#[tokio::test]
async fn an_error_status_outside_400_599_gets_the_default() {
    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Odd;
    impl OperationError for Odd {
        fn class(&self) -> OutcomeClass {
            OutcomeClass::Definitive
        }
        fn status(&self) -> u16 {
            200
        }
    }
    let executor = Executor::new(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    for _ in 0..2 {
        let r = runs.clone();
        let got = executor
            .run_typed::<Ticket, Odd, _, _>(&scope(), &key("k-1"), &fp(), |_| async move {
                r.fetch_add(1, Ordering::SeqCst);
                Err(Odd)
            })
            .await
            .unwrap();
        assert_eq!(got.into_result(), Err(Odd));
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[cfg(feature = "encryption")]
#[tokio::test]
async fn typed_and_encrypted() {
    use idem_core::codec::{AesGcmCodec, sealed_info};
    let store = MemoryStore::new();
    let executor =
        Executor::new(store.clone()).with_codec(AesGcmCodec::new("k1", [3; 32]).unwrap());
    let runs = Arc::new(AtomicUsize::new(0));
    create(&executor, "k-1", &runs, Ok(ticket())).await.unwrap();
    let at_rest = store
        .get(&RecordId::new(scope(), key("k-1")), SystemClock.now())
        .await
        .unwrap()
        .unwrap()
        .outcome
        .unwrap();
    assert!(sealed_info(at_rest.body()).is_some() && !at_rest.body().contains("T-1"));
    let again = create(&executor, "k-1", &runs, Err(TicketError::HelpdeskDown))
        .await
        .unwrap();
    assert_eq!(again.into_result(), Ok(ticket()));
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

/// An error that names its own HTTP status.
#[derive(Debug, Serialize)]
enum OrderError {
    /// 409, for good.
    Conflict,
    /// 429, try again later.
    RateLimited,
    /// A status that is not an error's (200): the class's default replaces it.
    Confused,
}

impl OperationError for OrderError {
    fn class(&self) -> OutcomeClass {
        match self {
            Self::Conflict | Self::Confused => OutcomeClass::Definitive,
            Self::RateLimited => OutcomeClass::Retryable,
        }
    }
    fn status(&self) -> u16 {
        match self {
            Self::Conflict => 409,
            Self::RateLimited => 429,
            Self::Confused => 200,
        }
    }
}

/// The outcome recorded for an error keeps the status the error names when it is an error's
/// (400–599), with its class; any other status gives way to the class's default (422, 503), so
/// a stored error never reads back as a success.
#[test]
fn an_error_is_recorded_with_its_own_status_or_its_class_default() {
    let recorded = |e: OrderError| {
        let outcome = idem_core::Outcome::from_result(&Err::<(), _>(e)).unwrap();
        (outcome.status(), outcome.class())
    };
    assert_eq!(
        recorded(OrderError::Conflict),
        (409, OutcomeClass::Definitive)
    );
    assert_eq!(
        recorded(OrderError::RateLimited),
        (429, OutcomeClass::Retryable)
    );
    assert_eq!(
        recorded(OrderError::Confused),
        (422, OutcomeClass::Definitive)
    );
    let ok = idem_core::Outcome::from_result(&Ok::<_, OrderError>(ticket())).unwrap();
    assert_eq!((ok.status(), ok.class()), (200, OutcomeClass::Definitive));
}
