//! Store URLs: `sqlite://path`, `postgres://…`, `redis://…`.

use std::fmt;
use std::path::PathBuf;

/// Where the records (and the reference server's tickets) live.
#[derive(Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// An SQLite file: `sqlite://idem.db`, `sqlite:///abs/path.db`, or a bare path.
    Sqlite(PathBuf),
    /// A PostgreSQL database: `postgres://user:pass@host:port/db`.
    Postgres(String),
    /// A Redis server: `redis://host:port`.
    Redis(String),
}

/// A store URL that could not be understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadStoreUrl(String);

impl fmt::Display for BadStoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for BadStoreUrl {}

impl std::str::FromStr for StoreUrl {
    type Err = BadStoreUrl;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some(path) = s
            .strip_prefix("sqlite://")
            .or_else(|| s.strip_prefix("sqlite:"))
        {
            if path.is_empty() {
                return Err(BadStoreUrl(
                    "sqlite:// needs a file path, e.g. sqlite://idem.db".into(),
                ));
            }
            return Ok(Self::Sqlite(PathBuf::from(path)));
        }
        if s.starts_with("postgres://") || s.starts_with("postgresql://") {
            return Ok(Self::Postgres(s.to_owned()));
        }
        if s.starts_with("redis://") || s.starts_with("rediss://") {
            return Ok(Self::Redis(s.to_owned()));
        }
        if s.contains("://") {
            return Err(BadStoreUrl(format!(
                "unknown store URL scheme in {:?}: use sqlite://PATH, postgres://… or redis://…",
                redact(s)
            )));
        }
        if s.is_empty() {
            return Err(BadStoreUrl("empty store URL".into()));
        }
        Ok(Self::Sqlite(PathBuf::from(s)))
    }
}

/// `s` with any password replaced by `***`.
pub fn redact(s: &str) -> String {
    match (s.find("://"), s.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &s[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => {
                    format!("{}{}:***{}", &s[..scheme + 3], &userinfo[..colon], &s[at..])
                }
                None => s.to_owned(),
            }
        }
        _ => s.to_owned(),
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Sqlite(path) => write!(f, "sqlite://{}", path.display()),
            Self::Postgres(url) | Self::Redis(url) => f.write_str(&redact(url)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_redacts() {
        assert_eq!(
            "sqlite://a.db".parse::<StoreUrl>().unwrap(),
            StoreUrl::Sqlite("a.db".into())
        );
        assert_eq!(
            "b.db".parse::<StoreUrl>().unwrap(),
            StoreUrl::Sqlite("b.db".into())
        );
        assert!(matches!(
            "postgres://u:p@h/d".parse::<StoreUrl>().unwrap(),
            StoreUrl::Postgres(_)
        ));
        assert!("mysql://x".parse::<StoreUrl>().is_err());
        assert!("sqlite://".parse::<StoreUrl>().is_err());
        let pg: StoreUrl = "postgres://user:secret@host:5432/db".parse().unwrap();
        assert_eq!(format!("{pg:?}"), "postgres://user:***@host:5432/db");
        assert!(!format!("{pg}").contains("secret"));
    }
}
