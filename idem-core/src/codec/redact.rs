//! [`Redact`], the codec that masks or removes chosen fields of a body before it is stored.

use serde_json::Value;

use super::{CodecContext, CodecError, OutcomeCodec};
use crate::Outcome;

/// Masks or removes chosen fields of the body before it is stored; see the [module docs](super).
///
/// Fields are named by JSON pointers (RFC 6901: `/customer/email`, `/cards/0/number`). A pointer
/// that names nothing in a body is skipped. A body in which no pointer matched is stored byte for
/// byte; one in which a pointer matched is stored re-serialised (compact; object members may come
/// back in another order). `decode` returns the stored body as it is: **a replay returns the
/// redacted body**, the first caller alone sees the full response.
///
/// ```
/// use idem_core::codec::{CodecContext, OutcomeCodec, Redact};
/// use idem_core::{IdempotencyKey, Outcome, Scope};
/// use serde_json::json;
/// let redact = Redact::mask(["/customer/email", "/card"]).unwrap();
/// let (scope, key) = (Scope::new("t/charge").unwrap(), IdempotencyKey::new("k-1").unwrap());
/// let outcome = Outcome::definitive(201, &json!({"id": "ch_1", "card": "4242", "customer": {"email": "a@b.c"}})).unwrap();
/// let stored = redact.encode(&CodecContext::new(&scope, &key), &outcome).unwrap();
/// let stored: serde_json::Value = serde_json::from_str(&stored).unwrap();
/// assert_eq!(stored, json!({"id": "ch_1", "card": "[redacted]", "customer": {"email": "[redacted]"}}));
/// ```
#[derive(Debug, Clone)]
pub struct Redact {
    pointers: Vec<String>,
    mask: Option<Value>,
}

impl Redact {
    /// Replaces the value at each pointer with the string `"[redacted]"`.
    pub fn mask<I, S>(pointers: I) -> Result<Self, CodecError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::build(pointers, Some(Value::String("[redacted]".into())))
    }

    /// Removes the field (or array element) at each pointer.
    pub fn remove<I, S>(pointers: I) -> Result<Self, CodecError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::build(pointers, None)
    }

    /// Replaces masked values with `mask` instead of `"[redacted]"` (no effect on a
    /// [`Redact::remove`] codec).
    pub fn with_mask(mut self, mask: Value) -> Self {
        if self.mask.is_some() {
            self.mask = Some(mask);
        }
        self
    }

    fn build<I, S>(pointers: I, mask: Option<Value>) -> Result<Self, CodecError>
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        let pointers: Vec<String> = pointers.into_iter().map(Into::into).collect();
        if let Some(bad) = pointers.iter().find(|p| !p.starts_with('/')) {
            return Err(CodecError::InvalidPointer {
                pointer: bad.clone(),
            });
        }
        Ok(Self { pointers, mask })
    }

    /// Applies the redaction to `value`; whether anything matched.
    fn apply(&self, value: &mut Value) -> bool {
        let mut changed = false;
        for pointer in &self.pointers {
            match &self.mask {
                Some(mask) => {
                    if let Some(target) = value.pointer_mut(pointer) {
                        *target = mask.clone();
                        changed = true;
                    }
                }
                None => {
                    // Split at the last unescaped '/': the parent, and the last reference token.
                    let at = pointer.rfind('/').expect("checked at construction");
                    let (parent, last) = (&pointer[..at], &pointer[at + 1..]);
                    let last = last.replace("~1", "/").replace("~0", "~");
                    match value.pointer_mut(parent) {
                        Some(Value::Object(members)) => {
                            changed |= members.remove(&last).is_some();
                        }
                        Some(Value::Array(items)) => {
                            if let Ok(i) = last.parse::<usize>()
                                && i < items.len()
                            {
                                items.remove(i);
                                changed = true;
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        changed
    }
}

impl OutcomeCodec for Redact {
    fn encode(&self, _cx: &CodecContext<'_>, outcome: &Outcome) -> Result<String, CodecError> {
        let mut value = outcome.body_json();
        if self.apply(&mut value) {
            Ok(value.to_string())
        } else {
            Ok(outcome.body().to_owned())
        }
    }

    fn decode(&self, _cx: &CodecContext<'_>, stored: &Outcome) -> Result<String, CodecError> {
        Ok(stored.body().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{IdempotencyKey, Scope};
    use serde_json::json;

    fn cx_parts() -> (Scope, IdempotencyKey) {
        (
            Scope::new("t/tool").unwrap(),
            IdempotencyKey::new("k-1").unwrap(),
        )
    }

    #[test]
    fn redact_remove_and_mask() {
        let (scope, key) = cx_parts();
        let cx = CodecContext::new(&scope, &key);
        let o = Outcome::definitive(
            200,
            &json!({"a": {"b/c": 1, "d": 2}, "list": [1, 2, 3], "keep": true}),
        )
        .unwrap();
        let removed = Redact::remove(["/a/b~1c", "/list/1", "/missing/x"])
            .unwrap()
            .encode(&cx, &o)
            .unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&removed).unwrap(),
            json!({"a": {"d": 2}, "list": [1, 3], "keep": true})
        );
        let masked = Redact::mask(["/a/d"])
            .unwrap()
            .with_mask(json!(null))
            .encode(&cx, &o)
            .unwrap();
        assert_eq!(
            serde_json::from_str::<Value>(&masked).unwrap()["a"]["d"],
            json!(null)
        );
    }

    #[test]
    fn redact_leaves_an_unmatched_body_byte_for_byte() {
        let (scope, key) = cx_parts();
        let text = "{ \"z\": 1,  \"a\": 2 }";
        let o = Outcome::from_json_text(200, text, crate::OutcomeClass::Definitive).unwrap();
        let r = Redact::mask(["/nope"]).unwrap();
        assert_eq!(
            r.encode(&CodecContext::new(&scope, &key), &o).unwrap(),
            text
        );
        // An index one past the end of an array matches nothing either.
        let text = "{ \"list\": [1, 2] }";
        let o = Outcome::from_json_text(200, text, crate::OutcomeClass::Definitive).unwrap();
        let r = Redact::remove(["/list/2"]).unwrap();
        assert_eq!(
            r.encode(&CodecContext::new(&scope, &key), &o).unwrap(),
            text
        );
    }

    #[test]
    fn redact_refuses_a_pointer_without_a_slash() {
        for p in ["", "card"] {
            assert!(matches!(
                Redact::mask([p]),
                Err(CodecError::InvalidPointer { .. })
            ));
        }
    }
}
