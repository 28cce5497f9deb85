//! What an operator sees: the log (JSON lines, the startup banner, one
//! line per rejection with its request id, the store's outage and
//! recovery, reload warnings), the access log, the admin listings, probes
//! without the token, and values from the environment.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};
use support::{scratch_dir, send, spawn_binary};

fn json(line: &str) -> Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_say_what_happened_and_redis_outages_are_logged_both_ways() {
    let mut redis = common::RedisServer::start();
    let dir = scratch_dir("rw-logs");
    let file = dir.join("ratewarden.yaml");
    std::fs::write(
        &file,
        format!(
            "log: {{format: json}}\nstore: {{type: redis, url: '{}', on_error: local}}\n\
             rules:\n  - {{name: per-client, limit: 2, window: 1h}}\n",
            redis.url()
        ),
    )
    .unwrap();
    let bin = spawn_binary(&file, "echo", &[], None);
    // Every line is JSON; the banner says what was loaded.
    let banner = json(&bin.wait_for_line(|l| l.contains("ratewarden serving")));
    assert_eq!(banner["level"], "INFO");
    assert_eq!(banner["rules"], 1);
    assert!(
        banner["store"]
            .as_str()
            .unwrap()
            .starts_with("redis redis://127.0.0.1:")
    );
    let rule = json(&bin.wait_for_line(|l| l.contains("rule per-client")));
    assert!(
        rule["message"]
            .as_str()
            .unwrap()
            .contains("per-client: sliding_window_counter 2 per 3600s"),
        "{rule}"
    );
    // A rejection: rule, key, reason, method, path and request id.
    for _ in 0..2 {
        send(bin.listen, "GET", "/a", &[], "").await;
    }
    let r = send(bin.listen, "POST", "/b", &[("x-request-id", "req-7")], "").await;
    assert_eq!(r.status, 429);
    let line = json(&bin.wait_for_line(|l| l.contains("\"rejected\"")));
    for (k, v) in [
        ("rule", "per-client"),
        ("key", "127.0.0.1"),
        ("reason", "limit"),
        ("method", "POST"),
        ("path", "/b"),
        ("request_id", "req-7"),
    ] {
        assert_eq!(line[k], v, "{k} in {line}");
    }
    // (The key's refusal is kept until the window lets it through, with
    // no Redis call: cleared, so that the next requests ask Redis.)
    let cleared = send(
        bin.admin,
        "DELETE",
        "/v1/keys/per-client/127.0.0.1",
        &[],
        "",
    )
    .await;
    assert_eq!(cleared.status, 200, "{}", cleared.body);
    // Redis goes away: one WARN that decisions go local, one when the
    // circuit opens; back: INFO with how long and how many were local.
    redis.kill();
    for _ in 0..5 {
        // Decided locally: allowed or 429, never a 5xx.
        assert!(send(bin.listen, "GET", "/c", &[], "").await.status.as_u16() < 500);
    }
    let warn = json(&bin.wait_for_line(|l| l.contains("deciding locally")));
    assert_eq!(warn["level"], "WARN");
    assert!(
        warn["message"]
            .as_str()
            .unwrap()
            .contains("deciding locally"),
        "{warn}"
    );
    bin.wait_for_line(|l| l.contains("circuit open"));
    redis.restart();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let back = loop {
        send(bin.listen, "GET", "/d", &[("x-user", "late")], "").await;
        if let Some(l) = bin
            .lines
            .lock()
            .unwrap()
            .iter()
            .find(|l| l.contains("store answering again"))
        {
            break json(l);
        }
        assert!(std::time::Instant::now() < deadline, "never recovered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(back["level"], "INFO");
    assert!(back["decisions"].as_u64().unwrap() >= 5, "{back}");
    assert!(back["outage"].is_string(), "{back}");
    let lines = bin.lines.lock().unwrap().clone();
    for l in &lines {
        json(l);
    }
    assert!(
        !lines.iter().any(|l| l.contains('\u{1b}')),
        "no colour codes in a pipe"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_log_has_a_line_per_answer_with_its_request_id() {
    let dir = scratch_dir("rw-access");
    let log = dir.join("access.log");
    let file = dir.join("ratewarden.yaml");
    std::fs::write(
        &file,
        format!(
            "access_log: {{path: {}, format: json}}\nrules:\n  - {{name: one, limit: 1, window: 1h, key: [identity, method]}}\n",
            log.display()
        ),
    )
    .unwrap();
    let up = support::Upstream::start().await;
    let bin = spawn_binary(&file, &up.url(), &[], None);
    let ok = send(bin.listen, "GET", "/x?y=1", &[("user-agent", "t/1")], "").await;
    let no = send(bin.listen, "GET", "/z", &[], "").await;
    assert_eq!((ok.status.as_u16(), no.status.as_u16()), (200, 429));
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let lines: Vec<Value> = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if text.lines().count() >= 2 {
            break text.lines().map(json).collect();
        }
        assert!(std::time::Instant::now() < deadline, "{text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(lines[0]["status"], 200);
    assert_eq!(lines[0]["target"], "/x?y=1");
    assert_eq!(lines[0]["user_agent"], "t/1");
    assert_eq!(lines[0]["request_id"], ok.header("x-request-id").unwrap());
    assert_eq!(lines[0]["identity"], "127.0.0.1");
    assert_eq!(lines[1]["status"], 429);
    assert_eq!(lines[1]["rule"], "one");
    assert_eq!(lines[1]["request_id"], no.header("x-request-id").unwrap());
    // A refusal logs the client's identity and the refusing rule's key,
    // each under its own name.
    assert_eq!(lines[1]["identity"], "127.0.0.1", "{}", lines[1]);
    assert_eq!(lines[1]["key"], "127.0.0.1:GET", "{}", lines[1]);
    assert_eq!(lines[0]["key"], Value::Null);
    let metrics = send(bin.admin, "GET", "/metrics", &[], "").await.body;
    assert!(
        metrics.contains("ratewarden_access_log_dropped_total 0"),
        "{metrics}"
    );
}

#[tokio::test]
async fn probes_and_metrics_need_no_token_unless_asked_to() {
    let gw = support::gateway("admin: {token: s3cret}\nrules: []\n", "echo", None).await;
    let admin = gw.admin.unwrap();
    for p in ["/healthz", "/readyz", "/metrics"] {
        assert_eq!(send(admin, "GET", p, &[], "").await.status, 200, "{p}");
    }
    assert_eq!(send(admin, "GET", "/v1/rules", &[], "").await.status, 401);
    let auth = [("authorization", "Bearer s3cret")];
    assert_eq!(send(admin, "GET", "/v1/rules", &auth, "").await.status, 200);
    gw.shutdown().await;
    let gw = support::gateway(
        "admin: {token: s3cret, token_for_probes: true}\nrules: []\n",
        "echo",
        None,
    )
    .await;
    let admin = gw.admin.unwrap();
    assert_eq!(send(admin, "GET", "/healthz", &[], "").await.status, 401);
    assert_eq!(send(admin, "GET", "/healthz", &auth, "").await.status, 200);
    gw.shutdown().await;
}

#[tokio::test]
async fn the_admin_api_lists_rules_the_hottest_keys_and_bans() {
    let clock = ratewarden::clock::ManualClock::new(support::now());
    let gw = support::gateway(
        "rules:\n  - {name: api, limit: 10, window: 1h}\n  - {name: login, limit: 1, window: 1m, penalty: 10m, match: {path: /login}}\n",
        "echo",
        Some(clock),
    )
    .await;
    let admin = gw.admin.unwrap();
    let rules = send(admin, "GET", "/v1/rules", &[], "").await;
    let v: Value = serde_json::from_str(&rules.body).unwrap();
    let names: Vec<&str> = v["rules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["api", "login"]);
    assert_eq!(v["rules"][1]["penalty"]["duration"], 600.0);
    assert_eq!(v["rules"][0]["id"].as_str().unwrap().len(), 16);
    // One client spends its 10 and goes on; /login earns it a ban.
    for _ in 0..40 {
        send(gw.listen(), "GET", "/", &[], "").await;
        send(gw.listen(), "GET", "/login", &[], "").await;
    }
    let top = send(admin, "GET", "/v1/keys?rule=api&limit=5", &[], "").await;
    assert_eq!(top.status, 200, "{}", top.body);
    let v: Value = serde_json::from_str(&top.body).unwrap();
    let keys = v["keys"].as_array().unwrap();
    assert_eq!(keys[0]["key"], "127.0.0.1", "{v}");
    assert_eq!(keys[0]["remaining"], 0);
    assert_eq!(keys[0]["used"], 1.0);
    let bans = send(admin, "GET", "/v1/bans", &[], "").await;
    let v: Value = serde_json::from_str(&bans.body).unwrap();
    let ban = &v["bans"][0];
    assert_eq!(
        (ban["rule"].as_str(), ban["key"].as_str()),
        (Some("login"), Some("127.0.0.1"))
    );
    assert!(ban["ban_left"].as_f64().unwrap() > 500.0, "{v}");
    assert_eq!(
        send(admin, "GET", "/v1/keys?rule=nope", &[], "")
            .await
            .status,
        404
    );
    assert_eq!(
        send(admin, "GET", "/v1/keys?rule=api&limit=0", &[], "")
            .await
            .status,
        400
    );
    gw.shutdown().await;
}

/// Gateway A decides for 300 clients; gateway B, on the same store, saw
/// none of them, and lists them (and A's bans) from a SCAN of the store.
async fn listings_come_from_the_store(store: &str) {
    let yaml = format!(
        "store: {store}\nrules:\n  - {{name: api, limit: 3, window: 1h}}\n  - {{name: login, limit: 1, window: 1m, penalty: 10m}}\n"
    );
    let a = support::gateway(&yaml, "echo", None).await;
    let b = support::gateway(&yaml, "echo", None).await;
    let check = |gw: &ratewarden_gateway::server::Running, rule: &str, key: String| {
        let admin = gw.admin.unwrap();
        let body = json!({"rule": rule, "key": key}).to_string();
        async move { send(admin, "POST", "/v1/check", &[], &body).await }
    };
    for i in 0..300 {
        // Client i spends i % 4 of its 3: some full, some not.
        for _ in 0..i % 4 {
            check(&a, "api", format!("10.0.{}.{}", i / 256, i % 256)).await;
        }
    }
    for i in 0..5 {
        for _ in 0..2 {
            check(&a, "login", format!("10.9.0.{i}")).await;
        }
    }
    let admin = b.admin.unwrap();
    let top = send(admin, "GET", "/v1/keys?rule=api&limit=1000", &[], "").await;
    assert_eq!(top.status, 200, "{}", top.body);
    let v: Value = serde_json::from_str(&top.body).unwrap();
    assert_eq!(v["complete"], true);
    let keys = v["keys"].as_array().unwrap();
    // Every client that spent something (225 of 300), the fullest first.
    // (`remaining` is what the next request would leave: 3 - spent - 1.)
    assert_eq!(keys.len(), 225, "{v}");
    assert_eq!(keys[0]["remaining"], 0);
    assert_eq!(keys[224]["remaining"], 1);
    assert_eq!(keys.iter().filter(|k| k["remaining"] == 0).count(), 150);
    // `used` is what was spent: 1, 2 or 3 of 3, 75 clients each.
    for (used, n) in [(1.0, 75), (0.667, 75), (0.333, 75)] {
        assert_eq!(
            keys.iter().filter(|k| k["used"] == used).count(),
            n,
            "{used}: {v}"
        );
    }
    assert_eq!(
        (keys[0]["used"].as_f64(), keys[224]["used"].as_f64()),
        (Some(1.0), Some(0.333))
    );
    let bans = send(admin, "GET", "/v1/bans?limit=3", &[], "").await;
    let v: Value = serde_json::from_str(&bans.body).unwrap();
    assert_eq!(v["complete"], true);
    let bans = v["bans"].as_array().unwrap();
    assert_eq!(bans.len(), 3, "bounded by limit: {v}");
    for ban in bans {
        assert_eq!(ban["rule"], "login");
        assert!(ban["key"].as_str().unwrap().starts_with("10.9.0."), "{ban}");
        assert!(ban["ban_left"].as_f64().unwrap() > 500.0, "{ban}");
    }
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test]
async fn listings_on_redis_come_from_a_bounded_scan_not_from_what_this_gateway_saw() {
    let redis = common::RedisServer::start();
    listings_come_from_the_store(&format!("{{type: redis, url: '{}'}}", redis.url())).await;
}

#[tokio::test]
async fn listings_on_redis_cluster_scan_every_master() {
    let cluster = common::RedisCluster::start();
    listings_come_from_the_store(&cluster.store_yaml()).await;
}

#[test]
fn config_values_come_from_the_environment_and_an_unset_one_is_named() {
    let dir = scratch_dir("rw-env");
    let file = dir.join("ratewarden.yaml");
    std::fs::write(
        &file,
        "admin: {token: '${RW_TEST_TOKEN}'}\nrules:\n  - {name: r, limit: ${RW_TEST_LIMIT:-7}, window: 1m}\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ratewarden"))
        .arg("validate")
        .arg(&file)
        .env_remove("RW_TEST_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ratewarden.yaml:1:17") && err.contains("`RW_TEST_TOKEN` is not set"),
        "{err}"
    );
    let bin = spawn_binary(&file, "echo", &[("RW_TEST_TOKEN", "from-env")], Some(dir));
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let auth = [("authorization", "Bearer from-env")];
        let r = send(bin.admin, "GET", "/v1/rules", &auth, "").await;
        assert_eq!(r.status, 200);
        assert!(r.body.contains("\"limit\":7"), "{}", r.body);
    });
}

#[test]
fn a_reload_that_changes_what_needs_a_restart_says_so() {
    let dir = scratch_dir("rw-reload");
    let file = dir.join("ratewarden.yaml");
    // No command-line overrides: they would win over the file on reload.
    let base = "admin: {listen: '127.0.0.1:0'}\nupstream: echo\n";
    std::fs::write(
        &file,
        format!("{base}listen: 127.0.0.1:0\nworkers: 1\nrules: []\n"),
    )
    .unwrap();
    let path = file.display().to_string();
    let bin = support::spawn_binary_with(&["serve", "-c", &path], &[], Some(dir));
    std::fs::write(
        &file,
        format!("{base}listen: 127.0.0.1:1\nworkers: 3\nrules: []\n"),
    )
    .unwrap();
    let line = bin.wait_for_line(|l| l.contains("take effect only on restart"));
    assert!(
        line.contains("WARN") && line.contains("listen, workers"),
        "{line}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_502_and_a_504_are_logged_with_the_upstream_and_the_reason() {
    // A port nothing listens on (502), and a server that accepts and never
    // answers (504).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let silent_url = format!("http://{}", silent.local_addr().unwrap());
    let held = tokio::spawn(async move {
        let mut kept = vec![];
        while let Ok((s, _)) = silent.accept().await {
            kept.push(s);
        }
    });
    let dir = scratch_dir("rw-5xx");
    let file = dir.join("ratewarden.yaml");
    std::fs::write(
        &file,
        format!(
            "log: {{format: json}}\nupstream_timeout: 300ms\n\
             routes:\n  - {{name: slow, match: {{path_prefix: /slow/}}, upstream: {{servers: ['{silent_url}']}}}}\n"
        ),
    )
    .unwrap();
    let bin = spawn_binary(&file, &refused, &[], Some(dir));
    let r = send(bin.listen, "GET", "/x", &[], "").await;
    assert_eq!(r.status, 502);
    let line = json(&bin.wait_for_line(|l| l.contains(": 502")));
    assert_eq!(line["level"], "WARN");
    assert!(
        line["upstream"]
            .as_str()
            .unwrap()
            .contains(refused.trim_start_matches("http://")),
        "{line}"
    );
    assert!(
        line["message"]
            .as_str()
            .unwrap()
            .contains("upstream failed ("),
        "{line}"
    );
    assert!(
        line["error"].as_str().is_some_and(|e| !e.is_empty()),
        "{line}"
    );
    let r = send(bin.listen, "GET", "/slow/y", &[], "").await;
    assert_eq!(r.status, 504);
    let line = json(&bin.wait_for_line(|l| l.contains(": 504")));
    assert_eq!(line["level"], "WARN");
    assert!(
        line["upstream"]
            .as_str()
            .unwrap()
            .contains(silent_url.trim_start_matches("http://")),
        "{line}"
    );
    assert_eq!(line["timeout"], "300ms");
    held.abort();
}

/// On the memory store, a key a rule banned is listed under that rule by
/// `/v1/keys`, as `/v1/bans` lists it (it was missing when the sampling of
/// keys near their limit had not seen it).
#[tokio::test]
async fn a_banned_key_is_listed_under_its_rule() {
    let gw = support::gateway(
        "identity: {from: header, header: X-User}\nrules:\n  - {name: login, limit: 1, window: 1h, penalty: 10m}\n",
        "echo",
        None,
    )
    .await;
    let admin = gw.admin.unwrap();
    for user in ["alice", "bob"] {
        for _ in 0..2 {
            send(gw.listen(), "GET", "/", &[("x-user", user)], "").await;
        }
    }
    let bans: Value =
        serde_json::from_str(&send(admin, "GET", "/v1/bans", &[], "").await.body).unwrap();
    assert_eq!(bans["bans"].as_array().unwrap().len(), 2, "{bans}");
    let top = send(admin, "GET", "/v1/keys?rule=login", &[], "").await;
    let v: Value = serde_json::from_str(&top.body).unwrap();
    let mut listed: Vec<&str> = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["key"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, ["alice", "bob"], "{v}");
    assert!(v["keys"][0]["ban_left"].as_f64().unwrap() > 500.0, "{v}");
    gw.shutdown().await;
}

/// `ratewarden_responses_total{route,source,code}` keeps the gateway's own
/// answers and the upstream's apart, per route and status class, on both
/// HTTP paths; each route's upstream time is a histogram of its own.
#[tokio::test]
async fn responses_are_counted_by_route_source_and_class() {
    let up = support::Upstream::start().await;
    let yaml = format!(
        "routes:\n  - name: api\n    match: {{path_prefix: /status/}}\n    upstream: {}\nrules:\n  - {{name: one, limit: 3, window: 1h, match: {{path: /}}}}\n",
        up.url()
    );
    let gw = support::gateway(&yaml, &up.url(), None).await;
    // HTTP/1.1 (the gateway's own path) and h2c (hyper's).
    let h2 = {
        let mut b =
            hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new());
        b.http2_only(true);
        b.build_http::<http_body_util::Full<bytes::Bytes>>()
    };
    let get_h2 = |path: &str| {
        let req = http::Request::get(format!("http://{}{path}", gw.listen()))
            .body(http_body_util::Full::new(bytes::Bytes::new()))
            .unwrap();
        h2.request(req)
    };
    for _ in 0..2 {
        assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    }
    assert_eq!(get_h2("/").await.unwrap().status(), 200);
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 429);
    assert_eq!(get_h2("/").await.unwrap().status(), 429);
    assert_eq!(
        send(gw.listen(), "GET", "/status/404", &[], "")
            .await
            .status,
        404
    );
    assert_eq!(get_h2("/status/503").await.unwrap().status(), 503);
    assert_eq!(
        send(gw.listen(), "GET", "/a/%00", &[], "").await.status,
        400
    );
    let m = send(gw.admin.unwrap(), "GET", "/metrics", &[], "")
        .await
        .body;
    for want in [
        "ratewarden_responses_total{route=\"default\",source=\"upstream\",code=\"2xx\"} 3",
        "ratewarden_responses_total{route=\"default\",source=\"gateway\",code=\"4xx\"} 2",
        "ratewarden_responses_total{route=\"api\",source=\"upstream\",code=\"4xx\"} 1",
        "ratewarden_responses_total{route=\"api\",source=\"upstream\",code=\"5xx\"} 1",
        "ratewarden_responses_total{route=\"none\",source=\"gateway\",code=\"4xx\"} 1",
        "ratewarden_route_upstream_duration_seconds_count{route=\"api\"} 2",
        "ratewarden_route_upstream_duration_seconds_count{route=\"default\"} 3",
    ] {
        assert!(m.contains(want), "{want} in\n{m}");
    }
    gw.shutdown().await;
}

/// A flood of refusals is not a flood of log lines: a key's first refusal
/// is logged whole, the rest of its period only counted (and summarised
/// once the period ends); the metrics still count every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refusals_logs_each_keys_first() {
    let dir = scratch_dir("rw-refusal-log");
    let file = dir.join("ratewarden.yaml");
    std::fs::write(
        &file,
        "log: {format: json}\nidentity: {from: header, header: X-User}\nrules:\n  - {name: one, limit: 1, window: 1h}\n",
    )
    .unwrap();
    let bin = spawn_binary(&file, "echo", &[], None);
    for _ in 0..30 {
        send(bin.listen, "GET", "/", &[("x-user", "alice")], "").await;
    }
    // bob's refusal comes after all of alice's on the one worker thread.
    for _ in 0..2 {
        send(bin.listen, "GET", "/", &[("x-user", "bob")], "").await;
    }
    bin.wait_for_line(|l| l.contains("\"rejected\"") && l.contains("\"bob\""));
    let lines = bin.lines.lock().unwrap().clone();
    let alice = lines
        .iter()
        .filter(|l| l.contains("\"rejected\"") && l.contains("\"alice\""))
        .count();
    assert_eq!(alice, 1, "one line for alice's 29 refusals");
    let m = send(bin.admin, "GET", "/metrics", &[], "").await.body;
    assert!(
        m.contains("ratewarden_requests_total{rule=\"one\",decision=\"rejected\"} 30"),
        "{m}"
    );
}
