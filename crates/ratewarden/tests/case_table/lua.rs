//! The Lua side of the table: each row run through the script (by EVAL and
//! as a Redis Function) on a real Redis, and mutants of the script that the
//! table must catch.

use super::*;

/// The most entries a sliding_window_log keeps in its state's tail
/// (`SMALL` in lua/sliding_window_log.lua).
const SMALL_LOG: usize = 4;

/// The Lua script on the row, on `redis`, with `script` as the script.
fn run_lua(con: &mut redis::Connection, source: &str, rule: &Rule, row: &Row) -> Outcome {
    let before = state(rule, &row.before);
    let (kind, now, cost, times) = op_times(&row.op);
    let (key, log) = ("t:{case}:k", "t:{case}:k:log");
    redis::cmd("FLUSHALL").exec(con).unwrap();
    if before != KeyState::default() {
        let w = rule.params().to_script(&before.algo);
        let m = before.marks();
        let fields = [
            w.words[0],
            w.words[1],
            w.words[2],
            m.last.get(),
            m.ban_until.get(),
            u64::from(m.ban_level),
        ];
        let mut packed: Vec<u8> = fields
            .iter()
            .flat_map(|&v| (v as f64).to_le_bytes())
            .collect();
        // A sliding_window_log of at most four entries keeps them after its
        // fields (its tail, lua/sliding_window_log.lua), a longer one in
        // its zset; concurrency's leases are always in the zset.
        let swl = rule.spec().algorithm == Kind::SlidingWindowLog;
        let in_tail = swl && w.log.len() <= SMALL_LOG;
        if in_tail {
            for (t, _, c) in &w.log {
                packed.extend((*t as f64).to_le_bytes());
                packed.extend((*c as f64).to_le_bytes());
            }
        }
        if !swl || in_tail {
            redis::cmd("SET").arg(key).arg(packed).exec(con).unwrap();
        } else {
            redis::cmd("SET").arg(key).arg("z").exec(con).unwrap();
            // A long log is in the zset, its state there too, scored -inf:
            // the zset's expiry in ms as last set (0: none is), then the
            // fields (the marks' only where one is not zero, as the script
            // writes them).
            let n = if fields[3..].iter().all(|&v| v == 0) {
                24
            } else {
                48
            };
            let member = [&0f64.to_le_bytes()[..], &packed[..n]].concat();
            redis::cmd("ZADD")
                .arg(log)
                .arg("-inf")
                .arg(member)
                .exec(con)
                .unwrap();
        }
        for (score, seq, c) in w.log.iter().filter(|_| !in_tail) {
            // sliding_window_log's entries: number and cost (where it is
            // not 1) as big-endian doubles; concurrency's leases
            // "lease:cost".
            let member = if swl && *c == 1 {
                (*seq as f64).to_be_bytes().to_vec()
            } else if swl {
                [(*seq as f64).to_be_bytes(), (*c as f64).to_be_bytes()].concat()
            } else {
                format!("{seq:015}:{c}").into_bytes()
            };
            redis::cmd("ZADD")
                .arg(log)
                .arg(*score)
                .arg(member)
                .exec(con)
                .unwrap();
        }
    }
    let o = Op::new(rule, "k");
    let (mode, lease) = match kind {
        OpKind::Apply => (script::Mode::Apply, 0),
        OpKind::Peek => (script::Mode::Peek, 0),
        OpKind::Fail => (script::Mode::Failure, 0),
        OpKind::Ok => (script::Mode::Success, 0),
        OpKind::Release(l) => (script::Mode::Release, l),
        OpKind::Refund => (script::Mode::Refund, 0),
        OpKind::Charge => (script::Mode::Charge, 0),
        OpKind::Ban => (script::Mode::Ban, 0),
    };
    let args = script::argv(&vec![(o, cost, lease); times], mode, now, now);
    // A Functions library (`#!lua name=...`, loaded by `lua_failures`) is
    // called by its function's name; a script is sent whole.
    let mut call = match source.strip_prefix("#!lua name=") {
        Some(rest) => {
            let mut c = redis::cmd("FCALL");
            c.arg(rest.lines().next().unwrap());
            c
        }
        None => {
            let mut c = redis::cmd("EVAL");
            c.arg(source);
            c
        }
    };
    call.arg(2 * times);
    for _ in 0..times {
        call.arg(key).arg(log);
    }
    let reply: redis::Value = call
        .arg(&args)
        .query(con)
        .unwrap_or_else(|e| panic!("line {}: {e}", row.line));
    let verdict = match kind {
        OpKind::Apply | OpKind::Peek => {
            let all = script::reply(&reply, times).unwrap();
            assert!(
                all.iter().all(|v| *v == all[0]),
                "line {}: the copies of one key got different verdicts: {all:?}",
                row.line
            );
            Some(all[0])
        }
        _ => None,
    };
    // Read the state back: a string, or (a long sliding_window_log) a
    // member of its zset scored -inf, its six fields then the zset's
    // expiry as the script last set it.
    let string: Option<Vec<u8>> = redis::cmd("GET").arg(key).query(con).unwrap();
    let mut members: Vec<(Vec<u8>, f64)> = redis::cmd("ZRANGE")
        .arg(log)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(con)
        .unwrap();
    let f = |b: &[u8]| f64::from_le_bytes(b.try_into().unwrap());
    let logged = members
        .first()
        .is_some_and(|(_, s)| *s == f64::NEG_INFINITY);
    assert_eq!(
        logged,
        string.as_deref() == Some(b"z"),
        "line {}: a state in the zset, and only then `z` as its string",
        row.line
    );
    let (packed, recorded_expiry) = if logged {
        // The zset's expiry, then the state's fields (the marks' three
        // only where one is not zero).
        let (m, _) = members.remove(0);
        assert!(
            m.len() == 32 || m.len() == 56,
            "line {}: a zset state of {} bytes",
            row.line,
            m.len()
        );
        (Some(m[8..].to_vec()), Some(f(&m[..8]) as i64))
    } else {
        (string, None)
    };
    let h: Vec<Option<u64>> = match &packed {
        // Little-endian doubles; trailing zero fields are left out.
        Some(p) => {
            assert!(
                p.len() % 8 == 0 && (8..=48 + 16 * SMALL_LOG).contains(&p.len()),
                "line {}: a state of {} bytes",
                row.line,
                p.len()
            );
            assert!(
                p.len() <= 48 || rule.spec().algorithm == Kind::SlidingWindowLog,
                "line {}: only a sliding_window_log has a tail",
                row.line
            );
            let mut h: Vec<Option<u64>> = p[..p.len().min(48)]
                .chunks_exact(8)
                .map(|b| Some(f(b) as u64))
                .collect();
            h.resize(6, Some(0));
            h
        }
        None => vec![None; 6],
    };
    let mut zs: Vec<(String, f64)> = members
        .into_iter()
        .map(|(m, s)| {
            assert!(s >= 0.0, "line {}: a second state in the zset", row.line);
            let m = if rule.spec().algorithm == Kind::SlidingWindowLog {
                // Number, then cost where it is not 1.
                let be = |b: &[u8]| f64::from_be_bytes(b.try_into().unwrap()) as u64;
                match m.len() {
                    8 => format!("{}:1", be(&m)),
                    16 if be(&m[8..]) != 1 => format!("{}:{}", be(&m[..8]), be(&m[8..])),
                    n => panic!("line {}: an entry of {n} bytes", row.line),
                }
            } else {
                String::from_utf8(m).expect("a lease")
            };
            (m, s)
        })
        .collect();
    // A state is in the zset only while its log is (past four entries).
    assert!(
        !logged || !zs.is_empty(),
        "line {}: a zset state with no entries",
        row.line
    );
    // A log in the state's tail: (time, cost) pairs, numbered in order (a
    // log is in one place only).
    if let Some(tail) = packed.as_ref().filter(|p| p.len() > 48).map(|p| &p[48..]) {
        assert!(zs.is_empty(), "line {}: a log in both places", row.line);
        for (i, pair) in tail.chunks_exact(16).enumerate() {
            zs.push((format!("{}:{}", i + 1, f(&pair[8..]) as u64), f(&pair[..8])));
        }
    }
    let exists = h.iter().any(Option::is_some);
    let mut w = ScriptState::default();
    let n = |i: usize| h[i].unwrap_or(0);
    w.words = [n(0), n(1), n(2)];
    for (m, score) in zs {
        let (seq, c) = m.split_once(':').unwrap();
        w.log
            .push((score as u64, seq.parse().unwrap(), c.parse().unwrap()));
    }
    let after = KeyState::new(
        rule.params().from_script(&w),
        Marks {
            last: Micros::new(n(3)),
            ban_until: Micros::new(n(4)),
            ban_level: n(5) as u32,
        },
    );
    let ttl: i64 = redis::cmd("PEXPIRETIME").arg(key).query(con).unwrap();
    if let Some(recorded) = recorded_expiry {
        let zset: i64 = redis::cmd("PEXPIRETIME").arg(log).query(con).unwrap();
        assert_eq!(
            zset, ttl,
            "line {}: the zset's expiry and its string's",
            row.line
        );
        // (0: none set, as the row's before state is written.)
        let set = if ttl == -1 { 0 } else { ttl };
        assert_eq!(
            recorded, set,
            "line {}: the zset's expiry, as its state records it",
            row.line
        );
    }
    let (after, expires) = match (ttl, exists) {
        // No expiry set: the state as written before (nothing was written).
        (-1, _) => ("same".to_owned(), "-".to_owned()),
        (-2, _) if before == KeyState::default() => ("same".into(), "-".into()),
        (-2, _) => ("fresh".into(), "gone".into()),
        (ms, _) => (show_state(rule, &after), format!("{}ms", ms)),
    };
    Outcome {
        verdict: show_verdict(verdict.as_ref()),
        after,
        expires,
    }
}

/// Runs the table through `source` on a fresh redis-server; the failures.
fn lua_failures(source: &str, only: Option<Kind>) -> (usize, Vec<String>) {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let mut con = client.get_connection().unwrap();
    if source.starts_with("#!lua") {
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(source)
            .exec(&mut con)
            .unwrap();
    }
    let mut failures = vec![];
    let mut n = 0;
    for row in rows() {
        let rule = rule(&row.rule);
        if only.is_some_and(|k| k != rule.spec().algorithm) {
            continue;
        }
        n += 1;
        let got = run_lua(&mut con, source, &rule, &row);
        for m in mismatches(&row, &got, true) {
            failures.push(format!("line {}: {m}", row.line));
        }
    }
    (n, failures)
}

#[test]
fn the_lua_script_agrees_with_the_table() {
    let (n, failures) = lua_failures(SCRIPT, None);
    assert!(
        failures.is_empty(),
        "{} of {n} rows:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The same code loaded as a Redis Function (the store's default path)
/// agrees with the table too.
#[test]
fn the_lua_function_agrees_with_the_table() {
    let (library, _) = script::library();
    let (n, failures) = lua_failures(&library, None);
    assert!(
        failures.is_empty(),
        "{} of {n} rows:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// The table is strong enough to catch a plausible slip in each Lua
/// algorithm: each mutant below (a comparison flipped, a bound off by one, a
/// charge forgotten) must fail some row of its algorithm.
#[test]
fn a_mutant_of_each_lua_algorithm_fails_the_table() {
    let mutants: [(Kind, &str, &str); 8] = [
        (
            Kind::FixedWindow,
            "if cost <= limit and used + cost <= limit then",
            "if cost <= limit and used + cost < limit then",
        ),
        (
            Kind::SlidingWindowLog,
            "while k < #e and e[k + 1] <= cut do",
            "while k < #e and e[k + 1] < cut do",
        ),
        (
            Kind::SlidingWindowLog,
            "local got = redis.call('ZRANGEBYSCORE', log, '-inf', string.format('%d', now - p[2]))",
            "local got = redis.call('ZRANGEBYSCORE', log, '-inf', string.format('%d', now - p[2] - 1))",
        ),
        (
            Kind::SlidingWindowCounter,
            "elseif st[1] + window == start then prev = st[3] end\n  -- Whole ticks",
            "elseif st[1] + window == start then prev = st[2] end\n  -- Whole ticks",
        ),
        (
            Kind::TokenBucket,
            "if need <= capacity then retry = ceil_div(level + need - capacity, rate) end",
            "if need <= capacity then retry = idiv(level + need - capacity, rate) end",
        ),
        (
            Kind::LeakyBucket,
            "local fits = level + need <= capacity",
            "local fits = level + need < capacity",
        ),
        (
            Kind::Gcra,
            "st[1] = math.min(start + cost * p[1], now + p[2])",
            "st[1] = start + cost * p[1]",
        ),
        (
            Kind::Concurrency,
            "redis.call('ZADD', st.log, string.format('%d', now + p[2]), member(st[2], cost))",
            "redis.call('ZADD', st.log, string.format('%d', now + p[2] - 1), member(st[2], cost))",
        ),
    ];
    for (kind, from, to) in mutants {
        let start = SCRIPT
            .find(&format!("-- algorithm {} (id", kind.name()))
            .expect("the algorithm's section");
        let end = start + SCRIPT[start..].find("-- end of ").expect("its end");
        let section = &SCRIPT[start..end];
        assert_eq!(
            section.matches(from).count(),
            1,
            "{kind}: the mutated line `{from}`"
        );
        let mutant = format!(
            "{}{}{}",
            &SCRIPT[..start],
            section.replace(from, to),
            &SCRIPT[end..]
        );
        let (n, failures) = lua_failures(&mutant, Some(kind));
        assert!(
            !failures.is_empty(),
            "{kind}: the mutant passed all {n} rows"
        );
    }
}

/// The rows that name one key several times in a call (`times=N`) fail a
/// script that decides each copy against the state before the call (the
/// merge in `lua/rule.lua` left out): both copies would be admitted where
/// only their sum is refused.
#[test]
fn a_script_deciding_copies_of_a_key_apart_fails_the_table() {
    let from = "        if first[j] == j and KEYS[2 * j - 1] == k then";
    assert_eq!(SCRIPT.matches(from).count(), 1, "the merge's line");
    let mutant = SCRIPT.replace(from, "        if false then");
    let (_, failures) = lua_failures(&mutant, None);
    let times: Vec<String> = rows()
        .iter()
        .filter(|r| r.op.contains("times="))
        .map(|r| format!("line {}:", r.line))
        .collect();
    assert!(!times.is_empty(), "no `times=` rows");
    assert!(
        !failures.is_empty()
            && failures
                .iter()
                .all(|f| times.iter().any(|t| f.starts_with(t))),
        "the mutant should fail the `times=` rows, and only them: {failures:?}"
    );
}

/// The charge an answer adds after its admission (`Settle::Charge`, mode
/// 10 of `lua/rule.lua`): a script that does not charge fails the table's
/// `charge` rows, and only them.
#[test]
fn a_script_that_does_not_charge_an_answers_cost_fails_the_table() {
    let from = "      if not r.a.holds_leases and cost > 0 then";
    assert_eq!(SCRIPT.matches(from).count(), 1, "the charge mode's line");
    let mutant = SCRIPT.replace(from, "      if false then");
    let (_, failures) = lua_failures(&mutant, None);
    let charges: Vec<String> = rows()
        .iter()
        .filter(|r| r.op.starts_with("charge"))
        .map(|r| format!("line {}:", r.line))
        .collect();
    assert!(charges.len() >= 8, "{charges:?}");
    assert!(
        !failures.is_empty()
            && failures
                .iter()
                .all(|f| charges.iter().any(|c| f.starts_with(c))),
        "the mutant should fail the `charge` rows, and only them: {failures:?}"
    );
}
