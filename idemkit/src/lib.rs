#![cfg_attr(not(doctest), doc = include_str!("../README.md"))]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use idem_core::*;

pub mod open;
pub use open::{OpenError, OpenOptions, Opened, StoreUrl, open};

/// The README's examples, as doctests (the PostgreSQL one compiled, not run). `cargo test`
/// enables `postgres` and `encryption` for this crate's own tests through its self
/// dev-dependency.
#[cfg(all(doctest, feature = "postgres", feature = "encryption"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The embedded SQLite store.
#[cfg(feature = "sqlite")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqlite")))]
pub mod sqlite {
    pub use idem_store_sqlite::*;
}

/// The PostgreSQL store.
#[cfg(feature = "postgres")]
#[cfg_attr(docsrs, doc(cfg(feature = "postgres")))]
pub mod postgres {
    pub use idem_store_postgres::*;
}

/// The Redis and Redis Cluster store.
#[cfg(feature = "redis")]
#[cfg_attr(docsrs, doc(cfg(feature = "redis")))]
pub mod redis {
    pub use idem_store_redis::*;
}

/// The DynamoDB store.
#[cfg(feature = "dynamodb")]
#[cfg_attr(docsrs, doc(cfg(feature = "dynamodb")))]
pub mod dynamodb {
    pub use idem_store_dynamodb::*;
}

/// Idempotent tools for MCP servers on `rmcp`, and the retrying caller.
#[cfg(feature = "mcp")]
#[cfg_attr(docsrs, doc(cfg(feature = "mcp")))]
pub mod mcp {
    pub use idem_mcp::*;
}

/// The tower layer for HTTP tools; with feature `client`, the agent-side `ToolClient` in
/// `idemkit::http::client`.
#[cfg(feature = "http")]
#[cfg_attr(docsrs, doc(cfg(feature = "http")))]
pub mod http {
    pub use idem_http::*;
}
