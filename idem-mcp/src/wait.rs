//! Waiting for an in-flight answer over MCP ([contract §5.2](idem_core::contract#waiting)): a
//! call with `_meta["io.idem/wait"]` (seconds) that finds its operation in flight waits for the
//! result instead of being answered "in flight".

use std::time::Duration;

use rmcp::model::{CallToolRequestParams, JsonObject};
use serde_json::Value;

/// The `_meta` entry of a call that asks to wait for an in-flight answer: `"io.idem/wait"`, a
/// number of seconds.
pub const WAIT_META_KEY: &str = "io.idem/wait";

/// The wait a call asks for: `_meta["io.idem/wait"]` of the request as rmcp hands it to the
/// server (`context_meta`) or of `params`; `None` without one, or when it is not a
/// non-negative number of seconds.
pub(crate) fn requested_wait(
    context_meta: &JsonObject,
    params: &CallToolRequestParams,
) -> Option<Duration> {
    let value = context_meta
        .get(WAIT_META_KEY)
        .or_else(|| params.meta.as_ref().and_then(|m| m.0.0.get(WAIT_META_KEY)))?;
    let seconds = value.as_f64()?;
    (seconds.is_finite() && seconds > 0.0)
        .then(|| Duration::from_millis((seconds.min(86_400.0) * 1000.0) as u64))
}

/// The wait a client attempt of `attempt_timeout` asks for: what is left after a margin of
/// 500 ms for the answer to come back, in seconds (to the millisecond); `None` if nothing is.
pub(crate) fn wait_within(attempt_timeout: Duration) -> Option<Value> {
    let left = attempt_timeout.saturating_sub(Duration::from_millis(500));
    (!left.is_zero()).then(|| Value::from(left.as_millis() as f64 / 1000.0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn asked(value: Value) -> Option<Duration> {
        let mut meta = JsonObject::new();
        meta.insert(WAIT_META_KEY.into(), value);
        requested_wait(&meta, &CallToolRequestParams::new("t"))
    }

    #[test]
    fn reads_the_wait_in_seconds() {
        assert_eq!(asked(json!(5)), Some(Duration::from_secs(5)));
        assert_eq!(asked(json!(0.25)), Some(Duration::from_millis(250)));
        assert_eq!(asked(json!(0)), None);
        assert_eq!(asked(json!(-1)), None);
        assert_eq!(asked(json!("5")), None);
        assert_eq!(
            requested_wait(&JsonObject::new(), &CallToolRequestParams::new("t")),
            None
        );
    }

    #[test]
    fn a_client_waits_within_its_attempt() {
        assert_eq!(wait_within(Duration::from_secs(3)), Some(json!(2.5)));
        assert_eq!(wait_within(Duration::from_millis(400)), None);
    }
}
