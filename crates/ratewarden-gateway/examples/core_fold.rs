//! The reference for `bench/simulate.sh`: the same traffic as `ratewarden
//! simulate --traffic SPEC` folded through the core alone (`Limiter::check`
//! on one rule, one thread, a manual clock), without the admission path,
//! the series or anything else simulate does.
//!
//!     cargo run --release --example core_fold -- RULE.yaml SPEC
//!
//! Prints `requests=N admitted=N seconds=S rate=R/s`.

use std::time::Instant;

use futures_util::FutureExt as _;
use ratewarden::clock::{ManualClock, Micros};
use ratewarden::{Limiter, MemoryStore};
use ratewarden_gateway::config::{self, Overrides};
use ratewarden_gateway::simulate::{run::EPOCH, traffic};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let [_, conf, spec] = &args[..] else {
        eprintln!("usage: core_fold RULE.yaml SPEC");
        std::process::exit(2);
    };
    let text = std::fs::read_to_string(conf).expect("the config file");
    let cfg = config::load(&text, conf, &Overrides::default()).expect("a valid config");
    let rule = &cfg.policy.rules[0].rule;
    let t = traffic::load(spec).expect("a traffic spec");
    let clock = ManualClock::new(EPOCH);
    let keys = (t.identities.len()).clamp(1 << 16, 1 << 26);
    let limiter = Limiter::new(
        MemoryStore::builder()
            .max_keys(keys)
            .clock(clock.clone())
            .build(),
    );
    let started = Instant::now();
    let mut admitted = 0u64;
    for e in &t.events {
        clock.set(Micros::new(EPOCH + e.t));
        let d = limiter
            .check(rule, &t.identities[e.identity as usize])
            .now_or_never()
            .expect("memory decides at once")
            .expect("memory never fails");
        admitted += u64::from(d.allowed);
    }
    let took = started.elapsed().as_secs_f64();
    println!(
        "requests={} admitted={admitted} seconds={took:.3} rate={:.0}/s",
        t.events.len(),
        t.events.len() as f64 / took
    );
}
