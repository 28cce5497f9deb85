//! The faults a real network brings (issue 52), through a fault proxy
//! between the store and Redis, and a Cluster moving a slot under
//! traffic: each counts admissions against the limit, not against "no
//! errors".

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::fault::FaultProxy;
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
/// Redis's again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blackhole_is_still_an_outage_and_heals() {
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
        let s = store(RedisConfig {
            cluster: cluster.urls(),
            key_prefix: format!("m{run}:"),
            timeout: Duration::from_millis(500),
            ..RedisConfig::default()
        });
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
        let (src_id, dst_id) = (
            at(src).cli(&["cluster", "myid"]),
            at(dst).cli(&["cluster", "myid"]),
        );
        let admitted = Arc::new(AtomicU64::new(1));
        let mut calls = vec![];
        for i in 0..120u64 {
            let (s, r, admitted) = (s.clone(), r.clone(), admitted.clone());
            calls.push(tokio::spawn(async move {
                tokio::time::sleep(Duration::from_millis(i % 40 * 5)).await;
                let op = [Op::new(&r, "k")];
                if let Ok(v) = s.decide(&op, 1, Mode::Apply).await
                    && v[0].allowed()
                {
                    admitted.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
        let moving = {
            let (src_n, dst_n) = (at(src), at(dst));
            let others: Vec<&RedisServer> = cluster.nodes.iter().collect();
            tokio::task::block_in_place(|| {
                std::thread::sleep(Duration::from_millis(30));
                dst_n.cli(&["cluster", "setslot", &slot, "importing", &src_id]);
                src_n.cli(&["cluster", "setslot", &slot, "migrating", &dst_id]);
                std::thread::sleep(Duration::from_millis(40));
                let keys = src_n.cli(&["cluster", "getkeysinslot", &slot, "100"]);
                let keys: Vec<&str> = keys.lines().collect();
                let port = dst.to_string();
                let mut args = vec!["migrate", "127.0.0.1", &port, "", "0", "5000", "keys"];
                args.extend(keys.iter().copied());
                let out = src_n.cli(&args);
                std::thread::sleep(Duration::from_millis(40));
                for n in &others {
                    n.cli(&["cluster", "setslot", &slot, "node", &dst_id]);
                }
                out
            })
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
