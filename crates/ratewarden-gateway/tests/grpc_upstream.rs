//! gRPC services behind the gateway (issue 37): a tonic client calls a
//! tonic server (grpc.health.v1 and server reflection, real tonic
//! services) through the gateway, to an `h2c://` upstream: a unary call, a
//! server stream and a bidirectional stream go through with their
//! trailers, and the limit refuses with RESOURCE_EXHAUSTED.

mod grpc_echo;
mod support;

use std::net::SocketAddr;

use tokio_stream_shim::once_then_open;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

/// A tonic server on a free port: health (SERVING for `svc`) and
/// reflection.
async fn tonic_server() -> SocketAddr {
    tonic_server_reporting().await.0
}

/// [`tonic_server`], and its health reporter, to change what it says.
async fn tonic_server_reporting() -> (SocketAddr, tonic_health::server::HealthReporter) {
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("svc", tonic_health::ServingStatus::Serving)
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let kept = reporter.clone();
    tokio::spawn(async move {
        let _reporter = kept;
        tonic::transport::Server::builder()
            .add_service(health)
            .add_service(reflection)
            .serve_with_incoming(tokio_stream_shim::incoming(listener))
            .await
            .unwrap();
    });
    (addr, reporter)
}

mod tokio_stream_shim {
    //! The two small streams the test needs, without another crate.

    /// A listener's connections as a stream.
    pub(crate) fn incoming(
        l: tokio::net::TcpListener,
    ) -> impl futures_util::Stream<Item = std::io::Result<tokio::net::TcpStream>> {
        futures_util::stream::unfold(l, |l| async move {
            let r = l.accept().await.map(|(s, _)| s);
            Some((r, l))
        })
    }

    /// One item, then a stream that stays open (a client stream that has
    /// not ended) until `end` fires.
    pub(crate) fn once_then_open<T: Send + 'static>(
        item: T,
        end: tokio::sync::oneshot::Receiver<()>,
    ) -> impl futures_util::Stream<Item = T> + Send + 'static {
        futures_util::stream::unfold((Some(item), Some(end)), |(item, end)| async move {
            match item {
                Some(i) => Some((i, (None, end))),
                None => {
                    if let Some(e) = end {
                        let _ = e.await;
                    }
                    None
                }
            }
        })
    }
}

async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_server_and_bidi_streams_through_the_gateway_to_an_h2c_server() {
    let server = tonic_server().await;
    let gw = support::gateway(
        "rules:\n  - {name: health, match: {path_prefix: /grpc.health.v1.Health/}, key: [global], limit: 3, window: 1h}\n",
        &format!("h2c://{server}"),
        None,
    )
    .await;
    let ch = channel(gw.listen()).await;
    let mut health = HealthClient::new(ch.clone());
    // Unary: its answer and its trailers (grpc-status 0) through.
    let r = health
        .check(HealthCheckRequest {
            service: "svc".into(),
        })
        .await
        .unwrap();
    assert_eq!(r.get_ref().status, ServingStatus::Serving as i32);
    assert!(
        r.metadata().get("x-ratelimit-remaining").is_some(),
        "{:?}",
        r.metadata()
    );
    // A status from the server (NOT_FOUND for an unknown service) comes
    // back as the server said it, in its trailers.
    let e = health
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    // Server streaming: Watch's first message arrives while the call is
    // still open.
    let mut watch = health
        .watch(HealthCheckRequest {
            service: "svc".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(std::time::Duration::from_secs(5), watch.message())
        .await
        .expect("streamed, not buffered")
        .unwrap()
        .unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    drop(watch);
    // The limit: 3 calls, then RESOURCE_EXHAUSTED from the gateway.
    let refused = health
        .check(HealthCheckRequest {
            service: "svc".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.metadata().get("retry-after").is_some());
    // Bidirectional: reflection answers a request while the client's
    // stream stays open.
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    let mut refl = ServerReflectionClient::new(ch);
    let (end, ended) = tokio::sync::oneshot::channel();
    let mut answers = refl
        .server_reflection_info(once_then_open(
            ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            },
            ended,
        ))
        .await
        .unwrap()
        .into_inner();
    let listed = tokio::time::timeout(std::time::Duration::from_secs(5), answers.message())
        .await
        .expect("the answer before the client's stream ends")
        .unwrap()
        .unwrap();
    let Some(MessageResponse::ListServicesResponse(l)) = listed.message_response else {
        panic!("{listed:?}")
    };
    assert!(
        l.service.iter().any(|s| s.name == "grpc.health.v1.Health"),
        "{l:?}"
    );
    // The client ends its stream; the server's ends after it.
    drop(end);
    assert!(
        answers.message().await.unwrap().is_none(),
        "the stream ended"
    );
    drop((answers, refl, health));
    gw.shutdown().await;
}

/// `count: failures` on gRPC: the outcome is the call's `grpc-status` (a
/// trailers-only NOT_FOUND, or OK in the trailers at the stream's end),
/// not its HTTP 200: NOT_FOUND is charged, OK forgives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failures_rule_is_charged_by_not_found_and_forgiven_by_ok() {
    let server = tonic_server().await;
    let gw = support::gateway(
        "rules:\n  - {name: probes, match: {path_prefix: /grpc.health.v1.Health/}, key: [global], limit: 2, window: 1h, count: failures}\n",
        &format!("h2c://{server}"),
        None,
    )
    .await;
    let admin = gw.admin.unwrap();
    let health = HealthClient::new(channel(gw.listen()).await);
    // Whether the rule holds any history for the key.
    let exists = || async {
        let v: serde_json::Value = serde_json::from_str(
            &support::send(admin, "GET", "/v1/keys/probes/global", &[], "")
                .await
                .body,
        )
        .unwrap();
        v["exists"].as_bool().unwrap()
    };
    let check = |svc: &'static str| {
        let mut h = health.clone();
        async move {
            h.check(HealthCheckRequest {
                service: svc.into(),
            })
            .await
        }
    };
    assert_eq!(check("nope").await.unwrap_err().code(), Code::NotFound);
    assert!(exists().await, "NOT_FOUND was charged");
    // OK, in the trailers at the stream's end: the history is cleared.
    assert!(check("svc").await.is_ok());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while exists().await {
        assert!(std::time::Instant::now() < deadline, "OK never forgave");
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    // Two failures fit again (without the OK, the second would be over).
    for _ in 0..2 {
        assert_eq!(check("nope").await.unwrap_err().code(), Code::NotFound);
    }
    let refused = check("svc").await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    drop(health);
    gw.shutdown().await;
}

/// `concurrency` holds a slot for as long as a streaming call is open.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrency_slot_is_held_until_the_stream_ends() {
    let server = tonic_server().await;
    let gw = support::gateway(
        "rules:\n  - {name: one-watch, match: {path: /grpc.health.v1.Health/Watch}, key: [global], algorithm: concurrency, limit: 1}\n",
        &format!("h2c://{server}"),
        None,
    )
    .await;
    let mut health = HealthClient::new(channel(gw.listen()).await);
    let watch = |h: &mut HealthClient<Channel>| {
        let mut h = h.clone();
        async move {
            h.watch(HealthCheckRequest {
                service: "svc".into(),
            })
            .await
        }
    };
    let mut first = watch(&mut health).await.unwrap().into_inner();
    assert!(first.message().await.unwrap().is_some());
    let second = watch(&mut health).await.unwrap_err();
    assert_eq!(
        second.code(),
        Code::ResourceExhausted,
        "the stream holds the slot"
    );
    drop(first);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match watch(&mut health).await {
            Ok(s) => {
                drop(s);
                break;
            }
            Err(e) => assert_eq!(e.code(), Code::ResourceExhausted),
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the slot never came back"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    drop(health);
    gw.shutdown().await;
}

/// Unary, server-streaming, client-streaming and bidirectional calls of
/// a tonic service, admitted, then one refused: to an `h2c://` server, and
/// to the same server given as `http://` with `protocol: h2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_four_kinds_of_call_to_an_h2c_server_and_to_protocol_h2() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    let echo = grpc_echo::Echo::default();
    grpc_echo::serve(listener, echo.clone());
    // h2c:// as the upstream.
    let gw = support::gateway(grpc_echo::RULE, &format!("h2c://{server}"), None).await;
    grpc_echo::all_four(tonic::client::Grpc::new(channel(gw.listen()).await), &echo).await;
    // HTTP/2 has no Upgrade: a WebSocket for this server is a 502 saying so.
    let ws = support::send(
        gw.listen(),
        "GET",
        "/ws",
        &[("connection", "upgrade"), ("upgrade", "websocket")],
        "",
    )
    .await;
    assert_eq!(ws.status, 502, "{}", ws.body);
    assert!(ws.body.contains("HTTP/2 only"), "{}", ws.body);
    gw.shutdown().await;
    // http:// with `protocol: h2`, a route's server.
    let yaml = format!(
        "routes:\n  - name: grpc\n    match: {{path_prefix: /echo.Echo/}}\n    upstream:\n      servers: [{{url: \"http://{server}\", protocol: h2}}]\n{}",
        grpc_echo::RULE
    );
    let gw = support::gateway(&yaml, "http://127.0.0.1:9", None).await;
    grpc_echo::all_four(tonic::client::Grpc::new(channel(gw.listen()).await), &echo).await;
    gw.shutdown().await;
}

/// `protocol:` is checked: an unknown one, and `http1` on an `h2c://`
/// server, are config errors naming the key.
#[test]
fn a_bad_protocol_is_a_config_error() {
    for (server, want) in [
        (
            "{url: \"http://127.0.0.1:1\", protocol: h3}",
            "`h3` is not a protocol",
        ),
        (
            "{url: \"h2c://127.0.0.1:1\", protocol: http1}",
            "`protocol: http1` contradicts it",
        ),
    ] {
        let yaml = format!(
            "upstream: http://127.0.0.1:1\nroutes:\n  - name: g\n    match: {{path_prefix: /}}\n    upstream: {{servers: [{server}]}}\nrules: []\n"
        );
        let e = ratewarden_gateway::config::load(
            &yaml,
            "a.yaml",
            &ratewarden_gateway::config::Overrides::default(),
        )
        .unwrap_err();
        let text = e.to_string();
        assert!(text.contains("protocol"), "{text}");
        assert!(text.contains(want), "{text}");
    }
}

/// The active check of an HTTP/2 server speaks HTTP/2: with the path of
/// the gRPC health service's Check, the server is up while it answers
/// SERVING for the named service and down (ejected) while it does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2_server_is_checked_by_the_grpc_health_service() {
    let (server, reporter) = tonic_server_reporting().await;
    let yaml = format!(
        "routes:\n  - name: grpc\n    match: {{path_prefix: /}}\n    upstream:\n      servers: [{{url: \"http://{server}\", protocol: h2}}]\n      health: {{active: {{path: \"/grpc.health.v1.Health/Check?service=svc\", interval: 50ms}}}}\nrules: []\n"
    );
    let gw = support::gateway(&yaml, "http://127.0.0.1:9", None).await;
    let admin = gw.admin.unwrap();
    let up =
        |v: u8| format!("ratewarden_upstream_server_up{{route=\"grpc\",server=\"{server}\"}} {v}");
    let until = |want: String| async move {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        loop {
            let m = support::send(admin, "GET", "/metrics", &[], "").await.body;
            if m.contains(&want) {
                return;
            }
            assert!(std::time::Instant::now() < deadline, "never `{want}`: {m}");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    };
    until(up(1)).await;
    reporter
        .set_service_status("svc", tonic_health::ServingStatus::NotServing)
        .await;
    until(up(0)).await;
    reporter
        .set_service_status("svc", tonic_health::ServingStatus::Serving)
        .await;
    until(up(1)).await;
    gw.shutdown().await;
}
