//! OpenTelemetry traces, off unless `[telemetry] otlp_endpoint` is set:
//! spans from `tracing` (through `tracing-opentelemetry`) exported over
//! OTLP/HTTP with protobuf, in batches, from the exporter's own thread.
//!
//! The spans: `http.request` (each API call, continuing the caller's
//! `traceparent`), `journal.fsync` (a send's or forward's wait for the
//! fsync that covers it) and `delivery.attempt` (each push delivery). A
//! send or forward stores a `traceparent` with its message (the journal's
//! enqueue record, docs/journal-format.md): its own span's when traces are
//! on, so that the delivery attempt is that span's child, and otherwise
//! the caller's as it came, so that the destination still continues the
//! caller's trace. Each attempt sends its own `traceparent` (or, with
//! traces off, the stored one).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::{Protocol, SpanExporter, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, Tracer};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::config::TelemetryConfig;

/// How long an export may take before it is given up.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often finished spans are sent.
const EXPORT_EVERY: Duration = Duration::from_millis(500);

/// Whether spans are exported (the layer is installed).
static ON: AtomicBool = AtomicBool::new(false);

/// The exporter cannot be built for `telemetry.otlp_endpoint` (its traces
/// URL is `url`).
#[derive(Debug, thiserror::Error)]
#[error("telemetry.otlp_endpoint {url}: {error}")]
pub struct TelemetryError {
    url: String,
    error: opentelemetry_otlp::ExporterBuildError,
}

/// The exporter's provider: [`Telemetry::shutdown`] sends what is left.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

impl Telemetry {
    /// Builds the exporter if `config` names an endpoint. Call it outside
    /// the async runtime: the exporter's HTTP client is a blocking one,
    /// used from the batch processor's own thread.
    pub fn start(config: &TelemetryConfig) -> Result<Option<(Telemetry, Tracer)>, TelemetryError> {
        let Some(url) = config.traces_url() else {
            return Ok(None);
        };
        crate::tls::install_crypto_provider();
        let exporter = SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url.clone())
            .with_timeout(EXPORT_TIMEOUT)
            .build()
            .map_err(|error| TelemetryError {
                url: url.clone(),
                error,
            })?;
        let batches = BatchSpanProcessor::builder(exporter)
            .with_batch_config(
                BatchConfigBuilder::default()
                    .with_scheduled_delay(EXPORT_EVERY)
                    .build(),
            )
            .build();
        let provider = SdkTracerProvider::builder()
            .with_resource(
                Resource::builder()
                    .with_service_name(config.service_name.clone())
                    .build(),
            )
            .with_span_processor(batches)
            .build();
        let tracer = provider.tracer("spoold");
        ON.store(true, Ordering::Release);
        Ok(Some((Telemetry { provider }, tracer)))
    }

    /// Sends the spans not sent yet and stops the exporter (blocks: call
    /// it outside the async runtime).
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "telemetry: the last spans were not sent");
        }
    }
}

/// A span from `make` when traces are on, else none: with traces off, no
/// request pays for a span (nor do the logs show one).
pub(crate) fn span(make: impl FnOnce() -> tracing::Span) -> tracing::Span {
    if ON.load(Ordering::Acquire) {
        make()
    } else {
        tracing::Span::none()
    }
}

/// A `traceparent` value of version 00 with ids that are not zero.
fn is_traceparent(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    let hex = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
    let nonzero = |s: &str| s.bytes().any(|b| b != b'0');
    matches!(parts.as_slice(), [v, trace, span, flags]
        if *v == "00" && hex(trace, 32) && nonzero(trace) && hex(span, 16) && nonzero(span) && hex(flags, 2))
}

/// Makes `span` a child of the span `traceparent` names, when traces are
/// on and it parses. Call it before the span is first entered.
pub(crate) fn continue_trace(span: &tracing::Span, traceparent: Option<&str>) {
    let Some(traceparent) = traceparent.filter(|t| ON.load(Ordering::Acquire) && is_traceparent(t))
    else {
        return;
    };
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// The current span's `traceparent`, when traces are on.
fn current() -> Option<String> {
    if !ON.load(Ordering::Acquire) {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&tracing::Span::current().context(), &mut carrier);
    carrier.remove("traceparent")
}

/// What a send or forward stores with its message: the current span's
/// `traceparent` when traces are on, else the caller's as it came.
pub(crate) fn to_store(incoming: Option<&str>) -> Option<String> {
    current().or_else(|| incoming.filter(|t| is_traceparent(t)).map(str::to_owned))
}

/// What a delivery attempt sends as `traceparent`: its own span's when
/// traces are on, else what the message stored.
pub(crate) fn outgoing(stored: Option<&str>) -> Option<String> {
    current().or_else(|| stored.map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_traceparent_is_kept() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(is_traceparent(good));
        assert_eq!(to_store(Some(good)).as_deref(), Some(good));
        for bad in [
            "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "garbage",
        ] {
            assert!(!is_traceparent(bad), "{bad}");
            assert_eq!(to_store(Some(bad)), None, "{bad}");
        }
    }
}
