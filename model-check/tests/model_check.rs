//! The exhaustive bounded runs CI makes (`cargo test -p idem-model-check`; `scripts/test` runs
//! them with the workspace). Each search covers every reachable state of its model, unless a
//! property fails: it then stops at that counterexample, so a broken rule fails these tests in
//! seconds (`tests/mutants.rs`). The figures are printed (`-- --nocapture`) and listed in
//! `docs/model-check.md`.

use idem_core::StalePolicy;
use idem_model_check::liveness::{Liveness, always_can_settle};
use idem_model_check::properties::{AT_MOST_ONCE, COMPLETES, EXPIRED_STAYS_GONE, REPLAYS};
use idem_model_check::run::{Report, check};
use idem_model_check::{CallerSpec, Config, ProtocolModel, Replication};

/// Two callers on one key, one call each, one crash, a reconciler with a probe (two passes).
fn base() -> Config {
    let mut cfg = Config::small();
    cfg.callers[0].calls = 1;
    cfg
}

fn figures(name: &str, r: &Report) {
    println!(
        "{name}: {} states ({} generated), depth {}, {:.2?}",
        r.unique_states, r.states, r.max_depth, r.elapsed
    );
}

/// Every state searched; no safety property fails, and the model is not vacuous: an operation
/// completes (and, where two callers send one request, a repeat is replayed).
fn holds(name: &str, cfg: Config) -> Report {
    let replay_possible = cfg.callers.iter().enumerate().any(|(i, a)| {
        cfg.callers[i + 1..]
            .iter()
            .any(|b| (a.key, a.request) == (b.key, b.request))
    });
    let r = check(ProtocolModel::new(cfg));
    figures(name, &r);
    if let Some(property) = r.violations.keys().next() {
        panic!(
            "{name}: {property} fails:\n{}",
            r.trace(property).expect("a trace")
        );
    }
    assert!(
        !r.unreached.contains(&COMPLETES),
        "{name}: nothing completes"
    );
    if replay_possible {
        assert!(!r.unreached.contains(&REPLAYS), "{name}: nothing replays");
    }
    r
}

/// The checker finds a counterexample to `property`; returns its trace.
fn finds(name: &str, cfg: Config, property: &'static str) -> String {
    let r = check(ProtocolModel::new(cfg));
    figures(name, &r);
    let trace = r.trace(property).unwrap_or_else(|| {
        panic!(
            "{name}: no counterexample to {property}; fails: {:?}",
            r.violations.keys()
        )
    });
    println!("{name}: counterexample to {property}:\n{trace}");
    trace
}

/// Liveness: the probe answers "unknown" only when it cannot know, records do not expire (or
/// expiry would settle everything), and the reconciler may run once per claim a caller can make.
fn settles(name: &str, mut cfg: Config) -> Liveness {
    cfg.probe_unknown = false;
    cfg.ttl = None;
    cfg.reconcile_passes = match cfg.stale {
        StalePolicy::Reconcile => cfg.callers.iter().map(|c| c.calls).sum(),
        StalePolicy::Takeover => 0,
    };
    let l = always_can_settle(cfg);
    println!("{name}: {} states, {:.2?}", l.states, l.elapsed);
    l
}

#[test]
fn model_check_reconcile_with_probe_keeps_every_guarantee() {
    // A caller that calls again (after a crash, or as a repeat) and one that calls once.
    let mut cfg = base();
    cfg.callers[0].calls = 2;
    holds("reconcile with probe, 2 + 1 calls", cfg);
}

#[test]
fn model_check_takeover_window_is_found_only_with_takeover() {
    let trace = finds("takeover", base().takeover(), AT_MOST_ONCE);
    // The window: the first holder ran its effect, its lease ran out before it recorded the
    // outcome, and the next caller took over and ran it again.
    assert!(
        trace.contains("Effect(") && trace.contains("Tick"),
        "{trace}"
    );
    // The same model with reconciliation instead: no double effect in any state.
    holds("same model, reconcile with probe", base());
}

#[test]
fn model_check_holder_that_ignores_its_lease_is_a_window() {
    let mut cfg = base();
    cfg.honour_lease = false;
    finds("holder ignores its lease", cfg, AT_MOST_ONCE);
    // Holders that stop when their lease ends (heartbeat with extend): none in any state.
    holds("same model, holders honour their lease", base());
}

#[test]
fn model_check_failover_window_is_found_only_without_acknowledgement() {
    let mut cfg = base();
    cfg.failovers = 1;
    cfg.replication = Replication::Asynchronous;
    let trace = finds("failover, asynchronous", cfg.clone(), AT_MOST_ONCE);
    assert!(trace.contains("Failover"), "{trace}");
    cfg.replication = Replication::Acknowledged;
    holds("failover, acknowledged by the replica", cfg);
}

#[test]
fn model_check_checkpoints_resume_a_two_effect_operation() {
    let mut cfg = base();
    cfg.effects = 2;
    cfg.checkpoints = true;
    holds("two effects, checkpoints", cfg.clone());
    let l = settles("two effects, checkpoints, crash, reconcile", cfg);
    assert_eq!(
        l.trap, None,
        "a state from which the operation cannot settle"
    );
}

#[test]
fn model_check_two_effects_without_checkpoints_are_never_run_twice_but_can_stay_processing() {
    let mut cfg = base();
    cfg.effects = 2;
    holds("two effects, no checkpoints", cfg.clone());
    // Half done and crashed: the probe cannot say "found" or "not found", nothing may guess,
    // and the record stays `processing` until it expires (the documented reason for
    // checkpoints, idem_core::contract §6.1).
    let l = settles("two effects, no checkpoints, crash, reconcile", cfg);
    let trap = l.trap.expect("a half-done operation that cannot settle");
    println!("trap: {trap:?}");
}

#[test]
fn model_check_waiting_repeats_and_retryable_outcomes() {
    let mut cfg = base();
    cfg.waiting = true;
    cfg.retryable = true;
    holds("waiting, retryable outcomes", cfg);
}

#[test]
fn model_check_three_callers_one_key_reused_for_another_request() {
    let mut cfg = base();
    cfg.callers.push(CallerSpec {
        key: 0,
        request: 1,
        calls: 1,
    });
    cfg.reconcile_passes = 1;
    holds("three callers, one key, another request", cfg);
}

#[test]
fn model_check_two_keys_share_a_store_and_a_reconciler() {
    let mut cfg = base();
    cfg.callers[1].key = 1;
    cfg.failovers = 1;
    holds("two keys, one store, one reconciler", cfg);
}

/// Regression of a finding (docs/model-check.md): the reconciler reads a stale record back, the
/// record expires (and is purged) before its takeover claim, and the claim (`New`, or
/// `ExpiredReplaced`) wrote the dead operation's record again, which, given back with `release`,
/// stayed `failed_retryable` for a whole ttl and refused another request on the key as a
/// mismatch. The takeover now keeps the record's own expiry
/// (`idem_core::reconcile::takeover_policy`): with the read and the claim as two steps, as in
/// the code, every property holds in every state; the reconciler before that rule is still
/// found.
#[test]
fn model_check_reconciliation_never_recreates_an_expired_record() {
    let mut cfg = base();
    cfg.reconcile_reads_first = true;
    let r = holds("reconciler reads, then claims", cfg.clone());
    assert!(!r.violations.contains_key(EXPIRED_STAYS_GONE));
    cfg.reconcile_own_expiry = false;
    let trace = finds(
        "reconciler reads, then claims under the callers' ttl",
        cfg,
        EXPIRED_STAYS_GONE,
    );
    assert!(
        trace.contains("ReconcileCheck") && trace.contains("ReconcileTake"),
        "{trace}"
    );
}

#[test]
fn model_check_every_state_can_settle() {
    // Without crashes the operation can always reach `completed` or `failed_retryable`, with
    // either stale policy.
    for stale in [StalePolicy::Reconcile, StalePolicy::Takeover] {
        let mut cfg = Config::small();
        cfg.crashes = 0;
        if stale == StalePolicy::Takeover {
            cfg = cfg.takeover();
        }
        let l = settles(&format!("{stale:?}, no crash"), cfg);
        assert_eq!(l.trap, None, "{stale:?}: a state that cannot settle");
    }
    // After a crash, reconciliation settles the key: no key stays `processing`. (Under takeover
    // without a reconciler, only a caller that comes back after the lease settles it.)
    let l = settles("Reconcile, one crash", Config::small());
    assert_eq!(l.trap, None, "a key stuck processing");
}
