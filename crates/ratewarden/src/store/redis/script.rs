//! The script and its contract: assembled at build time from `lua/`, the
//! ARGV a call sends (see `lua/prelude.lua` for the whole contract), and
//! the reply read back. Not a stable API: public (and hidden from the
//! docs) only for the case table, which runs the script itself.

use crate::algorithm::{Check, NEVER};
use crate::clock::{Micros, micros};
use crate::rule::{Counting, Reason, Verdict};
use crate::store::Op;

/// Builds the script: the prelude, then each algorithm of the table as
/// `algo[<id>]`, between markers that name it, then the rule layer.
macro_rules! assemble {
    ($($variant:ident $module:ident $id:literal $($boxed:ident)?),* $(,)?) => {
        concat!(
            include_str!("lua/prelude.lua"),
            $(
                "\n-- algorithm ", stringify!($module), " (id ", $id, ")\n",
                "algo[", $id, "] = (function()\n",
                include_str!(concat!("lua/", stringify!($module), ".lua")),
                "end)()\n",
                "-- end of ", stringify!($module), "\n",
            )*
            "\n",
            include_str!("lua/rule.lua"),
            "\nreturn dispatch()\n",
        )
    };
}

/// The whole script, as sent to `EVAL` / `EVALSHA`: the prelude, the
/// algorithms, the rule layer and `dispatch`, then one dispatch of the
/// call's `KEYS` and `ARGV` (globals there).
pub const SCRIPT: &str = crate::algorithm::table!(assemble);

/// The same code as a Redis Functions library, named for its content
/// (`rw_` and the first 16 hex digits of the script's SHA-1): loaded once
/// (`FUNCTION LOAD`), its functions and tables are built once per load
/// instead of once per call. Gateways of different versions on one Redis
/// each load their own. Returns the library and its function's name.
pub fn library() -> (String, String) {
    let sha = redis::Script::new(SCRIPT).get_hash().to_owned();
    let name = format!("rw_{}", &sha[..16]);
    let body = SCRIPT
        .strip_suffix("\nreturn dispatch()\n")
        .expect("the script ends with its dispatch");
    let library = format!(
        "#!lua name={name}\nlocal KEYS, ARGV\n{body}\nredis.register_function('{name}', function(keys, argv)\n  KEYS, ARGV = keys, argv\n  return dispatch()\nend)\n"
    );
    (library, name)
}

/// What a call does (`ARGV[1]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Decide and record.
    Apply = 0,
    /// Decide, record nothing.
    Peek = 1,
    /// Charge the `count: failures` ops.
    Failure = 2,
    /// Clear the `count: failures` ops' history (`reset_on_success`).
    Success = 3,
    /// The first op's state.
    Inspect = 4,
    /// Give back each op's lease.
    Release = 5,
    /// Give back each op's cost (an Envoy refund).
    Refund = 6,
    /// Lease a slice of the first op's key ([`crate::store::lease`]).
    Grant = 7,
    /// Ban each op's key for its `cost`, in µs, at least (the admin API).
    Ban = 8,
    /// Renew each op's lease (its request still going).
    Renew = 9,
    /// Charge each op's cost more (an answer that cost more than its
    /// admission charged).
    Charge = 10,
}

/// Values per op in ARGV: the rule's spec (one string), the cost, the
/// lease.
pub const FIELDS: usize = 3;
/// Integers in a rule's spec.
pub const SPEC: usize = 14;
/// Values per op in an apply or peek reply.
pub const REPLY: usize = 7;

/// One op of a call: the op, its cost, and the lease to release (0: none).
pub type Call<'a> = (Op<'a>, u64, u64);

/// A rule's spec as the script takes it: 14 integers joined by commas
/// (one ARGV string: Redis makes a string per ARGV value, and fourteen
/// cost it more than one; the script parses a spec once per library load).
pub fn spec(rule: &crate::Rule) -> String {
    spec_with(rule, None)
}

/// The spec a call at gateway time `local` sends: the rule's own, made
/// once, or for a calendar window one with the bounds of the periods
/// around `local` (`FixedWindow::script_bounds`).
pub fn spec_at(rule: &crate::Rule, local: Micros) -> std::borrow::Cow<'_, str> {
    if let crate::algorithm::Params::FixedWindow(fw) = rule.params()
        && let Some(bounds) = fw.script_bounds(local)
    {
        return spec_with(rule, Some(bounds)).into();
    }
    rule.script_spec(|| spec(rule)).into()
}

fn spec_with(rule: &crate::Rule, bounds: Option<[u64; 4]>) -> String {
    let spec = rule.spec();
    let (kind, mut p) = rule.params().script_params();
    if let Some(b) = bounds {
        p = b;
    }
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    let mut v: [i64; SPEC] = [0; SPEC];
    v[0] = i64::from(kind);
    // u64::MAX marks "none" (leaky bucket reject mode): -1.
    for (slot, p) in v[1..5].iter_mut().zip(p) {
        *slot = if p == u64::MAX { -1 } else { n(p) };
    }
    v[5] = n(spec.min_interval.map_or(0, |d| micros(d).get()));
    (v[6], v[7], v[8], v[9]) = match &spec.penalty {
        Some(pen) => (
            n(micros(pen.duration).get()),
            i64::from(pen.multiplier),
            n(micros(pen.max).get()),
            n(micros(pen.memory).get()),
        ),
        None => (0, 1, 0, 0),
    };
    (v[10], v[11]) = match spec.counting {
        Counting::All => (0, 0),
        Counting::Failures { reset_on_success } => (1, i64::from(reset_on_success)),
    };
    v[12] = i64::from(spec.count_rejected);
    v[13] = i64::from(spec.shadow);
    let mut out = String::with_capacity(64);
    let mut buf = itoa::Buffer::new();
    for (i, x) in v.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(buf.format(*x));
    }
    out
}

/// The ARGV of a call of `ops`, at `now` (0: Redis's `TIME`); `local` is
/// the gateway's time (calendar windows' bounds, [`spec_at`]).
pub fn argv(ops: &[Call<'_>], mode: Mode, now: Micros, local: Micros) -> Vec<String> {
    let mut out = Vec::with_capacity(3 + ops.len() * FIELDS);
    let mut buf = itoa::Buffer::new();
    let mut n = |v: u64| buf.format(v).to_owned();
    out.push((mode as u8).to_string());
    out.push(n(ops.len() as u64));
    out.push(n(now.get()));
    for (op, cost, lease) in ops {
        out.push(spec_at(op.rule, local).into_owned());
        out.push(n(*cost));
        out.push(n(*lease));
    }
    debug_assert_eq!(out.len(), 3 + ops.len() * FIELDS);
    out
}

/// The integers of a reply packed as little-endian doubles, 8 bytes each,
/// `n` ops of [`REPLY`] values.
fn integers(reply: &[u8], n: usize) -> Result<Vec<i64>, String> {
    if !reply.len().is_multiple_of(8) {
        return Err(format!("script returned {} bytes", reply.len()));
    }
    let raw: Vec<i64> = reply
        .chunks_exact(8)
        .map(|b| {
            let mut w = [0; 8];
            w.copy_from_slice(b);
            // Integers below 2^53: exact as doubles.
            f64::from_le_bytes(w) as i64
        })
        .collect();
    if raw.len() != n * REPLY {
        return Err(format!("script returned {} values for {n} ops", raw.len()));
    }
    Ok(raw)
}

/// The ARGV a grant adds after its op's.
pub fn grant_argv(rule: &crate::Rule, ask: &crate::store::lease::Ask) -> [String; 8] {
    [
        ask.holder.to_string(),
        ask.want.to_string(),
        ask.need.to_string(),
        ask.held.to_string(),
        ask.returned.to_string(),
        ask.lifetime.get().to_string(),
        ask.cap.to_string(),
        u8::from(crate::store::lease::gives_back(rule)).to_string(),
    ]
}

/// A grant's reply (see `grant` in `lua/rule.lua`).
pub fn grant(reply: &[u8]) -> Result<crate::store::lease::Grant, String> {
    use crate::store::lease::Grant;
    let raw = integers(reply, 1)?;
    let mut v = verdicts(reply, 1)?.remove(0);
    Ok(match raw[1] {
        0 => {
            v.lease = None;
            Grant::Granted {
                units: u64::try_from(raw[6]).unwrap_or(0),
                verdict: v,
            }
        }
        1 => {
            v.lease = None;
            Grant::Refused(v)
        }
        4 => Grant::Full,
        5 => Grant::Returned,
        other => return Err(format!("grant answered {other}")),
    })
}

/// Whether `rule`'s algorithm keeps a zset beside its state (its log, or
/// its leases): a compact call names it only then.
pub fn keeps_zset(rule: &crate::Rule) -> bool {
    matches!(
        rule.spec().algorithm,
        crate::algorithm::Kind::SlidingWindowLog | crate::algorithm::Kind::Concurrency
    )
}

/// The ARGV of the common call, compact: one op applied, at `now` (0:
/// Redis's `TIME`, and then left out): `a`, the rule's spec, the cost.
/// Its KEYS are the state, and the zset where [`keeps_zset`].
pub fn argv_one(op: &Op<'_>, cost: u64, now: Micros, local: Micros) -> Vec<String> {
    let mut out = Vec::with_capacity(4);
    out.push("a".to_owned());
    out.push(spec_at(op.rule, local).into_owned());
    out.push(cost.to_string());
    if now > Micros::ZERO {
        out.push(now.get().to_string());
    }
    out
}

/// The verdicts of an apply or peek call's reply for `n` ops: packed
/// ([`verdicts`]), or, for one op admitted with no delay and no lease,
/// one integer, remaining x 2^32 + reset_after (`one` in `lua/rule.lua`:
/// an integer reply is cheaper for Redis).
pub fn reply(reply: &redis::Value, n: usize) -> Result<Vec<Verdict>, String> {
    match reply {
        redis::Value::BulkString(bytes) => verdicts(bytes, n),
        redis::Value::Int(i) if n == 1 && *i >= 0 => Ok(vec![Verdict {
            check: Check {
                allowed: true,
                remaining: (*i as u64) >> 32,
                reset_after: Micros::new((*i as u64) & 0xffff_ffff),
                retry_after: Micros::ZERO,
                delay: Micros::ZERO,
            },
            reason: None,
            lease: None,
        }]),
        other => Err(format!("script answered {other:?} for {n} ops")),
    }
}

/// The verdicts of an apply or peek reply packed (its integers as
/// little-endian doubles, 8 bytes each) for `n` ops.
pub fn verdicts(reply: &[u8], n: usize) -> Result<Vec<Verdict>, String> {
    let raw = integers(reply, n)?;
    let u = |v: i64| u64::try_from(v).unwrap_or(0);
    let us = |v: i64| Micros::new(u(v));
    Ok(raw
        .chunks(REPLY)
        .map(|c| Verdict {
            check: Check {
                allowed: c[0] == 1,
                remaining: u(c[2]),
                reset_after: us(c[3]),
                retry_after: if c[4] < 0 { NEVER } else { us(c[4]) },
                delay: us(c[5]),
            },
            reason: match c[1] {
                0 => None,
                2 => Some(Reason::Banned),
                3 => Some(Reason::MinInterval),
                _ => Some(Reason::Limit),
            },
            lease: (c[6] > 0).then(|| u(c[6])),
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reply_reads_as_the_script_packs_it() {
        // What struct.pack('<ddddddd', ...) makes of one op's reply:
        // refused by a ban, 2^53 - 1 remaining, retry never, a lease.
        let values = [
            0.0,
            2.0,
            9_007_199_254_740_991.0,
            1_500_000.0,
            -1.0,
            0.0,
            7.0,
        ];
        let bytes: Vec<u8> = values.iter().flat_map(|v: &f64| v.to_le_bytes()).collect();
        let v = verdicts(&bytes, 1).unwrap();
        assert!(!v[0].check.allowed);
        assert_eq!(v[0].reason, Some(Reason::Banned));
        assert_eq!(v[0].check.remaining, 9_007_199_254_740_991);
        assert_eq!(v[0].check.reset_after, Micros::new(1_500_000));
        assert_eq!(v[0].check.retry_after, NEVER);
        assert_eq!(v[0].lease, Some(7));
        assert!(verdicts(&bytes, 2).is_err());
        assert!(verdicts(&bytes[..55], 1).is_err());
    }

    #[test]
    fn an_admitted_reply_reads_from_one_integer() {
        let v = reply(&redis::Value::Int((999_999 << 32) + 1_000_001), 1).unwrap();
        assert!(v[0].check.allowed);
        assert_eq!(v[0].reason, None);
        assert_eq!(v[0].check.remaining, 999_999);
        assert_eq!(v[0].check.reset_after, Micros::new(1_000_001));
        assert_eq!(v[0].check.retry_after, Micros::ZERO);
        assert_eq!(v[0].check.delay, Micros::ZERO);
        assert_eq!(v[0].lease, None);
        // Only one op's answer comes as an integer; never a negative one.
        assert!(reply(&redis::Value::Int(5), 2).is_err());
        assert!(reply(&redis::Value::Int(-1), 1).is_err());
        assert!(reply(&redis::Value::Nil, 1).is_err());
        let packed = [1.0f64, 0.0, 3.0, 4.0, 0.0, 0.0, 0.0];
        let bytes: Vec<u8> = packed.iter().flat_map(|v| v.to_le_bytes()).collect();
        let v = reply(&redis::Value::BulkString(bytes), 1).unwrap();
        assert_eq!(
            (v[0].check.remaining, v[0].check.reset_after),
            (3, Micros::new(4))
        );
    }

    #[test]
    fn every_algorithm_of_the_table_is_in_the_script() {
        for k in crate::algorithm::Kind::ALL {
            let marker = format!(
                "-- algorithm {} (id {})\nalgo[{}] =",
                k.name(),
                k.id(),
                k.id()
            );
            assert!(SCRIPT.contains(&marker), "{marker}");
        }
        assert!(SCRIPT.starts_with("-- ratewarden"));
        assert!(SCRIPT.contains("local FIELDS = 3"));
        assert!(SCRIPT.contains("return redis.error_reply('ratewarden: unknown mode')"));
        assert!(SCRIPT.ends_with("\nreturn dispatch()\n"));
        let (library, name) = library();
        assert!(library.starts_with(&format!("#!lua name={name}\n")));
        assert!(library.contains(&format!("redis.register_function('{name}',")));
    }
}
