//! The Redis store against the Rust specification, and across processes.
//!
//! Each test starts its own redis-server (or a 3-master cluster) on free
//! loopback ports.

#[path = "../common/mod.rs"]
mod common;
mod load;

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{RedisCluster, RedisServer};
use ratewarden::algorithm::Kind;
use ratewarden::clock::{Clock, ManualClock};
use ratewarden::store::Shared;
use ratewarden::{
    Fallback, Limiter, MemoryStore, Mode, OnError, Op, Penalty, RedisConfig, RedisStore, Rule,
    Settle, Store, Verdict,
};

fn wall_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

fn config(url: Option<String>, cluster: Vec<String>, clock: Option<ManualClock>) -> RedisConfig {
    // Field by field: `tls` exists only with the `tls` feature.
    let mut c = RedisConfig::default();
    c.url = url;
    c.cluster = cluster;
    c.key_prefix = "t:".into();
    c.timeout = Duration::from_millis(500);
    c.local_clock = clock.map(|c| Arc::new(c) as Arc<dyn Clock>);
    c
}

/// Every algorithm with every modifier: the rules of the case table.
fn case_rules() -> Vec<Rule> {
    let mut rules = vec![];
    for kind in Kind::ALL {
        let base = |name: &str| {
            Rule::builder(format!("{kind}-{name}"))
                .algorithm(kind)
                .limit(4, Duration::from_secs(3))
        };
        let burst = |b: ratewarden::rule::RuleBuilder| {
            if matches!(kind, Kind::TokenBucket | Kind::LeakyBucket | Kind::Gcra) {
                b.burst(3)
            } else {
                b
            }
        };
        rules.push(base("plain").build().unwrap());
        rules.push(burst(base("burst")).cost(2).build().unwrap());
        rules.push(
            base("gap")
                .min_interval(Duration::from_millis(700))
                .build()
                .unwrap(),
        );
        rules.push(
            base("ban")
                .penalty(Penalty {
                    duration: Duration::from_secs(2),
                    multiplier: 2,
                    max: Duration::from_secs(7),
                    memory: Duration::from_secs(10),
                })
                .build()
                .unwrap(),
        );
        if kind == Kind::Concurrency {
            // No count_rejected, no count: failures; leases that lapse
            // between steps instead.
            rules.push(
                base("hold")
                    .max_hold(Duration::from_millis(1100))
                    .build()
                    .unwrap(),
            );
        } else {
            rules.push(
                base("rejected")
                    .count_rejected(true)
                    .min_interval(Duration::from_millis(300))
                    .build()
                    .unwrap(),
            );
            rules.push(
                base("failures")
                    .count_failures(true)
                    .penalty(Penalty::fixed(Duration::from_secs(4)))
                    .build()
                    .unwrap(),
            );
            rules.push(
                base("failures-noreset")
                    .count_failures(false)
                    .build()
                    .unwrap(),
            );
        }
        rules.push(
            base("shadow")
                .shadow(true)
                .penalty(Penalty::fixed(Duration::from_secs(2)))
                .build()
                .unwrap(),
        );
    }
    rules.push(
        Rule::builder("leaky-delay")
            .algorithm(Kind::LeakyBucket)
            .limit(5, Duration::from_secs(1))
            .burst(4)
            .delay(Duration::from_millis(500))
            .build()
            .unwrap(),
    );
    rules
}

/// A small deterministic generator, so a failure names a reproducible step.
struct Lcg(u64);
impl Lcg {
    fn next(&mut self, n: u64) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 33) % n
    }
}

/// Runs the same random requests through both stores; every verdict must match.
async fn agree<S: Store>(redis: &S, clock: &ManualClock, memory: &MemoryStore, rules: &[Rule]) {
    let mut rng = Lcg(7);
    for (ri, rule) in rules.iter().enumerate() {
        // One rule alone, then paired with the next one in a single request.
        let partner = &rules[(ri + 1) % rules.len()];
        for step in 0..120 {
            // Boundaries on purpose: exactly a min_interval (300/700 ms), an
            // emission interval (750 ms), a window (3 s), and their neighbours.
            let gaps = [
                0, 1, 999, 120_000, 299_999, 300_000, 700_000, 750_000, 1_100_000, 2_999_999,
                3_000_000, 3_500_000,
            ];
            let gap = gaps[rng.next(gaps.len() as u64) as usize];
            clock.advance(Duration::from_micros(gap));
            let key = ["alice", "bob"][rng.next(2) as usize];
            let weight = 1 + rng.next(2);
            let pair = rng.next(4) == 0;
            let ops_one = [Op::new(rule, key)];
            let ops_two = [Op::new(rule, key), Op::new(partner, key)];
            let ops: &[Op<'_>] = if pair { &ops_two } else { &ops_one };
            let mode = if rng.next(8) == 0 {
                Mode::Peek
            } else {
                Mode::Apply
            };
            let m: Vec<Verdict> = memory.decide(ops, weight, mode).await.unwrap();
            let r: Vec<Verdict> = redis.decide(ops, weight, mode).await.unwrap();
            // Lease numbers are each store's own: a key Redis keeps up to a
            // millisecond longer (PEXPIREAT) may number its next lease on.
            // Whether a lease was taken must agree.
            let unnumbered = |v: &[Verdict]| -> Vec<Verdict> {
                v.iter()
                    .map(|v| Verdict {
                        lease: v.lease.map(|_| 0),
                        ..*v
                    })
                    .collect()
            };
            assert_eq!(
                unnumbered(&m),
                unnumbered(&r),
                "rule {} step {step} key {key} weight {weight} pair {pair}",
                rule.name()
            );
            let admitted = ratewarden::store::admitted(ops, &m);
            // Envoy refunds: some admitted requests give their cost back.
            if mode == Mode::Apply && admitted && rng.next(5) == 0 {
                memory.settle(ops, Settle::Refund(weight)).await.unwrap();
                redis.settle(ops, Settle::Refund(weight)).await.unwrap();
            }
            if mode == Mode::Apply && admitted && ops.iter().any(|o| o.rule.counts_failures()) {
                let how = if rng.next(3) != 0 {
                    Settle::Failure(weight)
                } else {
                    Settle::Success
                };
                memory.settle(ops, how).await.unwrap();
                redis.settle(ops, how).await.unwrap();
            }
            // Concurrency leases: most requests end (released), some never
            // do (their leases lapse).
            let leases = |v: &[Verdict]| -> Vec<(Op<'_>, u64, u64)> {
                ops.iter()
                    .zip(v)
                    .filter_map(|(op, v)| v.lease.map(|l| (*op, l, op.rule.cost(weight))))
                    .collect()
            };
            if !leases(&m).is_empty() && rng.next(3) != 0 {
                memory.release(&leases(&m)).await.unwrap();
                redis.release(&leases(&r)).await.unwrap();
            }
            if step % 20 == 19 {
                let (mi, ri) = (
                    memory.inspect(ops[0]).await.unwrap(),
                    redis.inspect(ops[0]).await.unwrap(),
                );
                assert_eq!(
                    (mi.remaining, mi.ban_left),
                    (ri.remaining, ri.ban_left),
                    "inspect {}",
                    rule.name()
                );
            }
        }
    }
}

#[tokio::test]
async fn a_random_walk_agrees_with_the_memory_store_on_standalone_redis() {
    let server = RedisServer::start();
    let clock = ManualClock::new(wall_now());
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let redis = RedisStore::new(config(Some(server.url()), vec![], Some(clock.clone()))).unwrap();
    agree(&redis, &clock, &memory, &case_rules()).await;
}

/// The same walk by `EVALSHA` (servers without Functions, or
/// `functions: false`): the store's other path.
#[tokio::test]
async fn a_random_walk_agrees_with_the_memory_store_by_evalsha() {
    let server = RedisServer::start();
    let clock = ManualClock::new(wall_now());
    let mut c = config(Some(server.url()), vec![], Some(clock.clone()));
    c.functions = false;
    let redis = RedisStore::new(c).unwrap();
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    agree(&redis, &clock, &memory, &case_rules()).await;
    assert_eq!(
        server.cli(&["function", "list"]).trim(),
        "",
        "no library loaded"
    );
}

/// Decisions go through a Redis Function, loaded on first use and again
/// when the server lost it (a restart, a new node, `FUNCTION FLUSH`).
#[tokio::test]
async fn calls_go_through_a_function_loaded_on_demand() {
    let server = RedisServer::start();
    let redis = RedisStore::new(config(Some(server.url()), vec![], None)).unwrap();
    let rule = Rule::builder("f")
        .limit(2, Duration::from_secs(60))
        .build()
        .unwrap();
    let (_, name) = ratewarden::store::redis::script::library();
    let decide = || async {
        redis
            .decide(&[Op::new(&rule, "k")], 1, Mode::Apply)
            .await
            .unwrap()[0]
            .allowed()
    };
    assert!(decide().await);
    assert!(server.cli(&["function", "list"]).contains(&name));
    server.cli(&["function", "flush"]);
    assert!(decide().await, "reloaded after FUNCTION FLUSH");
    assert!(server.cli(&["function", "list"]).contains(&name));
    assert!(!decide().await, "the limit of 2 holds across the reload");
}

/// Ops of one call on one rule share the spec the Function parsed once
/// and keeps; each is still charged its own cost (an Envoy call's
/// descriptors carry their own `hits_addend`), also on later calls that
/// find the spec kept.
#[tokio::test]
async fn ops_sharing_a_rule_are_each_charged_their_own_cost() {
    let server = RedisServer::start();
    let redis = RedisStore::new(config(Some(server.url()), vec![], None)).unwrap();
    let rule = Rule::builder("shared")
        .algorithm(Kind::FixedWindow)
        .limit(10, Duration::from_secs(3_600))
        .build()
        .unwrap();
    for round in 1..=2u64 {
        let ops = [
            Op::grouped(&rule, "a", "g").weighing(1),
            Op::grouped(&rule, "b", "g").weighing(4),
        ];
        let v = redis.decide(&ops, 1, Mode::Apply).await.unwrap();
        assert_eq!(v[0].check.remaining, 10 - round, "round {round}");
        assert_eq!(v[1].check.remaining, 10 - 4 * round, "round {round}");
    }
}

/// Keys `x` and `x:log` of one rule and group: the second's state is not
/// the first's log (a client choosing its key could otherwise break
/// another's `sliding_window_log` with WRONGTYPE, or reset it), and each
/// counts on its own.
#[tokio::test]
async fn a_key_ending_in_log_is_not_another_keys_log() {
    let server = RedisServer::start();
    let redis = RedisStore::new(config(Some(server.url()), vec![], None)).unwrap();
    let rule = Rule::builder("logged")
        .algorithm(Kind::SlidingWindowLog)
        .limit(3, Duration::from_secs(60))
        .build()
        .unwrap();
    let decide = |key: &'static str| {
        let op = Op::grouped(&rule, key, "g");
        let redis = &redis;
        async move { redis.decide(&[op], 1, Mode::Apply).await }
    };
    for round in 1..=3u64 {
        for key in ["x", "x:log", "x:log:k", "x:k"] {
            let v = decide(key).await.unwrap_or_else(|e| panic!("{key}: {e}"));
            assert!(v[0].allowed(), "{key}, round {round}");
            assert_eq!(v[0].check.remaining, 3 - round, "{key}, round {round}");
        }
    }
    for key in ["x", "x:log", "x:log:k", "x:k"] {
        assert!(!decide(key).await.unwrap()[0].allowed(), "{key}: its own 3");
    }
}

#[tokio::test]
async fn a_random_walk_agrees_with_the_memory_store_on_redis_cluster() {
    let cluster = RedisCluster::start();
    let clock = ManualClock::new(wall_now());
    let memory = MemoryStore::builder().clock(clock.clone()).build();
    let redis = RedisStore::new(config(None, cluster.urls(), Some(clock.clone()))).unwrap();
    agree(&redis, &clock, &memory, &case_rules()).await;
}

#[tokio::test]
async fn gateways_with_skewed_clocks_agree_because_time_comes_from_redis() {
    let server = RedisServer::start();
    let rule = Rule::builder("skew")
        .algorithm(Kind::FixedWindow)
        .limit(5, Duration::from_secs(60))
        .build()
        .unwrap();
    let op = [Op::new(&rule, "client")];
    // Negative control: stores that trust their own clocks, 10 minutes apart,
    // disagree (B sees a fresh window).
    let a_clock = ManualClock::new(wall_now());
    let b_clock = ManualClock::new(wall_now() + 600_000_000);
    let a = RedisStore::new(config(Some(server.url()), vec![], Some(a_clock))).unwrap();
    let b = RedisStore::new(config(Some(server.url()), vec![], Some(b_clock))).unwrap();
    for _ in 0..5 {
        assert!(a.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
    }
    assert!(
        b.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed(),
        "skewed local clocks disagree"
    );

    // With time from Redis (the default), two instances agree whatever the
    // processes' clocks say.
    let rule = Rule::builder("skew-redis-time")
        .algorithm(Kind::FixedWindow)
        .limit(5, Duration::from_secs(86_400))
        .build()
        .unwrap();
    let op = [Op::new(&rule, "client")];
    let a = RedisStore::new(config(Some(server.url()), vec![], None)).unwrap();
    let b = RedisStore::new(config(Some(server.url()), vec![], None)).unwrap();
    for _ in 0..5 {
        assert!(a.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
    }
    assert!(!b.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
}

#[tokio::test]
async fn all_or_nothing_on_standalone_and_where_the_cluster_relaxes_it() {
    let identity = Rule::builder("per-user")
        .algorithm(Kind::FixedWindow)
        .limit(100, Duration::from_secs(86_400))
        .build()
        .unwrap();
    let global = Rule::builder("global")
        .algorithm(Kind::FixedWindow)
        .limit(2, Duration::from_secs(86_400))
        .build()
        .unwrap();
    let request = |user: &'static str| {
        [
            Op::grouped(&identity, user, user),
            Op::grouped(&global, "global", "global"),
        ]
    };
    let remaining = async |s: &RedisStore, user| {
        s.decide(&[Op::grouped(&identity, user, user)], 1, Mode::Peek)
            .await
            .unwrap()[0]
            .check
            .remaining
    };

    // Standalone: one script call for both groups; a global rejection
    // charges the user nothing.
    let server = RedisServer::start();
    let s = RedisStore::new(config(Some(server.url()), vec![], None)).unwrap();
    for user in ["u1", "u2"] {
        assert!(ratewarden::store::admitted(
            &request(user),
            &s.decide(&request(user), 1, Mode::Apply).await.unwrap()
        ));
    }
    let v = s.decide(&request("u3"), 1, Mode::Apply).await.unwrap();
    assert!(!v[1].allowed());
    assert_eq!(remaining(&s, "u3").await, 99, "nothing charged to u3");

    // Cluster: the user's group is decided (and charged) first, then the
    // global group; a global rejection leaves that one charge on u3: the
    // documented relaxation, over-counting one client, never over-admitting.
    let cluster = RedisCluster::start();
    let c = RedisStore::new(config(None, cluster.urls(), None)).unwrap();
    for user in ["u1", "u2"] {
        c.decide(&request(user), 1, Mode::Apply).await.unwrap();
    }
    let v = c.decide(&request("u3"), 1, Mode::Apply).await.unwrap();
    assert!(v[0].allowed() && !v[1].allowed());
    assert_eq!(
        remaining(&c, "u3").await,
        98,
        "u3 was charged once by the first group"
    );
    // And a rejection in the first group is never charged to the second.
    let tight = Rule::builder("tight-user")
        .algorithm(Kind::FixedWindow)
        .limit(1, Duration::from_secs(86_400))
        .build()
        .unwrap();
    let wide_global = Rule::builder("wide-global")
        .algorithm(Kind::FixedWindow)
        .limit(100, Duration::from_secs(86_400))
        .build()
        .unwrap();
    let req = [
        Op::grouped(&tight, "u9", "u9"),
        Op::grouped(&wide_global, "global", "global"),
    ];
    c.decide(&req, 1, Mode::Apply).await.unwrap();
    c.decide(&req, 1, Mode::Apply).await.unwrap();
    let g = c.decide(&[req[1]], 1, Mode::Peek).await.unwrap();
    assert_eq!(
        g[0].check.remaining,
        100 - 1 - 1,
        "only the admitted request charged the global rule"
    );
}

/// The helper every Redis test uses: a port someone else holds is never
/// mistaken for a started server (redis-server exits there; the helper says
/// so rather than handing out the other server's port).
#[test]
fn the_redis_helper_never_takes_a_port_another_server_holds() {
    let other = RedisServer::start();
    assert!(RedisServer::start_on(other.port, false).is_none());
    let plain = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = plain.local_addr().unwrap().port();
    assert!(RedisServer::start_on(port, false).is_none());
    assert_eq!(other.cli(&["ping"]), "PONG");
}

/// Decides 2,500 keys of a sliding_window_log rule (a hash and a zset
/// each) and of another rule, then lists the first rule's back by SCAN.
async fn scan_lists_what_was_decided(store: RedisStore) {
    let rule = Rule::builder("scanned")
        .algorithm(Kind::SlidingWindowLog)
        .limit(5, Duration::from_secs(60))
        .build()
        .unwrap();
    let other = Rule::builder("other")
        .limit(5, Duration::from_secs(60))
        .build()
        .unwrap();
    let keys: Vec<String> = (0..2500).map(|i| format!("user:{i}")).collect();
    for k in &keys {
        let op = Op::grouped(&rule, k, k);
        store.decide(&[op], 1, Mode::Apply).await.unwrap();
        store
            .decide(&[Op::grouped(&other, k, k)], 1, Mode::Apply)
            .await
            .unwrap();
    }
    // A key whose own name ends in `:log`.
    let odd = Op::grouped(&rule, "x:log", "g");
    store.decide(&[odd], 1, Mode::Apply).await.unwrap();
    // Ten keys with a log of five entries: past four, its state is in its
    // zset and its string just says so; listed once all the same.
    for k in &keys[..10] {
        for _ in 0..4 {
            let op = Op::grouped(&rule, k, k);
            store.decide(&[op], 1, Mode::Apply).await.unwrap();
        }
    }
    let long = store
        .inspect(Op::grouped(&rule, &keys[0], &keys[0]))
        .await
        .unwrap();
    assert!(long.exists);
    assert_eq!((long.remaining, long.admits), (0, false));

    let all = store.scan(&rule, 1_000_000).await.unwrap();
    assert!(all.complete);
    let mut found: Vec<&(String, String)> = all.keys.iter().collect();
    found.sort();
    found.dedup();
    assert_eq!(found.len(), all.keys.len(), "each once");
    for k in &keys {
        assert!(all.keys.contains(&(k.clone(), k.clone())), "{k}");
    }
    assert!(all.keys.contains(&("g".into(), "x:log".into())));
    // Only this rule's keys, and no zset read as a key.
    assert_eq!(all.keys.len(), keys.len() + 1);
    // A budget smaller than the keyspace stops early and says so.
    let some = store.scan(&rule, 1_000).await.unwrap();
    assert!(!some.complete);
    assert!(some.keys.len() < keys.len(), "{}", some.keys.len());
}

#[tokio::test]
async fn a_bounded_scan_lists_a_rules_keys_on_standalone_redis() {
    let server = RedisServer::start();
    scan_lists_what_was_decided(RedisStore::new(config(Some(server.url()), vec![], None)).unwrap())
        .await;
}

#[tokio::test]
async fn a_bounded_scan_lists_a_rules_keys_on_every_cluster_master() {
    let cluster = RedisCluster::start();
    scan_lists_what_was_decided(RedisStore::new(config(None, cluster.urls(), None)).unwrap()).await;
}

/// A calendar day turns where Redis's clock says: a zone is chosen whose
/// local midnight is a few seconds from now (a fixed offset, to the
/// second), and a limit of 1 a day is full before it and fresh after it,
/// with the reset the reply gives pointing at that midnight. Redis's
/// clock cannot be set, so this waits for the boundary (3 s at most).
#[tokio::test]
async fn a_calendar_day_turns_at_local_midnight_by_redis_time() {
    let server = RedisServer::start();
    let redis = RedisStore::new(config(Some(server.url()), vec![], None)).unwrap();
    let now_us = wall_now();
    let boundary_s = now_us / 1_000_000 + 3;
    // Local time = UTC + offset; midnight at `boundary_s`.
    let mut offset = (86_400 - (boundary_s % 86_400) as i64) % 86_400;
    if offset > 50_400 {
        offset -= 86_400;
    }
    let sign = if offset < 0 { '-' } else { '+' };
    let a = offset.unsigned_abs();
    let zone = format!("{sign}{:02}:{:02}:{:02}", a / 3600, a / 60 % 60, a % 60);
    let calendar = ratewarden::calendar::Calendar::new(
        ratewarden::calendar::Period::Day,
        &zone,
        None,
        None,
        None,
    )
    .unwrap();
    let rule = Rule::builder("daily")
        .algorithm(Kind::FixedWindow)
        .limit(1, Duration::from_secs(86_400))
        .calendar(calendar)
        .build()
        .unwrap();
    let op = || Op::new(&rule, "k");
    let first = redis.decide(&[op()], 1, Mode::Apply).await.unwrap();
    assert!(first[0].check.allowed);
    let to_midnight = boundary_s * 1_000_000 - wall_now();
    let reset = first[0].check.reset_after.get();
    assert!(
        reset.abs_diff(to_midnight) < 200_000,
        "reset {reset} µs, midnight in {to_midnight} µs ({zone})"
    );
    let second = redis.decide(&[op()], 1, Mode::Apply).await.unwrap();
    assert!(!second[0].check.allowed, "one a day");
    assert!(second[0].check.retry_after.get().abs_diff(to_midnight) < 200_000);
    // Past midnight by Redis's clock (the same host's).
    let wait = (boundary_s * 1_000_000 + 100_000).saturating_sub(wall_now());
    tokio::time::sleep(Duration::from_micros(wait)).await;
    let third = redis.decide(&[op()], 1, Mode::Apply).await.unwrap();
    assert!(third[0].check.allowed, "a new day");
    let day = third[0].check.reset_after.get();
    assert!(day > 86_000_000_000 && day <= 86_400_000_000, "{day}");
}
