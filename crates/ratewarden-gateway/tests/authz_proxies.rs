//! The real proxies in front of an upstream, each configured with the
//! README's recipe as written there, asking ratewarden's authorisation
//! listener (issue 36): Debian's `nginx` (`auth_request`) and `caddy`
//! (`forward_auth`). A client through each one sees the limit hold, the
//! rate-limit headers where that proxy can show them, the 429 with
//! `Retry-After`, and a `deny:` as 403.

mod support;

use std::net::SocketAddr;
use std::process::{Command, Stdio};

use support::{Stopped, Upstream, free_port, gateway, send, tool, wait_until_up};

const YAML: &str = r#"identity: {from: header, header: X-User}
deny: [mallory]
authz: {listen: 127.0.0.1:0}
rules:
  - {name: api, match: {path_prefix: /api/}, limit: 2, window: 1h}
"#;

/// The checks every proxy passes; `headers_on_200`: whether it shows the
/// client the rate-limit headers of an admitted request.
async fn through(addr: SocketAddr, up: &Upstream, headers_on_200: bool) {
    let alice = [("x-user", "alice")];
    for left in ["1", "0"] {
        let r = send(addr, "GET", "/api/orders", &alice, "").await;
        assert_eq!(r.status, 200, "{}", r.body);
        if headers_on_200 {
            assert_eq!(
                r.header("x-ratelimit-remaining"),
                Some(left),
                "{:?}",
                r.headers
            );
            assert!(
                r.header("ratelimit-policy")
                    .is_some_and(|p| p.contains("\"api\";q=2"))
            );
        }
    }
    let hits = up.hits();
    let refused = send(addr, "GET", "/api/orders", &alice, "").await;
    assert_eq!(
        refused.status, 429,
        "{:?} {}",
        refused.headers, refused.body
    );
    let retry: u64 = refused
        .header("retry-after")
        .expect("Retry-After")
        .parse()
        .unwrap();
    // (The default sliding_window_counter may ask for up to two windows.)
    assert!(retry > 0 && retry <= 7200, "{retry}");
    assert_eq!(refused.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(
        up.hits(),
        hits,
        "a refused request never reaches the upstream"
    );
    // Another user has their own two; a path no rule matches is free.
    assert_eq!(
        send(addr, "GET", "/api/orders", &[("x-user", "bob")], "")
            .await
            .status,
        200
    );
    for _ in 0..3 {
        assert_eq!(
            send(addr, "GET", "/static/app.css", &alice, "")
                .await
                .status,
            200
        );
    }
    let denied = send(addr, "GET", "/static/app.css", &[("x-user", "mallory")], "").await;
    assert_eq!(denied.status, 403);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_auth_request_with_the_readme_recipe() {
    let up = Upstream::start().await;
    let gw = gateway(YAML, "echo", None).await;
    let authz = gw.authz.unwrap();
    let port = free_port();
    let server = support::recipe("nginx")
        .replace("listen 8080;", &format!("listen 127.0.0.1:{port};"))
        .replace("127.0.0.1:8082", &authz.to_string())
        .replace("127.0.0.1:9000", up.url().trim_start_matches("http://"));
    let _proxy = support::nginx(&server);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until_up(addr).await;
    through(addr, &up, true).await;
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caddy_forward_auth_with_the_readme_recipe() {
    let caddy = tool("caddy", "caddy");
    let up = Upstream::start().await;
    let gw = gateway(YAML, "echo", None).await;
    let authz = gw.authz.unwrap();
    let port = free_port();
    let dir = support::scratch_dir("rw-caddy");
    let site = support::recipe("caddy")
        .replace(":8080", &format!("http://127.0.0.1:{port}"))
        .replace("127.0.0.1:8082", &authz.to_string())
        .replace("127.0.0.1:9000", up.url().trim_start_matches("http://"));
    let file = dir.join("Caddyfile");
    std::fs::write(
        &file,
        format!("{{\n admin off\n auto_https off\n}}\n{site}\n"),
    )
    .unwrap();
    let child = Command::new(caddy)
        .args([
            "run",
            "--config",
            &file.display().to_string(),
            "--adapter",
            "caddyfile",
        ])
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("HOME", &*dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _proxy = Stopped(child, Some(dir));
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until_up(addr).await;
    // Caddy puts an admitted request's rate-limit headers on the request
    // upstream, not on the client's answer (the README says so).
    through(addr, &up, false).await;
    gw.shutdown().await;
}

/// The README's two nginx recipes together, as written: ratewarden's
/// `authz:` block (with `listen: off`, so nginx's port stays nginx's) run
/// by the real binary, and nginx's `auth_request` server in front. The
/// client's address is the identity, named by nginx, a trusted proxy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nginx_beside_the_binary_with_both_readme_recipes() {
    let up = Upstream::start().await;
    let (hook, port) = (free_port(), free_port());
    let dir = support::scratch_dir("rw-authz-recipe");
    let file = dir.join("ratewarden.yaml");
    let yaml = support::recipe("authz").replace("127.0.0.1:8082", &format!("127.0.0.1:{hook}"));
    std::fs::write(
        &file,
        format!(
            "{yaml}\nadmin: {{listen: 127.0.0.1:0}}\nrules:\n  - {{name: api, algorithm: fixed_window, limit: 2, window: 1h}}\n"
        ),
    )
    .unwrap();
    let gw = support::spawn_binary_with(&["serve", "-c", &file.display().to_string()], &[], None);
    assert_eq!(gw.authz, Some(format!("127.0.0.1:{hook}").parse().unwrap()));
    assert!(gw.lines.lock().unwrap().join("").contains("listen=off"));
    let server = support::recipe("nginx")
        .replace("listen 8080;", &format!("listen 127.0.0.1:{port};"))
        .replace("127.0.0.1:8082", &format!("127.0.0.1:{hook}"))
        .replace("127.0.0.1:9000", up.url().trim_start_matches("http://"));
    let _proxy = support::nginx(&server);
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    wait_until_up(addr).await;
    let mut codes = vec![];
    for _ in 0..3 {
        codes.push(send(addr, "GET", "/orders", &[], "").await);
    }
    assert_eq!(codes[0].status, 200);
    assert_eq!(codes[1].header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(codes[2].status, 429, "{:?}", codes[2].headers);
    assert!(codes[2].header("retry-after").is_some());
    assert_eq!(
        up.hits(),
        2,
        "the refused request never reached the upstream"
    );
}
