//! `consumers:`: where a request's API key is, what an unknown key gets,
//! the bound, and the consumers a file names.

use http::HeaderName;
use ratewarden::clock::Micros;
use ratewarden_tower::consumers::Consumer;

use super::super::diag::Diag;
use super::super::model::*;
use super::super::schema::*;

/// A consumer's name: what identities, keys and logs show, so plain
/// (letters, digits, `.`, `_`, `-`; 1 to 64 of them).
pub(crate) fn valid_name(name: &str) -> Result<(), String> {
    let ok = (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "consumer name `{name}`: 1 to 64 letters, digits, `.`, `_` or `-`"
        ))
    }
}

pub(super) fn consumers(
    d: &Diag<'_>,
    f: &Sp<ConsumersFile>,
    hasher: Option<&KeyHasher>,
) -> Option<ConsumersSpec> {
    let c = &f.value;
    let from = match c.from.value.trim() {
        "authorization" => Some(ApiKeyFrom::Authorization),
        text => match text.split_once(':') {
            Some(("header", name)) => d.check(
                "consumers.from",
                Some(&c.from.referenced),
                HeaderName::from_bytes(name.as_bytes())
                    .map(ApiKeyFrom::Header)
                    .map_err(|_| format!("`{name}` is not a header name")),
            ),
            Some(("query", name)) if !name.is_empty() => Some(ApiKeyFrom::Query(name.to_owned())),
            _ => {
                d.error(
                    "consumers.from",
                    Some(&c.from.referenced),
                    format!(
                        "`{text}`: an API key comes from header:NAME, authorization (Bearer) or query:NAME"
                    ),
                );
                None
            }
        },
    };
    let reject_unknown = match &c.unknown {
        None => Some(true),
        Some(v) => d.choice(
            "consumers.unknown",
            v,
            &[("reject", true), ("anonymous", false)],
        ),
    };
    let max = match &c.max {
        None => Some(CONSUMERS_MAX),
        Some(m) if (0..=10_000_000).contains(&m.value) => Some(m.value as usize),
        Some(m) => {
            d.error(
                "consumers.max",
                Some(&m.referenced),
                "`consumers.max` must be 0 (none made by the admin API) to 10000000",
            );
            None
        }
    };
    let Some(hasher) = hasher else {
        d.error(
            "consumers",
            Some(&f.referenced),
            "consumers' keys are kept as their HMAC: `consumers:` needs `key_secret:` (top level; e.g. `key_secret: ${RATEWARDEN_KEY_SECRET}`)",
        );
        return None;
    };
    let file = match &c.file {
        None => Some(vec![]),
        Some(path) => read_file(d, path, hasher),
    };
    Some(ConsumersSpec {
        from: from?,
        reject_unknown: reject_unknown?,
        max: max?,
        hasher: hasher.clone(),
        file: file?,
    })
}

/// `consumers.file`: each entry's name and key hash checked.
fn read_file(d: &Diag<'_>, path: &Sp<String>, hasher: &KeyHasher) -> Option<Vec<Consumer>> {
    let text = match std::fs::read_to_string(&path.value) {
        Ok(t) => t,
        Err(e) => {
            d.error(
                "consumers.file",
                Some(&path.referenced),
                format!("cannot read {}: {e}", path.value),
            );
            return None;
        }
    };
    let entries = match ratewarden_schema::consumers(&text) {
        Ok(e) => e,
        Err(e) => {
            d.push(super::super::diag::parse_error(&path.value, &text, &e));
            return None;
        }
    };
    let mut out = Some(vec![]);
    let bad = |m: String| {
        d.error(
            "consumers.file",
            Some(&path.referenced),
            format!("{}: {m}", path.value),
        );
    };
    let mut names = std::collections::HashSet::new();
    let mut keys = std::collections::HashSet::new();
    let mut ok = true;
    for e in entries {
        if let Err(m) = valid_name(&e.name) {
            bad(m);
            ok = false;
            continue;
        }
        if !hasher.is_hash(&e.key_hash) {
            bad(format!(
                "consumer `{}`: `key_hash` is what `ratewarden key hash` prints (`#` and 32 hex digits), never the key",
                e.name
            ));
            ok = false;
            continue;
        }
        if !names.insert(e.name.clone()) {
            bad(format!("consumer `{}` is named twice", e.name));
            ok = false;
        }
        if !keys.insert(e.key_hash.clone()) {
            bad(format!("consumer `{}`: another has the same key", e.name));
            ok = false;
        }
        let metadata = e.metadata.map(|m| {
            let map: serde_json::Map<String, serde_json::Value> = m
                .into_iter()
                .map(|(k, v)| (k, serde_json::Value::String(v.0)))
                .collect();
            serde_json::Value::Object(map).to_string()
        });
        if let Some(v) = out.as_mut() {
            v.push(Consumer {
                name: e.name,
                key_hash: e.key_hash,
                tier: e.tier,
                metadata,
                expires_at: None,
                created_at: Micros::ZERO,
            });
        }
    }
    if ok { out } else { None }
}
