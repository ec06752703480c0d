//! `idem serve --metrics`: the Prometheus exporter and its `GET /metrics`.

use std::time::Duration;

use axum::Router;
use axum::http::header;
use axum::routing::get;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

use super::BoxError;

/// Installs the Prometheus recorder process-wide ([`metrics-exporter-prometheus`]) and
/// describes every idem metric ([`idem_core::metrics::describe`]); fails if a recorder is
/// already installed. Histograms are exported as summaries; a background task runs the
/// exporter's upkeep every few seconds.
///
/// [`metrics-exporter-prometheus`]: https://docs.rs/metrics-exporter-prometheus
pub fn install_metrics() -> Result<PrometheusHandle, BoxError> {
    let handle = PrometheusBuilder::new().install_recorder()?;
    idem_core::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_secs(5)).await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

/// `GET /metrics`: the Prometheus text exposition of `handle`'s recorder (for
/// `idem serve --metrics ADDR`, on a listener of its own).
pub fn metrics_router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let text = handle.render();
            async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], text) }
        }),
    )
}
