//! The query string as the fingerprint sees it ([contract §1](idem_core::contract#words): "method,
//! path and the query string, its parameters sorted").

use percent_encoding::{NON_ALPHANUMERIC, percent_decode, percent_encode};

/// The canonical form of a URL query string (without the `?`), as [`IdempotencyLayer`]
/// fingerprints it: two query strings that a form-urlencoded reader (axum's `Query`,
/// `serde_urlencoded`, `url::form_urlencoded`) reads as the same parameters in the same order per
/// name give the same text, and two it reads differently never do.
///
/// - The query is read as `application/x-www-form-urlencoded`: parameters split on `&` (empty
///   ones dropped), name and value split on the first `=` (a parameter without `=` has the empty
///   value, as those readers say), `+` is a space, and `%XX` escapes are decoded to bytes. So
///   `%41` and `A` are the same, and `+`, `%20` and `%2B`… are judged as those readers judge
///   them: `+` and `%20` are both a space, `%2B` is a plus sign.
/// - Decoding is byte-exact (no lossy UTF-8 step): two different invalid sequences stay
///   different. A malformed escape (`%4`, `%zz`) is kept literally, as those readers keep it.
/// - Parameters are sorted by name (bytewise); a name given several times keeps the relative
///   order of its values (`tag=b&tag=a` is not `tag=a&tag=b`: a tool may read a list).
/// - The result percent-encodes every byte that is not an ASCII letter or digit.
///
/// An empty query (`/path` or `/path?`) gives the empty string.
///
/// [`IdempotencyLayer`]: crate::IdempotencyLayer
///
/// ```
/// use idem_http::canonical_query;
/// assert_eq!(canonical_query("b=2&a=1"), canonical_query("a=1&b=2"));
/// assert_eq!(canonical_query("name=%41+b"), canonical_query("name=A%20b"));
/// assert_ne!(canonical_query("amount=5"), canonical_query("amount=500"));
/// assert_ne!(canonical_query("tag=a&tag=b"), canonical_query("tag=b&tag=a"));
/// assert_ne!(canonical_query("q=a+b"), canonical_query("q=a%2Bb"));
/// assert_eq!(canonical_query(""), "");
/// ```
pub fn canonical_query(query: &str) -> String {
    let mut params: Vec<(Vec<u8>, Vec<u8>)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (name, value) = p.split_once('=').unwrap_or((p, ""));
            (decode(name), decode(value))
        })
        .collect();
    // Stable: the values of a repeated name keep their order.
    params.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = String::with_capacity(query.len());
    for (i, (name, value)) in params.iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.extend(percent_encode(name, NON_ALPHANUMERIC));
        out.push('=');
        out.extend(percent_encode(value, NON_ALPHANUMERIC));
    }
    out
}

fn decode(part: &str) -> Vec<u8> {
    let spaced: Vec<u8> = part
        .bytes()
        .map(|b| if b == b'+' { b' ' } else { b })
        .collect();
    percent_decode(&spaced).collect()
}

#[cfg(test)]
mod tests {
    use super::canonical_query as c;

    #[test]
    fn sorted_by_name_repeats_keep_their_order() {
        assert_eq!(c("b=2&a=1&b=1"), "a=1&b=2&b=1");
        assert_ne!(c("a=1&a=2"), c("a=2&a=1"));
    }

    #[test]
    fn percent_encoding_and_plus_are_normalised() {
        assert_eq!(c("%61=%41"), c("a=A"));
        assert_eq!(c("q=a+b"), c("q=a%20b"));
        assert_ne!(c("q=a+b"), c("q=a%2Bb"));
        assert_eq!(c("q=%e2%9c%93"), c("q=%E2%9C%93"));
        assert_eq!(c("q=✓"), c("q=%E2%9C%93"));
    }

    #[test]
    fn separators_inside_values_stay_inside() {
        assert_ne!(c("a=1%262"), c("a=1&2"));
        assert_ne!(c("a=b%3Dc"), c("a%3Db=c"));
        assert_eq!(c("a=b=c"), c("a=b%3Dc"));
    }

    #[test]
    fn invalid_utf8_is_kept_exactly() {
        assert_ne!(c("q=%FF"), c("q=%FE"));
    }

    #[test]
    fn empty_parameters_and_missing_values() {
        assert_eq!(c(""), "");
        assert_eq!(c("&&a=1&"), c("a=1"));
        assert_eq!(c("flag"), c("flag="));
        assert_ne!(c("flag"), c(""));
    }

    #[test]
    fn malformed_escapes_are_literal() {
        assert_eq!(c("q=%4"), c("q=%254"));
        assert_ne!(c("q=%zz"), c("q=zz"));
    }
}
