//! The one admission path: every front end (the tower layer, the
//! gateway's two HTTP paths, `/v1/check`, `/v1/explain`, `/v1/keys`) hands a
//! request's facts to a [`Policy`] here and renders what comes back. A
//! second copy of identity, matching or decision logic would drift from
//! this one (it did: `explain` once ignored `deny`).
//!
//! The stages, each usable alone by a front end that needs to show them
//! (`explain` shows the keys before it decides):
//!
//! 1. [`Policy::identify`]: who the client is. The identity is bounded to
//!    [`MAX_IDENTITY_BYTES`], an address identity is IPv6-grouped (also when
//!    the admin API is given one), a missing one follows [`Missing`], `deny`
//!    refuses and `allow` exempts.
//! 2. [`Policy::matching`]: the rules the request falls under, each with its
//!    key and Redis Cluster group.
//! 3. [`Matched::decide`]: one store call for all of them, all-or-nothing.
//! 4. [`Admitted::settle`] and [`Admitted::release`] once the answer is known
//!    and the request has ended: `count: failures` charged or cleared per
//!    each rule's `failure_status`, `concurrency` leases given back.

use std::net::IpAddr;
use std::sync::Arc;

use http::{HeaderName, StatusCode};
use ratewarden::{Decision, Limiter, Mode, Op, Pending, Rule, Store, StoreError};

pub use crate::settle::{AnswerCost, Held, Owed, Settlement};
use smallvec::SmallVec;

use crate::overrides::Applied;
use crate::policy::{IdentitySource, KeyPart, Missing, MissingPart, PathMatch, Policy, PolicyRule};
use crate::problem::{problem, rejection};
use crate::view::RequestView;
use std::borrow::Cow;

/// Longest identity (and header-taken key part) kept, in bytes, cut at a
/// character boundary: a client cannot grow the store's key names without
/// bound.
pub const MAX_IDENTITY_BYTES: usize = 256;

/// `s` cut to [`MAX_IDENTITY_BYTES`] at a character boundary.
///
/// ```
/// use ratewarden_tower::admission::{bounded, MAX_IDENTITY_BYTES};
/// let long = "é".repeat(200); // 400 bytes
/// let cut = bounded(&long);
/// assert_eq!(cut.len(), MAX_IDENTITY_BYTES);
/// assert!(cut.chars().all(|c| c == 'é'));
/// ```
pub fn bounded(s: &str) -> &str {
    if s.len() <= MAX_IDENTITY_BYTES {
        return s;
    }
    let mut end = MAX_IDENTITY_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The mark that begins every stand-in the admission path makes (the
/// identity for a missing key part, `anonymous`, an address standing in for
/// a missing header): every `%` in a value a client sends is escaped as
/// `%25` (see [`key_part`] and [`client_identity`]), so a client value never
/// begins with `%` followed by a letter, and no client can pose as a
/// stand-in, or make its value share another client's stand-in bucket.
pub const STAND_IN: char = '%';

/// The stand-in for every request that lacks a value, where `anonymous`
/// says they share one bucket.
pub const ANONYMOUS: &str = "%anonymous";

/// `value` as a part of a key or an identity a client gave: `%` escaped
/// (see [`STAND_IN`]), and `:` too when `colons` (a part of a key joined by
/// `:`); bounded to [`MAX_IDENTITY_BYTES`] first.
fn escaped(out: &mut String, value: &str, colons: bool) {
    let value = bounded(value);
    let special = |c: char| c == '%' || (colons && c == ':');
    if !value.contains(special) {
        out.push_str(value);
        return;
    }
    for c in value.chars() {
        match c {
            ':' if colons => out.push_str("%3A"),
            '%' => out.push_str("%25"),
            c => out.push(c),
        }
    }
}

/// An identity a client gave (a header's value, a token's claim): bounded,
/// and `%` escaped so that it never equals a stand-in ([`STAND_IN`]).
///
/// ```
/// use ratewarden_tower::admission::client_identity;
/// assert_eq!(client_identity("alice"), "alice");
/// assert_eq!(client_identity("%anonymous"), "%25anonymous");
/// ```
pub fn client_identity(value: &str) -> String {
    let mut out = String::with_capacity(value.len().min(MAX_IDENTITY_BYTES));
    escaped(&mut out, value, false);
    out
}

/// Where a request's identity comes from in this call.
#[derive(Debug, Clone, Copy)]
pub enum Identity<'a> {
    /// As the policy's [`IdentitySource`] says (the proxy).
    Resolve,
    /// Given: by a key extractor (the tower layer; `None` when it found
    /// none), or by an admin API caller. With an address source, an
    /// identity that is an address is grouped as the proxy would.
    Given(Option<&'a str>),
}

/// What a front end knows of a request: the one view of it, and what the
/// front end adds.
#[derive(Clone, Copy)]
pub struct Facts<'a> {
    /// The request.
    pub request: RequestView<'a>,
    /// Where the identity comes from.
    pub identity: Identity<'a>,
    /// The route the request takes, when the front end has routes (rules
    /// may match on it).
    pub route: Option<&'a str>,
    /// What the request is estimated to cost each rule charged by its
    /// answer ([`crate::policy::ByAnswer`]), reserved at admission (`None`,
    /// or `None` for a rule: its fixed [`reserve`](crate::policy::ByAnswer::reserve)).
    pub reserve: Option<&'a Reserve<'a>>,
}

/// A front end's estimate of what a request will cost a rule charged by
/// its answer (the gateway's: an LLM request's input and maximum output).
pub type Reserve<'a> = dyn Fn(&PolicyRule) -> Option<u64> + Sync + 'a;

impl std::fmt::Debug for Facts<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Facts")
            .field("request", &self.request)
            .field("identity", &self.identity)
            .field("route", &self.route)
            .field("reserve", &self.reserve.is_some())
            .finish()
    }
}

/// Who a client is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Who {
    /// The identity rules key on (bounded; an address IPv6-grouped).
    pub identity: String,
    /// The client's address, when known.
    pub ip: Option<IpAddr>,
    /// `false` when no rule applies to it: in `allow`, or without an
    /// identity under [`Missing::Skip`].
    pub limited: bool,
}

/// Why a request does not go on.
#[derive(Debug)]
pub enum Refusal {
    /// Over a limit: answered with the policy's status, rate-limit headers
    /// and the decision's problem body.
    Limited(Decision),
    /// In `deny`: 403.
    Denied(String),
    /// No identity, under [`Missing::Reject`]: 400. The header, if one is
    /// expected.
    NoIdentity(Option<HeaderName>),
    /// The store could not decide and `on_error: deny` says so: 503.
    Unavailable(StoreError),
    /// No trusted token where the front end requires one: 401 (the
    /// gateway's `jwt: {required: true}`).
    Unauthenticated,
    /// No API key that names a consumer where one is required (the
    /// gateway's `consumers: {unknown: reject}`, or an identity `from:
    /// consumer` with `missing: reject`): 401. An unknown, revoked or
    /// expired key is this too.
    NoConsumer,
    /// A rule with `missing: reject` needs a key part the request lacks:
    /// 400, naming the rule and the part.
    MissingPart {
        /// The rule.
        rule: String,
        /// The part, as the config writes it.
        part: String,
    },
}

impl Refusal {
    /// The status it is answered with; `limited` for [`Refusal::Limited`].
    pub fn status(&self, limited: StatusCode) -> StatusCode {
        match self {
            Refusal::Limited(d) => Self::limited_status(d, limited),
            Refusal::Denied(_) => StatusCode::FORBIDDEN,
            Refusal::NoIdentity(_) | Refusal::MissingPart { .. } => StatusCode::BAD_REQUEST,
            Refusal::Unauthenticated | Refusal::NoConsumer => StatusCode::UNAUTHORIZED,
            Refusal::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The status of a refusal over a limit: the refusing rule's
    /// `status`, else `default`.
    pub fn limited_status(d: &Decision, default: StatusCode) -> StatusCode {
        StatusCode::from_u16(d.status(default.as_u16())).unwrap_or(default)
    }

    /// The problem body it is answered with (RFC 9457); for
    /// [`Refusal::Limited`], the decision's.
    pub fn problem(&self, limited: StatusCode) -> String {
        let status = self.status(limited).as_u16();
        match self {
            Refusal::Limited(d) => rejection(d, status),
            Refusal::Denied(id) => problem(status, Some(&format!("client {id} is denied"))),
            Refusal::NoIdentity(Some(h)) => {
                problem(status, Some(&format!("header {h} is required")))
            }
            Refusal::NoIdentity(None) => {
                problem(status, Some("the request carries no rate-limit key"))
            }
            Refusal::Unavailable(e) => {
                problem(status, Some(&format!("rate limiter unavailable: {e}")))
            }
            Refusal::Unauthenticated => problem(
                status,
                Some("a valid token is required (missing, expired or not trusted)"),
            ),
            Refusal::NoConsumer => problem(
                status,
                Some("a valid API key is required (missing, unknown, revoked or expired)"),
            ),
            Refusal::MissingPart { rule, part } => problem(
                status,
                Some(&format!(
                    "rule `{rule}` needs `{part}`, which the request does not carry"
                )),
            ),
        }
    }
}

impl Policy {
    /// Stage 1: who the client is.
    pub fn identify(&self, facts: &Facts<'_>) -> Result<Who, Refusal> {
        let ip = match (self.identity.client_ip(), facts.request.peer) {
            (Some(c), Some(peer)) => Some(c.resolve(peer, facts.request.fields)),
            (_, peer) => peer,
        };
        let found: Option<String> = match (facts.identity, &self.identity) {
            (Identity::Given(given), source) => {
                given.map(|g| self.given_identity(g.trim(), source))
            }
            (Identity::Resolve, IdentitySource::Address(c)) => ip.map(|ip| c.key(ip)),
            (Identity::Resolve, IdentitySource::Header { name, .. }) => facts
                .request
                .header_text(name.as_str())
                .map(client_identity),
            (Identity::Resolve, IdentitySource::Claim { claim, .. }) => facts
                .request
                .claims
                .and_then(|c| c.claim(claim))
                .and_then(|v| {
                    let v = v.trim();
                    (!v.is_empty()).then(|| client_identity(v))
                }),
            (Identity::Resolve, IdentitySource::Consumer { .. }) => {
                facts.request.consumer.map(|c| client_identity(&c.name))
            }
            (Identity::Resolve, IdentitySource::Given { .. }) => None,
        };
        let identity = match found {
            Some(id) => id,
            None => {
                let missing = match &self.identity {
                    IdentitySource::Address(_) => Missing::Ip,
                    IdentitySource::Header { missing, .. }
                    | IdentitySource::Claim { missing, .. }
                    | IdentitySource::Consumer { missing, .. }
                    | IdentitySource::Given { missing } => *missing,
                };
                match missing {
                    Missing::Skip => {
                        return Ok(Who {
                            identity: String::new(),
                            ip,
                            limited: false,
                        });
                    }
                    // The address itself where identities are addresses;
                    // where they are a header's or a claim's, the address
                    // marked as standing in, so that no client can send
                    // another's address as its identity and spend its
                    // bucket.
                    Missing::Ip => match (ip, &self.identity) {
                        (Some(ip), IdentitySource::Address(c)) => c.key(ip),
                        (Some(ip), source) => {
                            let c = source.client_ip().cloned().unwrap_or_default();
                            format!("{STAND_IN}ip={}", c.key(ip))
                        }
                        (None, _) => ANONYMOUS.to_owned(),
                    },
                    Missing::Anonymous => ANONYMOUS.to_owned(),
                    // No API key that names a consumer: 401, as an
                    // unknown key is.
                    Missing::Reject if matches!(self.identity, IdentitySource::Consumer { .. }) => {
                        return Err(Refusal::NoConsumer);
                    }
                    Missing::Reject => {
                        let header = match &self.identity {
                            IdentitySource::Header { name, .. } => Some(name.clone()),
                            _ => None,
                        };
                        return Err(Refusal::NoIdentity(header));
                    }
                }
            }
        };
        if self.deny.iter().any(|p| p.matches(ip, &identity)) {
            return Err(Refusal::Denied(identity));
        }
        let limited = !self.allow.iter().any(|p| p.matches(ip, &identity));
        Ok(Who {
            identity,
            ip,
            limited,
        })
    }

    /// An identity given (by an extractor or an admin caller), as the proxy
    /// would have made it: bounded, and with an address source, an address
    /// grouped by the IPv6 prefix (`2001:db8::1` is `2001:db8::/64`).
    fn given_identity(&self, given: &str, source: &IdentitySource) -> String {
        if let IdentitySource::Address(c) = source
            && let Ok(ip) = given.parse::<IpAddr>()
        {
            return c.key(ip);
        }
        bounded(given).to_owned()
    }

    /// A rule's key given by an admin caller, as the proxy would have made
    /// it: for a rule keyed by the identity alone, the identity's
    /// treatment (see [`Policy::identify`]); else bounded.
    pub fn given_key(&self, rule: &PolicyRule, key: &str) -> String {
        match rule.key.as_slice() {
            [KeyPart::Identity] => self.given_identity(key.trim(), &self.identity),
            // A key of one hashed part is given in clear, and hashed as
            // the proxy hashes it (a hash given as such is kept).
            [KeyPart::Hashed(_, h)] if !h.is_hash(key) => h.hash(key),
            _ => key.to_owned(),
        }
    }

    /// Stage 2: the rules `facts` falls under, with their keys. None for a
    /// client that is not limited. `Err` when a rule with `missing:
    /// reject` lacks a key part.
    pub fn matching(&self, facts: &Facts<'_>, who: Who) -> Result<Matched<'_>, Refusal> {
        let mut keyed = SmallVec::<[Keyed; 2]>::new();
        let mut reserved: Option<Box<Reserved>> = None;
        if who.limited {
            for (i, r) in self.rules.iter().enumerate() {
                if !r.matcher.matches(&facts.request, facts.route) {
                    continue;
                }
                let key = if r.key == [KeyPart::Identity] {
                    None
                } else {
                    match key_of(r, &who.identity, facts) {
                        Ok(k) => Some(k),
                        Err(Lacking::Skip) => continue,
                        Err(Lacking::Reject(part)) => {
                            return Err(Refusal::MissingPart {
                                rule: r.rule.name().to_owned(),
                                part: part.to_string(),
                            });
                        }
                    }
                };
                let Some(choice) = self.choose(r, key.as_deref().unwrap_or(&who.identity), facts)
                else {
                    // An unlimited tier or override: not limited by it.
                    continue;
                };
                if let Some(by) = r.by_answer {
                    let units = facts.reserve.and_then(|f| f(r)).unwrap_or(by.reserve);
                    reserved
                        .get_or_insert_default()
                        .push((i as u32, units.max(1)));
                }
                keyed.push(Keyed {
                    rule: i as u32,
                    key,
                    by_identity: r.grouped_by_identity(),
                    choice,
                });
            }
            // Keys shared by clients last: on a cluster they are other slots,
            // decided after the client's own (see the README).
            keyed.sort_by_key(|k| !k.by_identity);
        }
        Ok(Matched {
            policy: self,
            who,
            keyed,
            reserved,
        })
    }

    /// Which parameters `r` decides `key` with: its override, else the
    /// tier the request's value picks, else its own; `None` when that is
    /// unlimited.
    fn choose(&self, r: &PolicyRule, key: &str, facts: &Facts<'_>) -> Option<Choice> {
        if let Some(o) = self.overrides.as_deref().and_then(|o| o.get(&r.rule, key)) {
            return match o {
                Applied::Limited(rule) => Some(Choice::Override(rule)),
                Applied::Unlimited => None,
            };
        }
        let Some(tiers) = &r.tiers else {
            return Some(Choice::Rule);
        };
        let value = part_value(&tiers.from, r, &facts.request);
        let i = tiers.pick(value.as_deref());
        tiers.values[i]
            .rule
            .as_ref()
            .map(|_| Choice::Tier(i as u16))
    }

    /// Stages 1 to 3 for one request of `weight`.
    pub async fn admit<S: Store>(
        &self,
        limiter: &Limiter<S>,
        facts: &Facts<'_>,
        weight: u64,
        mode: Mode,
    ) -> Result<Admitted<'_>, Refusal> {
        let who = self.identify(facts)?;
        // Built in place and decided through `&mut`: an admission moved
        // into and out of nested futures is copied at each step.
        let mut admitted = Admitted::new(self.matching(facts, who)?);
        admitted.decide(limiter, weight, mode).await?;
        Ok(admitted)
    }

    /// One named rule on one key, as an admin caller asks (`/v1/check`,
    /// `/v1/keys`): the key treated as the proxy would make it, grouped as
    /// the proxy groups it (`identity` names the group of a key with more
    /// parts than the identity).
    pub fn named<'p>(
        &'p self,
        rule: &str,
        key: &str,
        identity: Option<&str>,
    ) -> Result<Matched<'p>, NamedError> {
        self.named_in(rule, key, identity, None)
    }

    /// [`Self::named`] in the tier `tier` names (a consumer's), where the
    /// rule has tiers; `Ok(None)` when that tier is unlimited.
    pub fn named_in_tier<'p>(
        &'p self,
        rule: &str,
        key: &str,
        identity: Option<&str>,
        tier: Option<&str>,
    ) -> Result<Option<Matched<'p>>, NamedError> {
        let r = self
            .rule(rule)
            .ok_or_else(|| NamedError::NoRule(rule.to_owned()))?;
        if let Some(t) = &r.tiers
            && t.values[t.pick(tier)].rule.is_none()
        {
            return Ok(None);
        }
        self.named_in(rule, key, identity, tier).map(Some)
    }

    fn named_in<'p>(
        &'p self,
        rule: &str,
        key: &str,
        identity: Option<&str>,
        tier: Option<&str>,
    ) -> Result<Matched<'p>, NamedError> {
        let (i, r) = self
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| r.rule.name() == rule)
            .ok_or_else(|| NamedError::NoRule(rule.to_owned()))?;
        let key = self.given_key(r, key);
        let identity = identity.map(|id| self.given_identity(id.trim(), &self.identity));
        let group = r
            .group(&key, identity.as_deref())
            .map_err(NamedError::Group)?;
        let mut keyed = SmallVec::new();
        let identity = match identity {
            Some(id) => id,
            None if r.grouped_by_identity() => group.clone(),
            None => String::new(),
        };
        let choice = match self.overrides.as_deref().and_then(|o| o.get(&r.rule, &key)) {
            Some(Applied::Limited(rule)) => Choice::Override(rule),
            _ => match &r.tiers {
                Some(t) if t.values[t.pick(tier)].rule.is_some() => {
                    Choice::Tier(t.pick(tier) as u16)
                }
                _ => Choice::Rule,
            },
        };
        keyed.push(Keyed {
            rule: i as u32,
            key: (key != identity).then_some(key),
            by_identity: r.grouped_by_identity() && group == identity,
            choice,
        });
        Ok(Matched {
            policy: self,
            who: Who {
                identity,
                ip: None,
                limited: true,
            },
            keyed,
            reserved: None,
        })
    }
}

/// Why a named rule and key cannot be looked at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NamedError {
    /// No rule has that name (404).
    NoRule(String),
    /// The key's group cannot be told (400).
    Group(String),
}

impl std::fmt::Display for NamedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NamedError::NoRule(r) => write!(f, "no rule named `{r}`"),
            NamedError::Group(m) => f.write_str(m),
        }
    }
}

/// Why a rule's key could not be made.
enum Lacking<'r> {
    /// `missing: skip`: the rule does not apply.
    Skip,
    /// `missing: reject`: this part is lacking.
    Reject(&'r KeyPart),
}

/// A rule's key: its parts joined by `:`, each request-given part bounded
/// and escaped ([`key_part`]); a part the request lacks as the rule's
/// [`MissingPart`] says.
fn key_of<'r>(r: &'r PolicyRule, identity: &str, facts: &Facts<'_>) -> Result<String, Lacking<'r>> {
    let mut out = String::new();
    for (i, p) in r.key.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        let (part, hasher) = match p {
            KeyPart::Hashed(inner, h) => (&**inner, Some(h)),
            KeyPart::Identity => {
                out.push_str(identity);
                continue;
            }
            other => (other, None),
        };
        match (part_value(part, r, &facts.request), hasher, r.missing) {
            // The secret never enters the key: only its hash, of the whole
            // value (two tokens that share their first bytes are two
            // keys; only the request's size bounds the value).
            (Some(v), Some(h), _) => out.push_str(&h.hash(&v)),
            (Some(v), None, _) => key_part(&mut out, &v),
            // A stand-in, marked: no value a client sends makes it.
            (None, _, MissingPart::Identity) => {
                out.push(STAND_IN);
                out.push_str("id=");
                key_part(&mut out, identity);
            }
            (None, _, MissingPart::Anonymous) => out.push_str(ANONYMOUS),
            (None, _, MissingPart::Skip) => return Err(Lacking::Skip),
            (None, _, MissingPart::Reject) => return Err(Lacking::Reject(p)),
        }
    }
    Ok(out)
}

/// The value of a request-given key part (not the identity, not a hashed
/// part): what a key is made of, and what picks a tier. `None` when the
/// request lacks it (an empty value counts as lacking).
fn part_value<'a>(
    part: &KeyPart,
    r: &'a PolicyRule,
    request: &'a RequestView<'a>,
) -> Option<Cow<'a, str>> {
    match part {
        KeyPart::Identity | KeyPart::Hashed(..) => None,
        KeyPart::Method => Some(request.method.as_str().into()),
        KeyPart::Path => Some(request.path.into()),
        KeyPart::Global => Some("global".into()),
        KeyPart::Header(h) => request.header_text(h.as_str()).map(Cow::Borrowed),
        KeyPart::Host => request.host(),
        KeyPart::Query(n) => request.query_values(n).next().filter(|v| !v.is_empty()),
        KeyPart::Cookie(n) => request
            .cookie(n)
            .filter(|v| !v.is_empty())
            .map(Cow::Borrowed),
        KeyPart::Capture(n) => match &r.matcher.path {
            PathMatch::Regex(re) => re
                .captures(request.path)
                .and_then(|c| c.name(n))
                .map(|m| Cow::Borrowed(m.as_str()))
                .filter(|v| !v.is_empty()),
            _ => None,
        },
        KeyPart::Jwt(c) => request
            .claims
            .and_then(|claims| claims.claim(c))
            .filter(|v| !v.is_empty()),
        KeyPart::Json(f) => request
            .body
            .and_then(|body| body.claim(f))
            .filter(|v| !v.is_empty()),
        KeyPart::Consumer => request.consumer.map(|c| Cow::Borrowed(c.name.as_str())),
        KeyPart::ConsumerTier => request
            .consumer
            .and_then(|c| c.tier.as_deref())
            .map(Cow::Borrowed),
    }
}

/// Appends a request-given key part to `out`: bounded as identities are,
/// `%` and `:` escaped (`%25`, `%3A`), so that no part holds the `:` that
/// joins them and no two splits of a key can be confused.
///
/// ```
/// let mut k = String::from("GET:");
/// ratewarden_tower::admission::key_part(&mut k, "a:b%c");
/// assert_eq!(k, "GET:a%3Ab%25c");
/// ```
pub fn key_part(out: &mut String, value: &str) {
    escaped(out, value, true);
}

/// A matched rule's key and group for one request. Most keys are the
/// identity alone (`key: [identity]`, the default) and most groups are the
/// identity: those borrow it rather than copy it per rule and request.
#[derive(Debug, Clone)]
struct Keyed {
    /// Index into the policy's rules (u32 keeps `Keyed` at 32 bytes).
    rule: u32,
    /// `None`: the identity itself.
    key: Option<String>,
    /// The group is the identity, else the key (see [`PolicyRule::group`]).
    by_identity: bool,
    /// Which of the rule's parameters decide it.
    choice: Choice,
}

/// Which parameters a matched rule decides with: its own, a tier's, or
/// its key's override.
#[derive(Debug, Clone)]
enum Choice {
    Rule,
    Tier(u16),
    Override(Rule),
}

impl Keyed {
    /// The rule it is decided by.
    fn rule<'a>(&'a self, policy: &'a Policy) -> &'a Rule {
        let r = &policy.rules[self.rule as usize];
        match &self.choice {
            Choice::Rule => &r.rule,
            Choice::Tier(t) => r
                .tiers
                .as_ref()
                .and_then(|tiers| tiers.values[*t as usize].rule.as_ref())
                .unwrap_or(&r.rule),
            Choice::Override(o) => o,
        }
    }

    fn key<'a>(&'a self, identity: &'a str) -> &'a str {
        self.key.as_deref().unwrap_or(identity)
    }

    fn group<'a>(&'a self, identity: &'a str) -> &'a str {
        if self.by_identity {
            identity
        } else {
            self.key(identity)
        }
    }
}

/// The rules a request falls under, with their keys.
#[derive(Debug, Clone)]
pub struct Matched<'p> {
    policy: &'p Policy,
    who: Who,
    /// Inline for up to 2 matching rules: no allocation per request for
    /// most. (Small on purpose: an admission is moved through a few
    /// futures per request, and each move copies it.)
    keyed: SmallVec<[Keyed; 2]>,
    /// What is reserved of each matching rule charged by its answer (by
    /// its index): boxed, and only when there is one.
    reserved: Option<Box<Reserved>>,
}

/// Units reserved per rule (by index) charged by the answer.
type Reserved = SmallVec<[(u32, u64); 2]>;

impl<'p> Matched<'p> {
    /// Who the client is.
    pub fn who(&self) -> &Who {
        &self.who
    }

    /// The matching rules with their keys, in decision order, each with
    /// the rule it is decided by (its own, a tier's, an override).
    pub fn keys(&self) -> impl Iterator<Item = (&'p PolicyRule, &Rule, &str)> {
        let id = &self.who.identity;
        let policy = self.policy;
        self.keyed
            .iter()
            .map(move |k| (&policy.rules[k.rule as usize], k.rule(policy), k.key(id)))
    }

    /// The store ops of the matching rules (a rule charged by its answer
    /// weighing what is reserved of it).
    pub fn ops(&self) -> SmallVec<[Op<'_>; 2]> {
        let id = &self.who.identity;
        self.keyed
            .iter()
            .map(|k| {
                Op::grouped(k.rule(self.policy), k.key(id), k.group(id))
                    .weighing(self.reserved_of(k.rule).unwrap_or(0))
            })
            .collect()
    }

    /// What is reserved of the rule at `index`, if it is charged by its
    /// answer and matched.
    fn reserved_of(&self, index: u32) -> Option<u64> {
        self.reserved
            .as_deref()?
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, u)| *u)
    }

    /// What is reserved of `rule` (a rule charged by its answer), if it
    /// matched.
    pub fn reserved(&self, rule: &PolicyRule) -> Option<u64> {
        let i = self
            .policy
            .rules
            .iter()
            .position(|r| std::ptr::eq(r, rule))?;
        self.reserved_of(i as u32)
    }

    /// Stage 3: decides every matching rule in one store call, for a
    /// request of `weight`; in [`Mode::Peek`] nothing is recorded. `Err` is
    /// a rejection or a store that could not decide.
    pub async fn decide<S: Store>(
        self,
        limiter: &Limiter<S>,
        weight: u64,
        mode: Mode,
    ) -> Result<Admitted<'p>, Refusal> {
        let mut admitted = Admitted::new(self);
        admitted.decide(limiter, weight, mode).await?;
        Ok(admitted)
    }
}

/// Why ops already built did not go through: stage 3's only refusals (a
/// request's identity and `allow`/`deny` are stage 1's, which ops built
/// elsewhere, Envoy's descriptors, never pass).
#[derive(Debug)]
pub enum OpsRefusal {
    /// Over a limit, with the decision.
    Limited(Decision),
    /// The store could not decide.
    Unavailable(StoreError),
}

impl From<OpsRefusal> for Refusal {
    fn from(r: OpsRefusal) -> Self {
        match r {
            OpsRefusal::Limited(d) => Refusal::Limited(d),
            OpsRefusal::Unavailable(e) => Refusal::Unavailable(e),
        }
    }
}

/// Stage 3 on ops already built, for every front end (the proxy's matched
/// rules, Envoy's descriptors): one store call for all of them,
/// all-or-nothing, of `weight` (an op's own weight wins); the decision and,
/// in [`Mode::Apply`], what stays to settle or release. `Err` is a
/// rejection (with its decision) or a store that could not decide.
pub async fn decide_ops<S: Store>(
    limiter: &Limiter<S>,
    ops: &[Op<'_>],
    weight: u64,
    mode: Mode,
) -> Result<(Decision, Option<Pending>), OpsRefusal> {
    let verdicts = limiter
        .store()
        .decide(ops, weight, mode)
        .await
        .map_err(OpsRefusal::Unavailable)?;
    let a = ratewarden::Admission::from_verdicts(ops, &verdicts, weight, mode);
    if !a.decision.allowed {
        return Err(OpsRefusal::Limited(a.decision));
    }
    Ok((a.decision, a.pending))
}

/// A request the policy let through.
#[derive(Debug)]
pub struct Admitted<'p> {
    /// The decision, for the response's rate-limit headers; `None` when no
    /// rule matched.
    pub decision: Option<Decision>,
    matched: Matched<'p>,
    /// Boxed: present only with `count: failures` or `concurrency` rules.
    pending: Option<Box<Pending>>,
}

impl<'p> Admitted<'p> {
    fn new(matched: Matched<'p>) -> Self {
        Self {
            decision: None,
            matched,
            pending: None,
        }
    }

    /// Stage 3 (see [`Matched::decide`]), recording the decision here.
    async fn decide<S: Store>(
        &mut self,
        limiter: &Limiter<S>,
        weight: u64,
        mode: Mode,
    ) -> Result<(), Refusal> {
        if self.matched.keyed.is_empty() {
            return Ok(());
        }
        let ops = self.matched.ops();
        let (d, pending) = decide_ops(limiter, &ops, weight, mode).await?;
        self.pending = pending.map(Box::new);
        drop(ops);
        self.decision = Some(d);
        Ok(())
    }

    /// The rules and keys it was decided under.
    pub fn matched(&self) -> &Matched<'p> {
        &self.matched
    }

    /// Who the client is.
    pub fn who(&self) -> &Who {
        &self.matched.who
    }

    /// Stage 4: what this request's answer settles once it has ended, owned
    /// (a streamed answer ends after the request's scope; gRPC's status
    /// comes in its trailers): its `count: failures` rules, each decided
    /// rule with its key and group. `None` when nothing awaits the answer.
    pub fn settlement<S: Store>(&self, limiter: &Arc<Limiter<S>>) -> Option<Settlement<S>> {
        let awaits = self.pending.as_deref().is_some_and(Pending::awaits_outcome);
        if !awaits && self.matched.reserved.is_none() {
            return None;
        }
        let id = &self.matched.who.identity;
        let owed: Vec<Owed> = self
            .matched
            .keyed
            .iter()
            .filter_map(|k| {
                let r = &self.matched.policy.rules[k.rule as usize];
                let rule = k.rule(self.matched.policy);
                let reserved = self.matched.reserved_of(k.rule);
                (rule.counts_failures() || reserved.is_some()).then(|| Owed {
                    rule: rule.clone(),
                    key: k.key(id).to_owned(),
                    group: k.group(id).to_owned(),
                    failure_status: r.failure_status.clone(),
                    failure_grpc: r.failure_grpc.clone(),
                    reserved,
                })
            })
            .collect();
        Settlement::new(limiter, owed)
    }

    /// Stage 4 at once, for a front end that has the answer in hand (the
    /// tower layer): settles the `count: failures` rules on the answer's
    /// `status`, each by its own `failure_status`, or by `classify` when
    /// given (`Some(true)` a failure, `Some(false)` a success, `None` leaves
    /// the key alone).
    pub async fn settle<S: Store>(
        &self,
        limiter: &Arc<Limiter<S>>,
        status: StatusCode,
        classify: Option<&(dyn Fn(StatusCode) -> Option<bool> + Send + Sync)>,
    ) -> Result<(), StoreError> {
        let Some(s) = self.settlement(limiter) else {
            return Ok(());
        };
        s.settle_with(|o| match classify {
            Some(f) => f(status).map(Owed::outcome),
            None => o.on_status(status.as_u16(), None),
        })
        .await
    }

    /// Who the client is, taken: the admission is done with.
    pub fn into_who(self) -> Who {
        self.matched.who
    }

    /// Stage 4b: gives back the `concurrency` leases: the request ended.
    /// (A front end whose request may be dropped before it ends takes a
    /// [`Held`] instead.)
    pub async fn release<S: Store>(&mut self, limiter: &Limiter<S>) -> Result<(), StoreError> {
        match self.pending.as_mut().and_then(|p| p.take_leases()) {
            Some(p) => limiter.release(&p).await,
            None => Ok(()),
        }
    }

    /// Takes the `concurrency` leases out into a [`Held`], which renews
    /// them while it lives and releases them when dropped; `None` when
    /// there is none.
    pub fn hold<S: Store>(&mut self, limiter: &std::sync::Arc<Limiter<S>>) -> Option<Held> {
        Held::of(self.pending.as_mut()?.take_leases()?, limiter)
    }

    /// Whether it holds `concurrency` leases to release.
    pub fn holds_leases(&self) -> bool {
        self.pending
            .as_ref()
            .is_some_and(|p| p.leases().next().is_some())
    }
}
