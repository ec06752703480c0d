//! The command line: what `idem` accepts, as clap types. `main.rs` dispatches it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::exit::EXIT_CODES;
use clap::{Args, Parser, Subcommand};
use idem_core::{IdempotencyKey, Scope};

/// The store when neither `--store` nor `IDEM_STORE` names one.
pub(crate) const DEFAULT_STORE: &str = "sqlite://idem.db";

/// `idem demo --tool-latency-ms`'s default (`--mcp-tasks` reads it as 12 s).
pub(crate) const DEMO_DEFAULT_LATENCY_MS: u64 = 60;

#[derive(Parser)]
#[command(
    name = "idem",
    version,
    about = "Exactly-once side effects for retried agent tool calls",
    after_help = EXIT_CODES
)]
pub(crate) struct Cli {
    /// The store, for every command: sqlite://PATH, postgres://…, redis://…, rediss://…,
    /// redis+cluster://HOST:PORT?node=HOST:PORT, dynamodb://TABLE?region=…&endpoint=…. Accepted
    /// before or after the command. A text without a scheme is refused (write sqlite://idem.db
    /// for a file).
    /// Default: sqlite://idem.db (demo: a fresh SQLite file in a temp directory).
    #[arg(
        long,
        global = true,
        env = "IDEM_STORE",
        hide_env_values = true,
        value_name = "URL"
    )]
    pub(crate) store: Option<String>,
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Serve the reference tool `POST /tools/create_ticket` behind the idempotency layer, or
    /// with --mcp as the MCP tool `create_ticket` (streamable HTTP at `http://ADDR/mcp`, or
    /// stdio).
    ///
    /// Creates or upgrades its tables on start (the records and `tickets`). Any number of
    /// servers, HTTP or MCP, can share one store: a retry may reach any of them.
    ///
    /// WHO IS ASKING: without --tokens the tenant (whose records a request reads and writes) is
    /// the X-Tenant-Id header AS SENT, UNAUTHENTICATED: anyone who reaches the server can act as
    /// any tenant and replay its answers. Run it that way only behind an authenticating proxy
    /// that sets X-Tenant-Id itself (and strips the client's), or on loopback. To run it
    /// exposed, give --tokens FILE: then every tool request needs `Authorization: Bearer TOKEN`
    /// (401 otherwise) and X-Tenant-Id is ignored. Over MCP a call without X-Tenant-Id is
    /// refused (-32093) unless --principal names a scope such callers share; over MCP stdio
    /// (one client per process) every call is --principal's, default `stdio`.
    #[command(after_help = EXIT_CODES)]
    Serve(ServeArgs),
    /// Stand in front of an HTTP tool server that knows nothing of idem and give its calls
    /// idem's contract, records in the store.
    ///
    /// Requests to protected routes (by default every POST, PUT, PATCH and DELETE; routes in
    /// --config) are claimed before they are forwarded, and every repeat gets the upstream's
    /// first answer verbatim (status, headers less hop-by-hop ones, body) with
    /// `Idempotency-Replayed: true`; GET, HEAD and OPTIONS pass through untouched. The upstream
    /// receives a downstream key (the same on every attempt of one operation, distinct per
    /// tenant) in `Idempotency-Key`. A request sent that got no answer may have taken effect: a
    /// retry gets 409 during the lease, then `urn:idem:problem:in-doubt` until an operator
    /// settles the key (`idem keys resolve` / `release`). Tenancy as `idem serve` (--tokens,
    /// X-Tenant-Id). The first line on stdout is `listening on http://ADDR`.
    #[command(after_help = EXIT_CODES)]
    Proxy {
        /// The tool server: http://HOST:PORT (with --mcp: its streamable HTTP endpoint,
        /// http://HOST:PORT/mcp).
        #[arg(long, value_name = "URL", required_unless_present = "command")]
        upstream: Option<String>,
        /// In front of an MCP server instead: its tools/call of every tool it does not mark
        /// readOnlyHint is protected, everything else passes through. Serves streamable HTTP at
        /// http://ADDR/mcp (stateless) for --upstream, or MCP over stdin and stdout for a child
        /// given after `--`.
        #[arg(long)]
        mcp: bool,
        /// With --mcp: callers without X-Tenant-Id share the scope NAME instead of being
        /// refused; over stdio, the scope of every call (default `stdio`).
        #[arg(long, requires = "mcp", value_name = "NAME")]
        principal: Option<String>,
        /// With --mcp: the MCP server to run as a child and speak to over its stdin and stdout
        /// (`idem proxy --mcp -- python server.py`).
        #[arg(
            last = true,
            requires = "mcp",
            conflicts_with = "upstream",
            value_name = "CMD"
        )]
        command: Vec<String>,
        /// With --mcp: answer a client that declared MCP's tasks extension with a task for a
        /// protected tool (created once, served from the store by any proxy; the upstream is
        /// called synchronously meanwhile), its id sealed with the secret in FILE: 64
        /// hexadecimal digits, the same for every proxy on the store.
        #[arg(long, requires = "mcp", value_name = "FILE")]
        task_secret_file: Option<PathBuf>,
        /// The address to listen on.
        #[arg(long, default_value = "127.0.0.1:8788")]
        addr: SocketAddr,
        /// Routes, the methods they protect and their settings, in TOML (see the README).
        #[arg(long, value_name = "FILE")]
        config: Option<PathBuf>,
        /// What a protected request without an Idempotency-Key gets: `refuse` (400), `arguments`
        /// (a key derived from its body: the same request within an hour is one operation) or
        /// `unprotected` (forwarded every time). The config file may set it per route.
        #[arg(long, value_name = "SOURCE", default_value = "refuse", value_parser = parse_proxy_key_source)]
        key_source: crate::proxy::KeySourceName,
        /// Bearer tokens mapped to tenants, as `idem serve --tokens`: a protected request then
        /// needs `Authorization: Bearer TOKEN` (401 otherwise; the header is not passed on) and
        /// X-Tenant-Id is ignored.
        #[arg(long, value_name = "FILE")]
        tokens: Option<PathBuf>,
        /// How long a claim is presumed alive without news from its proxy (e.g. 30s): after
        /// it, a retry of a request that got no answer is in doubt. Renewed while the upstream
        /// works. The config file may set it per route.
        #[arg(long, value_parser = humantime::parse_duration)]
        lease: Option<Duration>,
    },
    /// Simulated agents retry a real tool under injected faults; effects counted at the sink.
    ///
    /// Starts the reference tool server on a loopback port (a fresh SQLite file in a temp
    /// directory unless --store or IDEM_STORE names a store) and sends every operation through
    /// the retrying client, with per-attempt deadlines shorter than the tool, duplicate
    /// concurrent sends, a repeat after success, and holders that crash mid-flight. Exits 6 if
    /// any operation produced two tickets.
    #[command(after_help = EXIT_CODES)]
    Demo(DemoArgs),
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
    Purge(PurgeArgs),
    /// Measure idem's first execution and replay against the bare engine operations on the same
    /// store and pool (insert-if-absent + update, and a read; on Redis also two trivial
    /// `EVALSHA`), interleaved: p50, p99 and mean, and their ratios. Creates a scratch table
    /// `idem_bench_raw` on SQL stores; prefilled records are deleted at the end (on Redis they
    /// expire within the hour).
    #[command(after_help = EXIT_CODES)]
    Bench(BenchArgs),
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

// `idem serve`'s arguments (the variant's doc comment is its help).
#[derive(Args)]
pub(crate) struct ServeArgs {
    /// The address to listen on.
    #[arg(long, default_value = "127.0.0.1:8787")]
    pub(crate) addr: SocketAddr,
    /// How long the tool works before answering, in milliseconds.
    #[arg(long, default_value_t = 0)]
    pub(crate) tool_latency_ms: u64,
    /// Bearer tokens mapped to tenants: one `TOKEN TENANT` per line (`#` comments, blank
    /// lines ignored; a token is 16-512 characters of A-Z a-z 0-9 - . _ ~ + / =). With it a
    /// tool request needs `Authorization: Bearer TOKEN` (else 401) and X-Tenant-Id is
    /// ignored; without it X-Tenant-Id is trusted as sent and must come from an
    /// authenticating proxy.
    #[arg(long, value_name = "FILE")]
    pub(crate) tokens: Option<PathBuf>,
    /// Serve the idem metrics in the Prometheus text format at `GET http://ADDR/metrics`,
    /// on a listener of its own (so it can stay on an internal address while the tool is
    /// exposed; it has no authentication).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<SocketAddr>,
    /// What a request without an Idempotency-Key gets: `client` (refused, 400 or -32602:
    /// the client must send a key), `arguments` (a key derived from title and account_id:
    /// the same ticket within an hour is one ticket) or `unprotected` (runs every time);
    /// with --mcp also `model-argument` (the tool asks the model for an `idempotency_key`
    /// argument) or `request` (the session and JSON-RPC request id: transport resends
    /// only; needs --stateful or --stdio, a stateless call is refused).
    #[arg(long, value_name = "SOURCE", default_value = "client", value_parser = crate::serve::parse_key_source)]
    pub(crate) key_source: idem_core::KeySource,
    /// Serve the tool over MCP instead of HTTP: streamable HTTP at `http://ADDR/mcp`,
    /// stateless (MCP 2026-07-28: no sessions, so any server on the store answers any
    /// request). The first line on stdout is `listening on http://ADDR/mcp`.
    #[arg(long)]
    pub(crate) mcp: bool,
    /// With --mcp: MCP over stdin and stdout instead, one client per process.
    #[arg(long, requires = "mcp", conflicts_with_all = ["addr", "tokens", "stateful"])]
    pub(crate) stdio: bool,
    /// With --mcp: streamable HTTP with sessions (`Mcp-Session-Id`, the protocol revisions
    /// before 2026-07-28); a session lives in the server that opened it.
    #[arg(long, requires = "mcp")]
    pub(crate) stateful: bool,
    /// With --mcp: callers that name no tenant (no X-Tenant-Id) share the scope NAME
    /// instead of being refused: they replay each other's answers. Over stdio, the scope
    /// of every call (default `stdio`).
    #[arg(long, requires = "mcp", conflicts_with = "tokens", value_name = "NAME")]
    pub(crate) principal: Option<String>,
    /// With --mcp: a call under a derived key that finds the same call in flight is told
    /// to retry (-32091) instead of waiting for its result.
    #[arg(long, requires = "mcp")]
    pub(crate) no_derived_key_wait: bool,
    /// With --mcp over HTTP: a `Host` to accept (a name, or name:port) besides localhost,
    /// 127.0.0.1, ::1 and the address listened on; rmcp refuses any other (DNS rebinding).
    /// Repeat for more.
    #[arg(long, requires = "mcp", conflicts_with = "stdio", value_name = "HOST")]
    pub(crate) allowed_host: Vec<String>,
    /// With --mcp: answer a client that declared MCP's tasks extension with a task (the
    /// tool runs on; the client polls `tasks/get`), its id sealed with the secret in FILE:
    /// 64 hexadecimal digits (32 bytes), the same for every server on the store.
    #[arg(long, requires = "mcp", value_name = "FILE")]
    pub(crate) task_secret_file: Option<PathBuf>,
}

// `idem demo`'s arguments.
#[derive(Args)]
pub(crate) struct DemoArgs {
    /// How many operations.
    #[arg(long, default_value_t = 200)]
    pub(crate) operations: usize,
    /// How many operations run at once.
    #[arg(long, default_value_t = 32)]
    pub(crate) concurrency: usize,
    /// How long the tool works, in milliseconds.
    #[arg(long, default_value_t = DEMO_DEFAULT_LATENCY_MS)]
    pub(crate) tool_latency_ms: u64,
    /// Also run the same traffic against the same tool without idem, side by side.
    #[arg(long)]
    pub(crate) without_idem: bool,
    /// Who calls: `orchestrated` agents that send a key made from their workflow step, or
    /// `stock` callers that send none (the tool derives the key from the arguments; side by
    /// side with the key refused and with the tool unprotected).
    #[arg(long, default_value = "orchestrated", value_parser = ["orchestrated", "stock"])]
    pub(crate) callers: String,
    /// Instead: a checkout with two effects (payment, email) whose holder crashes between
    /// them, retried by a takeover; without checkpoints and with them, side by side.
    #[arg(long)]
    pub(crate) crash_between_effects: bool,
    /// Instead: a tool that works longer than its clients wait (--tool-latency-ms, 12 s
    /// by default here), served as MCP tasks by two replicas behind no sticky routing, the
    /// first killed halfway; clients that lose answers and call again, polls spread over
    /// both; with idem and, side by side, with rmcp's in-memory TaskManager alone.
    #[arg(long)]
    pub(crate) mcp_tasks: bool,
    /// Retries do not ask to wait for an in-flight answer (`Prefer: wait`): they get 409 and
    /// retry after `Retry-After`.
    #[arg(long)]
    pub(crate) no_wait: bool,
}

// `idem purge`'s arguments.
#[derive(Args)]
pub(crate) struct PurgeArgs {
    /// Records per batch.
    #[arg(long, default_value_t = PURGE_BATCH)]
    pub(crate) batch: usize,
    /// The share of the time the purge may spend deleting (0 to 1): after each batch it
    /// rests in proportion, leaving the store to the claims that run meanwhile. 1 runs flat
    /// out.
    #[arg(long, default_value_t = PURGE_DUTY, value_parser = parse_duty)]
    pub(crate) duty: f64,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
}

// `idem bench`'s arguments.
#[derive(Args)]
pub(crate) struct BenchArgs {
    /// Operations of each kind in all, shared among the callers.
    #[arg(long, default_value_t = 1000)]
    pub(crate) operations: usize,
    /// Concurrent callers, each with keys of its own, on the same pool.
    #[arg(long, default_value_t = 1)]
    pub(crate) concurrency: usize,
    /// Live records to prefill before measuring; several (comma-separated, e.g.
    /// 10000,100000) are measured in ascending order in one run, filling incrementally.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub(crate) records: Vec<u64>,
    /// Measure first executions for this long (e.g. 10s) instead of `--operations`, then
    /// replay as many.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub(crate) duration: Option<Duration>,
    /// Then fill this many expired records and measure claims while the purge alternates
    /// half-second windows of deleting them and of resting: the claims of the idle windows
    /// against those of the purge windows.
    #[arg(long, value_name = "N")]
    pub(crate) purge: Option<u64>,
    /// Records per `purge_expired` call with `--purge`.
    #[arg(long, default_value_t = PURGE_BATCH, requires = "purge")]
    pub(crate) purge_batch: usize,
    /// The purge's duty cycle with `--purge` (0 to 1; 1 runs flat out), as `idem purge
    /// --duty`.
    #[arg(long, default_value_t = PURGE_DUTY, value_parser = parse_duty, requires = "purge")]
    pub(crate) purge_duty: f64,
    /// Instead: operations per second at each of these numbers of callers (e.g.
    /// 1,8,32,128), idem and the bare statements each in a phase of its own of
    /// `--operations` operations, with p50, p99 and the engine's CPU per operation (SQLite:
    /// this process; PostgreSQL on this machine: its processes; Redis: `INFO cpu`).
    #[arg(
        long,
        value_name = "CALLERS",
        value_delimiter = ',',
        conflicts_with_all = ["concurrency", "records", "duration", "purge"]
    )]
    pub(crate) saturation: Vec<usize>,
    /// Wrap idem's store in a replay cache (`idem_core::store::ReplayCache`): each key is
    /// replayed once unmeasured (the read that keeps its record), then the replays measured
    /// are answered from this process's memory.
    #[arg(long)]
    pub(crate) replay_cache: bool,
    /// Print JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Also write the JSON report to this file (for `--plot-with` later).
    #[arg(long, value_name = "REPORT.json")]
    pub(crate) save: Option<PathBuf>,
    /// Draw p50 and p99 against live records into this SVG file (with `--saturation`:
    /// operations per second against callers).
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// Earlier `--json` reports (other stores or concurrencies) to draw in the same plot.
    #[arg(long, value_name = "REPORT.json", requires = "plot")]
    pub(crate) plot_with: Vec<PathBuf>,
    /// Measure nothing: only draw the `--plot-with` reports into the `--plot` file.
    #[arg(long, requires = "plot")]
    pub(crate) plot_only: bool,
}

#[derive(Subcommand)]
pub(crate) enum KeysCommand {
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

/// `idem purge`'s batch size (and the bench's purge): records per `purge_expired` call.
pub const PURGE_BATCH: usize = 250;
/// `idem purge`'s duty cycle (and the bench's purge).
pub const PURGE_DUTY: f64 = 0.25;

fn parse_duty(s: &str) -> Result<f64, String> {
    let duty: f64 = s
        .parse()
        .map_err(|e| format!("{s:?} is not a number: {e}"))?;
    idem_core::reconcile::PurgePace::new(1)
        .duty(duty)
        .map(|pace| pace.duty_cycle())
        .map_err(|e| e.to_string())
}

fn parse_proxy_key_source(s: &str) -> Result<crate::proxy::KeySourceName, String> {
    use crate::proxy::KeySourceName;
    match s {
        "refuse" | "client" => Ok(KeySourceName::Refuse),
        "arguments" => Ok(KeySourceName::Arguments),
        "unprotected" => Ok(KeySourceName::Unprotected),
        other => Err(format!(
            "unknown key source {other:?}: refuse, arguments or unprotected"
        )),
    }
}

fn parse_state(s: &str) -> Result<idem_core::RecordState, String> {
    idem_core::RecordState::parse(s).ok_or_else(|| {
        format!("{s:?} is not a state: use processing, completed or failed_retryable")
    })
}
