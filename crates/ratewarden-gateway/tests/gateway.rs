//! The gateway end to end: the real server on port 0, a real upstream on
//! loopback, each seed's scenario.

mod support;

use std::time::Duration;

use ratewarden::clock::ManualClock;
use support::{Upstream, gateway, now, send};

#[tokio::test]
async fn coupon_freeze_and_forgiveness_seed_000() {
    let up = Upstream::start().await;
    let clock = ManualClock::new(now());
    let gw = gateway(
        "rules:\n  - name: coupon\n    match: {methods: [POST], path: /coupons}\n    key: [identity]\n    algorithm: sliding_window_log\n    limit: 10\n    window: 5m\n    penalty: 10m\n    count: failures\nidentity:\n  from: header\n  header: X-User-Id\n",
        &up.url(),
        Some(clock.clone()),
    )
    .await;
    let addr = gw.listen();
    let post = |user: &'static str, code: &'static str| async move {
        send(addr, "POST", "/coupons", &[("x-user-id", user)], code).await
    };
    for _ in 0..9 {
        assert_eq!(post("42", "WRONG").await.status, 400);
    }
    assert_eq!(
        post("42", "RIGHT").await.status,
        200,
        "a right code wipes the slate"
    );
    for i in 0..10 {
        clock.advance(Duration::from_secs(1));
        assert_eq!(
            post("42", "WRONG").await.status,
            400,
            "wrong code {i} reaches the upstream"
        );
    }
    let frozen = post("42", "WRONG").await;
    assert_eq!(frozen.status, 429);
    assert_eq!(frozen.header("retry-after"), Some("600"));
    assert_eq!(
        frozen.header("content-type"),
        Some("application/problem+json")
    );
    assert!(
        frozen.body.contains(r#""violated-policies":["coupon"]"#),
        "{}",
        frozen.body
    );
    assert!(frozen.body.contains("banned for 600 s"), "{}", frozen.body);
    let hits = up.hits();
    clock.advance(Duration::from_secs(300));
    let during = post("42", "RIGHT").await;
    assert_eq!(
        (during.status.as_u16(), during.header("retry-after")),
        (429, Some("300"))
    );
    assert_eq!(
        up.hits(),
        hits,
        "a frozen client never reaches the upstream"
    );
    assert_eq!(
        post("7", "RIGHT").await.status,
        200,
        "another user is unaffected"
    );
    clock.advance(Duration::from_secs(300));
    assert_eq!(post("42", "RIGHT").await.status, 200, "after the freeze");
    gw.shutdown().await;
}

/// Seed 001's own file: clicks while a generation runs are refused, one
/// after it ends passes at once; exactly one of 2 or 20 concurrent clicks
/// reaches the upstream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_double_click_admits_exactly_one_seed_001() {
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/seed-001-double-click.yaml"
    ))
    .unwrap();
    let up = support::Gated::start().await;
    let gw = gateway(&yaml, &up.url(), None).await;
    let click = |user: String| {
        let addr = gw.listen();
        tokio::spawn(async move {
            send(
                addr,
                "POST",
                "/api/interview-questions",
                &[("x-user-id", &user)],
                "",
            )
            .await
            .status
        })
    };
    for (n, user) in [(2, "user-2"), (20, "user-20")] {
        let before = up.arrived();
        let tasks: Vec<_> = (0..n).map(|_| click(user.to_owned())).collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while up.arrived() == before || tasks.iter().filter(|t| t.is_finished()).count() < n - 1 {
            assert!(std::time::Instant::now() < deadline, "{n} clicks");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(
            up.arrived() - before,
            1,
            "{n} clicks reached the upstream once"
        );
        let mut statuses = vec![];
        let mut running = vec![];
        for t in tasks {
            if t.is_finished() {
                statuses.push(t.await.unwrap());
            } else {
                running.push(t);
            }
        }
        assert!(statuses.iter().all(|s| *s == 429), "{statuses:?}");
        assert_eq!(running.len(), 1);
        up.open();
        assert_eq!(running.pop().unwrap().await.unwrap(), 200);
        // Ended: the next click passes at once, no window to wait out.
        assert_eq!(click(user.to_owned()).await.unwrap(), 200);
        up.close();
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn the_seed_002_file_limits_per_client_and_per_api_with_legacy_headers() {
    let up = Upstream::start().await;
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/seed-002-go-gateway.yaml"
    ))
    .unwrap();
    let gw = gateway(&yaml, &up.url(), None).await;
    // The post reads the client from X-Forwarded-For.
    let addr = gw.listen();
    let comment = |ip: &'static str| async move {
        send(
            addr,
            "POST",
            "/api/item/7/comment",
            &[("x-forwarded-for", ip)],
            "hi",
        )
        .await
    };
    for i in 0..5 {
        let r = comment("203.0.113.5").await;
        assert_eq!(r.status, 200, "comment {i}");
        assert_eq!(
            r.header("x-ratelimit-remaining"),
            Some(&*(4 - i).to_string()),
            "the API rule is the binding one"
        );
        assert!(
            r.header("ratelimit").is_none(),
            "legacy headers only, as the post sends"
        );
    }
    let r = comment("203.0.113.5").await;
    assert_eq!(r.status, 429);
    assert!(r.header("x-ratelimit-retry-after").is_some());
    assert_eq!(comment("203.0.113.6").await.status, 200, "per client");
    // Other paths only count against `client` (50 per minute).
    let r = send(
        gw.listen(),
        "GET",
        "/api/item/7",
        &[("x-forwarded-for", "203.0.113.5")],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-limit"), Some("50"));
    assert_eq!(
        r.header("x-ratelimit-remaining"),
        Some("44"),
        "5 comments + this one; the rejected one not charged"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_fixed_window_never_locks_out_a_client_that_kept_hammering_seed_002() {
    let up = Upstream::start().await;
    let clock = ManualClock::new(now());
    let gw = gateway(
        "rules:\n  - name: fw\n    algorithm: fixed_window\n    limit: 3\n    window: 60s\n",
        &up.url(),
        Some(clock.clone()),
    )
    .await;
    let mut rejected = 0;
    for _ in 0..50 {
        rejected += usize::from(send(gw.listen(), "GET", "/", &[], "").await.status == 429);
        clock.advance(Duration::from_millis(500));
    }
    assert!(rejected > 0);
    // Whatever the hammering, the next window admits again.
    clock.advance(Duration::from_secs(60));
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    gw.shutdown().await;
}

#[tokio::test]
async fn min_interval_and_a_rolling_window_seed_003() {
    let up = Upstream::start().await;
    let clock = ManualClock::new(now());
    let gw = gateway(
        "rules:\n  - name: messages\n    algorithm: sliding_window_log\n    limit: 3\n    window: 10s\n    min_interval: 1s\n",
        &up.url(),
        Some(clock.clone()),
    )
    .await;
    let get = || send(gw.listen(), "GET", "/", &[], "");
    assert_eq!(get().await.status, 200);
    let too_soon = get().await;
    assert_eq!(
        (too_soon.status.as_u16(), too_soon.header("retry-after")),
        (429, Some("1"))
    );
    assert!(
        too_soon.body.contains("at least 1s apart"),
        "{}",
        too_soon.body
    );
    clock.advance(Duration::from_secs(1));
    assert_eq!(get().await.status, 200);
    clock.advance(Duration::from_secs(1));
    assert_eq!(get().await.status, 200);
    clock.advance(Duration::from_secs(1));
    // Three in the last 10 s: the rolling window holds until the first leaves.
    let r = get().await;
    assert_eq!(
        (r.status.as_u16(), r.header("retry-after")),
        (429, Some("7"))
    );
    clock.advance(Duration::from_secs(7));
    assert_eq!(get().await.status, 200);
    gw.shutdown().await;
}

async fn twenty_per_minute_under_100_concurrent(yaml: &str) {
    let up = Upstream::start().await;
    let gw = gateway(yaml, &up.url(), None).await;
    let mut tasks = vec![];
    for _ in 0..100 {
        let addr = gw.listen();
        tasks.push(tokio::spawn(async move {
            send(addr, "GET", "/", &[], "").await.status.as_u16()
        }));
    }
    let mut ok = 0;
    for t in tasks {
        let s = t.await.unwrap();
        assert!(s == 200 || s == 429, "{s}");
        ok += usize::from(s == 200);
    }
    assert_eq!(ok, 20);
    assert_eq!(up.hits(), 20);
    // Every decision is counted once, under the rule's name.
    let admin = gw.admin.expect("admin listener");
    let metrics = send(admin, "GET", "/metrics", &[], "").await.body;
    for line in [
        "ratewarden_requests_total{rule=\"per-ip\",decision=\"allowed\"} 20\n",
        "ratewarden_requests_total{rule=\"per-ip\",decision=\"rejected\"} 80\n",
    ] {
        assert!(metrics.contains(line), "{line:?} missing from\n{metrics}");
    }
    gw.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_per_minute_per_ip_is_exact_under_100_concurrent_requests_in_memory() {
    twenty_per_minute_under_100_concurrent("rules:\n  - name: per-ip\n    algorithm: sliding_window_log\n    limit: 20\n    window: 60s\n").await;
}

#[tokio::test]
async fn spoofed_x_forwarded_for_from_an_untrusted_peer_is_ignored() {
    let up = Upstream::start().await;
    for (trusted, distinct) in [("10.0.0.0/8", false), ("127.0.0.1/32", true)] {
        let yaml = format!(
            "identity:\n  from: forwarded\n  trusted_proxies: [{trusted}]\nrules:\n  - name: per-ip\n    algorithm: fixed_window\n    limit: 1\n    window: 60s\n"
        );
        let gw = gateway(&yaml, &up.url(), None).await;
        let a = send(
            gw.listen(),
            "GET",
            "/",
            &[("x-forwarded-for", "198.51.100.1")],
            "",
        )
        .await;
        let b = send(
            gw.listen(),
            "GET",
            "/",
            &[("x-forwarded-for", "198.51.100.2")],
            "",
        )
        .await;
        assert_eq!(a.status, 200);
        assert_eq!(b.status == 200, distinct, "trusted {trusted}");
        // The upstream sees a trusted proxy's chain with our peer
        // appended; a client's own chain is replaced by its address
        // (`x_forwarded_for: replace`, the default).
        let want = if distinct {
            "xff=198.51.100.1, 127.0.0.1;"
        } else {
            "xff=127.0.0.1;"
        };
        assert!(a.body.contains(want), "{}", a.body);
        gw.shutdown().await;
    }
}

#[tokio::test]
async fn garbage_headers_never_crash_a_worker() {
    let up = Upstream::start().await;
    let gw = gateway(
        "identity:\n  from: forwarded\n  trusted_proxies: [127.0.0.1/32]\nrules:\n  - name: r\n    limit: 1000\n    window: 60s\n",
        &up.url(),
        None,
    )
    .await;
    let huge = "1.2.3.4,".repeat(5_000);
    for xff in [
        "",
        ",,,",
        "not-an-ip",
        "[::1",
        "999.1.1.1",
        huge.as_str(),
        "for=\"[",
        "caf\u{e9}, 1.2.3.4",
    ] {
        let r = send(
            gw.listen(),
            "GET",
            "/",
            &[("x-forwarded-for", xff), ("forwarded", xff)],
            "",
        )
        .await;
        assert_eq!(r.status, 200, "{:?}", &xff[..xff.len().min(20)]);
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn deny_answers_403_allow_is_never_limited_and_hop_by_hop_headers_are_dropped() {
    let up = Upstream::start().await;
    let gw = gateway(
        "identity: {from: header, header: X-User, missing: ip}\ndeny: [mallory]\nallow: [admin]\nrules:\n  - name: r\n    limit: 1\n    window: 60s\n",
        &up.url(),
        None,
    )
    .await;
    let r = send(gw.listen(), "GET", "/", &[("x-user", "mallory")], "").await;
    assert_eq!(r.status, 403);
    assert!(r.body.contains("\"status\":403"), "{}", r.body);
    for _ in 0..5 {
        let r = send(gw.listen(), "GET", "/", &[("x-user", "admin")], "").await;
        assert_eq!(r.status, 200);
        assert!(
            r.header("x-ratelimit-limit").is_none(),
            "not limited, so no headers"
        );
    }
    let r = send(
        gw.listen(),
        "GET",
        "/",
        &[("x-user", "bob"), ("connection", "x-hop"), ("x-hop", "1")],
        "",
    )
    .await;
    assert!(
        r.body.contains("hop=false"),
        "the request's hop-by-hop header was dropped: {}",
        r.body
    );
    assert!(
        r.header("x-secret").is_none(),
        "the response's hop-by-hop header was dropped"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn upstream_down_or_slow_is_502_or_504_with_a_problem_body() {
    // A port held for the whole test, bound but never listening: connecting
    // is refused, and no other test's server can take it meanwhile (a port
    // bound and released could be, and then answered 404).
    let held = tokio::net::TcpSocket::new_v4().unwrap();
    held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let dead = held.local_addr().unwrap();
    let gw = gateway("rules: []\n", &format!("http://{dead}"), None).await;
    let r = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(r.status, 502);
    assert_eq!(r.header("content-type"), Some("application/problem+json"));
    gw.shutdown().await;
    let up = Upstream::start().await;
    let gw = gateway("upstream_timeout: 200ms\nrules: []\n", &up.url(), None).await;
    let r = send(gw.listen(), "GET", "/slow", &[], "").await;
    assert_eq!(r.status, 504);
    assert!(r.body.contains("did not answer within 200ms"), "{}", r.body);
    gw.shutdown().await;
    // An https upstream that speaks plain HTTP: the handshake fails, the
    // 502 says why, and no request is sent in clear text.
    let gw = gateway("rules: []\n", &format!("https://{}", up.addr), None).await;
    let before = up.hits();
    let r = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(r.status, 502);
    assert!(r.body.contains("the TLS handshake failed"), "{}", r.body);
    assert_eq!(up.hits(), before, "nothing reached the upstream");
    gw.shutdown().await;
}

#[tokio::test]
async fn leaky_bucket_delay_mode_holds_requests_instead_of_rejecting() {
    let up = Upstream::start().await;
    let gw = gateway(
        "rules:\n  - name: smooth\n    algorithm: leaky_bucket\n    limit: 10\n    window: 1s\n    burst: 3\n    mode: delay\n    max_delay: 250ms\n",
        &up.url(),
        None,
    )
    .await;
    let started = std::time::Instant::now();
    let mut statuses = vec![];
    for _ in 0..4 {
        statuses.push(send(gw.listen(), "GET", "/", &[], "").await.status.as_u16());
    }
    assert_eq!(statuses[..3], [200, 200, 200]);
    // The third waited for the two ahead of it (2 × 100 ms): delayed, not rejected.
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "{:?}",
        started.elapsed()
    );
    gw.shutdown().await;
}

const IN_FLIGHT: &str = "identity: {from: header, header: X-User-Id}\nrules:\n  - name: in-flight\n    algorithm: concurrency\n    limit: 10\n    max_hold: 1m\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_in_flight_is_exact_under_100_concurrent_requests_in_memory() {
    support::in_flight_is_exact(IN_FLIGHT).await;
}
