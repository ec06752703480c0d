//! A replica of the demo's MCP server, on a tokio runtime of its own: killing it shuts the
//! runtime down at once, as a crash would.

use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::options::{Mode, Sink, TasksOptions};
use super::tool::Provisioner;
use crate::serve::BoxError;

/// One replica: its own runtime, so killing it stops everything it runs at once.
pub(super) struct Replica {
    pub(super) url: String,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Replica {
    pub(super) async fn start(
        mode: &Mode,
        sink: &Sink,
        options: &TasksOptions,
    ) -> Result<Self, BoxError> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}/mcp", listener.local_addr()?);
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<Result<(), String>>();
        let (mode, sink, options) = (mode.clone(), sink.clone(), options.clone());
        runtime.spawn(async move {
            let server = match Provisioner::new(&mode, sink, &options).await {
                Ok(server) => server,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let config = StreamableHttpServerConfig::default().with_sse_keep_alive(None);
            let service: StreamableHttpService<Provisioner, LocalSessionManager> =
                StreamableHttpService::new(move || Ok(server.clone()), Default::default(), config);
            let router = axum::Router::new().nest_service("/mcp", service);
            let listener = match tokio::net::TcpListener::from_std(listener) {
                Ok(listener) => listener,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            let _ = axum::serve(listener, router).await;
        });
        ready_rx.await.map_err(|_| "the replica did not start")??;
        Ok(Self {
            url,
            runtime: Some(runtime),
        })
    }

    /// Stops the replica at once, as a crash would.
    pub(super) fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.kill();
    }
}
