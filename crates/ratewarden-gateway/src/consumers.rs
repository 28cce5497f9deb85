//! Consumers (`/v1/consumers`): an API key that belongs to someone, on a
//! tier. What the admin API takes, and where consumers are kept.
//!
//! * A key is kept only as its HMAC under `key_secret` (the hash hashed
//!   key parts use): a generated key is shown once, in the answer that
//!   made it, and nowhere after.
//! * On memory, in the process ([`ratewarden_tower::consumers::Consumers`]);
//!   with `state_dir`, across restarts: the table is written whole to
//!   `state_dir/consumers.json` at each change (a new file, synced, renamed
//!   over the old; see [`crate::store::write_state`]) and read at start. A
//!   JSON file and no embedded database: changes are an operator's, a few
//!   a minute at most, and the table is bounded by `consumers.max`
//!   (100,000 at about 250 bytes each is a 25 MB file written in tens of
//!   milliseconds, off the request path); a database would add a
//!   dependency and its build time for nothing a request needs.
//! * On Redis, in one hash beside the limits (`{prefix}{consumers}`, one
//!   field per name, with a version counter), as overrides are: a change
//!   made through one gateway is in force on every gateway sharing the
//!   store at its next poll (every [`crate::overrides::POLL`], 250 ms). A
//!   revoked key is refused everywhere within that. Each gateway looks keys
//!   up in its own copy: no request reads Redis for them.
//! * `consumers.file` names consumers in the config: read at each load,
//!   never changed through the admin API.

use std::sync::Arc;

use ratewarden::clock::Micros;
use ratewarden_tower::consumers::{AddError, Consumer};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::config::parse_duration;
use crate::gateway::Gateway;
use ratewarden::store::Shared;

/// The shared table's name in Redis.
const TABLE: &str = "consumers";
/// The file a gateway on memory keeps its consumers in, under `state_dir`.
const FILE: &str = "consumers.json";
/// The longest metadata kept, as JSON text.
const MAX_METADATA: usize = 4096;

/// A `POST /v1/consumers` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NewBody {
    name: String,
    tier: Option<String>,
    metadata: Option<Value>,
    /// A duration from now (`90d`).
    expires_in: Option<String>,
    /// An existing key to import (else one is made).
    key: Option<String>,
}

impl NewBody {
    /// Whether it imports a key (the answer then shows none).
    pub(crate) fn imports(&self) -> bool {
        self.key.is_some()
    }
}

/// A `PUT /v1/consumers/{name}` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ChangeBody {
    tier: Option<String>,
    metadata: Option<Value>,
}

/// A consumer as the shared store and `state_dir` keep it.
#[derive(Debug, Serialize, Deserialize)]
struct Stored {
    key_hash: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    tier: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    expires_at_us: Option<u64>,
    #[serde(default)]
    created_at_us: u64,
}

impl Stored {
    fn of(c: &Consumer) -> Self {
        Self {
            key_hash: c.key_hash.clone(),
            tier: c.tier.clone(),
            metadata: c.metadata.clone(),
            expires_at_us: c.expires_at.map(Micros::get),
            created_at_us: c.created_at.get(),
        }
    }

    fn into_consumer(self, name: String) -> Consumer {
        Consumer {
            name,
            key_hash: self.key_hash,
            tier: self.tier,
            metadata: self.metadata,
            expires_at: self.expires_at_us.map(Micros::new),
            created_at: Micros::new(self.created_at_us),
        }
    }
}

/// `(name, stored text)` pairs as consumers; one that cannot be read (in
/// `whence`) is left out and said.
fn read_all(fields: Vec<(String, String)>, whence: &str) -> Vec<Consumer> {
    let mut out = Vec::with_capacity(fields.len());
    for (name, text) in fields {
        match serde_json::from_str::<Stored>(&text) {
            Ok(s) => out.push(s.into_consumer(name)),
            Err(_) => tracing::warn!(
                consumer = name,
                "a consumer in {whence} that this gateway cannot read: left out"
            ),
        }
    }
    out
}

/// Why a change was not made, as the admin API answers it.
#[derive(Debug)]
pub(crate) enum Error {
    /// The request is wrong (400).
    Invalid(String),
    /// No such consumer (404).
    NotFound(String),
    /// The name or key is taken, the bound reached, or the consumer is
    /// the config's (409).
    Conflict(String),
    /// The shared store could not be written (503).
    Store(ratewarden::StoreError),
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Invalid(m) | Error::NotFound(m) | Error::Conflict(m) => f.write_str(m),
            Error::Store(e) => e.fmt(f),
        }
    }
}

impl From<AddError> for Error {
    fn from(e: AddError) -> Self {
        Error::Conflict(e.to_string())
    }
}

/// The tiers a consumer may be on: those of the rules whose tiers come
/// from the consumer (empty: any).
fn known_tiers(gw: &Gateway) -> Vec<String> {
    let live = gw.live();
    let mut tiers: Vec<String> = live
        .config
        .policy
        .rules
        .iter()
        .filter_map(|r| r.tiers.as_ref())
        .filter(|t| t.from == ratewarden_tower::policy::KeyPart::ConsumerTier)
        .flat_map(|t| t.values.iter().map(|v| v.name.clone()))
        .collect();
    tiers.sort();
    tiers.dedup();
    tiers
}

fn check_tier(gw: &Gateway, tier: &Option<String>) -> Result<(), Error> {
    let Some(t) = tier else {
        return Ok(());
    };
    let known = known_tiers(gw);
    if known.is_empty() || known.contains(t) {
        Ok(())
    } else {
        Err(Error::Invalid(format!(
            "`{t}` is not a tier of any rule whose tiers come from the consumer ({})",
            known.join(", ")
        )))
    }
}

fn metadata_text(m: Option<Value>) -> Result<Option<String>, Error> {
    match m {
        None | Some(Value::Null) => Ok(None),
        Some(v @ Value::Object(_)) => {
            let text = v.to_string();
            if text.len() > MAX_METADATA {
                return Err(Error::Invalid(format!(
                    "`metadata` is {} bytes as JSON; at most {MAX_METADATA}",
                    text.len()
                )));
            }
            Ok(Some(text))
        }
        Some(_) => Err(Error::Invalid("`metadata` is a JSON object".into())),
    }
}

/// The consumers section, or why the admin API has none.
fn spec(gw: &Gateway) -> Result<crate::config::ConsumersSpec, Error> {
    gw.live()
        .config
        .consumers
        .clone()
        .ok_or_else(|| Error::NotFound("no `consumers:` section in the config".into()))
}

/// Makes a consumer from `body`: its key (made unless imported) hashed,
/// kept in the shared store first where there is one, then here. Returns
/// the consumer and the key, when one was made (shown once).
pub(crate) async fn create(gw: &Gateway, body: NewBody) -> Result<(Consumer, String), Error> {
    let spec = spec(gw)?;
    crate::config::consumer_name(&body.name).map_err(Error::Invalid)?;
    check_tier(gw, &body.tier)?;
    let metadata = metadata_text(body.metadata)?;
    let now = gw.consumers.now();
    let expires_at = match &body.expires_in {
        None => None,
        Some(d) => {
            let d = parse_duration(d).map_err(Error::Invalid)?;
            if d.is_zero() {
                return Err(Error::Invalid(
                    "`expires_in` must be longer than zero".into(),
                ));
            }
            Some(now.saturating_add(Micros::from(d)))
        }
    };
    let key = match body.key {
        Some(k) if k.trim().len() < 16 => {
            return Err(Error::Invalid(
                "an imported `key` has at least 16 characters".into(),
            ));
        }
        Some(k) => k.trim().to_owned(),
        None => crate::tls::new_api_key(),
    };
    let c = Consumer {
        name: body.name,
        key_hash: spec.hasher.hash(&key),
        tier: body.tier,
        metadata,
        expires_at,
        created_at: now,
    };
    let live = gw.live();
    if gw.consumers.get(&c.name).is_some() || live.file_consumer_named(&c.name).is_some() {
        return Err(AddError::NameTaken(c.name).into());
    }
    if live.file_consumer(&c.key_hash).is_some() {
        return Err(AddError::KeyTaken.into());
    }
    // The bound and the key checked here first, then in the store.
    check_room(gw, &c)?;
    put_shared(gw, &c).await?;
    gw.consumers.add(c.clone())?;
    save(gw).await;
    Ok((c, key))
}

/// Whether `c` fits the local table (name, key, bound) before anything is
/// written.
fn check_room(gw: &Gateway, c: &Consumer) -> Result<(), Error> {
    if gw.consumers.find(&c.key_hash).is_some() {
        return Err(AddError::KeyTaken.into());
    }
    if gw.consumers.len() >= gw.consumers.max() {
        return Err(AddError::Full(gw.consumers.max()).into());
    }
    Ok(())
}

/// Writes `c` to the shared store, where there is one.
async fn put_shared(gw: &Gateway, c: &Consumer) -> Result<(), Error> {
    let live = gw.live();
    let store = live.limiter.store();
    if !store.is_shared() {
        return Ok(());
    }
    let text = serde_json::to_string(&Stored::of(c)).unwrap_or_default();
    let stored = store
        .table_put(TABLE, &c.name, &text, gw.consumers.max())
        .await
        .map_err(Error::Store)?;
    if !stored {
        return Err(AddError::Full(gw.consumers.max()).into());
    }
    Ok(())
}

/// Changes a consumer's tier or metadata (its key stays).
pub(crate) async fn change(gw: &Gateway, name: &str, body: ChangeBody) -> Result<Consumer, Error> {
    if gw.live().file_consumer_named(name).is_some() {
        return Err(Error::Conflict(format!(
            "`{name}` is named in consumers.file: change it there"
        )));
    }
    let Some(old) = gw.consumers.get(name) else {
        return Err(Error::NotFound(format!("no consumer named `{name}`")));
    };
    check_tier(gw, &body.tier)?;
    let mut c = (*old).clone();
    if body.tier.is_some() {
        c.tier = body.tier;
    }
    if body.metadata.is_some() {
        c.metadata = metadata_text(body.metadata)?;
    }
    put_shared(gw, &c).await?;
    gw.consumers.update(c.clone());
    save(gw).await;
    Ok(c)
}

/// Revokes a consumer: its key names no one from now on here, and on
/// every gateway sharing the store within a poll.
pub(crate) async fn revoke(gw: &Gateway, name: &str) -> Result<Consumer, Error> {
    if gw.live().file_consumer_named(name).is_some() {
        return Err(Error::Conflict(format!(
            "`{name}` is named in consumers.file: remove it there"
        )));
    }
    let live = gw.live();
    let store = live.limiter.store();
    let mut existed = false;
    if store.is_shared() {
        existed = store
            .table_delete(TABLE, name)
            .await
            .map_err(Error::Store)?;
    }
    match gw.consumers.remove(name) {
        Some(c) => {
            save(gw).await;
            Ok((*c).clone())
        }
        None if existed => Err(Error::NotFound(format!(
            "`{name}` was revoked in the shared store; this gateway had not read it yet"
        ))),
        None => Err(Error::NotFound(format!("no consumer named `{name}`"))),
    }
}

/// The consumer named `name`: the admin API's, or the config file's.
pub(crate) fn named(gw: &Gateway, name: &str) -> Option<(Arc<Consumer>, &'static str)> {
    if let Some(c) = gw.consumers.get(name) {
        return Some((c, "api"));
    }
    gw.live()
        .file_consumer_named(name)
        .map(|c| (c.clone(), "file"))
}

/// Every consumer, by name: the admin API's and the config file's.
pub(crate) fn all(gw: &Gateway) -> Vec<(Arc<Consumer>, &'static str)> {
    let mut out: Vec<_> = gw
        .consumers
        .list()
        .into_iter()
        .map(|c| (c, "api"))
        .collect();
    out.extend(gw.live().file_consumers().map(|c| (c.clone(), "file")));
    out.sort_by(|a, b| a.0.name.cmp(&b.0.name));
    out
}

/// A consumer as the admin API shows it: never its key, nor its hash.
pub(crate) fn to_json(c: &Consumer, source: &str, now: Micros) -> Value {
    let time = |us: u64| {
        ratewarden::calendar::jiff::Timestamp::from_microsecond(us as i64)
            .ok()
            .map(|t| t.to_string())
    };
    let mut v = json!({
        "name": c.name,
        "tier": c.tier,
        "source": source,
        "expired": c.expired(now),
    });
    if let Some(m) = &c.metadata {
        v["metadata"] = serde_json::from_str(m).unwrap_or(Value::Null);
    }
    if c.created_at.get() > 0 {
        v["created_at"] = json!(time(c.created_at.get()));
    }
    if let Some(at) = c.expires_at {
        v["expires_at"] = json!(time(at.get()));
        v["expires_in"] = json!(at.saturating_sub(now).get() as f64 / 1e6);
    }
    v
}

/// Writes this gateway's consumers to `state_dir` (memory store only; the
/// shared store keeps its own). A failure is logged: the change is in
/// force, and kept until the restart.
async fn save(gw: &Gateway) {
    let live = gw.live();
    let shared = live.limiter.store().is_shared();
    let table = || -> std::collections::BTreeMap<String, Stored> {
        gw.consumers
            .list()
            .iter()
            .map(|c| (c.name.clone(), Stored::of(c)))
            .collect()
    };
    crate::store::save_state(
        live.config.state_dir.clone(),
        shared,
        FILE,
        "consumers",
        table,
    )
    .await;
}

/// Reads the consumers `state_dir` kept (memory store only), at start: in
/// force from the first request.
pub(crate) fn restore(gw: &Gateway) {
    let live = gw.live();
    let dir = live.config.state_dir.as_deref();
    let shared = live.limiter.store().is_shared();
    let Some(table) = crate::store::read_state(dir, shared, FILE, "consumers") else {
        return;
    };
    let path = dir.map(|d| d.join(FILE)).unwrap_or_default();
    let fields = table
        .into_iter()
        .map(|(name, v)| (name, v.to_string()))
        .collect();
    let all = read_all(fields, "state_dir");
    let n = all.len();
    gw.consumers.replace(all);
    tracing::info!(consumers = n, file = %path.display(), "consumers restored from state_dir");
}

/// Keeps this gateway's consumers the shared store's (see
/// [`crate::store::TableFollower`]).
pub(crate) struct Sync(crate::store::TableFollower);

impl Sync {
    /// Not yet read.
    pub(crate) fn new() -> Self {
        Self(crate::store::TableFollower::new(TABLE))
    }

    /// One poll. A store error leaves the table as it was: a revocation
    /// made elsewhere is in force here once the store answers again.
    pub(crate) async fn poll(&mut self, gw: &Arc<Gateway>) {
        let live = gw.live();
        if live.config.consumers.is_none() {
            return;
        }
        let Some((v, fields)) = self.0.changed(live.limiter.store()).await else {
            return;
        };
        let all = read_all(fields, "redis");
        let n = all.len();
        gw.consumers.replace(all);
        if self.0.read_once() {
            tracing::info!(
                consumers = n,
                version = v,
                "consumers changed in redis: table read again"
            );
        }
        self.0.read(v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_consumer_round_trips_through_the_store_without_its_key() {
        let c = Consumer {
            name: "acme".into(),
            key_hash: "#0123456789abcdef0123456789abcdef".into(),
            tier: Some("pro".into()),
            metadata: Some(r#"{"plan":"annual"}"#.into()),
            expires_at: Some(Micros::from_secs(2_000_000_000)),
            created_at: Micros::from_secs(1_800_000_000),
        };
        let text = serde_json::to_string(&Stored::of(&c)).unwrap();
        let back = read_all(vec![("acme".into(), text)], "test");
        assert_eq!(back, vec![c.clone()]);
        let shown = to_json(&c, "api", Micros::from_secs(1_900_000_000));
        assert_eq!(shown["metadata"]["plan"], "annual");
        assert_eq!(shown["expired"], false);
        assert!(!shown.to_string().contains(&c.key_hash), "{shown}");
    }

    #[test]
    fn metadata_is_an_object_and_bounded() {
        assert!(metadata_text(Some(json!({"a": 1}))).unwrap().is_some());
        assert!(metadata_text(Some(json!([1]))).is_err());
        let big = json!({"a": "x".repeat(MAX_METADATA)});
        assert!(metadata_text(Some(big)).is_err());
    }
}
