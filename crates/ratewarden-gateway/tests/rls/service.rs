//! The listener as a gRPC service: reflection, health, bad calls and slow
//! clients, a store failure, reloads of the descriptor files.

use super::exact::FIFTY;
use super::*;

#[tokio::test]
async fn reflection_lists_the_service_and_health_answers() {
    use tonic_health::pb::health_client::HealthClient;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let gw = gateway(FIFTY, "{type: memory}", None).await;
    let addr = gw.rls.unwrap();
    let channel = Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut refl = ServerReflectionClient::new(channel.clone());
    let ask = |m: MessageRequest| ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    };
    let mut answers = refl
        .server_reflection_info(tokio_stream_of(vec![
            ask(MessageRequest::ListServices(String::new())),
            ask(MessageRequest::FileContainingSymbol(
                "envoy.service.ratelimit.v3.RateLimitService".into(),
            )),
        ]))
        .await
        .unwrap()
        .into_inner();
    let list = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::ListServicesResponse(l)) = list.message_response else {
        panic!("{list:?}");
    };
    let names: Vec<&str> = l.service.iter().map(|s| s.name.as_str()).collect();
    assert!(
        names.contains(&"envoy.service.ratelimit.v3.RateLimitService"),
        "{names:?}"
    );
    assert!(names.contains(&"grpc.health.v1.Health"), "{names:?}");
    let file = answers.message().await.unwrap().unwrap();
    let Some(MessageResponse::FileDescriptorResponse(f)) = file.message_response else {
        panic!("{file:?}");
    };
    use prost::Message as _;
    let rls = prost_types::FileDescriptorProto::decode(&f.file_descriptor_proto[0][..]).unwrap();
    assert_eq!(rls.name(), "envoy/service/ratelimit/v3/rls.proto");
    assert_eq!(rls.service[0].name(), "RateLimitService");
    assert_eq!(rls.service[0].method[0].name(), "ShouldRateLimit");
    // Every file it imports, and theirs, can be fetched by name: what a
    // client without the .proto files (grpcurl) needs.
    let mut wanted: Vec<String> = rls.dependency.clone();
    let mut seen = std::collections::HashSet::new();
    while let Some(name) = wanted.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let mut a = refl
            .server_reflection_info(tokio_stream_of(vec![ask(MessageRequest::FileByFilename(
                name.clone(),
            ))]))
            .await
            .unwrap()
            .into_inner();
        let got = a.message().await.unwrap().unwrap();
        let Some(MessageResponse::FileDescriptorResponse(f)) = got.message_response else {
            panic!("{name}: {got:?}");
        };
        let fd = prost_types::FileDescriptorProto::decode(&f.file_descriptor_proto[0][..]).unwrap();
        assert_eq!(fd.name(), name);
        wanted.extend(fd.dependency);
    }
    assert!(seen.len() >= 20, "{seen:?}");

    let mut health = HealthClient::new(channel);
    let status = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "envoy.service.ratelimit.v3.RateLimitService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.status, 1, "SERVING");
    gw.shutdown().await;
}

/// grpc.health.v1 as tonic-health and grpc-go answer it: Check of the
/// server (empty), the service and `ratelimit` SERVING, of any other name
/// NOT_FOUND; Watch sends the status (SERVICE_UNKNOWN for an unknown name)
/// and stays open; another method is UNIMPLEMENTED.
#[tokio::test]
async fn health_checks_and_watches_as_grpc_health_v1() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;

    let gw = gateway(FIFTY, "{type: memory}", None).await;
    let channel = Channel::from_shared(format!("http://{}", gw.rls.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = HealthClient::new(channel.clone());
    let ask = |s: &str| HealthCheckRequest { service: s.into() };
    for name in [
        "",
        "envoy.service.ratelimit.v3.RateLimitService",
        "ratelimit",
    ] {
        let got = health.check(ask(name)).await.unwrap().into_inner();
        assert_eq!(got.status(), ServingStatus::Serving, "{name:?}");
    }
    let unknown = health.check(ask("no.such.Service")).await.unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");
    assert!(unknown.message().contains("no.such.Service"), "{unknown:?}");

    let mut watch = health.watch(ask("ratelimit")).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::Serving);
    // Open: no second message and no end while nothing changes.
    let more = tokio::time::timeout(Duration::from_millis(200), watch.message()).await;
    assert!(more.is_err(), "the watch ended or sent again: {more:?}");
    drop(watch);
    let mut watch = health.watch(ask("nope")).await.unwrap().into_inner();
    let first = watch.message().await.unwrap().unwrap();
    assert_eq!(first.status(), ServingStatus::ServiceUnknown);
    drop(watch);

    // A method the service does not have; the connection still answers.
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/grpc.health.v1.Health/List");
    let err = grpc
        .unary::<HealthCheckRequest, tonic_health::pb::HealthCheckResponse, _>(
            tonic::Request::new(ask("")),
            path,
            tonic_prost::ProstCodec::default(),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::Unimplemented, "{err:?}");
    let got = health.check(ask("")).await.unwrap().into_inner();
    assert_eq!(got.status(), ServingStatus::Serving);
    gw.shutdown().await;
}

/// A finished stream of `items` for a client-streaming call.
fn tokio_stream_of<T: Send + 'static>(
    items: Vec<T>,
) -> impl tonic::codegen::tokio_stream::Stream<Item = T> + Send + 'static {
    tonic::codegen::tokio_stream::iter(items)
}

#[tokio::test]
async fn a_bad_descriptor_config_never_starts_and_names_the_problem() {
    let yaml = "rls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: d\n      descriptors:\n        - key: k\n          rate_limit: {unit: fortnight, requests_per_unit: 1}\n";
    let err = ratewarden_gateway::config::load(yaml, "t.yaml", &Default::default()).unwrap_err();
    assert!(
        err.to_string()
            .contains("invalid rate limit unit `fortnight`"),
        "{err}"
    );
    let yaml = "rls:\n  listen: 127.0.0.1:0\n  config: /nonexistent/rls.yaml\n";
    let err = ratewarden_gateway::config::load(yaml, "t.yaml", &Default::default()).unwrap_err();
    assert!(err.to_string().contains("/nonexistent/rls.yaml"), "{err}");
}

/// An edited descriptor file is reloaded as the config file is (watched);
/// a bad one keeps the running descriptors.
#[tokio::test]
async fn an_edited_descriptor_file_is_reloaded_and_a_bad_one_ignored() {
    let dir = support::scratch_dir("rw-rls-reload");
    let rules = dir.join("rules");
    std::fs::create_dir_all(&rules).unwrap();
    let write = |limit: &str| {
        std::fs::write(
            rules.join("d.yaml"),
            format!(
                "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {{unit: hour, requests_per_unit: {limit}}}\n"
            ),
        )
        .unwrap()
    };
    write("2");
    let main = dir.join("ratewarden.yaml");
    let yaml = format!(
        "rls:\n  listen: 127.0.0.1:0\n  config: {}\n",
        rules.display()
    );
    std::fs::write(&main, &yaml).unwrap();
    let gw = support::gateway_file(&yaml, "echo", None, Some(main)).await;
    let mut c = client(gw.rls.unwrap()).await;
    assert_eq!(oks(&mut c, "d", &[("k", "a")], 5).await, 2);
    let reloads = |want| support::wait_for_metric(gw.admin.unwrap(), want);
    write("4");
    reloads("ratewarden_config_reloads_total{result=\"success\"} 1").await;
    // A new limit, so a new rule (its own counter): 4 for value b.
    assert_eq!(oks(&mut c, "d", &[("k", "b")], 6).await, 4);
    std::fs::write(rules.join("d.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: fortnight, requests_per_unit: 1}\n").unwrap();
    reloads("ratewarden_config_reloads_total{result=\"failure\"} 1").await;
    assert_eq!(
        oks(&mut c, "d", &[("k", "c")], 6).await,
        4,
        "still the last good file"
    );
    gw.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A store that cannot decide: UNAVAILABLE only under `on_error: deny`;
/// `local` decides in process.
#[tokio::test]
async fn a_store_failure_is_unavailable_only_under_deny() {
    let dead = format!("redis://127.0.0.1:{}", common::free_port());
    for (on_error, want) in [("deny", Some(tonic::Code::Unavailable)), ("local", None)] {
        let gw = gateway(
            FIFTY,
            &format!("{{type: redis, url: '{dead}', on_error: {on_error}}}"),
            None,
        )
        .await;
        let mut c = client(gw.rls.unwrap()).await;
        let r = c
            .should_rate_limit(request("app", vec![descriptor(&[("tenant", "t")])]))
            .await;
        match want {
            Some(code) => assert_eq!(r.unwrap_err().code(), code, "{on_error}"),
            None => assert_eq!(
                Code::try_from(r.unwrap().into_inner().overall_code).unwrap(),
                Code::Ok,
                "{on_error}"
            ),
        }
        gw.shutdown().await;
    }
}

/// A raw HTTP/2 call to the RLS listener: the answer's head, its body's
/// bytes and its trailers (or, for a trailers-only answer, the head's).
async fn raw_call(
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    frames: Vec<Vec<u8>>,
) -> (http::HeaderMap, Vec<u8>, http::HeaderMap) {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut send, conn) = h2::client::handshake(tcp).await.unwrap();
    tokio::spawn(async move {
        let _ = conn.await;
    });
    let mut req = http::Request::post(format!("http://{addr}{path}"))
        .header("content-type", "application/grpc")
        .header("te", "trailers");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (answer, mut body) = send.send_request(req.body(()).unwrap(), false).unwrap();
    let last = frames.len().saturating_sub(1);
    for (i, f) in frames.into_iter().enumerate() {
        body.reserve_capacity(f.len());
        body.send_data(f.into(), i == last).unwrap();
    }
    let answer = answer.await.unwrap();
    let head = answer.headers().clone();
    let mut recv = answer.into_body();
    let mut bytes = vec![];
    while let Some(d) = recv.data().await {
        let d = d.unwrap();
        let _ = recv.flow_control().release_capacity(d.len());
        bytes.extend_from_slice(&d);
    }
    let trailers = recv
        .trailers()
        .await
        .unwrap()
        .unwrap_or_else(|| head.clone());
    (head, bytes, trailers)
}

fn grpc_frame(message: &[u8]) -> Vec<u8> {
    let mut f = vec![0];
    f.extend_from_slice(&(message.len() as u32).to_be_bytes());
    f.extend_from_slice(message);
    f
}

#[tokio::test]
async fn bad_calls_get_a_grpc_status_and_the_listener_goes_on() {
    use prost::Message as _;
    let gw = gateway(TREE, "{type: memory}", None).await;
    let addr = gw.rls.unwrap();
    let method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let status = |t: &http::HeaderMap| t.get("grpc-status").map(|v| v.to_str().unwrap().to_owned());
    let good = request("app", vec![descriptor(&[("client", "raw")])]).encode_to_vec();

    // A message in one-byte DATA frames is read whole and decided.
    let framed = grpc_frame(&good);
    let bytes: Vec<Vec<u8>> = framed.iter().map(|b| vec![*b]).collect();
    let (head, body, trailers) = raw_call(addr, method, &[], bytes).await;
    assert_eq!(head.get("content-type").unwrap(), "application/grpc");
    assert_eq!(status(&trailers).as_deref(), Some("0"));
    let answer = RateLimitResponse::decode(&body[5..]).unwrap();
    assert_eq!(answer.overall_code, Code::Ok as i32);
    assert_eq!(
        answer.statuses[0].current_limit.as_ref().unwrap().name,
        "per_client"
    );

    // Bytes that are not a RateLimitRequest: INVALID_ARGUMENT (3).
    let (_, _, t) = raw_call(addr, method, &[], vec![grpc_frame(&[0x0a, 0x05, b'a'])]).await;
    assert_eq!(status(&t).as_deref(), Some("3"));
    // Not one length-prefixed frame: INVALID_ARGUMENT.
    let (_, _, t) = raw_call(addr, method, &[], vec![vec![0, 0, 0, 0, 9, 1]]).await;
    assert_eq!(status(&t).as_deref(), Some("3"));
    // Compressed: UNIMPLEMENTED (12).
    let (_, _, t) = raw_call(
        addr,
        method,
        &[("grpc-encoding", "gzip")],
        vec![framed.clone()],
    )
    .await;
    assert_eq!(status(&t).as_deref(), Some("12"));
    // Over 4 MiB: RESOURCE_EXHAUSTED (8), without reading it all.
    let big = vec![vec![0u8; 1 << 20]; 5];
    let (_, _, t) = raw_call(addr, method, &[], big).await;
    assert_eq!(status(&t).as_deref(), Some("8"));
    // No such method: UNIMPLEMENTED.
    let (_, _, t) = raw_call(addr, "/no.Such/Method", &[], vec![framed.clone()]).await;
    assert_eq!(status(&t).as_deref(), Some("12"));

    // And the listener still decides, having counted the one good call
    // (of 3 a minute) and none of the refused ones.
    let mut c = client(addr).await;
    assert_eq!(oks(&mut c, "app", &[("client", "raw")], 3).await, 2);
}

#[tokio::test]
async fn a_connection_that_never_speaks_http2_is_closed_after_the_header_timeout() {
    use tokio::io::AsyncReadExt as _;
    let gw = gateway(TREE, "{type: memory}\nclient_header_timeout: 300ms", None).await;
    let addr = gw.rls.unwrap();
    let mut silent = tokio::net::TcpStream::connect(addr).await.unwrap();
    let started = std::time::Instant::now();
    let mut buf = [0u8; 256];
    // The server's SETTINGS may come first; then, with no preface from
    // us, the end of the stream.
    let closed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match silent.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => continue,
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "still open after 10 s");
    assert!(started.elapsed() >= Duration::from_millis(250));
    // A client that does speak is served.
    let mut c = client(addr).await;
    assert_eq!(one(&mut c, "app", &[("client", "x")]).await, Code::Ok);
}

#[tokio::test]
async fn a_call_whose_body_never_comes_ends_after_the_body_timeout() {
    let gw = gateway(TREE, "{type: memory}\nclient_body_timeout: 300ms", None).await;
    let addr = gw.rls.unwrap();
    let method = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";
    let started = std::time::Instant::now();
    // Headers, and then nothing: the stream stays open from our side.
    let (_, _, trailers) =
        tokio::time::timeout(Duration::from_secs(10), raw_call(addr, method, &[], vec![]))
            .await
            .expect("no answer within 10 s");
    assert_eq!(
        trailers.get("grpc-status").map(|v| v.to_str().unwrap()),
        Some("4"),
        "DEADLINE_EXCEEDED: {trailers:?}"
    );
    assert!(started.elapsed() >= Duration::from_millis(250));
    // A call whose body does come is decided as before.
    let mut c = client(addr).await;
    assert_eq!(one(&mut c, "app", &[("client", "y")]).await, Code::Ok);
}
