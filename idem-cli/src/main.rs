//! `idem`: the reference tool server, the demo, and operator commands on any store URL.
//!
//! A binary only: its modules are private, its promises are its commands (`idem --help`). One
//! module per command; this file parses the command line and dispatches. The tests that need its
//! insides are unit tests (`src/tests/`); the others drive the binary.

use std::process::ExitCode;

use clap::Parser;
use idemkit::StoreUrl;

mod bench;
mod cli;
mod conformance;
mod demo;
mod exit;
mod keys;
mod migrate;
mod proxy;
mod purge;
mod serve;
mod store;
mod tokens;

#[cfg(test)]
mod tests;

use cli::{Cli, Command, DEFAULT_STORE};
use exit::Failure;

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // The demo's table and the operator's answers are the point; per-call logs come with
    // RUST_LOG=info.
    let default_level = match &cli.command {
        // On stdio the client owns the process: only what goes wrong.
        Command::Serve(args) if args.stdio => "warn,rmcp::service=error",
        Command::Proxy { command, .. } if !command.is_empty() => "warn,rmcp::service=error",
        Command::Serve(_) | Command::Proxy { .. } => "info",
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
    // The demo alone has a store of its own when none is named.
    let named = cli.store.as_deref();
    let store = || -> Result<StoreUrl, Failure> { Ok(named.unwrap_or(DEFAULT_STORE).parse()?) };
    match cli.command {
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
            proxy::run(store()?, options).await
        }
        Command::Serve(args) => serve::command::run(store()?, args).await,
        Command::Demo(args) => {
            let store = named.map(|_| store()).transpose()?;
            demo::run(store, args).await
        }
        Command::Migrate { json } => migrate::run(store()?, json).await,
        Command::Keys { command } => keys::run(store()?, command).await,
        Command::Purge(args) => purge::run(store()?, args).await,
        Command::Conformance { json } => conformance::run(store()?, json).await,
        Command::Bench(args) => bench::command::run(store()?, args).await,
    }
}
