//! `idem`: the reference tool server, the demo, and operator commands on any store URL.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idem_cli::demo::{self, DemoOptions};
use idem_cli::ops;
use idem_cli::serve::{Backend, BoxError, ServeOptions, router};
use idem_cli::store_url::StoreUrl;
use idem_core::{IdempotencyKey, Scope};

#[derive(Parser)]
#[command(
    name = "idem",
    version,
    about = "Exactly-once side effects for retried agent tool calls"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the reference tool `POST /tools/create_ticket` behind the idempotency layer.
    ///
    /// WHO IS ASKING: without --tokens the tenant (whose records a request reads and writes) is
    /// the X-Tenant-Id header AS SENT, UNAUTHENTICATED: anyone who reaches the server can act as
    /// any tenant and replay its answers. Run it that way only behind an authenticating proxy
    /// that sets X-Tenant-Id itself (and strips the client's), or on loopback. To run it
    /// exposed, give --tokens FILE: then every tool request needs `Authorization: Bearer TOKEN`
    /// (401 otherwise) and X-Tenant-Id is ignored.
    Serve {
        /// Where records and tickets live: sqlite://PATH (default), postgres://…, redis://…
        #[arg(long, env = "IDEM_STORE", default_value = "sqlite://idem.db")]
        store: StoreUrl,
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
    },
    /// Simulated agents retry a real tool under injected faults; effects counted at the sink.
    ///
    /// Starts the reference tool server on a loopback port (an embedded SQLite file by default)
    /// and sends every operation through the retrying client, with per-attempt deadlines shorter
    /// than the tool, duplicate concurrent sends, a repeat after success, and holders that crash
    /// mid-flight. Exits non-zero if any operation produced two tickets.
    Demo {
        /// Where records and tickets live (default: a fresh SQLite file in a temp directory).
        #[arg(long)]
        store: Option<StoreUrl>,
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
    /// Inspect and settle keys.
    Keys {
        /// The store: sqlite://PATH, postgres://…, redis://…
        #[arg(long, env = "IDEM_STORE", default_value = "sqlite://idem.db")]
        store: StoreUrl,
        #[command(subcommand)]
        command: KeysCommand,
    },
    /// Delete expired records in bounded batches until none are left.
    Purge {
        /// The store: sqlite://PATH, postgres://…, redis://…
        #[arg(long, env = "IDEM_STORE", default_value = "sqlite://idem.db")]
        store: StoreUrl,
        /// Records per batch.
        #[arg(long, default_value_t = 1000)]
        batch: usize,
    },
    /// Measure idem's first execution and replay against the bare engine operations on the same
    /// store (insert-if-absent + update, and a read), as ratios.
    Bench {
        /// The store: sqlite://PATH, postgres://…, redis://…
        #[arg(long)]
        store: StoreUrl,
        /// Operations of each kind.
        #[arg(long, default_value_t = 1000)]
        operations: usize,
    },
    /// Run the public conformance suite against a live store (in scopes of its own) and print
    /// pass/fail per case: does this PostgreSQL or Redis setup really give the guarantees?
    /// First prints a `warning:` line for each server setting that can lose an acknowledged
    /// claim (asynchronous replicas, synchronous_commit off, eviction, persistence off).
    Conformance {
        /// The store: sqlite://PATH, postgres://…, redis://…
        #[arg(long)]
        store: StoreUrl,
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
    /// (`{"status": 201, "body": {...}}`). Refuses a completed record and a running lease.
    Resolve {
        /// The scope.
        scope: Scope,
        /// The key.
        key: IdempotencyKey,
        /// A JSON file `{"status": …, "body": …}`.
        #[arg(long)]
        outcome: PathBuf,
    },
    /// Give a stuck key back so that the next retry runs the operation. Refuses a completed
    /// record and a running lease.
    Release {
        /// The scope.
        scope: Scope,
        /// The key.
        key: IdempotencyKey,
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
    let result = match cli.command {
        Command::Serve {
            store,
            addr,
            tool_latency_ms,
            tokens,
        } => serve(store, addr, tool_latency_ms, tokens).await,
        Command::Demo {
            store,
            operations,
            concurrency,
            tool_latency_ms,
            without_idem,
        } => {
            let options = DemoOptions {
                store: store.unwrap_or_else(|| StoreUrl::Sqlite(PathBuf::new())),
                operations,
                concurrency,
                tool_latency: Duration::from_millis(tool_latency_ms),
                progress: true,
            };
            run_demo(options, without_idem).await
        }
        Command::Keys { store, command } => keys(store, command).await,
        Command::Purge { store, batch } => match ops::open_store(&store).await {
            Ok(s) => ops::purge(&*s, batch, true).await.map(|m| println!("{m}")),
            Err(e) => Err(format!("cannot open the store {store}: {e}").into()),
        },
        Command::Conformance { store } => conformance(store).await,
        Command::Bench { store, operations } => match ops::bench(&store, operations).await {
            Ok(report) => {
                println!("idem bench on {store}");
                print!("{report}");
                Ok(())
            }
            Err(e) => Err(format!("bench on {store}: {e}").into()),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn keys(store: StoreUrl, command: KeysCommand) -> Result<(), BoxError> {
    let s = ops::open_store(&store)
        .await
        .map_err(|e| format!("cannot open the store {store}: {e}"))?;
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
        } => {
            let text = std::fs::read_to_string(&outcome)
                .map_err(|e| format!("cannot read {}: {e}", outcome.display()))?;
            let value = serde_json::from_str(&text)
                .map_err(|e| format!("{} is not JSON: {e}", outcome.display()))?;
            ops::resolve(&*s, &scope, &key, &value).await?
        }
        KeysCommand::Release { scope, key } => ops::release(&*s, &scope, &key).await?,
    };
    println!("{}", out.trim_end());
    Ok(())
}

fn parse_state(s: &str) -> Result<idem_core::RecordState, String> {
    idem_core::RecordState::parse(s).ok_or_else(|| {
        format!("{s:?} is not a state: use processing, completed or failed_retryable")
    })
}

async fn conformance(store: StoreUrl) -> Result<(), BoxError> {
    // Fail early and clearly if the store cannot be opened at all.
    ops::open_store(&store)
        .await
        .map_err(|e| format!("cannot open the store {store}: {e}"))?;
    // Settings the suite cannot see (it runs on one server) but that lose claims in production.
    let warnings = ops::durability_warnings(&store)
        .await
        .map_err(|e| format!("cannot read the settings of {store}: {e}"))?;
    for w in &warnings {
        println!("warning: {w}");
    }
    // The suite runs each case on a runtime of its own: off this one.
    let report = tokio::task::spawn_blocking(move || ops::conformance(store)).await?;
    println!("{report}");
    if report.failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} conformance cases failed", report.failed.len()).into())
    }
}

async fn run_demo(mut options: DemoOptions, without_idem: bool) -> Result<(), BoxError> {
    let _temp;
    if options.store == StoreUrl::Sqlite(PathBuf::new()) {
        let dir = std::env::temp_dir().join(format!("idem-demo-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        _temp = RemoveOnDrop(dir.clone());
        options.store = StoreUrl::Sqlite(dir.join("demo.db"));
    }
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
    let with = demo::run(&options, true).await?;
    let without = if without_idem {
        eprintln!("the same traffic without idem:");
        Some(demo::run(&options, false).await?)
    } else {
        None
    };
    println!();
    print!("{}", demo::table(&with, without.as_ref()));
    if with.double_effects > 0 {
        return Err(format!("{} operations produced two tickets", with.double_effects).into());
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
) -> Result<(), BoxError> {
    let tokens = match tokens {
        Some(path) => {
            let tokens = idem_cli::tokens::Tokens::load(&path)?;
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
    let backend = Backend::open(&store)
        .await
        .map_err(|e| format!("cannot open the store {store}: {e}"))?;
    let options = ServeOptions {
        tool_latency: Duration::from_millis(latency_ms),
        tokens,
        ..ServeOptions::default()
    };
    let app = router(backend, options);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    let addr = listener.local_addr()?;
    eprintln!("idem: serving POST http://{addr}/tools/create_ticket and GET /tools on {store}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
