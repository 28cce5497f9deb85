//! The README's Envoy configuration for the rate limit service (issue 36),
//! checked as Envoy would use it: its rate limit filter points at an
//! HTTP/2 cluster with the V3 API; its route's `rate_limits` actions make
//! descriptors for a request as Envoy makes them; and those descriptors,
//! sent to a gateway running the README's `rls:` block, get the limits it
//! says. (Envoy itself is not installable here.)

mod support;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use serde_json::Value;

fn at<'v>(v: &'v Value, path: &[&str]) -> &'v Value {
    path.iter().fold(v, |v, k| match k.parse::<usize>() {
        Ok(i) => &v[i],
        Err(_) => &v[*k],
    })
}

/// The descriptors Envoy makes with `rate_limits` for a request from
/// `remote` with `headers` (pseudo-headers included): each entry's actions
/// in order; an entry whose `request_headers` header is missing is not
/// sent, as Envoy skips it.
fn descriptors(
    rate_limits: &Value,
    remote: &str,
    headers: &[(&str, &str)],
) -> Vec<Vec<(String, String)>> {
    let mut out = vec![];
    'entry: for limit in rate_limits.as_array().unwrap() {
        let mut entries = vec![];
        for action in limit["actions"].as_array().unwrap() {
            let (kind, a) = action.as_object().unwrap().iter().next().unwrap();
            match kind.as_str() {
                "remote_address" => entries.push(("remote_address".to_owned(), remote.to_owned())),
                "request_headers" => {
                    let name = a["header_name"].as_str().unwrap();
                    let Some((_, v)) = headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name))
                    else {
                        continue 'entry;
                    };
                    entries.push((
                        a["descriptor_key"].as_str().unwrap().to_owned(),
                        (*v).to_owned(),
                    ));
                }
                "generic_key" => entries.push((
                    a["descriptor_key"]
                        .as_str()
                        .unwrap_or("generic_key")
                        .to_owned(),
                    a["descriptor_value"].as_str().unwrap().to_owned(),
                )),
                other => panic!("an action this test does not know: {other}"),
            }
        }
        out.push(entries);
    }
    out
}

#[tokio::test]
async fn the_readme_envoy_config_reaches_the_readme_limits() {
    let envoy: Value =
        serde_saphyr::from_str(&support::recipe("envoy-rls")).expect("the Envoy YAML parses");
    let hcm = at(
        &envoy,
        &[
            "static_resources",
            "listeners",
            "0",
            "filter_chains",
            "0",
            "filters",
            "0",
            "typed_config",
        ],
    );
    let filters = hcm["http_filters"].as_array().unwrap();
    let rl = filters
        .iter()
        .find(|f| f["name"] == "envoy.filters.http.ratelimit")
        .expect("the rate limit filter")["typed_config"]
        .clone();
    assert_eq!(
        filters.last().unwrap()["name"],
        "envoy.filters.http.router",
        "the router last"
    );
    assert_eq!(rl["rate_limit_service"]["transport_api_version"], "V3");
    assert!(rl["timeout"].is_string() && rl["failure_mode_deny"].is_boolean());
    let cluster_name = rl["rate_limit_service"]["grpc_service"]["envoy_grpc"]["cluster_name"]
        .as_str()
        .unwrap();
    let cluster = envoy["static_resources"]["clusters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == cluster_name)
        .expect("the service's cluster");
    let http2 = &cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        ["explicit_http_config"]["http2_protocol_options"];
    assert!(http2.is_object(), "gRPC needs an HTTP/2 cluster");
    assert_eq!(
        cluster["health_checks"][0]["grpc_health_check"]["service_name"],
        "ratelimit"
    );
    let domain = rl["domain"].as_str().unwrap();
    let rate_limits = at(
        hcm,
        &[
            "route_config",
            "virtual_hosts",
            "0",
            "routes",
            "0",
            "route",
            "rate_limits",
        ],
    );

    // The gateway on the README's `rls:` block (its port made free).
    let rls = support::recipe("envoy-rls-ratewarden").replace("127.0.0.1:8081", "127.0.0.1:0");
    let gw = support::gateway(&rls, "echo", None).await;
    let mut client = RateLimitServiceClient::connect(format!("http://{}", gw.rls.unwrap()))
        .await
        .unwrap();
    let request = |headers: &[(&str, &str)]| RateLimitRequest {
        domain: domain.to_owned(),
        descriptors: descriptors(rate_limits, "203.0.113.5", headers)
            .into_iter()
            .map(|entries| RateLimitDescriptor {
                entries: entries
                    .into_iter()
                    .map(|(key, value)| Entry { key, value })
                    .collect(),
                ..Default::default()
            })
            .collect(),
        hits_addend: 0,
    };
    let api = [
        ("x-client-id", "acme"),
        (":path", "/api/orders"),
        (":method", "GET"),
    ];
    let r = request(&api);
    assert_eq!(r.descriptors.len(), 2, "{r:?}");
    let mut codes = vec![];
    for _ in 0..4 {
        let out = client
            .should_rate_limit(request(&api))
            .await
            .unwrap()
            .into_inner();
        codes.push(Code::try_from(out.overall_code).unwrap());
        assert!(
            out.response_headers_to_add
                .iter()
                .any(|h| h.key == "RateLimit-Remaining"),
            "{:?}",
            out.response_headers_to_add
        );
    }
    assert_eq!(
        codes,
        [Code::Ok, Code::Ok, Code::Ok, Code::OverLimit],
        "3 a minute per client on /api/*"
    );
    // Without the client header Envoy sends only the address's descriptor.
    let plain = request(&[(":path", "/api/orders")]);
    assert_eq!(plain.descriptors.len(), 1);
    let out = client.should_rate_limit(plain).await.unwrap().into_inner();
    assert_eq!(Code::try_from(out.overall_code).unwrap(), Code::Ok);
    gw.shutdown().await;
}
