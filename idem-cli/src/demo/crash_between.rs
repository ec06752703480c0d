//! `idem demo --crash-between-effects`: a checkout with two effects (a payment, then a receipt
//! email) whose holder crashes between them, retried by a takeover once its lease has run out
//! ([contract §6.1](idem_core::contract#checkpoints)). Without checkpoints the retry starts over
//! and pays again; with a checkpoint saved after the payment it resumes and only sends the email.
//! Effects are counted at their sinks.
//!
//! The crash is the holder's task dropped while its operation runs (what a killed process leaves:
//! the record `processing`, no release); the takeover happens at an injected time past the lease.
//! `idemkit/examples/checkout_resume.rs` does the same with a real process killed by SIGKILL.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use idem_core::{
    Attempt, Executor, Fingerprint, IdempotencyKey, ManualClock, Outcome, Policy, Scope,
    StalePolicy, Timestamp,
};
use idemkit::{OpenOptions, StoreUrl};
use serde_json::json;
use tokio::sync::oneshot;

use crate::exit::Failure;

/// The lease of a checkout.
const LEASE: Duration = Duration::from_secs(30);

/// What one run produced, counted at the sinks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CrashReport {
    /// Checkouts, each crashed once between its payment and its email, then retried.
    pub operations: usize,
    /// Payments at the payment sink.
    pub payments: usize,
    /// Emails at the email sink.
    pub emails: usize,
    /// Checkouts paid more than once.
    pub double_payments: usize,
}

/// The two sinks: payments and emails per order.
#[derive(Default, Clone)]
struct Sinks {
    payments: Arc<Mutex<HashMap<String, usize>>>,
    emails: Arc<Mutex<HashMap<String, usize>>>,
}

impl Sinks {
    fn add(map: &Mutex<HashMap<String, usize>>, order: &str) -> usize {
        let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
        let n = map.entry(order.to_owned()).or_default();
        *n += 1;
        *n
    }
}

/// The checkout. With `checkpoints`, it saves a step after paying and skips the payment when an
/// earlier attempt saved it. `crashed`, when given, is told after the payment (and its
/// checkpoint), and the operation then never finishes: the holder dies there.
async fn checkout(
    attempt: Attempt,
    sinks: Sinks,
    order: String,
    checkpoints: bool,
    crashed: Option<oneshot::Sender<()>>,
) -> Outcome {
    let paid: Option<usize> = match checkpoints {
        true => attempt.checkpoint_value("charged").unwrap_or(None),
        false => None,
    };
    let payment = match paid {
        Some(payment) => payment,
        None => {
            let payment = Sinks::add(&sinks.payments, &order);
            if checkpoints && let Err(e) = attempt.checkpoint("charged", &payment).await {
                return Outcome::retryable(503, &json!({"error": e.to_string()}))
                    .expect("a JSON body");
            }
            payment
        }
    };
    if let Some(crashed) = crashed {
        let _ = crashed.send(());
        std::future::pending::<()>().await;
    }
    Sinks::add(&sinks.emails, &order);
    Outcome::definitive(200, &json!({"order": order, "payment": payment})).expect("a JSON body")
}

/// Runs `operations` checkouts on `store`, each crashed once between its effects and retried by
/// a takeover, with or without checkpoints.
pub async fn run(
    store: &StoreUrl,
    operations: usize,
    checkpoints: bool,
) -> Result<CrashReport, Failure> {
    let store = OpenOptions::new()
        .migrate(true)
        .open(store)
        .await?
        .into_store();
    let clock = ManualClock::new(Timestamp::now());
    let policy = Policy::builder()
        .lease(LEASE)
        .stale(StalePolicy::Takeover)
        .build()
        .map_err(Failure::other)?;
    let executor = Executor::from_arc(store)
        .with_policy(policy)
        .with_clock(clock.clone());
    let sinks = Sinks::default();
    let run_id = format!("{:016x}", rand::random::<u64>());
    let scope = Scope::new(format!("idem-demo/{run_id}/checkout")).map_err(Failure::other)?;
    for i in 0..operations {
        let order = format!("order-{i}");
        let key = IdempotencyKey::new(format!("checkout:{order}")).map_err(Failure::other)?;
        let fp = Fingerprint::of("checkout", &json!({"order": order})).map_err(Failure::other)?;
        // The holder pays, then dies before the email: its task is dropped mid-operation.
        let (crashed, dead) = oneshot::channel();
        let holder = executor.run(&scope, &key, &fp, |attempt| {
            checkout(
                attempt,
                sinks.clone(),
                order.clone(),
                checkpoints,
                Some(crashed),
            )
        });
        tokio::select! {
            _ = holder => return Err(Failure::other("the crashed holder finished")),
            _ = dead => {}
        }
        // Past its lease, the retry takes the claim over.
        clock.advance(LEASE + Duration::from_secs(1));
        executor
            .run(&scope, &key, &fp, |attempt| {
                checkout(attempt, sinks.clone(), order.clone(), checkpoints, None)
            })
            .await
            .map_err(Failure::other)?;
    }
    let count = |map: &Mutex<HashMap<String, usize>>| {
        let map = map.lock().unwrap_or_else(|e| e.into_inner());
        (map.values().sum(), map.values().filter(|&&n| n > 1).count())
    };
    let (payments, double_payments) = count(&sinks.payments);
    let (emails, _) = count(&sinks.emails);
    Ok(CrashReport {
        operations,
        payments,
        emails,
        double_payments,
    })
}

/// The two runs side by side.
pub fn table(without: &CrashReport, with: &CrashReport) -> String {
    let mut out = format!(
        "{:<28} {:>20} {:>20}\n",
        "", "without checkpoints", "with checkpoints"
    );
    for (label, a, b) in [
        (
            "checkouts (crashed once)",
            without.operations,
            with.operations,
        ),
        ("payments", without.payments, with.payments),
        ("emails", without.emails, with.emails),
        (
            "double payments",
            without.double_payments,
            with.double_payments,
        ),
    ] {
        out.push_str(&format!("{label:<28} {a:>20} {b:>20}\n"));
    }
    out
}

/// `idem demo --crash-between-effects`: both runs on `store` (a fresh SQLite file in a temporary
/// directory when none is given), the table, and exit 6 if the run with checkpoints paid any
/// checkout twice or left an email unsent.
pub async fn run_cli(store: Option<StoreUrl>, operations: usize) -> Result<(), Failure> {
    let _temp;
    let store = match store {
        Some(store) => store,
        None => {
            let dir = std::env::temp_dir().join(format!("idem-demo-crash-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(Failure::other)?;
            _temp = RemoveOnDrop(dir.clone());
            format!("sqlite://{}", dir.join("demo.db").display()).parse()?
        }
    };
    println!(
        "idem demo --crash-between-effects: {operations} checkouts (a payment, then an email), \
         each holder crashing between the two and its retry taking over, store {store}"
    );
    let without = run(&store, operations, false).await?;
    let with = run(&store, operations, true).await?;
    println!();
    print!("{}", table(&without, &with));
    if with.double_payments > 0 || with.payments != operations || with.emails != operations {
        return Err(Failure::suite_failed(format!(
            "with checkpoints: {} payments and {} emails for {operations} checkouts",
            with.payments, with.emails
        )));
    }
    println!(
        "\nwithout checkpoints every retry paid again ({} double payments); with them, none.",
        without.double_payments
    );
    Ok(())
}

/// Removes the demo's temporary directory.
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
