//! `idem demo --mcp-tasks` does its job on every backend: with idem, one effect per operation at
//! the sink and every operation answered, although answers were lost, polls went to either
//! replica and one replica was killed mid-task; with rmcp's `TaskManager` alone, the same
//! clients doubled effects and polled tasks the replica did not have.

use std::time::Duration;

use idem_conformance::kit;

use crate::demo::tasks::{Mode, TasksOptions, run};

fn options() -> TasksOptions {
    TasksOptions::new(9, Duration::from_millis(1200))
}

async fn check_on(backend: &str) {
    let Some((url, _dir)) = kit::store_url(backend, "tasks.db") else {
        return;
    };
    let with = run(Mode::Idem(url.parse().unwrap()), &options())
        .await
        .unwrap();
    assert_eq!(
        (with.effects, with.doubled, with.unfinished),
        (9, 0, 0),
        "{with:?}"
    );
    assert_eq!(with.tasks_created, 9, "one task per operation: {with:?}");
    assert_eq!(with.lost, 0, "{with:?}");
    // The faults happened: lost answers were called again.
    assert!(with.calls > 9, "{with:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_tasks_demo_on_sqlite() {
    check_on("sqlite").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_tasks_demo_on_postgres() {
    check_on("postgres").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn mcp_tasks_demo_on_redis() {
    check_on("redis").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn without_idem_the_same_clients_double_effects_and_lose_tasks() {
    let without = run(Mode::TaskManager, &options()).await.unwrap();
    assert!(without.doubled > 0, "{without:?}");
    assert!(without.effects > 9, "{without:?}");
    assert!(without.lost > 0, "{without:?}");
}
