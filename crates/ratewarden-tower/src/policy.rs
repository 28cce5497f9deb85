//! What a limiter is configured to do with requests: who a client is
//! ([`IdentitySource`]), who is never limited or always refused
//! ([`Pattern`]), and which rules apply to which requests under which key
//! ([`PolicyRule`]). [`crate::admission`] runs requests through it.

use std::net::IpAddr;

use http::{HeaderName, Method};
use ipnet::IpNet;
use ratewarden::Rule;
use regex::Regex;

use crate::identity::ClientIp;
use crate::view::RequestView;

/// Everything that decides whether a request goes on.
#[derive(Debug, Clone)]
pub struct Policy {
    /// Who a client is.
    pub identity: IdentitySource,
    /// Never limited.
    pub allow: Vec<Pattern>,
    /// Always refused (403).
    pub deny: Vec<Pattern>,
    /// The rules, in order.
    pub rules: Vec<PolicyRule>,
}

/// Where a request's identity comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdentitySource {
    /// The client's address: the peer, or behind trusted proxies the address
    /// they forward; IPv6 grouped by prefix.
    Address(ClientIp),
    /// A header's value; `missing` says what to do without one.
    Header {
        /// The header.
        name: HeaderName,
        /// How the client's address is found (for `missing: ip`, and for
        /// `allow`/`deny` networks).
        client_ip: ClientIp,
        /// Without the header.
        missing: Missing,
    },
    /// Given by the front end (the tower layer's key extractor).
    Given {
        /// Without one.
        missing: Missing,
    },
}

impl IdentitySource {
    /// How the client's address is found.
    pub fn client_ip(&self) -> Option<&ClientIp> {
        match self {
            IdentitySource::Address(c) | IdentitySource::Header { client_ip: c, .. } => Some(c),
            IdentitySource::Given { .. } => None,
        }
    }
}

/// What to do with a request that carries no identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Missing {
    /// Let it through unlimited (nginx's behaviour for an empty key); the
    /// tower layer's default.
    #[default]
    Skip,
    /// Use the client's address (the gateway's default with `from: header`).
    Ip,
    /// Refuse it: 400.
    Reject,
    /// Limit all such requests together, as `anonymous`.
    Anonymous,
}

/// An `allow:` / `deny:` entry: a network, or an identity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pattern {
    /// A network (a single address is a /32 or /128).
    Net(IpNet),
    /// An exact identity (e.g. a user id from a header).
    Identity(String),
}

impl Pattern {
    /// Whether the client (address `ip`, if known, identity `id`) matches.
    pub fn matches(&self, ip: Option<IpAddr>, id: &str) -> bool {
        match self {
            Pattern::Net(n) => ip.is_some_and(|ip| n.contains(&ip)),
            Pattern::Identity(s) => s == id,
        }
    }
}

/// One part of a rule's key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPart {
    /// The request's identity.
    Identity,
    /// The method.
    Method,
    /// The (normalised) path, without query.
    Path,
    /// A header's value.
    Header(HeaderName),
    /// One key for all clients.
    Global,
}

/// Which requests a rule applies to.
#[derive(Debug, Clone)]
pub struct Matcher {
    /// Empty = any method.
    pub methods: Vec<Method>,
    /// Path condition, on the normalised path (see [`crate::path`]).
    pub path: PathMatch,
    /// Paths compare in ASCII lower case (the pattern is stored
    /// lower-cased; a regex gets the `i` flag).
    pub case_insensitive: bool,
    /// Only requests on this route (a front end's own notion: the
    /// gateway's routes). `None`: any.
    pub route: Option<String>,
}

/// A path condition.
#[derive(Debug, Clone)]
pub enum PathMatch {
    /// Any path.
    Any,
    /// Exactly this path.
    Exact(String),
    /// Paths starting with this.
    Prefix(String),
    /// Paths the (linear-time) regex matches.
    Regex(Regex),
}

impl Matcher {
    /// Every request.
    pub fn any() -> Self {
        Self {
            methods: vec![],
            path: PathMatch::Any,
            case_insensitive: false,
            route: None,
        }
    }

    /// Whether `request`, on `route`, matches.
    ///
    /// ```
    /// use http::Method;
    /// use ratewarden_tower::policy::{Matcher, PathMatch};
    /// use ratewarden_tower::view::RequestView;
    /// let m = Matcher { methods: vec![], path: PathMatch::Prefix("/api/".into()), case_insensitive: true, route: None };
    /// assert!(m.matches(&RequestView::bare(&Method::GET, "/API/items"), None));
    /// assert!(!m.matches(&RequestView::bare(&Method::GET, "/apix"), None));
    /// let on = Matcher { route: Some("admin".into()), ..Matcher::any() };
    /// assert!(on.matches(&RequestView::bare(&Method::GET, "/x"), Some("admin")));
    /// assert!(!on.matches(&RequestView::bare(&Method::GET, "/x"), Some("api")));
    /// ```
    pub fn matches(&self, request: &RequestView<'_>, route: Option<&str>) -> bool {
        let (method, path) = (request.method, request.path);
        if !(self.methods.is_empty() || self.methods.contains(method)) {
            return false;
        }
        if let Some(r) = &self.route
            && route != Some(r.as_str())
        {
            return false;
        }
        let with = |path: &str| match &self.path {
            PathMatch::Any => true,
            PathMatch::Exact(p) => path == p,
            PathMatch::Prefix(p) => path.starts_with(p.as_str()),
            PathMatch::Regex(r) => r.is_match(path),
        };
        match self.path {
            PathMatch::Exact(_) | PathMatch::Prefix(_)
                if self.case_insensitive && path.bytes().any(|b| b.is_ascii_uppercase()) =>
            {
                with(&path.to_ascii_lowercase())
            }
            _ => with(path),
        }
    }
}

/// The spec's `failure_status` default: 400-499 except 429.
pub const DEFAULT_FAILURES: [(u16, u16); 2] = [(400, 428), (430, 499)];

/// A rule as a policy applies it.
#[derive(Debug, Clone)]
pub struct PolicyRule {
    /// The limiter rule.
    pub rule: Rule,
    /// When it applies.
    pub matcher: Matcher,
    /// Its key.
    pub key: Vec<KeyPart>,
    /// Upstream statuses that count as failures (`count: failures`), as
    /// inclusive ranges.
    pub failure_status: Vec<(u16, u16)>,
}

impl PolicyRule {
    /// `rule` on every request, keyed by the identity, failures as the spec
    /// says by default.
    pub fn everywhere(rule: Rule) -> Self {
        Self {
            rule,
            matcher: Matcher::any(),
            key: vec![KeyPart::Identity],
            failure_status: DEFAULT_FAILURES.to_vec(),
        }
    }

    /// Whether this rule's keys are grouped by the client's identity (their
    /// key contains it), else each by itself; see [`Self::group`].
    pub fn grouped_by_identity(&self) -> bool {
        self.key.contains(&KeyPart::Identity)
    }

    /// The Redis Cluster group (hash tag) of a key of this rule: the client's
    /// identity when the key contains it (so all of one client's keys share
    /// a slot), else the key itself (a key shared by clients, such as
    /// `global` or an API key header, is one slot of its own). A function of
    /// the key alone, so the proxy and the admin API name the same counter.
    /// `identity` may be omitted when the key is the identity alone.
    pub fn group(&self, key: &str, identity: Option<&str>) -> Result<String, String> {
        if !self.grouped_by_identity() {
            return Ok(key.to_owned());
        }
        match identity {
            Some(id) => Ok(id.to_owned()),
            None if self.key == [KeyPart::Identity] => Ok(key.to_owned()),
            None => Err(format!(
                "rule `{}` is keyed by more than the identity: pass `identity` too",
                self.rule.name()
            )),
        }
    }

    /// The group of a key this rule made, from the key alone, for keys
    /// listed without their request (`/v1/keys?rule=`): the identity's
    /// place in the key, which joins its parts with `:`. The parts around
    /// the identity are taken to hold no `:` (an identity may, as an IPv6
    /// group does); a key with too few parts is its own group.
    pub fn group_of_key(&self, key: &str) -> String {
        let Some(at) = self.key.iter().position(|p| *p == KeyPart::Identity) else {
            return key.to_owned();
        };
        let after = self.key.len() - 1 - at;
        // Skip `at` parts from the left and `after` from the right.
        let mut start = 0;
        for _ in 0..at {
            match key[start..].find(':') {
                Some(i) => start += i + 1,
                None => return key.to_owned(),
            }
        }
        let mut end = key.len();
        for _ in 0..after {
            match key[start..end].rfind(':') {
                Some(i) => end = start + i,
                None => return key.to_owned(),
            }
        }
        key[start..end].to_owned()
    }

    /// Whether `status` is a failure for this rule.
    pub fn is_failure(&self, status: u16) -> bool {
        self.failure_status
            .iter()
            .any(|&(lo, hi)| (lo..=hi).contains(&status))
    }
}

impl Policy {
    /// `rules` on every request, keyed by what the front end gives; no
    /// `allow`, no `deny`.
    pub fn given(rules: impl IntoIterator<Item = Rule>, missing: Missing) -> Self {
        Self {
            identity: IdentitySource::Given { missing },
            allow: vec![],
            deny: vec![],
            rules: rules.into_iter().map(PolicyRule::everywhere).collect(),
        }
    }

    /// The rule named `name`.
    pub fn rule(&self, name: &str) -> Option<&PolicyRule> {
        self.rules.iter().find(|r| r.rule.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn keyed(key: Vec<KeyPart>) -> PolicyRule {
        let rule = ratewarden::Rule::builder("r")
            .limit(1, Duration::from_secs(1))
            .build()
            .unwrap();
        PolicyRule {
            key,
            ..PolicyRule::everywhere(rule)
        }
    }

    #[test]
    fn a_keys_group_is_its_identity_wherever_the_identity_stands() {
        use KeyPart::{Global, Identity, Method};
        assert_eq!(
            keyed(vec![Identity]).group_of_key("2001:db8::/64"),
            "2001:db8::/64"
        );
        assert_eq!(
            keyed(vec![Identity, Method]).group_of_key("2001:db8::/64:GET"),
            "2001:db8::/64"
        );
        assert_eq!(
            keyed(vec![Method, Identity]).group_of_key("POST:10.0.0.1"),
            "10.0.0.1"
        );
        assert_eq!(
            keyed(vec![Method, Identity, Global]).group_of_key("POST:2001:db8::/64:global"),
            "2001:db8::/64"
        );
        assert_eq!(
            keyed(vec![Method, Global]).group_of_key("GET:global"),
            "GET:global"
        );
        assert_eq!(keyed(vec![Method, Identity]).group_of_key("short"), "short");
    }
}
