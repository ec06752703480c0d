//! A holder REALLY killed (SIGKILL, a separate process) between the two effects of a tool, on
//! SQLite and on PostgreSQL, and resumed by a takeover from its checkpoint: one payment and one
//! email at the sinks. The test binary re-spawns itself as the child (`--exact <test>`); the
//! tool and the choreography are the example's (`examples/checkout_resume.rs`).

#[path = "../examples/checkout_resume.rs"]
#[allow(dead_code)]
mod example;

fn child_args(test: &'static str) -> [&'static str; 4] {
    ["--exact", test, "--nocapture", "--test-threads=1"]
}

#[test]
fn sqlite_holder_killed_between_effects_resumes_from_its_checkpoint() {
    if example::is_child() {
        return example::child_main();
    }
    let dir = idem_conformance::kit::temp_dir("checkout-kill");
    let url = format!("sqlite://{}", dir.path().join("checkout.db").display());
    let counts = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(example::kill_and_resume(
            &url,
            &child_args("sqlite_holder_killed_between_effects_resumes_from_its_checkpoint"),
        ))
        .unwrap();
    assert_eq!(counts, (1, 1), "one payment, one email");
}

#[test]
fn postgres_holder_killed_between_effects_resumes_from_its_checkpoint() {
    if example::is_child() {
        return example::child_main();
    }
    let Ok(url) = std::env::var("IDEM_TEST_POSTGRES_URL") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "IDEM_TEST_POSTGRES_URL is not set (required under CI)"
        );
        eprintln!("skipped: IDEM_TEST_POSTGRES_URL is not set");
        return;
    };
    let counts = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(example::kill_and_resume(
            &url,
            &child_args("postgres_holder_killed_between_effects_resumes_from_its_checkpoint"),
        ))
        .unwrap();
    assert_eq!(counts, (1, 1), "one payment, one email");
}
