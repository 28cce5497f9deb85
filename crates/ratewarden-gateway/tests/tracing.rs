//! OpenTelemetry traces (issue 50), against an OTLP receiver made from the
//! official protobuf definitions (`tests/sdk/otlp_receiver.py`: PyPI's
//! `opentelemetry-proto`, gRPC through `grpcio`), over HTTP and gRPC: the
//! span tree of a forwarded request under the client's `traceparent`, a
//! refused request's attributes, the `OTEL_*` variables over the file, and
//! a dead collector that leaves the request path alone.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Upstream, scratch_dir, send, spawn_binary, wait_for_metric};

/// The Python with the OTLP definitions (`./test` makes one in
/// `target/sdk-venv` and names it in `RATEWARDEN_SDK_PYTHON`).
fn python() -> String {
    std::env::var("RATEWARDEN_SDK_PYTHON").unwrap_or_else(|_| {
        panic!(
            "this test needs a Python with `opentelemetry-proto` and `grpcio`: run ./test \
             (it makes target/sdk-venv), or `python3 -m venv v && v/bin/pip install \
             opentelemetry-proto grpcio` and set RATEWARDEN_SDK_PYTHON=v/bin/python"
        )
    })
}

/// The receiver, its spans as they arrive; stopped when dropped.
struct Receiver {
    child: Child,
    port: u16,
    spans: Arc<Mutex<Vec<Value>>>,
}

impl Receiver {
    fn start(mode: &str) -> Self {
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/sdk/otlp_receiver.py");
        let mut child = Command::new(python())
            .args([script, mode])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the receiver's Python");
        let mut out = BufReader::new(child.stdout.take().unwrap());
        let mut first = String::new();
        out.read_line(&mut first).unwrap();
        let port = first
            .trim()
            .strip_prefix("port=")
            .unwrap_or_else(|| {
                panic!("the receiver said {first:?}: is opentelemetry-proto installed?")
            })
            .parse()
            .unwrap();
        let spans = Arc::new(Mutex::new(vec![]));
        let s = spans.clone();
        std::thread::spawn(move || {
            for line in out.lines() {
                let Ok(line) = line else { return };
                if let Ok(v) = serde_json::from_str(&line) {
                    s.lock().unwrap().push(v);
                }
            }
        });
        Self { child, port, spans }
    }

    /// Waits (at most 10 s) until `n` spans with `pred` have arrived.
    fn wait(&self, n: usize, pred: impl Fn(&Value) -> bool) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let got: Vec<Value> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| pred(s))
                .cloned()
                .collect();
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {n} spans arrived: {:#?}",
                got.len(),
                self.spans.lock().unwrap()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const PARENT: &str = "00f067aa0ba902b7";

fn attr<'a>(span: &'a Value, key: &str) -> &'a Value {
    &span["attrs"][key]
}

/// The real binary in front of `upstream`, its traces sent to the
/// collector on `port` over `protocol`; `rest` follows `tracing.otlp`.
fn traced(port: u16, protocol: &str, rest: &str, upstream: &str) -> support::Binary {
    let dir = scratch_dir("rw-trace");
    let file = dir.join("rw.yaml");
    std::fs::write(
        &file,
        format!("tracing:\n  otlp: {{endpoint: 'http://127.0.0.1:{port}', protocol: {protocol}}}\n{rest}"),
    )
    .unwrap();
    spawn_binary(&file, upstream, &[], Some(dir))
}

/// A forwarded request under the client's sampled `traceparent`: the
/// server span is the client span's child, in its trace, with the HTTP
/// conventions and the decision; the decision's span (the store) and the
/// upstream's span (kind client) are the server span's children; the
/// upstream received the upstream span as its parent, and the client's
/// `tracestate`. A refused request's span names the rule and why.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forwarded_request_and_a_refused_one_as_spans_over_http() {
    let receiver = Receiver::start("http");
    let up = Upstream::start().await;
    let gw = traced(
        receiver.port,
        "http/protobuf",
        "  sample: 1\n  service_name: edge\nrules:\n  - {name: per-ip, key: [identity], limit: 2, window: 1m}\n",
        &up.url(),
    );
    let sent = format!("00-{TRACE}-{PARENT}-01");
    let r = send(
        gw.listen,
        "GET",
        "/headers",
        &[("traceparent", &sent), ("tracestate", "vendor=abc")],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    let received = r
        .body
        .lines()
        .find_map(|l| l.strip_prefix("traceparent: "))
        .expect("the upstream received a traceparent")
        .to_owned();
    assert!(r.body.contains("tracestate: vendor=abc"), "{}", r.body);
    assert!(received.starts_with(&format!("00-{TRACE}-")), "{received}");
    assert!(received.ends_with("-01"), "{received}");
    assert_ne!(
        &received[36..52],
        PARENT,
        "the gateway's span, not the client's"
    );
    // Two more: the third is refused.
    assert_eq!(send(gw.listen, "GET", "/x", &[], "").await.status, 200);
    assert_eq!(send(gw.listen, "GET", "/x", &[], "").await.status, 429);

    let servers = receiver.wait(3, |s| s["kind"] == 2);
    let server = servers
        .iter()
        .find(|s| s["trace_id"] == TRACE)
        .expect("the client's trace");
    assert_eq!(server["parent"], PARENT);
    assert_eq!(server["trace_state"], "vendor=abc");
    assert_eq!(attr(server, "http.request.method"), "GET");
    assert_eq!(attr(server, "url.path"), "/headers");
    assert_eq!(attr(server, "http.response.status_code"), 200);
    assert_eq!(attr(server, "ratewarden.rule"), "per-ip");
    assert_eq!(attr(server, "ratewarden.limited"), false);
    assert_eq!(attr(server, "ratewarden.remaining"), 1);
    assert_eq!(attr(server, "ratewarden.key"), "127.0.0.1");
    assert!(attr(server, "ratewarden.reset_after").as_i64().unwrap() > 0);
    assert_eq!(server["resource"]["service.name"], "edge");
    let id = server["span_id"].as_str().unwrap();
    let children = receiver.wait(2, |s| s["parent"] == id);
    let store = children
        .iter()
        .find(|s| s["name"] == "ratewarden decide")
        .expect("a store span");
    assert_eq!(attr(store, "db.system.name"), "memory");
    assert_eq!(store["kind"], 3);
    let upstream = children
        .iter()
        .find(|s| s["name"] == "GET")
        .expect("an upstream span");
    assert_eq!(upstream["kind"], 3);
    assert_eq!(
        upstream["span_id"],
        &received[36..52],
        "the upstream's parent is this span"
    );
    assert_eq!(
        attr(upstream, "server.address"),
        up.addr.to_string().as_str()
    );
    assert!(server["start"].as_u64() <= store["start"].as_u64());
    assert!(store["end"].as_u64() <= upstream["start"].as_u64());
    assert!(upstream["end"].as_u64() <= server["end"].as_u64());

    let refused = servers
        .iter()
        .find(|s| attr(s, "http.response.status_code") == 429)
        .expect("the refused request's span");
    assert_eq!(attr(refused, "ratewarden.limited"), true);
    assert_eq!(attr(refused, "ratewarden.remaining"), 0);
    assert_eq!(refused["status"]["code"], 2, "an error");
    let why = refused["status"]["message"].as_str().unwrap();
    assert!(why.contains("per-ip"), "{why}");
    // A refused request went nowhere: no upstream span under it.
    let rid = refused["span_id"].as_str().unwrap();
    std::thread::sleep(Duration::from_millis(1_200));
    let under: Vec<_> = receiver
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s["parent"] == rid)
        .cloned()
        .collect();
    assert_eq!(under.len(), 1, "only the decision's span: {under:#?}");
}

/// The standard variables win over the file: the endpoint and protocol
/// (gRPC here, the file says HTTP to a dead port), the service's name and
/// resource attributes, and the sampler: `parentbased_traceidratio` at 0
/// records no trace that starts here, and still every one a parent
/// sampled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_otel_variables_win_over_the_file_over_grpc() {
    let receiver = Receiver::start("grpc");
    let up = Upstream::start().await;
    let dir = scratch_dir("rw-trace");
    let file = dir.join("rw.yaml");
    std::fs::write(
        &file,
        "tracing:\n  otlp: {endpoint: 'http://127.0.0.1:1', protocol: http/protobuf}\n  sample: 1\n  service_name: from-file\n",
    )
    .unwrap();
    let endpoint = format!("http://127.0.0.1:{}", receiver.port);
    let gw = spawn_binary(
        &file,
        &up.url(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ("OTEL_SERVICE_NAME", "from-env"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=test,team=edge%20ops",
            ),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0"),
        ],
        Some(dir),
    );
    for _ in 0..5 {
        assert_eq!(
            send(gw.listen, "GET", "/unsampled", &[], "").await.status,
            200
        );
    }
    let sent = format!("00-{TRACE}-{PARENT}-01");
    assert_eq!(
        send(gw.listen, "GET", "/sampled", &[("traceparent", &sent)], "")
            .await
            .status,
        200
    );
    // Unsampled by its parent: not recorded, and passed on as it came.
    let unsampled = format!("00-{TRACE}-{PARENT}-00");
    let r = send(
        gw.listen,
        "GET",
        "/headers",
        &[("traceparent", &unsampled)],
        "",
    )
    .await;
    assert!(
        r.body.contains(&format!("traceparent: {unsampled}")),
        "{}",
        r.body
    );
    let got = receiver.wait(1, |s| s["kind"] == 2);
    std::thread::sleep(Duration::from_millis(1_500));
    let servers: Vec<Value> = receiver
        .spans
        .lock()
        .unwrap()
        .iter()
        .filter(|s| s["kind"] == 2)
        .cloned()
        .collect();
    assert_eq!(
        servers.len(),
        1,
        "only the sampled parent's request: {servers:#?}"
    );
    let s = &got[0];
    assert_eq!(attr(s, "url.path"), "/sampled");
    assert_eq!(s["resource"]["service.name"], "from-env");
    assert_eq!(s["resource"]["deployment.environment"], "test");
    assert_eq!(s["resource"]["team"], "edge ops");
    assert_eq!(s["scope"], "ratewarden");
}

/// RSS of `pid`, in kB.
fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A collector that is not there: every request still answered as before
/// (the spans wait in a bounded queue, off the request's thread), the
/// spans that could not go counted as dropped, and the gateway's memory
/// flat while it lasts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_collector_costs_the_request_path_nothing_and_memory_stays_flat() {
    let up = Upstream::start().await;
    // A port with nothing on it.
    let gw = traced(support::free_port(), "grpc", "  sample: 1\n", &up.url());
    let pid = gw.child.id();
    let burst = |n: usize| async move {
        let mut tasks = vec![];
        for t in 0..8 {
            tasks.push(tokio::spawn(async move {
                let mut ok = 0;
                for i in 0..n / 8 {
                    let r = send(gw_listen(), "GET", &format!("/p/{t}/{i}"), &[], "").await;
                    ok += usize::from(r.status == 200);
                }
                ok
            }));
        }
        let mut ok = 0;
        for t in tasks {
            ok += t.await.unwrap();
        }
        ok
    };
    LISTEN.set(gw.listen).ok();
    assert_eq!(burst(4_000).await, 4_000);
    let warm = rss_kb(pid);
    assert_eq!(burst(12_000).await, 12_000);
    let after = rss_kb(pid);
    wait_for_metric(gw.admin, "ratewarden_trace_spans_dropped_total").await;
    let m = send(gw.admin, "GET", "/metrics", &[], "").await.body;
    let dropped: u64 = m
        .lines()
        .find_map(|l| l.strip_prefix("ratewarden_trace_spans_dropped_total "))
        .unwrap()
        .parse()
        .unwrap();
    eprintln!(
        "dead collector: RSS {warm} kB after 4,000 requests, {after} kB after 16,000; {dropped} spans dropped"
    );
    assert!(dropped > 0, "spans dropped are counted");
    // 12,000 requests' spans (3 each) would be megabytes if kept.
    assert!(after < warm + 4_096, "RSS grew from {warm} to {after} kB");
}

static LISTEN: std::sync::OnceLock<std::net::SocketAddr> = std::sync::OnceLock::new();

fn gw_listen() -> std::net::SocketAddr {
    *LISTEN.get().unwrap()
}

/// Exemplars: the real Prometheus (Debian's), with exemplar storage on,
/// scrapes `/metrics` (asking for OpenMetrics, as it does) and keeps a
/// sampled request's trace id beside the refusing rule's count and the
/// decision histogram's bucket; read back through its API.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_keeps_a_refusals_trace_as_an_exemplar() {
    let prometheus = support::tool("prometheus", "prometheus");
    let receiver = Receiver::start("http");
    let up = Upstream::start().await;
    let gw = traced(
        receiver.port,
        "http/protobuf",
        "rules:\n  - {name: tight, key: [identity], limit: 1, window: 1h}\n",
        &up.url(),
    );
    // OpenMetrics when asked: counters named without `_total`, `# EOF`.
    let om = send(
        gw.admin,
        "GET",
        "/metrics",
        &[("accept", "application/openmetrics-text; version=1.0.0")],
        "",
    )
    .await;
    assert_eq!(
        om.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    assert!(om.body.ends_with("# EOF\n"));
    assert!(
        om.body.contains("# TYPE ratewarden_requests counter"),
        "{}",
        om.body
    );
    assert_eq!(send(gw.listen, "GET", "/a", &[], "").await.status, 200);
    let sent = format!("00-{TRACE}-{PARENT}-01");
    assert_eq!(
        send(gw.listen, "GET", "/b", &[("traceparent", &sent)], "")
            .await
            .status,
        429
    );
    let om = send(
        gw.admin,
        "GET",
        "/metrics",
        &[("accept", "application/openmetrics-text")],
        "",
    )
    .await
    .body;
    let line = om
        .lines()
        .find(|l| l.starts_with("ratewarden_requests_total{rule=\"tight\",decision=\"rejected\"}"))
        .unwrap();
    assert!(
        line.contains(&format!("# {{trace_id=\"{TRACE}\"}} 1 ")),
        "{line}"
    );

    let work = scratch_dir("rw-prom");
    let port = support::free_port();
    std::fs::write(
        work.join("prometheus.yml"),
        format!(
            "global: {{scrape_interval: 1s}}\nscrape_configs:\n  - job_name: ratewarden\n    static_configs: [{{targets: ['{}']}}]\n",
            gw.admin
        ),
    )
    .unwrap();
    let child = Command::new(&prometheus)
        .arg(format!(
            "--config.file={}",
            work.join("prometheus.yml").display()
        ))
        .arg(format!(
            "--storage.tsdb.path={}",
            work.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .arg("--enable-feature=exemplar-storage")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _prom = support::Stopped(child, Some(work));
    let api: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    support::wait_until_up(api).await;
    let now = support::now() / 1_000_000;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let q = format!(
            "/api/v1/query_exemplars?query=ratewarden_requests_total&start={}&end={}",
            now - 600,
            now + 600
        );
        let r = send(api, "GET", &q, &[], "").await;
        if r.body.contains(TRACE) {
            let v: Value = serde_json::from_str(&r.body).unwrap();
            let series = &v["data"][0];
            assert_eq!(series["seriesLabels"]["rule"], "tight", "{v:#}");
            assert_eq!(series["seriesLabels"]["decision"], "rejected", "{v:#}");
            assert_eq!(series["exemplars"][0]["labels"]["trace_id"], TRACE, "{v:#}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no exemplar in Prometheus: {}",
            r.body
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // The decision histogram's too.
    let q = format!(
        "/api/v1/query_exemplars?query=ratewarden_decision_duration_seconds_bucket&start={}&end={}",
        now - 600,
        now + 600
    );
    let r = send(api, "GET", &q, &[], "").await;
    assert!(r.body.contains(TRACE), "{}", r.body);
}

/// Envoy's rate limit service: a `ShouldRateLimit` call whose gRPC
/// metadata carries a sampled `traceparent` (as Envoy sends its span) is a
/// server span in that trace, with OpenTelemetry's RPC attributes, its
/// domain, and whether it was over a limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_rls_call_is_a_span_under_envoys() {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::{
        RateLimitDescriptor, rate_limit_descriptor::Entry,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
    let receiver = Receiver::start("http");
    let gw = support::gateway(
        &format!(
            "tracing:\n  otlp: {{endpoint: 'http://127.0.0.1:{}', protocol: http/protobuf}}\n  sample: 0\nrls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: app\n      descriptors:\n        - key: client\n          rate_limit: {{unit: minute, requests_per_unit: 1}}\n",
            receiver.port
        ),
        "echo",
        None,
    )
    .await;
    let mut client = RateLimitServiceClient::connect(format!("http://{}", gw.rls.unwrap()))
        .await
        .unwrap();
    let ask = || {
        let mut r = tonic::Request::new(RateLimitRequest {
            domain: "app".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "client".into(),
                    value: "a".into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        });
        r.metadata_mut().insert(
            "traceparent",
            format!("00-{TRACE}-{PARENT}-01").parse().unwrap(),
        );
        r
    };
    client.should_rate_limit(ask()).await.unwrap();
    client.should_rate_limit(ask()).await.unwrap();
    // Not sampled here (`sample: 0`) and no parent: no span.
    client
        .should_rate_limit(RateLimitRequest {
            domain: "app".into(),
            descriptors: vec![RateLimitDescriptor {
                entries: vec![Entry {
                    key: "client".into(),
                    value: "b".into(),
                }],
                ..Default::default()
            }],
            ..Default::default()
        })
        .await
        .unwrap();
    let spans = receiver.wait(2, |s| {
        s["name"] == "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
    });
    for s in &spans {
        assert_eq!(s["trace_id"], TRACE);
        assert_eq!(s["parent"], PARENT);
        assert_eq!(s["kind"], 2);
        assert_eq!(attr(s, "rpc.system"), "grpc");
        assert_eq!(attr(s, "ratewarden.domain"), "app");
    }
    let limited: Vec<bool> = spans
        .iter()
        .map(|s| attr(s, "ratewarden.limited").as_bool().unwrap())
        .collect();
    assert!(
        limited.contains(&true) && limited.contains(&false),
        "{limited:?}"
    );
    std::thread::sleep(Duration::from_millis(1_200));
    assert_eq!(
        receiver.spans.lock().unwrap().len(),
        2,
        "the unsampled call made no span"
    );
    gw.shutdown().await;
}
