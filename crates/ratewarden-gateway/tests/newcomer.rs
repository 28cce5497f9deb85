//! What a new user tripped on (issue 49): an emptied or half-written
//! config never turns the limits off, a config names its upstream, and a
//! rule's decisions count what it charged.

mod support;

use std::time::Duration;

use support::{Upstream, gateway, gateway_file, send};

fn validate(text: &str) -> (i32, String) {
    // A directory of its own per call (tests run in parallel).
    let dir = support::scratch_dir("rw-newcomer");
    let file = dir.join("ratewarden.yaml");
    std::fs::write(&file, text).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
        .arg("validate")
        .arg(&file)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// An empty file (or only comments), and one that names no upstream, are
/// errors: the echo upstream is served only when written.
#[test]
fn an_empty_config_or_one_without_an_upstream_is_an_error() {
    for empty in ["", "\n\n", "# nothing yet\n"] {
        let (code, out) = validate(empty);
        assert_eq!(code, 2, "{empty:?}: {out}");
        assert!(out.contains("the file is empty"), "{out}");
    }
    let (code, out) = validate("rules:\n  - name: r\n    limit: 10\n    window: 1m\n");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("no `upstream`"), "{out}");
    assert!(out.contains("upstream: echo"), "{out}");
    // Written, it is served.
    let (code, out) =
        validate("upstream: echo\nrules:\n  - name: r\n    limit: 10\n    window: 1m\n");
    assert_eq!(code, 0, "{out}");
}

/// The file emptied while serving (`: > ratewarden.yaml`) is a failed
/// reload: the running limits stay. A file written in two steps is read
/// only once it has stopped changing: its first half is never validated.
#[tokio::test]
async fn an_emptied_or_half_written_file_never_turns_the_limits_off() {
    let up = Upstream::start().await;
    let dir = support::scratch_dir("rw-emptied");
    let file = dir.join("ratewarden.yaml");
    let v1 = "rules:\n  - name: r\n    algorithm: fixed_window\n    limit: 2\n    window: 1h\n";
    std::fs::write(&file, v1).unwrap();
    let gw = gateway_file(v1, &up.url(), None, Some(file.clone())).await;
    let admin = gw.admin.unwrap();
    for _ in 0..2 {
        assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    }
    std::fs::write(&file, "").unwrap();
    support::wait_for_metric(
        admin,
        "ratewarden_config_reloads_total{result=\"failure\"} 1",
    )
    .await;
    assert_eq!(
        send(gw.listen(), "GET", "/", &[], "").await.status,
        429,
        "the limit still holds"
    );
    // Half a file, then the rest 50 ms later (less than the 500 ms between
    // reads): the half alone (a rule without its limit) is never read.
    let v2 = v1.replace("limit: 2", "limit: 5");
    let (half, _) = v2.split_at(v2.find("limit").unwrap());
    std::fs::write(&file, half).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    std::fs::write(&file, &v2).unwrap();
    support::wait_for_metric(
        admin,
        "ratewarden_config_reloads_total{result=\"success\"} 1",
    )
    .await;
    let metrics = send(admin, "GET", "/metrics", &[], "").await.body;
    assert!(
        metrics.contains("ratewarden_config_reloads_total{result=\"failure\"} 1"),
        "the half was validated:\n{metrics}"
    );
    let r = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    gw.shutdown().await;
}

/// Two rules, limits 1 and 100, five requests: one admitted, four refused
/// by the first. The second rule charged one, and says so; its four other
/// yeses charged nothing, and are counted apart.
#[tokio::test]
async fn a_rule_counts_what_it_charged_not_what_another_refused() {
    let up = Upstream::start().await;
    let yaml = "rules:\n  - name: a\n    algorithm: fixed_window\n    limit: 1\n    window: 1h\n  - name: b\n    algorithm: fixed_window\n    limit: 100\n    window: 1h\n";
    let gw = gateway(yaml, &up.url(), None).await;
    let admin = gw.admin.unwrap();
    let mut statuses = vec![];
    for _ in 0..5 {
        statuses.push(send(gw.listen(), "GET", "/", &[], "").await.status.as_u16());
    }
    assert_eq!(statuses, [200, 429, 429, 429, 429]);
    let rules: serde_json::Value =
        serde_json::from_str(&send(admin, "GET", "/v1/rules", &[], "").await.body).unwrap();
    let b = &rules["rules"][1]["decisions"];
    assert_eq!(b["allowed"], 1, "{b}");
    assert_eq!(b["not_charged"], 4, "{b}");
    assert_eq!(b["rejected"], 0, "{b}");
    let a = &rules["rules"][0]["decisions"];
    assert_eq!(
        (a["allowed"].as_u64(), a["rejected"].as_u64()),
        (Some(1), Some(4))
    );
    let metrics = send(admin, "GET", "/metrics", &[], "").await.body;
    assert!(
        metrics.contains("ratewarden_requests_total{rule=\"b\",decision=\"not_charged\"} 4"),
        "{metrics}"
    );
    // The remaining b reports is what was charged: 99 left.
    let r = send(admin, "GET", "/v1/keys/b/127.0.0.1", &[], "").await;
    let v: serde_json::Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(v["charged"], 1, "{v}");
    gw.shutdown().await;
}

/// A duration with a decimal fraction is read exactly.
#[test]
fn a_decimal_duration_is_accepted() {
    let (code, out) = validate(
        "upstream: echo\nrules:\n  - {name: r, algorithm: gcra, limit: 10, window: 1.5s}\n",
    );
    assert_eq!(code, 0, "{out}");
    let (code, out) = validate("upstream: echo\nrules:\n  - {name: r, limit: 10, window: 1.s}\n");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("is not a duration"), "{out}");
}

/// Flow style, as the README writes rules, reports each error at its key,
/// line and column, as block style does, and all of them.
#[test]
fn flow_style_errors_are_each_reported_at_their_key() {
    let (code, out) = validate(
        "upstream: echo\nrules:\n  - {name: g, limit: 10/min, window: 1m}\n  - {name: h, limit: 5, window: 1q}\n  - {name: i, limt: 5, window: 1m}\n  - {name: j, limit: 5, window: 1m, algorithm: gcraa}\n  - name: k\n    limit: -1\n    window: 1m\n",
    );
    assert_eq!(code, 2, "{out}");
    for want in [
        ":3:22: `limit`: expected a whole number, got `10/min`",
        ":4:33: `window`: `1q`: unknown unit `q`",
        ":5:15: `limt`: unknown key `limt`; did you mean `limit`?",
        ":6:48: `algorithm`: unknown algorithm `gcraa`",
        ":8:12: `limit`: must be a whole number >= 1",
    ] {
        assert!(out.contains(want), "no {want:?} in:\n{out}");
    }
    assert_eq!(
        out.lines().filter(|l| l.starts_with("error:")).count(),
        5,
        "{out}"
    );
    assert!(!out.contains("only valid inside a block"), "{out}");
}

/// One mistake, one error: a `key_secret` too short is not also "needs
/// key_secret" at each hashed part; a `tiers` block without `default` does
/// not hide the other errors of its rule.
#[test]
fn one_mistake_is_one_error_and_hides_no_other() {
    let (code, out) = validate(
        "upstream: echo\nkey_secret: short\nrules:\n  - {name: g, limit: 10, window: 1m, key: [{hash: \"header:X-Api-Key\"}]}\n",
    );
    assert_eq!(code, 2, "{out}");
    assert_eq!(
        out.lines().filter(|l| l.starts_with("error:")).count(),
        1,
        "{out}"
    );
    assert!(out.contains("`key_secret`: at least 16 bytes"), "{out}");
    let (code, out) = validate(
        "upstream: echo\nrules:\n  - name: g\n    limit: 10\n    window: 1m\n    tiers:\n      from: jwt:plan\n      values: {free: {limit: 5}}\n",
    );
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("`tiers` needs a `default`"), "{out}");
    assert!(out.contains("needs a top-level `jwt:` section"), "{out}");
}

/// `listen: off`: a gateway for a proxy's hook alone opens no proxy
/// listener (the nginx `auth_request` recipe's port is nginx's); the hook
/// answers. Alone, without `authz:` or `rls:`, it is an error.
#[tokio::test]
async fn listen_off_serves_the_hook_without_a_proxy_listener() {
    use ratewarden_gateway::config::{self, Overrides};
    use ratewarden_gateway::server::{self, Source};
    let yaml = "listen: off\nadmin: {listen: 127.0.0.1:0}\nauthz: {listen: 127.0.0.1:0}\nrules:\n  - {name: r, algorithm: fixed_window, limit: 2, window: 1h}\n";
    let cfg = config::load(yaml, "t.yaml", &Overrides::default()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(cfg.listen, None);
    let gw = server::start(
        cfg,
        Source {
            loaded: None,
            path: None,
            overrides: Overrides::default(),
            clock: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(gw.proxy, None, "no proxy listener");
    let authz = gw.authz.unwrap();
    let hook = [
        ("x-original-method", "GET"),
        ("x-original-uri", "/"),
        ("x-forwarded-for", "192.0.2.1"),
    ];
    let mut codes = vec![];
    for _ in 0..3 {
        codes.push(
            send(authz, "GET", "/authz/nginx", &hook, "")
                .await
                .status
                .as_u16(),
        );
    }
    assert_eq!(codes[..2], [200, 200]);
    assert_ne!(codes[2], 200, "the third is refused");
    gw.shutdown().await;
    let (code, out) = validate("listen: off\nupstream: echo\nrules: []\n");
    assert_eq!(code, 2, "{out}");
    assert!(
        out.contains("`listen: off` leaves nothing to serve"),
        "{out}"
    );
    // `rls:` alone is something to serve.
    let (code, out) = validate(
        "listen: off\nrls:\n  listen: 127.0.0.1:0\n  domains:\n    - domain: d\n      descriptors:\n        - {key: k, rate_limit: {unit: second, requests_per_unit: 1}}\n",
    );
    assert_eq!(code, 0, "{out}");
    // `listen: null` (or `listen:` with nothing) is not the default.
    for text in [
        "listen: null\nupstream: echo\n",
        "listen:\nupstream: echo\n",
    ] {
        let (code, out) = validate(text);
        assert_eq!(code, 2, "{text}: {out}");
        assert!(out.contains("`listen` is empty (null)"), "{out}");
    }
}

/// The rate-limit fields' names are written alike (lowercase) whichever
/// path answers: the HTTP/1.1 path and hyper's (HTTP/1.0 here), an
/// admitted request and a refused one.
#[tokio::test]
async fn rate_limit_header_names_are_written_alike_on_both_paths() {
    let up = Upstream::start().await;
    let gw = support::binary(
        "rules:\n  - {name: r, algorithm: fixed_window, limit: 2, window: 1h}\n",
        &up.url(),
    );
    let mut heads = vec![];
    for version in ["1.1", "1.0", "1.1"] {
        let answer = support::raw(
            gw.listen,
            &format!("GET / HTTP/{version}\r\nhost: x\r\nconnection: close\r\n\r\n"),
        )
        .await;
        heads.push(answer);
    }
    assert!(heads[2].starts_with("HTTP/1.1 429"), "{}", heads[2]);
    for head in &heads {
        assert!(head.contains("\r\nx-ratelimit-limit: 2\r\n"), "{head}");
        assert!(!head.contains("X-RateLimit"), "{head}");
    }
    assert!(heads[2].contains("\r\nretry-after: "), "{}", heads[2]);
}

/// On the memory store with `state_dir`, overrides survive a restart: set
/// through the admin API, written to the directory, read at the next
/// start and in force from its first request; a DELETE is kept too.
#[tokio::test]
async fn overrides_survive_a_restart_with_a_state_dir() {
    let dir = support::scratch_dir("rw-state");
    let yaml = format!(
        "state_dir: {}\nrules:\n  - {{name: r, algorithm: fixed_window, limit: 100, window: 1h}}\n",
        dir.display()
    );
    let json = [("content-type", "application/json")];
    let gw = gateway(&yaml, "echo", None).await;
    let r = send(
        gw.admin.unwrap(),
        "PUT",
        "/v1/overrides/r/127.0.0.1",
        &json,
        r#"{"limit": 1, "note": "ticket 4711"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    gw.shutdown().await;
    assert!(dir.join("overrides.json").exists());
    // A new process (a new gateway, nothing shared but the directory).
    let gw = gateway(&yaml, "echo", None).await;
    let listed = send(gw.admin.unwrap(), "GET", "/v1/overrides", &[], "")
        .await
        .body;
    assert!(listed.contains("ticket 4711"), "{listed}");
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    assert_eq!(
        send(gw.listen(), "GET", "/", &[], "").await.status,
        429,
        "the override's limit of 1"
    );
    let r = send(
        gw.admin.unwrap(),
        "DELETE",
        "/v1/overrides/r/127.0.0.1",
        &[],
        "",
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    gw.shutdown().await;
    let gw = gateway(&yaml, "echo", None).await;
    let listed = send(gw.admin.unwrap(), "GET", "/v1/overrides", &[], "")
        .await
        .body;
    assert!(
        !listed.contains("ticket 4711"),
        "the delete was kept: {listed}"
    );
    gw.shutdown().await;
    // A directory that cannot be written is a config error.
    let (code, out) = validate("upstream: echo\nstate_dir: /proc/no-such-dir\nrules: []\n");
    assert_eq!(code, 2, "{out}");
    assert!(out.contains("`state_dir`"), "{out}");
}
