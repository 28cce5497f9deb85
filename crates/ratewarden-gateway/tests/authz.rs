//! The authorisation listener (issue 36): each proxy hook's contract,
//! decided with the gateway's rules through the one admission path. The
//! requests here are what each proxy sends (nginx's `auth_request`
//! subrequest, Traefik's and Caddy's forward auth, Envoy's HTTP and gRPC
//! `ext_authz`); `authz_proxies.rs` runs the real nginx and Caddy.

mod support;

use std::net::SocketAddr;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::config::core::v3::{Address, SocketAddress, address, socket_address};
use envoy_types::pb::envoy::service::auth::v3::attribute_context::{HttpRequest, Peer, Request};
use envoy_types::pb::envoy::service::auth::v3::{
    AttributeContext, CheckRequest, CheckResponse, check_response,
};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use prost::Message;
use support::{gateway, send};

const YAML: &str = r#"identity: {trusted_proxies: [127.0.0.1/32]}
deny: [198.51.100.66]
authz: {listen: 127.0.0.1:0}
rules:
  - {name: api, match: {path_prefix: /api/}, limit: 2, window: 1h}
"#;

fn authz(g: &ratewarden_gateway::server::Running) -> SocketAddr {
    g.authz.expect("the authz listener")
}

#[tokio::test]
async fn forward_auth_limits_the_request_it_describes_and_refuses_as_the_rule_says() {
    let gw = gateway(YAML, "echo", None).await;
    let a = authz(&gw);
    let h = |uri: &'static str, client: &'static str| {
        [
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", uri),
            ("x-forwarded-host", "app.example"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-for", client),
        ]
    };
    for n in [1, 0] {
        let r = send(
            a,
            "GET",
            "/authz/forward",
            &h("/api/x?q=1", "203.0.113.7"),
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-ratelimit-remaining"), Some(&*n.to_string()));
        assert!(
            r.header("ratelimit-policy")
                .unwrap()
                .contains("\"api\";q=2")
        );
    }
    let refused = send(a, "GET", "/authz/forward", &h("/api/y", "203.0.113.7"), "").await;
    assert_eq!(refused.status, 429);
    assert!(refused.header("retry-after").is_some());
    assert!(
        refused.body.contains("\"rule\":\"api\""),
        "{}",
        refused.body
    );
    // Another client (as the trusted proxy names it), and a path no rule
    // matches.
    let r = send(a, "GET", "/authz/forward", &h("/api/y", "203.0.113.8"), "").await;
    assert_eq!(r.status, 200);
    let r = send(
        a,
        "GET",
        "/authz/forward",
        &h("/static/a.css", "203.0.113.7"),
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("ratelimit-policy"), None);
    // `deny:`: 403.
    let r = send(a, "GET", "/authz/forward", &h("/", "198.51.100.66"), "").await;
    assert_eq!(r.status, 403);
    gw.shutdown().await;
}

#[tokio::test]
async fn nginx_gets_403_with_the_status_it_should_give_and_envoy_http_gets_the_path_after_the_prefix()
 {
    let gw = gateway(YAML, "echo", None).await;
    let a = authz(&gw);
    let nginx = [
        ("x-original-method", "POST"),
        ("x-original-uri", "/api/orders?id=3"),
        ("x-forwarded-for", "203.0.113.9"),
    ];
    for _ in 0..2 {
        assert_eq!(send(a, "GET", "/authz/nginx", &nginx, "").await.status, 200);
    }
    let refused = send(a, "GET", "/authz/nginx", &nginx, "").await;
    assert_eq!(refused.status, 403, "nginx takes 2xx, 401, 403 only");
    assert_eq!(refused.header("x-ratewarden-status"), Some("429"));
    assert!(refused.header("retry-after").is_some());
    let denied = send(
        a,
        "GET",
        "/authz/nginx",
        &[
            ("x-original-method", "GET"),
            ("x-original-uri", "/"),
            ("x-forwarded-for", "198.51.100.66"),
        ],
        "",
    )
    .await;
    assert_eq!(denied.status, 403);
    assert_eq!(denied.header("x-ratewarden-status"), Some("403"));
    // `X-Real-IP` is not the header the operator named (`identity.header`,
    // X-Forwarded-For by default): never read, the client is the proxy.
    let not_named = send(
        a,
        "GET",
        "/authz/nginx",
        &[
            ("x-original-method", "GET"),
            ("x-original-uri", "/"),
            ("x-real-ip", "198.51.100.66"),
        ],
        "",
    )
    .await;
    assert_eq!(not_named.status, 200, "{:?}", not_named.headers);
    // Envoy's HTTP dialect: the method and headers are the original's, the
    // path follows the prefix.
    let envoy = [("x-forwarded-for", "203.0.113.10"), ("host", "app.example")];
    for _ in 0..2 {
        assert_eq!(
            send(a, "DELETE", "/authz/envoy/api/orders/3", &envoy, "")
                .await
                .status,
            200
        );
    }
    let refused = send(a, "DELETE", "/authz/envoy/api/orders/3", &envoy, "").await;
    assert_eq!(refused.status, 429);
    assert_eq!(
        send(a, "GET", "/authz/envoy", &envoy, "").await.status,
        200,
        "the root"
    );
    assert_eq!(send(a, "GET", "/authz/other", &[], "").await.status, 404);
    gw.shutdown().await;
}

/// Hostile or broken hook requests: refused, never guessed; a client
/// address from a peer that is not a trusted proxy is not believed.
#[tokio::test]
async fn bad_hook_requests_are_refused_and_untrusted_forwarding_is_ignored() {
    let gw = gateway(YAML, "echo", None).await;
    let a = authz(&gw);
    for (path, headers, status) in [
        ("/authz/nginx", vec![("x-original-method", "GET")], 403),
        ("/authz/nginx", vec![("x-original-uri", "/api/x")], 403),
        (
            "/authz/forward",
            vec![
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "http://evil.example/api"),
            ],
            400,
        ),
        (
            "/authz/forward",
            vec![("x-forwarded-method", "GET"), ("x-forwarded-uri", "api/x")],
            400,
        ),
        (
            "/authz/forward",
            vec![
                ("x-forwarded-method", "G E T"),
                ("x-forwarded-uri", "/api/x"),
            ],
            400,
        ),
        (
            "/authz/forward",
            vec![
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/api/../../etc"),
            ],
            400,
        ),
        (
            "/authz/forward",
            vec![
                ("x-forwarded-method", "GET"),
                ("x-forwarded-uri", "/api/x"),
                ("x-forwarded-for", "not-an-address"),
            ],
            200,
        ),
    ] {
        let r = send(a, "GET", path, &headers, "").await;
        assert_eq!(r.status, status, "{path} {headers:?}: {}", r.body);
        if path == "/authz/nginx" {
            assert_eq!(r.header("x-ratewarden-status"), Some("400"), "{headers:?}");
        }
    }
    // Not trusted: the peer is the client, whatever it forwards.
    let untrusted = gateway(&YAML.replace("127.0.0.1/32", "10.9.9.9/32"), "echo", None).await;
    let a = authz(&untrusted);
    let mut codes = vec![];
    for spoofed in ["203.0.113.1", "203.0.113.2", "203.0.113.3"] {
        let h = [
            ("x-forwarded-method", "GET"),
            ("x-forwarded-uri", "/api/x"),
            ("x-forwarded-for", spoofed),
        ];
        codes.push(
            send(a, "GET", "/authz/forward", &h, "")
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(codes, [200, 200, 429], "one key: the proxy's address");
    untrusted.shutdown().await;
    gw.shutdown().await;
}

/// A store failure under `on_error: deny`: 503 (nginx: 403 saying 503).
#[tokio::test]
async fn a_store_failure_follows_on_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let yaml = format!(
        "store: {{type: redis, url: 'redis://{closed}', timeout: 100ms, on_error: deny}}\n{YAML}"
    );
    let gw = gateway(&yaml, "echo", None).await;
    let a = authz(&gw);
    let fwd = [("x-forwarded-method", "GET"), ("x-forwarded-uri", "/api/x")];
    assert_eq!(send(a, "GET", "/authz/forward", &fwd, "").await.status, 503);
    let nginx = [("x-original-method", "GET"), ("x-original-uri", "/api/x")];
    let r = send(a, "GET", "/authz/nginx", &nginx, "").await;
    assert_eq!(
        (r.status.as_u16(), r.header("x-ratewarden-status")),
        (403, Some("503"))
    );
    let (code, response) = check(a, "GET", "/api/x", "203.0.113.5").await;
    assert_eq!(code, "0", "the call itself succeeds");
    assert_eq!(response.status.unwrap().code, 14, "UNAVAILABLE");
    match response.http_response {
        Some(check_response::HttpResponse::DeniedResponse(d)) => {
            assert_eq!(d.status.unwrap().code, 503)
        }
        other => panic!("{other:?}"),
    }
    gw.shutdown().await;
}

/// Envoy's gRPC `Check`: a `CheckRequest` as Envoy sends it, over h2c.
/// Returns the call's `grpc-status` and the response.
async fn check(
    addr: SocketAddr,
    method: &str,
    path: &str,
    client: &str,
) -> (String, CheckResponse) {
    let req = CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(Peer {
                address: Some(Address {
                    address: Some(address::Address::SocketAddress(SocketAddress {
                        address: client.into(),
                        port_specifier: Some(socket_address::PortSpecifier::PortValue(40000)),
                        ..Default::default()
                    })),
                }),
                ..Default::default()
            }),
            request: Some(Request {
                http: Some(HttpRequest {
                    method: method.into(),
                    path: path.into(),
                    host: "app.example".into(),
                    scheme: "https".into(),
                    protocol: "HTTP/1.1".into(),
                    headers: [
                        (":authority".to_owned(), "app.example".to_owned()),
                        ("user-agent".to_owned(), "curl".to_owned()),
                    ]
                    .into_iter()
                    .collect(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    let msg = req.encode_to_vec();
    let mut body = BytesMut::new();
    body.put_u8(0);
    body.put_u32(msg.len() as u32);
    body.put_slice(&msg);
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let request = http::Request::builder()
        .method("POST")
        .uri(format!(
            "http://{addr}/envoy.service.auth.v3.Authorization/Check"
        ))
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(body.freeze()))
        .unwrap();
    let resp = sender.send_request(request).await.unwrap();
    assert_eq!(resp.status(), 200);
    let collected = resp.into_body().collect().await.unwrap();
    let trailers = collected.trailers().cloned().unwrap_or_default();
    let mut data: Bytes = collected.to_bytes();
    let code = trailers
        .get("grpc-status")
        .map(|v| v.to_str().unwrap().to_owned())
        .unwrap_or_default();
    assert!(data.len() >= 5, "no message; grpc-status {code}");
    data.advance(5);
    (code, CheckResponse::decode(data).unwrap())
}

#[tokio::test]
async fn envoy_grpc_check_is_answered_as_envoy_expects() {
    let gw = gateway(YAML, "echo", None).await;
    let a = authz(&gw);
    for remaining in ["1", "0"] {
        let (code, r) = check(a, "GET", "/api/items?page=2", "203.0.113.20").await;
        assert_eq!(code, "0");
        assert_eq!(r.status.unwrap().code, 0);
        let Some(check_response::HttpResponse::OkResponse(ok)) = r.http_response else {
            panic!("not ok")
        };
        let added: Vec<(String, String)> = ok
            .response_headers_to_add
            .iter()
            .filter_map(|h| h.header.as_ref().map(|h| (h.key.clone(), h.value.clone())))
            .collect();
        assert!(
            added.contains(&("x-ratelimit-remaining".into(), remaining.into())),
            "{added:?}"
        );
    }
    let (code, r) = check(a, "GET", "/api/items", "203.0.113.20").await;
    assert_eq!(code, "0");
    assert_eq!(r.status.unwrap().code, 7, "PERMISSION_DENIED");
    let Some(check_response::HttpResponse::DeniedResponse(denied)) = r.http_response else {
        panic!("not denied")
    };
    assert_eq!(denied.status.unwrap().code, 429);
    assert!(denied.body.contains("\"rule\":\"api\""), "{}", denied.body);
    assert!(
        denied
            .headers
            .iter()
            .any(|h| h.header.as_ref().is_some_and(|h| h.key == "retry-after")),
        "{:?}",
        denied.headers
    );
    // `deny:` is 403 / PERMISSION_DENIED; another client is its own key.
    let (_, r) = check(a, "GET", "/", "198.51.100.66").await;
    let Some(check_response::HttpResponse::DeniedResponse(denied)) = r.http_response else {
        panic!("not denied")
    };
    assert_eq!(denied.status.unwrap().code, 403);
    let (_, r) = check(a, "GET", "/api/items", "203.0.113.21").await;
    assert!(matches!(
        r.http_response,
        Some(check_response::HttpResponse::OkResponse(_))
    ));
    gw.shutdown().await;
}

#[test]
fn rules_that_need_the_response_are_refused_beside_authz() {
    use ratewarden_gateway::config::{self, Overrides};
    let e = config::load(
        "authz: {listen: 127.0.0.1:8082}\nrules:\n  - {name: coupon, limit: 5, window: 5m, count: failures}\n  - {name: gen, algorithm: concurrency, limit: 1}\n",
        "a.yaml",
        &Overrides::default(),
    )
    .unwrap_err();
    let all = e.all();
    assert_eq!(all.len(), 2, "{e}");
    assert_eq!((all[0].line, all[0].key.as_str()), (3, "count"));
    assert!(
        all[0].message.contains("never sees how it ended"),
        "{}",
        all[0]
    );
    assert_eq!((all[1].line, all[1].key.as_str()), (4, "algorithm"));
    let e = config::load(
        "listen: 127.0.0.1:8080\nauthz: {listen: 127.0.0.1:8080}\n",
        "a.yaml",
        &Overrides::default(),
    )
    .unwrap_err();
    assert_eq!(e.first().key, "authz.listen", "{e}");
    let e = config::load(
        "authz: {listen: nowhere}\n",
        "a.yaml",
        &Overrides::default(),
    )
    .unwrap_err();
    assert_eq!(e.first().key, "authz.listen", "{e}");
}
