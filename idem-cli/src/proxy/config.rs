//! `idem proxy --config FILE`: which requests are protected and how, in TOML.
//!
//! ```toml
//! # Settings of every route unless the route says otherwise.
//! [defaults]
//! lease = "30s"                 # how long a claim is presumed alive (renewed while waiting)
//! processing_window = "5s"      # the upstream's usual time: a 409's Retry-After
//! max_wait = "30s"              # the longest `Prefer: wait` honoured
//! timeout = "60s"               # the longest wait for the upstream's answer
//! key_source = "refuse"         # refuse | arguments | unprotected
//! key_window = "1h"             # how long a derived key's record is kept
//! stale = "in-doubt"            # in-doubt | takeover (only for upstreams that deduplicate by key)
//! keep_every_answer = false     # true: a 5xx/408/425/429 is kept too (replayed, not retried)
//! max_request_bytes = 1048576
//! max_response_bytes = 16777216
//! downstream_key_header = "Idempotency-Key"
//!
//! # Routes, first match wins; a path ending in `*` matches every path it starts.
//! [[route]]
//! path = "/payments/*"
//! methods = ["POST"]            # the protected methods (default POST PUT PATCH DELETE)
//! stale = "takeover"
//!
//! [[route]]
//! path = "/search"
//! methods = []                  # nothing protected: every request passes through
//! ```
//!
//! A file with an error is refused at start: the message names the line and what to write.

use std::path::Path;
use std::time::Duration;

use http::{HeaderName, Method};
use serde::Deserialize;
use serde::de::{Deserializer, Error as _};

/// What a request without a key gets on a route ([contract §5.1](idem_core::contract#key-sources)).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum KeySourceName {
    /// 400 `key-required`.
    #[serde(alias = "client")]
    Refuse,
    /// A key derived from the whole body.
    Arguments,
    /// Forwarded every time, unrecorded.
    Unprotected,
}

/// What a retry gets once the holder's lease ended without an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Stale {
    /// 409 `urn:idem:problem:in-doubt` until an operator settles the key.
    InDoubt,
    /// The retry claims it and forwards again (with the same downstream key).
    Takeover,
}

/// The settings of one route, all given.
#[derive(Debug, Clone)]
pub(crate) struct RouteSettings {
    pub(crate) lease: Duration,
    pub(crate) processing_window: Duration,
    pub(crate) max_wait: Duration,
    pub(crate) timeout: Duration,
    pub(crate) key_source: KeySourceName,
    pub(crate) key_window: Duration,
    pub(crate) stale: Stale,
    pub(crate) keep_every_answer: bool,
    pub(crate) max_request_bytes: usize,
    pub(crate) max_response_bytes: usize,
    pub(crate) downstream_key_header: HeaderName,
}

impl Default for RouteSettings {
    fn default() -> Self {
        Self {
            lease: Duration::from_secs(30),
            processing_window: Duration::from_secs(5),
            max_wait: Duration::from_secs(30),
            timeout: Duration::from_secs(60),
            key_source: KeySourceName::Refuse,
            key_window: Duration::from_secs(3600),
            stale: Stale::InDoubt,
            keep_every_answer: false,
            max_request_bytes: 1024 * 1024,
            max_response_bytes: 16 * 1024 * 1024,
            downstream_key_header: HeaderName::from_static("idempotency-key"),
        }
    }
}

/// One route: the paths it matches, the methods it protects, its settings.
#[derive(Debug, Clone)]
pub(crate) struct Route {
    /// The path, or its prefix when `prefix`.
    pub(crate) path: String,
    pub(crate) prefix: bool,
    pub(crate) methods: Vec<Method>,
    pub(crate) settings: RouteSettings,
}

impl Route {
    /// The route of every path no configured route matches.
    pub(crate) fn catch_all(settings: RouteSettings) -> Self {
        Self {
            path: "/".into(),
            prefix: true,
            methods: default_methods(),
            settings,
        }
    }

    pub(crate) fn matches(&self, path: &str) -> bool {
        match self.prefix {
            true => path.starts_with(&self.path),
            false => path == self.path,
        }
    }

    pub(crate) fn protects(&self, method: &Method) -> bool {
        self.methods.contains(method)
    }
}

fn default_methods() -> Vec<Method> {
    vec![Method::POST, Method::PUT, Method::PATCH, Method::DELETE]
}

/// The routes, first match first, the catch-all last.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) routes: Vec<Route>,
}

impl Config {
    /// The route of `path`.
    #[cfg(test)]
    pub(crate) fn route(&self, path: &str) -> &Route {
        self.routes
            .iter()
            .find(|r| r.matches(path))
            .unwrap_or_else(|| self.routes.last().expect("the catch-all is always there"))
    }

    /// Every route protecting the default methods with `defaults`.
    pub(crate) fn with_defaults(defaults: RouteSettings) -> Self {
        Self {
            routes: vec![Route::catch_all(defaults)],
        }
    }

    /// Reads `path`; `defaults` are the settings the command line gave (the file's `[defaults]`
    /// override them). The error names the file, the line and the fix.
    pub(crate) fn load(path: &Path, defaults: RouteSettings) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("--config {}: {e}", path.display()))?;
        Self::parse(&text, defaults).map_err(|e| format!("--config {}: {e}", path.display()))
    }

    pub(crate) fn parse(text: &str, defaults: RouteSettings) -> Result<Self, String> {
        let file: File = toml::from_str(text).map_err(|e| e.to_string())?;
        if file.defaults.path.is_some() || file.defaults.methods.is_some() {
            return Err(
                "[defaults] holds settings only: put `path` and `methods` in a [[route]]".into(),
            );
        }
        let defaults = file.defaults.apply(defaults);
        let mut routes = Vec::with_capacity(file.route.len() + 1);
        for mut route in file.route {
            let Some(written) = route.path.take() else {
                return Err("every [[route]] needs a path (e.g. path = \"/tools/*\")".into());
            };
            let line = line_of(text, written.span().start);
            let (path, prefix) = match written.get_ref().strip_suffix('*') {
                Some(prefix) => (prefix.to_owned(), true),
                None => (written.get_ref().clone(), false),
            };
            if !path.starts_with('/') {
                return Err(format!(
                    "line {line}: a route's path starts with `/` (e.g. path = \"/tools/*\"), not {:?}",
                    written.get_ref()
                ));
            }
            let methods = route.methods.take().unwrap_or_else(default_methods);
            let settings = route.apply(defaults.clone());
            check(&settings).map_err(|why| format!("line {line}: {why}"))?;
            routes.push(Route {
                path,
                prefix,
                methods,
                settings,
            });
        }
        check(&defaults).map_err(|why| format!("[defaults]: {why}"))?;
        routes.push(Route::catch_all(defaults));
        Ok(Self { routes })
    }
}

/// The settings that must agree with each other.
pub(crate) fn check(s: &RouteSettings) -> Result<(), String> {
    if s.lease.is_zero() {
        return Err("lease must be more than 0 (e.g. lease = \"30s\")".into());
    }
    if s.key_window <= s.lease {
        return Err(format!(
            "key_window ({}) must be longer than the lease ({}): write a longer key_window or a shorter lease",
            humantime::format_duration(s.key_window),
            humantime::format_duration(s.lease)
        ));
    }
    if s.max_request_bytes == 0 || s.max_response_bytes == 0 {
        return Err("max_request_bytes and max_response_bytes must be more than 0".into());
    }
    Ok(())
}

/// The 1-based line of byte `offset` in `text`.
fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].matches('\n').count() + 1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Settings,
    #[serde(default)]
    route: Vec<Settings>,
}

/// A section as written (`[defaults]` or a `[[route]]`): each setting optional. One struct for
/// both, not a flattened one: flattening loses the position an error is reported at.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Settings {
    /// Routes only.
    path: Option<toml::Spanned<String>>,
    /// Routes only.
    #[serde(default, deserialize_with = "methods")]
    methods: Option<Vec<Method>>,
    #[serde(default, deserialize_with = "duration")]
    lease: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    processing_window: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    max_wait: Option<Duration>,
    #[serde(default, deserialize_with = "duration")]
    timeout: Option<Duration>,
    key_source: Option<KeySourceName>,
    #[serde(default, deserialize_with = "duration")]
    key_window: Option<Duration>,
    stale: Option<Stale>,
    keep_every_answer: Option<bool>,
    max_request_bytes: Option<usize>,
    max_response_bytes: Option<usize>,
    #[serde(default, deserialize_with = "header_name")]
    downstream_key_header: Option<HeaderName>,
}

impl Settings {
    fn apply(self, base: RouteSettings) -> RouteSettings {
        RouteSettings {
            lease: self.lease.unwrap_or(base.lease),
            processing_window: self.processing_window.unwrap_or(base.processing_window),
            max_wait: self.max_wait.unwrap_or(base.max_wait),
            timeout: self.timeout.unwrap_or(base.timeout),
            key_source: self.key_source.unwrap_or(base.key_source),
            key_window: self.key_window.unwrap_or(base.key_window),
            stale: self.stale.unwrap_or(base.stale),
            keep_every_answer: self.keep_every_answer.unwrap_or(base.keep_every_answer),
            max_request_bytes: self.max_request_bytes.unwrap_or(base.max_request_bytes),
            max_response_bytes: self.max_response_bytes.unwrap_or(base.max_response_bytes),
            downstream_key_header: self
                .downstream_key_header
                .unwrap_or(base.downstream_key_header),
        }
    }
}

fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text).map(Some).map_err(|e| {
        D::Error::custom(format!(
            "{text:?} is not a duration ({e}): write e.g. \"500ms\", \"30s\" or \"2m\""
        ))
    })
}

fn header_name<'de, D: Deserializer<'de>>(d: D) -> Result<Option<HeaderName>, D::Error> {
    let text = String::deserialize(d)?;
    HeaderName::try_from(text.as_str()).map(Some).map_err(|_| {
        D::Error::custom(format!(
            "{text:?} is not a header name: write e.g. \"Idempotency-Key\""
        ))
    })
}

fn methods<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Method>>, D::Error> {
    let names = Vec::<String>::deserialize(d)?;
    let mut methods = Vec::with_capacity(names.len());
    for name in names {
        let method = Method::from_bytes(name.to_ascii_uppercase().as_bytes())
            .map_err(|_| D::Error::custom(format!("{name:?} is not an HTTP method")))?;
        if matches!(method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return Err(D::Error::custom(format!(
                "{method} passes through unprotected: list only methods with effects (POST, PUT, PATCH, DELETE)"
            )));
        }
        methods.push(method);
    }
    Ok(Some(methods))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, String> {
        Config::parse(text, RouteSettings::default())
    }

    #[test]
    fn routes_match_in_order_and_inherit_the_defaults() {
        let config = parse(
            "[defaults]\nlease = \"10s\"\n\n[[route]]\npath = \"/pay/*\"\nmethods = [\"post\"]\nstale = \"takeover\"\n\n[[route]]\npath = \"/search\"\nmethods = []\n",
        )
        .unwrap();
        let pay = config.route("/pay/card");
        assert_eq!(pay.methods, [Method::POST]);
        assert_eq!(pay.settings.stale, Stale::Takeover);
        assert_eq!(pay.settings.lease, Duration::from_secs(10));
        assert!(!config.route("/search").protects(&Method::POST));
        let other = config.route("/tools/x");
        assert!(other.protects(&Method::DELETE) && !other.protects(&Method::GET));
        assert_eq!(other.settings.stale, Stale::InDoubt);
        assert_eq!(other.settings.lease, Duration::from_secs(10));
    }

    #[test]
    fn errors_name_the_line_and_the_fix() {
        let bad = |text: &str, wanted: &[&str]| {
            let e = parse(text).unwrap_err();
            for w in wanted {
                assert!(e.contains(w), "{e:?} lacks {w:?}");
            }
        };
        bad(
            "[defaults]\n\nlease = \"soon\"\n",
            &["line 3", "not a duration", "\"30s\""],
        );
        bad(
            "[[route]]\npath = \"/a\"\nstale = \"maybe\"\n",
            &["line 3", "in-doubt", "takeover"],
        );
        bad(
            "[[route]]\npath = \"/a\"\nleese = \"1s\"\n",
            &["line 3", "leese"],
        );
        bad(
            "\n[[route]]\npath = \"a\"\n",
            &["line 3", "starts with `/`"],
        );
        bad(
            "[[route]]\npath = \"/a\"\nmethods = [\"GET\"]\n",
            &["line 3", "passes through"],
        );
        bad(
            "[[route]]\npath = \"/a\"\nlease = \"2h\"\n",
            &["line 2", "key_window", "longer"],
        );
    }
}
