//! Envoy rate limit descriptors: envoyproxy/ratelimit's configuration
//! format, loaded unchanged, and ratewarden's extension of it.
//!
//! A domain holds a tree of descriptors. Each level is keyed by `key` or
//! `key_value`; a value ending in (or holding) `*` is a wildcard. A request
//! descriptor's entries walk the tree as envoyproxy/ratelimit walks it
//! ([`Domains::limit`]): at each level the exact `key_value` first, then
//! the wildcards in file order, then the bare `key` (one limit per
//! distinct value); the limit is the one reached by the last entry.
//!
//! The extension: `rate_limit` may also say `algorithm` (any of ours, not
//! `concurrency`: Envoy never says when a request ends), `burst`,
//! `min_interval`, `penalty`, `window` (any duration, in place of
//! `unit`), and `distribution` (leased slices on Redis, as a rule's).
//!
//! Here in `config` (plain data, built from the files), so that the
//! service (`crate::front::rls`) uses it and config uses nothing of the service.

/// `rls:` as configured.
#[derive(Debug, Clone)]
pub struct RlsSpec {
    /// The gRPC listener.
    pub listen: SocketAddr,
    /// Which rate-limit headers go into `response_headers_to_add`.
    pub headers: HeaderStyle,
    /// envoyproxy/ratelimit's own headers (`headers: [envoy]`), under
    /// these names (limit, remaining, reset): the descriptor with the
    /// least remaining, as that service answers.
    pub envoy_headers: Option<[String; 3]>,
    /// The domains and their descriptors.
    pub domains: Arc<Domains>,
    /// `rls.config`, a file or a directory: watched, as the config file
    /// is, for a reload.
    pub source: Option<std::path::PathBuf>,
}

impl RlsSpec {
    /// The files `rls.config` names now (a directory's `.yaml` / `.yml`
    /// files, sorted), so that an added or removed file counts as a
    /// change.
    pub fn files(&self) -> Vec<std::path::PathBuf> {
        self.source
            .as_deref()
            .map(|p| descriptor_files(p).unwrap_or_default())
            .unwrap_or_default()
    }
}

/// The descriptor files `rls.config` names (a file, or a directory's
/// `.yaml` / `.yml` files), read and parsed, each named as shown in
/// errors; `None` after reporting what could not be read or parsed.
pub(super) fn read_files(
    d: &super::diag::Diag<'_>,
    path: &super::schema::Sp<String>,
) -> Option<Vec<(String, DomainFile)>> {
    let p = std::path::Path::new(&path.value);
    let names = match descriptor_files(p) {
        Ok(names) => names,
        Err(e) => {
            d.error(
                "rls.config",
                Some(&path.referenced),
                format!("cannot read {}: {e}", p.display()),
            );
            return None;
        }
    };
    let (mut files, mut ok) = (vec![], true);
    for name in names {
        let shown = name.display().to_string();
        match std::fs::read_to_string(&name) {
            Ok(text) => match ratewarden_schema::rls::file(&text) {
                Ok(f) => files.push((shown, f)),
                Err(e) => {
                    d.push(super::diag::parse_error(&shown, &text, &e));
                    ok = false;
                }
            },
            Err(e) => {
                d.error(
                    "rls.config",
                    Some(&path.referenced),
                    format!("cannot read {shown}: {e}"),
                );
                ok = false;
            }
        }
    }
    ok.then_some(files)
}

/// The descriptor files `path` names: itself, or a directory's `.yaml` and
/// `.yml` files, sorted (the order domains load in).
pub(crate) fn descriptor_files(path: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_owned()]);
    }
    let mut v: Vec<_> = std::fs::read_dir(path)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml" || x == "yml"))
        .collect();
    v.sort();
    Ok(v)
}

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ratewarden::algorithm::Kind;
use ratewarden::{HeaderStyle, Rule};
pub(crate) use ratewarden_schema::rls::{DescriptorFile, DomainFile, RateLimitFile, Scalar};

/// Envoy's `RateLimitResponse.RateLimit.Unit` values.
pub(crate) const UNITS: [(&str, i32, u64); 7] = [
    ("second", 1, 1),
    ("minute", 2, 60),
    ("hour", 3, 3_600),
    ("day", 4, 86_400),
    ("month", 5, 86_400 * 30),
    ("year", 6, 86_400 * 365),
    ("week", 7, 86_400 * 7),
];

/// The seconds of Envoy unit `unit` (an override's), if it is one.
pub(crate) fn unit_seconds(unit: i32) -> Option<u64> {
    UNITS.iter().find(|u| u.1 == unit).map(|u| u.2)
}

/// A descriptor's limit, compiled.
#[derive(Debug)]
pub struct Limit {
    /// `domain.key_value.key...`: the descriptor's place in the tree (its
    /// metric label, and its rule's name).
    pub full_key: String,
    /// `rate_limit.name` (`replaces` refers to it), or empty.
    pub name: String,
    /// Names of the limits this one replaces.
    pub replaces: Vec<String>,
    /// `unlimited: true`: always OK, never counted.
    pub unlimited: bool,
    /// `shadow_mode`: decided and counted, never refused.
    pub shadow: bool,
    /// `detailed_metric`: metrics carry the request's values.
    pub detailed: bool,
    /// The rule deciding it (`None` when unlimited, or when
    /// `requests_per_unit` is 0: every request over, as
    /// envoyproxy/ratelimit's block lists have it).
    pub rule: Option<Rule>,
    /// Its window.
    pub window: Duration,
    /// As Envoy's response gives it back: unit and requests per unit
    /// (unit 0, UNKNOWN, for a `window` that is not a unit).
    pub unit: i32,
    /// Requests per unit.
    pub requests_per_unit: u32,
}

/// A descriptor as configured: its composite key (`key` or
/// `key_value`) at its level, the limit it carries, and the descriptors
/// under it. Plain data: the RLS front end builds its lookup tree from it
/// (`front::rls::tree`).
#[derive(Debug)]
pub struct Descriptor {
    /// `key` or `key_value` (may hold `*`, any run of characters).
    pub key: String,
    /// Its limit, if it has one.
    pub limit: Option<Arc<Limit>>,
    /// The level under it.
    pub children: Vec<Descriptor>,
}

/// Every domain, as configured.
#[derive(Debug, Default)]
pub struct Domains {
    /// Each domain's name and top level, in file order.
    pub domains: Vec<(String, Vec<Descriptor>)>,
    /// Every compiled limit, for `/v1/rules`-style listings and tests.
    limits: Vec<Arc<Limit>>,
}

impl Domains {
    /// How many domains.
    pub fn len(&self) -> usize {
        self.domains.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.domains.is_empty()
    }

    /// Every limit configured.
    pub fn limits(&self) -> &[Arc<Limit>] {
        &self.limits
    }
}

/// Builds the domains of `files` (each named for its errors). Errors are
/// `(file, key path, message)`, every one found.
pub(crate) fn build(
    files: &[(String, DomainFile)],
) -> Result<Domains, Vec<(String, String, String)>> {
    let mut out = Domains::default();
    let mut errors = vec![];
    for (file, f) in files {
        let mut err = |key: &str, m: String| errors.push((file.clone(), key.to_owned(), m));
        let domain = match &f.domain {
            Some(Scalar(d)) if !d.is_empty() => d.clone(),
            _ => {
                err("domain", "a config file cannot have an empty domain".into());
                continue;
            }
        };
        if out.domains.iter().any(|(d, _)| *d == domain) {
            err("domain", format!("duplicate domain `{domain}`"));
            continue;
        }
        let mut root = vec![];
        load(
            &mut root,
            &format!("{domain}."),
            &f.descriptors,
            &mut out.limits,
            &mut err,
        );
        out.domains.push((domain, root));
    }
    if errors.is_empty() {
        Ok(out)
    } else {
        Err(errors)
    }
}

fn load(
    level: &mut Vec<Descriptor>,
    parent: &str,
    descriptors: &[DescriptorFile],
    limits: &mut Vec<Arc<Limit>>,
    err: &mut impl FnMut(&str, String),
) {
    for d in descriptors {
        let key = match &d.key {
            Some(Scalar(k)) if !k.is_empty() => k.clone(),
            _ => {
                err(parent, "descriptor has an empty key".into());
                continue;
            }
        };
        let final_key = match &d.value {
            Some(Scalar(v)) if !v.is_empty() => format!("{key}_{v}"),
            _ => key.clone(),
        };
        let full_key = format!("{parent}{final_key}");
        if level.iter().any(|d| d.key == final_key) {
            err(
                &full_key,
                format!("duplicate descriptor composite key `{full_key}`"),
            );
            continue;
        }
        for (name, present) in [
            ("quota_mode", d.quota_mode.is_some()),
            ("value_to_metric", d.value_to_metric.is_some()),
            ("share_threshold", d.share_threshold.is_some()),
            ("metadata", d.metadata.is_some()),
        ] {
            if present {
                err(
                    &full_key,
                    format!("`{name}` is not supported by ratewarden (remove it)"),
                );
            }
        }
        let limit = d
            .rate_limit
            .as_ref()
            .and_then(|r| compile(r, &full_key, d, err))
            .map(Arc::new);
        if let Some(l) = &limit {
            limits.push(l.clone());
        }
        let mut children = vec![];
        load(
            &mut children,
            &format!("{full_key}."),
            &d.descriptors,
            limits,
            err,
        );
        level.push(Descriptor {
            key: final_key,
            limit,
            children,
        });
    }
}

fn compile(
    r: &RateLimitFile,
    full_key: &str,
    d: &DescriptorFile,
    err: &mut impl FnMut(&str, String),
) -> Option<Limit> {
    let key = format!("{full_key}.rate_limit");
    let name = r.name.as_ref().map(|n| n.0.clone()).unwrap_or_default();
    let replaces: Vec<String> = r.replaces.iter().map(|x| x.name.0.clone()).collect();
    if replaces.iter().any(String::is_empty) {
        err(&key, "should not have an empty replaces entry".into());
    }
    if !name.is_empty() && replaces.contains(&name) {
        err(
            &key,
            "replaces should not contain the name of the same descriptor".into(),
        );
    }
    // The one place a limit is made; each way out below calls it once.
    let make = |unlimited, rule, window, unit, requests_per_unit| Limit {
        full_key: full_key.to_owned(),
        name,
        replaces,
        unlimited,
        shadow: d.shadow_mode,
        detailed: d.detailed_metric,
        rule,
        window,
        unit,
        requests_per_unit,
    };
    let unit = r
        .unit
        .as_deref()
        .map(|u| UNITS.iter().find(|x| x.0.eq_ignore_ascii_case(u)).ok_or(u));
    if r.unlimited {
        if unit.is_some() {
            err(
                &key,
                "should not specify a rate limit unit when unlimited".into(),
            );
            return None;
        }
        return Some(make(true, None, Duration::ZERO, 0, 0));
    }
    let window = match (unit, &r.window) {
        (Some(Ok(u)), None) => Duration::from_secs(u.2),
        (None, Some(w)) => match crate::config::parse_duration(w) {
            Ok(w) => w,
            Err(e) => {
                err(&key, format!("window: {e}"));
                return None;
            }
        },
        (Some(Err(u)), _) => {
            let names: Vec<&str> = UNITS.iter().map(|u| u.0).collect();
            err(
                &key,
                format!(
                    "invalid rate limit unit `{u}` (expected {})",
                    names.join(", ")
                ),
            );
            return None;
        }
        (Some(Ok(_)), Some(_)) => {
            err(&key, "give `unit` or `window`, not both".into());
            return None;
        }
        (None, None) => {
            err(&key, "a rate limit needs a `unit`".into());
            return None;
        }
    };
    let Some(rpu) = r.requests_per_unit else {
        err(&key, "a rate limit needs `requests_per_unit`".into());
        return None;
    };
    let envoy_unit = match unit {
        Some(Ok(u)) => u.1,
        _ => 0,
    };
    if rpu == 0 {
        // envoyproxy/ratelimit's block list: every request over.
        return Some(make(false, None, window, envoy_unit, 0));
    }
    let kind = match r.algorithm.as_deref() {
        None => Kind::FixedWindow,
        Some(a) => match Kind::ALL.iter().find(|k| k.name() == a) {
            Some(Kind::Concurrency) => {
                err(
                    &key,
                    "`concurrency` cannot be an Envoy limit: Envoy never says when a request ends"
                        .into(),
                );
                return None;
            }
            Some(k) => *k,
            None => {
                let names: Vec<&str> = Kind::ALL.iter().map(|k| k.name()).collect();
                err(
                    &key,
                    format!("unknown algorithm `{a}` (expected {})", names.join(", ")),
                );
                return None;
            }
        },
    };
    let mut b = Rule::builder(full_key)
        .algorithm(kind)
        .limit(rpu, window)
        .shadow(d.shadow_mode);
    if let Some(burst) = r.burst {
        b = b.burst(burst);
    }
    if let Some(f) = &r.distribution {
        match crate::config::distribution(f) {
            Ok(d) => b = b.distribution(d),
            Err(e) => {
                err(&key, e);
                return None;
            }
        }
    }
    for (field, value) in [("min_interval", &r.min_interval), ("penalty", &r.penalty)] {
        let Some(v) = value else { continue };
        match crate::config::parse_duration(v) {
            Ok(d) if field == "min_interval" => b = b.min_interval(d),
            Ok(d) => b = b.penalty(ratewarden::Penalty::fixed(d)),
            Err(e) => {
                err(&key, format!("{field}: {e}"));
                return None;
            }
        }
    }
    let rule = match b.build() {
        Ok(rule) => rule,
        Err(e) => {
            err(&key, e.to_string());
            return None;
        }
    };
    Some(make(
        false,
        Some(rule),
        window,
        envoy_unit,
        u32::try_from(rpu).unwrap_or(u32::MAX),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_descriptors_are_named_and_unsupported_keys_refused() {
        let f: DomainFile = serde_saphyr::from_str(
            "domain: d
descriptors:
  - key: a
    rate_limit: {unit: fortnight, requests_per_unit: 1}
  - key: a
  - key: b
    quota_mode: true
    rate_limit: {unlimited: true, unit: second}
  - key: c
    rate_limit: {unit: second, requests_per_unit: 1, name: n, replaces: [{name: n}]}
  - key: e
    rate_limit: {unit: second, requests_per_unit: 1, algorithm: concurrency}
",
        )
        .unwrap();
        let errors = build(&[("t.yaml".into(), f)]).unwrap_err();
        let text: Vec<String> = errors.iter().map(|e| format!("{}: {}", e.1, e.2)).collect();
        let all = text.join("\n");
        for want in [
            "invalid rate limit unit `fortnight`",
            "duplicate descriptor composite key `d.a`",
            "`quota_mode` is not supported",
            "should not specify a rate limit unit when unlimited",
            "replaces should not contain the name",
            "`concurrency` cannot be an Envoy limit",
        ] {
            assert!(all.contains(want), "{want} in\n{all}");
        }
    }
}
