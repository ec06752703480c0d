//! `Prefer: wait=N` (RFC 7240) on a keyed request, and `Preference-Applied` on an answer that
//! waited ([contract §5.2](idem_core::contract#waiting)).

use std::time::Duration;

use http::{HeaderMap, HeaderValue};

/// The header that names the preferences a server applied (RFC 7240 §3).
pub const PREFERENCE_APPLIED: &str = "preference-applied";

/// The request header of preferences (RFC 7240 §2).
pub const PREFER: &str = "prefer";

/// The `wait` preference of `headers`, in seconds (`wait=5`; a decimal, `wait=0.5`, is read to
/// the millisecond): the first one of every `Prefer` header, `None` without one, or when it is
/// not a non-negative number.
pub(crate) fn requested_wait(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get_all(PREFER)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|preference| {
            let (name, value) = preference.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("wait") {
                return None;
            }
            // A parameter after `;` belongs to the preference, not to its value.
            let value = value.split(';').next()?.trim().trim_matches('"');
            let seconds: f64 = value.parse().ok()?;
            (seconds.is_finite() && seconds >= 0.0)
                .then(|| Duration::from_millis((seconds.min(86_400.0) * 1000.0) as u64))
        })
}

/// `wait=N`, N the bound applied, in whole seconds when it is a whole number of them.
pub(crate) fn applied(bound: Duration) -> HeaderValue {
    let text = if bound.subsec_millis() == 0 {
        format!("wait={}", bound.as_secs())
    } else {
        format!("wait={:.3}", bound.as_secs_f64())
    };
    HeaderValue::try_from(text).expect("digits are a valid header value")
}

/// `Prefer: wait=N` for a client attempt of `attempt_timeout`: the whole seconds left after a
/// margin of 500 ms for the answer to come back, `None` if that is under one second.
#[cfg(feature = "client")]
pub(crate) fn prefer_wait_within(attempt_timeout: Duration) -> Option<HeaderValue> {
    let secs = attempt_timeout
        .saturating_sub(Duration::from_millis(500))
        .as_secs();
    (secs > 0).then(|| HeaderValue::try_from(format!("wait={secs}")).expect("digits"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefer(values: &[&str]) -> Option<Duration> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(PREFER, HeaderValue::from_str(v).unwrap());
        }
        requested_wait(&headers)
    }

    #[test]
    fn reads_the_wait_preference() {
        assert_eq!(prefer(&["wait=5"]), Some(Duration::from_secs(5)));
        assert_eq!(
            prefer(&["respond-async, Wait = 2"]),
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            prefer(&["handling=lenient", "wait=0.25"]),
            Some(Duration::from_millis(250))
        );
        assert_eq!(prefer(&["wait=\"3\"; x=y"]), Some(Duration::from_secs(3)));
        assert_eq!(prefer(&["wait=-1"]), None);
        assert_eq!(prefer(&["wait=soon"]), None);
        assert_eq!(prefer(&["return=minimal"]), None);
        assert_eq!(prefer(&[]), None);
    }

    #[test]
    fn the_applied_bound() {
        assert_eq!(applied(Duration::from_secs(4)), "wait=4");
        assert_eq!(applied(Duration::from_millis(1500)), "wait=1.500");
    }

    #[cfg(feature = "client")]
    #[test]
    fn the_client_preference() {
        assert_eq!(
            prefer_wait_within(Duration::from_secs(3)).unwrap(),
            "wait=2"
        );
        assert_eq!(prefer_wait_within(Duration::from_millis(1499)), None);
    }
}
