//! The README's guarantees on Redis, through whole gateways: exact on a
//! busy host, a stated bound through an outage, and bans that outlast one.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod support;

use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::RedisServer;
use ratewarden_gateway::server::Running;
use support::{Upstream, gateway, send};

/// Two CPU-bound processes (shell busy loops), killed when dropped: on a
/// 2-core host, every core is wanted by something else as well.
struct Hogs(Vec<Child>);

impl Hogs {
    fn start() -> Self {
        Self(
            (0..2)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("sh")
                })
                .collect(),
        )
    }
}

impl Drop for Hogs {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `n` requests at once, spread over `gateways` in turn; how many were
/// admitted (200), and any status that was neither 200 nor 429.
async fn burst(gateways: &[SocketAddr], n: usize, path: &'static str) -> (usize, Vec<u16>) {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let addr = gateways[i % gateways.len()];
            tokio::spawn(async move { send(addr, "GET", path, &[], "").await.status.as_u16() })
        })
        .collect();
    let (mut ok, mut odd) = (0, vec![]);
    for t in tasks {
        match t.await.unwrap() {
            200 => ok += 1,
            429 => {}
            s => odd.push(s),
        }
    }
    (ok, odd)
}

/// 120 concurrent requests on one key, `limit: 20`, default store settings,
/// two CPU hogs beside the gateways and Redis: exactly 20 admitted, for
/// every algorithm but `sliding_window_counter` (an estimate by design),
/// through one gateway and through two.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exact_on_redis_while_two_cpu_hogs_run() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let _hogs = Hogs::start();
    for algo in [
        "fixed_window",
        "sliding_window_log",
        "token_bucket",
        "leaky_bucket",
        "gcra",
        "concurrency",
    ] {
        for n in [1, 2] {
            // Concurrency counts requests in flight: the upstream holds
            // each admitted one for 3 s, longer than the burst takes.
            let (shape, path) = match algo {
                "concurrency" => ("    max_hold: 60s\n", "/slow"),
                _ => ("    window: 60s\n", "/"),
            };
            let yaml = format!(
                "store:\n  type: redis\n  url: {}\n  key_prefix: \"busy-{algo}-{n}:\"\nrules:\n  - name: r\n    algorithm: {algo}\n    limit: 20\n{shape}",
                redis.url()
            );
            let mut gws: Vec<Running> = vec![];
            for _ in 0..n {
                gws.push(gateway(&yaml, &up.url(), None).await);
            }
            let addrs: Vec<SocketAddr> = gws.iter().map(|g| g.listen()).collect();
            let started = Instant::now();
            let (ok, odd) = burst(&addrs, 120, path).await;
            eprintln!(
                "{algo} on {n} gateway(s): {ok} admitted in {:?}",
                started.elapsed()
            );
            assert!(odd.is_empty(), "{algo} on {n}: statuses {odd:?}");
            assert_eq!(ok, 20, "{algo} on {n} gateway(s)");
            for g in gws {
                g.shutdown().await;
            }
        }
    }
}

/// The admin API's count of gateways sharing the store, as `gw` last read.
async fn gateways_seen(gw: &Running) -> u64 {
    let m = send(gw.admin.unwrap(), "GET", "/metrics", &[], "")
        .await
        .body;
    m.lines()
        .find_map(|l| l.strip_prefix("ratewarden_store_gateways "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Two gateways under traffic, Redis killed in mid-window: the requests
/// admitted for the window stay within the README's bound, limit + max(limit,
/// N) for N gateways (no call was in flight at the kill), and are exactly
/// what the shares give: 10 on Redis before, then floor(20 / 2) on each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_outage_admits_within_the_stated_bound() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let limit = 20;
    let yaml = format!(
        "store:\n  type: redis\n  url: {}\nrules:\n  - name: r\n    algorithm: sliding_window_log\n    limit: {limit}\n    window: 1h\n",
        redis.url()
    );
    let (a, b) = (
        gateway(&yaml, &up.url(), None).await,
        gateway(&yaml, &up.url(), None).await,
    );
    // Each gateway has connected, announced itself and read the other.
    let deadline = Instant::now() + Duration::from_secs(10);
    for g in [&a, &b] {
        while gateways_seen(g).await != 2 {
            let _ = send(g.listen(), "GET", "/", &[], "").await;
            assert!(
                Instant::now() < deadline,
                "the gateways never saw each other"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    // The warm-up requests' count cleared; not FLUSHALL, which would also
    // drop the gateways' announcements (a gateway re-announcing first
    // would count itself alone until its next announcement: a race the
    // kill below could land in).
    let cleared = send(a.admin.unwrap(), "DELETE", "/v1/keys/r/127.0.0.1", &[], "").await;
    assert_eq!(cleared.status, 200, "{}", cleared.body);
    let mut admitted = 0;
    for g in [&a, &b] {
        for _ in 0..5 {
            admitted += usize::from(send(g.listen(), "GET", "/", &[], "").await.status == 200);
        }
    }
    assert_eq!(admitted, 10, "on Redis before the kill");
    redis.kill();
    for g in [&a, &b] {
        for _ in 0..30 {
            let s = send(g.listen(), "GET", "/", &[], "").await.status;
            assert!(s == 200 || s == 429, "on_error: local answers: {s}");
            admitted += usize::from(s == 200);
        }
    }
    let n = 2;
    let bound = limit + limit.max(n);
    eprintln!("outage: {admitted} admitted in the window, bound {bound}");
    assert!(admitted <= bound, "{admitted} > {bound}");
    assert_eq!(admitted, 10 + 2 * (limit / n), "each gateway its share");
    // Ready all the while: on_error: local answers every request.
    let r = send(a.admin.unwrap(), "GET", "/readyz", &[], "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("\"state\":\"down\""), "{}", r.body);
    a.shutdown().await;
    b.shutdown().await;
}

/// A ban a gateway learnt from Redis holds through an outage: the key stays
/// refused on that gateway's local decisions until the ban ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ban_seen_on_redis_outlasts_an_outage() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store:\n  type: redis\n  url: {}\nrules:\n  - name: r\n    algorithm: fixed_window\n    limit: 2\n    window: 1h\n    penalty: 10m\n",
        redis.url()
    );
    let gw = gateway(&yaml, &up.url(), None).await;
    let gw_listen = gw.listen();
    let statuses = |n| async move {
        let mut out = vec![];
        for _ in 0..n {
            out.push(send(gw_listen, "GET", "/", &[], "").await.status.as_u16());
        }
        out
    };
    assert_eq!(statuses(3).await, [200, 200, 429], "banned on Redis");
    redis.kill();
    let during = statuses(5).await;
    assert!(
        during.iter().all(|s| *s == 429),
        "the ban held locally: {during:?}"
    );
    gw.shutdown().await;
}
