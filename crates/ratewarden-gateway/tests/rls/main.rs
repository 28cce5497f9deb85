//! Envoy's rate limit service through a tonic client: envoyproxy/ratelimit's
//! configuration and matching, the response, exactness on every store.

#[path = "../../../ratewarden/tests/common/mod.rs"]
mod common;
mod exact;
mod service;
#[path = "../support/mod.rs"]
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
