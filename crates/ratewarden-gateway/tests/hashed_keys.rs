//! Credentials are never stored in clear (issue 34): a key part marked
//! `{hash: ...}` reaches Redis, the logs, `/metrics`, `/v1/keys` and the
//! access log only as a keyed hash, through the real binary; the admin
//! API takes the clear value and hashes it as the proxy does.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use common::RedisServer;
use support::{Upstream, send};

const SECRET: &str = "sk_live_4242424242";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hashed_api_key_is_nowhere_in_clear() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let scratch = support::scratch_dir("rw-hashed");
    let access = scratch.join("access.log");
    let yaml = format!(
        "store: {{type: redis, url: \"{}\"}}\nkey_secret: ${{RW_TEST_KEY_SECRET}}\naccess_log: {{path: {}}}\nrules:\n  - name: per-api-key\n    key: [{{hash: 'header:X-Api-Key'}}]\n    limit: 2\n    window: 1h\n  - name: per-query-key\n    key: [{{hash: 'query:api_key'}}, method]\n    limit: 2\n    window: 1h\n    match: {{path: /q}}\n",
        redis.url(),
        access.display()
    );
    let dir = support::scratch_dir("rw-hashed-conf");
    let file = dir.join("ratewarden.yaml");
    std::fs::write(&file, format!("admin: {{listen: 127.0.0.1:0}}\n{yaml}")).unwrap();
    let gw = support::spawn_binary(
        &file,
        &up.url(),
        &[("RW_TEST_KEY_SECRET", "0123456789abcdef0123456789abcdef")],
        Some(dir),
    );
    let mut statuses = vec![];
    for _ in 0..3 {
        statuses.push(
            send(gw.listen, "GET", "/", &[("x-api-key", SECRET)], "")
                .await
                .status,
        );
    }
    assert_eq!(statuses, [200, 200, 429], "one bucket per (hashed) key");
    let other = send(gw.listen, "GET", "/", &[("x-api-key", "another")], "").await;
    assert_eq!(other.status, 200, "another key, another bucket");
    for _ in 0..3 {
        send(
            gw.listen,
            "GET",
            &format!("/q?api_key={SECRET}"),
            &[("x-api-key", "q")],
            "",
        )
        .await;
    }
    // The refusal log line names the key: its hash.
    let line = gw.wait_for_line(|l| l.contains("rejected") && l.contains("per-api-key"));
    assert!(line.contains("key=\"#"), "{line}");
    // Everywhere a key can be seen.
    let keys = redis.cli(&["KEYS", "*"]);
    let metrics = send(gw.admin, "GET", "/metrics", &[], "").await.body;
    let listed = send(gw.admin, "GET", "/v1/keys?rule=per-api-key", &[], "")
        .await
        .body;
    let listed_q = send(gw.admin, "GET", "/v1/keys?rule=per-query-key", &[], "")
        .await
        .body;
    let logs = gw.lines.lock().unwrap().join("");
    // The access log is written every 200 ms: wait for the refused line.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let access_text = loop {
        let t = std::fs::read_to_string(&access).unwrap_or_default();
        if t.contains("\"status\":429") || t.contains(" 429 ") {
            break t;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no refusal in the access log: {t}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    for (place, text) in [
        ("redis KEYS *", &keys),
        ("/metrics", &metrics),
        ("/v1/keys", &listed),
        ("/v1/keys (query)", &listed_q),
        ("the log", &logs),
        ("the access log", &access_text),
    ] {
        // (The access log's request line holds the target as sent, query
        // included: that is the request, not a key; the key field is
        // checked below.)
        let text = text.replace(&format!("api_key={SECRET}"), "");
        assert!(!text.contains(SECRET), "{place} holds the secret:\n{text}");
    }
    assert!(keys.contains(":#"), "the state keys name the hash: {keys}");
    assert!(listed.contains("\"key\":\"#"), "{listed}");
    // The admin API takes the clear value and hashes it as the proxy does.
    let explain = send(
        gw.admin,
        "GET",
        &format!("/v1/explain?header:X-Api-Key={SECRET}"),
        &[],
        "",
    )
    .await
    .body;
    assert!(explain.contains("\"would_allow\":false"), "{explain}");
    assert!(!explain.contains(SECRET), "{explain}");
    let cleared = send(
        gw.admin,
        "DELETE",
        &format!("/v1/keys/per-api-key/{SECRET}"),
        &[],
        "",
    )
    .await;
    assert!(cleared.status.is_success(), "{}", cleared.body);
    let again = send(gw.listen, "GET", "/", &[("x-api-key", SECRET)], "").await;
    assert_eq!(again.status, 200, "cleared through its clear value");
}
