//! `idem`: the reference tool server (and, as issues land, the demo and operator commands).

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};
use idem_cli::demo::{self, DemoOptions};
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
        Command::Demo {
            store,
            operations,
            concurrency,
            tool_latency_ms,
            without_idem,
        } => {
            demo(
                store,
                operations,
                concurrency,
                tool_latency_ms,
                without_idem,
            )
            .await
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("idem: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn demo(
    store: Option<StoreUrl>,
    operations: usize,
    concurrency: usize,
    latency_ms: u64,
    without_idem: bool,
) -> Result<(), idem_cli::serve::BoxError> {
    let _temp;
    let store = match store {
        Some(store) => store,
        None => {
            let dir = std::env::temp_dir().join(format!("idem-demo-{}", std::process::id()));
            std::fs::create_dir_all(&dir)?;
            _temp = RemoveOnDrop(dir.clone());
            StoreUrl::Sqlite(dir.join("demo.db"))
        }
    };
    let mut options = DemoOptions {
        store,
        operations,
        concurrency,
        tool_latency: Duration::from_millis(latency_ms),
        progress: true,
    };
    println!(
        "idem demo: {operations} operations, {concurrency} at a time, tool latency {latency_ms} ms, store {}",
        options.store
    );
    println!(
        "faults: attempt deadlines shorter than the tool, duplicate concurrent sends, a repeat after success, holders that crash mid-flight"
    );
    let with = demo::run(&options, true).await?;
    let without = if without_idem {
        println!("the same traffic without idem:");
        options.progress = true;
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
struct RemoveOnDrop(std::path::PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
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
