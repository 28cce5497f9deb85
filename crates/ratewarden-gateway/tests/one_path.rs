//! One admission path: a table of requests, each run through the proxy,
//! `/v1/explain` (which decides without charging, before the proxy does)
//! and `/v1/check` (on a second gateway with the same config and clock,
//! charging as the proxy does). All three must show the same decisions,
//! the same keys and the same rate-limit headers.

mod support;

use std::collections::BTreeMap;

use ratewarden::clock::ManualClock;
use serde_json::{Value, json};
use support::{Upstream, gateway, now, send};

const CONFIG: &str = "\
identity:
  from: forwarded
  trusted_proxies: [127.0.0.1/32]
  ipv6_prefix: 64
deny: [198.51.100.0/24]
allow: [192.0.2.1]
rules:
  - name: per-client
    algorithm: fixed_window
    limit: 3
    window: 1m
  - name: api-path
    match: {path_prefix: /api/}
    key: [identity, path]
    algorithm: sliding_window_log
    limit: 2
    window: 1m
  - name: by-key
    match: {path_prefix: /keyed/}
    key: [header:x-api-key]
    algorithm: gcra
    limit: 2
    window: 1m
  - name: watching
    shadow: true
    algorithm: fixed_window
    limit: 1
    window: 1m
";

/// (method, path, client address, API key)
const REQUESTS: &[(&str, &str, &str, &str)] = &[
    ("GET", "/", "203.0.113.5", ""),
    ("GET", "/api/a", "203.0.113.5", ""),
    ("GET", "/%61pi/./a", "203.0.113.5", ""),
    ("GET", "/api/a", "203.0.113.5", ""),
    ("POST", "/api/b", "203.0.113.5", ""),
    ("GET", "/", "2001:db8::1", ""),
    ("GET", "/api/x", "2001:db8::2", ""),
    ("GET", "/other", "2001:db8::3", ""),
    ("GET", "/", "2001:db8::4", ""),
    ("GET", "/keyed/1", "203.0.113.9", "k1"),
    ("GET", "/keyed/2", "203.0.113.10", "k1"),
    ("GET", "/keyed/3", "203.0.113.11", "k1"),
    ("GET", "/", "198.51.100.7", ""),
    ("GET", "/", "192.0.2.1", ""),
    ("GET", "/", "192.0.2.1", ""),
    ("GET", "/", "192.0.2.1", ""),
    ("GET", "/", "192.0.2.1", ""),
];

/// The rate-limit headers of an answer, by lower-case name.
fn rate_headers(pairs: impl IntoIterator<Item = (String, String)>) -> BTreeMap<String, String> {
    pairs
        .into_iter()
        .map(|(k, v)| (k.to_ascii_lowercase(), v))
        .filter(|(k, _)| k.contains("ratelimit") || k == "retry-after")
        .collect()
}

fn query(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'/' | b'.' | b'-' => (b as char).to_string(),
            b => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn proxy_explain_and_check_decide_alike() {
    let up = Upstream::start().await;
    let clock = ManualClock::new(now());
    let proxy = gateway(CONFIG, &up.url(), Some(clock.clone())).await;
    let checker = gateway(CONFIG, &up.url(), Some(clock.clone())).await;
    for (i, &(method, path, client, api_key)) in REQUESTS.iter().enumerate() {
        let mut headers = vec![("x-forwarded-for", client)];
        if !api_key.is_empty() {
            headers.push(("x-api-key", api_key));
        }
        // explain, before the proxy charges anything.
        let mut q = format!(
            "/v1/explain?method={method}&path={}&peer=127.0.0.1&header:x-forwarded-for={}",
            query(path),
            query(client)
        );
        if !api_key.is_empty() {
            q.push_str(&format!("&header:x-api-key={api_key}"));
        }
        let explained: Value =
            serde_json::from_str(&send(proxy.admin.unwrap(), "GET", &q, &[], "").await.body)
                .unwrap();
        // The proxy.
        let answer = send(proxy.listen(), method, path, &headers, "").await;
        // check, on the other gateway, with the request as the proxy saw it.
        let body = json!({"request": {
            "method": method,
            "path": path,
            "peer": "127.0.0.1",
            "headers": headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        }});
        let checked: Value = serde_json::from_str(
            &send(
                checker.admin.unwrap(),
                "POST",
                "/v1/check",
                &[],
                &body.to_string(),
            )
            .await
            .body,
        )
        .unwrap();
        let step = format!("request {i}: {method} {path} from {client}");

        // The same verdict.
        let status = answer.status.as_u16();
        let proxy_allowed = status == 200;
        assert_eq!(
            explained["would_allow"],
            json!(proxy_allowed),
            "{step}: explain {explained}"
        );
        assert_eq!(
            checked["allowed"],
            json!(proxy_allowed),
            "{step}: check {checked}"
        );
        if status == 403 {
            assert_eq!(explained["refused"], "denied", "{step}");
            assert_eq!(checked["status"], 403, "{step}");
            continue;
        }
        // The same rules on the same keys.
        let keys = |v: &Value| -> Vec<(String, String)> {
            v["rules"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| {
                    (
                        r["rule"].as_str().unwrap().to_owned(),
                        r["key"].as_str().unwrap().to_owned(),
                    )
                })
                .collect()
        };
        assert_eq!(keys(&explained), keys(&checked), "{step}");
        // The same headers, as the proxy sent them.
        let sent = rate_headers(
            answer
                .headers
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), v.to_str().unwrap().to_owned())),
        );
        let object = |v: &Value| {
            rate_headers(
                v["headers"]
                    .as_object()
                    .map(|o| {
                        o.iter()
                            .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                            .collect::<Vec<_>>()
                    })
                    .unwrap_or_default(),
            )
        };
        assert_eq!(object(&checked), sent, "{step}: check's headers");
        assert_eq!(object(&explained), sent, "{step}: explain's headers");
    }
    // What each request was keyed on, spot-checked: IPv6 clients of one
    // /64 share a key, the path key is the normalised path, the API key
    // groups clients.
    let explained: Value = serde_json::from_str(
        &send(
            proxy.admin.unwrap(),
            "GET",
            "/v1/explain?path=/api/./a&identity=2001:db8::99",
            &[],
            "",
        )
        .await
        .body,
    )
    .unwrap();
    let rules = explained["rules"].as_array().unwrap();
    assert_eq!(explained["identity"], "2001:db8::/64");
    assert_eq!(rules[1]["key"], "2001:db8::/64:/api/a");
    assert_eq!(rules[0]["state"]["exists"], true, "2001:db8::/64 was seen");
    proxy.shutdown().await;
    checker.shutdown().await;
}
