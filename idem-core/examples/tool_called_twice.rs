//! A tool called twice with the same key — the agent's orchestrator timed out and retried — and
//! the side effect happening once.
//!
//! Run: `cargo run -q -p idem-core --example tool_called_twice`

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use idem_core::{Executor, Fingerprint, IdempotencyKey, MemoryStore, Outcome, Scope};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let executor = Executor::new(MemoryStore::new());
    // The effect: tickets created in the helpdesk. Counted where they land.
    let tickets = Arc::new(AtomicUsize::new(0));

    // The orchestrator names the operation from its durable step, never the model.
    let scope = Scope::from_parts(["tenant-acme", "create_ticket"])?;
    let key = IdempotencyKey::new("wf-8812:step-3:create_ticket")?;
    let args = json!({"title": "Printer on fire", "account_id": "A-7"});
    let fingerprint = Fingerprint::of("create_ticket", &args)?;

    for call in 1..=2 {
        let tickets = tickets.clone();
        let execution = executor
            .run(&scope, &key, &fingerprint, |attempt| async move {
                let n = tickets.fetch_add(1, Ordering::SeqCst) + 1;
                println!(
                    "  tool runs (attempt {}): ticket T-{n} created",
                    attempt.number()
                );
                Outcome::definitive(201, &json!({"ticket_id": format!("T-{n}")})).expect("json")
            })
            .await?;
        println!(
            "call {call}: status {} body {} replayed={}",
            execution.outcome().status(),
            execution.outcome().body(),
            execution.is_replay()
        );
    }
    let n = tickets.load(Ordering::SeqCst);
    println!("tickets at the sink: {n}");
    assert_eq!(n, 1, "the retry must not create a second ticket");
    Ok(())
}
