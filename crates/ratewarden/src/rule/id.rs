//! A rule's id: a fingerprint of its name and parameters that names its
//! state in stores, fixed for ever (a change renames every key in every
//! Redis).

use std::num::NonZeroU64;
use std::time::Duration;

use super::{Counting, RuleSpec};
use crate::clock::micros;

/// Every parameter of a rule as one string, in a fixed format: the input of
/// the rule's id, which names its keys in Redis, so it must not depend on the
/// build (as `derive(Hash)` or `Debug` output may).
pub(super) fn canonical(spec: &RuleSpec) -> String {
    let us = |d: Option<Duration>| d.map_or(-1, |d| micros(d).get() as i128);
    let (pd, pm, px, pmem) = spec.penalty.map_or((-1, 0, -1, -1), |p| {
        (
            us(Some(p.duration)),
            p.multiplier,
            us(Some(p.max)),
            us(Some(p.memory)),
        )
    });
    let counting = match spec.counting {
        Counting::All => "all",
        Counting::Failures {
            reset_on_success: true,
        } => "failures+reset",
        Counting::Failures {
            reset_on_success: false,
        } => "failures",
    };
    let mut id = format!(
        "v1|{}|{}|{}|{}|{}|{}|{}|{pd}|{pm}|{px}|{pmem}|{counting}|{}|{}|{}",
        spec.name,
        spec.algorithm,
        spec.limit,
        micros(spec.window).get(),
        spec.burst.map_or(0, NonZeroU64::get),
        us(spec.max_delay),
        us(spec.min_interval),
        spec.count_rejected,
        spec.cost,
        spec.shadow
    );
    // Parameters added after v1 are appended only where they apply, so
    // the ids of rules without them never change.
    if let Some(hold) = spec.max_hold {
        id.push_str(&format!("|hold={}", micros(hold).get()));
    }
    if let Some(c) = &spec.calendar {
        id.push_str(&format!("|cal={}", c.canonical()));
    }
    match &spec.variant {
        Some(super::Variant::Tier(t)) => id.push_str(&format!("|tier={t}")),
        Some(super::Variant::Override) => id.push_str("|override"),
        None => {}
    }
    id
}

/// 64-bit FNV-1a of `bytes`: tiny, and fixed forever (rule ids are made
/// of it); the one copy for every crate of the project.
///
/// ```
/// assert_eq!(ratewarden::fnv1a(*b""), 0xcbf2_9ce4_8422_2325);
/// assert_eq!(ratewarden::fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
/// ```
pub fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    bytes.into_iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rule::Rule;

    #[test]
    fn the_id_is_fixed_by_name_and_parameters_alone() {
        let a = Rule::builder("r")
            .limit(5, Duration::from_secs(60))
            .build()
            .unwrap();
        let b = Rule::builder("r")
            .limit(5, Duration::from_secs(60))
            .build()
            .unwrap();
        let c = Rule::builder("r")
            .limit(6, Duration::from_secs(60))
            .build()
            .unwrap();
        assert_eq!(a.id(), b.id());
        assert_ne!(a.id(), c.id());
        // Pinned: a change here renames every key in every Redis.
        assert_eq!(
            canonical(a.spec()),
            "v1|r|sliding_window_counter|5|60000000|0|-1|-1|-1|0|-1|-1|all|false|1|false"
        );
        assert_eq!(fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
    }
}
