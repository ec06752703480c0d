//! `idem`: the reference tool server (and, as issues land, the demo and operator commands).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idem_cli::serve::{Backend, ServeOptions, router};
use idem_cli::store_url::StoreUrl;

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
    Serve {
        /// Where records and tickets live: sqlite://PATH (default), postgres://…
        #[arg(long, env = "IDEM_STORE", default_value = "sqlite://idem.db")]
        store: StoreUrl,
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:8787")]
        addr: SocketAddr,
        /// How long the tool works before answering, in milliseconds.
        #[arg(long, default_value_t = 0)]
        tool_latency_ms: u64,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve {
            store,
            addr,
            tool_latency_ms,
        } => serve(store, addr, tool_latency_ms).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(
    store: StoreUrl,
    addr: SocketAddr,
    latency_ms: u64,
) -> Result<(), idem_cli::serve::BoxError> {
    let backend = Backend::open(&store)
        .await
        .map_err(|e| format!("cannot open the store {store}: {e}"))?;
    let options = ServeOptions {
        tool_latency: Duration::from_millis(latency_ms),
        ..ServeOptions::default()
    };
    let app = router(backend, options);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;
    eprintln!("idem: serving POST http://{addr}/tools/create_ticket and GET /tools on {store}");
    axum::serve(listener, app)
        .with_graceful_shutdown(async {
            let _ = tokio::signal::ctrl_c().await;
        })
        .await?;
    Ok(())
}
