//! What a tool publishes of its contract ([contract §5](idem_core::contract#http)): the listing
//! `GET /tools` serves carries the processing window, the minimum client retry deadline (the
//! window plus the store write budget) and the maximum wait, in milliseconds, and a client reads
//! them back.

use std::time::Duration;

use idem_core::contract::{ListedTool, ToolContract, ToolListing};
use serde_json::json;

#[test]
fn the_listing_publishes_the_window_the_minimum_deadline_and_the_wait() {
    let contract = ToolContract::new(Duration::from_secs(2))
        .with_store_write(Duration::from_millis(250))
        .with_max_wait(Duration::from_secs(5));
    assert_eq!(contract.min_client_deadline(), Duration::from_millis(2250));

    let listing = ToolListing {
        tools: vec![ListedTool::new("create_ticket", &contract)],
    };
    let wire = serde_json::to_value(&listing).unwrap();
    assert_eq!(
        wire,
        json!({"tools": [{
            "name": "create_ticket",
            "processing_window_ms": 2000,
            "min_client_deadline_ms": 2250,
            "max_wait_ms": 5000,
        }]})
    );

    let read: ToolListing = serde_json::from_value(wire).unwrap();
    let tool = read.tool("create_ticket").unwrap();
    assert_eq!(
        tool.min_client_deadline(),
        Some(Duration::from_millis(2250))
    );
    assert_eq!(tool.max_wait(), Some(Duration::from_secs(5)));
}

/// What a contract holds reads back as it was given (an MCP server takes its store write budget
/// from the contract `idem serve` builds), and a new contract has the default budget and
/// publishes no wait.
#[test]
fn a_contract_reads_back_its_window_budget_and_wait() {
    let new = ToolContract::new(Duration::from_secs(2));
    assert_eq!(new.processing_window(), Duration::from_secs(2));
    assert_eq!(new.store_write(), ToolContract::DEFAULT_STORE_WRITE);
    assert_eq!(
        ToolContract::DEFAULT_STORE_WRITE,
        Duration::from_millis(500)
    );
    assert_eq!(new.max_wait(), None);

    let set = new
        .with_store_write(Duration::from_millis(250))
        .with_max_wait(Duration::from_secs(5));
    assert_eq!(set.processing_window(), Duration::from_secs(2));
    assert_eq!(set.store_write(), Duration::from_millis(250));
    assert_eq!(set.max_wait(), Some(Duration::from_secs(5)));
}
