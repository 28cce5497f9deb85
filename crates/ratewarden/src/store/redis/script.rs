//! The script and its contract: assembled at build time from `lua/`, the
//! ARGV a call sends (see `lua/prelude.lua` for the whole contract), and
//! the reply read back.

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
}

/// Values per op in ARGV.
pub const FIELDS: usize = 16;
/// Values per op in an apply or peek reply.
pub const REPLY: usize = 7;

/// One op of a call: the op, its cost, and the lease to release (0: none).
pub type Call<'a> = (Op<'a>, u64, u64);

/// The ARGV of a call of `ops`, at `now` (0: Redis's `TIME`).
pub fn argv(ops: &[Call<'_>], mode: Mode, now: Micros) -> Vec<i64> {
    let mut out = Vec::with_capacity(3 + ops.len() * FIELDS);
    let n = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
    out.extend([mode as i64, ops.len() as i64, n(now.get())]);
    for (op, cost, lease) in ops {
        let spec = op.rule.spec();
        let (kind, p) = op.rule.params().script_params();
        out.push(i64::from(kind));
        // u64::MAX marks "none" (leaky bucket reject mode): -1.
        out.extend(p.map(|v| if v == u64::MAX { -1 } else { n(v) }));
        out.push(n(spec.min_interval.map_or(0, |d| micros(d).get())));
        match &spec.penalty {
            Some(pen) => out.extend([
                n(micros(pen.duration).get()),
                i64::from(pen.multiplier),
                n(micros(pen.max).get()),
                n(micros(pen.memory).get()),
            ]),
            None => out.extend([0, 1, 0, 0]),
        }
        let (failures, reset) = match spec.counting {
            Counting::All => (0, 0),
            Counting::Failures { reset_on_success } => (1, i64::from(reset_on_success)),
        };
        out.extend([
            failures,
            reset,
            i64::from(spec.count_rejected),
            i64::from(spec.shadow),
            n(*cost),
            n(*lease),
        ]);
    }
    debug_assert_eq!(out.len(), 3 + ops.len() * FIELDS);
    out
}

/// The verdicts of an apply or peek reply for `n` ops.
pub fn verdicts(raw: &[i64], n: usize) -> Result<Vec<Verdict>, String> {
    if raw.len() != n * REPLY {
        return Err(format!("script returned {} values for {n} ops", raw.len()));
    }
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
        assert!(SCRIPT.contains("local FIELDS = 16"));
        assert!(SCRIPT.contains("return redis.error_reply('ratewarden: unknown mode')"));
        assert!(SCRIPT.ends_with("\nreturn dispatch()\n"));
        let (library, name) = library();
        assert!(library.starts_with(&format!("#!lua name={name}\n")));
        assert!(library.contains(&format!("redis.register_function('{name}',")));
    }
}
