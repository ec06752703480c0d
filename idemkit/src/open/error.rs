//! [`OpenError`]: why a store could not be opened from its URL.

use std::path::PathBuf;

use idem_core::StoreError;

/// Why a store could not be opened from its URL. Every URL inside is already redacted.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OpenError {
    /// The text has no `scheme://`; `hint` suggests the URL that was probably meant.
    #[error("store URL {input:?} has no scheme: {hint}")]
    NoScheme {
        /// The text given (redacted).
        input: String,
        /// What to write instead.
        hint: String,
    },
    /// The scheme is not one idemkit knows.
    #[error("unknown store URL scheme {scheme:?} in {input:?}: use {known}")]
    UnknownScheme {
        /// The scheme given.
        scheme: String,
        /// The text given (redacted).
        input: String,
        /// The schemes that are known, for people.
        known: &'static str,
    },
    /// The URL does not parse, or its parts do not make sense for its scheme.
    #[error("invalid store URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL (redacted).
        url: String,
        /// What is wrong.
        reason: String,
        /// The parser's error, if there was one.
        #[source]
        source: Option<url::ParseError>,
    },
    /// The scheme's backend is not compiled in: enable the named cargo feature of `idemkit`.
    #[error("{url} needs idemkit's `{feature}` feature, which this build does not have")]
    FeatureDisabled {
        /// The URL (redacted).
        url: String,
        /// The cargo feature to enable.
        feature: &'static str,
    },
    /// The SQLite file does not exist (it is created only when migrating).
    #[error(
        "no SQLite file at {}: check the path, or create it with `idem migrate` (in code: OpenOptions::migrate)",
        path.display()
    )]
    NoDatabaseFile {
        /// The path.
        path: PathBuf,
    },
    /// The store's schema is missing or older than this build needs; nothing was changed.
    #[error(
        "schema missing at {url}: found version {found}, this build needs {expected}; run `idem migrate` (in code: OpenOptions::migrate) with a role allowed to change the schema"
    )]
    SchemaMissing {
        /// The URL (redacted).
        url: String,
        /// The version found (0: never migrated).
        found: u32,
        /// The version this build reads and writes.
        expected: u32,
    },
    /// The store's schema is newer than this build knows: upgrade idem.
    #[error(
        "the schema at {url} is at version {found}, newer than this build's {expected}: upgrade idem"
    )]
    SchemaNewer {
        /// The URL (redacted).
        url: String,
        /// The version found.
        found: u32,
        /// The version this build reads and writes.
        expected: u32,
    },
    /// The store refused or could not be reached while opening (see
    /// [`StoreError::is_unavailable`] on the source).
    #[error("cannot open the store {url}: {source}")]
    Store {
        /// The URL (redacted).
        url: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
}

impl OpenError {
    /// Whether the text given was not a usable store URL (as opposed to a store that could not
    /// be opened).
    pub fn is_bad_url(&self) -> bool {
        matches!(
            self,
            Self::NoScheme { .. }
                | Self::UnknownScheme { .. }
                | Self::InvalidUrl { .. }
                | Self::FeatureDisabled { .. }
        )
    }
}

impl From<std::convert::Infallible> for OpenError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}
