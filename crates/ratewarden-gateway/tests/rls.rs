//! Envoy's rate limit service through a tonic client: envoyproxy/ratelimit's
//! configuration and matching, the response, exactness on every store.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use std::net::SocketAddr;
use std::time::Duration;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use ratewarden::clock::ManualClock;
use ratewarden_gateway::server::Running;
use tonic::transport::Channel;

type Client = RateLimitServiceClient<Channel>;

async fn client(addr: SocketAddr) -> Client {
    RateLimitServiceClient::connect(format!("http://{addr}"))
        .await
        .unwrap()
}

fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).into(),
                value: (*v).into(),
            })
            .collect(),
        ..Default::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.into(),
        descriptors,
        hits_addend: 0,
    }
}

async fn ask(c: &mut Client, r: RateLimitRequest) -> RateLimitResponse {
    c.should_rate_limit(r).await.unwrap().into_inner()
}

/// One descriptor, asked once: its status code.
async fn one(c: &mut Client, domain: &str, entries: &[(&str, &str)]) -> Code {
    let r = ask(c, request(domain, vec![descriptor(entries)])).await;
    assert_eq!(r.statuses.len(), 1);
    Code::try_from(r.statuses[0].code).unwrap()
}

/// How many of `n` asks of one descriptor are OK.
async fn oks(c: &mut Client, domain: &str, entries: &[(&str, &str)], n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        if one(c, domain, entries).await == Code::Ok {
            ok += 1;
        }
    }
    ok
}

/// envoyproxy/ratelimit's own README examples, as files of that service.
const ENVOY_FILES: [(&str, &str); 2] = [
    (
        "mongo.yaml",
        "---
domain: mongo_cps
descriptors:
  - key: database
    value: users
    rate_limit:
      unit: second
      requests_per_unit: 500

  - key: database
    value: default
    rate_limit:
      unit: second
      requests_per_unit: 5
",
    ),
    (
        "edge.yaml",
        "domain: edge_proxy_per_ip
descriptors:
  - key: remote_address
    rate_limit:
      unit: second
      requests_per_unit: 10

  # Black list IP
  - key: remote_address
    value: 50.0.0.5
    rate_limit:
      unit: second
      requests_per_unit: 0
      unlimited: false
    descriptors: []
",
    ),
];

async fn gateway(rls: &str, store: &str, clock: Option<ManualClock>) -> Running {
    support::gateway(
        &format!("store: {store}\nrls:\n  listen: 127.0.0.1:0\n{rls}"),
        "echo",
        clock,
    )
    .await
}

const TREE: &str = "  domains:
    - domain: app
      descriptors:
        - key: client
          value: partner
          descriptors:
            - key: path
              rate_limit: {unit: minute, requests_per_unit: 2}
        - key: client
          rate_limit: {unit: minute, requests_per_unit: 3, name: per_client}
        - key: path
          value: /static/*
          rate_limit: {unlimited: true}
        - key: path
          value: /api/*
          rate_limit: {unit: hour, requests_per_unit: 1}
        - key: plan
          value: gold
          rate_limit: {unit: minute, requests_per_unit: 100, name: gold, replaces: [{name: per_client}]}
        - key: shadowed
          shadow_mode: true
          rate_limit: {unit: minute, requests_per_unit: 1}
        - key: smooth
          rate_limit: {unit: second, requests_per_unit: 10, algorithm: gcra, burst: 2}
";

#[tokio::test]
async fn descriptors_match_as_envoyproxy_ratelimit_matches_them() {
    let clock = ManualClock::new(support::now() / 60_000_000 * 60_000_000);
    let gw = gateway(TREE, "{type: memory}", Some(clock.clone())).await;
    let mut c = client(gw.rls.unwrap()).await;

    // Nested: client=partner then path; each path value its own limit.
    assert_eq!(
        oks(&mut c, "app", &[("client", "partner"), ("path", "/a")], 5).await,
        2
    );
    assert_eq!(
        oks(&mut c, "app", &[("client", "partner"), ("path", "/b")], 5).await,
        2
    );
    // `client=partner` alone stops at a level without a limit: OK, no limit.
    let r = ask(
        &mut c,
        request("app", vec![descriptor(&[("client", "partner")])]),
    )
    .await;
    assert_eq!(r.statuses[0].current_limit, None);
    assert_eq!(Code::try_from(r.overall_code).unwrap(), Code::Ok);

    // A key without a value: one limit per distinct value.
    assert_eq!(oks(&mut c, "app", &[("client", "x")], 5).await, 3);
    assert_eq!(oks(&mut c, "app", &[("client", "y")], 5).await, 3);

    // Wildcards: each value under the prefix its own counter.
    assert_eq!(oks(&mut c, "app", &[("path", "/api/v1")], 3).await, 1);
    assert_eq!(oks(&mut c, "app", &[("path", "/api/v2")], 3).await, 1);
    // `unlimited`: always OK, remaining u32::MAX.
    let r = ask(
        &mut c,
        request("app", vec![descriptor(&[("path", "/static/x.css")])]),
    )
    .await;
    assert_eq!(r.statuses[0].limit_remaining, u32::MAX);
    assert_eq!(oks(&mut c, "app", &[("path", "/static/y")], 50).await, 50);
    // An unknown domain or descriptor limits nothing.
    assert_eq!(oks(&mut c, "nope", &[("client", "x")], 5).await, 5);
    assert_eq!(oks(&mut c, "app", &[("other", "x")], 5).await, 5);

    // The response of a limited descriptor: its limit, what is left, when
    // it resets (a fixed window on the minute, as Envoy's units are).
    clock.advance(Duration::from_secs(15));
    let r = ask(&mut c, request("app", vec![descriptor(&[("client", "z")])])).await;
    let s = &r.statuses[0];
    let limit = s.current_limit.as_ref().unwrap();
    assert_eq!(
        (limit.requests_per_unit, limit.unit, limit.name.as_str()),
        (3, 2, "per_client")
    );
    assert_eq!(s.limit_remaining, 2);
    assert_eq!(s.duration_until_reset.unwrap().seconds, 45);

    // The overall code is the worst; an over-limit descriptor charges no
    // other (all-or-nothing): w's count is untouched by the refused calls.
    let both = || {
        request(
            "app",
            vec![
                descriptor(&[("client", "w")]),
                descriptor(&[("path", "/api/v1")]),
            ],
        )
    };
    let r = ask(&mut c, both()).await;
    assert_eq!(Code::try_from(r.overall_code).unwrap(), Code::OverLimit);
    assert_eq!(Code::try_from(r.statuses[0].code).unwrap(), Code::Ok);
    assert_eq!(Code::try_from(r.statuses[1].code).unwrap(), Code::OverLimit);
    ask(&mut c, both()).await;
    assert_eq!(oks(&mut c, "app", &[("client", "w")], 5).await, 3);

    // Another algorithm: gcra, 10/s with a burst of 2.
    assert_eq!(oks(&mut c, "app", &[("smooth", "s")], 5).await, 2);
    clock.advance(Duration::from_millis(100));
    assert_eq!(oks(&mut c, "app", &[("smooth", "s")], 5).await, 1);
    gw.shutdown().await;
}

#[tokio::test]
async fn shadow_mode_hits_addend_and_replaces() {
    let clock = ManualClock::new(support::now() / 60_000_000 * 60_000_000);
    let gw = gateway(TREE, "{type: memory}", Some(clock.clone())).await;
    let mut c = client(gw.rls.unwrap()).await;
    // Shadow: over its limit, still OK, counted apart.
    assert_eq!(oks(&mut c, "app", &[("shadowed", "s")], 3).await, 3);
    let metrics = support::send(gw.admin.unwrap(), "GET", "/metrics", &[], "")
        .await
        .body;
    assert!(
        metrics.contains("ratewarden_rls_decisions_total{domain=\"app\",descriptor=\"app.shadowed\",code=\"shadow_over_limit\"} 2"),
        "{metrics}"
    );
    assert!(metrics.contains("descriptor=\"app.shadowed\",code=\"ok\"} 1"));

    // hits_addend on the request: 2 of the 3 at once.
    let mut r = request("app", vec![descriptor(&[("client", "h")])]);
    r.hits_addend = 2;
    let out = ask(&mut c, r).await;
    assert_eq!(out.statuses[0].limit_remaining, 1);
    // On a descriptor it wins over the request's; an explicit 0 peeks.
    let mut d = descriptor(&[("client", "h")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
    let mut r = request("app", vec![d]);
    r.hits_addend = 5;
    let out = ask(&mut c, r).await;
    assert_eq!(Code::try_from(out.overall_code).unwrap(), Code::Ok);
    assert_eq!(
        out.statuses[0].limit_remaining, 1,
        "a peek costs nothing: 1 of 3 is still left (envoyproxy/ratelimit's answer)"
    );
    let mut d = descriptor(&[("client", "h")]);
    d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 1 });
    let mut r = request("app", vec![d]);
    r.hits_addend = 5;
    let out = ask(&mut c, r).await;
    assert_eq!(
        Code::try_from(out.overall_code).unwrap(),
        Code::Ok,
        "the peek charged nothing"
    );
    assert_eq!(
        one(&mut c, "app", &[("client", "h")]).await,
        Code::OverLimit
    );

    // replaces: with plan=gold in the same request, per_client does not
    // apply (client q is over its 3 and still passes).
    assert_eq!(oks(&mut c, "app", &[("client", "q")], 3).await, 3);
    assert_eq!(
        one(&mut c, "app", &[("client", "q")]).await,
        Code::OverLimit
    );
    let r = ask(
        &mut c,
        request(
            "app",
            vec![
                descriptor(&[("client", "q")]),
                descriptor(&[("plan", "gold")]),
            ],
        ),
    )
    .await;
    assert_eq!(Code::try_from(r.overall_code).unwrap(), Code::Ok);
    assert_eq!(r.statuses[0].current_limit, None, "replaced");
    assert_eq!(r.statuses[1].current_limit.as_ref().unwrap().name, "gold");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_negative_hits_descriptor_gives_its_cost_back() {
    let clock = ManualClock::new(support::now() / 60_000_000 * 60_000_000);
    let gw = gateway(TREE, "{type: memory}", Some(clock)).await;
    let mut c = client(gw.rls.unwrap()).await;
    assert_eq!(oks(&mut c, "app", &[("client", "r")], 4).await, 3);
    let refund = |n: u64| {
        let mut d = descriptor(&[("client", "r")]);
        d.is_negative_hits = true;
        d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: n });
        request("app", vec![d])
    };
    let out = ask(&mut c, refund(2)).await;
    assert_eq!(Code::try_from(out.overall_code).unwrap(), Code::Ok);
    assert_eq!(
        out.statuses[0].limit_remaining, 1,
        "2 back: a request of 1 would leave 1"
    );
    assert_eq!(oks(&mut c, "app", &[("client", "r")], 4).await, 2);
    // Never past fresh: a refund of 10 gives back what was spent, no more.
    ask(&mut c, refund(10)).await;
    assert_eq!(oks(&mut c, "app", &[("client", "r")], 5).await, 3);
    let metrics = support::send(gw.admin.unwrap(), "GET", "/metrics", &[], "")
        .await
        .body;
    assert!(
        metrics.contains("descriptor=\"app.client\",code=\"refunded\"} 2"),
        "{metrics}"
    );
    gw.shutdown().await;
}

/// 200 concurrent calls on one descriptor limited to 50: exactly 50 OK.
async fn exact_under_200_concurrent_calls(addrs: &[SocketAddr]) {
    let mut clients = vec![];
    for a in addrs {
        clients.push(client(*a).await);
    }
    let tasks: Vec<_> = (0..200)
        .map(|i| {
            let mut c = clients[i % clients.len()].clone();
            tokio::spawn(async move { one(&mut c, "app", &[("tenant", "t1")]).await == Code::Ok })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap());
    }
    assert_eq!(ok, 50);
}

const FIFTY: &str = "  domains:
    - domain: app
      descriptors:
        - key: tenant
          rate_limit: {unit: hour, requests_per_unit: 50}
";

#[tokio::test]
async fn exact_under_200_concurrent_calls_on_memory() {
    let gw = gateway(FIFTY, "{type: memory}", None).await;
    exact_under_200_concurrent_calls(&[gw.rls.unwrap()]).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn exact_under_200_concurrent_calls_on_redis_and_across_two_instances() {
    let redis = common::RedisServer::start();
    let store = format!("{{type: redis, url: '{}'}}", redis.url());
    let a = gateway(FIFTY, &store, None).await;
    exact_under_200_concurrent_calls(&[a.rls.unwrap()]).await;
    // Two instances on one Redis hold one limit.
    let yaml = FIFTY.replace("hour", "day");
    let b = gateway(&yaml, &store, None).await;
    let c = gateway(&yaml, &store, None).await;
    exact_under_200_concurrent_calls(&[b.rls.unwrap(), c.rls.unwrap()]).await;
    for g in [a, b, c] {
        g.shutdown().await;
    }
}

#[tokio::test]
async fn exact_under_200_concurrent_calls_on_redis_cluster() {
    let cluster = common::RedisCluster::start();
    // The default on_error (local): the gateway connects before it serves,
    // so no call made while the cluster connection is set up is decided
    // locally (that once let 86 of 200 through).
    let gw = gateway(FIFTY, &cluster.store_yaml(), None).await;
    exact_under_200_concurrent_calls(&[gw.rls.unwrap()]).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn envoyproxy_ratelimit_files_load_unchanged_from_a_directory() {
    let dir = support::scratch_dir("rw-rls");
    for (name, text) in ENVOY_FILES {
        std::fs::write(dir.join(name), text).unwrap();
    }
    let clock = ManualClock::new(support::now() / 1_000_000 * 1_000_000);
    let gw = gateway(
        &format!("  config: {}\n", dir.display()),
        "{type: memory}",
        Some(clock),
    )
    .await;
    let mut c = client(gw.rls.unwrap()).await;
    assert_eq!(
        oks(&mut c, "mongo_cps", &[("database", "default")], 8).await,
        5
    );
    assert_eq!(
        oks(&mut c, "mongo_cps", &[("database", "users")], 8).await,
        8
    );
    assert_eq!(
        oks(
            &mut c,
            "edge_proxy_per_ip",
            &[("remote_address", "10.0.0.1")],
            12
        )
        .await,
        10
    );
    // requests_per_unit 0: the black-listed address gets nothing.
    assert_eq!(
        oks(
            &mut c,
            "edge_proxy_per_ip",
            &[("remote_address", "50.0.0.5")],
            3
        )
        .await,
        0
    );
    gw.shutdown().await;
    std::fs::remove_dir_all(&dir).unwrap();
}

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

#[test]
fn the_banner_lists_the_descriptor_limits() {
    let yaml = format!("rls:\n  listen: 127.0.0.1:0\n{TREE}");
    let cfg = ratewarden_gateway::config::load(&yaml, "t.yaml", &Default::default()).unwrap();
    let b = ratewarden_gateway::gateway::banner(&cfg);
    for want in [
        "app.client: fixed_window 3 per 60s",
        "app.path_/static/*: unlimited",
        "app.shadowed: fixed_window 1 per 60s (shadow)",
        "app.smooth: gcra 10 per 1s",
    ] {
        assert!(b.rls.iter().any(|l| l == want), "{want} in {:?}", b.rls);
    }
}

#[tokio::test]
async fn detailed_metric_counts_by_the_request_values() {
    let yaml = "  domains:
    - domain: d
      descriptors:
        - key: user
          detailed_metric: true
          rate_limit: {unit: minute, requests_per_unit: 1}
";
    let gw = gateway(yaml, "{type: memory}", None).await;
    let mut c = client(gw.rls.unwrap()).await;
    assert_eq!(oks(&mut c, "d", &[("user", "ann\"a")], 2).await, 1);
    let metrics = support::send(gw.admin.unwrap(), "GET", "/metrics", &[], "")
        .await
        .body;
    // The value, escaped as a label value must be.
    assert!(
        metrics.contains(
            "ratewarden_rls_decisions_total{domain=\"d\",descriptor=\"d.user_ann\\\"a\",code=\"over_limit\"} 1"
        ),
        "{metrics}"
    );
    gw.shutdown().await;
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

/// An Envoy limit with `distribution` (the extension) is leased like a
/// rule: two instances on one Redis answer most calls from slices and
/// admit no more than the limit between them (fixed_window); at most what
/// they hold unused (the lease room, 40) goes unadmitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leased_envoy_limit_holds_across_two_instances() {
    let redis = common::RedisServer::start();
    let store = format!("{{type: redis, url: '{}'}}", redis.url());
    let yaml = "  domains:
    - domain: app
      descriptors:
        - key: tenant
          rate_limit: {unit: hour, requests_per_unit: 400, distribution: {mode: lease, epsilon: 0.1, max_share: 0.5}}
";
    let (a, b) = (
        gateway(yaml, &store, None).await,
        gateway(yaml, &store, None).await,
    );
    let clients = [client(a.rls.unwrap()).await, client(b.rls.unwrap()).await];
    let tasks: Vec<_> = (0..600)
        .map(|i| {
            let mut c = clients[i % 2].clone();
            tokio::spawn(async move { one(&mut c, "app", &[("tenant", "t1")]).await == Code::Ok })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap());
    }
    assert!((360..=400).contains(&ok), "{ok} of 600 admitted, limit 400");
    let mut local = 0u64;
    for g in [&a, &b] {
        let m = support::send(g.admin.unwrap(), "GET", "/metrics", &[], "")
            .await
            .body;
        local += m
            .lines()
            .find_map(|l| l.strip_prefix("ratewarden_lease_local_decisions_total "))
            .unwrap()
            .parse::<u64>()
            .unwrap();
    }
    assert!(local >= 300, "{local} decisions from slices");
    a.shutdown().await;
    b.shutdown().await;
}

const TEN: &str = "  domains:
    - domain: app
      descriptors:
        - key: tenant
          rate_limit: {unit: hour, requests_per_unit: 10}
";

/// A call naming one descriptor twice charges both copies in turn, as
/// envoyproxy/ratelimit does: after a call naming it twice, a call naming it
/// nine times is over a limit of 10 (before, each copy was decided against
/// the count before the call, and both were admitted: 11).
async fn copies_of_a_descriptor_are_charged_in_turn(addr: SocketAddr) {
    let mut c = client(addr).await;
    let copies = |n| request("app", vec![descriptor(&[("tenant", "t")]); n]);
    let out = ask(&mut c, copies(2)).await;
    assert_eq!(Code::try_from(out.overall_code).unwrap(), Code::Ok);
    assert!(
        out.statuses.iter().all(|s| s.limit_remaining == 8),
        "{out:?}"
    );
    let out = ask(&mut c, copies(9)).await;
    assert_eq!(
        Code::try_from(out.overall_code).unwrap(),
        Code::OverLimit,
        "2 + 9 is over 10"
    );
    let out = ask(&mut c, copies(8)).await;
    assert_eq!(
        Code::try_from(out.overall_code).unwrap(),
        Code::Ok,
        "2 + 8 fits"
    );
    assert_eq!(
        one(&mut c, "app", &[("tenant", "t")]).await,
        Code::OverLimit
    );
}

#[tokio::test]
async fn copies_of_a_descriptor_are_charged_in_turn_on_memory_and_redis() {
    let gw = gateway(TEN, "{type: memory}", None).await;
    copies_of_a_descriptor_are_charged_in_turn(gw.rls.unwrap()).await;
    gw.shutdown().await;
    let redis = common::RedisServer::start();
    let gw = gateway(
        TEN,
        &format!("{{type: redis, url: '{}'}}", redis.url()),
        None,
    )
    .await;
    copies_of_a_descriptor_are_charged_in_turn(gw.rls.unwrap()).await;
    gw.shutdown().await;
}

/// Where ratewarden answered otherwise than envoyproxy/ratelimit (issue
/// 36), now answered as that service does: `OVER_LIMIT` reports nothing
/// left; a peek (`hits_addend: 0`) costs nothing and is OK at the limit;
/// Envoy's `limit` override is a plain fixed window on the unit and is not
/// looked at for a domain with no config; `grpc.health.v1` answers for
/// `ratelimit`; its response header names can be produced.
#[tokio::test]
async fn answers_as_envoyproxy_ratelimit_answers() {
    // On a whole second, so that a unit's end is known.
    let start = support::now() / 1_000_000 * 1_000_000;
    let clock = ManualClock::new(start);
    let gw = gateway(
        "  headers: [envoy]\n  header_names: {limit: X-Quota, remaining: X-Quota-Left, reset: X-Quota-Reset}\n  domains:\n    - domain: app\n      descriptors:\n        - key: client\n          rate_limit: {unit: hour, requests_per_unit: 3}\n",
        "{type: memory}",
        Some(clock.clone()),
    )
    .await;
    let mut c = client(gw.rls.unwrap()).await;
    // A hits_addend that overshoots: OVER_LIMIT with 0 left (was 3 - 1 = 2
    // "left" after a refusal of 5).
    let mut r = request("app", vec![descriptor(&[("client", "a")])]);
    r.hits_addend = 5;
    let out = ask(&mut c, r).await;
    assert_eq!(
        Code::try_from(out.statuses[0].code).unwrap(),
        Code::OverLimit
    );
    assert_eq!(out.statuses[0].limit_remaining, 0);
    // A peek after 1 of 3: 2 left; at the limit: OK with 0 left.
    let peek = |key: &str| {
        let mut d = descriptor(&[("client", key)]);
        d.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 0 });
        request("app", vec![d])
    };
    assert_eq!(one(&mut c, "app", &[("client", "b")]).await, Code::Ok);
    let out = ask(&mut c, peek("b")).await;
    assert_eq!(
        (
            Code::try_from(out.statuses[0].code).unwrap(),
            out.statuses[0].limit_remaining
        ),
        (Code::Ok, 2)
    );
    assert_eq!(oks(&mut c, "app", &[("client", "b")], 2).await, 2);
    let out = ask(&mut c, peek("b")).await;
    assert_eq!(
        (
            Code::try_from(out.statuses[0].code).unwrap(),
            out.statuses[0].limit_remaining
        ),
        (Code::Ok, 0),
        "a peek at the limit is OK with nothing left"
    );
    // The headers, under the names configured: the descriptor with the
    // least left, its limit, and the seconds to the end of its unit.
    let out = ask(&mut c, request("app", vec![descriptor(&[("client", "c")])])).await;
    let header = |out: &RateLimitResponse, name: &str| {
        out.response_headers_to_add
            .iter()
            .find(|h| h.key.eq_ignore_ascii_case(name))
            .map(|h| h.value.clone())
    };
    assert_eq!(header(&out, "X-Quota").as_deref(), Some("3"));
    assert_eq!(header(&out, "X-Quota-Left").as_deref(), Some("2"));
    let reset: u64 = header(&out, "X-Quota-Reset").unwrap().parse().unwrap();
    assert!((1..=3600).contains(&reset), "{reset}");
    // Envoy's `limit` override: 2 per second, a plain fixed window; its
    // reset is the unit's end (unit - now mod unit), not the window's end
    // plus a request's share.
    let overridden = |key: &str| {
        let mut d = descriptor(&[("client", key)]);
        d.limit = Some(envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::RateLimitOverride {
            requests_per_unit: 2,
            unit: 1, // SECOND
        });
        request("app", vec![d])
    };
    clock.advance(Duration::from_millis(250));
    for _ in 0..2 {
        let out = ask(&mut c, overridden("o")).await;
        assert_eq!(Code::try_from(out.overall_code).unwrap(), Code::Ok);
    }
    let out = ask(&mut c, overridden("o")).await;
    assert_eq!(Code::try_from(out.overall_code).unwrap(), Code::OverLimit);
    let reset = out.statuses[0].duration_until_reset.unwrap();
    assert_eq!(
        (reset.seconds, reset.nanos),
        (0, 750_000_000),
        "the second's end"
    );
    // The next second: admitted, every time.
    clock.advance(Duration::from_millis(750));
    let out = ask(&mut c, overridden("o")).await;
    assert_eq!(Code::try_from(out.overall_code).unwrap(), Code::Ok);
    // An override for a domain with no config: OK, no limit.
    let mut r = overridden("o");
    r.domain = "nobody".into();
    for _ in 0..5 {
        assert_eq!(
            Code::try_from(ask(&mut c, r.clone()).await.overall_code).unwrap(),
            Code::Ok
        );
    }
    // Health under envoyproxy/ratelimit's name.
    let channel = Channel::from_shared(format!("http://{}", gw.rls.unwrap()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    let got = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "ratelimit".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        got.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    gw.shutdown().await;
}
