//! Runtime overrides of one key's limit (`PUT /v1/overrides/{rule}/{key}`):
//! what the admin API takes, and where they are kept.
//!
//! * On memory, in the process ([`ratewarden_tower::overrides::Overrides`]):
//!   they survive reloads; with `state_dir`, restarts too: the table is
//!   written whole to `state_dir/overrides.json` at each change (a new
//!   file renamed over the old, so a crash leaves one or the other, never
//!   half) and read at start. A JSON file, not an embedded database: the
//!   table is bounded by `overrides.max` and changes only when an operator
//!   changes it, so nothing more is needed, and nothing more is built.
//! * On Redis, in one hash beside the limits (`{prefix}{overrides}`, with a
//!   version counter): a change made through one gateway is in force on
//!   every gateway sharing the store at its next poll (every
//!   [`POLL`]), and they survive restarts. Each gateway decides from its
//!   own copy of the table: no request reads Redis for it.

use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::Duration;

use ratewarden::clock::Micros;
use ratewarden_tower::overrides::{Override, SetError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::parse_duration;
use crate::gateway::Gateway;
use ratewarden::store::Shared;

/// The shared table's name in Redis.
const TABLE: &str = "overrides";
/// How often a gateway asks the shared store whether the table changed.
pub(crate) const POLL: Duration = Duration::from_millis(250);

/// A `PUT` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Body {
    limit: Option<u64>,
    window: Option<String>,
    burst: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    /// A duration from now (`30d`).
    expires_in: Option<String>,
    /// An RFC 3339 time.
    expires_at: Option<String>,
    note: Option<String>,
}

/// An override as the shared store keeps it.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    #[serde(skip_serializing_if = "Option::is_none")]
    limit: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    window_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    burst: Option<u64>,
    #[serde(default)]
    unlimited: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_us: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
}

impl From<&Override> for Stored {
    fn from(o: &Override) -> Self {
        Self {
            limit: o.limit.map(NonZeroU64::get),
            window_us: o.window.map(|w| w.as_micros() as u64),
            burst: o.burst.map(NonZeroU64::get),
            unlimited: o.unlimited,
            expires_at_us: o.expires_at.map(Micros::get),
            note: o.note.clone(),
        }
    }
}

impl From<Stored> for Override {
    fn from(s: Stored) -> Self {
        Self {
            limit: s.limit.and_then(NonZeroU64::new),
            window: s.window_us.map(Duration::from_micros),
            burst: s.burst.and_then(NonZeroU64::new),
            unlimited: s.unlimited,
            expires_at: s.expires_at_us.map(Micros::new),
            note: s.note,
        }
    }
}

fn encode(o: &Override) -> String {
    serde_json::to_string(&Stored::from(o)).unwrap_or_default()
}

fn decode(text: &str) -> Option<Override> {
    serde_json::from_str::<Stored>(text)
        .ok()
        .map(Override::from)
}

/// A table's `(field, override)` pairs as the entries
/// [`ratewarden_tower::overrides::Overrides::replace`] takes; one that
/// cannot be read (in `whence`) is left out and said.
fn entries(
    fields: impl IntoIterator<Item = (String, Option<Override>)>,
    whence: &str,
) -> Vec<(String, String, Override)> {
    let mut entries = vec![];
    for (f, o) in fields {
        match (f.split_once('\n'), o) {
            (Some((rule, key)), Some(o)) => entries.push((rule.to_owned(), key.to_owned(), o)),
            _ => tracing::warn!("an override in {whence} that this gateway cannot read: left out"),
        }
    }
    entries
}

/// The shared table's field of `key` of `rule`: the rule's name (printable
/// ASCII, no newline), a newline, the key.
fn field(rule: &str, key: &str) -> String {
    format!("{rule}\n{key}")
}

/// The longest note kept.
const MAX_NOTE: usize = 512;

/// A `PUT` body as an override, at time `now`; `Err` says what is wrong.
pub(crate) fn from_body(b: Body, now: Micros) -> Result<Override, String> {
    let nonzero = |n: Option<u64>, key: &str| match n {
        None => Ok(None),
        Some(v) => NonZeroU64::new(v)
            .map(Some)
            .ok_or_else(|| format!("`{key}` must be at least 1")),
    };
    let limit = nonzero(b.limit, "limit")?;
    let burst = nonzero(b.burst, "burst")?;
    let window = match &b.window {
        None => None,
        Some(w) => match parse_duration(w)? {
            d if d.is_zero() => return Err("`window` must be longer than zero".into()),
            d => Some(d),
        },
    };
    if !b.unlimited && limit.is_none() && window.is_none() && burst.is_none() {
        return Err("an override sets `limit`, `window` or `burst`, or `unlimited: true`".into());
    }
    if b.unlimited && (limit.is_some() || window.is_some() || burst.is_some()) {
        return Err("`unlimited: true` takes no `limit`, `window` or `burst`".into());
    }
    let expires_at = match (&b.expires_in, &b.expires_at) {
        (Some(_), Some(_)) => return Err("give `expires_in` or `expires_at`, not both".into()),
        (Some(d), None) => Some(now.saturating_add(Micros::from(parse_duration(d)?))),
        (None, Some(t)) => {
            let ts: jiff_time::Timestamp = t
                .parse()
                .map_err(|_| format!("`expires_at` {t:?} is not an RFC 3339 time"))?;
            let us = ts.as_microsecond();
            if us <= now.get() as i64 {
                return Err("`expires_at` is in the past".into());
            }
            Some(Micros::new(us as u64))
        }
        (None, None) => None,
    };
    let note = b.note.map(|n| n.chars().take(MAX_NOTE).collect());
    Ok(Override {
        limit,
        window,
        burst,
        unlimited: b.unlimited,
        expires_at,
        note,
    })
}

// jiff parses RFC 3339 (the core crate already depends on it for
// calendar windows).
use ratewarden::calendar::jiff as jiff_time;

/// An override as the admin API shows it.
pub(crate) fn to_json(rule: &str, key: &str, o: &Override, now: Micros) -> Value {
    let mut v = json!({"rule": rule, "key": key});
    if o.unlimited {
        v["unlimited"] = json!(true);
    }
    if let Some(l) = o.limit {
        v["limit"] = json!(l.get());
    }
    if let Some(w) = o.window {
        v["window"] = json!(w.as_secs_f64());
    }
    if let Some(b) = o.burst {
        v["burst"] = json!(b.get());
    }
    if let Some(at) = o.expires_at {
        let ts = jiff_time::Timestamp::from_microsecond(at.get() as i64).ok();
        v["expires_at"] = json!(ts.map(|t| t.to_string()));
        v["expires_in"] = json!(at.saturating_sub(now).get() as f64 / 1e6);
    }
    if let Some(n) = &o.note {
        v["note"] = json!(n);
    }
    v
}

/// Why a change was not made.
#[derive(Debug)]
pub(crate) enum ChangeError {
    /// Refused: the bound, or parameters that do not make a rule (400/409).
    Set(SetError),
    /// The shared store could not be written (503).
    Store(ratewarden::StoreError),
}

impl std::fmt::Display for ChangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ChangeError::Set(s) => s.fmt(f),
            ChangeError::Store(s) => s.fmt(f),
        }
    }
}

/// Sets `key`'s override of `rule` (a rule of the live policy): in the
/// shared store first where there is one (so that a gateway that fails to
/// write it does not apply it alone), then here.
pub(crate) async fn set(
    gw: &Gateway,
    rule: &str,
    key: &str,
    o: Override,
) -> Result<(), ChangeError> {
    let live = gw.live();
    let table = &gw.overrides;
    let Some(r) = live.config.policy.rule(rule) else {
        return Err(ChangeError::Set(SetError::Invalid(format!(
            "no rule named `{rule}`"
        ))));
    };
    // The parameters and the bound, checked here first.
    o.compile(&r.rule)
        .map_err(|e| ChangeError::Set(SetError::Invalid(format!("{e} ({})", e.key()))))?;
    let store = live.limiter.store();
    if store.is_shared() {
        let stored = store
            .table_put(TABLE, &field(rule, key), &encode(&o), table.max())
            .await
            .map_err(ChangeError::Store)?;
        if !stored {
            return Err(ChangeError::Set(SetError::Full(table.max())));
        }
    }
    table.set(&r.rule, key, o).map_err(ChangeError::Set)?;
    save(gw).await;
    Ok(())
}

/// The file a gateway on memory keeps its overrides in, under `state_dir`.
const FILE: &str = "overrides.json";

/// Writes this gateway's table to `state_dir` (memory store only; the
/// shared store keeps its own): a new file renamed over the old. A failure
/// is logged: the override is in force, and kept until the restart.
async fn save(gw: &Gateway) {
    let live = gw.live();
    let shared = live.limiter.store().is_shared();
    let table = || -> std::collections::BTreeMap<String, Stored> {
        gw.overrides
            .list(None)
            .iter()
            .map(|(rule, key, o)| (field(rule, key), Stored::from(o)))
            .collect()
    };
    crate::store::save_state(
        live.config.state_dir.clone(),
        shared,
        FILE,
        "overrides",
        table,
    )
    .await;
}

/// Reads the overrides `state_dir` kept (memory store only), at start: in
/// force from the first request. One that no longer names a rule of the
/// config, or that cannot be read, is left out and said.
pub(crate) fn restore(gw: &Gateway) {
    let live = gw.live();
    let dir = live.config.state_dir.as_deref();
    let shared = live.limiter.store().is_shared();
    let Some(table) = crate::store::read_state(dir, shared, FILE, "overrides") else {
        return;
    };
    let path = dir.map(|d| d.join(FILE)).unwrap_or_default();
    let read = table.into_iter().map(|(f, v)| {
        let o = serde_json::from_value::<Stored>(v).ok().map(Override::from);
        (f, o)
    });
    let entries = entries(read, "state_dir");
    let n = entries.len();
    let policy = &live.config.policy;
    gw.overrides
        .replace(entries, |name| policy.rule(name).map(|r| &r.rule));
    tracing::info!(overrides = n, file = %path.display(), "overrides restored from state_dir");
}

/// Removes `key`'s override of `rule`; whether there was one.
pub(crate) async fn remove(gw: &Gateway, rule: &str, key: &str) -> Result<bool, ChangeError> {
    let live = gw.live();
    let mut existed = false;
    let store = live.limiter.store();
    if store.is_shared() {
        existed = store
            .table_delete(TABLE, &field(rule, key))
            .await
            .map_err(ChangeError::Store)?;
    }
    let removed = gw.overrides.remove(rule, key);
    if removed {
        save(gw).await;
    }
    Ok(removed || existed)
}

/// Keeps this gateway's table the shared store's: every [`POLL`], one GET
/// of the table's version, and the whole table read again when it moved.
/// Expired overrides are swept here too (on memory, the only place).
pub(crate) struct Sync(crate::store::TableFollower);

impl Sync {
    /// Not yet read.
    pub(crate) fn new() -> Self {
        Self(crate::store::TableFollower::new(TABLE))
    }

    /// One poll. A store error leaves the table as it was (logged once
    /// per failure run by the store's own outage lines).
    pub(crate) async fn poll(&mut self, gw: &Arc<Gateway>) {
        gw.overrides.sweep();
        let live = gw.live();
        // `overrides: {max: 0}`: none may be set, and the store is not asked.
        if live.config.overrides_max == 0 && gw.overrides.is_empty() {
            return;
        }
        let Some((v, fields)) = self.0.changed(live.limiter.store()).await else {
            return;
        };
        let read = fields.into_iter().map(|(f, text)| {
            let o = decode(&text);
            (f, o)
        });
        let entries = entries(read, "redis");
        let n = entries.len();
        let policy = &live.config.policy;
        gw.overrides
            .replace(entries, |name| policy.rule(name).map(|r| &r.rule));
        if self.0.read_once() {
            tracing::info!(
                overrides = n,
                version = v,
                "overrides changed in redis: table read again"
            );
        }
        self.0.read(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(text: &str) -> Body {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn a_body_becomes_an_override_and_round_trips_through_the_store() {
        let now = Micros::from_secs(1_000);
        let o = from_body(
            body(r#"{"limit": 1000, "window": "1m", "burst": 2000, "expires_in": "30d", "note": "ticket 4711"}"#),
            now,
        )
        .unwrap();
        assert_eq!(o.limit.unwrap().get(), 1000);
        assert_eq!(o.window, Some(Duration::from_secs(60)));
        assert_eq!(o.expires_at, Some(Micros::from_secs(1_000 + 30 * 86_400)));
        assert_eq!(decode(&encode(&o)), Some(o));
        let at = from_body(
            body(r#"{"unlimited": true, "expires_at": "2030-01-01T00:00:00Z"}"#),
            now,
        )
        .unwrap();
        assert_eq!(at.expires_at, Some(Micros::from_secs(1_893_456_000)));
    }

    #[test]
    fn bodies_that_say_nothing_or_contradict_themselves_are_refused() {
        let now = Micros::from_secs(2_000_000_000);
        for (text, says) in [
            (r#"{}"#, "sets `limit`"),
            (r#"{"limit": 0}"#, "at least 1"),
            (r#"{"unlimited": true, "limit": 3}"#, "takes no"),
            (r#"{"limit": 3, "window": "5"}"#, "no unit"),
            (
                r#"{"limit": 3, "expires_in": "1d", "expires_at": "2030-01-01T00:00:00Z"}"#,
                "not both",
            ),
            (
                r#"{"limit": 3, "expires_at": "2030-01-01T00:00:00Z"}"#,
                "in the past",
            ),
            (r#"{"limit": 3, "expires_at": "tomorrow"}"#, "RFC 3339"),
        ] {
            let e = from_body(body(text), now).unwrap_err();
            assert!(e.contains(says), "{text}: {e}");
        }
        assert!(serde_json::from_str::<Body>(r#"{"limt": 3}"#).is_err());
    }

    #[test]
    fn a_key_with_a_newline_is_still_its_own_field() {
        let f = field("api", "a\nb");
        assert_eq!(f.split_once('\n'), Some(("api", "a\nb")));
    }
}
