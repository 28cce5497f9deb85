//! The shared case table (`tests/cases.table`), run against the Rust
//! algorithms and against the Lua script on a test-started redis-server.
//!
//! Each row is a rule, a key's state before, one operation at a time with a
//! cost, and what must come of it: the verdict, the state after, and when
//! the stores let the state expire. The Rust rule layer is the
//! specification; the Lua port must agree with the table to the
//! microsecond (to the millisecond for Redis expiries, which `PEXPIREAT`
//! rounds up).
//!
//! The Lua side runs on redis-server rather than an embedded Lua 5.1: the
//! script calls `redis.call` for its state (sorted sets for the log and
//! the leases, `PEXPIREAT`, `TIME`), and a stand-in for those calls would
//! test the stand-in. redis-server is the runtime the script meets in
//! production, and the tests start one anyway; the whole table runs in a
//! few hundred milliseconds there.
//!
//! `RATEWARDEN_BLESS=1 cargo test --test case_table` rewrites the expected
//! columns from the Rust side (review the diff: the table is what the
//! algorithms are meant to do, not what they happen to do).

#[path = "../common/mod.rs"]
mod common;
mod lua;

use std::time::Duration;

use common::RedisServer;
use ratewarden::algorithm::{Kind, ScriptState};
use ratewarden::clock::Micros;
use ratewarden::rule::{KeyState, Marks, Reason, Verdict};
use ratewarden::store::redis::script::{self, SCRIPT};
use ratewarden::{Op, Penalty, Rule, Settle};

/// Every time in the table is an offset from this instant: a whole day, so
/// windows of seconds, minutes, hours and days start on it, and one years
/// ahead of the machine's clock (2032-12-20), because redis-server expires
/// keys by its own clock: a `PEXPIREAT` in the past would delete them.
const T0: Micros = Micros::new(1_987_200_000_000_000);

fn table_path() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cases.table")
}

/// `1500ms`, `2s`, `250us`, `3m`, `1h`, `1d`, or plain µs.
fn duration(s: &str) -> Micros {
    let (n, unit) = s
        .find(|c: char| !c.is_ascii_digit())
        .map_or((s, ""), |i| s.split_at(i));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("bad number in `{s}`"));
    Micros::new(n)
        * match unit {
            "" | "us" => 1,
            "ms" => 1_000,
            "s" => 1_000_000,
            "m" => 60_000_000,
            "h" => 3_600_000_000,
            "d" => 86_400_000_000,
            u => panic!("unknown unit `{u}` in `{s}`"),
        }
}

/// An offset from T0, possibly negative (`-5s`).
fn time(s: &str) -> Micros {
    match s.strip_prefix('-') {
        Some(rest) => T0 - duration(rest),
        None => T0 + duration(s),
    }
}

/// `µs` written back as an offset from T0 in the largest exact unit.
fn show_time(t: Micros) -> String {
    if t >= T0 {
        show_duration(t - T0)
    } else {
        format!("-{}", show_duration(T0 - t))
    }
}

fn show_duration(d: Micros) -> String {
    let d = d.get();
    if d == 0 {
        return "0".into();
    }
    for (unit, size) in [
        ("d", 86_400_000_000),
        ("h", 3_600_000_000),
        ("m", 60_000_000),
        ("s", 1_000_000),
        ("ms", 1_000),
    ] {
        if d >= size && d.is_multiple_of(size) {
            return format!("{}{unit}", d / size);
        }
    }
    format!("{d}us")
}

/// `key=value` and bare `flag` words.
fn fields(s: &str) -> Vec<(&str, &str)> {
    s.split_whitespace()
        .map(|w| w.split_once('=').unwrap_or((w, "")))
        .collect()
}

fn rule(spec: &str) -> Rule {
    let mut words = spec.split_whitespace();
    let kind: Kind = words.next().expect("an algorithm").parse().unwrap();
    let f = fields(spec);
    let get = |k: &str| f.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let d = |k: &str| get(k).map(|v| duration(v).as_duration());
    let mut b = Rule::builder(format!("case-{kind}")).algorithm(kind).limit(
        get("limit").expect("limit").parse().unwrap(),
        d("window").unwrap_or(Duration::from_secs(1)),
    );
    if let Some(v) = get("burst") {
        b = b.burst(v.parse().unwrap());
    }
    if let Some(v) = d("max_delay") {
        b = b.delay(v);
    }
    if let Some(v) = d("max_hold") {
        b = b.max_hold(v);
    }
    if let Some(v) = d("min_interval") {
        b = b.min_interval(v);
    }
    if let Some(dur) = d("penalty") {
        let mut p = Penalty::fixed(dur);
        if let Some(m) = get("penalty_mult") {
            p.multiplier = m.parse().unwrap();
        }
        if let Some(m) = d("penalty_max") {
            p.max = m;
        }
        if let Some(m) = d("penalty_memory") {
            p.memory = m;
        }
        b = b.penalty(p);
    }
    if get("count_rejected").is_some() {
        b = b.count_rejected(true);
    }
    if get("failures").is_some() {
        b = b.count_failures(true);
    }
    if get("failures_keep").is_some() {
        b = b.count_failures(false);
    }
    if get("shadow").is_some() {
        b = b.shadow(true);
    }
    b.build().unwrap_or_else(|e| panic!("{spec}: {e}"))
}

/// A state in the table's notation: its algorithm's fields (as the Lua
/// script keeps them, see `Algorithm::to_script`) and the marks.
fn state(rule: &Rule, s: &str) -> KeyState {
    if s == "fresh" {
        return KeyState::default();
    }
    let mut w = ScriptState::default();
    let mut marks = Marks::default();
    let kind = rule.spec().algorithm;
    for (k, v) in fields(s) {
        match (kind, k) {
            (_, "last") => marks.last = time(v),
            (_, "ban") => marks.ban_until = time(v),
            (_, "ban_level") => marks.ban_level = v.parse().unwrap(),
            (Kind::FixedWindow | Kind::SlidingWindowCounter, "start") => w.words[0] = time(v).get(),
            (Kind::FixedWindow, "count") => w.words[1] = v.parse().unwrap(),
            (Kind::SlidingWindowCounter, "prev") => w.words[1] = v.parse().unwrap(),
            (Kind::SlidingWindowCounter, "cur") => w.words[2] = v.parse().unwrap(),
            (Kind::TokenBucket, "deficit") | (Kind::LeakyBucket, "level") => {
                w.words[0] = v.parse().unwrap()
            }
            (Kind::TokenBucket | Kind::LeakyBucket, "at") => w.words[1] = time(v).get(),
            (Kind::Gcra, "tat") => w.words[0] = time(v).get(),
            (Kind::SlidingWindowLog, "log") => {
                for (i, e) in v.split(',').enumerate() {
                    let (t, c) = e.split_once(':').unwrap_or((e, "1"));
                    let c: u64 = c.parse().unwrap();
                    w.log.push((time(t).get(), i as u64 + 1, c));
                    w.words[0] += c;
                    w.words[1] += 1;
                }
            }
            (Kind::Concurrency, "leases") => {
                for e in v.split(',') {
                    let (id, rest) = e.split_once('@').unwrap();
                    let (t, c) = rest.split_once(':').unwrap_or((rest, "1"));
                    let c: u64 = c.parse().unwrap();
                    w.log.push((time(t).get(), id.parse().unwrap(), c));
                    w.words[0] += c;
                }
                w.log.sort();
            }
            (Kind::Concurrency, "seq") => w.words[1] = v.parse().unwrap(),
            _ => panic!("`{k}` is not a field of a {kind} state"),
        }
    }
    KeyState::new(rule.params().from_script(&w), marks)
}

/// A state written back in the table's notation.
fn show_state(rule: &Rule, s: &KeyState) -> String {
    if *s == KeyState::default() {
        return "fresh".into();
    }
    let w = rule.params().to_script(&s.algo);
    let mut out: Vec<String> = vec![];
    if s.algo != ratewarden::algorithm::State::Fresh {
        match rule.spec().algorithm {
            Kind::FixedWindow => {
                out.push(format!("start={}", show_time(Micros::new(w.words[0]))));
                out.push(format!("count={}", w.words[1]));
            }
            Kind::SlidingWindowCounter => {
                out.push(format!("start={}", show_time(Micros::new(w.words[0]))));
                out.push(format!("prev={}", w.words[1]));
                out.push(format!("cur={}", w.words[2]));
            }
            Kind::TokenBucket => {
                out.push(format!("deficit={}", w.words[0]));
                out.push(format!("at={}", show_time(Micros::new(w.words[1]))));
            }
            Kind::LeakyBucket => {
                out.push(format!("level={}", w.words[0]));
                out.push(format!("at={}", show_time(Micros::new(w.words[1]))));
            }
            Kind::Gcra => out.push(format!("tat={}", show_time(Micros::new(w.words[0])))),
            Kind::SlidingWindowLog => {
                let log: Vec<String> = w
                    .log
                    .iter()
                    .map(|&(t, _, c)| format!("{}:{c}", show_time(Micros::new(t))))
                    .collect();
                if !log.is_empty() {
                    out.push(format!("log={}", log.join(",")));
                }
            }
            Kind::Concurrency => {
                let leases: Vec<String> = w
                    .log
                    .iter()
                    .map(|&(t, id, c)| format!("{id}@{}:{c}", show_time(Micros::new(t))))
                    .collect();
                if !leases.is_empty() {
                    out.push(format!("leases={}", leases.join(",")));
                }
                out.push(format!("seq={}", w.words[1]));
            }
        }
    }
    let m = s.marks();
    if m.last > Micros::ZERO {
        out.push(format!("last={}", show_time(m.last)));
    }
    if m.ban_until > Micros::ZERO {
        out.push(format!("ban={}", show_time(m.ban_until)));
    }
    if m.ban_level > 0 {
        out.push(format!("ban_level={}", m.ban_level));
    }
    if out.is_empty() {
        "fresh".into()
    } else {
        out.join(" ")
    }
}

/// What one operation does.
#[derive(Debug, Clone, Copy)]
enum OpKind {
    Apply,
    Peek,
    Fail,
    Ok,
    Release(u64),
    /// A refund of an admitted request's cost (Envoy's negative hits,
    /// leases given back); rows only for algorithms that refund.
    Refund,
    /// An answer that cost more than its admission charged: its extra
    /// cost charged now (`Settle::Charge`), past the limit if need be.
    Charge,
    /// A ban an operator sets (`ban at=T for=D`: the cost column carries
    /// D in µs, as the script's ARGV does).
    Ban,
}

struct Row {
    line: usize,
    text: String,
    rule: String,
    before: String,
    op: String,
    verdict: String,
    after: String,
    expires: String,
}

fn rows() -> Vec<Row> {
    let text = std::fs::read_to_string(table_path()).unwrap();
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(|(i, l)| {
            let cols: Vec<&str> = l.split('|').map(str::trim).collect();
            assert_eq!(cols.len(), 6, "line {}: six columns", i + 1);
            Row {
                line: i + 1,
                text: l.to_owned(),
                rule: cols[0].into(),
                before: cols[1].into(),
                op: cols[2].into(),
                verdict: cols[3].into(),
                after: cols[4].into(),
                expires: cols[5].into(),
            }
        })
        .collect()
}

/// `apply at=T cost=N`, `peek ...`, `fail at=T`, `ok at=T`,
/// `release at=T lease=N cost=N`, `refund at=T cost=N`; `times=N` names
/// the key N times in one call (an apply or a peek), each at the cost:
/// the kind, the time, the cost and the times.
fn op_times(s: &str) -> (OpKind, Micros, u64, usize) {
    let times = fields(s)
        .iter()
        .find(|(n, _)| *n == "times")
        .map_or(1, |(_, v)| v.parse().unwrap());
    let (kind, at, cost) = op_once(s);
    (kind, at, cost, times)
}

fn op_once(s: &str) -> (OpKind, Micros, u64) {
    let f = fields(s);
    let get = |k: &str| f.iter().find(|(n, _)| *n == k).map(|(_, v)| *v);
    let at = time(get("at").expect("at="));
    let cost = match get("for") {
        Some(d) => duration(d).get(),
        None => get("cost").map_or(1, |c| c.parse().unwrap()),
    };
    let kind = match f[0].0 {
        "apply" => OpKind::Apply,
        "peek" => OpKind::Peek,
        "fail" => OpKind::Fail,
        "ok" => OpKind::Ok,
        "release" => OpKind::Release(get("lease").expect("lease=").parse().unwrap()),
        "refund" => OpKind::Refund,
        "charge" => OpKind::Charge,
        "ban" => OpKind::Ban,
        other => panic!("unknown op `{other}`"),
    };
    (kind, at, cost)
}

fn show_verdict(v: Option<&Verdict>) -> String {
    let Some(v) = v else { return "-".into() };
    let word = match v.reason {
        None => "allow",
        Some(Reason::Limit) => "limit",
        Some(Reason::Banned) => "banned",
        Some(Reason::MinInterval) => "min_interval",
        Some(Reason::Full) => "store_full",
    };
    let mut out = format!(
        "{word} remaining={} reset={}",
        v.check.remaining,
        show_duration(v.check.reset_after)
    );
    if v.reason.is_some() {
        match ratewarden::algorithm::NEVER == v.check.retry_after {
            true => out.push_str(" retry=never"),
            false => out.push_str(&format!(" retry={}", show_duration(v.check.retry_after))),
        }
    }
    if v.check.delay > Micros::ZERO {
        out.push_str(&format!(" delay={}", show_duration(v.check.delay)));
    }
    if let Some(l) = v.lease {
        out.push_str(&format!(" lease={l}"));
    }
    out
}

/// What a store ends with: the verdict, the state after, and its expiry
/// (`-` not written, `gone` deleted, else the time it reads fresh from).
struct Outcome {
    verdict: String,
    after: String,
    expires: String,
}

/// The Rust rule layer on the row: what the memory store does, without it.
fn run_rust(rule: &Rule, row: &Row) -> Outcome {
    let mut st = state(rule, &row.before);
    // A call naming the key N times is decided on the sum of its costs,
    // every copy given that one verdict (store::memory, lua/rule.lua).
    let (kind, now, cost, times) = op_times(&row.op);
    let cost = cost * times as u64;
    let (verdict, written) = match kind {
        OpKind::Apply | OpKind::Peek => {
            let mut v = rule.verdict(&st, now, cost);
            let admitted = v.allowed() || rule.is_shadow();
            let records = matches!(kind, OpKind::Apply) && rule.records(&v, admitted);
            if records {
                rule.commit(&mut st, now, cost, &v, admitted);
                v.lease = rule.lease_taken(&st, &v, admitted);
            }
            (Some(v), records)
        }
        OpKind::Fail | OpKind::Ok => {
            let failure = matches!(kind, OpKind::Fail);
            let changes = match rule.spec().counting {
                ratewarden::Counting::All => false,
                ratewarden::Counting::Failures { reset_on_success } => failure || reset_on_success,
            };
            if changes {
                let how = if failure {
                    Settle::Failure(1)
                } else {
                    Settle::Success
                };
                rule.settle(&mut st, now, cost, how);
            }
            (None, changes)
        }
        OpKind::Release(lease) => {
            rule.release(&mut st, lease, cost);
            (None, true)
        }
        OpKind::Refund => {
            rule.settle(&mut st, now, cost, Settle::Refund(1));
            (None, true)
        }
        OpKind::Charge => {
            let charges = Settle::Charge(cost).applies_to(rule);
            if charges {
                rule.settle(&mut st, now, cost, Settle::Charge(1));
            }
            (None, charges)
        }
        OpKind::Ban => {
            st.hold_ban(now + Micros::new(cost));
            (None, true)
        }
    };
    let expires = if !written {
        "-".to_owned()
    } else {
        match rule.idle_at(&st) {
            t if t <= now => {
                st = KeyState::default();
                "gone".into()
            }
            t => show_time(t),
        }
    };
    Outcome {
        verdict: show_verdict(verdict.as_ref()),
        after: if written {
            show_state(rule, &st)
        } else {
            "same".into()
        },
        expires,
    }
}

/// Redis keeps expiries in whole milliseconds, rounded up.
fn expiry_as_redis(expected: &str) -> String {
    match expected {
        "-" | "gone" => expected.to_owned(),
        t => format!("{}ms", time(t).div_ceil(Micros::from_millis(1))),
    }
}

/// Everything a store must agree with, as `(column, expected, got)`.
fn mismatches(row: &Row, got: &Outcome, redis: bool) -> Vec<String> {
    let expires = if redis {
        expiry_as_redis(&row.expires)
    } else {
        row.expires.clone()
    };
    let mut out = vec![];
    for (col, want, got) in [
        ("verdict", &row.verdict, &got.verdict),
        ("after", &row.after, &got.after),
        ("expires", &expires, &got.expires),
    ] {
        // A row whose state reads as fresh again was deleted: Redis has it
        // gone, the table may say fresh.
        if want != got && !(col == "after" && want == "fresh" && got == "fresh") {
            out.push(format!("{col}: want `{want}`, got `{got}`"));
        }
    }
    out
}

#[test]
fn the_rust_rule_layer_agrees_with_the_table() {
    let rows = rows();
    let bless = std::env::var_os("RATEWARDEN_BLESS").is_some();
    let mut failures = vec![];
    let mut blessed = std::fs::read_to_string(table_path()).unwrap();
    for row in &rows {
        let rule = rule(&row.rule);
        let got = run_rust(&rule, row);
        if bless {
            let cols: Vec<&str> = row.text.split('|').collect();
            let line = format!(
                "{}|{}|{}| {} | {} | {}",
                cols[0], cols[1], cols[2], got.verdict, got.after, got.expires
            );
            blessed = blessed.replacen(&row.text, &line, 1);
            continue;
        }
        for m in mismatches(row, &got, false) {
            failures.push(format!("line {}: {m}", row.line));
        }
    }
    if bless {
        std::fs::write(table_path(), blessed).unwrap();
        return;
    }
    // Every algorithm has rows, and every modifier.
    for kind in Kind::ALL {
        assert!(
            rows.iter().any(|r| r.rule.starts_with(kind.name())),
            "no rows for {kind}"
        );
    }
    for modifier in [
        "min_interval",
        "penalty",
        "penalty_mult",
        "count_rejected",
        "failures",
        "failures_keep",
        "shadow",
        "burst",
        "max_delay",
        "max_hold",
    ] {
        assert!(
            rows.iter()
                .any(|r| fields(&r.rule).iter().any(|(k, _)| *k == modifier)),
            "no rows for {modifier}"
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} rows:\n{}",
        failures.len(),
        rows.len(),
        failures.join("\n")
    );
}
