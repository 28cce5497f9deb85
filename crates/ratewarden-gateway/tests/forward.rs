//! What both HTTP paths must do alike (`proxy::forward`), one test body
//! each, run against both: over HTTP/1.1 (the gateway's own path) and over
//! HTTP/2 cleartext (hyper's path), as limitador runs one test body per
//! storage backend.

mod support;

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::{Reply, Upstream, gateway};

/// A client on one of the two paths.
#[derive(Clone, Copy)]
enum Path {
    /// HTTP/1.1: the gateway's own path.
    H1,
    /// h2c: hyper's path.
    H2,
}

async fn send(
    path: Path,
    addr: SocketAddr,
    method: &str,
    target: &str,
    headers: &[(&str, &str)],
) -> Reply {
    let builder = Client::builder(TokioExecutor::new());
    let client = match path {
        Path::H1 => builder.build_http::<Full<Bytes>>(),
        Path::H2 => {
            let mut b = builder;
            b.http2_only(true);
            b.build_http()
        }
    };
    let mut b = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{target}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client
        .request(b.body(Full::new(Bytes::new())).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body =
        String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned();
    Reply {
        status,
        headers,
        body,
    }
}

support::both_paths!(
    the_upstream_prefix_comes_before_the_target,
    x_forwarded_for_carries_the_chain_and_the_peer,
    hop_by_hop_fields_go_neither_way,
    host_is_the_upstream_s,
    underscore_names_are_dropped,
    an_unreachable_upstream_is_a_502_naming_why,
    a_slow_upstream_is_a_504,
    a_rejection_reads_the_same,
    the_request_id_goes_upstream_and_back,
    x_forwarded_host_proto_and_port_are_set_and_a_client_s_replaced,
    a_trusted_proxy_s_x_forwarded_fields_are_kept,
    preserve_host_sends_the_client_s_host,
    request_headers_set_and_remove_fields_upstream,
    forwarded_rfc7239_on_request_with_the_same_trust_rule,
);

/// The fields the test upstream received (`/headers`: `name: value` lines),
/// every value of `name`.
fn received<'a>(body: &'a str, name: &str) -> Vec<&'a str> {
    body.lines()
        .filter_map(|l| l.strip_prefix(&format!("{name}: ")))
        .collect()
}

/// What a Django app behind the gateway reads: the Host the client asked
/// for, its scheme and port, whatever the client claimed under those names.
async fn x_forwarded_host_proto_and_port_are_set_and_a_client_s_replaced(path: Path) {
    let up = Upstream::start().await;
    let gw = gateway("rules: []\n", &up.url(), None).await;
    let spoofed = [
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "evil.example"),
        ("x-forwarded-port", "443"),
    ];
    let r = send(path, gw.listen(), "GET", "/headers", &spoofed).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    let asked = gw.listen().to_string();
    assert_eq!(
        received(&r.body, "x-forwarded-host"),
        [asked.as_str()],
        "{}",
        r.body
    );
    assert_eq!(
        received(&r.body, "x-forwarded-proto"),
        ["http"],
        "{}",
        r.body
    );
    let port = gw.listen().port().to_string();
    assert_eq!(
        received(&r.body, "x-forwarded-port"),
        [port.as_str()],
        "{}",
        r.body
    );
    // Host stays the upstream's by default (nginx's `$proxy_host`).
    assert_eq!(received(&r.body, "host"), [up.addr.to_string().as_str()]);
    gw.shutdown().await;
}

/// From a peer in `identity.trusted_proxies`, each `X-Forwarded-*` field it
/// sent is kept (the proxy in front knows the scheme); those it did not
/// send are set.
async fn a_trusted_proxy_s_x_forwarded_fields_are_kept(path: Path) {
    let up = Upstream::start().await;
    let gw = gateway(
        "identity: {trusted_proxies: [127.0.0.1]}\nrules: []\n",
        &up.url(),
        None,
    )
    .await;
    let sent = [
        ("x-forwarded-proto", "https"),
        ("x-forwarded-host", "shop.example"),
    ];
    let r = send(path, gw.listen(), "GET", "/headers", &sent).await;
    assert_eq!(
        received(&r.body, "x-forwarded-proto"),
        ["https"],
        "{}",
        r.body
    );
    assert_eq!(
        received(&r.body, "x-forwarded-host"),
        ["shop.example"],
        "{}",
        r.body
    );
    let port = gw.listen().port().to_string();
    assert_eq!(
        received(&r.body, "x-forwarded-port"),
        [port.as_str()],
        "{}",
        r.body
    );
    gw.shutdown().await;
}

/// `preserve_host: true` (top level, or a route's own) sends the Host the
/// client asked for (an HTTP/2 request's `:authority`), not the server's.
async fn preserve_host_sends_the_client_s_host(path: Path) {
    let up = Upstream::start().await;
    let gw = gateway("preserve_host: true\nrules: []\n", &up.url(), None).await;
    let r = send(path, gw.listen(), "GET", "/headers", &[]).await;
    let asked = gw.listen().to_string();
    assert_eq!(received(&r.body, "host"), [asked.as_str()], "{}", r.body);
    gw.shutdown().await;
    // A route says otherwise for its own requests.
    let yaml = format!(
        "preserve_host: true\nroutes:\n  - name: api\n    match: {{path_prefix: /headers}}\n    preserve_host: false\n    upstream: {}\nrules: []\n",
        up.url()
    );
    let gw = gateway(&yaml, &up.url(), None).await;
    let r = send(path, gw.listen(), "GET", "/headers", &[]).await;
    assert_eq!(
        received(&r.body, "host"),
        [up.addr.to_string().as_str()],
        "{}",
        r.body
    );
    gw.shutdown().await;
}

/// The upstream answers `xff=...;host=...;hop=...;body=...` (see support).
fn field<'a>(body: &'a str, name: &str) -> &'a str {
    body.split(';')
        .find_map(|p| p.strip_prefix(&format!("{name}=")))
        .unwrap_or_else(|| panic!("{name} in {body}"))
}

async fn the_upstream_prefix_comes_before_the_target(path: Path) {
    // The test upstream answers /status/N with N: under the prefix
    // /status, the target /204 reaches /status/204.
    let up = Upstream::start().await;
    let gw = gateway("rules: []\n", &format!("{}/status/", up.url()), None).await;
    let r = send(path, gw.listen(), "GET", "/204?x=1", &[]).await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    gw.shutdown().await;
}

async fn x_forwarded_for_carries_the_chain_and_the_peer(path: Path) {
    let up = Upstream::start().await;
    // By default a client's chain is replaced by its address (it is no
    // trusted proxy): an app that believes one hop sees the client.
    let gw = gateway("rules: []\n", &up.url(), None).await;
    let r = send(
        path,
        gw.listen(),
        "GET",
        "/",
        &[("x-forwarded-for", "203.0.113.1, 10.0.0.2")],
    )
    .await;
    assert_eq!(field(&r.body, "xff"), "127.0.0.1");
    gw.shutdown().await;
    // nginx's way, asked for: the chain, then the peer.
    let gw = gateway("x_forwarded_for: append\nrules: []\n", &up.url(), None).await;
    let r = send(
        path,
        gw.listen(),
        "GET",
        "/",
        &[("x-forwarded-for", "203.0.113.1, 10.0.0.2")],
    )
    .await;
    assert_eq!(field(&r.body, "xff"), "203.0.113.1, 10.0.0.2, 127.0.0.1");
    let r = send(path, gw.listen(), "GET", "/", &[]).await;
    assert_eq!(field(&r.body, "xff"), "127.0.0.1");
    gw.shutdown().await;
}

async fn hop_by_hop_fields_go_neither_way(path: Path) {
    let up = Upstream::start().await;
    let gw = gateway("rules: []\n", &up.url(), None).await;
    // HTTP/2 forbids hop-by-hop fields, so the request side is shown on
    // HTTP/1.1 only; the answer side (the upstream sends `connection:
    // x-secret` and `x-secret`) on both.
    if let Path::H1 = path {
        let r = send(
            path,
            gw.listen(),
            "GET",
            "/",
            &[("x-hop", "1"), ("connection", "x-hop")],
        )
        .await;
        assert_eq!(field(&r.body, "hop"), "false", "{}", r.body);
    }
    let r = send(path, gw.listen(), "GET", "/", &[]).await;
    assert!(r.header("x-secret").is_none(), "{:?}", r.headers);
    assert!(r.header("connection").is_none(), "{:?}", r.headers);
    gw.shutdown().await;
}

async fn host_is_the_upstream_s(path: Path) {
    let up = Upstream::start().await;
    let gw = gateway("rules: []\n", &up.url(), None).await;
    let r = send(path, gw.listen(), "GET", "/", &[]).await;
    assert_eq!(field(&r.body, "host"), up.addr.to_string());
    gw.shutdown().await;
}

async fn underscore_names_are_dropped(path: Path) {
    let up = Upstream::start().await;
    let gw = gateway("identity: {from: header, header: x-user}\nrules:\n  - name: r\n    limit: 1\n    window: 1m\n", &up.url(), None).await;
    // `x_user` would read as `x-user` to a CGI backend: it is neither
    // forwarded nor read as the identity (which falls back to the address).
    let r = send(path, gw.listen(), "GET", "/", &[("x_user", "someone")]).await;
    assert_eq!(r.status, 200);
    let r = send(path, gw.listen(), "GET", "/", &[("x_user", "someone-else")]).await;
    assert_eq!(r.status, 429, "both were 127.0.0.1");
    gw.shutdown().await;
}

async fn an_unreachable_upstream_is_a_502_naming_why(path: Path) {
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dead = held.local_addr().unwrap();
    let gw = gateway(
        "rules:\n  - name: r\n    limit: 5\n    window: 1m\n",
        &format!("http://{dead}"),
        None,
    )
    .await;
    let r = send(path, gw.listen(), "GET", "/", &[]).await;
    assert_eq!(r.status, StatusCode::BAD_GATEWAY);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert!(
        r.body
            .contains("the upstream could not be reached: could not connect"),
        "{}",
        r.body
    );
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("4"),
        "it was admitted"
    );
    gw.shutdown().await;
}

async fn a_slow_upstream_is_a_504(path: Path) {
    let up = Upstream::start().await;
    let gw = gateway("upstream_timeout: 200ms\nrules: []\n", &up.url(), None).await;
    let r = send(path, gw.listen(), "GET", "/slow", &[]).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(r.body.contains("did not answer within 200ms"), "{}", r.body);
    gw.shutdown().await;
}

async fn a_rejection_reads_the_same(path: Path) {
    let up = Upstream::start().await;
    let clock = ratewarden::clock::ManualClock::new(support::now());
    let gw = gateway(
        "rules:\n  - name: coupon\n    limit: 1\n    window: 1m\n    penalty: 10m\n",
        &up.url(),
        Some(clock),
    )
    .await;
    send(path, gw.listen(), "GET", "/", &[]).await;
    let r = send(path, gw.listen(), "GET", "/", &[]).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    assert_eq!(
        r.body,
        r#"{"type":"https://iana.org/assignments/http-problem-types#quota-exceeded","title":"Too Many Requests","status":429,"violated-policies":["coupon"],"rule":"coupon","retry_after":600,"detail":"limit of rule coupon exceeded; banned for 600 s"}"#
    );
    for (name, value) in [
        ("retry-after", "600"),
        ("x-ratelimit-limit", "1"),
        ("x-ratelimit-remaining", "0"),
        ("x-ratelimit-reset", "600"),
        ("x-ratelimit-retry-after", "600"),
        ("ratelimit-policy", "\"coupon\";q=1;w=60"),
        ("ratelimit", "\"coupon\";r=0;t=600"),
    ] {
        assert_eq!(r.header(name), Some(value), "{name}");
    }
    gw.shutdown().await;
}

/// `X-Request-Id`: a valid one is kept, a missing or unsafe one replaced by
/// a UUIDv7; the same id reaches the upstream and comes back, on
/// forwarded requests and on rejections.
async fn the_request_id_goes_upstream_and_back(path: Path) {
    let up = Upstream::start().await;
    let gw = gateway(
        "rules:\n  - {name: two, limit: 2, window: 1h}\n",
        &up.url(),
        None,
    )
    .await;
    let r = send(
        path,
        gw.listen(),
        "GET",
        "/",
        &[("x-request-id", "trace-42.a:b")],
    )
    .await;
    assert_eq!(r.header("x-request-id"), Some("trace-42.a:b"));
    assert_eq!(field(&r.body, "rid"), "trace-42.a:b");
    let r = send(
        path,
        gw.listen(),
        "GET",
        "/",
        &[("x-request-id", "no spaces \"please\"")],
    )
    .await;
    let made = r.header("x-request-id").unwrap().to_owned();
    assert_eq!(made.len(), 36, "a UUID: {made}");
    assert_eq!(&made[14..15], "7", "version 7: {made}");
    assert_eq!(field(&r.body, "rid"), made, "the same id upstream");
    let rejected = send(path, gw.listen(), "GET", "/", &[]).await;
    assert_eq!(rejected.status, StatusCode::TOO_MANY_REQUESTS);
    let id = rejected.header("x-request-id").unwrap();
    assert!(id.len() == 36 && id != made, "{id}");
    gw.shutdown().await;
}

/// A route's `request_headers` sets fields (replacing the client's, Host
/// too) and removes others; the top level's serves routes without their
/// own.
async fn request_headers_set_and_remove_fields_upstream(path: Path) {
    let up = Upstream::start().await;
    let yaml = format!(
        "request_headers: {{set: {{X-Env: top}}}}\nroutes:\n  - name: api\n    match: {{path_prefix: /headers}}\n    upstream: {}\n    request_headers:\n      set: {{Host: api.internal, X-Tenant: acme, X-Forwarded-Proto: https}}\n      remove: [X-Debug, Cookie]\nrules: []\n",
        up.url()
    );
    let gw = gateway(&yaml, &up.url(), None).await;
    let sent = [
        ("x-tenant", "spoofed"),
        ("x-debug", "1"),
        ("cookie", "session=secret"),
        ("x-kept", "yes"),
    ];
    let r = send(path, gw.listen(), "GET", "/headers", &sent).await;
    assert_eq!(received(&r.body, "host"), ["api.internal"], "{}", r.body);
    assert_eq!(received(&r.body, "x-tenant"), ["acme"], "{}", r.body);
    assert_eq!(
        received(&r.body, "x-forwarded-proto"),
        ["https"],
        "{}",
        r.body
    );
    assert!(received(&r.body, "x-debug").is_empty(), "{}", r.body);
    assert!(received(&r.body, "cookie").is_empty(), "{}", r.body);
    assert_eq!(received(&r.body, "x-kept"), ["yes"], "{}", r.body);
    assert!(
        received(&r.body, "x-env").is_empty(),
        "the route's own replace the top level's"
    );
    // The default route takes the top level's.
    let r = send(path, gw.listen(), "GET", "/status/200", &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    gw.shutdown().await;
    let gw = gateway(
        "request_headers: {set: {X-Env: top}}\nrules: []\n",
        &up.url(),
        None,
    )
    .await;
    let r = send(path, gw.listen(), "GET", "/headers", &[]).await;
    assert_eq!(received(&r.body, "x-env"), ["top"], "{}", r.body);
    gw.shutdown().await;
}

/// `forwarded: true` adds an RFC 7239 `Forwarded` element for this hop:
/// a client's own is replaced, a trusted proxy's kept with ours after it.
async fn forwarded_rfc7239_on_request_with_the_same_trust_rule(path: Path) {
    let up = Upstream::start().await;
    let ours = |gw: &ratewarden_gateway::server::Running| {
        format!("for=127.0.0.1;host=\"{}\";proto=http", gw.listen())
    };
    let claim = [("forwarded", "for=203.0.113.9;proto=https")];
    let gw = gateway("forwarded: true\nrules: []\n", &up.url(), None).await;
    let r = send(path, gw.listen(), "GET", "/headers", &claim).await;
    assert_eq!(
        received(&r.body, "forwarded"),
        [ours(&gw).as_str()],
        "{}",
        r.body
    );
    gw.shutdown().await;
    let gw = gateway(
        "forwarded: true\nidentity: {trusted_proxies: [127.0.0.1]}\nrules: []\n",
        &up.url(),
        None,
    )
    .await;
    let r = send(path, gw.listen(), "GET", "/headers", &claim).await;
    let chained = format!("for=203.0.113.9;proto=https, {}", ours(&gw));
    assert_eq!(
        received(&r.body, "forwarded"),
        [chained.as_str()],
        "{}",
        r.body
    );
    gw.shutdown().await;
    // Off by default: nothing added.
    let gw = gateway("rules: []\n", &up.url(), None).await;
    let r = send(path, gw.listen(), "GET", "/headers", &[]).await;
    assert!(received(&r.body, "forwarded").is_empty(), "{}", r.body);
    gw.shutdown().await;
}
