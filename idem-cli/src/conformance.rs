//! `idem conformance`: the public conformance suite against a live store.

use idemkit::StoreUrl;
use serde_json::json;

use crate::exit::Failure;
use crate::store::{durability_warnings, open, open_store};

/// `idem conformance` on `store`: the server's risky settings, then each case as it finishes,
/// as text or JSON Lines; fails if a case fails.
pub(crate) async fn run(store: StoreUrl, as_json: bool) -> Result<(), Failure> {
    // Fail early and clearly if the store cannot be opened at all (or has no schema).
    let opened = open(&store).await?;
    // Settings the suite cannot see (it runs on one server) but that lose claims in production.
    for w in durability_warnings(&opened).await? {
        if as_json {
            println!("{}", json!({"type": "warning", "message": w}));
        } else {
            println!("warning: {w}");
        }
    }
    drop(opened);
    // The suite runs each case on a runtime of its own: off this one. Each case is printed as
    // it finishes (stdout is line-buffered, so each line reaches a pipe at once).
    let report = tokio::task::spawn_blocking(move || {
        suite(store, |case| {
            if as_json {
                println!(
                    "{}",
                    json!({
                        "type": "case",
                        "case": case.name,
                        "group": case.group,
                        "passed": case.passed(),
                        "message": case.failure,
                        "ms": case.elapsed.as_millis() as u64,
                    })
                );
            } else {
                match &case.failure {
                    None => println!("pass  {}", case.name),
                    Some(why) => println!("FAIL  {}: {why}", case.name),
                }
            }
        })
    })
    .await
    .map_err(Failure::other)?;
    let (passed, failed) = (report.passed.len(), report.failed.len());
    if as_json {
        println!(
            "{}",
            json!({"type": "summary", "passed": passed, "failed": failed})
        );
    } else {
        println!("{passed} passed, {failed} failed");
    }
    if failed == 0 {
        Ok(())
    } else {
        Err(Failure::suite_failed(format!(
            "{failed} conformance cases failed"
        )))
    }
}

/// `idem conformance --store URL`: the public suite against a live store, case by case;
/// `on_case` sees each case as it finishes. Each case opens the store again (reading only).
fn suite(
    url: StoreUrl,
    on_case: impl FnMut(&idem_conformance::CaseResult),
) -> idem_conformance::Report {
    let factory = move || {
        let url = url.clone();
        async move { open_store(&url).await.expect("the store opens") }
    };
    idem_conformance::run_streaming(factory, |_| true, on_case)
}
