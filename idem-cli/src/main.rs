//! `idem`: the reference tool server, the demo, and operator commands on any store URL.
//!
//! A binary only: its modules are private, its promises are its commands (`idem --help`). The
//! tests that need its insides are unit tests (`src/tests/`); the others drive the binary.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use idemkit::StoreUrl;
use serde_json::json;

mod bench;
mod cli;
mod crash_between;
mod demo;
mod demo_report;
mod demo_stock;
mod demo_tasks;

/// `idem demo --tool-latency-ms`'s default (`--mcp-tasks` reads it as 12 s).
pub(crate) const DEMO_DEFAULT_LATENCY_MS: u64 = 60;
mod exit;
mod ops;
mod proxy;
mod serve;
mod steps;
mod tokens;

#[cfg(test)]
mod tests;

use cli::{Cli, Command, DEFAULT_STORE, KeysCommand};
use demo::DemoOptions;
use exit::Failure;
use serve::{Backend, McpOptions, McpTransport, ServeOptions, TicketServer, router};

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo's table and the operator's answers are the point; per-call logs come with
    // RUST_LOG=info.
    let default_level = match cli.command {
        // On stdio the client owns the process: only what goes wrong.
        Command::Serve { stdio: true, .. } => "warn,rmcp::service=error",
        Command::Proxy { ref command, .. } if !command.is_empty() => "warn,rmcp::service=error",
        Command::Serve { .. } | Command::Proxy { .. } => "info",
        _ => "error",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| default_level.into()),
        )
        .with_writer(std::io::stderr)
        // Colour only for a person at a terminal: never in a file or a pipe, never with NO_COLOR.
        .with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        )
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
            key_source,
            mcp,
            stdio,
            stateful,
            principal,
            no_derived_key_wait,
            allowed_host,
            task_secret_file,
        } => {
            if !mcp && serve::mcp_only(&key_source) {
                return Err(Failure::usage(
                    "--key-source model-argument and request are for the MCP tool: add --mcp",
                ));
            }
            let options = ServeOptions {
                tool_latency: Duration::from_millis(tool_latency_ms),
                key_source,
                ..ServeOptions::default()
            };
            let mcp = mcp.then_some(McpOptions {
                transport: match (stdio, stateful) {
                    (true, _) => McpTransport::Stdio,
                    (false, true) => McpTransport::Stateful,
                    (false, false) => McpTransport::Stateless,
                },
                principal,
                derived_key_wait: !no_derived_key_wait,
                allowed_hosts: allowed_host,
                task_secret: task_secret_file
                    .as_deref()
                    .map(serve::read_task_secret)
                    .transpose()?,
            });
            let listen = Listen {
                addr,
                tokens,
                metrics,
            };
            serve(store_or_default(), listen, options, mcp).await
        }
        Command::Proxy {
            upstream,
            mcp,
            principal,
            command,
            task_secret_file,
            addr,
            config,
            key_source,
            tokens,
            lease,
        } => {
            let options = proxy::ProxyOptions {
                upstream,
                mcp,
                principal,
                command,
                task_secret: task_secret_file
                    .as_deref()
                    .map(serve::read_task_secret)
                    .transpose()?,
                addr,
                config,
                key_source,
                tokens,
                lease,
            };
            proxy::run(store_or_default(), options).await
        }
        Command::Demo {
            operations,
            crash_between_effects: true,
            ..
        } => crash_between::run_cli(store, operations).await,
        Command::Demo {
            operations,
            tool_latency_ms,
            mcp_tasks: true,
            ..
        } => {
            // The tool outlives its clients' 5 s deadline: 12 s unless given.
            let latency = match tool_latency_ms {
                DEMO_DEFAULT_LATENCY_MS => 12_000,
                given => given,
            };
            let options = demo_tasks::TasksOptions::new(operations, Duration::from_millis(latency));
            demo_tasks::run_cli(store, options).await
        }
        Command::Demo {
            operations,
            concurrency,
            tool_latency_ms,
            without_idem,
            callers,
            crash_between_effects: false,
            mcp_tasks: false,
            no_wait,
        } => {
            let options = |store| DemoOptions {
                store,
                operations,
                concurrency,
                tool_latency: Duration::from_millis(tool_latency_ms),
                progress: true,
                wait: !no_wait,
            };
            match callers.as_str() {
                "stock" => demo_stock::run_cli(store, options).await,
                _ => demo::run_cli(store, options, without_idem).await,
            }
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
        Command::Purge { batch, duty, json } => {
            let store = store_or_default();
            let s = ops::open_store(&store).await?;
            let pace = idem_core::reconcile::PurgePace::new(batch)
                .duty(duty)
                .map_err(|e| Failure::usage(e.to_string()))?;
            let report = ops::purge(&*s, pace, !json).await?;
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
            purge,
            purge_batch,
            purge_duty,
            saturation,
            replay_cache,
            json,
            save,
            plot,
            plot_with,
            plot_only,
        } => {
            let values_with = || -> Result<Vec<serde_json::Value>, Failure> {
                plot_with
                    .iter()
                    .map(|path| {
                        let text = std::fs::read_to_string(path)
                            .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))?;
                        serde_json::from_str(&text)
                            .map_err(|e| Failure::usage(format!("{}: {e}", path.display())))
                    })
                    .collect()
            };
            let reports_with = || -> Result<Vec<bench::BenchReport>, Failure> {
                let values = values_with()?;
                let reports = values.iter().map(bench::BenchReport::from_json);
                reports.collect::<Result<_, _>>().map_err(Failure::usage)
            };
            let saturations_with = || -> Result<Vec<bench::SaturationReport>, Failure> {
                let values = values_with()?;
                let reports = values.iter().map(bench::SaturationReport::from_json);
                reports.collect::<Result<_, _>>().map_err(Failure::usage)
            };
            let store = store_or_default();
            // A report measured: to `--save`'s file, then printed as JSON or as text.
            let emit = |value: serde_json::Value, text: String| -> Result<(), Failure> {
                if let Some(path) = &save {
                    std::fs::write(path, format!("{value}\n"))
                        .map_err(|e| Failure::other(format!("{}: {e}", path.display())))?;
                }
                if json {
                    println!("{value}");
                } else {
                    print!("{text}");
                }
                Ok(())
            };
            // Reports of `--saturation` (they have levels, not points) draw its plot.
            let saturation_plot = !saturation.is_empty()
                || (plot_only
                    && !plot_with.is_empty()
                    && values_with()?.iter().all(|v| v["levels"].is_array()));
            if saturation_plot {
                let mut reports = saturations_with()?;
                if !plot_only {
                    let opts = bench::SaturationOptions {
                        callers: saturation,
                        operations,
                        replay_cache,
                    };
                    let report = bench::saturation(&store, &opts)
                        .await
                        .map_err(|e| e.context(format!("bench on {store}")))?;
                    emit(
                        report.to_json(),
                        format!("idem bench --saturation on {store}\n{report}"),
                    )?;
                    reports.push(report);
                }
                if let Some(plot) = &plot {
                    bench::plot_saturation(plot, &reports).map_err(Failure::other)?;
                }
                return Ok(());
            }
            if let (true, Some(plot)) = (plot_only, &plot) {
                return bench::plot(plot, &reports_with()?).map_err(Failure::other);
            }
            let opts = bench::BenchOptions {
                operations,
                concurrency,
                records,
                duration,
                purge,
                purge_batch,
                purge_duty,
                replay_cache,
            };
            let report = bench::bench(&store, &opts)
                .await
                .map_err(|e| e.context(format!("bench on {store}")))?;
            emit(report.to_json(), format!("idem bench on {store}\n{report}"))?;
            if let Some(plot) = plot {
                let mut reports = reports_with()?;
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
            let filter = idem_core::store::ListFilter {
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
            ops::resolve(&*s, &scope, &key, &value, ops::ManualFlags { force, json }).await?
        }
        KeysCommand::Release {
            scope,
            key,
            force,
            json,
        } => ops::release(&*s, &scope, &key, ops::ManualFlags { force, json }).await?,
    };
    println!("{}", out.trim_end());
    Ok(())
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

/// Where and to whom `idem serve` answers.
struct Listen {
    addr: SocketAddr,
    tokens: Option<PathBuf>,
    metrics: Option<SocketAddr>,
}

async fn serve(
    store: StoreUrl,
    listen: Listen,
    options: ServeOptions,
    mcp: Option<McpOptions>,
) -> Result<(), Failure> {
    // Before anything records a metric, so nothing is lost.
    if let Some(metrics) = listen.metrics {
        let handle = serve::install_metrics()
            .map_err(|e| Failure::other(format!("cannot install the metrics exporter: {e}")))?;
        let listener = tokio::net::TcpListener::bind(metrics)
            .await
            .map_err(|e| Failure::other(format!("cannot listen on {metrics}: {e}")))?;
        let at = listener.local_addr().map_err(Failure::other)?;
        eprintln!("idem: serving metrics at GET http://{at}/metrics");
        let app = serve::metrics_router(handle);
        tokio::spawn(async move {
            if let Err(e) = axum::serve(listener, app).await {
                tracing::error!(error = %e, "the metrics listener failed");
            }
        });
    }
    let stdio = mcp
        .as_ref()
        .is_some_and(|m| m.transport == McpTransport::Stdio);
    let tokens = match listen.tokens {
        Some(path) => {
            let tokens = tokens::Tokens::load(&path).map_err(Failure::usage)?;
            tracing::info!(
                tokens = tokens.len(),
                file = %path.display(),
                "bearer tokens loaded: tool requests need Authorization: Bearer; X-Tenant-Id is ignored"
            );
            Some(std::sync::Arc::new(tokens))
        }
        None if stdio => None,
        None => {
            tracing::warn!(
                "X-Tenant-Id is trusted AS SENT, unauthenticated: anyone who reaches this server can act as any tenant and replay its answers. Serve behind an authenticating proxy that sets the header, or give --tokens FILE"
            );
            None
        }
    };
    if let Some(principal) = mcp.as_ref().and_then(|m| m.principal.as_ref())
        && !stdio
    {
        tracing::warn!(
            %principal,
            "MCP callers without X-Tenant-Id share one idempotency scope (--principal)"
        );
    }
    let backend =
        Backend::open(&store)
            .await
            .map_err(|e| match e.downcast::<idemkit::OpenError>() {
                Ok(e) => Failure::from(*e),
                Err(e) => Failure::store(format!("cannot set up the store {store}: {e}")),
            })?;
    let options = ServeOptions { tokens, ..options };
    let Some(mcp) = mcp else {
        let app = router(backend, options);
        let listener = bind(listen.addr).await?;
        let addr = listener.local_addr().map_err(Failure::other)?;
        eprintln!("idem: serving POST http://{addr}/tools/create_ticket and GET /tools on {store}");
        return run_http(listener, app).await;
    };
    let server = TicketServer::new(backend, options, &mcp).map_err(Failure::usage)?;
    if mcp.transport == McpTransport::Stdio {
        eprintln!("idem: serving the MCP tool create_ticket on stdio on {store}");
        return serve::serve_stdio(server).await.map_err(Failure::other);
    }
    let listener = bind(listen.addr).await?;
    let addr = listener.local_addr().map_err(Failure::other)?;
    let app = serve::mcp_router(server, &mcp, addr);
    let sessions = match mcp.transport {
        McpTransport::Stateful => "with sessions",
        _ => "stateless",
    };
    eprintln!(
        "idem: serving the MCP tool create_ticket (streamable HTTP, {sessions}) at http://{addr}/mcp on {store}"
    );
    // The first line on stdout: scripts and tests read the address from it.
    println!("listening on http://{addr}/mcp");
    run_http(listener, app).await
}

async fn bind(addr: SocketAddr) -> Result<tokio::net::TcpListener, Failure> {
    tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::other(format!("cannot listen on {addr}: {e}")))
}

/// Serves `app` until Ctrl-C.
async fn run_http(listener: tokio::net::TcpListener, app: axum::Router) -> Result<(), Failure> {
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await
        .map_err(Failure::other)
}
