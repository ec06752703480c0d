//! The checkpoints of a record as `idem keys show` prints them ([contract
//! §6.1](idem_core::contract#checkpoints)): each step's name, time and size; its value only when it
//! is stored in clear (an encrypted value shows its algorithm and key id, never ciphertext).

use idem_core::Record;
use idem_core::codec::sealed_info;
use serde_json::{Value, json};

/// The steps as JSON: `[{"name", "saved_at", "size", "value" | "encrypted"}]`.
pub(crate) fn checkpoints_json(r: &Record, rfc3339: fn(idem_core::Timestamp) -> String) -> Value {
    Value::Array(
        r.checkpoints
            .iter()
            .map(|c| {
                let mut step = json!({
                    "name": c.name(),
                    "saved_at": rfc3339(c.saved_at()),
                    "size": c.value().len(),
                });
                match sealed_info(c.value()) {
                    Some(sealed) => {
                        step["encrypted"] =
                            json!({"algorithm": sealed.algorithm, "key_id": sealed.key_id});
                    }
                    None => step["value"] = c.value_json(),
                }
                step
            })
            .collect(),
    )
}

/// The steps as text lines for `idem keys show`.
pub(crate) fn checkpoints_text(r: &Record, rfc3339: fn(idem_core::Timestamp) -> String) -> String {
    if r.checkpoints.is_empty() {
        return format!("{:<12} none\n", "checkpoints");
    }
    let mut out = format!("{:<12} {}\n", "checkpoints", r.checkpoints.len());
    for (i, c) in r.checkpoints.iter().enumerate() {
        let value = match sealed_info(c.value()) {
            Some(sealed) => format!("encrypted ({}, key id {})", sealed.algorithm, sealed.key_id),
            None => c.value().to_owned(),
        };
        out.push_str(&format!(
            "  {}. {}  {}  {} bytes  {}\n",
            i + 1,
            c.name(),
            rfc3339(c.saved_at()),
            c.value().len(),
            value
        ));
    }
    out
}
