//! `idem purge`: deletes expired records in bounded batches until none are left.

use std::time::Duration;

use idem_core::reconcile::{PurgePace, purge_expired_paced};
use idem_core::{KeyStore, SystemClock};
use idemkit::StoreUrl;
use serde_json::json;

use crate::cli::PurgeArgs;
use crate::exit::Failure;
use crate::store::open_store;

/// `idem purge` on `store`, reporting as text or JSON.
pub(crate) async fn run(store: StoreUrl, args: PurgeArgs) -> Result<(), Failure> {
    let PurgeArgs { batch, duty, json } = args;
    let s = open_store(&store).await?;
    let pace = PurgePace::new(batch)
        .duty(duty)
        .map_err(|e| Failure::usage(e.to_string()))?;
    let report = purge(&*s, pace, !json).await?;
    if json {
        println!(
            "{}",
            json!({"deleted": report.deleted, "batches": report.batches})
        );
    } else {
        println!(
            "purged {} expired records in {} batches",
            report.deleted, report.batches
        );
    }
    Ok(())
}

/// What `idem purge` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PurgeReport {
    /// Records deleted.
    pub deleted: u64,
    /// Batches run.
    pub batches: u64,
}

/// `idem purge`: deletes expired records at `pace` (batch size and duty cycle), showing a
/// progress spinner on stderr only when stderr is a terminal (`progress`).
pub async fn purge(
    store: &dyn KeyStore,
    pace: PurgePace,
    progress: bool,
) -> Result<PurgeReport, Failure> {
    use std::io::IsTerminal;
    let bar = if progress && std::io::stderr().is_terminal() {
        let bar = indicatif::ProgressBar::new_spinner();
        bar.enable_steady_tick(Duration::from_millis(120));
        bar
    } else {
        indicatif::ProgressBar::hidden()
    };
    let report = purge_expired_paced(store, &SystemClock, pace, tokio::time::sleep, |r| {
        bar.set_message(format!(
            "purged {} records in {} batches",
            r.deleted, r.batches
        ));
    })
    .await;
    bar.finish_and_clear();
    let report = report?;
    Ok(PurgeReport {
        deleted: report.deleted as u64,
        batches: report.batches as u64,
    })
}
