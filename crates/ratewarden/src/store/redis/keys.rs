//! Key names: `<prefix>{<group>}:s4:<rule id>:<key>`, and `:log` after it
//! for the op's zset (`:lease` for a leased rule's slices). A key that
//! itself ends in `:log`, `:lease` or `:k` gets `:k`
//! after it in its state's name, so that no state name is another key's
//! zset name (`x:log`'s state would otherwise be `x`'s zset) and the names
//! stay one-to-one with the keys. `s4` is the state's format ([`FORMAT`]:
//! up to six packed doubles, a long sliding_window_log's state a member of
//! its zset; `s3` kept that state in the string beside the zset, `s2` was
//! six decimal integers, the first format, a hash, had no marker), so that
//! gateways of different formats on one Redis never read each other's
//! keys. The `{group}` hash tag (the client's identity by default)
//! puts all keys of one request on one cluster slot, while different
//! clients spread over the cluster; the rule id (a fingerprint of its name
//! and parameters) starts a changed rule afresh.

use crate::store::Op;

/// The state format's marker in every name: `s4`, states of packed
/// little-endian doubles (`lua/rule.lua`), a long sliding_window_log's in
/// its zset (`lua/sliding_window_log.lua`).
const FORMAT: &str = "s4";

/// The state key and the zset key of `op` (`rw:{_a_}:s4:<id>:k` and
/// that with `:log`, for group `{a}` and key `k`; see the tests).
pub(crate) fn names(prefix: &str, op: &Op<'_>) -> (String, String) {
    // The group must not end the hash tag early or leave it empty (an
    // empty `{}` hashes the whole key, and the keys would scatter).
    let group: String = op
        .group
        .chars()
        .map(|c| if c == '{' || c == '}' { '_' } else { c })
        .collect();
    let group = if group.is_empty() { "_".into() } else { group };
    let base = format!(
        "{prefix}{{{group}}}:{FORMAT}:{:016x}:{}",
        op.rule.id(),
        op.key
    );
    let log = format!("{base}:log");
    let state = if escaped(op.key) {
        format!("{base}{ESCAPE}")
    } else {
        base
    };
    (state, log)
}

/// The name of the hash of `op`'s leased slices ([`crate::store::lease`]):
/// the zset's name with `:lease` in place of `:log`, so in the same slot.
pub(crate) fn lease_name(prefix: &str, op: &Op<'_>) -> String {
    let (_, log) = names(prefix, op);
    format!("{}:lease", log.strip_suffix(":log").expect("a zset name"))
}

/// What a state name gets after a key that could be read as a zset name,
/// a lease hash's name, or an escaped key.
const ESCAPE: &str = ":k";

/// Whether `key`'s state name needs [`ESCAPE`]: a key ending as a zset
/// or lease hash name ends, or as an escaped name ends.
fn escaped(key: &str) -> bool {
    key.ends_with(":log") || key.ends_with(":lease") || key.ends_with(ESCAPE)
}

/// A `SCAN ... MATCH` pattern for every key of the rule with id `rule_id`
/// (state and zset keys alike), whatever their group.
pub(crate) fn pattern(prefix: &str, rule_id: u64) -> String {
    let mut p = String::with_capacity(prefix.len() + 24);
    // The prefix is the operator's: its glob characters match themselves.
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push_str(&format!("{{*}}:{FORMAT}:{rule_id:016x}:*"));
    p
}

/// The group and key a state name (the first of [`names`]) was made
/// from, if it is one for a rule with id `rule_id`. (A zset name parses
/// too, as a key ending in `:log`: tell them apart by type, as
/// [`RedisStore::scan`](super::RedisStore::scan) does.)
pub(crate) fn parse(prefix: &str, rule_id: u64, name: &str) -> Option<(String, String)> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('{')?;
    // A group never holds `}` (`names` replaces it).
    let close = rest.find('}')?;
    let (group, rest) = (&rest[..close], &rest[close + 1..]);
    let key = rest.strip_prefix(format!(":{FORMAT}:{rule_id:016x}:").as_str())?;
    let key = match key.strip_suffix(ESCAPE) {
        Some(k) if escaped(k) => k,
        _ => key,
    };
    Some((group.to_owned(), key.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_of_a_grouped_op() {
        let rule = crate::Rule::builder("r")
            .limit(1, std::time::Duration::from_secs(1))
            .build()
            .unwrap();
        let (k, log) = names("rw:", &Op::grouped(&rule, "k", "{a}"));
        assert_eq!(k, format!("rw:{{_a_}}:s4:{:016x}:k", rule.id()));
        assert_eq!(log, format!("{k}:log"));
    }
    use crate::Rule;
    use std::time::Duration;

    fn rule() -> Rule {
        Rule::builder("r")
            .limit(1, Duration::from_secs(1))
            .build()
            .unwrap()
    }

    #[test]
    fn a_name_parses_back_to_its_group_and_key() {
        let rule = rule();
        for (group, key) in [
            ("a", "k"),
            ("10.0.0.1", "GET:10.0.0.1"),
            ("2001:db8::", "x:log"),
            ("a", "x:k"),
            ("a", "x:log:k"),
            ("a", "x:k:k"),
            ("a", "x:lease"),
        ] {
            let (state, _) = names("rw:", &Op::grouped(&rule, key, group));
            assert_eq!(
                parse("rw:", rule.id(), &state),
                Some((group.into(), key.into()))
            );
        }
        // Another rule's names, another prefix: not this rule's.
        let (state, _) = names("rw:", &Op::grouped(&rule, "k", "a"));
        assert_eq!(parse("rw:", rule.id() ^ 1, &state), None);
        assert_eq!(parse("other:", rule.id(), &state), None);
    }

    #[test]
    fn no_state_name_is_another_keys_state_or_zset_name() {
        let rule = rule();
        // Keys built from a few pieces that end names: every state name
        // differs from every other name, zsets included.
        let pieces = ["", "x", ":log", ":k", ":lease", ":lo", "g", "k", ":"];
        let mut keys = vec![String::new()];
        for _ in 0..3 {
            let mut next = vec![];
            for k in &keys {
                for p in pieces {
                    next.push(format!("{k}{p}"));
                }
            }
            keys = next;
        }
        keys.sort();
        keys.dedup();
        let mut seen = std::collections::HashMap::new();
        for k in &keys {
            let op = Op::grouped(&rule, k, "g");
            let (state, log) = names("rw:", &op);
            let lease = lease_name("rw:", &op);
            for (name, what) in [(state.clone(), "state"), (log, "zset"), (lease, "lease")] {
                if let Some(other) = seen.insert(name.clone(), (k.clone(), what)) {
                    panic!("{name}: {what} of {k:?} and {other:?}");
                }
            }
            assert_eq!(
                parse("rw:", rule.id(), &state),
                Some(("g".into(), k.clone())),
                "{k:?}"
            );
        }
    }

    #[test]
    fn the_pattern_escapes_the_prefix() {
        assert_eq!(
            pattern("a*[b]", 0xab),
            "a\\*\\[b\\]{*}:s4:00000000000000ab:*"
        );
    }
}
