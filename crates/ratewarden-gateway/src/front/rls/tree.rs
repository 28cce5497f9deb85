//! The descriptor tree the RLS answers from: built from the configured
//! domains (plain specs, `config::rls`) when a configuration comes into
//! force, and walked per call as envoyproxy/ratelimit walks its own.

use std::sync::Arc;

use crate::config::rls::{Descriptor, Domains, Limit};

/// Looked up per call with request-given keys, built from the config
/// only (nothing a request sends is inserted): a fast hash, seeded.
type HashMap<K, V> = foldhash::HashMap<K, V>;

/// One level of a domain's tree.
#[derive(Debug, Default)]
struct Node {
    children: HashMap<String, Node>,
    /// `key_value` patterns holding `*`, in file order, split on `*`.
    wildcards: Vec<(String, Vec<String>)>,
    limit: Option<Arc<Limit>>,
}

impl Node {
    fn of(level: &[Descriptor]) -> Self {
        let mut node = Node::default();
        for d in level {
            if d.key.contains('*') {
                let parts = d.key.split('*').map(str::to_owned).collect();
                node.wildcards.push((d.key.clone(), parts));
            }
            let mut child = Node::of(&d.children);
            child.limit = d.limit.clone();
            node.children.insert(d.key.clone(), child);
        }
        node
    }
}

/// Every domain's tree.
#[derive(Debug, Default)]
pub(crate) struct Tree {
    domains: HashMap<String, Node>,
}

impl Tree {
    /// The trees of `domains`.
    pub(crate) fn new(domains: &Domains) -> Self {
        Self {
            domains: domains
                .domains
                .iter()
                .map(|(name, level)| (name.clone(), Node::of(level)))
                .collect(),
        }
    }

    /// Whether `domain` is configured.
    pub(crate) fn has(&self, domain: &str) -> bool {
        self.domains.contains_key(domain)
    }

    /// The limit `entries` (key, value pairs) reach in `domain`, walking
    /// the tree as envoyproxy/ratelimit does: each entry one level down,
    /// `key_value` first, then a wildcard value, then the bare `key`; the
    /// limit of the level the last entry reaches, if any.
    pub(crate) fn limit(&self, domain: &str, entries: &[(&str, &str)]) -> Option<&Arc<Limit>> {
        let mut level = self.domains.get(domain)?;
        let mut found = None;
        let mut exact = String::new();
        for (i, (key, value)) in entries.iter().enumerate() {
            exact.clear();
            exact.push_str(key);
            exact.push('_');
            exact.push_str(value);
            let next = level.children.get(exact.as_str()).or_else(|| {
                level
                    .wildcards
                    .iter()
                    .find(|(_, parts)| wildcard_match(parts, &exact))
                    .and_then(|(k, _)| level.children.get(k))
                    .or_else(|| level.children.get(*key))
            });
            let Some(next) = next else {
                break;
            };
            if i == entries.len() - 1 {
                found = next.limit.as_ref();
            }
            if next.children.is_empty() {
                break;
            }
            level = next;
        }
        found
    }
}

/// The tree of the configuration in force, built once per configuration
/// (a reload brings new domains; the first call under them builds).
#[derive(Debug, Default)]
pub(super) struct Trees {
    current: arc_swap::ArcSwapOption<(Arc<Domains>, Tree)>,
}

impl Trees {
    /// The tree of `domains`, built now if it is not the one held.
    pub(super) fn of(&self, domains: &Arc<Domains>) -> Arc<(Arc<Domains>, Tree)> {
        if let Some(held) = self.current.load_full()
            && Arc::ptr_eq(&held.0, domains)
        {
            return held;
        }
        let built = Arc::new((domains.clone(), Tree::new(domains)));
        self.current.store(Some(built.clone()));
        built
    }
}

/// Whether `value` matches a pattern split on `*` (each `*` any run of
/// characters, possibly empty).
fn wildcard_match(parts: &[String], value: &str) -> bool {
    let (first, last) = (&parts[0], &parts[parts.len() - 1]);
    if parts.len() == 1 {
        return value == first;
    }
    let fixed: usize = parts.iter().map(String::len).sum();
    if value.len() < fixed || !value.starts_with(first.as_str()) || !value.ends_with(last.as_str())
    {
        return false;
    }
    let mut rest = &value[first.len()..value.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part.as_str()) {
            Some(i) => rest = &rest[i + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::rls::{DomainFile, build};

    fn domains(yaml: &str) -> Tree {
        let f: DomainFile = serde_saphyr::from_str(yaml).unwrap();
        Tree::new(&build(&[("t.yaml".into(), f)]).unwrap())
    }

    fn reached(d: &Tree, entries: &[(&str, &str)]) -> Option<String> {
        d.limit("d", entries).map(|l| l.full_key.clone())
    }

    #[test]
    fn the_walk_follows_envoyproxy_ratelimit() {
        let d = domains(
            "domain: d
descriptors:
  - key: remote_address
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: path
    value: /login
    rate_limit: {unit: minute, requests_per_unit: 5}
  - key: path
    value: /api/*
    rate_limit: {unit: minute, requests_per_unit: 50}
  - key: path
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: client
    value: 200
    descriptors:
      - key: op
        rate_limit: {unit: hour, requests_per_unit: 3}
  - key: x
    value: a*b*c
    rate_limit: {unit: day, requests_per_unit: 1}
",
        );
        let k = |s: &str| Some(s.to_owned());
        assert_eq!(
            reached(&d, &[("remote_address", "1.2.3.4")]),
            k("d.remote_address")
        );
        assert_eq!(reached(&d, &[("path", "/login")]), k("d.path_/login"));
        assert_eq!(reached(&d, &[("path", "/api/v1")]), k("d.path_/api/*"));
        assert_eq!(reached(&d, &[("path", "/other")]), k("d.path"));
        // Nested: only the last entry's level counts.
        assert_eq!(reached(&d, &[("client", "200")]), None);
        assert_eq!(
            reached(&d, &[("client", "200"), ("op", "w")]),
            k("d.client_200.op")
        );
        assert_eq!(reached(&d, &[("client", "201"), ("op", "w")]), None);
        // More entries than the tree is deep: nothing.
        assert_eq!(reached(&d, &[("path", "/login"), ("op", "w")]), None);
        assert_eq!(reached(&d, &[("x", "a-b-c")]), k("d.x_a*b*c"));
        assert_eq!(reached(&d, &[("x", "abc")]), k("d.x_a*b*c"));
        assert_eq!(reached(&d, &[("x", "acb")]), None);
        assert!(d.limit("other", &[("path", "/login")]).is_none());
        assert!(d.has("d") && !d.has("other"));
    }

    #[test]
    fn a_tree_is_built_once_per_configuration() {
        let f: DomainFile = serde_saphyr::from_str(
            "domain: d\ndescriptors: [{key: k, rate_limit: {unit: second, requests_per_unit: 1}}]",
        )
        .unwrap();
        let a = Arc::new(build(&[("t.yaml".into(), f)]).unwrap());
        let b = Arc::new(Domains::default());
        let trees = Trees::default();
        let first = trees.of(&a);
        assert!(
            Arc::ptr_eq(&first, &trees.of(&a)),
            "the same domains: the same tree"
        );
        assert!(first.1.has("d"));
        let other = trees.of(&b);
        assert!(!other.1.has("d"), "new domains: a new tree");
    }
}
