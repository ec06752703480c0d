//! What an operation answered.

use serde::{Deserialize, Serialize};

/// Whether an outcome settles the operation ([contract §1](crate::contract#words)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutcomeClass {
    /// Success, validation failure, business rejection: the answer, forever.
    Definitive,
    /// An unresolved technical failure: under [`CachePolicy::DefinitiveOnly`](crate::CachePolicy)
    /// a retry may run the operation again.
    Retryable,
}

impl OutcomeClass {
    /// `"definitive"` or `"retryable"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Definitive => "definitive",
            Self::Retryable => "retryable",
        }
    }

    /// Parses [`OutcomeClass::as_str`].
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "definitive" => Some(Self::Definitive),
            "retryable" => Some(Self::Retryable),
            _ => None,
        }
    }
}

/// The prefix of every problem `type` idem defines, written once: `urn:idem:problem:` followed
/// by the problem's name.
macro_rules! problem_urn {
    ($name:literal) => {
        concat!("urn:idem:problem:", $name)
    };
}
pub(crate) use problem_urn;

/// The problem type (RFC 9457 `type`) of the outcome kept in place of one that was too large to
/// store: `urn:idem:problem:outcome-not-kept`. See [`Outcome::not_kept`].
pub const OUTCOME_NOT_KEPT: &str = problem_urn!("outcome-not-kept");

/// What an operation answered: a status code, a JSON body and a class.
///
/// The body is kept as the exact JSON text it was given, so a replay returns it byte for byte (key
/// order, white space, escapes and all). Its `Debug` shows the status, the class and the body's
/// size, never the body: stored bodies are never logged ([contract
/// §8](crate::contract#observability)).
///
/// ```
/// use idem_core::{Outcome, OutcomeClass};
/// let o = Outcome::definitive(201, &serde_json::json!({"ticket_id": "T-1"})).unwrap();
/// assert_eq!(o.body(), r#"{"ticket_id":"T-1"}"#);
/// let raw = Outcome::from_json_text(200, "{ \"b\":1, \"a\":2 }", OutcomeClass::Definitive).unwrap();
/// assert_eq!(raw.body(), "{ \"b\":1, \"a\":2 }");
/// assert!(Outcome::from_json_text(200, "not json", OutcomeClass::Definitive).is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    status: u16,
    body: String,
    class: OutcomeClass,
}

impl Outcome {
    /// An outcome whose body is `body` serialised as JSON.
    pub fn new(
        status: u16,
        body: &impl Serialize,
        class: OutcomeClass,
    ) -> Result<Self, serde_json::Error> {
        Ok(Self {
            status,
            body: serde_json::to_string(body)?,
            class,
        })
    }

    /// A [`OutcomeClass::Definitive`] outcome whose body is `body` serialised as JSON (an `Err`
    /// when it does not serialise, such as a map with non-string keys);
    /// [`Outcome::definitive_json`] takes a JSON value and cannot fail.
    pub fn definitive(status: u16, body: &impl Serialize) -> Result<Self, serde_json::Error> {
        Self::new(status, body, OutcomeClass::Definitive)
    }

    /// A [`OutcomeClass::Retryable`] outcome whose body is `body` serialised as JSON;
    /// [`Outcome::retryable_json`] takes a JSON value and cannot fail.
    pub fn retryable(status: u16, body: &impl Serialize) -> Result<Self, serde_json::Error> {
        Self::new(status, body, OutcomeClass::Retryable)
    }

    /// A [`OutcomeClass::Definitive`] outcome whose body is a JSON value (`json!({…})`, a
    /// string, a number…). Unlike [`Outcome::definitive`] it cannot fail: a
    /// [`serde_json::Value`] always serialises, so an operation returns it as it is, with no
    /// `unwrap`. For your own types, serialise them yourself or use
    /// [`Executor::run_typed`](crate::Executor::run_typed).
    ///
    /// ```
    /// use idem_core::{Outcome, OutcomeClass};
    /// use serde_json::json;
    /// let o = Outcome::definitive_json(201, json!({"ticket_id": "T-1"}));
    /// assert_eq!((o.status(), o.class()), (201, OutcomeClass::Definitive));
    /// assert_eq!(o, Outcome::definitive(201, &json!({"ticket_id": "T-1"})).unwrap());
    /// ```
    pub fn definitive_json(status: u16, body: impl Into<serde_json::Value>) -> Self {
        Self::from_value(status, body.into(), OutcomeClass::Definitive)
    }

    /// A [`OutcomeClass::Retryable`] outcome whose body is a JSON value; infallible, as
    /// [`Outcome::definitive_json`].
    ///
    /// ```
    /// use idem_core::{Outcome, OutcomeClass};
    /// let o = Outcome::retryable_json(503, "the helpdesk is down");
    /// assert_eq!((o.body(), o.class()), (r#""the helpdesk is down""#, OutcomeClass::Retryable));
    /// ```
    pub fn retryable_json(status: u16, body: impl Into<serde_json::Value>) -> Self {
        Self::from_value(status, body.into(), OutcomeClass::Retryable)
    }

    fn from_value(status: u16, body: serde_json::Value, class: OutcomeClass) -> Self {
        Self {
            status,
            // A `Value`'s map keys are strings and its numbers finite: writing it into a
            // `String` cannot fail (the text `serde_json::to_string` would give).
            body: body.to_string(),
            class,
        }
    }

    /// An outcome whose body is JSON text kept exactly as given; refused if it is not JSON that
    /// reads back as a value (a number out of range, such as `1E400`, is refused).
    pub fn from_json_text(
        status: u16,
        body: impl Into<String>,
        class: OutcomeClass,
    ) -> Result<Self, serde_json::Error> {
        let body = body.into();
        // Parsed as a value, not skipped as `IgnoredAny`: that accepts numbers no JSON reader can
        // hold (`1E400`), and a stored body must read back.
        serde_json::from_str::<serde_json::Value>(&body)?;
        Ok(Self {
            status,
            body,
            class,
        })
    }

    /// The status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The body, as the exact JSON text stored.
    pub fn body(&self) -> &str {
        &self.body
    }

    /// The body parsed as a JSON value.
    pub fn body_json(&self) -> serde_json::Value {
        // Validated at construction.
        serde_json::from_str(&self.body).unwrap_or(serde_json::Value::Null)
    }

    /// The class.
    pub fn class(&self) -> OutcomeClass {
        self.class
    }

    /// The size counted against [`Policy::max_outcome_bytes`](crate::Policy): the body's bytes.
    pub fn size(&self) -> usize {
        self.body.len()
    }

    /// The small outcome stored in place of `original` when `original` is over the size limit
    /// `limit` ([contract §2](crate::contract#states)): the operation ran, its response was not
    /// kept.
    ///
    /// It keeps `original`'s status and class, so a retry learns what the operation answered
    /// (a success stays a success: a caller must not mistake it for a failure and run the
    /// operation again under a new key) and the cache policy treats it as it would have treated
    /// `original`. Its body is a problem document (RFC 9457) of type [`OUTCOME_NOT_KEPT`] with
    /// the original size and the limit; it never contains any of `original`'s body.
    ///
    /// ```
    /// use idem_core::{Outcome, OutcomeClass};
    /// let big = Outcome::definitive(201, &"x".repeat(2000)).unwrap();
    /// let kept = Outcome::not_kept(&big, 1024);
    /// assert_eq!((kept.status(), kept.class()), (201, OutcomeClass::Definitive));
    /// assert!(kept.is_not_kept() && !big.is_not_kept());
    /// assert_eq!(kept.body_json()["type"], "urn:idem:problem:outcome-not-kept");
    /// assert!(kept.size() < 400);
    /// ```
    pub fn not_kept(original: &Outcome, limit: usize) -> Outcome {
        let body = serde_json::json!({
            "type": OUTCOME_NOT_KEPT,
            "title": "The operation ran; its response was not kept",
            "detail": format!(
                "the operation ran and answered status {}, but its response ({} bytes) was over the idempotency store's limit of {limit} bytes and was not kept; this is the final answer for this key",
                original.status,
                original.size()
            ),
            "original_status": original.status,
            "original_size": original.size(),
            "limit": limit,
        });
        Self {
            status: original.status,
            body: body.to_string(),
            class: original.class,
        }
    }

    /// The outcome [`Executor::run_typed`](crate::Executor::run_typed) stores when the
    /// operation's value could not be serialised: the same problem type as [`Outcome::not_kept`],
    /// with `status` and `class` the value would have had.
    pub(crate) fn not_serializable(status: u16, class: OutcomeClass) -> Outcome {
        let body = serde_json::json!({
            "type": OUTCOME_NOT_KEPT,
            "title": "The operation ran; its response was not kept",
            "detail": format!(
                "the operation ran and answered status {status}, but its answer could not be serialised as JSON and was not kept; this is the final answer for this key"
            ),
            "original_status": status,
        });
        Self {
            status,
            body: body.to_string(),
            class,
        }
    }

    /// Whether this is the outcome [`Outcome::not_kept`] stores in place of one too large.
    pub fn is_not_kept(&self) -> bool {
        self.body.contains(OUTCOME_NOT_KEPT)
            && self.body_json().get("type").and_then(|t| t.as_str()) == Some(OUTCOME_NOT_KEPT)
    }
}

/// Status, class and size only: a stored body may hold personal data or secrets.
impl std::fmt::Debug for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcome")
            .field("status", &self.status)
            .field("class", &self.class)
            .field("size", &self.body.len())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_round_trips() {
        for c in [OutcomeClass::Definitive, OutcomeClass::Retryable] {
            assert_eq!(OutcomeClass::parse(c.as_str()), Some(c));
        }
        assert_eq!(OutcomeClass::parse("x"), None);
    }

    #[test]
    fn debug_never_shows_the_body() {
        let o =
            Outcome::definitive(201, &serde_json::json!({"card": "SECRET-MARKER-4242"})).unwrap();
        let shown = format!("{o:?} {o:#?}");
        assert!(!shown.contains("SECRET-MARKER"), "{shown}");
        assert!(
            shown.contains("201")
                && shown.contains("Definitive")
                && shown.contains(&o.size().to_string())
        );
        let in_record = format!("{:?}", Some(&o));
        assert!(!in_record.contains("SECRET-MARKER"));
    }

    #[test]
    fn not_kept_is_recognised_only_by_its_type() {
        let big = Outcome::retryable(503, &"SECRET-MARKER".repeat(100)).unwrap();
        let kept = Outcome::not_kept(&big, 10);
        assert!(kept.is_not_kept());
        assert!(!kept.body().contains("SECRET-MARKER"));
        assert_eq!(
            (kept.status(), kept.class()),
            (503, OutcomeClass::Retryable)
        );
        let mention =
            Outcome::definitive(200, &serde_json::json!({"note": OUTCOME_NOT_KEPT})).unwrap();
        assert!(!mention.is_not_kept());
        let array = Outcome::definitive(200, &serde_json::json!([OUTCOME_NOT_KEPT])).unwrap();
        assert!(!array.is_not_kept());
    }

    #[test]
    fn body_kept_byte_for_byte() {
        let text = "{\"z\":\"\\u00e9 😀\",  \"a\":[1.50]}";
        let o = Outcome::from_json_text(200, text, OutcomeClass::Retryable).unwrap();
        assert_eq!(o.body(), text);
        assert_eq!(o.size(), text.len());
        assert_eq!(o.body_json()["a"][0], 1.5);
    }

    #[test]
    fn a_body_that_cannot_be_read_back_is_refused() {
        // Found by fuzzing (fuzz target `http_layer`): `1E400` passed the check (it was only
        // skipped, never read), was stored, and then no reader could parse the stored answer.
        for text in ["1E400", "[-1e999]", "{\"a\":1e309}"] {
            assert!(
                Outcome::from_json_text(200, text, OutcomeClass::Definitive).is_err(),
                "{text}"
            );
        }
        let o = Outcome::from_json_text(200, "1e308", OutcomeClass::Definitive).unwrap();
        assert_eq!(o.body_json(), serde_json::json!(1e308));
    }
}
