//! A real rmcp client and server in one process, over an in-memory duplex pipe: which answers
//! are recorded, which run again, and what happens without a key. The sink is a per-tool counter
//! of how often the tool's body ran.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use idem_conformance::kit::{Fault, FaultStore, Op};
use idem_core::store::ListFilter;
use idem_core::{KeySource, KeyStore, MemoryStore, Timestamp};
use idem_mcp::{
    IdempotentTools, META_KEY, STORE_UNAVAILABLE, ToolSettings, UNAUTHENTICATED, is_replay,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientConfig, ContentBlock, ErrorCode,
    ErrorData, ListToolsResult, PaginatedRequestParams, RequestMetaObject, ServerCapabilities,
    ServerConfig,
};
use rmcp::service::{RequestContext, RunningService, ServiceError};
use rmcp::{RoleClient, RoleServer, ServerHandler, ServiceExt, tool, tool_router};
use serde_json::json;

#[derive(Clone, Default)]
struct Runs {
    unprotected: Arc<AtomicUsize>,
    flaky: Arc<AtomicUsize>,
    rejects: Arc<AtomicUsize>,
    plain: Arc<AtomicUsize>,
}

#[derive(Clone)]
struct Server {
    tool_router: ToolRouter<Self>,
    idem: IdempotentTools,
    runs: Runs,
}

#[tool_router]
impl Server {
    #[tool(description = "A side-effecting tool that runs unprotected without a key.")]
    async fn unprotected(&self) -> String {
        self.runs.unprotected.fetch_add(1, Ordering::SeqCst);
        "done".into()
    }

    #[tool(description = "Fails internally on its first run, succeeds afterwards.")]
    async fn flaky(&self) -> Result<CallToolResult, ErrorData> {
        if self.runs.flaky.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(ErrorData::internal_error("downstream timed out", None));
        }
        Ok(CallToolResult::success(vec![ContentBlock::text("ok")]))
    }

    #[tool(description = "Always rejects the request: a business answer.")]
    async fn rejects(&self) -> CallToolResult {
        let n = self.runs.rejects.fetch_add(1, Ordering::SeqCst);
        CallToolResult::error(vec![ContentBlock::text(format!("account closed ({n})"))])
    }

    #[tool(description = "Not side-effecting: never needs a key.")]
    async fn plain(&self) -> String {
        self.runs.plain.fetch_add(1, Ordering::SeqCst);
        "read".into()
    }
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        self.idem.advertise(ServerConfig::new(
            ServerCapabilities::builder().enable_tools().build(),
        ))
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(self.idem.list_routed(&self.tool_router))
    }

    async fn call_tool(
        &self,
        params: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.idem
            .call_routed(self, &self.tool_router, params, context)
            .await
    }
}

/// The tools of the tests, protected over `store`, with no principal source but the default.
fn tools(store: MemoryStore) -> IdempotentTools {
    IdempotentTools::with_store(store)
        .tool("unprotected", settings(KeySource::Unprotected))
        .tool("flaky", settings(KeySource::Refuse))
        .tool("rejects", settings(KeySource::Refuse))
}

/// A tool with a 2 s processing window and `source` for calls without a key.
fn settings(source: KeySource) -> ToolSettings {
    let tool = idem_core::Tool::builder()
        .processing_window(Duration::from_secs(2))
        .key_source(source)
        .build()
        .unwrap();
    ToolSettings::new(tool)
}

/// A client of a server with [`tools`], opted into one shared scope: the duplex pipe carries no
/// authentication.
async fn connect() -> (RunningService<RoleClient, ClientConfig>, Runs) {
    let runs = Runs::default();
    let idem = tools(MemoryStore::new()).allow_anonymous("test-agent");
    (serve(idem, runs.clone()).await, runs)
}

/// A client of a server running `idem`, counting runs in `runs`.
async fn serve(idem: IdempotentTools, runs: Runs) -> RunningService<RoleClient, ClientConfig> {
    let server = Server {
        tool_router: Server::tool_router(),
        idem,
        runs,
    };
    let (server_io, client_io) = tokio::io::duplex(64 * 1024);
    tokio::spawn(async move {
        if let Ok(running) = server.serve(server_io).await {
            let _ = running.waiting().await;
        }
    });
    ClientConfig::default().serve(client_io).await.unwrap()
}

fn call(tool: &'static str, key: Option<&str>) -> CallToolRequestParams {
    let mut params = CallToolRequestParams::new(tool);
    if let Some(key) = key {
        let mut meta = RequestMetaObject::new();
        meta.0.0.insert(META_KEY.into(), json!(key));
        params.meta = Some(meta);
    }
    params
}

fn runs(counter: &AtomicUsize) -> usize {
    counter.load(Ordering::SeqCst)
}

#[tokio::test]
async fn run_unprotected_without_a_key_runs_every_time_and_with_a_key_once() {
    let (client, ran) = connect().await;
    client.call_tool(call("unprotected", None)).await.unwrap();
    client.call_tool(call("unprotected", None)).await.unwrap();
    assert_eq!(runs(&ran.unprotected), 2, "no key: no protection");
    let first = client
        .call_tool(call("unprotected", Some("k-1")))
        .await
        .unwrap();
    let again = client
        .call_tool(call("unprotected", Some("k-1")))
        .await
        .unwrap();
    assert!(!is_replay(&first) && is_replay(&again));
    assert_eq!(runs(&ran.unprotected), 3, "with a key: once");
    // Its annotations do not claim idempotency it only has with a key.
    let tools = client.list_all_tools().await.unwrap();
    let tool = tools.iter().find(|t| t.name == "unprotected").unwrap();
    assert_eq!(
        tool.annotations.as_ref().unwrap().idempotent_hint,
        Some(false)
    );
    let description = tool.description.as_deref().unwrap();
    assert!(description.contains("runs unprotected"), "{description}");
}

#[tokio::test]
async fn refuse_is_the_default_for_a_missing_key() {
    let (client, ran) = connect().await;
    let err = client.call_tool(call("flaky", None)).await.unwrap_err();
    let ServiceError::McpError(err) = err else {
        panic!("a JSON-RPC error")
    };
    assert_eq!(err.code, ErrorCode::INVALID_PARAMS);
    assert_eq!(runs(&ran.flaky), 0);
}

#[tokio::test]
async fn an_internal_failure_is_retryable_and_the_retry_runs_the_tool_again() {
    let (client, ran) = connect().await;
    let failed = client
        .call_tool(call("flaky", Some("k-2")))
        .await
        .unwrap_err();
    assert!(matches!(failed, ServiceError::McpError(e) if e.code == ErrorCode::INTERNAL_ERROR));
    let second = client.call_tool(call("flaky", Some("k-2"))).await.unwrap();
    assert!(!is_replay(&second), "the retry ran the tool");
    let third = client.call_tool(call("flaky", Some("k-2"))).await.unwrap();
    assert!(is_replay(&third), "the success is recorded");
    assert_eq!(runs(&ran.flaky), 2);
}

#[tokio::test]
async fn a_tool_error_result_is_definitive_and_replayed() {
    let (client, ran) = connect().await;
    let first = client
        .call_tool(call("rejects", Some("k-3")))
        .await
        .unwrap();
    let again = client
        .call_tool(call("rejects", Some("k-3")))
        .await
        .unwrap();
    assert_eq!(first.is_error, Some(true));
    assert_eq!(again.is_error, Some(true));
    assert!(is_replay(&again));
    assert_eq!(
        first.content, again.content,
        "the same rejection, byte for byte"
    );
    assert_eq!(runs(&ran.rejects), 1);
}

#[tokio::test]
async fn tools_not_registered_pass_through_without_a_key() {
    let (client, ran) = connect().await;
    let result = client.call_tool(call("plain", None)).await.unwrap();
    client
        .call_tool(call("plain", Some("ignored")))
        .await
        .unwrap();
    assert!(!is_replay(&result));
    assert!(result.meta.is_none(), "untouched");
    assert_eq!(runs(&ran.plain), 2);
    let tools = client.list_all_tools().await.unwrap();
    let plain = tools.iter().find(|t| t.name == "plain").unwrap();
    assert!(plain.annotations.is_none());
}

/// A call of a side-effecting tool without a principal is refused by default: a typed error,
/// nothing claimed, the tool not run, with a key or without.
#[tokio::test]
async fn no_principal_is_refused_by_default_and_nothing_runs() {
    let store = MemoryStore::new();
    let ran = Runs::default();
    let client = serve(tools(store.clone()), ran.clone()).await;
    for (tool, key) in [
        ("flaky", Some("k-p")),
        ("rejects", Some("k-p")),
        ("unprotected", Some("k-p")),
        ("unprotected", None),
    ] {
        let err = client.call_tool(call(tool, key)).await.unwrap_err();
        let ServiceError::McpError(err) = err else {
            panic!("a JSON-RPC error")
        };
        assert_eq!(err.code, UNAUTHENTICATED, "{tool}");
        assert_eq!(
            err.data.unwrap()["type"],
            "urn:idem:problem:unauthenticated"
        );
        assert!(err.message.contains("no principal"), "{}", err.message);
    }
    assert_eq!(
        (runs(&ran.flaky), runs(&ran.rejects), runs(&ran.unprotected)),
        (0, 0, 0)
    );
    let records = store
        .list(&ListFilter::default(), Timestamp::now(), 100)
        .await
        .unwrap();
    assert!(records.is_empty(), "nothing claimed: {records:?}");
    // A tool that is not side-effecting still answers.
    client.call_tool(call("plain", None)).await.unwrap();
    assert_eq!(runs(&ran.plain), 1);
}

/// With the explicit opt-in, callers without a principal share one scope: a second client's call
/// with the same key replays the first client's result.
#[tokio::test]
async fn the_opt_in_shares_one_scope() {
    let ran = Runs::default();
    let idem = tools(MemoryStore::new()).allow_anonymous("shared-agent");
    let a = serve(idem.clone(), ran.clone()).await;
    let b = serve(idem, ran.clone()).await;
    let first = a.call_tool(call("rejects", Some("k-s"))).await.unwrap();
    let again = b.call_tool(call("rejects", Some("k-s"))).await.unwrap();
    assert!(!is_replay(&first) && is_replay(&again));
    assert_eq!(first.content, again.content);
    assert_eq!(runs(&ran.rejects), 1);
}

/// Two principals, one key: two scopes, two runs, no replay across them.
#[tokio::test]
async fn two_principals_two_scopes() {
    let ran = Runs::default();
    let store = MemoryStore::new();
    // The principal from the request's `_meta` (a stand-in for an authentication layer).
    let idem = tools(store.clone()).principal_with(|context| {
        context
            .meta
            .0
            .0
            .get("test/principal")
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    });
    let client = serve(idem, ran.clone()).await;
    let as_principal = |who: &str| {
        let mut params = call("rejects", Some("k-same"));
        params
            .meta
            .as_mut()
            .unwrap()
            .0
            .0
            .insert("test/principal".into(), json!(who));
        params
    };
    let a = client.call_tool(as_principal("alice")).await.unwrap();
    let b = client.call_tool(as_principal("bob")).await.unwrap();
    let a_again = client.call_tool(as_principal("alice")).await.unwrap();
    assert!(!is_replay(&a) && !is_replay(&b) && is_replay(&a_again));
    assert_ne!(a.content, b.content, "bob did not get alice's answer");
    assert_eq!(runs(&ran.rejects), 2);
    let scopes: std::collections::BTreeSet<String> = store
        .list(&ListFilter::default(), Timestamp::now(), 100)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.scope.as_str().to_owned())
        .collect();
    assert_eq!(scopes.len(), 2, "{scopes:?}");
}

/// Refusals are counted in `idem_refusals_total{transport="mcp", reason}` and keyless calls of
/// a `RunUnprotected` tool in `idem_unprotected_total{transport="mcp"}`, exactly; nothing
/// refused runs.
#[tokio::test]
async fn refusals_and_unprotected_calls_are_counted() {
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);

    let (client, ran) = connect().await;
    client.call_tool(call("flaky", None)).await.unwrap_err();
    client
        .call_tool(call("flaky", Some("a b")))
        .await
        .unwrap_err();
    client
        .call_tool(call("rejects", Some("k-m")))
        .await
        .unwrap();
    let mut other = call("rejects", Some("k-m"));
    other.arguments = Some(json!({"account": "B-9"}).as_object().unwrap().clone());
    client.call_tool(other).await.unwrap_err();
    client.call_tool(call("unprotected", None)).await.unwrap();
    let anonymous = serve(tools(MemoryStore::new()), ran.clone()).await;
    anonymous
        .call_tool(call("rejects", Some("k-p")))
        .await
        .unwrap_err();
    assert_eq!((runs(&ran.flaky), runs(&ran.rejects)), (0, 1));
    assert_eq!(runs(&ran.unprotected), 1);

    /// A counter: name, sorted labels, value.
    type Sample = (String, Vec<(String, String)>, u64);
    let counters: Vec<Sample> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(key, _, _, value)| match value {
            DebugValue::Counter(n) => {
                let key = key.key();
                let mut labels: Vec<(String, String)> = key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect();
                labels.sort();
                Some((key.name().to_owned(), labels, n))
            }
            _ => None,
        })
        .collect();
    let value = |name: &str, labels: &[(&str, &str)]| {
        let mut want: Vec<(String, String)> = labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        want.sort();
        counters
            .iter()
            .filter(|(n, l, _)| n == name && *l == want)
            .map(|(.., v)| *v)
            .sum::<u64>()
    };
    let refused = |reason| {
        value(
            "idem_refusals_total",
            &[("transport", "mcp"), ("reason", reason)],
        )
    };
    assert_eq!(refused("key-required"), 1, "{counters:?}");
    assert_eq!(refused("invalid-key"), 1, "{counters:?}");
    assert_eq!(refused("fingerprint-mismatch"), 1, "{counters:?}");
    assert_eq!(refused("unauthenticated"), 1, "{counters:?}");
    let all_refusals: u64 = counters
        .iter()
        .filter(|(n, ..)| n == "idem_refusals_total")
        .map(|(.., v)| v)
        .sum();
    assert_eq!(all_refusals, 4, "{counters:?}");
    assert_eq!(
        value("idem_unprotected_total", &[("transport", "mcp")]),
        1,
        "{counters:?}"
    );
}

/// As over HTTP (503 `store-unavailable`, 500 `store-error`), a store that is down is told from
/// one that failed otherwise: [`STORE_UNAVAILABLE`] (retry later with the same key) versus an
/// internal error of type `store-error`. Neither runs the tool.
#[tokio::test]
async fn a_store_that_is_down_is_told_from_a_store_that_failed_and_nothing_runs() {
    for (fault, code, name, retry_later) in [
        (
            Fault::Unavailable,
            STORE_UNAVAILABLE,
            "store-unavailable",
            true,
        ),
        (
            Fault::Backend,
            ErrorCode::INTERNAL_ERROR,
            "store-error",
            false,
        ),
    ] {
        let ran = Runs::default();
        let store = FaultStore::new(MemoryStore::new());
        store.fail_all(fault);
        let idem = IdempotentTools::with_store(store.clone())
            .tool("rejects", settings(KeySource::Refuse))
            .allow_anonymous("test-agent");
        let client = serve(idem, ran.clone()).await;
        let err = client
            .call_tool(call("rejects", Some("k-s")))
            .await
            .unwrap_err();
        let ServiceError::McpError(err) = err else {
            panic!("a JSON-RPC error")
        };
        assert_eq!(err.code, code, "{name}");
        assert_eq!(
            err.data.unwrap()["type"],
            format!("urn:idem:problem:{name}")
        );
        assert_eq!(
            err.message.contains("retry later with the same key"),
            retry_later,
            "{}",
            err.message
        );
        assert_eq!(runs(&ran.rejects), 0, "{name}: never a silent proceed");
        assert_eq!(
            store.calls(Op::Claim),
            0,
            "{name}: the claim never reached the store"
        );
    }
}
