//! The cost of calendar windows: a `fixed_window` check whose window is a
//! month in Asia/Seoul (the period kept, as on every request but the
//! first of a period) beside the same check on a plain 30-day window, and
//! the period arithmetic itself (what the first request of a period pays),
//! all in one run.
//!
//!     cargo bench -p ratewarden --bench calendar

use std::hint::black_box;
use std::num::NonZeroU64;
use std::sync::Arc;

use criterion::{Criterion, criterion_group, criterion_main};
use ratewarden::algorithm::fixed_window::{FixedWindow, State};
use ratewarden::calendar::{Calendar, Period};
use ratewarden::clock::Micros;

fn bench(c: &mut Criterion) {
    let limit = NonZeroU64::new(100_000).unwrap();
    let plain = FixedWindow::new(limit, Micros::from_secs(30 * 86_400)).unwrap();
    let month = Arc::new(Calendar::new(Period::Month, "Asia/Seoul", Some(1), None, None).unwrap());
    let calendar = FixedWindow::calendar(limit, month.clone());
    let berlin = Calendar::new(Period::Day, "Europe/Berlin", None, None, None).unwrap();
    // 2027-03-10T12:00:00Z, and a state of that window.
    let now = Micros::from_secs(1_805_025_600);
    let mut s = State::default();
    calendar.charge(&mut s, now, 1);
    let mut p = State::default();
    plain.charge(&mut p, now, 1);
    let mut g = c.benchmark_group("calendar");
    g.bench_function("fixed_window/check (plain 30 d, the reference)", |b| {
        b.iter(|| plain.check(black_box(&p), black_box(now), 1))
    });
    g.bench_function("fixed_window/check (month in Asia/Seoul, kept)", |b| {
        b.iter(|| calendar.check(black_box(&s), black_box(now), 1))
    });
    g.bench_function("period arithmetic (month, Asia/Seoul)", |b| {
        b.iter(|| month.compute(black_box(now)))
    });
    g.bench_function("period arithmetic (day, Europe/Berlin)", |b| {
        b.iter(|| berlin.compute(black_box(now)))
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
