//! The refusal cache (issue 51): under a flood from one key on Redis, two
//! gateways answer the key's refusals themselves until they lapse, so
//! Redis is asked about a refused key once per gateway, not once per
//! request; nothing more is admitted than the limit; a key cleared or
//! overridden through one gateway is decided by Redis again on the other
//! within a second.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use std::time::{Duration, Instant};

use common::RedisServer;
use support::{Binary, Upstream, send};

/// The decision calls Redis has answered (functions, or scripts).
fn decisions(redis: &RedisServer) -> u64 {
    let stats = redis.cli(&["INFO", "commandstats"]);
    stats
        .lines()
        .filter(|l| {
            l.starts_with("cmdstat_fcall:")
                || l.starts_with("cmdstat_evalsha:")
                || l.starts_with("cmdstat_fcall_ro:")
        })
        .map(|l| {
            let calls = l.split("calls=").nth(1).unwrap();
            calls[..calls.find(',').unwrap()].parse::<u64>().unwrap()
        })
        .sum()
}

/// Statuses of `n` requests, alternating between the gateways.
async fn flood(gws: [&Binary; 2], n: usize) -> Vec<u16> {
    let mut out = vec![];
    for i in 0..n {
        out.push(
            send(gws[i % 2].listen, "GET", "/", &[], "")
                .await
                .status
                .as_u16(),
        );
    }
    out
}

fn admitted(codes: &[u16]) -> usize {
    codes.iter().filter(|&&c| c == 200).count()
}

/// Waits (at most 1 s) until `gw` admits a request; how long it took.
async fn admits_within_a_second(gw: &Binary) -> Duration {
    let t = Instant::now();
    loop {
        if send(gw.listen, "GET", "/", &[], "").await.status == 200 {
            return t.elapsed();
        }
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "still refused after 1 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_flood_from_one_key_costs_redis_one_call_per_gateway_and_admits_nothing_more() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{type: redis, url: \"{}\", timeout: 1s}}\n\
         rules:\n  - {{name: api, algorithm: fixed_window, limit: 5, window: 1h}}\n",
        redis.url()
    );
    let a = support::binary(&yaml, &up.url());
    let b = support::binary(&yaml, &up.url());
    let gws = [&a, &b];
    // The limit, then the flood: 400 refusals between the two.
    assert_eq!(admitted(&flood(gws, 5).await), 5);
    let before = decisions(&redis);
    let codes = flood(gws, 400).await;
    let calls = decisions(&redis) - before;
    assert_eq!(admitted(&codes), 0, "over-admission in the flood");
    assert!(codes.iter().all(|&c| c == 429), "{codes:?}");
    // One call per gateway (each learns the refusal once).
    assert!(
        calls as f64 / 400.0 <= 0.01,
        "{calls} Redis decisions for 400 refused requests"
    );
    let cached = |gw: &Binary| {
        let gw = gw.admin;
        async move {
            let m = send(gw, "GET", "/metrics", &[], "").await.body;
            m.lines()
                .find_map(|l| l.strip_prefix("ratewarden_refusals_cached_total "))
                .unwrap()
                .parse::<u64>()
                .unwrap()
        }
    };
    assert_eq!(cached(&a).await + cached(&b).await, 400 - calls);
    // The refusal's headers still count down from Redis's answer (the
    // window ends at the hour): a kept refusal says what Redis says.
    let kept = send(b.listen, "GET", "/", &[], "").await;
    let retry: u64 = kept.header("retry-after").unwrap().parse().unwrap();
    let at_end = 3600 - support::now() / 1_000_000 % 3600;
    assert!(retry.abs_diff(at_end) <= 1, "{retry} against {at_end}");
    assert_eq!(kept.header("x-ratelimit-remaining"), Some("0"));

    // Cleared through A: B asks Redis again within a second, and the key
    // has its 5 again, no more.
    let cleared = send(a.admin, "DELETE", "/v1/keys/api/127.0.0.1", &[], "").await;
    assert_eq!(cleared.status, 200, "{}", cleared.body);
    let took = admits_within_a_second(&b).await;
    println!("400 refusals, {calls} Redis decisions; cleared on A, B admitted after {took:?}");
    let more = 1 + admitted(&flood(gws, 20).await);
    assert_eq!(more, 5, "after the clear (B admitted after {took:?})");

    // Overridden through A (a rule of its own): B decides by it within a
    // second, despite the refusal it keeps.
    let _ = flood(gws, 10).await;
    let set = send(
        a.admin,
        "PUT",
        "/v1/overrides/api/127.0.0.1",
        &[("content-type", "application/json")],
        r#"{"limit": 8}"#,
    )
    .await;
    assert_eq!(set.status, 200, "{}", set.body);
    let took = admits_within_a_second(&b).await;
    println!("overridden on A, B admitted after {took:?}");
    let more = 1 + admitted(&flood(gws, 20).await);
    assert_eq!(more, 8, "under the override (B admitted after {took:?})");
}
