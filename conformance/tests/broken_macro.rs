//! The broken stores of `broken/mod.rs` fail their cases through `conformance_tests!` too, the
//! way a user's store runs the suite.
//!
//! Each broken store's tests are generated, `#[ignore]`d, in a module of their own below. The
//! driver test runs this very binary again (`std::env::current_exe()`) for one generated test at a
//! time, `--ignored --exact <module>::<case>`, and asserts that the test process fails for every
//! case meant to catch the defect and passes the basic case. A child process per test is what a
//! user gets (`cargo test` runs the same binary); it sees the panic, the case's timeout and the
//! exit status exactly as the user's CI would.

use std::process::Command;

mod broken;

use broken::{BASIC_CASE, Defect, caught_by};

macro_rules! broken_suite {
    ($($module:ident => $defect:ident),* $(,)?) => {
        $(
            mod $module {
                idem_conformance::conformance_tests!(
                    #[ignore = "deliberately broken store, run by the driver test"]
                    crate::broken::factory(crate::broken::Defect::$defect)
                );
            }
        )*

        /// The module holding the generated tests of `defect`.
        fn module(defect: Defect) -> &'static str {
            match defect {
                $(Defect::$defect => ::core::stringify!($module),)*
            }
        }
    };
}

broken_suite! {
    read_then_write_claim => ReadThenWriteClaim,
    read_then_write_rewrite => ReadThenWriteRewrite,
    rewrite_writes_stale_checkpoints => RewriteWritesStaleCheckpoints,
    rewrite_compares_token_only => RewriteComparesTokenOnly,
    no_fencing => NoFencing,
    lease_ends_holder => LeaseEndsHolder,
    expiry_ignored => ExpiryIgnored,
    case_insensitive_address => CaseInsensitiveAddress,
    concatenated_address => ConcatenatedAddress,
    spaces_dropped_address => SpacesDroppedAddress,
    purge_miscount => PurgeMiscount,
    extend_sets_the_lease => ExtendSetsTheLease,
    extend_forgets => ExtendForgets,
    checkpoint_unfenced => CheckpointUnfenced,
    never_wakes => NeverWakes,
}

/// Runs the generated test `module::case` in a child process; whether it passed, and its output.
fn run_generated(module: &str, case: &str) -> (bool, String) {
    let name = format!("{module}::{case}");
    let output = Command::new(std::env::current_exe().expect("the test binary"))
        .args(["--ignored", "--exact", &name, "--test-threads=1"])
        // The failures are expected: no backtraces to symbolise.
        .env("RUST_BACKTRACE", "0")
        .output()
        .expect("run the test binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("running 1 test"),
        "{name}: the generated test exists and ran alone:\n{stdout}"
    );
    let log = format!("{stdout}\n{}", String::from_utf8_lossy(&output.stderr));
    (output.status.success(), log)
}

#[test]
fn every_broken_store_fails_its_cases_through_the_macro() {
    // One thread per broken store, each running its store's tests one after the other.
    std::thread::scope(|threads| {
        for &defect in broken::ALL {
            threads.spawn(move || {
                let module = module(defect);
                let (passed, log) = run_generated(module, BASIC_CASE);
                assert!(
                    passed,
                    "{defect:?} is otherwise a working store: \
                     {module}::{BASIC_CASE} must pass\n{log}"
                );
                for case in caught_by(defect) {
                    let (passed, log) = run_generated(module, case);
                    assert!(
                        !passed,
                        "{defect:?}: the generated test {module}::{case} \
                         should fail but passed\n{log}"
                    );
                }
            });
        }
    });
}
