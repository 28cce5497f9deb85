//! Key names: `<prefix>{<group>}:<rule id>:<key>`, and `:log` after it for
//! the op's zset. The `{group}` hash tag (the client's identity by default)
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
/// assert_eq!(k, format!("rw:{{_a_}}:{:016x}:k", rule.id()));
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
    let base = format!("{prefix}{{{group}}}:{:016x}:{}", op.rule.id(), op.key);
    let log = format!("{base}:log");
    (base, log)
}
