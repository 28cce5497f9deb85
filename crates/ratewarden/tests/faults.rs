//! The faults a real network brings (issue 52), through a fault proxy
//! between the store and Redis, and a Cluster moving a slot under
//! traffic: each counts admissions against the limit, not against "no
//! errors".

mod common;
#[path = "common/logs.rs"]
mod logs;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::fault::FaultProxy;
use common::netns::Partitioned;
use common::{RedisCluster, RedisServer};
use ratewarden::algorithm::Kind;
use ratewarden::{Fallback, MemoryStore, Mode, OnError, Op, RedisConfig, RedisStore, Rule, Store};

fn rule(name: &str, limit: u64) -> Rule {
    Rule::builder(name)
        .algorithm(Kind::FixedWindow)
        .limit(limit, Duration::from_secs(3_600))
        .build()
        .unwrap()
}

fn store(config: RedisConfig) -> Arc<Fallback<RedisStore>> {
    Arc::new(Fallback::new(
        RedisStore::new(config).unwrap(),
        OnError::Local,
        MemoryStore::default(),
    ))
}

/// A store on `cluster`, its keys under `prefix`, calls allowed `timeout_ms`.
fn on_cluster(cluster: &RedisCluster, prefix: &str, timeout_ms: u64) -> Arc<Fallback<RedisStore>> {
    store(RedisConfig {
        cluster: cluster.urls(),
        key_prefix: prefix.into(),
        timeout: Duration::from_millis(timeout_ms),
        ..RedisConfig::default()
    })
}

/// Decisions on `key` from `tasks` callers for `for_how_long`: how many
/// were admitted.
async fn load(
    s: &Arc<Fallback<RedisStore>>,
    r: &Arc<Rule>,
    key: &'static str,
    tasks: usize,
    for_how_long: Duration,
) -> u64 {
    let admitted = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + for_how_long;
    let mut all = vec![];
    for _ in 0..tasks {
        let (s, r, admitted) = (s.clone(), r.clone(), admitted.clone());
        all.push(tokio::spawn(async move {
            while Instant::now() < until {
                let op = [Op::new(&r, key)];
                if let Ok(v) = s.decide(&op, 1, Mode::Apply).await
                    && v[0].allowed()
                {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    for t in all {
        t.await.unwrap();
    }
    admitted.load(Ordering::Relaxed)
}

/// Latency that stays above the timeout: every call is late (refused, as
/// the late-call rule says), and it stays late through the silence that
/// follows (nothing answered within the timeout for 3 s). Before, that
/// silence replaced the connections; the new one could not be made within
/// one call's timeout over the slow link, was taken for an outage, and
/// decisions went local: 30 admitted on a limit of 20 while Redis answered
/// every call, only late. A late answer is proof of life: the store now
/// asks the silent server with a ping that may take longer, and keeps its
/// connections when it answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn latency_past_the_timeout_stays_late_through_the_silence() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let s = store(RedisConfig {
        url: Some(proxy.url()),
        key_prefix: "f:".into(),
        timeout: Duration::from_millis(200),
        ..RedisConfig::default()
    });
    let r = Arc::new(rule("slow", 20));
    let mut admitted = 0;
    for _ in 0..10 {
        let op = [Op::new(&r, "k")];
        admitted += u64::from(s.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
    }
    assert_eq!(admitted, 10);
    // 1.5 s there and back, ±100 ms: every call is past its 200 ms.
    proxy.delay(Duration::from_millis(700), Duration::from_millis(100));
    admitted += load(&s, &r, "k", 4, Duration::from_secs(8)).await;
    assert!(s.local().is_empty(), "decided locally while Redis answered");
    assert!(!s.primary().circuit_open());
    assert_eq!(s.primary().errors_by_kind()[0], ("unavailable", 0));
    assert!(s.late_answers() > 50, "{}", s.late_answers());
    proxy.heal();
    // Back to answering within the timeout; the late calls were applied
    // by Redis as they arrived: the limit holds over all of it.
    tokio::time::sleep(Duration::from_secs(2)).await;
    admitted += load(&s, &r, "k", 4, Duration::from_secs(1)).await;
    assert!(admitted <= 20, "{admitted} admitted on a limit of 20");
    assert!(s.local().is_empty());
    let op = [Op::new(&r, "k")];
    let left = s.decide(&op, 1, Mode::Peek).await.unwrap()[0]
        .check
        .remaining;
    assert_eq!(left, 0, "Redis holds the limit spent");
}

/// A link that stops answering for good (a blackhole, the connection left
/// open) is still found down: after the silence and an unanswered ping the
/// store connects afresh, the new connection is not made, and decisions
/// follow `on_error` within the stated outage bound; healed, they are
/// Redis's again. The unanswered pings (one every few hundred ms while
/// calls keep coming) are logged once per 10 s, not each time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackhole_is_still_an_outage_and_heals() {
    logs::keep();
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port);
    let s = store(RedisConfig {
        url: Some(proxy.url()),
        key_prefix: "b:".into(),
        timeout: Duration::from_millis(200),
        ..RedisConfig::default()
    });
    let r = Arc::new(rule("hole", 20));
    let op = [Op::new(&r, "k")];
    assert!(s.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
    proxy.stall(true, true);
    // New connections through the proxy are stalled too: never made.
    let _ = load(&s, &r, "k", 2, Duration::from_secs(10)).await;
    assert!(
        !s.local().is_empty(),
        "a link that never answers was never taken for an outage"
    );
    let said = logs::containing(&["redis silent", &proxy.url()]);
    assert_eq!(
        said.len(),
        1,
        "one line for a 10 s stall (the first after 3 s of silence, the next 10 s later): {said:#?}"
    );
    assert!(said[0].starts_with("WARN"), "{said:?}");
    proxy.heal();
    proxy.cut();
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let before = s.primary().errors_by_kind()[0].1;
        let v = s.decide(&op, 1, Mode::Peek).await;
        if v.is_ok() && s.primary().errors_by_kind()[0].1 == before && !s.primary().circuit_open() {
            break;
        }
        assert!(Instant::now() < deadline, "not back on Redis");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 120 concurrent decisions on key `k`, spread over 200 ms (40 start
/// times, 5 ms apart), each admission counted in `admitted`.
fn burst(
    s: &Arc<Fallback<RedisStore>>,
    r: &Arc<Rule>,
    admitted: &Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..120u64)
        .map(|i| {
            let (s, r, admitted) = (s.clone(), r.clone(), admitted.clone());
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i % 40 * 5)).await;
                let op = [Op::new(&r, "k")];
                if let Ok(v) = s.decide(&op, 1, Mode::Apply).await
                    && v[0].allowed()
                {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect()
}

/// Moves `slot` from `src` to `dst` as an operator would, with pauses for
/// traffic to meet each step: `SETSLOT … IMPORTING` on `dst`, `MIGRATING`
/// on `src`, `MIGRATE` of its keys, then `SETSLOT … NODE` on every node of
/// `nodes`. What `MIGRATE` said.
fn move_slot(nodes: &[&RedisServer], slot: &str, src: &RedisServer, dst: &RedisServer) -> String {
    let (src_id, dst_id) = (src.cli(&["cluster", "myid"]), dst.cli(&["cluster", "myid"]));
    std::thread::sleep(Duration::from_millis(30));
    dst.cli(&["cluster", "setslot", slot, "importing", &src_id]);
    src.cli(&["cluster", "setslot", slot, "migrating", &dst_id]);
    std::thread::sleep(Duration::from_millis(40));
    let keys = src.cli(&["cluster", "getkeysinslot", slot, "100"]);
    let port = dst.port.to_string();
    let mut args = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "keys"];
    args.extend(keys.lines());
    let out = src.cli(&args);
    std::thread::sleep(Duration::from_millis(40));
    for n in nodes {
        n.cli(&["cluster", "setslot", slot, "node", &dst_id]);
    }
    out
}

/// The slot of a hot key moves between masters while 120 concurrent
/// requests at a limit of 20 are decided (`SETSLOT … IMPORTING` /
/// `MIGRATING`, `MIGRATE`, `SETSLOT … NODE`): a `MOVED` or `ASK` means
/// nothing was applied, so the store follows it and tries again within
/// the timeout, and never decides locally because of it. Before, 21-32
/// were admitted in 10 of 11 runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_moving_under_traffic_admits_no_more_than_the_limit() {
    let cluster = RedisCluster::start();
    for run in 0..4 {
        let s = on_cluster(&cluster, &format!("m{run}:"), 500);
        let r = Arc::new(rule("hot", 20));
        let op = [Op::new(&r, "k")];
        assert!(s.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
        // The key's slot and its owner.
        let node = &cluster.nodes[0];
        let key = cluster
            .nodes
            .iter()
            .flat_map(|n| {
                let keys = n.cli(&["keys", &format!("m{run}:*")]);
                keys.lines().map(str::to_owned).collect::<Vec<_>>()
            })
            // Not the gateways' announcement.
            .find(|k| !k.contains("{ratewarden}"))
            .expect("the state key");
        let slot = node.cli(&["cluster", "keyslot", &key]);
        let src = cluster.master_of(0, &key).unwrap();
        let at = |port: u16| cluster.nodes.iter().find(|n| n.port == port).unwrap();
        let dst = cluster
            .nodes
            .iter()
            .map(|n| n.port)
            .find(|p| *p != src)
            .unwrap();
        let admitted = Arc::new(AtomicU64::new(1));
        let calls = burst(&s, &r, &admitted);
        let moving = {
            let nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
            tokio::task::block_in_place(|| move_slot(&nodes, &slot, at(src), at(dst)))
        };
        assert!(
            moving.contains("OK") || moving.contains("NOKEY"),
            "{moving}"
        );
        for c in calls {
            c.await.unwrap();
        }
        let admitted = admitted.load(Ordering::Relaxed);
        assert!(
            admitted <= 20,
            "run {run}: {admitted} admitted on a limit of 20"
        );
        assert!(
            s.local().is_empty(),
            "run {run}: decided locally during a slot move"
        );
        assert_eq!(cluster.master_of(0, &key), Some(dst), "the slot moved");
    }
}

/// Two gateways' stores, each behind its own fault proxy to one server.
struct Two {
    _server: RedisServer,
    proxies: [FaultProxy; 2],
    stores: [Arc<Fallback<RedisStore>>; 2],
}

fn two(prefix: &str, timeout: Duration) -> Two {
    let server = RedisServer::start();
    let proxies = [
        FaultProxy::start(server.port),
        FaultProxy::start(server.port),
    ];
    let mk = |p: &FaultProxy| {
        store(RedisConfig {
            url: Some(p.url()),
            key_prefix: prefix.into(),
            timeout,
            ..RedisConfig::default()
        })
    };
    let stores = [mk(&proxies[0]), mk(&proxies[1])];
    Two {
        _server: server,
        proxies,
        stores,
    }
}

/// What traffic on both gateways saw: admissions per key, and each
/// decision's time.
#[derive(Default)]
struct Seen {
    admitted: std::collections::HashMap<&'static str, u64>,
    micros: Vec<u64>,
    errors: u64,
}

impl Seen {
    fn p99(&mut self) -> Duration {
        self.micros.sort_unstable();
        let i = (self.micros.len() * 99 / 100).min(self.micros.len().saturating_sub(1));
        Duration::from_micros(self.micros.get(i).copied().unwrap_or(0))
    }

    fn max(&self) -> Duration {
        Duration::from_micros(self.micros.iter().copied().max().unwrap_or(0))
    }
}

/// `n` admissions on `key` through each store, then a wait for both to
/// have announced themselves and read that there are two (`N = 2`).
async fn prime(stores: &[Arc<Fallback<RedisStore>>], r: &Rule, key: &str, n: u64) {
    for s in stores {
        for _ in 0..n {
            let op = [Op::new(r, key)];
            assert!(s.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
        }
    }
    tokio::time::sleep(Duration::from_millis(2_200)).await;
    for s in stores {
        assert_eq!(s.primary().instances(), 2);
    }
}

/// `tasks` callers per store in `stores`, each deciding `rule` on `keys`
/// in turn for `for_how_long`, 10 ms apart.
async fn traffic(
    stores: &[Arc<Fallback<RedisStore>>],
    r: &Arc<Rule>,
    keys: &'static [&'static str],
    tasks: usize,
    for_how_long: Duration,
) -> Seen {
    let until = Instant::now() + for_how_long;
    let mut all = vec![];
    for s in stores {
        for t in 0..tasks {
            let (s, r) = (s.clone(), r.clone());
            all.push(tokio::spawn(async move {
                let mut seen = Seen::default();
                let mut i = t;
                while Instant::now() < until {
                    let key = keys[i % keys.len()];
                    i += 1;
                    let op = [Op::new(&r, key)];
                    let at = Instant::now();
                    match s.decide(&op, 1, Mode::Apply).await {
                        Ok(v) if v[0].allowed() => *seen.admitted.entry(key).or_default() += 1,
                        Ok(_) => {}
                        Err(_) => seen.errors += 1,
                    }
                    seen.micros.push(at.elapsed().as_micros() as u64);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                seen
            }));
        }
    }
    let mut out = Seen::default();
    for t in all {
        let s = t.await.unwrap();
        for (k, n) in s.admitted {
            *out.admitted.entry(k).or_default() += n;
        }
        out.micros.extend(s.micros);
        out.errors += s.errors;
    }
    out
}

/// Latency of 20, 200 and 2,000 ms there and back, with jitter, on both
/// gateways' links, 4 callers each on two keys at a limit of 20 that is
/// reached. Below the 1 s timeout: exact, every key at its limit, nothing
/// decided locally. Above it: the late-call rule, every call refused, none
/// decided locally, and the limit held once healed. The p99 each caller saw
/// is printed (README: "The faults a real network brings").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_under_latency_below_and_above_the_timeout() {
    const KEYS: &[&str] = &["a", "b"];
    for (rtt, jitter, secs) in [(20, 10, 2), (200, 50, 3), (2_000, 200, 7)] {
        let t = two(&format!("l{rtt}:"), Duration::from_secs(1));
        let r = Arc::new(rule("lat", 20));
        // Connected first: latency that grows on links in use. (A gateway
        // that starts over a link slower than its timeout never reaches
        // Redis, and decides locally as the README's outage bound says.)
        for s in &t.stores {
            let op = [Op::new(&r, "warm")];
            assert!(s.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
        }
        for p in &t.proxies {
            p.delay(
                Duration::from_millis(rtt / 2),
                Duration::from_millis(jitter / 2),
            );
        }
        let mut seen = traffic(&t.stores, &r, KEYS, 4, Duration::from_secs(secs)).await;
        let p99 = seen.p99();
        eprintln!(
            "added {rtt} ms ± {} ms: admitted {:?}, p99 {:?}, max {:?}, late {}",
            jitter / 2,
            seen.admitted,
            p99,
            seen.max(),
            t.stores[0].late_answers() + t.stores[1].late_answers()
        );
        for s in &t.stores {
            assert!(s.local().is_empty(), "{rtt} ms: decided locally");
            assert!(!s.primary().circuit_open(), "{rtt} ms");
        }
        assert_eq!(seen.errors, 0);
        assert!(
            seen.max() < Duration::from_millis(1_300),
            "{rtt} ms: {:?}",
            seen.max()
        );
        if rtt < 1_000 {
            for k in KEYS {
                assert_eq!(seen.admitted.get(k), Some(&20), "{rtt} ms, key {k}");
            }
        } else {
            assert!(seen.admitted.is_empty(), "{:?}", seen.admitted);
            for p in &t.proxies {
                p.heal();
            }
            // Redis applied the late calls as they arrived.
            tokio::time::sleep(Duration::from_millis(2_500)).await;
            let after = traffic(&t.stores, &r, KEYS, 2, Duration::from_millis(500)).await;
            for k in KEYS {
                assert!(
                    after.admitted.get(k).copied().unwrap_or(0) <= 20,
                    "{:?}",
                    after.admitted
                );
            }
        }
    }
}

/// A partition between the gateways' halves: gateway A keeps its link to
/// Redis, gateway B's stalls without closing for 10 s (a blackhole). B
/// finds it down after the silence and an unanswered ping (stated: about 6
/// s at a 200 ms timeout), decides locally at its share meanwhile, and no
/// decision waits past the timeout for the store; A stays on Redis. The
/// total admitted on the key stays within the README's outage bound,
/// `limit + max(limit, N) + F`; healed, B is on Redis again within a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_of_one_gateway_stays_within_the_outage_bound() {
    const KEYS: &[&str] = &["p"];
    let timeout = Duration::from_millis(200);
    let t = two("p:", timeout);
    let r = Arc::new(rule("part", 20));
    // 10 admitted on Redis first, both announced (N = 2).
    prime(&t.stores, &r, "p", 5).await;
    let before = 10;
    let [a, b] = &t.stores;
    let cut = Instant::now();
    t.proxies[1].stall(true, true);
    let watch = {
        let b = b.clone();
        tokio::spawn(async move {
            while !b.in_outage() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            cut.elapsed()
        })
    };
    let mut during = traffic(&t.stores, &r, KEYS, 4, Duration::from_secs(10)).await;
    let found = watch.await.unwrap();
    let p99 = during.p99();
    eprintln!(
        "partition: found down after {found:?}; admitted during {:?}; max decision {:?}; p99 {:?}",
        during.admitted,
        during.max(),
        p99
    );
    assert!(found < Duration::from_secs(7), "{found:?}");
    assert!(!a.in_outage(), "A kept its link");
    assert!(
        during.max() < timeout + Duration::from_millis(150),
        "{:?}",
        during.max()
    );
    let admitted = before + during.admitted.get("p").copied().unwrap_or(0);
    // limit + max(limit, N) + F, F at most B's 4 callers.
    assert!(admitted <= 20 + 20 + 4, "{admitted}");
    t.proxies[1].heal();
    let healed = Instant::now();
    let op = [Op::new(&r, "p")];
    loop {
        let _ = b.decide(&op, 1, Mode::Peek).await;
        if !b.in_outage() {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(1),
            "B not back on Redis within 1 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "partition: B back on Redis {:?} after the heal",
        healed.elapsed()
    );
}

/// 1% of the commands sent to Redis have their connection reset right
/// after they reach the server, before the answer comes back. A call whose
/// connection broke is tried once more on a fresh one (before, it was an
/// outage call decided locally: 21-23 admitted at a limit of 20): no
/// decision fails (no 5xx), none is decided locally, the reached key is
/// exact, and the calls applied twice or applied and not answered (the
/// bound's `F`, here an over-count: the safe side) are measured on a key
/// whose limit is never reached: Redis's count plus the local decisions,
/// less the requests made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_after_the_script_ran_are_the_bounds_f() {
    let t = two("r:", Duration::from_millis(500));
    let reached = Arc::new(rule("reached", 20));
    let wide = Arc::new(rule("wide", 1_000_000));
    prime(&t.stores, &wide, "warm", 1).await;
    for p in &t.proxies {
        p.reset_after_send(10_000);
    }
    let seen_reached = traffic(&t.stores, &reached, &["k"], 2, Duration::from_secs(3));
    let seen_wide = traffic(&t.stores, &wide, &["w"], 2, Duration::from_secs(3));
    let (reached_seen, wide_seen) = tokio::join!(seen_reached, seen_wide);
    let resets: u64 = t.proxies.iter().map(FaultProxy::resets).sum();
    for p in &t.proxies {
        p.heal();
    }
    assert_eq!(
        reached_seen.errors + wide_seen.errors,
        0,
        "a decision failed"
    );
    assert!(resets > 0, "no reset happened");
    let requests = wide_seen.micros.len() as u64;
    let op = [Op::new(&wide, "w")];
    tokio::time::sleep(Duration::from_millis(300)).await;
    let on_redis = 1_000_000
        - t.stores[0].decide(&op, 1, Mode::Peek).await.unwrap()[0]
            .check
            .remaining;
    // A local decision costs the gateway's share, N = 2.
    let mut local = 0;
    for s in &t.stores {
        let left = match s.local().decide(&op, 1, Mode::Peek).await {
            Ok(v) => v[0].check.remaining,
            Err(_) => 1_000_000,
        };
        local += (1_000_000 - left) / 2;
    }
    let f = on_redis + local - requests;
    eprintln!(
        "resets: {resets} connections reset; {requests} requests on the wide key, {on_redis} counted by Redis, {local} decided locally: F = {f}; reached key admitted {:?}",
        reached_seen.admitted
    );
    assert!(f <= resets, "F {f} over the resets {resets}");
    assert_eq!(local, 0, "decided locally after a reset");
    let admitted = reached_seen.admitted.get("k").copied().unwrap_or(0);
    assert_eq!(admitted, 20, "the reached key");
}

/// Replies lost, requests still arriving (one direction cut) for 8 s on
/// both gateways, then healed: Redis counts requests whose answers never
/// came back; the callers are refused as late, then, once the link is
/// found down (the ping unanswered too), decide locally at their share.
/// The README's bound for this case: `limit + max(limit, N) + F`, as for
/// an outage (the late calls Redis counted were refused: the safe side).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_cut_then_healed_stay_within_the_bound() {
    let t = two("c:", Duration::from_millis(200));
    let r = Arc::new(rule("cut", 20));
    prime(&t.stores, &r, "c", 5).await;
    let before = 10;
    for p in &t.proxies {
        p.stall(false, true);
    }
    let during = traffic(&t.stores, &r, &["c"], 4, Duration::from_secs(8)).await;
    for p in &t.proxies {
        p.heal();
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let after = traffic(&t.stores, &r, &["c"], 2, Duration::from_millis(500)).await;
    let total = before
        + during.admitted.get("c").copied().unwrap_or(0)
        + after.admitted.get("c").copied().unwrap_or(0);
    eprintln!(
        "one direction cut: before {before}, during {:?}, after {:?}; total {total}",
        during.admitted, after.admitted
    );
    assert_eq!(during.errors, 0);
    assert!(total <= 20 + 20 + 8, "{total}");
}

/// A whole Cluster that stops answering with its connections open (every
/// node paused): calls are late, and the liveness pings asked after the
/// silence fail each within the client's own timeout. They were logged one
/// WARN line each (every 500 ms in a soak); now once per 10 s, with their
/// count, and the line no longer says it connects afresh, which the
/// cluster's client does for itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_cluster_is_logged_once_per_ten_seconds() {
    logs::keep();
    let cluster = RedisCluster::start();
    let s = on_cluster(&cluster, "sc:", 200);
    let r = Arc::new(rule("sc", 1_000_000));
    let op = [Op::new(&r, "k")];
    assert!(s.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
    for n in &cluster.nodes {
        n.pause(true);
    }
    let _ = load(&s, &r, "k", 2, Duration::from_secs(7)).await;
    for n in &cluster.nodes {
        n.pause(false);
    }
    let seed = format!("127.0.0.1:{}", cluster.nodes[0].port);
    let said = logs::containing(&["redis silent", &seed]);
    assert_eq!(said.len(), 1, "one line for a 7 s silence: {said:#?}");
    assert!(
        said[0].contains("the cluster client reconnects to its nodes"),
        "{said:?}"
    );
    assert!(s.late_answers() > 0, "the calls were late");
}

/// A manual `CLUSTER FAILOVER` (sent to the replica of the key's master)
/// under traffic loses no decision: every admission acknowledged is in the
/// new master's count, and none was decided locally.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_cluster_failover_under_traffic_loses_no_decision() {
    let cluster = RedisCluster::start_with_replicas();
    let s = on_cluster(&cluster, "mf:", 500);
    let r = Arc::new(rule("mf", 1_000_000));
    let state_key = s.primary().key_names(&Op::new(&r, "k")).0;
    let op = [Op::new(&r, "k")];
    assert!(s.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
    let old = cluster.master_of(0, &state_key).unwrap();
    let replica = cluster
        .nodes
        .iter()
        .find(|n| n.replicates(old))
        .expect("the master's replica");
    let load = traffic(
        std::slice::from_ref(&s),
        &r,
        &["k"],
        8,
        Duration::from_secs(4),
    );
    let switch = async {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let said = tokio::task::block_in_place(|| replica.cli(&["cluster", "failover"]));
        assert_eq!(said, "OK");
        let deadline = Instant::now() + Duration::from_secs(10);
        while cluster.master_of(0, &state_key) != Some(replica.port) {
            assert!(Instant::now() < deadline, "the replica never took over");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let (seen, ()) = tokio::join!(load, switch);
    let admitted = 1 + seen.admitted.get("k").copied().unwrap_or(0);
    let count = replica.state(&state_key).get(1).copied().unwrap_or(0);
    eprintln!(
        "manual failover: {admitted} admitted, the new master counts {count}, {} late",
        s.late_answers()
    );
    assert_eq!(seen.errors, 0);
    assert!(
        s.local().is_empty(),
        "decided locally during a manual failover"
    );
    assert!(admitted > 100, "traffic ran: {admitted}");
    // Late calls may have been counted and not answered: never fewer.
    assert!(
        count >= admitted,
        "{count} counted < {admitted} admitted: decisions lost"
    );
}

/// A node that joins the cluster (`CLUSTER MEET`) is used once its slots
/// are assigned: the hot key's slot moved to it under 120 concurrent
/// requests at a limit of 20, the newcomer holds the key's count, and no
/// more than 20 are admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_node_that_joins_is_used_once_its_slots_are_assigned() {
    let cluster = RedisCluster::start();
    let newcomer = RedisServer::start_any(true);
    cluster.nodes[0].cli(&["cluster", "meet", "127.0.0.1", &newcomer.port.to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while newcomer.cli(&["cluster", "nodes"]).lines().count() < 4
        || cluster.nodes[1].cli(&["cluster", "nodes"]).lines().count() < 4
        || cluster.nodes[2].cli(&["cluster", "nodes"]).lines().count() < 4
        || !newcomer
            .cli(&["cluster", "info"])
            .contains("cluster_state:ok")
    {
        assert!(Instant::now() < deadline, "the newcomer never joined");
        std::thread::sleep(Duration::from_millis(50));
    }
    let s = on_cluster(&cluster, "j:", 500);
    let r = Arc::new(rule("join", 20));
    let state_key = s.primary().key_names(&Op::new(&r, "k")).0;
    let op = [Op::new(&r, "k")];
    for _ in 0..5 {
        assert!(s.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
    }
    let slot = cluster.nodes[0].cli(&["cluster", "keyslot", &state_key]);
    let src = cluster.master_of(0, &state_key).unwrap();
    let src = cluster.nodes.iter().find(|n| n.port == src).unwrap();
    let admitted = Arc::new(AtomicU64::new(5));
    let calls = burst(&s, &r, &admitted);
    let moved = {
        let mut nodes: Vec<&RedisServer> = cluster.nodes.iter().collect();
        nodes.push(&newcomer);
        tokio::task::block_in_place(|| move_slot(&nodes, &slot, src, &newcomer))
    };
    assert!(moved.contains("OK"), "{moved}");
    for c in calls {
        c.await.unwrap();
    }
    // And after it, on the newcomer.
    for _ in 0..10 {
        let v = s.decide(&op, 1, Mode::Apply).await.unwrap();
        admitted.fetch_add(u64::from(v[0].allowed()), Ordering::Relaxed);
    }
    let admitted = admitted.load(Ordering::Relaxed);
    let count = newcomer.state(&state_key).get(1).copied().unwrap_or(0);
    eprintln!(
        "a node joins: {admitted} admitted, the newcomer counts {count}; errors {:?}, local {}",
        s.primary().errors_by_kind(),
        !s.local().is_empty()
    );
    assert!(admitted <= 20, "{admitted} admitted on a limit of 20");
    assert!(s.local().is_empty(), "decided locally while a node joined");
    assert!(count >= 20, "the newcomer holds the key's count: {count}");
}

/// Two stores over a real partition: Redis in a network namespace of its
/// own, each store on its own veth link to it.
fn partitioned(prefix: &str, timeout: Duration) -> (Partitioned, [Arc<Fallback<RedisStore>>; 2]) {
    let net = Partitioned::start(2);
    let mk = |side: usize| {
        store(RedisConfig {
            url: Some(net.url(side)),
            key_prefix: prefix.into(),
            timeout,
            ..RedisConfig::default()
        })
    };
    let stores = [mk(0), mk(1)];
    (net, stores)
}

/// The partition of one gateway again, through the kernel instead of the
/// fault proxy: gateway B's link loses its carrier for 10 s (`ip link set
/// down` at Redis's end), so its established connections retransmit into
/// the void and its new connections' SYNs go unanswered until the connect
/// timeout. A keeps its link. The same bound holds: B found down (silence,
/// then an unanswered ping), no decision waits past the timeout, the total
/// within `limit + max(limit, N) + F`; and B back on Redis soon after the
/// heal: 0.47 s measured. The kernel sets the worst case: a connect under
/// way when the link comes back has sent its SYNs at 0 and 1 s, and waits
/// out its 2 s connect timeout before the next probe (at most 500 ms
/// later) connects at once: 1.5 s (README: "The faults a real network
/// brings").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_real_partition_through_the_kernel_stays_within_the_bound() {
    const KEYS: &[&str] = &["n"];
    let timeout = Duration::from_millis(200);
    let (net, stores) = partitioned("n:", timeout);
    let r = Arc::new(rule("netns", 20));
    prime(&stores, &r, "n", 5).await;
    let before = 10;
    let [a, b] = &stores;
    let cut = Instant::now();
    net.cut(1);
    let watch = {
        let b = b.clone();
        tokio::spawn(async move {
            while !b.in_outage() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            cut.elapsed()
        })
    };
    let mut during = traffic(&stores, &r, KEYS, 4, Duration::from_secs(10)).await;
    let found = watch.await.unwrap();
    let p99 = during.p99();
    eprintln!(
        "kernel partition: found down after {found:?}; admitted during {:?}; max decision {:?}; p99 {:?}",
        during.admitted,
        during.max(),
        p99
    );
    assert!(found < Duration::from_secs(7), "{found:?}");
    assert!(!a.in_outage(), "A kept its link");
    // B has not announced itself for 10 s; A still counts it (its share,
    // were A to lose Redis too, stays what it left B).
    assert_eq!(
        a.primary().instances(),
        2,
        "A forgot the partitioned gateway"
    );
    assert_eq!(during.errors, 0);
    assert!(
        during.max() < timeout + Duration::from_millis(150),
        "{:?}",
        during.max()
    );
    let admitted = before + during.admitted.get("n").copied().unwrap_or(0);
    assert!(admitted <= 20 + 20 + 4, "{admitted}");
    net.heal(1);
    let healed = Instant::now();
    let op = [Op::new(&r, "n")];
    loop {
        let _ = b.decide(&op, 1, Mode::Peek).await;
        if !b.in_outage() {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_millis(1_600),
            "B not back on Redis within 1.5 s of the heal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "kernel partition: B back on Redis {:?} after the heal",
        healed.elapsed()
    );
    assert_eq!(net.cli(&["PING"]), "PONG");
}

/// A gateway that starts while its link is down: its first connection's
/// SYN goes unanswered. No decision waits past the timeout for it (the
/// attempt runs on its own, bounded by the connect timeout, and each call
/// by its own), decisions fall to `on_error: local` at once, and once the
/// link is up the store reaches Redis and shares its count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_starting_partitioned_waits_no_longer_than_its_timeout() {
    let timeout = Duration::from_millis(200);
    let (net, stores) = partitioned("s:", timeout);
    let r = Arc::new(rule("start", 20));
    net.cut(1);
    let b = &stores[1];
    let mut seen = traffic(&stores[1..], &r, &["s"], 4, Duration::from_secs(4)).await;
    let p99 = seen.p99();
    eprintln!(
        "starting partitioned: admitted {:?}, max decision {:?}, p99 {p99:?}, errors {}",
        seen.admitted,
        seen.max(),
        seen.errors
    );
    assert_eq!(seen.errors, 0);
    assert!(
        seen.max() < timeout + Duration::from_millis(150),
        "{:?}",
        seen.max()
    );
    assert!(!b.local().is_empty(), "decided locally meanwhile");
    // Locally, at its share (N = 1: it never counted the others).
    assert!(seen.admitted.get("s").copied().unwrap_or(0) <= 20);
    net.heal(1);
    let healed = Instant::now();
    let op = [Op::new(&r, "s2")];
    loop {
        let v = b.decide(&op, 1, Mode::Apply).await;
        if !b.in_outage() && v.is_ok() {
            break;
        }
        assert!(
            healed.elapsed() < Duration::from_secs(5),
            "B never reached Redis after the heal"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "starting partitioned: on Redis {:?} after the heal",
        healed.elapsed()
    );
    let counted = net.cli(&["--scan", "--pattern", "s:*"]);
    assert!(!counted.is_empty(), "Redis holds the store's keys");
}

/// Two faults in a row: gateway B's link stalls (a partition of its half)
/// and, once B has been silent past the announcements' TTL, gateway A
/// loses Redis too. Both decide locally. A must still count B: had it
/// dropped B from its count, it would take the whole limit as its share
/// beside B's half (seen in CI: 50 admitted at a bound of 44). The total
/// stays within `limit + max(limit, N) + F`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_then_an_outage_of_the_other_half_stays_within_the_bound() {
    let timeout = Duration::from_millis(200);
    let t = two("pp:", timeout);
    let r = Arc::new(rule("two-faults", 20));
    prime(&t.stores, &r, "pp", 5).await;
    let before = 10;
    t.proxies[1].stall(true, true);
    // B silent for longer than INSTANCE_TTL, A still on Redis.
    let first = traffic(&t.stores, &r, &["pp"], 2, Duration::from_secs(8)).await;
    assert_eq!(t.stores[0].primary().instances(), 2, "A forgot B");
    t.proxies[0].stall(true, true);
    let second = traffic(&t.stores, &r, &["pp"], 2, Duration::from_secs(8)).await;
    let admitted = before
        + first.admitted.get("pp").copied().unwrap_or(0)
        + second.admitted.get("pp").copied().unwrap_or(0);
    eprintln!(
        "partition then outage: before {before}, first {:?}, second {:?}, A in outage {}, total {admitted}",
        first.admitted,
        second.admitted,
        t.stores[0].in_outage()
    );
    assert!(
        t.stores[0].in_outage() && t.stores[1].in_outage(),
        "both local at the end"
    );
    // limit + max(limit, N) + F, F at most each gateway's 2 callers.
    assert!(admitted <= 20 + 20 + 4, "{admitted}");
}
