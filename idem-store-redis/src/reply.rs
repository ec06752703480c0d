//! What a claim script answers, read back into a [`ClaimAnswer`].

use std::time::Duration;

use idem_core::machine::{ClaimAnswer, ClaimKind};
use idem_core::{StoreError, Token};
use redis::Value;

use crate::record;

pub(crate) fn short() -> StoreError {
    StoreError::corrupt("redis claim script: short answer")
}

/// A text field of a script's answer (a Lua string: a bulk string, never a status reply).
pub(crate) fn text(v: Option<&Value>) -> Result<&str, StoreError> {
    match v {
        Some(Value::BulkString(b)) => std::str::from_utf8(b)
            .map_err(|e| StoreError::corrupt_with("redis: answer is not UTF-8", e)),
        _ => Err(short()),
    }
}

pub(crate) fn parse_claim(reply: Value, token_id: u128) -> Result<ClaimAnswer, StoreError> {
    let reply = match reply {
        Value::BulkString(o) => return Ok(ClaimAnswer::Replay(record::outcome(o)?)),
        Value::SimpleString(claimed) => return parse_claimed(&claimed, token_id),
        Value::Array(reply) => reply,
        other => {
            return Err(StoreError::corrupt(format!(
                "redis claim script: unknown answer {other:?}"
            )));
        }
    };
    match text(reply.first())? {
        "in_flight" => {
            let ms: u64 = record::number("retry_after", text(reply.get(1))?)?;
            Ok(ClaimAnswer::InFlight {
                retry_after: Duration::from_millis(ms.max(1)),
                stale: text(reply.get(2))? == "1",
            })
        }
        "mismatch" => Ok(ClaimAnswer::FingerprintMismatch),
        "corrupt" => Err(StoreError::corrupt(format!(
            "redis record: {}",
            text(reply.get(1))?
        ))),
        other => Err(StoreError::corrupt(format!(
            "redis claim script: unknown answer {other:?}"
        ))),
    }
}

/// `seq|attempt|kind`, the claim script's answer when it claimed.
pub(crate) fn parse_claimed(claimed: &str, token_id: u128) -> Result<ClaimAnswer, StoreError> {
    let mut parts = claimed.split('|');
    let mut part = || parts.next().ok_or_else(short);
    let seq = record::number("token seq", part()?)?;
    let attempt = record::number("attempt", part()?)?;
    let kind = match part()? {
        "n" => ClaimKind::New,
        "e" => ClaimKind::ExpiredReplaced,
        "r" => ClaimKind::Retry,
        "t" => ClaimKind::TakenOver,
        other => {
            return Err(StoreError::corrupt(format!(
                "redis record: claim kind {other:?}"
            )));
        }
    };
    Ok(ClaimAnswer::Claimed {
        token: Token::with_id(seq, token_id),
        attempt,
        kind,
    })
}
