//! `idem migrate`: creates or upgrades the store's schema.

use idemkit::{OpenOptions, StoreUrl};
use serde_json::json;

use crate::exit::Failure;
use crate::store::durability_warnings;

/// `idem migrate` on `store`: the schema made ready, then the server's risky settings, as text
/// or JSON.
pub(crate) async fn run(store: StoreUrl, as_json: bool) -> Result<(), Failure> {
    let warnings = migrate(&store).await?;
    if as_json {
        println!(
            "{}",
            json!({"store": store.to_string(), "migrated": true, "warnings": warnings})
        );
    } else {
        for w in &warnings {
            println!("warning: {w}");
        }
        println!("migrated {store}: the schema is ready");
    }
    Ok(())
}

/// `idem migrate`: creates or upgrades the schema (on Redis: loads the scripts and checks the
/// settings), then reports the durability warnings.
pub async fn migrate(url: &StoreUrl) -> Result<Vec<String>, Failure> {
    let opened = OpenOptions::new().migrate(true).open(url).await?;
    durability_warnings(&opened).await
}
