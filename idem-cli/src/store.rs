//! Opening the store a command names, and what its server's settings risk.
//!
//! Every store is opened through [`idemkit::open()`]; only `idem migrate` (and the reference
//! server) change the schema.

use std::sync::Arc;

use idem_core::KeyStore;
use idemkit::{OpenOptions, Opened, StoreUrl};

use crate::exit::Failure;

/// Opens the record store named by `url`, reading only: a missing or older schema is refused
/// with a message naming `idem migrate`, and nothing is created.
pub async fn open_store(url: &StoreUrl) -> Result<Arc<dyn KeyStore>, Failure> {
    Ok(open(url).await?.into_store())
}

/// [`open_store`], keeping the engine's own store.
pub async fn open(url: &StoreUrl) -> Result<Opened, Failure> {
    Ok(OpenOptions::new().open(url).await?)
}

/// The settings that allow a lost claim, one line each naming the setting, the risk and what to
/// do, prefixed by the backend (`idem conformance` and `idem migrate` print them). Redis is
/// judged as a store without `with_wait_for_replicas`, which is what a URL opens: an
/// application that waits for its replicas should check its own store's
/// [`Maintenance::check_config`](idem_core::Maintenance::check_config).
pub async fn durability_warnings(opened: &Opened) -> Result<Vec<String>, Failure> {
    let backend = opened.url().backend();
    let warnings = opened
        .maintenance()
        .check_config()
        .await
        .map_err(|e| Failure::from(e).context("cannot read the server's settings"))?;
    Ok(warnings.iter().map(|w| format!("{backend}: {w}")).collect())
}
