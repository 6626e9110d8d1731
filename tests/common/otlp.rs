//! A real OTLP/HTTP receiver (protobuf) for the trace tests
//! (tests/process/push_delivery.rs, tests/cluster/webhooks.rs).

use axum::http::StatusCode;

pub type Spans =
    std::sync::Arc<std::sync::Mutex<Vec<(String, opentelemetry_proto::tonic::trace::v1::Span)>>>;

/// A local OTLP/HTTP receiver (protobuf): every span posted to
/// `/v1/traces`, with the `service.name` of its resource.
pub async fn otlp_receiver() -> (Spans, String) {
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use prost::Message;
    let spans: std::sync::Arc<std::sync::Mutex<Vec<_>>> = Default::default();
    let kept = spans.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let kept = kept.clone();
            async move {
                let request = ExportTraceServiceRequest::decode(body).unwrap();
                for rs in request.resource_spans {
                    let service = rs
                        .resource
                        .iter()
                        .flat_map(|r| &r.attributes)
                        .find(|a| a.key == "service.name")
                        .and_then(|a| a.value.as_ref())
                        .map(|v| format!("{:?}", v.value))
                        .unwrap_or_default();
                    for ss in rs.scope_spans {
                        for span in ss.spans {
                            kept.lock().unwrap().push((service.clone(), span));
                        }
                    }
                }
                StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (spans, format!("http://{addr}"))
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// An attribute of `span`, as text (strings as they are, numbers written).
pub fn attribute(span: &opentelemetry_proto::tonic::trace::v1::Span, key: &str) -> Option<String> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value as V;
    let value = span
        .attributes
        .iter()
        .find(|a| a.key == key)?
        .value
        .as_ref()?;
    match value.value.as_ref()? {
        V::StringValue(s) => Some(s.clone()),
        V::IntValue(n) => Some(n.to_string()),
        other => Some(format!("{other:?}")),
    }
}
