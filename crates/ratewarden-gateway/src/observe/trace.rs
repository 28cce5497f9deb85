//! OpenTelemetry traces (issue 50): W3C trace context read from a request
//! and passed on to its upstream, a sampler, and spans sent as OTLP
//! (protobuf over HTTP, or gRPC) in batches, from a thread of their own.
//!
//! Written here rather than taken from the `opentelemetry` crates: the
//! request path needs only a sampling decision, two ids and a few
//! timestamps per sampled request, and the OTLP messages are a dozen
//! protobuf types that `prost` (already built for Envoy's RLS) encodes.
//! The SDK would have brought its own runtime glue, a second gRPC stack
//! and global state. The parser of `traceparent` is fuzzed
//! (`fuzz/fuzz_targets/traceparent.rs`); the messages are checked against
//! the official definitions by `tests/tracing.rs` (Python's
//! `opentelemetry-proto` decodes what we send).
//!
//! **Bounded.** Spans wait in a queue of [`QUEUE`]; a full queue drops the
//! span and counts it (`ratewarden_trace_spans_dropped_total`), as does a
//! batch the collector did not take. Nothing grows with an outage of the
//! collector.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::{TraceEndpoint, TraceProtocol, TraceSampler, TraceSpec};

/// Spans waiting to be sent, at most.
pub(crate) const QUEUE: usize = 2_048;
/// Spans per export, at most.
const BATCH: usize = 512;
/// A batch goes at least this often while spans arrive.
const EVERY: Duration = Duration::from_secs(1);
/// One export's bound (connection, request and answer).
const EXPORT_TIMEOUT: Duration = Duration::from_secs(5);

/// A W3C trace context, as read from `traceparent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parent {
    pub(crate) trace_id: [u8; 16],
    pub(crate) span_id: [u8; 8],
    pub(crate) sampled: bool,
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

fn hex_into(src: &[u8], out: &mut [u8]) -> Option<()> {
    if src.len() != out.len() * 2 {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(src.chunks_exact(2)) {
        *o = hex_val(pair[0])? << 4 | hex_val(pair[1])?;
    }
    Some(())
}

/// A `traceparent` value as W3C Trace Context level 1 reads it:
/// `version-traceid-parentid-flags`, lowercase hex, neither id all zeros,
/// version `ff` invalid; a version above `00` may carry more after its
/// flags (following a `-`), which is ignored. Anything else is no parent:
/// the request starts a trace of its own (a bad header is never trusted,
/// and never an error).
pub(crate) fn parse_traceparent(v: &[u8]) -> Option<Parent> {
    if v.len() < 55 {
        return None;
    }
    let mut version = [0u8; 1];
    hex_into(&v[0..2], &mut version)?;
    if version[0] == 0xff || v[2] != b'-' || v[35] != b'-' || v[52] != b'-' {
        return None;
    }
    if version[0] == 0 && v.len() != 55 {
        return None;
    }
    if v.len() > 55 && v[55] != b'-' {
        return None;
    }
    let mut p = Parent {
        trace_id: [0; 16],
        span_id: [0; 8],
        sampled: false,
    };
    hex_into(&v[3..35], &mut p.trace_id)?;
    hex_into(&v[36..52], &mut p.span_id)?;
    let mut flags = [0u8; 1];
    hex_into(&v[53..55], &mut flags)?;
    if p.trace_id == [0; 16] || p.span_id == [0; 8] {
        return None;
    }
    p.sampled = flags[0] & 1 == 1;
    Some(p)
}

/// Whether a `tracestate` value may be passed on: at most 512 bytes of
/// printable ASCII (its list members are not checked further: it is
/// another vendor's, relayed as received or not at all).
pub(crate) fn valid_tracestate(v: &[u8]) -> bool {
    v.len() <= 512 && v.iter().all(|b| (0x20..0x7f).contains(b))
}

/// `00-{trace}-{span}-{flags}`.
pub(crate) fn traceparent(trace_id: &[u8; 16], span_id: &[u8; 8], sampled: bool) -> [u8; 55] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = [b'-'; 55];
    out[0] = b'0';
    out[1] = b'0';
    let mut put = |at: usize, bytes: &[u8]| {
        for (i, b) in bytes.iter().enumerate() {
            out[at + 2 * i] = HEX[usize::from(b >> 4)];
            out[at + 2 * i + 1] = HEX[usize::from(b & 15)];
        }
    };
    put(3, trace_id);
    put(36, span_id);
    put(53, &[u8::from(sampled)]);
    out
}

/// Whether `sampler` keeps a trace that starts here with `trace_id`:
/// OpenTelemetry's TraceIdRatioBased, the id's last 8 bytes against the
/// ratio (so every service with the same ratio keeps the same traces).
fn keeps(sampler: TraceSampler, trace_id: &[u8; 16]) -> bool {
    match sampler {
        TraceSampler::Off => false,
        TraceSampler::Ratio(r) if r >= 1.0 => true,
        TraceSampler::Ratio(r) if r <= 0.0 => false,
        TraceSampler::Ratio(r) => {
            let mut low = [0u8; 8];
            low.copy_from_slice(&trace_id[8..]);
            (u64::from_be_bytes(low) >> 1) < (r * (1u64 << 63) as f64) as u64
        }
    }
}

/// The protobuf messages OTLP sends (opentelemetry-proto's
/// `collector/trace/v1`, `trace/v1`, `common/v1`, `resource/v1`), the
/// fields we fill.
pub(crate) mod proto {
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ExportTraceServiceRequest {
        #[prost(message, repeated, tag = "1")]
        pub(crate) resource_spans: Vec<ResourceSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ResourceSpans {
        #[prost(message, optional, tag = "1")]
        pub(crate) resource: Option<Resource>,
        #[prost(message, repeated, tag = "2")]
        pub(crate) scope_spans: Vec<ScopeSpans>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Resource {
        #[prost(message, repeated, tag = "1")]
        pub(crate) attributes: Vec<KeyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct ScopeSpans {
        #[prost(message, optional, tag = "1")]
        pub(crate) scope: Option<InstrumentationScope>,
        #[prost(message, repeated, tag = "2")]
        pub(crate) spans: Vec<Span>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct InstrumentationScope {
        #[prost(string, tag = "1")]
        pub(crate) name: String,
        #[prost(string, tag = "2")]
        pub(crate) version: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Span {
        #[prost(bytes = "vec", tag = "1")]
        pub(crate) trace_id: Vec<u8>,
        #[prost(bytes = "vec", tag = "2")]
        pub(crate) span_id: Vec<u8>,
        #[prost(string, tag = "3")]
        pub(crate) trace_state: String,
        #[prost(bytes = "vec", tag = "4")]
        pub(crate) parent_span_id: Vec<u8>,
        #[prost(string, tag = "5")]
        pub(crate) name: String,
        #[prost(int32, tag = "6")]
        pub(crate) kind: i32,
        #[prost(fixed64, tag = "7")]
        pub(crate) start_time_unix_nano: u64,
        #[prost(fixed64, tag = "8")]
        pub(crate) end_time_unix_nano: u64,
        #[prost(message, repeated, tag = "9")]
        pub(crate) attributes: Vec<KeyValue>,
        #[prost(message, repeated, tag = "11")]
        pub(crate) events: Vec<Event>,
        #[prost(message, optional, tag = "15")]
        pub(crate) status: Option<Status>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Event {
        #[prost(fixed64, tag = "1")]
        pub(crate) time_unix_nano: u64,
        #[prost(string, tag = "2")]
        pub(crate) name: String,
        #[prost(message, repeated, tag = "3")]
        pub(crate) attributes: Vec<KeyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct Status {
        #[prost(string, tag = "2")]
        pub(crate) message: String,
        #[prost(int32, tag = "3")]
        pub(crate) code: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct KeyValue {
        #[prost(string, tag = "1")]
        pub(crate) key: String,
        #[prost(message, optional, tag = "2")]
        pub(crate) value: Option<AnyValue>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub(crate) struct AnyValue {
        #[prost(oneof = "Value", tags = "1, 2, 3, 4")]
        pub(crate) value: Option<Value>,
    }
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub(crate) enum Value {
        #[prost(string, tag = "1")]
        String(String),
        #[prost(bool, tag = "2")]
        Bool(bool),
        #[prost(int64, tag = "3")]
        Int(i64),
        #[prost(double, tag = "4")]
        Double(f64),
    }

    pub(crate) const KIND_SERVER: i32 = 2;
    pub(crate) const KIND_CLIENT: i32 = 3;
    pub(crate) const STATUS_ERROR: i32 = 2;

    pub(crate) fn kv(key: &str, value: Value) -> KeyValue {
        KeyValue {
            key: key.to_owned(),
            value: Some(AnyValue { value: Some(value) }),
        }
    }
    pub(crate) fn s(key: &str, v: impl Into<String>) -> KeyValue {
        kv(key, Value::String(v.into()))
    }
    pub(crate) fn i(key: &str, v: i64) -> KeyValue {
        kv(key, Value::Int(v))
    }
    pub(crate) fn b(key: &str, v: bool) -> KeyValue {
        kv(key, Value::Bool(v))
    }
}

/// A span's ids, as the request path carries them.
#[derive(Debug, Clone)]
pub(crate) struct Ids {
    pub(crate) trace_id: [u8; 16],
    pub(crate) span_id: [u8; 8],
    /// The client's span, when its `traceparent` named one.
    pub(crate) parent: Option<[u8; 8]>,
    /// The client's `tracestate`, passed on and recorded.
    pub(crate) state: Option<Box<str>>,
}

impl Ids {
    /// A new span id in this trace.
    pub(crate) fn child(&self) -> [u8; 8] {
        new_span_id()
    }
}

fn new_span_id() -> [u8; 8] {
    loop {
        let v = crate::observe::request_id::random();
        if v != 0 {
            return v.to_be_bytes();
        }
    }
}

fn new_trace_id() -> [u8; 16] {
    let mut t = [0u8; 16];
    t[..8].copy_from_slice(&crate::observe::request_id::random().to_be_bytes());
    t[8..].copy_from_slice(&new_span_id());
    t
}

/// The tracer of a configuration: its sampler and the queue to the
/// exporting thread.
pub(crate) struct Tracer {
    sampler: TraceSampler,
    queue: tokio::sync::mpsc::Sender<proto::Span>,
    dropped: Arc<AtomicU64>,
    /// The store's system and node, for the store's spans.
    pub(crate) store: (&'static str, Option<String>),
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer")
            .field("sampler", &self.sampler)
            .finish_non_exhaustive()
    }
}

impl Tracer {
    /// Starts exporting as `spec` says, counting what it drops in
    /// `dropped`; `None` when tracing is off.
    pub(crate) fn start(
        spec: &TraceSpec,
        dropped: Arc<AtomicU64>,
        store: (&'static str, Option<String>),
    ) -> Option<Self> {
        let endpoint = spec.endpoint.clone()?;
        let (tx, rx) = tokio::sync::mpsc::channel(QUEUE);
        let exporter = Exporter {
            endpoint,
            protocol: spec.protocol,
            headers: spec.headers.clone(),
            resource: resource(spec),
            dropped: dropped.clone(),
        };
        let spawned = std::thread::Builder::new()
            .name("ratewarden-otlp".into())
            .spawn(move || exporter.run(rx));
        if let Err(e) = spawned {
            tracing::error!(error = %e, "tracing: the exporting thread did not start; no spans are sent");
            return None;
        }
        Some(Self {
            sampler: spec.sampler,
            queue: tx,
            dropped,
            store,
        })
    }

    /// The span ids of a request that carried `traceparent` and
    /// `tracestate`, if it is recorded: a parent's sampled flag decides
    /// (parent-based), the sampler only for a trace that starts here. A
    /// bad `traceparent` is none: a trace starts here.
    pub(crate) fn begin(&self, traceparent: Option<&[u8]>, state: Option<&[u8]>) -> Option<Ids> {
        match traceparent.and_then(parse_traceparent) {
            Some(p) if p.sampled => Some(Ids {
                trace_id: p.trace_id,
                span_id: new_span_id(),
                parent: Some(p.span_id),
                state: state
                    .filter(|s| valid_tracestate(s))
                    .map(|s| String::from_utf8_lossy(s).into()),
            }),
            Some(_) => None,
            None => {
                let trace_id = new_trace_id();
                keeps(self.sampler, &trace_id).then(|| Ids {
                    trace_id,
                    span_id: new_span_id(),
                    parent: None,
                    state: None,
                })
            }
        }
    }

    /// Queues `spans` for export; what does not fit is dropped and counted.
    pub(crate) fn send(&self, spans: impl IntoIterator<Item = proto::Span>) {
        for s in spans {
            if self.queue.try_send(s).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }
}

fn resource(spec: &TraceSpec) -> proto::Resource {
    let mut attributes = vec![proto::s("service.name", spec.service_name.clone())];
    for (k, v) in &spec.resource {
        if k != "service.name" {
            attributes.push(proto::s(k, v.clone()));
        }
    }
    attributes.push(proto::s("telemetry.sdk.name", "ratewarden"));
    attributes.push(proto::s("telemetry.sdk.language", "rust"));
    attributes.push(proto::s("service.version", env!("CARGO_PKG_VERSION")));
    proto::Resource { attributes }
}

struct Exporter {
    endpoint: TraceEndpoint,
    protocol: TraceProtocol,
    headers: Vec<(String, String)>,
    resource: proto::Resource,
    dropped: Arc<AtomicU64>,
}

impl Exporter {
    /// The exporting thread: batches of at most [`BATCH`] spans, at least
    /// every [`EVERY`], until every sender is gone (the configuration was
    /// replaced and its last request ended); then what is left goes.
    fn run(self, mut rx: tokio::sync::mpsc::Receiver<proto::Span>) {
        let rt = match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt,
            Err(e) => {
                tracing::error!(error = %e, "tracing: no runtime for the exporter");
                return;
            }
        };
        rt.block_on(async move {
            let mut failing = false;
            loop {
                let Some(first) = rx.recv().await else { return };
                let mut batch = vec![first];
                let until = tokio::time::Instant::now() + EVERY;
                while batch.len() < BATCH {
                    match tokio::time::timeout_at(until, rx.recv()).await {
                        Ok(Some(s)) => batch.push(s),
                        Ok(None) | Err(_) => break,
                    }
                }
                let n = batch.len() as u64;
                match tokio::time::timeout(EXPORT_TIMEOUT, self.export(batch)).await {
                    Ok(Ok(())) => {
                        if failing {
                            tracing::info!(collector = %self.endpoint.authority, "tracing: the collector takes spans again");
                            failing = false;
                        }
                    }
                    outcome => {
                        self.dropped.fetch_add(n, Ordering::Relaxed);
                        if !failing {
                            let why = match outcome {
                                Err(_) => format!("no answer within {EXPORT_TIMEOUT:?}"),
                                Ok(Err(e)) => e,
                                Ok(Ok(())) => unreachable!(),
                            };
                            tracing::warn!(collector = %self.endpoint.authority, error = %why, "tracing: spans dropped: the collector did not take them (counted in ratewarden_trace_spans_dropped_total; logged again when it recovers)");
                            failing = true;
                        }
                    }
                }
            }
        });
    }

    async fn export(&self, spans: Vec<proto::Span>) -> Result<(), String> {
        use prost::Message as _;
        let request = proto::ExportTraceServiceRequest {
            resource_spans: vec![proto::ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![proto::ScopeSpans {
                    scope: Some(proto::InstrumentationScope {
                        name: "ratewarden".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                    }),
                    spans,
                }],
            }],
        };
        let body = request.encode_to_vec();
        let stream = tokio::net::TcpStream::connect(&self.endpoint.authority)
            .await
            .map_err(|e| format!("connecting to {}: {e}", self.endpoint.authority))?;
        let _ = stream.set_nodelay(true);
        let io = hyper_util::rt::TokioIo::new(stream);
        let uri = format!("http://{}{}", self.endpoint.authority, self.endpoint.path);
        match self.protocol {
            TraceProtocol::HttpProtobuf => {
                let (mut send, conn) = hyper::client::conn::http1::handshake(io)
                    .await
                    .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                // Origin form: a full URI would be sent as a proxy's
                // absolute form.
                let mut req = http::Request::post(self.endpoint.path.as_str())
                    .header(http::header::HOST, &self.endpoint.authority)
                    .header(http::header::CONTENT_TYPE, "application/x-protobuf");
                for (k, v) in &self.headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                let req = req
                    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
                    .map_err(|e| e.to_string())?;
                let answer = send.send_request(req).await.map_err(|e| e.to_string())?;
                let status = answer.status();
                if status.is_success() {
                    Ok(())
                } else {
                    Err(format!("the collector answered {status}"))
                }
            }
            TraceProtocol::Grpc => {
                use http_body_util::BodyExt as _;
                let (mut send, conn) =
                    hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                        .await
                        .map_err(|e| e.to_string())?;
                tokio::spawn(conn);
                let mut framed = Vec::with_capacity(body.len() + 5);
                framed.push(0);
                framed.extend_from_slice(&(body.len() as u32).to_be_bytes());
                framed.extend_from_slice(&body);
                let mut req = http::Request::post(uri)
                    .header(http::header::CONTENT_TYPE, "application/grpc")
                    .header(http::header::TE, "trailers");
                for (k, v) in &self.headers {
                    req = req.header(k.as_str(), v.as_str());
                }
                let req = req
                    .body(http_body_util::Full::new(bytes::Bytes::from(framed)))
                    .map_err(|e| e.to_string())?;
                let answer = send.send_request(req).await.map_err(|e| e.to_string())?;
                let (head, body) = answer.into_parts();
                let status = head
                    .headers
                    .get("grpc-status")
                    .map(|v| v.as_bytes().to_vec());
                let collected = body.collect().await.map_err(|e| e.to_string())?;
                let status = status.or_else(|| {
                    collected
                        .trailers()
                        .and_then(|t| t.get("grpc-status"))
                        .map(|v| v.as_bytes().to_vec())
                });
                match status.as_deref() {
                    Some(b"0") => Ok(()),
                    Some(s) => Err(format!(
                        "the collector answered grpc-status {}",
                        String::from_utf8_lossy(s)
                    )),
                    None => Err(format!(
                        "the collector answered {} without a grpc-status",
                        head.status
                    )),
                }
            }
        }
    }
}

/// A `ShouldRateLimit` call's span (kind server, OpenTelemetry's RPC
/// attributes): from `from` to now, over `descriptors` descriptors of
/// `domain`, over a limit or not, or failed with a gRPC status's message.
pub(crate) fn rls_span(
    ids: Ids,
    from: quanta::Instant,
    domain: &str,
    descriptors: usize,
    outcome: Result<bool, &str>,
) -> proto::Span {
    let mut attributes = vec![
        proto::s("rpc.system", "grpc"),
        proto::s("rpc.service", "envoy.service.ratelimit.v3.RateLimitService"),
        proto::s("rpc.method", "ShouldRateLimit"),
        proto::s("ratewarden.domain", domain),
        proto::i("ratewarden.descriptors", descriptors as i64),
    ];
    let status = match outcome {
        Ok(over) => {
            attributes.push(proto::b("ratewarden.limited", over));
            attributes.push(proto::i("rpc.grpc.status_code", 0));
            None
        }
        Err(message) => Some(proto::Status {
            message: message.to_owned(),
            code: proto::STATUS_ERROR,
        }),
    };
    proto::Span {
        trace_id: ids.trace_id.to_vec(),
        span_id: ids.span_id.to_vec(),
        trace_state: ids.state.as_deref().unwrap_or("").to_owned(),
        parent_span_id: ids.parent.map(|p| p.to_vec()).unwrap_or_default(),
        name: "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit".into(),
        kind: proto::KIND_SERVER,
        start_time_unix_nano: unix_nanos(from),
        end_time_unix_nano: unix_nanos(quanta::Instant::now()),
        attributes,
        events: vec![],
        status,
    }
}

/// Unix nanoseconds at `at` (the flow's clock).
pub(crate) fn unix_nanos(at: quanta::Instant) -> u64 {
    crate::observe::request_id::wall(at).as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_is_read_as_w3c_says() {
        let v = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let p = parse_traceparent(v).unwrap();
        assert_eq!(p.trace_id[0], 0x4b);
        assert_eq!(p.span_id[7], 0xb7);
        assert!(p.sampled);
        assert_eq!(&traceparent(&p.trace_id, &p.span_id, true), v);
        let unsampled = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00";
        assert!(!parse_traceparent(unsampled).unwrap().sampled);
        for bad in [
            &b"00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01"[..],
            b"00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            b"ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-",
            b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            b"00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            b"",
        ] {
            assert_eq!(
                parse_traceparent(bad),
                None,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        // A later version may carry more, after a dash.
        let later = b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-comes";
        assert!(parse_traceparent(later).is_some());
        assert!(
            parse_traceparent(&later[..57].iter().copied().chain(*b"x").collect::<Vec<_>>())
                .is_some()
        );
        assert!(
            parse_traceparent(b"01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x")
                .is_none()
        );
    }

    #[test]
    fn the_ratio_sampler_keeps_its_share_by_trace_id() {
        let s = TraceSampler::Ratio(0.25);
        let kept = (0..20_000).filter(|_| keeps(s, &new_trace_id())).count();
        assert!((4_500..5_500).contains(&kept), "{kept}");
        let id = new_trace_id();
        assert_eq!(keeps(s, &id), keeps(s, &id));
        assert!(!keeps(TraceSampler::Ratio(0.0), &id));
        assert!(keeps(TraceSampler::Ratio(1.0), &id));
        assert!(!keeps(TraceSampler::Off, &id));
    }

    #[test]
    fn tracestate_passes_only_when_printable_and_short() {
        assert!(valid_tracestate(b"congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"));
        assert!(!valid_tracestate(b"a=b\r\nx: y"));
        assert!(!valid_tracestate(&[b'a'; 513]));
    }
}
