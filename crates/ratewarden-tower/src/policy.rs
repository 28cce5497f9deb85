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
    /// One key's parameters set at runtime ([`crate::overrides`]); kept
    /// across reloads by the front end, which hands each new policy the
    /// same table.
    pub overrides: Option<std::sync::Arc<crate::overrides::Overrides>>,
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
    /// A claim of the request's verified token (see
    /// [`RequestView::claims`]); `missing` says what to do without one
    /// (no token, or one not trusted).
    Claim {
        /// The claim (`sub`, nested as `org.id`).
        claim: String,
        /// How the client's address is found (for `missing: ip`, and for
        /// `allow`/`deny` networks).
        client_ip: ClientIp,
        /// Without the claim.
        missing: Missing,
    },
    /// The name of the consumer the request's API key names (see
    /// [`crate::consumers`]); `missing` says what to do without one (no
    /// key, or one that names no one under `unknown: anonymous`):
    /// [`Missing::Reject`] answers 401.
    Consumer {
        /// How the client's address is found (for `missing: ip`, and for
        /// `allow`/`deny` networks).
        client_ip: ClientIp,
        /// Without a consumer.
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
            IdentitySource::Address(c)
            | IdentitySource::Header { client_ip: c, .. }
            | IdentitySource::Claim { client_ip: c, .. }
            | IdentitySource::Consumer { client_ip: c, .. } => Some(c),
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
    /// A header's value (the first sent).
    Header(HeaderName),
    /// One key for all clients.
    Global,
    /// The host the request is for (see [`RequestView::host`]).
    Host,
    /// A query parameter's first value, decoded.
    Query(String),
    /// A cookie's value.
    Cookie(String),
    /// A named capture group of the rule's `path_regex` (`path:NAME`).
    Capture(String),
    /// A claim of the request's verified token (`jwt:CLAIM`, nested as
    /// `jwt:org.id`).
    Jwt(String),
    /// A field of the request's JSON body (`json:model`, nested as
    /// `json:metadata.user_id`; see [`RequestView::body`]).
    Json(String),
    /// The name of the consumer the request's API key names (`consumer`).
    Consumer,
    /// That consumer's tier (what `tiers: {from: consumer}` reads).
    ConsumerTier,
    /// Another part (a credential: an API key in a header, a parameter, a
    /// cookie), kept only as a keyed hash of its value: the store, the logs,
    /// the metrics and the admin API never hold the secret.
    Hashed(Box<KeyPart>, KeyHasher),
}

/// A keyed hash for [`KeyPart::Hashed`], given by the front end (the
/// gateway's is HMAC-SHA256 under its `key_secret`, through its crypto
/// provider; this crate holds no cryptography). Its output must be text
/// without `:`.
#[derive(Clone)]
pub struct KeyHasher(std::sync::Arc<dyn Fn(&str) -> String + Send + Sync>);

impl KeyHasher {
    /// A hasher calling `f`.
    pub fn new(f: impl Fn(&str) -> String + Send + Sync + 'static) -> Self {
        Self(std::sync::Arc::new(f))
    }

    /// The hash of `value`.
    pub fn hash(&self, value: &str) -> String {
        (self.0)(value)
    }

    /// Whether `key` is already a hash this hasher made (the same length
    /// and first character as the hash of anything).
    pub fn is_hash(&self, key: &str) -> bool {
        let sample = self.hash("");
        let (key, sample) = (key.as_bytes(), sample.as_bytes());
        key.len() == sample.len()
            && key.first() == sample.first()
            && key.iter().skip(1).all(u8::is_ascii_hexdigit)
    }
}

impl std::fmt::Debug for KeyHasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.write_str("KeyHasher")
    }
}

/// Two hashed parts are alike when their parts are (the key is the
/// configuration's one).
impl PartialEq for KeyHasher {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for KeyHasher {}

/// What a rule does with a request that lacks one of its key's parts (a
/// header, a parameter, a cookie not sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingPart {
    /// The part is the client's identity instead: neither omitting the
    /// part nor inventing values escapes the limit (Kong's way without a
    /// consumer).
    #[default]
    Identity,
    /// Every such request shares one bucket per rule (`anonymous`).
    Anonymous,
    /// The rule does not apply.
    Skip,
    /// The request is refused: 400, naming the part.
    Reject,
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
    /// Only requests for one of these hosts (see [`RequestView::host`]);
    /// empty: any.
    pub hosts: Vec<HostPattern>,
    /// Header conditions, all of which must hold.
    pub headers: Vec<Condition>,
    /// Query parameter conditions, all of which must hold.
    pub query: Vec<Condition>,
    /// Conditions on the JSON request body's fields (dotted names), all of
    /// which must hold (see [`RequestView::body`]).
    pub json: Vec<Condition>,
}

/// A `hosts:` entry, lower case, without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    /// This name.
    Exact(String),
    /// `*.suffix`: any name ending in `.suffix` (held with its dot), not
    /// `suffix` itself.
    Suffix(String),
}

impl HostPattern {
    /// Whether `host` (normalised as [`RequestView::host`] gives it)
    /// matches.
    pub fn matches(&self, host: &str) -> bool {
        match self {
            HostPattern::Exact(h) => host == h,
            HostPattern::Suffix(s) => host.len() > s.len() && host.ends_with(s.as_str()),
        }
    }
}

/// A condition on a header or a query parameter: `name` and one test,
/// perhaps inverted.
#[derive(Debug, Clone)]
pub struct Condition {
    /// The header (any case) or the parameter (decoded).
    pub name: String,
    /// What its values must be.
    pub test: Test,
    /// The condition holds when the test does not.
    pub invert: bool,
}

/// What a [`Condition`] asks of the values sent under its name.
#[derive(Debug, Clone)]
pub enum Test {
    /// Some value is exactly this.
    Exact(String),
    /// Some value starts with this.
    Prefix(String),
    /// Some value matches this (linear-time) regex.
    Regex(Regex),
    /// `true`: the name is sent (with any value); `false`: it is not.
    Present(bool),
}

impl Test {
    /// Whether `values` (all those sent under the name) pass.
    fn passes<'v>(&self, mut values: impl Iterator<Item = std::borrow::Cow<'v, str>>) -> bool {
        match self {
            Test::Present(want) => values.next().is_some() == *want,
            Test::Exact(x) => values.any(|v| v == x.as_str()),
            Test::Prefix(x) => values.any(|v| v.starts_with(x.as_str())),
            Test::Regex(r) => values.any(|v| r.is_match(&v)),
        }
    }
}

impl Condition {
    /// Whether the header condition holds for `request` (a value that is
    /// not text is seen as its bytes read lossily, so it can still be
    /// matched and counted by `present`).
    pub fn holds_for_header(&self, request: &RequestView<'_>) -> bool {
        // Borrowed when the value is UTF-8 (the common case): no copy per
        // value and request.
        let values = request
            .headers(&self.name)
            .map(|v| match String::from_utf8_lossy(v) {
                std::borrow::Cow::Borrowed(t) => std::borrow::Cow::Borrowed(t.trim()),
                std::borrow::Cow::Owned(t) => std::borrow::Cow::Owned(t.trim().to_owned()),
            });
        self.test.passes(values) != self.invert
    }

    /// Whether the query condition holds for `request`.
    pub fn holds_for_query(&self, request: &RequestView<'_>) -> bool {
        self.test.passes(request.query_values(&self.name)) != self.invert
    }

    /// Whether the condition on a JSON body field holds for `request` (a
    /// body that is not JSON has no fields: `present: false` holds).
    pub fn holds_for_json(&self, request: &RequestView<'_>) -> bool {
        let value = request.body.and_then(|b| b.claim(&self.name));
        self.test.passes(value.into_iter()) != self.invert
    }
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
            hosts: vec![],
            headers: vec![],
            query: vec![],
            json: vec![],
        }
    }

    /// Whether `request`, on `route`, matches.
    ///
    /// ```
    /// use http::Method;
    /// use ratewarden_tower::policy::{Matcher, PathMatch};
    /// use ratewarden_tower::view::RequestView;
    /// let m = Matcher { path: PathMatch::Prefix("/api/".into()), case_insensitive: true, ..Matcher::any() };
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
        if !self.hosts.is_empty() {
            let Some(host) = request.host() else {
                return false;
            };
            if !self.hosts.iter().any(|h| h.matches(&host)) {
                return false;
            }
        }
        if !self.headers.iter().all(|c| c.holds_for_header(request))
            || !self.query.iter().all(|c| c.holds_for_query(request))
            || !self.json.iter().all(|c| c.holds_for_json(request))
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

/// How the config writes a key part (`identity`, `header:x-api-key`...).
impl std::fmt::Display for KeyPart {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            KeyPart::Identity => f.write_str("identity"),
            KeyPart::Method => f.write_str("method"),
            KeyPart::Path => f.write_str("path"),
            KeyPart::Header(h) => write!(f, "header:{h}"),
            KeyPart::Global => f.write_str("global"),
            KeyPart::Host => f.write_str("host"),
            KeyPart::Query(n) => write!(f, "query:{n}"),
            KeyPart::Cookie(n) => write!(f, "cookie:{n}"),
            KeyPart::Capture(n) => write!(f, "path:{n}"),
            KeyPart::Jwt(n) => write!(f, "jwt:{n}"),
            KeyPart::Json(n) => write!(f, "json:{n}"),
            KeyPart::Consumer => f.write_str("consumer"),
            KeyPart::ConsumerTier => f.write_str("consumer.tier"),
            KeyPart::Hashed(p, _) => write!(f, "hash({p})"),
        }
    }
}

/// Why a key part's text names none (see [`KeyPart`]'s `FromStr`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyPartError {
    /// A word that is no part (`identity`, `method`, `path`, `host`,
    /// `global`).
    Unknown(String),
    /// `KIND:NAME` with a kind that is none (`header`, `query`, `cookie`,
    /// `path`, `jwt`, `json`).
    UnknownKind(String, String),
    /// `KIND:` with nothing after it.
    Empty(String),
    /// `header:NAME` with a name no header may have.
    BadHeader(String),
}

impl KeyPartError {
    /// The parts without a name.
    pub const PLAIN: [&'static str; 7] = [
        "identity",
        "method",
        "path",
        "global",
        "host",
        "consumer",
        "consumer.tier",
    ];
    /// The kinds of the parts with one.
    pub const NAMED: [&'static str; 6] = ["header", "query", "cookie", "path", "jwt", "json"];
}

impl std::fmt::Display for KeyPartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let all = "key parts are identity, method, path, host, global, consumer, header:NAME, \
                   query:NAME, cookie:NAME, path:NAME (a capture of the rule's path_regex), jwt:CLAIM \
                   and json:FIELD (the JSON request body's)";
        match self {
            KeyPartError::Unknown(t) => write!(f, "`{t}`: {all}"),
            KeyPartError::UnknownKind(k, n) => write!(f, "`{k}:{n}`: {all}"),
            KeyPartError::Empty(k) => write!(f, "`{k}:` names nothing after `{k}:`"),
            KeyPartError::BadHeader(t) => write!(f, "`{t}`: bad header name"),
        }
    }
}

impl std::error::Error for KeyPartError {}

/// A key part as a config writes it, the inverse of its `Display` (but
/// `hash(..)`, which the front end makes with its own hasher).
///
/// ```
/// use ratewarden_tower::policy::{KeyPart, KeyPartError};
/// let part: KeyPart = "header:x-api-key".parse().unwrap();
/// assert_eq!(part.to_string(), "header:x-api-key");
/// assert_eq!("path:id".parse::<KeyPart>().unwrap(), KeyPart::Capture("id".into()));
/// assert_eq!("ip".parse::<KeyPart>(), Err(KeyPartError::Unknown("ip".into())));
/// assert_eq!("query:".parse::<KeyPart>(), Err(KeyPartError::Empty("query".into())));
/// ```
impl std::str::FromStr for KeyPart {
    type Err = KeyPartError;

    fn from_str(text: &str) -> Result<Self, KeyPartError> {
        match text {
            "identity" => return Ok(KeyPart::Identity),
            "method" => return Ok(KeyPart::Method),
            "path" => return Ok(KeyPart::Path),
            "global" => return Ok(KeyPart::Global),
            "host" => return Ok(KeyPart::Host),
            "consumer" => return Ok(KeyPart::Consumer),
            "consumer.tier" => return Ok(KeyPart::ConsumerTier),
            _ => {}
        }
        let Some((kind, name)) = text.split_once(':') else {
            return Err(KeyPartError::Unknown(text.to_owned()));
        };
        if name.is_empty() {
            return Err(KeyPartError::Empty(kind.to_owned()));
        }
        match kind {
            "header" => HeaderName::from_bytes(name.as_bytes())
                .map(KeyPart::Header)
                .map_err(|_| KeyPartError::BadHeader(text.to_owned())),
            "query" => Ok(KeyPart::Query(name.to_owned())),
            "cookie" => Ok(KeyPart::Cookie(name.to_owned())),
            "path" => Ok(KeyPart::Capture(name.to_owned())),
            "jwt" => Ok(KeyPart::Jwt(name.to_owned())),
            "json" => Ok(KeyPart::Json(name.to_owned())),
            _ => Err(KeyPartError::UnknownKind(kind.to_owned(), name.to_owned())),
        }
    }
}

/// What a matcher takes, in words (the gateway's banner and `/v1/rules`):
/// `GET,POST paths /v2/* on hosts api.example.com|*.partner.example if
/// header x-plan = pro and query format = json`. The one place each match
/// field is described.
impl std::fmt::Display for Matcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.methods.is_empty() {
            let methods: Vec<&str> = self.methods.iter().map(Method::as_str).collect();
            write!(f, "{} ", methods.join(","))?;
        }
        match &self.path {
            PathMatch::Any => f.write_str("every path")?,
            PathMatch::Exact(p) => write!(f, "path {p}")?,
            PathMatch::Prefix(p) => write!(f, "paths {p}*")?,
            PathMatch::Regex(re) => write!(f, "paths ~ {re}")?,
        }
        if let Some(r) = &self.route {
            write!(f, " on route {r}")?;
        }
        if !self.hosts.is_empty() {
            let hosts: Vec<String> = self
                .hosts
                .iter()
                .map(|h| match h {
                    HostPattern::Exact(n) => n.clone(),
                    HostPattern::Suffix(s) => format!("*{s}"),
                })
                .collect();
            write!(f, " for hosts {}", hosts.join("|"))?;
        }
        let conditions = self
            .headers
            .iter()
            .map(|c| ("header", c))
            .chain(self.query.iter().map(|c| ("query", c)))
            .chain(self.json.iter().map(|c| ("json", c)));
        for (i, (kind, c)) in conditions.enumerate() {
            f.write_str(if i == 0 { " if " } else { " and " })?;
            if c.invert {
                f.write_str("not ")?;
            }
            match &c.test {
                Test::Exact(x) => write!(f, "{kind} {} = {x}", c.name)?,
                Test::Prefix(x) => write!(f, "{kind} {} = {x}*", c.name)?,
                Test::Regex(re) => write!(f, "{kind} {} ~ {re}", c.name)?,
                Test::Present(true) => write!(f, "{kind} {} sent", c.name)?,
                Test::Present(false) => write!(f, "{kind} {} absent", c.name)?,
            }
        }
        Ok(())
    }
}

/// The spec's `failure_status` default: 400-499 except 429.
pub const DEFAULT_FAILURES: [(u16, u16); 2] = [(400, 428), (430, 499)];

/// The gRPC status codes that count as failures by default: the client's
/// errors (INVALID_ARGUMENT, NOT_FOUND, ALREADY_EXISTS, PERMISSION_DENIED,
/// FAILED_PRECONDITION, OUT_OF_RANGE, UNAUTHENTICATED).
pub const DEFAULT_GRPC_FAILURES: [u16; 7] = [3, 5, 6, 7, 9, 11, 16];

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
    /// For a gRPC answer, the `grpc-status` codes that count as failures
    /// (`failure_grpc_status`); 0 (OK) is a success, any other code
    /// leaves the key alone.
    pub failure_grpc: Vec<u16>,
    /// A request without one of the key's parts.
    pub missing: MissingPart,
    /// Parameters chosen by a request value (`tiers:`); `rule` is then
    /// the default tier's (or, when that is unlimited, the first limited
    /// tier's): the rule's name, and the base of its overrides.
    pub tiers: Option<Box<Tiers>>,
    /// Charged by what the answer cost, not per request (`cost: {from:
    /// ...}`): see [`ByAnswer`].
    pub by_answer: Option<ByAnswer>,
}

/// A rule charged by what its answers cost (tokens, money, a cost the
/// upstream names): admission reserves an estimate, and the end phase
/// replaces the reservation by the answer's cost, charging the difference
/// or giving it back ([`Settlement::on_end`](crate::settle::Settlement::on_end)).
/// The units in flight plus the units settled never exceed the limit but
/// by what an answer's cost exceeds its reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByAnswer {
    /// Units reserved at admission where the front end estimates none
    /// (at least 1: a request needs a unit left to go on).
    pub reserve: u64,
}

/// A rule's tiers: its parameters chosen by one request value (a plan
/// named in a header or a token's claim), each counting in its own state.
#[derive(Debug, Clone)]
pub struct Tiers {
    /// The value (a key part: `header:X-Plan`, `jwt:plan`...).
    pub from: KeyPart,
    /// The tier of a request without the value, or with one no tier has
    /// (an index into `values`).
    pub default: usize,
    /// The tiers.
    pub values: Vec<Tier>,
}

/// One tier: its name and its rule (`None`: `unlimited`).
#[derive(Debug, Clone)]
pub struct Tier {
    /// Its name, as the value names it.
    pub name: String,
    /// Its parameters, compiled (a [`ratewarden::Variant::Tier`]).
    pub rule: Option<Rule>,
}

impl Tiers {
    /// The tier a request's value chooses (the default for none, or for a
    /// value no tier has).
    pub fn pick(&self, value: Option<&str>) -> usize {
        value
            .and_then(|v| self.values.iter().position(|t| t.name == v))
            .unwrap_or(self.default)
    }
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
            failure_grpc: DEFAULT_GRPC_FAILURES.to_vec(),
            missing: MissingPart::Identity,
            tiers: None,
            by_answer: None,
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
    /// the identity hold no `:` (each is escaped: see
    /// [`crate::admission::key_part`]; an identity may hold some, as an
    /// IPv6 group does); a key with too few parts is its own group.
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
            overrides: None,
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
