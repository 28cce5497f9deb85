//! Key names: `<prefix>{<group>}:s2:<rule id>:<key>`, and `:log` after it
//! for the op's zset. `s2` is the state's format (a string of six integers;
//! the first format, a hash, had no marker), so that gateways of the two
//! formats on one Redis never read each other's keys. The `{group}` hash tag (the client's identity by default)
//! puts all keys of one request on one cluster slot, while different
//! clients spread over the cluster; the rule id (a fingerprint of its name
//! and parameters) starts a changed rule afresh.

use crate::store::Op;

/// The state key and the zset key of `op`.
///
/// ```
/// # use std::time::Duration;
/// # use ratewarden::{Op, Rule};
/// let rule = Rule::builder("r").limit(1, Duration::from_secs(1)).build().unwrap();
/// let (k, log) = ratewarden::store::redis::keys::names("rw:", &Op::grouped(&rule, "k", "{a}"));
/// assert_eq!(k, format!("rw:{{_a_}}:s2:{:016x}:k", rule.id()));
/// assert_eq!(log, format!("{k}:log"));
/// ```
pub fn names(prefix: &str, op: &Op<'_>) -> (String, String) {
    // The group must not end the hash tag early or leave it empty (an
    // empty `{}` hashes the whole key, and the keys would scatter).
    let group: String = op
        .group
        .chars()
        .map(|c| if c == '{' || c == '}' { '_' } else { c })
        .collect();
    let group = if group.is_empty() { "_".into() } else { group };
    let base = format!("{prefix}{{{group}}}:s2:{:016x}:{}", op.rule.id(), op.key);
    let log = format!("{base}:log");
    (base, log)
}

/// A `SCAN ... MATCH` pattern for every key of the rule with id `rule_id`
/// (state and zset keys alike), whatever their group.
pub fn pattern(prefix: &str, rule_id: u64) -> String {
    let mut p = String::with_capacity(prefix.len() + 24);
    // The prefix is the operator's: its glob characters match themselves.
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            p.push('\\');
        }
        p.push(c);
    }
    p.push_str(&format!("{{*}}:s2:{rule_id:016x}:*"));
    p
}

/// The group and key a state name (the first of [`names`]) was made
/// from, if it is one for a rule with id `rule_id`. (A zset name parses
/// too, as a key ending in `:log`: tell them apart by type, as
/// [`RedisStore::scan`](super::RedisStore::scan) does.)
pub fn parse(prefix: &str, rule_id: u64, name: &str) -> Option<(String, String)> {
    let rest = name.strip_prefix(prefix)?.strip_prefix('{')?;
    // A group never holds `}` (`names` replaces it).
    let close = rest.find('}')?;
    let (group, rest) = (&rest[..close], &rest[close + 1..]);
    let key = rest.strip_prefix(format!(":s2:{rule_id:016x}:").as_str())?;
    Some((group.to_owned(), key.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Rule;
    use std::time::Duration;

    #[test]
    fn a_name_parses_back_to_its_group_and_key() {
        let rule = Rule::builder("r")
            .limit(1, Duration::from_secs(1))
            .build()
            .unwrap();
        for (group, key) in [
            ("a", "k"),
            ("10.0.0.1", "GET:10.0.0.1"),
            ("2001:db8::", "x:log"),
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
    fn the_pattern_escapes_the_prefix() {
        assert_eq!(
            pattern("a*[b]", 0xab),
            "a\\*\\[b\\]{*}:s2:00000000000000ab:*"
        );
    }
}
