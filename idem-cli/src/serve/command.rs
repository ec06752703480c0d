//! `idem serve`: the command, from its arguments to a server that runs until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use idemkit::StoreUrl;

use super::{Backend, McpOptions, McpTransport, ServeOptions, TicketServer, router};
use crate::cli::ServeArgs;
use crate::exit::Failure;
use crate::tokens;

/// `idem serve` on `store`.
pub(crate) async fn run(store: StoreUrl, args: ServeArgs) -> Result<(), Failure> {
    let ServeArgs {
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
    } = args;
    if !mcp && super::mcp_only(&key_source) {
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
            .map(super::read_task_secret)
            .transpose()?,
    });
    let listen = Listen {
        addr,
        tokens,
        metrics,
    };
    serve(store, listen, options, mcp).await
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
        let handle = super::install_metrics()
            .map_err(|e| Failure::other(format!("cannot install the metrics exporter: {e}")))?;
        let listener = tokio::net::TcpListener::bind(metrics)
            .await
            .map_err(|e| Failure::other(format!("cannot listen on {metrics}: {e}")))?;
        let at = listener.local_addr().map_err(Failure::other)?;
        eprintln!("idem: serving metrics at GET http://{at}/metrics");
        let app = super::metrics_router(handle);
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
        let app = router(backend, options).map_err(Failure::usage)?;
        let listener = bind(listen.addr).await?;
        let addr = listener.local_addr().map_err(Failure::other)?;
        eprintln!("idem: serving POST http://{addr}/tools/create_ticket and GET /tools on {store}");
        return run_http(listener, app).await;
    };
    let server = TicketServer::new(backend, options, &mcp).map_err(Failure::usage)?;
    if mcp.transport == McpTransport::Stdio {
        eprintln!("idem: serving the MCP tool create_ticket on stdio on {store}");
        return super::serve_stdio(server).await.map_err(Failure::other);
    }
    let listener = bind(listen.addr).await?;
    let addr = listener.local_addr().map_err(Failure::other)?;
    let app = super::mcp_router(server, &mcp, addr);
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
