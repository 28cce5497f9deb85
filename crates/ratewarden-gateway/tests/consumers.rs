//! Consumers (issue 49): API keys that belong to someone, on a tier. Made,
//! used, counted, listed, revoked through the real binary: on memory
//! (across a restart, with `state_dir`), on Redis with two gateways
//! (revocation in force on both within a second), from `consumers.file`
//! with `ratewarden key`, and the README's "API product in ten minutes"
//! run as written.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use std::time::{Duration, Instant};

use common::RedisServer;
use serde_json::Value;
use support::{Upstream, send};

const SECRET: &str = "0123456789abcdef0123456789abcdef";

/// Consumers keyed by `X-Api-Key`, the identity their name, two tiers.
fn yaml(extra: &str) -> String {
    format!(
        "key_secret: {SECRET}\n\
         consumers: {{from: header:X-Api-Key, unknown: reject, max: 2}}\n\
         identity: {{from: consumer, missing: reject}}\n\
         access_log: {{path: stdout, format: json}}\n\
         {extra}\
         rules:\n  - name: api\n    window: 1m\n    tiers: {{from: consumer, default: free, values: {{free: {{limit: 2}}, pro: {{limit: 5}}}}}}\n"
    )
}

fn json(body: &str) -> Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"))
}

/// Makes consumer `name` on `tier` through `admin`; its key.
async fn make(admin: std::net::SocketAddr, name: &str, tier: &str) -> String {
    let r = send(
        admin,
        "POST",
        "/v1/consumers",
        &[("content-type", "application/json")],
        &format!(r#"{{"name":"{name}","tier":"{tier}","metadata":{{"crm":"4711"}}}}"#),
    )
    .await;
    assert_eq!(r.status, 201, "{}", r.body);
    let v = json(&r.body);
    v["key"].as_str().expect("the key, once").to_owned()
}

/// The statuses of `n` requests with `key`.
async fn statuses(listen: std::net::SocketAddr, key: &str, n: usize) -> Vec<u16> {
    let mut out = vec![];
    for _ in 0..n {
        let r = send(listen, "GET", "/orders", &[("x-api-key", key)], "").await;
        out.push(r.status.as_u16());
    }
    out
}

#[tokio::test]
async fn consumers_on_memory_are_named_everywhere_and_survive_a_restart() {
    let up = Upstream::start().await;
    let dir = support::scratch_dir("rw-consumers");
    let file = dir.join("ratewarden.yaml");
    let state = dir.join("state");
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(&file, yaml(&format!("state_dir: {}\n", state.display()))).unwrap();
    let gw = support::spawn_binary(&file, &up.url(), &[], None);
    let pro = make(gw.admin, "acme", "pro").await;
    let free = make(gw.admin, "globex", "free").await;
    assert!(pro.starts_with("rw_") && pro.len() == 51, "{pro}");
    // The bound (`consumers.max: 2`), and a name or key taken: 409.
    for body in [r#"{"name":"initech"}"#, r#"{"name":"acme"}"#] {
        let r = send(
            gw.admin,
            "POST",
            "/v1/consumers",
            &[("content-type", "application/json")],
            body,
        )
        .await;
        assert_eq!(r.status, 409, "{body}: {}", r.body);
    }
    // The plan's headers: pro's 5, free's 2.
    let r = send(gw.listen, "GET", "/orders", &[("x-api-key", &pro)], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"), "{:?}", r.headers);
    assert_eq!(statuses(gw.listen, &free, 3).await, [200, 200, 429]);
    // No key, and a key that names no one: 401, saying where the key goes.
    let none = send(gw.listen, "GET", "/orders", &[], "").await;
    assert_eq!(none.status, 401);
    let wrong = send(gw.listen, "GET", "/orders", &[("x-api-key", "rw_nope")], "").await;
    assert_eq!(wrong.status, 401);
    assert_eq!(
        wrong.header("www-authenticate"),
        Some("ApiKey header=\"x-api-key\"")
    );
    // Usage, as the store holds it: globex used its 2.
    let usage = json(
        &send(gw.admin, "GET", "/v1/consumers/globex/usage", &[], "")
            .await
            .body,
    );
    assert_eq!(usage["rules"][0]["rule"], "api");
    assert_eq!(usage["rules"][0]["tier"], "free");
    assert_eq!(usage["rules"][0]["limit"], 2);
    assert_eq!(usage["rules"][0]["remaining"], 0);
    // Named where a key shows: /v1/keys, /v1/explain, the access log
    // (admitted lines too), the refusal log; the key nowhere.
    let keys = send(gw.admin, "GET", "/v1/keys/api/globex", &[], "")
        .await
        .body;
    assert!(keys.contains("\"remaining\":0"), "{keys}");
    let explain = json(
        &send(
            gw.admin,
            "GET",
            &format!("/v1/explain?path=/orders&header:x-api-key={pro}"),
            &[],
            "",
        )
        .await
        .body,
    );
    assert_eq!(explain["consumer"]["name"], "acme", "{explain}");
    assert_eq!(explain["rules"][0]["tier"], "pro", "{explain}");
    let admitted =
        gw.wait_for_line(|l| l.contains("\"status\":200") && l.contains("\"consumer\":\"acme\""));
    assert!(admitted.contains("\"identity\":\"acme\""), "{admitted}");
    gw.wait_for_line(|l| l.contains("rejected") && l.contains("key=\"globex\""));
    let listed = send(gw.admin, "GET", "/v1/consumers", &[], "").await.body;
    let metrics = send(gw.admin, "GET", "/metrics", &[], "").await.body;
    assert!(
        metrics.contains("ratewarden_consumer_unknown_keys_total 1"),
        "{metrics}"
    );
    assert!(!metrics.contains("acme"), "no consumer label");
    let log = gw.lines.lock().unwrap().join("");
    let kept = std::fs::read_to_string(state.join("consumers.json")).unwrap();
    for text in [&listed, &log, &kept, &metrics, &keys] {
        assert!(
            !text.contains(&pro) && !text.contains(&free),
            "a key in clear: {text}"
        );
    }
    use std::os::unix::fs::PermissionsExt as _;
    let mode = std::fs::metadata(state.join("consumers.json"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    drop(gw);

    // Restarted: the same keys name the same consumers, on their tiers.
    let gw = support::spawn_binary(&file, &up.url(), &[], None);
    let r = send(gw.listen, "GET", "/orders", &[("x-api-key", &pro)], "").await;
    assert_eq!(r.status, 200, "acme's key after a restart");
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    let one = json(
        &send(gw.admin, "GET", "/v1/consumers/acme", &[], "")
            .await
            .body,
    );
    assert_eq!(one["tier"], "pro");
    assert_eq!(one["metadata"]["crm"], "4711");
    // A tier change, then a revocation, each kept.
    let put = send(
        gw.admin,
        "PUT",
        "/v1/consumers/acme",
        &[("content-type", "application/json")],
        r#"{"tier":"free"}"#,
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let bad = send(
        gw.admin,
        "PUT",
        "/v1/consumers/acme",
        &[("content-type", "application/json")],
        r#"{"tier":"gold"}"#,
    )
    .await;
    assert_eq!(bad.status, 400);
    assert!(bad.body.contains("free, pro"), "{}", bad.body);
    let r = send(gw.listen, "GET", "/orders", &[("x-api-key", &pro)], "").await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"));
    let del = send(gw.admin, "DELETE", "/v1/consumers/globex", &[], "").await;
    assert_eq!(del.status, 200);
    assert_eq!(
        statuses(gw.listen, &free, 1).await,
        [401],
        "revoked at once"
    );
    drop(gw);
    let gw = support::spawn_binary(&file, &up.url(), &[], None);
    assert_eq!(statuses(gw.listen, &free, 1).await, [401], "still revoked");
    let r = send(gw.listen, "GET", "/orders", &[("x-api-key", &pro)], "").await;
    assert_eq!(r.header("x-ratelimit-limit"), Some("2"), "still free");
    drop(dir);
}

#[tokio::test]
async fn a_consumer_made_on_one_gateway_is_in_force_on_another_and_its_revocation_within_a_second()
{
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = yaml(&format!(
        "store: {{type: redis, url: \"{}\", timeout: 1s}}\n",
        redis.url()
    ));
    let a = support::binary(&yaml, &up.url());
    let b = support::binary(&yaml, &up.url());
    let key = make(a.admin, "acme", "pro").await;
    let t = Instant::now();
    while statuses(b.listen, &key, 1).await != [200] {
        assert!(t.elapsed() < Duration::from_secs(1), "not on B within 1 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let made = t.elapsed();
    // Shared state: 5 between the two gateways (one already spent on B).
    let n = statuses(a.listen, &key, 3)
        .await
        .iter()
        .filter(|&&s| s == 200)
        .count()
        + statuses(b.listen, &key, 3)
            .await
            .iter()
            .filter(|&&s| s == 200)
            .count();
    assert_eq!(n, 4, "the pro tier's 5, one used by the wait");
    // Listed by its name (found by the SCAN of the tier's keys).
    let keys = send(a.admin, "GET", "/v1/keys?rule=api", &[], "")
        .await
        .body;
    assert!(keys.contains("\"key\":\"acme\""), "{keys}");
    assert!(!keys.contains(&key), "{keys}");
    // Kept in Redis as its hash only.
    let dump = redis.cli(&["HGETALL", "rw:{consumers}"]);
    assert!(dump.contains("acme") && dump.contains("key_hash"), "{dump}");
    assert!(!dump.contains(&key), "the key in clear in Redis: {dump}");
    let del = send(b.admin, "DELETE", "/v1/consumers/acme", &[], "").await;
    assert_eq!(del.status, 200, "{}", del.body);
    let t = Instant::now();
    while statuses(a.listen, &key, 1).await != [401] {
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "still in force on A after 1 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "made on A, in force on B after {made:?}; revoked on B, refused on A after {:?}",
        t.elapsed()
    );
}

#[tokio::test]
async fn key_new_and_key_hash_make_what_consumers_file_takes() {
    let up = Upstream::start().await;
    let bin = env!("CARGO_BIN_EXE_ratewarden");
    let out = std::process::Command::new(bin)
        .args(["key", "new"])
        .env("RATEWARDEN_KEY_SECRET", SECRET)
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let key = text
        .lines()
        .find_map(|l| l.strip_prefix("key:"))
        .unwrap()
        .trim()
        .to_owned();
    let hash = text
        .lines()
        .find_map(|l| l.strip_prefix("key_hash:"))
        .unwrap()
        .trim()
        .trim_matches('"')
        .to_owned();
    // `key hash` of the same key: the same hash.
    let mut child = std::process::Command::new(bin)
        .args(["key", "hash"])
        .env("RATEWARDEN_KEY_SECRET", SECRET)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write as _;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(key.as_bytes())
        .unwrap();
    let again = String::from_utf8(child.wait_with_output().unwrap().stdout).unwrap();
    assert!(again.contains(&hash), "{again} vs {hash}");
    let dir = support::scratch_dir("rw-consumers-file");
    let list = dir.join("consumers.yaml");
    std::fs::write(
        &list,
        format!("- {{name: initech, key_hash: \"{hash}\", tier: pro, metadata: {{crm: 9}}}}\n"),
    )
    .unwrap();
    let file = dir.join("ratewarden.yaml");
    std::fs::write(
        &file,
        yaml("").replace(
            "unknown: reject, max: 2}",
            &format!("unknown: reject, file: {}}}", list.display()),
        ),
    )
    .unwrap();
    let gw = support::spawn_binary(&file, &up.url(), &[], None);
    let r = send(gw.listen, "GET", "/orders", &[("x-api-key", &key)], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-limit"), Some("5"));
    let one = json(
        &send(gw.admin, "GET", "/v1/consumers/initech", &[], "")
            .await
            .body,
    );
    assert_eq!(one["source"], "file");
    let del = send(gw.admin, "DELETE", "/v1/consumers/initech", &[], "").await;
    assert_eq!(del.status, 409, "{}", del.body);
    // A clear key where the hash goes is an error at load.
    std::fs::write(&list, format!("- {{name: initech, key_hash: \"{key}\"}}\n")).unwrap();
    let v = std::process::Command::new(bin)
        .args(["validate", &file.display().to_string()])
        .output()
        .unwrap();
    assert!(!v.status.success());
    assert!(
        String::from_utf8_lossy(&v.stderr).contains("never the key"),
        "{}",
        String::from_utf8_lossy(&v.stderr)
    );
}

/// `consumers.max` is applied by a reload, as every other key is: raised,
/// the consumer it refused is made; the table keeps what it held.
#[tokio::test]
async fn a_reload_applies_a_new_consumers_max() {
    let up = Upstream::start().await;
    let dir = support::scratch_dir("rw-consumers-max");
    let file = dir.join("ratewarden.yaml");
    std::fs::write(&file, yaml("")).unwrap();
    let gw = support::spawn_binary(&file, &up.url(), &[], None);
    make(gw.admin, "acme", "pro").await;
    make(gw.admin, "globex", "free").await;
    let post = || {
        send(
            gw.admin,
            "POST",
            "/v1/consumers",
            &[("content-type", "application/json")],
            r#"{"name":"initech"}"#,
        )
    };
    assert_eq!(post().await.status, 409, "over `max: 2`");
    std::fs::write(&file, yaml("").replace("max: 2", "max: 3")).unwrap();
    support::wait_for_metric(
        gw.admin,
        "ratewarden_config_reloads_total{result=\"success\"} 1",
    )
    .await;
    let r = post().await;
    assert_eq!(r.status, 201, "{}", r.body);
    let list = json(&send(gw.admin, "GET", "/v1/consumers", &[], "").await.body);
    assert_eq!(list["max"], 3, "{list}");
    assert_eq!(
        list["consumers"].as_array().map(Vec::len),
        Some(3),
        "{list}"
    );
}

#[tokio::test]
async fn consumers_need_key_secret_and_from_consumer_needs_consumers() {
    use ratewarden_gateway::config::{self, Overrides};
    for (yaml, says) in [
        (
            "upstream: echo\nconsumers: {from: header:X-Api-Key}\n",
            "needs `key_secret:`",
        ),
        (
            "upstream: echo\nidentity: {from: consumer}\n",
            "needs a top-level `consumers:`",
        ),
        (
            "upstream: echo\nkey_secret: 0123456789abcdef0123\nconsumers: {from: cookie:k}\n",
            "header:NAME, authorization (Bearer) or query:NAME",
        ),
        (
            "upstream: echo\nkey_secret: 0123456789abcdef0123\nconsumers: {from: header:k, unknown: allow}\n",
            "consumers.unknown",
        ),
    ] {
        let e = config::load(yaml, "t.yaml", &Overrides::default()).unwrap_err();
        assert!(e.to_string().contains(says), "{yaml}: {e}");
    }
}

// The script runs on a thread of its own while the upstream answers here.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_api_product_runs_as_written() {
    let up = Upstream::start().await;
    let dir = support::scratch_dir("rw-api-product");
    let (listen, admin) = (support::free_port(), support::free_port());
    let config = support::recipe("api-product-config")
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{listen}"))
        .replace("127.0.0.1:9090", &format!("127.0.0.1:{admin}"))
        .replace("http://127.0.0.1:8000", &up.url())
        .replace("./state", &dir.join("state").display().to_string());
    std::fs::create_dir_all(dir.join("state")).unwrap();
    let file = dir.join("api.yaml");
    std::fs::write(&file, &config).unwrap();
    let _gw = support::spawn_binary_with(
        &["serve", "-c", &file.display().to_string()],
        &[("RATEWARDEN_KEY_SECRET", SECRET)],
        None,
    );
    let script = support::recipe("api-product")
        .replace("127.0.0.1:8080", &format!("127.0.0.1:{listen}"))
        .replace("127.0.0.1:9090", &format!("127.0.0.1:{admin}"));
    let out = std::process::Command::new("bash")
        .args(["-eo", "pipefail", "-c", &script])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<&str> = text.lines().map(str::trim_end).collect();
    // The call: 200 and the pro plan's limit.
    assert!(lines[0].starts_with("HTTP/1.1 200"), "{text}");
    assert!(
        lines[1].eq_ignore_ascii_case("x-ratelimit-limit: 5000"),
        "{text}"
    );
    // Its usage: one of 5000 spent.
    let usage = json(lines[2]);
    assert_eq!(usage["rules"][0]["charged"], 1, "{text}");
    assert_eq!(usage["rules"][0]["limit"], 5000, "{text}");
    assert_eq!(usage["tier"], "pro");
    assert!(lines[3].contains("\"revoked\":true"), "{text}");
    // Revoked: 401, with the challenge.
    assert!(lines[4].starts_with("HTTP/1.1 401"), "{text}");
    assert!(
        lines[5]
            .to_ascii_lowercase()
            .starts_with("www-authenticate: apikey"),
        "{text}"
    );
}
