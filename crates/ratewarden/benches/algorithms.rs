//! Time per decision of every algorithm on the memory store, on one hot key and
//! over 1,000,000 distinct keys, with 1 and 2 threads, beside governor's keyed
//! GCRA limiter measured in the same run.
//!
//! `cargo bench -p ratewarden --bench algorithms`

use std::hint::black_box;
use std::num::NonZeroU32;
use std::thread;
use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use governor::{Quota, RateLimiter};

use ratewarden::algorithm::Kind;
use ratewarden::{MemoryStore, Mode, Op, Rule};

const KEYS: usize = 1_000_000;
const LIMIT: u32 = 1_000;

fn keys() -> Vec<String> {
    (0..KEYS)
        .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
        .collect()
}

/// Key index for iteration `i`: a fixed pseudo-random walk over all keys, so
/// both limiters see the same cache-unfriendly order.
fn pick(i: u64) -> usize {
    (i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 44) as usize % KEYS
}

/// Runs `iters` calls of `f` split over `threads` threads; wall time.
fn run<F: Fn(u64) + Sync>(threads: u64, iters: u64, f: F) -> Duration {
    let start = Instant::now();
    thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || {
                let per = iters / threads;
                for i in t * per..(t + 1) * per {
                    f(i);
                }
            });
        }
    });
    start.elapsed()
}

fn bench(c: &mut Criterion) {
    let keys = keys();
    let quota = Quota::per_second(NonZeroU32::new(LIMIT).unwrap());
    for threads in [1u64, 2] {
        let mut g = c.benchmark_group(format!("{threads}-thread"));
        g.sample_size(20).measurement_time(Duration::from_secs(3));

        let gov = RateLimiter::keyed(quota);
        for k in &keys {
            let _ = gov.check_key(k);
        }
        g.bench_function("governor-gcra/hot", |b| {
            b.iter_custom(|n| run(threads, n, |_| drop(black_box(gov.check_key(&keys[0])))))
        });
        g.bench_function("governor-gcra/1M-keys", |b| {
            b.iter_custom(|n| {
                run(threads, n, |i| {
                    drop(black_box(gov.check_key(&keys[pick(i)])))
                })
            })
        });

        for kind in Kind::ALL {
            let rule = Rule::builder("bench")
                .algorithm(kind)
                .limit(u64::from(LIMIT), Duration::from_secs(1))
                .build()
                .unwrap();
            // Room for every key: this measures decisions, not eviction.
            let store = MemoryStore::builder().max_keys(2 * KEYS).build();
            for k in &keys {
                store.decide_one(&Op::new(&rule, k), 1, Mode::Apply);
            }
            let decide = |key: &str| {
                black_box(store.decide_one(&Op::new(&rule, key), 1, Mode::Apply));
            };
            g.bench_function(format!("{kind}/hot"), |b| {
                b.iter_custom(|n| run(threads, n, |_| decide(&keys[0])))
            });
            g.bench_function(format!("{kind}/1M-keys"), |b| {
                b.iter_custom(|n| run(threads, n, |i| decide(&keys[pick(i)])))
            });
        }
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
