//! The request path: identify, match rules, decide, forward, settle.

use smallvec::SmallVec;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use ratewarden::decision::problem;
use ratewarden::{Decision, Limiter, Op, Reason, Store};
use ratewarden_tower::insert_headers;

use crate::config::{Config, IdentityFrom, KeyPart, Missing, StoreSpec, Upstream};
use crate::metrics::{Metrics, RuleCounts};
use crate::store::AnyStore;
use crate::upstream::Pool;

/// The body of every response the gateway sends.
pub type Body = UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>>;

/// Longest identity taken from a header (longer values are cut).
const MAX_IDENTITY_BYTES: usize = 256;

/// The configuration in force and the limiter it runs on; swapped whole on reload.
pub struct Live {
    /// The validated configuration.
    pub config: Config,
    /// Decisions over the configured store.
    pub limiter: Limiter<AnyStore>,
    /// Connections to the configured upstream (none for the echo upstream).
    pub pool: Option<Arc<Pool>>,
    /// Deciding a request may read its headers (identity or key from a
    /// header, forwarding headers): the HTTP/1.1 path builds a `HeaderMap`
    /// only then.
    pub reads_headers: bool,
    /// Each rule's decision counts, by rule index.
    counts: Vec<Arc<RuleCounts>>,
}

impl Live {
    fn new(
        config: Config,
        limiter: Limiter<AnyStore>,
        pool: Option<Arc<Pool>>,
        metrics: &Metrics,
    ) -> Self {
        let reads_headers = matches!(config.identity.from, IdentityFrom::Header(_))
            || config.identity.client_ip.forwarded
            || config
                .rules
                .iter()
                .any(|r| r.key.iter().any(|k| matches!(k, KeyPart::Header(_))));
        let counts = config
            .rules
            .iter()
            .map(|r| metrics.counts(r.rule.name()))
            .collect();
        Self {
            config,
            limiter,
            pool,
            reads_headers,
            counts,
        }
    }
}

/// Everything a request needs; shared by all connections.
pub struct Gateway {
    live: ArcSwap<Live>,
    clock: Option<Arc<dyn ratewarden::clock::Clock>>,
    /// Metrics, exported by the admin API.
    pub metrics: Metrics,
}

/// `body` as the gateway's body type.
pub(crate) fn boxed(body: Full<Bytes>) -> Body {
    body.map_err(|never| match never {}).boxed_unsync()
}

/// A complete response of `content_type`.
pub(crate) fn respond(
    status: StatusCode,
    content_type: &'static str,
    body: impl Into<Bytes>,
) -> Response<Body> {
    let mut r = Response::new(boxed(Full::new(body.into())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    r
}

/// An RFC 9457 problem response saying `detail`.
pub(crate) fn problem_response(status: StatusCode, detail: &str) -> Response<Body> {
    respond(
        status,
        "application/problem+json",
        problem(status.as_u16(), Some(detail)),
    )
}

/// matched), the keys to settle on its answer, and who sent it.
pub(crate) struct Admitted {
    /// The decision, for the response's rate-limit headers.
    pub decision: Option<Decision>,
    /// Inline for up to 4 matching rules: no allocation per request.
    keyed: SmallVec<[Keyed; 4]>,
    /// Indexes into `keyed` of the `count: failures` rules.
    settle: Vec<usize>,
    /// The client's identity.
    pub identity: String,
}

/// Why a request is not forwarded.
pub(crate) enum Refusal {
    /// Over a limit: answered with `status:`, rate-limit headers and the
    /// decision's problem body (see [`rejection`]).
    Limited(Decision),
    /// Denied, no identity, or the limiter is down: this answer.
    Answer(Response<Body>),
}

impl Admitted {
    /// Adds the decision's rate-limit headers (none when no rule matched).
    pub(crate) fn add_headers(&self, headers: &mut HeaderMap, style: ratewarden::HeaderStyle) {
        if let Some(d) = &self.decision {
            insert_headers(headers, d.header_fields(style));
        }
    }
}

/// A matched rule's key and group for one request. Most keys are the
/// identity alone (`key: [identity]`, the default) and most groups are the
/// identity: those borrow it rather than copy it per rule and request.
struct Keyed {
    rule: usize,
    /// `None`: the identity itself.
    key: Option<String>,
    /// The group is the identity, else the key (see [`GatewayRule::group`]).
    by_identity: bool,
}

impl Keyed {
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

impl Gateway {
    /// A gateway running `config` on a new store.
    pub fn new(
        config: Config,
        clock: Option<Arc<dyn ratewarden::clock::Clock>>,
    ) -> Result<Arc<Self>, ratewarden::StoreError> {
        let store = AnyStore::new(&config.store, clock.clone())?;
        let pool = pool_for(&config.upstream, None);
        let metrics = Metrics::default();
        Ok(Arc::new(Self {
            live: ArcSwap::from_pointee(Live::new(config, Limiter::new(store), pool, &metrics)),
            clock,
            metrics,
        }))
    }

    /// The configuration and limiter in force.
    pub fn live(&self) -> Arc<Live> {
        self.live.load_full()
    }

    /// Swaps in a new configuration. The store (and so every rule's state)
    /// is kept when the store settings did not change; rules whose name and
    /// parameters did not change then keep their keys.
    pub fn swap(&self, config: Config) -> Result<(), ratewarden::StoreError> {
        let old = self.live();
        let store = if same_store(&old.config.store, &config.store) {
            old.limiter.store().clone()
        } else {
            AnyStore::new(&config.store, self.clock.clone())?
        };
        // Same upstream: keep its warm connections.
        let pool = pool_for(&config.upstream, old.pool.as_ref());
        self.live.store(Arc::new(Live::new(
            config,
            Limiter::new(store),
            pool,
            &self.metrics,
        )));
        Ok(())
    }

    /// Identifies the client, applies `deny`/`allow` and decides every
    /// matching rule; waits out a `mode: delay` hold. `Err` says why the
    /// request must not go on.
    pub(crate) async fn admit(
        &self,
        live: &Live,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
        peer: IpAddr,
    ) -> Result<Admitted, Refusal> {
        let cfg = &live.config;
        let ip = cfg.identity.client_ip.resolve(peer, headers);
        let identity = match &cfg.identity.from {
            IdentityFrom::Ip => cfg.identity.client_ip.key(ip),
            IdentityFrom::Header(name) => {
                let v = headers
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::trim);
                match v {
                    Some(v) if !v.is_empty() => v.chars().take(MAX_IDENTITY_BYTES).collect(),
                    _ => match cfg.identity.missing {
                        Missing::Ip => cfg.identity.client_ip.key(ip),
                        Missing::Anonymous => "anonymous".to_owned(),
                        Missing::Reject => {
                            return Err(Refusal::Answer(problem_response(
                                StatusCode::BAD_REQUEST,
                                &format!("header {name} is required"),
                            )));
                        }
                    },
                }
            }
        };
        if cfg.deny.iter().any(|p| p.matches(ip, &identity)) {
            tracing::info!(identity, "denied by `deny:`");
            return Err(Refusal::Answer(problem_response(
                StatusCode::FORBIDDEN,
                &format!("client {identity} is denied"),
            )));
        }
        let limited = !cfg.allow.iter().any(|p| p.matches(ip, &identity));
        let mut keyed = SmallVec::<[Keyed; 4]>::new();
        if limited {
            for (i, r) in cfg.rules.iter().enumerate() {
                if !r.matcher.matches(method, path) {
                    continue;
                }
                let key = (r.key != [KeyPart::Identity])
                    .then(|| key_of(&r.key, &identity, method, path, headers));
                keyed.push(Keyed {
                    rule: i,
                    key,
                    by_identity: r.grouped_by_identity(),
                });
            }
            // Keys shared by clients last: on a cluster they are other slots,
            // decided after the client's own (see the README).
            keyed.sort_by_key(|k| !k.by_identity);
        }
        let mut admitted = Admitted {
            decision: None,
            keyed,
            settle: vec![],
            identity,
        };
        if admitted.keyed.is_empty() {
            return Ok(admitted);
        }
        let ops: SmallVec<[Op<'_>; 4]> = admitted
            .keyed
            .iter()
            .map(|k| {
                let id = &admitted.identity;
                Op::grouped(&cfg.rules[k.rule].rule, k.key(id), k.group(id))
            })
            .collect();
        // quanta's clock: std's `Instant` costs a system call's worth here.
        let started = quanta::Instant::now();
        let admission = live.limiter.acquire(&ops, 1).await;
        self.metrics.decision_time(started.elapsed());
        // (SmallVec's drop, unlike Vec's, would keep `admitted` borrowed.)
        drop(ops);
        let admission = match admission {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "limiter unavailable; on_error: deny");
                return Err(Refusal::Answer(problem_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &format!("rate limiter unavailable: {e}"),
                )));
            }
        };
        let d = admission.decision;
        for (r, k) in d.rules.iter().zip(&admitted.keyed) {
            let label = match (r.allowed(), r.rule.is_shadow()) {
                (true, _) => "allowed",
                (false, true) => "shadow_rejected",
                (false, false) => "rejected",
            };
            live.counts[k.rule].add(label);
            if let Some(reason) = r.reason {
                let banned = reason == Reason::Banned
                    || (reason == Reason::Limit && r.rule.spec().penalty.is_some());
                if banned && let Some(left) = r.retry_after {
                    self.metrics.banned(
                        r.rule.name(),
                        k.key(&admitted.identity),
                        Instant::now() + left,
                    );
                }
                tracing::info!(
                    rule = r.rule.name(),
                    key = k.key(&admitted.identity),
                    reason = reason.as_str(),
                    shadow = r.rule.is_shadow(),
                    "rejected"
                );
            }
        }
        if !d.allowed {
            return Err(Refusal::Limited(d));
        }
        if admission.pending.is_some() {
            admitted.settle = admitted
                .keyed
                .iter()
                .enumerate()
                .filter(|(_, k)| cfg.rules[k.rule].rule.counts_failures())
                .map(|(i, _)| i)
                .collect();
        }
        if !d.delay.is_zero() {
            tokio::time::sleep(d.delay).await;
        }
        admitted.decision = Some(d);
        Ok(admitted)
    }

    /// Settles the `count: failures` rules of `admitted` on the answer's
    /// `status`.
    pub(crate) async fn settle(&self, live: &Live, admitted: &Admitted, status: u16) {
        for &i in &admitted.settle {
            let k = &admitted.keyed[i];
            let rule = &live.config.rules[k.rule];
            let id = &admitted.identity;
            let op = Op::grouped(&rule.rule, k.key(id), k.group(id));
            if live
                .limiter
                .store()
                .settle(&[op], 1, rule.is_failure(status))
                .await
                .is_err()
            {
                self.metrics.store_error();
            }
        }
    }
}

/// The pool for `upstream`: `old` when it already serves that address.
fn pool_for(upstream: &Upstream, old: Option<&Arc<Pool>>) -> Option<Arc<Pool>> {
    let Upstream::Url(base) = upstream else {
        return None;
    };
    let name = base.host().unwrap_or("127.0.0.1");
    let port = base
        .port_u16()
        .unwrap_or(if base.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    // A bracketed IPv6 literal keeps its brackets: `[::1]:8080`.
    let addr = format!("{name}:{port}");
    let host = base
        .authority()
        .and_then(|a| HeaderValue::from_str(a.as_str()).ok());
    match old {
        Some(p) if p.addr() == addr && p.host() == host.as_ref() => Some(p.clone()),
        _ => Some(Pool::new(addr, host)),
    }
}

fn same_store(a: &StoreSpec, b: &StoreSpec) -> bool {
    a == b
}

/// A rule's key: its parts joined by `:`.
fn key_of(
    parts: &[KeyPart],
    identity: &str,
    method: &Method,
    path: &str,
    headers: &HeaderMap,
) -> String {
    let mut out = String::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            out.push(':');
        }
        match p {
            KeyPart::Identity => out.push_str(identity),
            KeyPart::Method => out.push_str(method.as_str()),
            KeyPart::Path => out.push_str(path),
            KeyPart::Global => out.push_str("global"),
            KeyPart::Header(h) => {
                let v = headers.get(h).and_then(|v| v.to_str().ok()).unwrap_or("");
                out.extend(v.chars().take(MAX_IDENTITY_BYTES));
            }
        }
    }
    out
}
