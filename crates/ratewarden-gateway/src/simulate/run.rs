//! The replay: each request of a [`Traffic`] through the one admission
//! path's stages, as [`Policy::admit`] runs them for the proxy
//! (`identify`, asked once per client since a replayed request has no
//! headers; then `matching` and `decide` per request), on a memory store
//! whose clock is set to the request's time. Nothing is modelled: what the
//! proxy would decide at those instants is what is counted.

use std::future::Future as _;
use std::time::Duration;

use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode};
use ratewarden::MemoryStore;
use ratewarden::clock::{ManualClock, Micros};
use ratewarden::{Limiter, Mode};
use ratewarden_tower::admission::{Facts, Identity, Refusal, Who};
use ratewarden_tower::policy::Policy;
use ratewarden_tower::view::{Fields, RequestView};

use super::traffic::Traffic;
use crate::config::RouteSpec;

/// Polls a future once, pinned where it is built: the memory store decides
/// at once, and `now_or_never` moved the 608-byte admission future twice
/// per request (polling it in place took one thread's replay from 4.5-4.7
/// to ~5.0M requests/s). `None` if it did not finish.
macro_rules! at_once {
    ($f:expr) => {{
        let f = std::pin::pin!($f);
        match f.poll(&mut std::task::Context::from_waker(std::task::Waker::noop())) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        }
    }};
}

/// Where the simulated clock starts: 2026-01-01T00:00:00Z, so that
/// windows aligned to the epoch fall as they would in production.
pub const EPOCH: u64 = 1_767_225_600_000_000;

/// What happened to one rule's requests in one step of time.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Counts {
    /// Requests the rule applied to.
    pub offered: u64,
    /// Of those, admitted (by every rule that applied).
    pub admitted: u64,
    /// Refused by this rule: over its limit.
    pub limit: u64,
    /// Refused by this rule: its key banned (`penalty`).
    pub banned: u64,
    /// Refused by this rule: too soon after the key's last (`min_interval`).
    pub min_interval: u64,
    /// Refused by another rule (this one would have admitted it).
    pub other: u64,
}

impl Counts {
    /// Refused by this rule, for any reason.
    pub fn rejected(&self) -> u64 {
        self.limit + self.banned + self.min_interval
    }

    fn add(&mut self, o: &Counts) {
        self.offered += o.offered;
        self.admitted += o.admitted;
        self.limit += o.limit;
        self.banned += o.banned;
        self.min_interval += o.min_interval;
        self.other += o.other;
    }
}

/// One replay's results.
#[derive(Debug)]
pub struct Run {
    /// The rules' names, in order.
    pub rules: Vec<String>,
    /// Their algorithms' names.
    pub algorithms: Vec<String>,
    /// Each one's refusal status (its `status:`, else the default).
    pub statuses: Vec<u16>,
    /// The step of the series.
    pub step: Duration,
    /// From the start to the last request.
    pub span: Duration,
    /// Per rule, per step.
    pub series: Vec<Vec<Counts>>,
    /// Requests offered per step (whether or not a rule applied).
    pub offered: Vec<u64>,
    /// Requests refused by no rule but by the policy (`deny`: 403; no
    /// identity under `missing: reject`: 400).
    pub refused_otherwise: u64,
    /// The Retry-After (whole seconds, as sent) of each request a rule
    /// refused, per rule.
    pub retry_after: Vec<Vec<u32>>,
    /// Requests replayed.
    pub requests: u64,
}

impl Run {
    /// Adds another part's counts of the same rules and steps.
    fn merge(&mut self, o: Run) {
        for (mine, theirs) in self.series.iter_mut().zip(&o.series) {
            for (a, b) in mine.iter_mut().zip(theirs) {
                a.add(b);
            }
        }
        for (a, b) in self.offered.iter_mut().zip(&o.offered) {
            *a += b;
        }
        for (a, b) in self.retry_after.iter_mut().zip(o.retry_after) {
            a.extend(b);
        }
        self.refused_otherwise += o.refused_otherwise;
        self.requests += o.requests;
    }

    /// A rule's counts over the whole run.
    pub fn total(&self, rule: usize) -> Counts {
        let mut c = Counts::default();
        for s in &self.series[rule] {
            c.add(s);
        }
        c
    }
}

/// Replays `traffic` under `policy` (with `routes` for rules that match on
/// a route's name), counting per `step`. `progress` is told how many
/// requests are done now and then.
///
/// When every rule's key contains the client's identity, no two clients
/// share any state: the clients are then split between threads, each
/// replaying its own clients' requests in time order on a store and clock
/// of its own, which counts exactly what one thread would.
pub fn replay(
    policy: &Policy,
    routes: &[RouteSpec],
    traffic: &Traffic,
    step: Duration,
    progress: &mut dyn FnMut(u64),
) -> Result<Run, String> {
    let prepared = Prepared::new(policy, routes, traffic)?;
    let parts = if traffic.events.len() >= 1 << 18
        && policy.rules.iter().all(|r| r.grouped_by_identity())
    {
        std::thread::available_parallelism().map_or(1, |n| n.get().min(8))
    } else {
        1
    };
    if parts == 1 {
        return prepared.replay(step, None, progress);
    }
    // Each other thread on rules of its own: a decision clones its rule's
    // `Arc`, and two threads counting on one would contend for its line.
    let copies = (1..parts)
        .map(|_| {
            let mut p = policy.clone();
            for r in &mut p.rules {
                r.rule = ratewarden::Rule::new(r.rule.spec().clone()).map_err(|e| e.to_string())?;
            }
            Ok(p)
        })
        .collect::<Result<Vec<Policy>, String>>()?;
    std::thread::scope(|s| {
        let others: Vec<_> = copies
            .iter()
            .enumerate()
            .map(|(i, copy)| {
                let mine = Prepared {
                    policy: copy,
                    ids: rule_ids(copy),
                    ..prepared.clone()
                };
                s.spawn(move || mine.replay(step, Some((i + 1, parts)), &mut |_| {}))
            })
            .collect();
        // This thread's share stands for all of them in the progress.
        let mut run =
            prepared.replay(step, Some((0, parts)), &mut |n| progress(n * parts as u64))?;
        for o in others {
            run.merge(
                o.join()
                    .map_err(|_| "a replay thread panicked".to_owned())??,
            );
        }
        progress(run.requests);
        Ok(run)
    })
}

/// What every replay of a traffic shares: each distinct request's path as
/// a rule sees it and its route, each client's address and who the policy
/// says it is.
#[derive(Clone)]
struct Prepared<'a> {
    policy: &'a Policy,
    traffic: &'a Traffic,
    /// Each distinct request: method, target as given, path as a rule
    /// sees it, route.
    requests: Vec<(Method, &'a str, String, Option<&'a str>)>,
    peers: Vec<Option<std::net::IpAddr>>,
    /// Stage 1 depends on the client alone here (no headers): asked once
    /// per client, as the proxy would ask it per request. `Err` for a
    /// client refused before any rule (`deny`, no identity).
    who: Vec<Result<Who, ()>>,
    /// Each distinct request's header fields (its host as `Host`).
    fields: Vec<HeaderMap>,
    /// Which part of a split replay a client falls in: by its identity as
    /// the rules see it (two addresses of one IPv6 /64 are one client).
    hash: Vec<u64>,
    /// Each rule's id and its tiers', with the rule's position: a
    /// decision's rules found among them (a scan of a few integers;
    /// hashing the name cost more).
    ids: Vec<(u64, usize)>,
}

/// Each rule's id and its tiers', with the rule's position.
fn rule_ids(policy: &Policy) -> Vec<(u64, usize)> {
    let mut out = vec![];
    for (at, r) in policy.rules.iter().enumerate() {
        out.push((r.rule.id(), at));
        for t in r.tiers.iter().flat_map(|t| &t.values) {
            if let Some(rule) = &t.rule {
                out.push((rule.id(), at));
            }
        }
    }
    out
}

impl<'a> Prepared<'a> {
    fn new(
        policy: &'a Policy,
        routes: &'a [RouteSpec],
        traffic: &'a Traffic,
    ) -> Result<Self, String> {
        let mut fields = Vec::with_capacity(traffic.requests.len());
        for r in &traffic.requests {
            let mut map = HeaderMap::new();
            let given = r.headers.iter().map(|(k, v)| (k.as_str(), v.as_str()));
            for (k, v) in given.chain(r.host.as_deref().map(|h| ("host", h))) {
                let name = HeaderName::from_bytes(k.as_bytes())
                    .map_err(|_| format!("`{k}` is not a header name"))?;
                let value = HeaderValue::from_str(v)
                    .map_err(|_| format!("header `{k}`: `{v}` is not a header value"))?;
                map.append(name, value);
            }
            fields.push(map);
        }
        let requests: Vec<(Method, &str, String, Option<&str>)> = traffic
            .requests
            .iter()
            .zip(&fields)
            .map(|(r, map)| {
                let (m, p) = (&r.method, &r.target);
                let path = crate::proxy::forward::rule_path(m, p)
                    .map_err(|e| format!("path `{p}` is refused at the edge: {e:?}"))?
                    .into_owned();
                let view = RequestView {
                    target: p,
                    fields: Fields::Map(map),
                    ..RequestView::bare(m, &path)
                };
                let route =
                    crate::upstream::route::chosen(routes.iter().map(|r| &r.matcher), &view)
                        .map_or(crate::upstream::route::DEFAULT, |i| routes[i].name.as_str());
                Ok((m.clone(), p.as_str(), path, Some(route)))
            })
            .collect::<Result<_, String>>()?;
        let peers: Vec<Option<std::net::IpAddr>> =
            traffic.identities.iter().map(|i| i.parse().ok()).collect();
        let who: Vec<Result<Who, ()>> = traffic
            .identities
            .iter()
            .zip(&peers)
            .map(|(id, peer)| {
                policy
                    .identify(&Facts {
                        request: RequestView {
                            peer: *peer,
                            ..RequestView::bare(&Method::GET, "/")
                        },
                        identity: Identity::Given(Some(id)),
                        route: None,
                        reserve: None,
                    })
                    .map_err(|_| ())
            })
            .collect();
        let hash = who
            .iter()
            .map(|w| {
                let id = w.as_ref().map_or("", |w| w.identity.as_str());
                ratewarden::fnv1a(id.bytes())
            })
            .collect();
        let ids = rule_ids(policy);
        Ok(Self {
            policy,
            traffic,
            requests,
            peers,
            who,
            hash,
            fields,
            ids,
        })
    }

    fn rule_index(&self, rule: &ratewarden::Rule) -> usize {
        let id = rule.id();
        match self.ids.iter().find(|(i, _)| *i == id) {
            Some((_, at)) => *at,
            None => self
                .policy
                .rules
                .iter()
                .position(|r| r.rule.name() == rule.name())
                .unwrap_or(0),
        }
    }

    /// The requests of part `part.0` of `part.1` (all without one).
    fn replay(
        &self,
        step: Duration,
        part: Option<(usize, usize)>,
        progress: &mut dyn FnMut(u64),
    ) -> Result<Run, String> {
        let (policy, traffic) = (self.policy, self.traffic);
        let step_us = u64::try_from(step.as_micros()).unwrap_or(u64::MAX).max(1);
        let steps = (traffic.span() / step_us + 1) as usize;
        let clock = ManualClock::new(EPOCH);
        // Room for every client under every rule: nothing is evicted early.
        let keys = (traffic.identities.len() * policy.rules.len().max(1)).clamp(1 << 16, 1 << 26);
        let store = MemoryStore::builder()
            .max_keys(keys)
            .clock(clock.clone())
            .build();
        let limiter = std::sync::Arc::new(Limiter::new(store));
        let n = policy.rules.len();
        let mut run = Run {
            rules: policy
                .rules
                .iter()
                .map(|r| r.rule.name().to_owned())
                .collect(),
            algorithms: policy
                .rules
                .iter()
                .map(|r| r.rule.spec().algorithm.name().to_owned())
                .collect(),
            statuses: policy
                .rules
                .iter()
                .map(|r| r.rule.spec().status.unwrap_or(429))
                .collect(),
            step,
            span: Duration::from_micros(traffic.span()),
            series: vec![vec![Counts::default(); steps]; n],
            offered: vec![0; steps],
            refused_otherwise: 0,
            retry_after: vec![Vec::new(); n],
            requests: 0,
        };
        for (done, e) in traffic.events.iter().enumerate() {
            if done & 0xffff == 0 {
                progress(done as u64 / part.map_or(1, |p| p.1 as u64));
            }
            let client = e.identity as usize;
            if let Some((p, parts)) = part
                && self.hash[client] % parts as u64 != p as u64
            {
                continue;
            }
            run.requests += 1;
            clock.set(Micros::new(EPOCH + e.t));
            let at = (e.t / step_us) as usize;
            run.offered[at] += 1;
            let Ok(who) = &self.who[client] else {
                run.refused_otherwise += 1;
                continue;
            };
            let (method, target, path, route) = &self.requests[e.request as usize];
            let facts = Facts {
                request: RequestView {
                    target,
                    fields: Fields::Map(&self.fields[e.request as usize]),
                    peer: self.peers[client],
                    ..RequestView::bare(method, path)
                },
                identity: Identity::Given(Some(&traffic.identities[client])),
                route: *route,
                reserve: None,
            };
            let Ok(matched) = policy.matching(&facts, who.clone()) else {
                // `missing: reject`: refused before any rule counts it.
                run.refused_otherwise += 1;
                continue;
            };
            let decided = at_once!(matched.decide(&limiter, 1, Mode::Apply))
                .ok_or("the memory store did not decide at once")?;
            match decided {
                Ok(mut admitted) => {
                    if let Some(d) = &admitted.decision {
                        for r in &d.rules {
                            let c = &mut run.series[self.rule_index(&r.rule)][at];
                            c.offered += 1;
                            c.admitted += 1;
                        }
                    }
                    if e.status != 0
                        && let Ok(status) = StatusCode::from_u16(e.status)
                    {
                        settle(at_once!(admitted.settle(&limiter, status, None)))?;
                    }
                    // A simulated request takes no time: `concurrency` slots
                    // are given back at once.
                    settle(at_once!(admitted.release(&limiter)))?;
                }
                Err(Refusal::Limited(d)) => {
                    let retry = d.retry_after_secs().unwrap_or(0).min(u64::from(u32::MAX)) as u32;
                    for r in &d.rules {
                        let i = self.rule_index(&r.rule);
                        let c = &mut run.series[i][at];
                        c.offered += 1;
                        match r.reason {
                            None => c.other += 1,
                            Some(reason) => {
                                match reason {
                                    ratewarden::Reason::Limit => c.limit += 1,
                                    ratewarden::Reason::Banned => c.banned += 1,
                                    ratewarden::Reason::MinInterval => c.min_interval += 1,
                                    // (A full store refuses as a limit does.)
                                    ratewarden::Reason::Full => c.limit += 1,
                                }
                                run.retry_after[i].push(retry);
                            }
                        }
                    }
                }
                Err(_) => run.refused_otherwise += 1,
            }
        }
        if part.is_none() {
            progress(run.requests);
        }
        Ok(run)
    }
}

fn settle(r: Option<Result<(), ratewarden::StoreError>>) -> Result<(), String> {
    match r {
        Some(Ok(())) => Ok(()),
        Some(Err(e)) => Err(format!("store: {e}")),
        None => Err("the memory store did not settle at once".into()),
    }
}
