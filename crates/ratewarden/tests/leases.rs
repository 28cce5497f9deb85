//! Leased local quotas (`distribution: {mode: lease}`): four gateways share
//! one hot key through one store, and what they admit together stays
//! within limit × (1 + ε) in every window: under bursty arrivals, under
//! arrivals skewed towards one gateway, and with a gateway killed while it
//! holds a slice. On the memory store and on Redis, on a manual clock.

mod common;

use std::sync::Arc;
use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::clock::{Clock, ManualClock};
use ratewarden::store::lease::Leased;
use ratewarden::store::redis::{RedisConfig, RedisStore};
use ratewarden::{Distribution, MemoryStore, Mode, Op, Rule, Store};

const LIMIT: u64 = 1000;
const EPSILON: f64 = 0.05;

/// The next whole second on the wall clock: a Redis key's expiry (`PXAT`)
/// is on Redis's clock, so a manual clock must start where it stands; on a
/// whole second, every run sees the same windows.
fn wall_now() -> u64 {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    (now + 1) * 1_000_000
}

fn rule(kind: Kind) -> Rule {
    rule_sharing(kind, 0.25)
}

/// With `max_share` 1, each gateway asks for the whole lease room, and
/// only the store's bound on what all slices hold keeps them within it.
fn rule_sharing(kind: Kind, max_share: f64) -> Rule {
    Rule::builder(format!("global-{kind}-{max_share}"))
        .algorithm(kind)
        .limit(LIMIT, Duration::from_secs(1))
        .distribution(Distribution::lease(EPSILON, max_share))
        .build()
        .unwrap()
}

/// Arrivals at one gateway in one millisecond step.
#[derive(Clone, Copy, Debug)]
enum Traffic {
    /// Bursts of ~200 every 50 ms, spread over the gateways, little between.
    Bursty,
    /// 85% of a steady ~3x overload at gateway 0.
    Skewed,
    /// About the limit (1.2x), evenly: slices are still held when a
    /// window ends.
    Near,
    /// Under the limit (0.9x) in even seconds, 3x over it in odd ones:
    /// what is held at the end of a quiet window meets a full one.
    Alternating,
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn arrivals(t: Traffic, step: u64, gateway: usize, rng: &mut Rng) -> u64 {
    match t {
        Traffic::Bursty if step.is_multiple_of(50) => 40 + rng.next() % 20,
        Traffic::Bursty => rng.next() % 2,
        Traffic::Skewed if gateway == 0 => 2 + rng.next() % 2,
        Traffic::Skewed => rng.next() % 3 / 2,
        Traffic::Near => u64::from(rng.next() % 10 < 3),
        Traffic::Alternating if (step / 1000).is_multiple_of(2) => u64::from(rng.next() % 40 < 9),
        Traffic::Alternating => rng.next() % 4 * 2 / 3,
    }
}

/// Runs 4 s of `traffic` through `gateways` (gateway 3 is killed, dropped
/// without giving back its slice, at 2 s or as soon after as it holds
/// one); returns the admission times
/// and how many decisions there were.
async fn run<S: Store>(
    mut gateways: Vec<Option<Leased<S>>>,
    clock: &ManualClock,
    rule: &Rule,
    traffic: Traffic,
) -> (Vec<u64>, u64, u64) {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let (mut admitted, mut decisions, mut grants) = (vec![], 0u64, 0u64);
    for step in 0..4000u64 {
        // Each step the gateways take turns at going first.
        for i in (0..4).map(|j| (j + step as usize) % 4) {
            let Some(g) = &gateways[i] else { continue };
            for _ in 0..arrivals(traffic, step, i, &mut rng) {
                let op = [Op::new(rule, "global")];
                let v = g.decide(&op, 1, Mode::Apply).await.unwrap();
                decisions += 1;
                if v[0].allowed() {
                    admitted.push(clock.now().get());
                }
            }
        }
        // Gateway 3 is killed after the first step from 2 s on that
        // leaves it holding units of a slice.
        if step >= 2000 && gateways[3].as_ref().is_some_and(|g| g.held() > 0) {
            let g = gateways[3].take().unwrap();
            grants += g.counts().0;
            drop(g);
        }
        clock.advance(Duration::from_millis(1));
    }
    // Gateway 3 is killed holding a slice, except where it may hold none
    // after 2 s: under skew (it sees few requests), or with `max_share` 1
    // (the first gateways to ask take the whole room).
    assert!(
        gateways[3].is_none() || matches!(traffic, Traffic::Skewed) || rule.name().ends_with("-1"),
        "{} {traffic:?}: gateway 3 never held a slice to be killed with",
        rule.name()
    );
    grants += gateways.iter().flatten().map(|g| g.counts().0).sum::<u64>();
    (admitted, decisions, grants)
}

/// The most admitted in any window of 1 s: aligned windows for
/// `fixed_window` and `sliding_window_counter` (whose estimate bounds
/// each aligned window; a window across two it only approximates),
/// windows starting at every admission otherwise.
fn worst_window(kind: Kind, times: &[u64]) -> u64 {
    const W: u64 = 1_000_000;
    if matches!(kind, Kind::FixedWindow | Kind::SlidingWindowCounter) {
        let mut per = std::collections::HashMap::new();
        for t in times {
            *per.entry(t / W).or_insert(0u64) += 1;
        }
        return per.values().copied().max().unwrap_or(0);
    }
    let mut worst = 0;
    let mut j = 0;
    for (i, &t) in times.iter().enumerate() {
        while j < times.len() && times[j] < t + W {
            j += 1;
        }
        worst = worst.max((j - i) as u64);
    }
    worst
}

/// What the algorithm itself may admit in a window of 1 s, without leases.
fn algorithm_bound(kind: Kind) -> u64 {
    match kind {
        // A full bucket, then the refill over the window.
        Kind::Gcra | Kind::TokenBucket | Kind::LeakyBucket => 2 * LIMIT,
        _ => LIMIT,
    }
}

fn check(
    kind: Kind,
    traffic: Traffic,
    share: f64,
    on: &str,
    (times, decisions, grants): (Vec<u64>, u64, u64),
) {
    let worst = worst_window(kind, &times);
    if std::env::var("LEASE_DEBUG").is_ok() {
        let mut per = std::collections::BTreeMap::new();
        for t in &times {
            *per.entry(t / 1_000_000).or_insert(0u64) += 1;
        }
        eprintln!("{on} {kind} {traffic:?} per window {per:?}");
    }
    let eps = (LIMIT as f64 * EPSILON) as u64;
    let bound = if kind == Kind::FixedWindow {
        // A slice ends with the window it was charged in.
        LIMIT
    } else {
        algorithm_bound(kind) + eps
    };
    eprintln!(
        "{on} {kind} {traffic:?} share {share}: {} admitted of {decisions}, {grants} grants, worst window {worst} (bound {bound})",
        times.len()
    );
    assert!(worst <= bound, "{on} {kind} {traffic:?}: {worst} > {bound}");
    // Leasing did its work: most decisions were local (near the limit, the
    // lease room, 50 units, is shared by slices held longer: smaller ones).
    let busy = matches!(traffic, Traffic::Bursty | Traffic::Skewed);
    let per_grant = match (busy, share < 1.0) {
        (true, true) => 5,
        (false, true) => 2,
        // Gateways that each ask for the whole room mostly find it taken.
        (_, false) => 1,
    };
    assert!(
        grants * per_grant < decisions,
        "{on} {kind}: {grants} grants for {decisions} decisions"
    );
    // And admitted most of what the limit allows over 4 s (3.9 windows
    // after the first; a killed gateway strands at most its slice).
    assert!(
        times.len() as u64 >= (3 * LIMIT).min(decisions * 8 / 10),
        "{on} {kind} {traffic:?}: only {} admitted",
        times.len()
    );
}

/// Every algorithm under every traffic, at the default share and at 1.
fn cases() -> Vec<(Kind, Traffic, f64)> {
    let mut out = vec![];
    for kind in KINDS {
        for traffic in [
            Traffic::Bursty,
            Traffic::Skewed,
            Traffic::Near,
            Traffic::Alternating,
        ] {
            for share in [0.25, 1.0] {
                out.push((kind, traffic, share));
            }
        }
    }
    out
}

const KINDS: [Kind; 6] = [
    Kind::FixedWindow,
    Kind::SlidingWindowLog,
    Kind::SlidingWindowCounter,
    Kind::TokenBucket,
    Kind::LeakyBucket,
    Kind::Gcra,
];

#[tokio::test]
async fn leases_keep_every_window_within_epsilon_on_memory() {
    for (kind, traffic, share) in cases() {
        {
            let clock = ManualClock::new(wall_now());
            let store = MemoryStore::builder().clock(clock.clone()).build();
            let gateways = (0..4)
                .map(|_| Some(Leased::with_clock(store.clone(), Arc::new(clock.clone()))))
                .collect();
            let rule = rule_sharing(kind, share);
            check(
                kind,
                traffic,
                share,
                "memory",
                run(gateways, &clock, &rule, traffic).await,
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_keep_every_window_within_epsilon_on_redis() {
    let server = common::RedisServer::start();
    for (kind, traffic, share) in cases() {
        {
            let clock = ManualClock::new(wall_now());
            let gateways = (0..4)
                .map(|_| {
                    let store = RedisStore::new(RedisConfig {
                        url: Some(server.url()),
                        local_clock: Some(Arc::new(clock.clone())),
                        timeout: Duration::from_secs(2),
                        ..Default::default()
                    })
                    .unwrap();
                    Some(Leased::with_clock(store, Arc::new(clock.clone())))
                })
                .collect();
            let rule = rule_sharing(kind, share);
            check(
                kind,
                traffic,
                share,
                "redis",
                run(gateways, &clock, &rule, traffic).await,
            );
            server.cli(&["FLUSHALL"]);
        }
    }
}

/// What a gateway did not use goes back when it shuts down, where the
/// algorithm's refund is exact: the key has it all again.
#[tokio::test]
async fn a_slice_not_used_is_given_back() {
    let clock = ManualClock::new(wall_now());
    let store = MemoryStore::builder().clock(clock.clone()).build();
    let rule = rule(Kind::Gcra);
    let g = Leased::with_clock(store.clone(), Arc::new(clock.clone()));
    let op = [Op::new(&rule, "global")];
    assert!(g.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
    // The slice of the second call follows the first's rate: more than 1.
    clock.advance(Duration::from_micros(10));
    for _ in 0..3 {
        assert!(g.decide(&op, 1, Mode::Apply).await.unwrap()[0].allowed());
    }
    let fresh = store
        .inspect(Op::new(&rule, "other"))
        .await
        .unwrap()
        .remaining;
    let before = store.inspect(op[0]).await.unwrap().remaining;
    g.give_back().await.unwrap();
    let after = store.inspect(op[0]).await.unwrap().remaining;
    // 4 used, everything else back.
    assert_eq!(after, fresh - 4, "remaining {before} -> {after}");
    assert!(before < after);
}

/// Rules that cannot be leased say so.
#[test]
fn only_plain_limits_are_leased() {
    let d = Distribution::lease(0.05, 0.5);
    let bad = [
        Rule::builder("a")
            .algorithm(Kind::Concurrency)
            .limit(100, Duration::from_secs(1))
            .distribution(d)
            .build(),
        Rule::builder("b")
            .limit(100, Duration::from_secs(1))
            .min_interval(Duration::from_millis(1))
            .distribution(d)
            .build(),
        Rule::builder("c")
            .limit(100, Duration::from_secs(1))
            .count_failures(false)
            .distribution(d)
            .build(),
        Rule::builder("d")
            .limit(10, Duration::from_secs(1))
            .distribution(Distribution::lease(0.05, 0.5))
            .build(),
        Rule::builder("e")
            .limit(100, Duration::from_secs(1))
            .distribution(Distribution::lease(0.0, 0.5))
            .build(),
    ];
    for r in bad {
        assert_eq!(r.unwrap_err().key(), "distribution");
    }
    let ok = rule(Kind::Gcra);
    assert_eq!(ok.lease_room(), 50);
}

/// The store's side of the bound, asked directly: what all holders' slices
/// hold never passes the lease room; a slice given back frees its room, and
/// is refunded to the key only where the refund is exact.
async fn the_room_bounds_all_slices<S: Store>(store: &S, clock: &ManualClock) {
    use ratewarden::clock::Micros;
    use ratewarden::store::lease::{Ask, Grant};
    let ask = |holder, want, need, returned| Ask {
        holder,
        want,
        need,
        held: 0,
        returned,
        lifetime: Micros::from_secs(1),
        cap: 50,
    };
    for kind in [Kind::Gcra, Kind::SlidingWindowLog] {
        let rule = rule_sharing(kind, 1.0);
        let op = Op::new(&rule, "global");
        let units = |g: Grant| match g {
            Grant::Granted { units, .. } => units,
            other => panic!("{kind}: {other:?}"),
        };
        assert_eq!(units(store.grant(op, &ask(1, 30, 1, 0)).await.unwrap()), 30);
        assert_eq!(units(store.grant(op, &ask(2, 30, 1, 0)).await.unwrap()), 20);
        assert_eq!(
            store.grant(op, &ask(3, 5, 1, 0)).await.unwrap(),
            Grant::Full
        );
        let before = store.inspect(op).await.unwrap().remaining;
        // Holder 1 gives its 30 back: they are room again...
        assert_eq!(
            store.grant(op, &ask(1, 0, 0, 30)).await.unwrap(),
            Grant::Returned
        );
        assert_eq!(units(store.grant(op, &ask(3, 40, 1, 0)).await.unwrap()), 30);
        // ... and allowance again where a refund is exact (gcra: 30 back,
        // 30 taken by holder 3), not on a log (30 more taken).
        let after = store.inspect(op).await.unwrap().remaining;
        let expected = if kind == Kind::Gcra {
            before
        } else {
            before - 30
        };
        assert_eq!(after, expected, "{kind}");
        // A slice lapses after its lifetime: its room is free again.
        clock.advance(Duration::from_secs(1));
        assert_eq!(units(store.grant(op, &ask(4, 50, 1, 0)).await.unwrap()), 50);
    }
}

#[tokio::test]
async fn the_room_bounds_all_slices_on_memory() {
    let clock = ManualClock::new(wall_now());
    let store = MemoryStore::builder().clock(clock.clone()).build();
    the_room_bounds_all_slices(&store, &clock).await;
}

#[tokio::test]
async fn the_room_bounds_all_slices_on_redis() {
    let server = common::RedisServer::start();
    let clock = ManualClock::new(wall_now());
    let store = RedisStore::new(RedisConfig {
        url: Some(server.url()),
        local_clock: Some(Arc::new(clock.clone())),
        timeout: Duration::from_secs(2),
        ..Default::default()
    })
    .unwrap();
    the_room_bounds_all_slices(&store, &clock).await;
}

/// A memory store whose first grant never answers (a store call that hangs
/// until its request is dropped).
#[derive(Clone)]
struct FirstGrantHangs(MemoryStore, Arc<std::sync::atomic::AtomicBool>);

impl Store for FirstGrantHangs {
    async fn decide(
        &self,
        ops: &[Op<'_>],
        weight: u64,
        mode: Mode,
    ) -> Result<Vec<ratewarden::Verdict>, ratewarden::StoreError> {
        self.0.decide(ops, weight, mode).await
    }
    async fn settle(
        &self,
        ops: &[Op<'_>],
        how: ratewarden::Settle,
    ) -> Result<(), ratewarden::StoreError> {
        self.0.settle(ops, how).await
    }
    async fn release(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), ratewarden::StoreError> {
        self.0.release(leases).await
    }
    async fn renew(&self, leases: &[(Op<'_>, u64, u64)]) -> Result<(), ratewarden::StoreError> {
        self.0.renew(leases).await
    }
    async fn grant(
        &self,
        op: Op<'_>,
        ask: &ratewarden::store::lease::Ask,
    ) -> Result<ratewarden::store::lease::Grant, ratewarden::StoreError> {
        if !self.1.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::future::pending::<()>().await;
        }
        self.0.grant(op, ask).await
    }
    async fn inspect(&self, op: Op<'_>) -> Result<ratewarden::KeyInfo, ratewarden::StoreError> {
        self.0.inspect(op).await
    }
    async fn clear(&self, op: Op<'_>) -> Result<bool, ratewarden::StoreError> {
        self.0.clear(op).await
    }
    async fn ping(&self) -> Result<(), ratewarden::StoreError> {
        self.0.ping().await
    }

    async fn ban(&self, op: Op<'_>, left: Duration) -> Result<(), ratewarden::StoreError> {
        self.0.ban(op, left).await
    }
}

/// A request dropped while it renews a slice (its client went away) does
/// not leave the requests waiting on that renewal waiting for ever.
#[tokio::test]
async fn a_renewal_dropped_midway_lets_the_waiting_requests_go_on() {
    let clock = ManualClock::new(wall_now());
    let store = FirstGrantHangs(
        MemoryStore::builder().clock(clock.clone()).build(),
        Default::default(),
    );
    let g = Arc::new(Leased::with_clock(store, Arc::new(clock.clone())));
    let rule = rule(Kind::Gcra);
    // One request on the global key, in a task of its own.
    let request = || {
        let (g, rule) = (g.clone(), rule.clone());
        tokio::spawn(async move {
            let op = [Op::new(&rule, "global")];
            g.decide(&op, 1, Mode::Apply).await
        })
    };
    let renewing = request();
    tokio::task::yield_now().await;
    let waiting = request();
    tokio::task::yield_now().await;
    assert!(
        !waiting.is_finished(),
        "the second request waits for the renewal"
    );
    renewing.abort();
    let v = tokio::time::timeout(Duration::from_secs(5), waiting)
        .await
        .expect("the waiting request went on")
        .unwrap()
        .unwrap();
    assert!(v[0].allowed());
}
