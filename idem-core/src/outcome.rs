//! What an operation answered.

use serde::{Deserialize, Serialize};

/// Whether an outcome settles the operation (SPEC §1).
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

/// What an operation answered: a status code, a JSON body and a class.
///
/// The body is kept as the exact JSON text it was given, so a replay returns it byte for byte
/// (key order, white space, escapes and all).
///
/// ```
/// use idem_core::{Outcome, OutcomeClass};
/// let o = Outcome::definitive(201, &serde_json::json!({"ticket_id": "T-1"})).unwrap();
/// assert_eq!(o.body(), r#"{"ticket_id":"T-1"}"#);
/// let raw = Outcome::from_json_text(200, "{ \"b\":1, \"a\":2 }", OutcomeClass::Definitive).unwrap();
/// assert_eq!(raw.body(), "{ \"b\":1, \"a\":2 }");
/// assert!(Outcome::from_json_text(200, "not json", OutcomeClass::Definitive).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
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

    /// A [`OutcomeClass::Definitive`] outcome.
    pub fn definitive(status: u16, body: &impl Serialize) -> Result<Self, serde_json::Error> {
        Self::new(status, body, OutcomeClass::Definitive)
    }

    /// A [`OutcomeClass::Retryable`] outcome.
    pub fn retryable(status: u16, body: &impl Serialize) -> Result<Self, serde_json::Error> {
        Self::new(status, body, OutcomeClass::Retryable)
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
