//! `idem`: the reference tool server, the demo, and operator commands on any store URL.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idem_cli::bench;
use idem_cli::demo::{self, DemoOptions};
use idem_cli::exit::{EXIT_CODES, Failure};
use idem_cli::ops;
use idem_cli::serve::{Backend, ServeOptions, router};
use idem_core::{IdempotencyKey, Scope};
use idemkit::StoreUrl;
use serde_json::json;

/// The store when neither `--store` nor `IDEM_STORE` names one.
const DEFAULT_STORE: &str = "sqlite://idem.db";

#[derive(Parser)]
#[command(
    name = "idem",
    version,
    about = "Exactly-once side effects for retried agent tool calls",
    after_help = EXIT_CODES
)]
struct Cli {
    /// The store, for every command: sqlite://PATH, postgres://…, redis://…, rediss://…,
    /// redis+cluster://HOST:PORT?node=HOST:PORT. Accepted before or after the
    /// command. A text without a scheme is refused (write sqlite://idem.db for a file).
    /// Default: sqlite://idem.db (demo: a fresh SQLite file in a temp directory).
    #[arg(
        long,
        global = true,
        env = "IDEM_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    store: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the reference tool `POST /tools/create_ticket` behind the idempotency layer.
    ///
    /// Creates or upgrades its tables on start (the records and `tickets`).
    ///
    /// WHO IS ASKING: without --tokens the tenant (whose records a request reads and writes) is
    /// the X-Tenant-Id header AS SENT, UNAUTHENTICATED: anyone who reaches the server can act as
    /// any tenant and replay its answers. Run it that way only behind an authenticating proxy
    /// that sets X-Tenant-Id itself (and strips the client's), or on loopback. To run it
    /// exposed, give --tokens FILE: then every tool request needs `Authorization: Bearer TOKEN`
    /// (401 otherwise) and X-Tenant-Id is ignored.
    #[command(after_help = EXIT_CODES)]
    Serve {
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:8787")]
        addr: SocketAddr,
        /// How long the tool works before answering, in milliseconds.
        #[arg(long, default_value_t = 0)]
        tool_latency_ms: u64,
        /// Bearer tokens mapped to tenants: one `TOKEN TENANT` per line (`#` comments, blank
        /// lines ignored; a token is 16-512 characters of A-Z a-z 0-9 - . _ ~ + / =). With it a
        /// tool request needs `Authorization: Bearer TOKEN` (else 401) and X-Tenant-Id is
        /// ignored; without it X-Tenant-Id is trusted as sent and must come from an
        /// authenticating proxy.
        #[arg(long, value_name = "FILE")]
        tokens: Option<PathBuf>,
        /// Serve the idem metrics in the Prometheus text format at `GET http://ADDR/metrics`,
        /// on a listener of its own (so it can stay on an internal address while the tool is
        /// exposed; it has no authentication).
        #[arg(long, value_name = "ADDR")]
        metrics: Option<SocketAddr>,
    },
    /// Simulated agents retry a real tool under injected faults; effects counted at the sink.
    ///
    /// Starts the reference tool server on a loopback port (a fresh SQLite file in a temp
    /// directory unless --store or IDEM_STORE names a store) and sends every operation through
    /// the retrying client, with per-attempt deadlines shorter than the tool, duplicate
    /// concurrent sends, a repeat after success, and holders that crash mid-flight. Exits 6 if
    /// any operation produced two tickets.
    #[command(after_help = EXIT_CODES)]
    Demo {
        /// How many operations.
        #[arg(long, default_value_t = 200)]
        operations: usize,
        /// How many operations run at once.
        #[arg(long, default_value_t = 32)]
        concurrency: usize,
        /// How long the tool works, in milliseconds.
        #[arg(long, default_value_t = 60)]
        tool_latency_ms: u64,
        /// Also run the same traffic against the same tool without idem, side by side.
        #[arg(long)]
        without_idem: bool,
    },
    /// Create or upgrade the store's schema (the only command besides `serve` that changes
    /// it; needs a role allowed to). On Redis: load the scripts and check the settings.
    #[command(after_help = EXIT_CODES)]
    Migrate {
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Inspect and settle keys. `ls` and `show` only read; none of them changes the schema.
    #[command(after_help = EXIT_CODES)]
    Keys {
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Delete expired records in bounded batches until none are left.
    #[command(after_help = EXIT_CODES)]
    Purge {
        /// Records per batch.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Measure idem's first execution and replay against the bare engine operations on the same
    /// store and pool (insert-if-absent + update, and a read; on Redis also two trivial
    /// `EVALSHA`), interleaved: p50, p99 and mean, and their ratios. Creates a scratch table
    /// `idem_bench_raw` on SQL stores; prefilled records are deleted at the end (on Redis they
    /// expire within the hour).
    #[command(after_help = EXIT_CODES)]
    Bench {
        /// Operations of each kind in all, shared among the callers.
        #[arg(long, default_value_t = 1000)]
        operations: usize,
        /// Concurrent callers, each with keys of its own, on the same pool.
        #[arg(long, default_value_t = 1)]
        concurrency: usize,
        /// Live records to prefill before measuring; several (comma-separated, e.g.
        /// 10000,100000) are measured in ascending order in one run, filling incrementally.
        #[arg(long, value_delimiter = ',', default_value = "0")]
        records: Vec<u64>,
        /// Measure first executions for this long (e.g. 10s) instead of `--operations`, then
        /// replay as many.
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
        /// Print JSON.
        #[arg(long)]
        json: bool,
        /// Draw p50 and p99 against live records into this SVG file.
        #[arg(long, value_name = "FILE.svg")]
        plot: Option<PathBuf>,
        /// Earlier `--json` reports (other stores or concurrencies) to draw in the same plot.
        #[arg(long, value_name = "REPORT.json", requires = "plot")]
        plot_with: Vec<PathBuf>,
    },
    /// Run the public conformance suite against a live store (in scopes of its own) and print
    /// pass/fail per case as each finishes: does this PostgreSQL or Redis setup really give the
    /// guarantees? First prints a `warning:` line for each server setting that can lose an
    /// acknowledged claim (asynchronous replicas, synchronous_commit off, eviction, persistence
    /// off). Exits 6 if a case fails.
    #[command(after_help = EXIT_CODES)]
    Conformance {
        /// Print JSON Lines: {"type":"warning"|"case"|"summary", …}, one per line as it happens.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Subcommand)]
enum KeysCommand {
    /// List records, least recently written first; every filter is served by an index.
    Ls {
        /// Only records in this state: processing, completed or failed_retryable.
        #[arg(long, value_parser = parse_state)]
        state: Option<idem_core::RecordState>,
        /// Only records last written at least this long ago (e.g. 10m, 2h).
        #[arg(long, value_parser = humantime::parse_duration)]
        older_than: Option<Duration>,
        /// Only records of this scope.
        #[arg(long)]
        scope: Option<Scope>,
        /// At most this many records.
        #[arg(long, default_value_t = 100)]
        limit: usize,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one record, its outcome body pretty-printed.
    Show {
        /// The scope, e.g. `public/%2Ftools%2Fcreate_ticket`.
        scope: Scope,
        /// The key.
        key: IdempotencyKey,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Settle a stuck key by hand: complete it with the outcome in FILE
    /// (`{"status": 201, "body": {...}}`). Refuses a completed record, and a running lease
    /// unless --force. The holder is fenced: its late completion is refused.
    Resolve {
        /// The scope.
        scope: Scope,
        /// The key.
        key: IdempotencyKey,
        /// A JSON file `{"status": …, "body": …}`.
        #[arg(long)]
        outcome: PathBuf,
        /// Settle it although its holder's lease still runs: you know the holder is dead. The
        /// holder's token is fenced, so should it be alive after all, its completion is
        /// refused. The record's timestamps count from the end of the overridden lease.
        #[arg(long)]
        force: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
    /// Give a stuck key back so that the next retry runs the operation. Refuses a completed
    /// record, and a running lease unless --force. The holder is fenced.
    Release {
        /// The scope.
        scope: Scope,
        /// The key.
        key: IdempotencyKey,
        /// Release it although its holder's lease still runs: you know the holder is dead. The
        /// holder's token is fenced, so should it be alive after all, its completion is
        /// refused. The record's timestamps count from the end of the overridden lease.
        #[arg(long)]
        force: bool,
        /// Print JSON.
        #[arg(long)]
        json: bool,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo's table and the operator's answers are the point; per-call logs come with
    // RUST_LOG=info.
    let default_level = match cli.command {
        Command::Serve { .. } => "info",
        _ => "error",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        .init();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem: {e}");
            e.exit.into()
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let store = match (&cli.command, cli.store.as_deref()) {
        (Command::Demo { .. }, None) => None,
        (_, given) => Some(given.unwrap_or(DEFAULT_STORE).parse::<StoreUrl>()?),
    };
    let store_or_default = || store.clone().expect("every command but demo has a store");
    match cli.command {
        Command::Serve {
            addr,
            tool_latency_ms,
            tokens,
            metrics,
        } => serve(store_or_default(), addr, tool_latency_ms, tokens, metrics).await,
        Command::Demo {
            operations,
            concurrency,
            tool_latency_ms,
            without_idem,
        } => {
            let options = |store| DemoOptions {
                store,
                operations,
                concurrency,
                tool_latency: Duration::from_millis(tool_latency_ms),
                progress: true,
            };
            run_demo(store, options, without_idem).await
        }
        Command::Migrate { json } => {
            let store = store_or_default();
            let warnings = ops::migrate(&store).await?;
            if json {
                println!(
                    "{}",
                    json!({"store": store.to_string(), "migrated": true, "warnings": warnings})
                );
            } else {
                for w in &warnings {
                    println!("warning: {w}");
                }
                println!("migrated {store}: the schema is ready");
            }
            Ok(())
        }
        Command::Keys { command } => keys(store_or_default(), command).await,
        Command::Purge { batch, json } => {
            let store = store_or_default();
            let s = ops::open_store(&store).await?;
            let report = ops::purge(&*s, batch, !json).await?;
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
        Command::Conformance { json } => conformance(store_or_default(), json).await,
        Command::Bench {
            operations,
            concurrency,
            records,
            duration,
            json,
            plot,
            plot_with,
        } => {
            let store = store_or_default();
            let opts = bench::BenchOptions {
                operations,
                concurrency,
                records,
                duration,
            };
            let report = bench::bench(&store, &opts)
                .await
                .map_err(|e| e.context(format!("bench on {store}")))?;
            if json {
                println!("{}", report.to_json());
            } else {
                println!("idem bench on {store}");
                print!("{report}");
            }
            if let Some(plot) = plot {
                let mut reports = Vec::new();
                for path in &plot_with {
                    let text = std::fs::read_to_string(path)
                        .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
                    let value = serde_json::from_str(&text)
                        .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
                    reports.push(
                        bench::BenchReport::from_json(&value)
                            .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?,
                    );
                }
                reports.push(report);
                bench::plot(&plot, &reports).map_err(Failure::other)?;
            }
            Ok(())
        }
    }
}

async fn keys(store: StoreUrl, command: KeysCommand) -> Result<(), Failure> {
    let s = ops::open_store(&store).await?;
    let out = match command {
        KeysCommand::Ls {
            state,
            older_than,
            scope,
            limit,
            json,
        } => {
            let filter = idem_core::ListFilter {
                state,
                scope,
                updated_before: older_than.map(|d| idem_core::Timestamp::now() - d),
            };
            ops::ls(&*s, &filter, limit, json).await?
        }
        KeysCommand::Show { scope, key, json } => ops::show(&*s, &scope, &key, json).await?,
        KeysCommand::Resolve {
            scope,
            key,
            outcome,
            force,
            json,
        } => {
            let text = std::fs::read_to_string(&outcome)
                .map_err(|e| Failure::usage(format!("cannot read {}: {e}", outcome.display())))?;
            let value = serde_json::from_str(&text)
                .map_err(|e| Failure::usage(format!("{} is not JSON: {e}", outcome.display())))?;
            ops::resolve(&*s, &scope, &key, &value, force, json).await?
        }
        KeysCommand::Release {
            scope,
            key,
            force,
            json,
        } => ops::release(&*s, &scope, &key, force, json).await?,
    };
    println!("{}", out.trim_end());
    Ok(())
}

fn parse_state(s: &str) -> Result<idem_core::RecordState, String> {
    idem_core::RecordState::parse(s).ok_or_else(|| {
        format!("{s:?} is not a state: use processing, completed or failed_retryable")
    })
}

async fn conformance(store: StoreUrl, as_json: bool) -> Result<(), Failure> {
    // Fail early and clearly if the store cannot be opened at all (or has no schema).
    let opened = ops::open(&store).await?;
    // Settings the suite cannot see (it runs on one server) but that lose claims in production.
    for w in ops::durability_warnings(&opened).await? {
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
        ops::conformance(store, |case| {
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

async fn run_demo(
    store: Option<StoreUrl>,
    options: impl FnOnce(StoreUrl) -> DemoOptions,
    without_idem: bool,
) -> Result<(), Failure> {
    let _temp;
    let store = match store {
        Some(store) => store,
        None => {
            let dir = std::env::temp_dir().join(format!("idem-demo-{}", std::process::id()));
            std::fs::create_dir_all(&dir).map_err(Failure::other)?;
            _temp = RemoveOnDrop(dir.clone());
            format!("sqlite://{}", dir.join("demo.db").display()).parse()?
        }
    };
    let options = options(store);
    println!(
        "idem demo: {} operations, {} at a time, tool latency {} ms, store {}",
        options.operations,
        options.concurrency,
        options.tool_latency.as_millis(),
        options.store
    );
    println!(
        "faults: attempt deadlines shorter than the tool, duplicate concurrent sends, a repeat after success, holders that crash mid-flight"
    );
    let with = demo::run(&options, true).await.map_err(demo_failure)?;
    let without = if without_idem {
        eprintln!("the same traffic without idem:");
        Some(demo::run(&options, false).await.map_err(demo_failure)?)
    } else {
        None
    };
    println!();
    print!("{}", demo::table(&with, without.as_ref()));
    if with.double_effects > 0 {
        return Err(Failure::suite_failed(format!(
            "{} operations produced two tickets",
            with.double_effects
        )));
    }
    if let Some(w) = without {
        println!(
            "\nwithout idem the same traffic produced {} duplicate tickets over {} operations.",
            w.tickets - w.operations as i64,
            w.double_effects
        );
    }
    Ok(())
}

/// A store that cannot be opened keeps its exit code (usage or store unavailable).
fn demo_failure(e: idem_cli::serve::BoxError) -> Failure {
    match e.downcast::<idemkit::OpenError>() {
        Ok(e) => Failure::from(*e),
        Err(e) => Failure::other(e),
    }
}

/// Removes a directory when dropped.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

async fn serve(
    store: StoreUrl,
    addr: SocketAddr,
    latency_ms: u64,
    tokens: Option<PathBuf>,
    metrics: Option<SocketAddr>,
) -> Result<(), Failure> {
    // Before anything records a metric, so nothing is lost.
    if let Some(metrics) = metrics {
        let handle = idem_cli::serve::install_metrics()
            .map_err(|e| Failure::other(format!("cannot install the metrics exporter: {e}")))?;
        let listener = tokio::net::TcpListener::bind(metrics)
            .await
            .map_err(|e| Failure::other(format!("cannot listen on {metrics}: {e}")))?;
        let at = listener.local_addr().map_err(Failure::other)?;
        eprintln!("idem: serving metrics at GET http://{at}/metrics");
        let app = idem_cli::serve::metrics_router(handle);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the metrics listener failed");
            }
        });
    }
    let tokens = match tokens {
        Some(path) => {
            let tokens = idem_cli::tokens::Tokens::load(&path).map_err(Failure::usage)?;
            tracing::info!(
                tokens = tokens.len(),
                file = %path.display(),
                "bearer tokens loaded: tool requests need Authorization: Bearer; X-Tenant-Id is ignored"
            );
            Some(std::sync::Arc::new(tokens))
        }
        None => {
            tracing::warn!(
                "X-Tenant-Id is trusted AS SENT, unauthenticated: anyone who reaches this server can act as any tenant and replay its answers. Serve behind an authenticating proxy that sets the header, or give --tokens FILE"
            );
            None
        }
    };
    let backend =
        Backend::open(&store)
            .await
            .map_err(|e| match e.downcast::<idemkit::OpenError>() {
                Ok(e) => Failure::from(*e),
                Err(e) => Failure::store(format!("cannot set up the store {store}: {e}")),
            })?;
    let options = ServeOptions {
        tool_latency: Duration::from_millis(latency_ms),
        tokens,
        ..ServeOptions::default()
    };
    let app = router(backend, options);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::other(format!("cannot listen on {addr}: {e}")))?;
    let addr = listener.local_addr().map_err(Failure::other)?;
    eprintln!("idem: serving POST http://{addr}/tools/create_ticket and GET /tools on {store}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(Failure::other)?;
    Ok(())
}
