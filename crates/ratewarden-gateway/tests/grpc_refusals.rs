//! Refusals gRPC clients understand (issue 37, its first part): a gRPC
//! call refused by a limit is HTTP 200, trailers-only, `grpc-status: 8`
//! (RESOURCE_EXHAUSTED) with `grpc-message` naming the rule and
//! `Retry-After` and the rate-limit headers as metadata; `deny:` is 7
//! (PERMISSION_DENIED), a store failure under `on_error: deny` 14
//! (UNAVAILABLE). A real tonic client (grpc.health.v1's) sees the codes;
//! grpc-web gets the trailers as the body's trailer frame, on both paths.

mod support;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use support::gateway;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

const YAML: &str = r#"identity: {from: header, header: x-user}
deny: [mallory]
rules:
  - {name: health-calls, match: {path_prefix: /grpc.health.v1.Health/}, limit: 1, window: 1h}
"#;

async fn call(addr: std::net::SocketAddr, user: &str) -> tonic::Status {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    let mut req = tonic::Request::new(HealthCheckRequest {
        service: String::new(),
    });
    req.metadata_mut().insert("x-user", user.parse().unwrap());
    client
        .check(req)
        .await
        .expect_err("the upstream is not a gRPC server")
}

#[tokio::test]
async fn a_tonic_client_sees_resource_exhausted_permission_denied_and_unavailable() {
    let gw = gateway(YAML, "echo", None).await;
    // The first call goes on (to an upstream that is no gRPC server: some
    // error); the second is refused by the limit.
    let first = call(gw.listen(), "alice").await;
    assert_ne!(first.code(), Code::ResourceExhausted, "{first:?}");
    let refused = call(gw.listen(), "alice").await;
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("health-calls"), "{refused:?}");
    let retry: u64 = refused
        .metadata()
        .get("retry-after")
        .unwrap()
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=7200).contains(&retry), "{retry}");
    assert_eq!(
        refused.metadata().get("x-ratelimit-remaining").unwrap(),
        "0"
    );
    let denied = call(gw.listen(), "mallory").await;
    assert_eq!(denied.code(), Code::PermissionDenied, "{denied:?}");
    gw.shutdown().await;

    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let down = gateway(
        &format!("store: {{type: redis, url: 'redis://{closed}', timeout: 100ms, on_error: deny}}\n{YAML}"),
        "echo",
        None,
    )
    .await;
    let unavailable = call(down.listen(), "bob").await;
    assert_eq!(unavailable.code(), Code::Unavailable, "{unavailable:?}");
    down.shutdown().await;
}

/// A grpc-web call refused: 200, the status in the headers and as the
/// body's trailer frame (flag 0x80, a length, `name: value` lines).
async fn grpc_web_refusal(h2: bool) {
    let gw = gateway(YAML, "echo", None).await;
    let stream = tokio::net::TcpStream::connect(gw.listen()).await.unwrap();
    let io = TokioIo::new(stream);
    let req = || {
        let b = http::Request::builder().method("POST");
        let b = if h2 {
            b.uri(format!(
                "http://{}/grpc.health.v1.Health/Check",
                gw.listen()
            ))
        } else {
            b.uri("/grpc.health.v1.Health/Check")
                .header("host", "app.example")
        };
        b.header("content-type", "application/grpc-web+proto")
            .header("x-user", "carol")
            .header("x-grpc-web", "1")
            .body(Full::new(Bytes::from_static(&[0, 0, 0, 0, 0])))
            .unwrap()
    };
    let mut last = None;
    if h2 {
        let (mut s, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .unwrap();
        tokio::spawn(conn);
        for _ in 0..2 {
            let r = s.send_request(req()).await.unwrap();
            let (parts, body) = r.into_parts();
            last = Some((parts, body.collect().await.unwrap().to_bytes()));
        }
    } else {
        let (mut s, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(conn);
        for _ in 0..2 {
            let r = s.send_request(req()).await.unwrap();
            let (parts, body) = r.into_parts();
            last = Some((parts, body.collect().await.unwrap().to_bytes()));
        }
    }
    let (parts, body) = last.unwrap();
    check_web(
        parts.status,
        parts.headers.get("content-type").cloned(),
        parts.headers.get("grpc-status").cloned(),
        &body,
    );
    gw.shutdown().await;
}

fn check_web(
    status: http::StatusCode,
    ct: Option<http::HeaderValue>,
    grpc_status: Option<http::HeaderValue>,
    body: &[u8],
) {
    assert_eq!(status, 200);
    assert_eq!(ct.unwrap(), "application/grpc-web+proto");
    assert_eq!(grpc_status.unwrap(), "8");
    assert_eq!(body[0], 0x80, "a trailer frame");
    let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
    let block = std::str::from_utf8(&body[5..5 + len]).unwrap();
    assert!(block.contains("grpc-status: 8\r\n"), "{block}");
    assert!(
        block.contains("grpc-message: rate limited by rule `health-calls`"),
        "{block}"
    );
    assert!(block.contains("retry-after: "), "{block}");
}

#[tokio::test]
async fn a_grpc_web_refusal_carries_its_trailers_in_the_body_on_http1() {
    grpc_web_refusal(false).await;
}

#[tokio::test]
async fn a_grpc_web_refusal_carries_its_trailers_in_the_body_on_h2c() {
    grpc_web_refusal(true).await;
}
