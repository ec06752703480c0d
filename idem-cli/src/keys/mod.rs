//! `idem keys`: inspect a key, and settle a stuck one by hand.

mod settle;
mod show;
mod steps;

use idemkit::StoreUrl;

use crate::cli::KeysCommand;
use crate::exit::Failure;
use crate::store::open_store;
use settle::ManualFlags;

/// `idem keys COMMAND` on `store`, its answer printed.
pub(crate) async fn run(store: StoreUrl, command: KeysCommand) -> Result<(), Failure> {
    let s = open_store(&store).await?;
    let out = match command {
        KeysCommand::Ls {
            state,
            older_than,
            scope,
            limit,
            json,
        } => {
            let filter = idem_core::store::ListFilter {
                state,
                scope,
                updated_before: older_than.map(|d| idem_core::Timestamp::now() - d),
            };
            show::ls(&*s, &filter, limit, json).await?
        }
        KeysCommand::Show { scope, key, json } => show::show(&*s, &scope, &key, json).await?,
        KeysCommand::Resolve {
            scope,
            key,
            outcome,
            force,
            json,
        } => {
            let text = std::fs::read_to_string(&outcome)
                .map_err(|e| Failure::usage(format!("cannot read {}: {e}", outcome.display())))?;
            let value = serde_json::from_str(&text)
                .map_err(|e| Failure::usage(format!("{} is not JSON: {e}", outcome.display())))?;
            settle::resolve(&*s, &scope, &key, &value, ManualFlags { force, json }).await?
        }
        KeysCommand::Release {
            scope,
            key,
            force,
            json,
        } => settle::release(&*s, &scope, &key, ManualFlags { force, json }).await?,
    };
    println!("{}", out.trim_end());
    Ok(())
}
