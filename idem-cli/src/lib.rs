//! The `idem` binary's library: the reference tool server and store URLs, usable from tests.

pub mod serve;
pub mod store_url;
