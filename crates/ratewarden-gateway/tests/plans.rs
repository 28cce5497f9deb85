//! Plans (issue 35): a rule's limit chosen by a request value (`tiers:`),
//! one key's limit changed at runtime (`/v1/overrides`), calendar quotas,
//! and a refusal's status per rule. Through the real binary where it
//! matters (both HTTP paths; memory and Redis), in process with a manual
//! clock where time must move.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::RedisServer;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};
use ratewarden::clock::ManualClock;
use serde_json::Value;
use support::{Upstream, send};

/// A client on one of the two paths.
#[derive(Clone, Copy, Debug)]
enum Path {
    /// HTTP/1.1: the gateway's own path.
    H1,
    /// h2c: hyper's path.
    H2,
}

struct Got {
    status: StatusCode,
    headers: HeaderMap,
    body: String,
}

impl Got {
    fn header(&self, name: &str) -> &str {
        self.headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or(Value::Null)
    }
}

/// `GET /` on `path` with `headers`.
async fn get(path: Path, addr: SocketAddr, headers: &[(&str, &str)]) -> Got {
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let io = TokioIo::new(stream);
    let mut b = Request::builder().method("GET");
    let resp = match path {
        Path::H1 => {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
            tokio::spawn(conn);
            b = b.uri("/").header("host", "api.example");
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            sender
                .send_request(b.body(Full::<Bytes>::new(Bytes::new())).unwrap())
                .await
        }
        Path::H2 => {
            let (mut sender, conn) =
                hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
                    .await
                    .unwrap();
            tokio::spawn(conn);
            b = b.uri("http://api.example/");
            for (k, v) in headers {
                b = b.header(*k, *v);
            }
            sender
                .send_request(b.body(Full::<Bytes>::new(Bytes::new())).unwrap())
                .await
        }
    }
    .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body =
        String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned();
    Got {
        status,
        headers,
        body,
    }
}

/// How many of `n` requests were admitted before the first refusal; the
/// refusal (panics when none came).
async fn until_refused(
    path: Path,
    addr: SocketAddr,
    n: usize,
    headers: &[(&str, &str)],
) -> (usize, Got) {
    for i in 0..n {
        let g = get(path, addr, headers).await;
        if g.status != StatusCode::OK {
            return (i, g);
        }
    }
    panic!("{path:?}: no refusal in {n} requests with {headers:?}");
}

const TIERS: &str = r#"identity: {from: header, header: X-User}
rules:
  - name: api
    key: [identity]
    window: 1h
    tiers:
      from: header:X-Plan
      default: free
      values:
        free: {limit: 2}
        pro: {limit: 4, algorithm: token_bucket, burst: 5}
        internal: unlimited
"#;

support::both_paths!(
    each_tier_has_its_own_limit_headers_and_body,
    a_rule_refuses_with_its_own_status_and_problem_type,
);

async fn each_tier_has_its_own_limit_headers_and_body(path: Path) {
    let up = Upstream::start().await;
    let gw = support::binary(TIERS, &up.url());
    check_tiers(path, gw.listen).await;
}

/// Free 2, pro 5 (a burst of 5 on a token bucket), internal never; a
/// missing or unknown plan is free; each counts on its own.
async fn check_tiers(path: Path, a: SocketAddr) {
    let (n, refused) = until_refused(path, a, 10, &[("x-user", "alice"), ("x-plan", "free")]).await;
    assert_eq!(n, 2, "free admits 2");
    assert_eq!(refused.status, 429);
    assert!(
        refused
            .header("ratelimit-policy")
            .contains("\"api\";q=2;w=3600;tier=\"free\""),
        "{:?}",
        refused.headers
    );
    assert_eq!(refused.header("x-ratelimit-limit"), "2");
    let body = refused.json();
    assert_eq!(body["rule"], "api");
    assert_eq!(body["tier"], "free");
    let (n, refused) = until_refused(path, a, 10, &[("x-user", "bob"), ("x-plan", "pro")]).await;
    assert_eq!(n, 5, "pro admits its burst");
    assert_eq!(refused.json()["tier"], "pro");
    assert!(refused.header("ratelimit-policy").contains("tier=\"pro\""));
    // No plan, and a plan no tier has: the default.
    let (n, refused) = until_refused(path, a, 10, &[("x-user", "carol")]).await;
    assert_eq!((n, refused.json()["tier"].as_str()), (2, Some("free")));
    let (n, _) = until_refused(path, a, 10, &[("x-user", "dave"), ("x-plan", "gold")]).await;
    assert_eq!(n, 2);
    // A key that moves from free to pro starts pro afresh.
    let (n, _) = until_refused(path, a, 10, &[("x-user", "alice"), ("x-plan", "pro")]).await;
    assert_eq!(n, 5);
    for _ in 0..20 {
        let g = get(path, a, &[("x-user", "erin"), ("x-plan", "internal")]).await;
        assert_eq!(g.status, 200, "internal is unlimited");
        assert_eq!(g.header("ratelimit-policy"), "", "no rule limits it");
    }
}

async fn a_rule_refuses_with_its_own_status_and_problem_type(path: Path) {
    let up = Upstream::start().await;
    let gw = support::binary(
        r#"rules:
  - {name: quota, limit: 1, window: 1h, key: [header:X-Key], match: {headers: [{name: X-Key, present: true}]}, status: 403, problem_type: "https://example.com/probs/quota"}
  - {name: burst, limit: 1, window: 1h, key: [header:X-Other], match: {headers: [{name: X-Other, present: true}]}}
"#,
        &up.url(),
    );
    let a = gw.listen;
    let (_, quota) = until_refused(path, a, 3, &[("x-key", "k")]).await;
    assert_eq!(quota.status, 403);
    assert_eq!(quota.json()["type"], "https://example.com/probs/quota");
    assert_eq!(quota.json()["status"], 403);
    assert!(quota.header("retry-after").parse::<u64>().unwrap() > 0);
    let (_, burst) = until_refused(path, a, 3, &[("x-other", "k")]).await;
    assert_eq!(burst.status, 429, "the default stays 429");
    assert_eq!(
        burst.json()["type"],
        "https://iana.org/assignments/http-problem-types#quota-exceeded"
    );
}

/// Tiers on Redis: the same answers, each tier in its own state there.
#[tokio::test]
async fn tiers_on_redis_through_the_binary() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{type: redis, url: \"{}\", timeout: 1s}}\n{TIERS}",
        redis.url()
    );
    let gw = support::binary(&yaml, &up.url());
    check_tiers(Path::H1, gw.listen).await;
    // `/v1/keys` lists each key under the tier it counts in.
    let keys: Value = serde_json::from_str(
        &send(gw.admin, "GET", "/v1/keys?rule=api", &[], "")
            .await
            .body,
    )
    .unwrap();
    let tier_of = |key: &str, tier: &str| {
        keys["keys"]
            .as_array()
            .unwrap()
            .iter()
            .any(|k| k["key"] == key && k["tier"] == tier)
    };
    assert!(tier_of("bob", "pro") && tier_of("carol", "free"), "{keys}");
    assert!(
        tier_of("alice", "free") && tier_of("alice", "pro"),
        "{keys}"
    );
}

/// A tier named by a token's claim (`jwt:plan`), as `/v1/explain` shows.
#[tokio::test]
async fn a_tier_chosen_by_a_jwt_claim() {
    let secret = "s3cret-s3cret-s3cret-s3cret-s3cret!";
    let gw = support::gateway(
        &format!(
            "jwt: {{secret: \"{secret}\"}}\nidentity: {{from: jwt, claim: sub}}\nrules:\n  - name: api\n    window: 1h\n    tiers:\n      from: jwt:plan\n      default: free\n      values:\n        free: {{limit: 1}}\n        pro: {{limit: 3}}\n"
        ),
        "echo",
        None,
    )
    .await;
    let token = |plan: &str| hs256(secret, &format!(r#"{{"sub":"u-{plan}","plan":"{plan}"}}"#));
    for (plan, admitted) in [("pro", 3), ("free", 1), ("other", 1)] {
        let bearer = format!("Bearer {}", token(plan));
        let mut n = 0;
        for _ in 0..5 {
            let r = send(gw.listen(), "GET", "/", &[("authorization", &bearer)], "").await;
            if r.status == 200 {
                n += 1;
            }
        }
        assert_eq!(n, admitted, "{plan}");
    }
    let explained = send(
        gw.admin.unwrap(),
        "GET",
        &format!("/v1/explain?jwt={}", token("pro")),
        &[],
        "",
    )
    .await;
    let v: Value = serde_json::from_str(&explained.body).unwrap();
    assert_eq!(v["rules"][0]["tier"], "pro", "{v}");
    assert_eq!(v["rules"][0]["applied"], "tier");
    assert_eq!(v["rules"][0]["limit"], 3);
}

/// An HS256 token of `claims`.
fn hs256(secret: &str, claims: &str) -> String {
    use base64::Engine;
    let b64 = |b: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b);
    let signing = format!(
        "{}.{}",
        b64(br#"{"alg":"HS256","typ":"JWT"}"#),
        b64(claims.as_bytes())
    );
    let key = aws_lc_rs::hmac::Key::new(aws_lc_rs::hmac::HMAC_SHA256, secret.as_bytes());
    let tag = aws_lc_rs::hmac::sign(&key, signing.as_bytes());
    format!("{signing}.{}", b64(tag.as_ref()))
}

const OVERRIDABLE: &str = r#"identity: {from: header, header: X-User}
overrides: {max: 2}
rules:
  - name: api
    window: 1h
    tiers:
      from: header:X-Plan
      default: free
      values:
        free: {limit: 2}
        pro: {limit: 4}
"#;

async fn admitted(addr: SocketAddr, user: &str, plan: &str, n: usize) -> usize {
    let mut ok = 0;
    for _ in 0..n {
        let r = send(addr, "GET", "/", &[("x-user", user), ("x-plan", plan)], "").await;
        if r.status == 200 {
            ok += 1;
        }
    }
    ok
}

/// Overrides on memory: precedence (over the tier), what explain says,
/// expiry on the manual clock, the bound, a DELETE restoring the tier,
/// and a cross-site browser write refused.
#[tokio::test]
async fn an_override_wins_over_the_tier_until_it_expires_or_is_deleted() {
    let clock = ManualClock::new(1_800_000_000_000_000);
    let gw = support::gateway(OVERRIDABLE, "echo", Some(clock.clone())).await;
    let admin = gw.admin.unwrap();
    let json = [("content-type", "application/json")];
    let r = send(
        admin,
        "PUT",
        "/v1/overrides/api/alice",
        &json,
        r#"{"limit": 5, "expires_in": "10m", "note": "ticket 4711"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.body);
    // Precedence: the override, though alice says pro.
    assert_eq!(admitted(gw.listen(), "alice", "pro", 8).await, 5);
    let e: Value = serde_json::from_str(
        &send(
            admin,
            "GET",
            "/v1/explain?identity=alice&header:X-Plan=pro",
            &[],
            "",
        )
        .await
        .body,
    )
    .unwrap();
    assert_eq!(e["rules"][0]["applied"], "override", "{e}");
    assert_eq!(e["rules"][0]["limit"], 5);
    let listed: Value = serde_json::from_str(
        &send(admin, "GET", "/v1/overrides?rule=api", &[], "")
            .await
            .body,
    )
    .unwrap();
    assert_eq!(listed["count"], 1);
    assert_eq!(listed["overrides"][0]["key"], "alice");
    assert_eq!(listed["overrides"][0]["note"], "ticket 4711");
    assert_eq!(listed["overrides"][0]["expires_in"], 600.0);
    // The bound: 2.
    assert_eq!(
        send(
            admin,
            "PUT",
            "/v1/overrides/api/bob",
            &json,
            r#"{"limit": 9}"#
        )
        .await
        .status,
        200
    );
    let full = send(
        admin,
        "PUT",
        "/v1/overrides/api/carol",
        &json,
        r#"{"limit": 9}"#,
    )
    .await;
    assert_eq!(full.status, 409, "{}", full.body);
    assert!(full.body.contains("at most 2"), "{}", full.body);
    // Bad parameters, a rule that does not exist.
    assert_eq!(
        send(
            admin,
            "PUT",
            "/v1/overrides/api/carol",
            &json,
            r#"{"limit": 0}"#
        )
        .await
        .status,
        400
    );
    assert_eq!(
        send(
            admin,
            "PUT",
            "/v1/overrides/nope/carol",
            &json,
            r#"{"limit": 1}"#
        )
        .await
        .status,
        404
    );
    // A browser on another site may not write.
    let cross = send(
        admin,
        "DELETE",
        "/v1/overrides/api/bob",
        &[
            ("sec-fetch-site", "cross-site"),
            ("origin", "https://evil.example"),
        ],
        "",
    )
    .await;
    assert_eq!(cross.status, 403);
    assert_eq!(
        send(admin, "GET", "/v1/overrides/api/bob", &[], "")
            .await
            .status,
        200,
        "still there"
    );
    // Deleted: bob is back on his tier (free: 2).
    let del = send(admin, "DELETE", "/v1/overrides/api/bob", &[], "").await;
    assert!(del.body.contains("\"removed\":true"), "{}", del.body);
    assert_eq!(admitted(gw.listen(), "bob", "free", 4).await, 2);
    // Expired after 10 minutes: alice is on her tier again, as used
    // before the override (pro, untouched: 4).
    clock.advance(Duration::from_secs(601));
    assert_eq!(
        send(admin, "GET", "/v1/overrides/api/alice", &[], "")
            .await
            .status,
        404
    );
    assert_eq!(admitted(gw.listen(), "alice", "pro", 6).await, 4);
    gw.shutdown().await;
}

/// Overrides on Redis: set through gateway A, in force on gateway B within
/// a second; both restarted, still in force; deleted through B, gone on A.
#[tokio::test]
async fn an_override_set_on_one_gateway_holds_on_another_and_across_restarts() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{type: redis, url: \"{}\", timeout: 1s}}\n{OVERRIDABLE}",
        redis.url()
    );
    let a = support::binary(&yaml, &up.url());
    let b = support::binary(&yaml, &up.url());
    let json = [("content-type", "application/json")];
    let set = send(
        a.admin,
        "PUT",
        "/v1/overrides/api/alice",
        &json,
        r#"{"limit": 6}"#,
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.body);
    let t = Instant::now();
    loop {
        let v: Value =
            serde_json::from_str(&send(b.admin, "GET", "/v1/overrides", &[], "").await.body)
                .unwrap();
        if v["count"] == 1 {
            break;
        }
        // Polled every 250 ms: on B within a second on a quiet host; the
        // deadline leaves a busy one room.
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "not on B within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let seen = t.elapsed();
    // Six between the two gateways: the override's state is shared too.
    let n =
        admitted(a.listen, "alice", "free", 4).await + admitted(b.listen, "alice", "free", 4).await;
    assert_eq!(n, 6, "on B after {seen:?}");
    drop((a, b));
    let a = support::binary(&yaml, &up.url());
    let b = support::binary(&yaml, &up.url());
    let v: Value = serde_json::from_str(
        &send(a.admin, "GET", "/v1/overrides/api/alice", &[], "")
            .await
            .body,
    )
    .unwrap();
    assert_eq!(v["limit"], 6, "kept across restarts: {v}");
    assert_eq!(
        admitted(a.listen, "alice", "free", 2).await,
        0,
        "still its used-up state"
    );
    let del = send(b.admin, "DELETE", "/v1/overrides/api/alice", &[], "").await;
    assert!(del.body.contains("\"removed\":true"), "{}", del.body);
    let t = Instant::now();
    while send(a.admin, "GET", "/v1/overrides/api/alice", &[], "")
        .await
        .status
        != 404
    {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "not gone from A within 10 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Back on the free tier, as used before: its own state, untouched.
    assert_eq!(admitted(a.listen, "alice", "free", 4).await, 2);
}

/// A monthly quota in Seoul: the headers count to the local reset, and
/// `RateLimit-Policy` has no `w`.
#[tokio::test]
async fn a_calendar_quota_resets_at_local_midnight_and_says_when() {
    // 2027-01-31T14:59:00Z: 23:59 in Seoul, a minute before February.
    let clock = ManualClock::new(1_801_407_540_000_000);
    let gw = support::gateway(
        "rules:\n  - name: monthly\n    algorithm: fixed_window\n    limit: 2\n    calendar: {period: month, timezone: Asia/Seoul}\n    status: 403\n",
        "echo",
        Some(clock.clone()),
    )
    .await;
    for _ in 0..2 {
        assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    }
    let refused = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(refused.status, 403);
    assert_eq!(refused.header("retry-after"), Some("60"));
    assert_eq!(refused.header("x-ratelimit-reset"), Some("60"));
    assert_eq!(refused.header("ratelimit"), Some("\"monthly\";r=0;t=60"));
    assert_eq!(refused.header("ratelimit-policy"), Some("\"monthly\";q=2"));
    clock.advance(Duration::from_secs(60));
    let fresh = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(fresh.status, 200);
    // February 2027 in Seoul: 28 days.
    assert_eq!(
        fresh.header("x-ratelimit-reset"),
        Some(&*(28 * 86_400).to_string())
    );
    gw.shutdown().await;
}
