//! The deeper run, with the bounds as arguments (`scripts/model-check --help`; figures in
//! `docs/model-check.md`).

use std::process::ExitCode;

use idem_core::StalePolicy;
use idem_model_check::liveness::always_can_settle;
use idem_model_check::run::check;
use idem_model_check::{CallerSpec, Config, ProtocolModel, Replication};

const HELP: &str = "\
usage: idem-model-check [options]

Searches every reachable state of the idem protocol within the bounds given and prints the
figures, or stops at the first counterexample and prints it. Defaults: two callers on one key making 2 and 1 calls, one
effect, one crash, reconciliation with a probe (2 takeovers), no failover, lease 2, ttl 5.

  --calls A,B[,C]    calls of each caller (a third caller reuses key 0 with another request)
  --second-key       the last caller names key 1 instead
  --effects N        effects per operation (1 or 2)
  --checkpoints      a checkpoint after each effect but the last
  --waiting          repeats wait for the operation in flight
  --retryable        an attempt may fail retryably before its first effect
  --crashes N        crashes of holders, in all
  --passes N         takeovers the reconciler may make
  --reads-first      the reconciler reads a stale record back, then claims it (two steps)
  --full-ttl-takeover  the reconciler's takeover under the callers' ttl, not the record's own
                     expiry (the reconciler before that rule: finds a recreated record)
  --takeover         stale claims are taken over (no reconciler)
  --failovers N      failovers of the store
  --asynchronous     the store acknowledges before its replica has the write
  --ignore-lease     holders start effects after their lease ended
  --ttl N|none       the ttl in ticks (lease: 2)
  --liveness         check that every state can settle instead (probe never 'unknown' when
                     it knows)
";

fn parse(args: &[String]) -> Result<(Config, bool), String> {
    let mut cfg = Config::small();
    let mut liveness = false;
    let mut second_key = false;
    let mut it = args.iter();
    let number = |v: Option<&String>| -> Result<u8, String> {
        v.ok_or("a number is missing")?
            .parse()
            .map_err(|e| format!("{e}"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--calls" => {
                let list = it.next().ok_or("--calls needs A,B[,C]")?;
                let calls: Result<Vec<u8>, _> = list.split(',').map(str::parse).collect();
                cfg.callers = calls
                    .map_err(|e| format!("--calls: {e}"))?
                    .into_iter()
                    .enumerate()
                    .map(|(i, calls)| CallerSpec {
                        key: 0,
                        request: u8::from(i == 2),
                        calls,
                    })
                    .collect();
            }
            "--second-key" => second_key = true,
            "--effects" => cfg.effects = number(it.next())?,
            "--checkpoints" => cfg.checkpoints = true,
            "--waiting" => cfg.waiting = true,
            "--retryable" => cfg.retryable = true,
            "--crashes" => cfg.crashes = number(it.next())?,
            "--passes" => cfg.reconcile_passes = number(it.next())?,
            "--reads-first" => cfg.reconcile_reads_first = true,
            "--full-ttl-takeover" => cfg.reconcile_own_expiry = false,
            "--takeover" => cfg = cfg.takeover(),
            "--failovers" => cfg.failovers = number(it.next())?,
            "--asynchronous" => cfg.replication = Replication::Asynchronous,
            "--ignore-lease" => cfg.honour_lease = false,
            "--ttl" => {
                cfg.ttl = match it.next().map(String::as_str) {
                    Some("none") => None,
                    v => Some(u64::from(number(v.map(|v| v.to_string()).as_ref())?)),
                }
            }
            "--liveness" => liveness = true,
            other => return Err(format!("unknown argument {other}\n\n{HELP}")),
        }
    }
    if second_key && let Some(last) = cfg.callers.last_mut() {
        last.key = 1;
        last.request = 0;
    }
    if cfg.stale == StalePolicy::Takeover {
        cfg.reconcile_passes = 0;
    }
    Ok((cfg, liveness))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        print!("{HELP}");
        return ExitCode::SUCCESS;
    }
    let (mut cfg, liveness) = match parse(&args) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    println!("{cfg:?}");
    if liveness {
        cfg.probe_unknown = false;
        let l = always_can_settle(cfg);
        println!("{} states, {:.2?}", l.states, l.elapsed);
        return match l.trap {
            None => {
                println!("every reachable state can settle");
                ExitCode::SUCCESS
            }
            Some(path) => {
                println!("a state that cannot settle, reached by: {path:?}");
                ExitCode::FAILURE
            }
        };
    }
    let r = check(ProtocolModel::new(cfg));
    println!(
        "{} states ({} generated), depth {}, {:.2?}",
        r.unique_states, r.states, r.max_depth, r.elapsed
    );
    for name in r.violations.keys() {
        println!(
            "FAILS: {name}\n{}",
            r.trace(name).expect("a counterexample")
        );
    }
    for name in &r.unreached {
        println!("never reached: {name}");
    }
    if r.violations.is_empty() && r.unreached.is_empty() {
        println!("every property holds in every reachable state");
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
