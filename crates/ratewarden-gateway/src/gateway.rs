//! The gateway's state, and what it records about each decision of the one
//! admission path ([`ratewarden_tower::admission`]): the configuration in
//! force and the limiter it runs on, swapped whole on reload; metrics and
//! log lines per decision. The front ends (`proxy::h1`, `proxy::hyper`,
//! `admin`) build a request's facts, call [`Gateway::admit`], and render.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use ratewarden::{Decision, Limiter, Mode, Reason};
use ratewarden_tower::admission::{Admitted, Facts, Refusal};

pub use crate::answer::Body;
use crate::config::Config;
use crate::observe::metrics::{Metrics, RuleCounts};
use crate::store::AnyStore;
use crate::upstream::route::Router;
use ratewarden_tower::consumers::{Consumer, Consumers};
use ratewarden_tower::overrides::Overrides;

/// The store's system and node, as a store span names them: the host and
/// port of its URL (never its credentials), a cluster's first seed, or the
/// sentinels' master's name.
fn store_node(spec: &crate::config::StoreSpec) -> (&'static str, Option<String>) {
    use crate::config::StoreSpec;
    let host_port = |url: &str| {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
        rest.split(['/', '?']).next().unwrap_or_default().to_owned()
    };
    match spec {
        StoreSpec::Memory { .. } => ("memory", None),
        StoreSpec::Redis { url: Some(u), .. } => ("redis", Some(host_port(u))),
        StoreSpec::Redis {
            cluster, sentinel, ..
        } => (
            "redis",
            cluster
                .first()
                .map(|u| host_port(u))
                .or_else(|| sentinel.as_ref().map(|s| s.master.clone())),
        ),
    }
}

/// The configuration in force and the limiter it runs on; swapped whole on reload.
pub struct Live {
    /// The validated configuration.
    pub config: Config,
    /// Decisions over the configured store (shared with the guards that
    /// release `concurrency` leases).
    pub limiter: Arc<Limiter<AnyStore>>,
    /// The routes and their upstream servers (with their pools).
    pub router: Router,
    /// Each rule's decision counts, by rule id.
    counts: Vec<(u64, Arc<RuleCounts>)>,
    /// A rule keys on a token's claims: requests' tokens are verified.
    reads_claims: bool,
    /// A rule reads the request's body (a `json:` key part or tier, or a
    /// cost reserved from it): each request's body is read whole before
    /// its decision.
    reads_body: bool,
    /// A rule lowers LLM requests' maximum output to what is left
    /// (`cap_max_output`): such requests are peeked before they are
    /// decided.
    caps_max_output: bool,
    /// The answer counts of requests no route took (the echo upstream's,
    /// under the default route) and of those answered before any route
    /// was chosen: resolved here, so that counting takes no lock.
    pub(crate) unrouted: [Arc<crate::observe::metrics::RouteCounts>; 2],
    /// The consumers `consumers.file` names, by key hash.
    file_consumers: std::collections::HashMap<String, Arc<Consumer>>,
    /// Spans go through it, when tracing is on.
    pub(crate) tracer: Option<crate::observe::trace::Tracer>,
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Live").finish_non_exhaustive()
    }
}

/// `consumers.max`, or its default.
fn consumers_max(config: &Config) -> usize {
    config
        .consumers
        .as_ref()
        .map_or(crate::config::CONSUMERS_MAX, |c| c.max)
}

impl Live {
    fn new(
        mut config: Config,
        limiter: Arc<Limiter<AnyStore>>,
        router: Router,
        metrics: &Metrics,
        overrides: &Arc<Overrides>,
    ) -> Self {
        overrides.set_max(config.overrides_max);
        overrides.rebase(|name| config.policy.rule(name).map(|r| &r.rule));
        config.policy.overrides = Some(overrides.clone());
        // A rule's counts under its id and each of its tiers' (an
        // override's are found by name).
        let mut counts = vec![];
        for r in &config.policy.rules {
            let c = metrics.counts(r.rule.name());
            counts.push((r.rule.id(), c.clone()));
            for t in r.tiers.iter().flat_map(|t| &t.values) {
                if let Some(rule) = &t.rule {
                    counts.push((rule.id(), c.clone()));
                }
            }
        }
        // Envoy's descriptor limits count as rules do, under their rule's
        // name.
        for l in config.rls.iter().flat_map(|r| r.domains.limits()) {
            if let Some(rule) = &l.rule {
                counts.push((rule.id(), metrics.counts(rule.name())));
            }
        }
        use ratewarden_tower::policy::{IdentitySource, KeyPart};
        // Tokens are verified when they are required, or when the identity
        // or a rule's key reads a claim.
        let policy = &config.policy;
        let keyed_by_claims = matches!(policy.identity, IdentitySource::Claim { .. })
            || policy
                .rules
                .iter()
                .any(|r| r.key.iter().any(|k| matches!(k, KeyPart::Jwt(_))));
        let reads_claims = config
            .jwt
            .as_ref()
            .is_some_and(|j| j.required || keyed_by_claims);
        let json = |k: &KeyPart| match k {
            KeyPart::Json(_) => true,
            KeyPart::Hashed(p, _) => matches!(**p, KeyPart::Json(_)),
            _ => false,
        };
        let reads_body = config.costs.iter().any(|c| c.reads_body())
            || config.policy.rules.iter().any(|r| {
                r.key.iter().any(json)
                    || r.tiers.as_ref().is_some_and(|t| json(&t.from))
                    || !r.matcher.json.is_empty()
            });
        let caps_max_output = config.costs.iter().any(
            |c| matches!(&c.source, crate::config::cost::CostSource::Llm(l) if l.cap_max_output),
        );
        let unrouted = [
            metrics.route(crate::upstream::route::DEFAULT),
            metrics.route(crate::observe::metrics::NO_ROUTE),
        ];
        // The refusal cache never keeps a rule charged by its answer (a
        // refund frees units before the refusal's time).
        if let Some(r) = limiter.store().refusals() {
            r.exclude(
                config
                    .policy
                    .rules
                    .iter()
                    .filter(|r| r.by_answer.is_some())
                    .map(|r| r.rule.name().to_owned())
                    .collect(),
            );
        }
        let file_consumers = config
            .consumers
            .iter()
            .flat_map(|c| &c.file)
            .map(|c| (c.key_hash.clone(), Arc::new(c.clone())))
            .collect();
        let tracer = crate::observe::trace::Tracer::start(
            &config.tracing,
            metrics.trace_dropped.clone(),
            store_node(&config.store),
        );
        Self {
            tracer,
            config,
            limiter,
            router,
            counts,
            reads_claims,
            reads_body,
            caps_max_output,
            unrouted,
            file_consumers,
        }
    }

    /// The consumer `consumers.file` names by `key_hash`.
    pub(crate) fn file_consumer(&self, key_hash: &str) -> Option<&Arc<Consumer>> {
        self.file_consumers.get(key_hash)
    }

    /// The consumer of `consumers.file` named `name`.
    pub(crate) fn file_consumer_named(&self, name: &str) -> Option<&Arc<Consumer>> {
        self.file_consumers.values().find(|c| c.name == name)
    }

    /// Every consumer of `consumers.file`.
    pub(crate) fn file_consumers(&self) -> impl Iterator<Item = &Arc<Consumer>> {
        self.file_consumers.values()
    }

    /// Whether a rule reads the request's body (see [`Live::reads_body`]'s
    /// field): the flow reads it whole before deciding.
    pub(crate) fn reads_body(&self) -> bool {
        self.reads_body
    }

    /// Whether a rule caps LLM requests' maximum output (see the field).
    pub(crate) fn caps_max_output(&self) -> bool {
        self.caps_max_output
    }

    /// The decision counts of `rule` (by its id; an override's by the
    /// name of its rule).
    fn counts(&self, rule: &ratewarden::Rule) -> Option<&RuleCounts> {
        let id = rule.id();
        match self.counts.iter().find(|(i, _)| *i == id) {
            Some((_, c)) => Some(c),
            None => self
                .config
                .policy
                .rule(rule.name())
                .and_then(|r| self.counts.iter().find(|(i, _)| *i == r.rule.id()))
                .map(|(_, c)| &**c),
        }
    }
}

/// Everything a request needs; shared by all connections.
pub struct Gateway {
    live: ArcSwap<Live>,
    clock: Option<Arc<dyn ratewarden::clock::Clock>>,
    /// Metrics, exported by the admin API.
    pub metrics: Metrics,
    /// The access log, when `access_log:` asks for one (opened at start).
    pub access: Option<crate::observe::access::AccessLog>,
    /// Runtime overrides of one key's limit: kept across reloads (each
    /// new policy is handed this table).
    pub overrides: Arc<Overrides>,
    /// The consumers the admin API made (`/v1/consumers`): kept across
    /// reloads; shared through Redis, or kept in `state_dir` on memory.
    pub consumers: Arc<Consumers>,
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

/// Why the gateway could not be built.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The store could not be created.
    #[error(transparent)]
    Store(#[from] ratewarden::StoreError),
    /// The access log could not be opened.
    #[error("access log: {0}")]
    AccessLog(#[source] std::io::Error),
}

impl Gateway {
    /// A gateway running `config` on a new store.
    pub fn new(
        config: Config,
        clock: Option<Arc<dyn ratewarden::clock::Clock>>,
    ) -> Result<Arc<Self>, GatewayError> {
        let store = AnyStore::new(&config.store, clock.clone())?;
        let metrics = Metrics::default();
        let router = Router::new(
            &config.routes,
            config.default_server().as_ref(),
            config.preserve_host,
            &config.request_headers,
            None,
            &metrics,
        );
        let access = match &config.access_log {
            Some(spec) => Some(
                crate::observe::access::AccessLog::start(spec).map_err(GatewayError::AccessLog)?,
            ),
            None => None,
        };
        let table_clock = clock
            .clone()
            .unwrap_or_else(|| Arc::new(ratewarden::clock::SystemClock::new()));
        let overrides = Arc::new(Overrides::new(config.overrides_max, table_clock.clone()));
        let consumers = Arc::new(Consumers::new(consumers_max(&config), table_clock));
        let live = Live::new(
            config,
            Arc::new(Limiter::new(store)),
            router,
            &metrics,
            &overrides,
        );
        Ok(Arc::new(Self {
            live: ArcSwap::from_pointee(live),
            clock,
            metrics,
            access,
            overrides,
            consumers,
        }))
    }

    /// The claims of `request`'s token, when the config verifies tokens
    /// and a rule keys on them. A token that is not trusted is none (the
    /// rule's `missing:` applies), counted by reason and logged at DEBUG.
    pub(crate) fn claims(
        &self,
        live: &Live,
        request: &ratewarden_tower::view::RequestView<'_>,
    ) -> Option<crate::jwt::Claims> {
        if !live.reads_claims {
            return None;
        }
        let token = live.config.jwt.as_ref()?.token(request)?;
        self.verify_token(live, &token, request)
    }

    /// [`Self::claims`], refused when the config requires a trusted token
    /// and the request has none (`jwt: {required: true}`): what every
    /// front end that decides a request asks first.
    pub(crate) fn required_claims(
        &self,
        live: &Live,
        request: &ratewarden_tower::view::RequestView<'_>,
        route: Option<&str>,
    ) -> Result<Option<crate::jwt::Claims>, ratewarden_tower::admission::Refusal> {
        let claims = self.claims(live, request);
        if claims.is_none() && requires_token(live, request, route) {
            return Err(ratewarden_tower::admission::Refusal::Unauthenticated);
        }
        Ok(claims)
    }

    /// The consumer `request`'s API key names, under `consumers:`: `None`
    /// without a key (the identity's `missing` then applies) or without
    /// `consumers:`. A key that names no one (unknown, revoked, expired)
    /// is refused (401) under `unknown: reject`, and is as no key under
    /// `anonymous`. The key is hashed first; only its hash is looked up.
    #[inline]
    pub(crate) fn consumer(
        &self,
        live: &Live,
        request: &ratewarden_tower::view::RequestView<'_>,
    ) -> Result<Option<Arc<Consumer>>, Refusal> {
        // Without `consumers:` (most configs), nothing more: no call.
        match &live.config.consumers {
            None => Ok(None),
            Some(spec) => self.find_consumer(live, spec, request),
        }
    }

    /// [`Self::consumer`] under `consumers:`.
    fn find_consumer(
        &self,
        live: &Live,
        spec: &crate::config::ConsumersSpec,
        request: &ratewarden_tower::view::RequestView<'_>,
    ) -> Result<Option<Arc<Consumer>>, Refusal> {
        use crate::config::ApiKeyFrom;
        let key = match &spec.from {
            ApiKeyFrom::Header(h) => request
                .header_text(h.as_str())
                .map(std::borrow::Cow::Borrowed),
            ApiKeyFrom::Authorization => request
                .header_text("authorization")
                .and_then(|v| {
                    let (scheme, rest) = v.trim().split_once(' ')?;
                    scheme.eq_ignore_ascii_case("bearer").then_some(rest)
                })
                .map(std::borrow::Cow::Borrowed),
            ApiKeyFrom::Query(n) => request.query_values(n).next(),
        };
        let Some(key) = key.as_deref().map(str::trim).filter(|k| !k.is_empty()) else {
            return Ok(None);
        };
        let hash = spec.hasher.hash(key);
        if let Some(c) = self.consumers.find(&hash) {
            return Ok(Some(c));
        }
        if let Some(c) = live.file_consumer(&hash) {
            return Ok(Some(c.clone()));
        }
        self.metrics.unknown_key();
        if spec.reject_unknown {
            Err(Refusal::NoConsumer)
        } else {
            Ok(None)
        }
    }

    /// The claims of `token`, if it is to be trusted (see [`Self::claims`]),
    /// carried by `request` (whose client's bad signatures are counted: see
    /// [`crate::jwt::Verifier::verify_from`]).
    pub(crate) fn verify_token(
        &self,
        live: &Live,
        token: &str,
        request: &ratewarden_tower::view::RequestView<'_>,
    ) -> Option<crate::jwt::Claims> {
        let verifier = live.config.jwt.as_ref()?;
        let now = match &self.clock {
            Some(c) => c.now().get() / 1_000_000,
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
        };
        let client = || {
            let peer = request.peer?;
            Some(match live.config.policy.identity.client_ip() {
                Some(c) => c.resolve(peer, request.fields),
                None => peer,
            })
        };
        match verifier.verify_from(token, now, client) {
            Ok(c) => Some(c),
            Err(reason) => {
                self.metrics.jwt_rejected(reason.as_str());
                tracing::debug!(
                    reason = reason.as_str(),
                    "token not trusted: its claims are missing"
                );
                None
            }
        }
    }

    /// Access log lines dropped because the writer fell behind.
    pub fn access_dropped(&self) -> u64 {
        self.access.as_ref().map_or(0, |a| a.dropped())
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
        let limiter = if old.config.store == config.store {
            old.limiter.clone()
        } else {
            Arc::new(Limiter::new(AnyStore::new(
                &config.store,
                self.clock.clone(),
            )?))
        };
        // Servers that did not change keep their warm connections.
        let router = Router::new(
            &config.routes,
            config.default_server().as_ref(),
            config.preserve_host,
            &config.request_headers,
            Some(&old.router),
            &self.metrics,
        );
        self.consumers.set_max(consumers_max(&config));
        self.live.store(Arc::new(Live::new(
            config,
            limiter,
            router,
            &self.metrics,
            &self.overrides,
        )));
        Ok(())
    }

    /// Runs a proxied request through the one admission path, records the
    /// decision (metrics, a log line per rejection) and waits out a
    /// `mode: delay` hold. `Err` says why the request must not go on.
    pub(crate) async fn admit<'l>(
        &self,
        live: &'l Live,
        facts: &Facts<'_>,
        rid: &crate::observe::request_id::RequestId,
    ) -> Result<Admitted<'l>, Refusal> {
        let request = Some((facts.request.method, facts.request.path, rid));
        // quanta's clock: std's `Instant` costs a system call's worth here.
        let started = quanta::Instant::now();
        let res = live
            .config
            .policy
            .admit(&live.limiter, facts, 1, Mode::Apply)
            .await;
        match &res {
            Ok(a) => {
                if let Some(d) = &a.decision {
                    self.metrics.decision_time(started.elapsed());
                    self.record(live, d, request);
                }
            }
            Err(Refusal::Limited(d)) => {
                self.metrics.decision_time(started.elapsed());
                self.record(live, d, request);
            }
            Err(Refusal::Denied(identity)) => tracing::info!(
                identity,
                method = %facts.request.method,
                path = facts.request.path,
                request_id = %rid,
                "denied by `deny:`"
            ),
            Err(Refusal::Unavailable(e)) => {
                // A late answer, an outage or a broken store, under
                // on_error: deny (the only policy that answers 503). Counted by kind in
                // ratewarden_store_errors_total; a late answer's own WARN
                // line is rate-limited by the store, so this one is DEBUG.
                match e {
                    ratewarden::StoreError::Late(_) => {
                        tracing::debug!(error = %e, request_id = %rid, "store answer late: 503")
                    }
                    _ => {
                        tracing::warn!(error = %e, request_id = %rid, "limiter unavailable; on_error: deny: 503")
                    }
                }
            }
            Err(
                Refusal::NoIdentity(_)
                | Refusal::MissingPart { .. }
                | Refusal::Unauthenticated
                | Refusal::NoConsumer,
            ) => {}
        }
        let admitted = res?;
        if let Some(d) = &admitted.decision
            && !d.delay.is_zero()
        {
            tokio::time::sleep(d.delay).await;
        }
        Ok(admitted)
    }

    /// Counts a decision per rule, tracks bans, logs each rule's rejection
    /// (with the request's method, path and id when it is a request's).
    pub(crate) fn record(
        &self,
        live: &Live,
        d: &Decision,
        request: Option<(&http::Method, &str, &crate::observe::request_id::RequestId)>,
    ) {
        for r in &d.rules {
            if let Some(c) = live.counts(&r.rule) {
                // A yes that another rule's no left uncharged is not an
                // admission (the decision is all-or-nothing).
                c.add(if !d.allowed && r.allowed() {
                    "not_charged"
                } else {
                    r.label()
                });
            }
            // Keys at or near their limit are `/v1/keys`'s candidates: one
            // in eight sightings (per thread) is enough to catch the hot
            // ones, and keeps a rejection flood off the table's lock.
            let near = r.reason.is_some() || r.remaining.saturating_mul(4) <= r.rule.limit();
            if near && every_eighth() {
                self.metrics.hot(r.rule.name(), &r.key);
            }
            if let Some(reason) = r.reason {
                let banned = reason == Reason::Banned
                    || (reason == Reason::Limit && r.rule.spec().penalty.is_some());
                if banned && let Some(left) = r.retry_after {
                    self.metrics
                        .banned(r.rule.name(), &r.key, Instant::now() + left);
                }
                // A flood of refusals is not a flood of lines: a key's first
                // refusal in each period is logged, the rest summarised.
                // With INFO off there are neither lines nor summaries to
                // write: nothing is kept.
                // (The global level, one atomic load: `enabled!` would ask
                // the filter each time.)
                if tracing::level_filters::LevelFilter::current() < tracing::Level::INFO
                    || !crate::observe::refusals::first(r.rule.id(), r.rule.name(), &r.key)
                {
                    continue;
                }
                match request {
                    Some((method, path, rid)) => tracing::info!(
                        rule = r.rule.name(),
                        key = r.key,
                        reason = reason.as_str(),
                        shadow = r.rule.is_shadow(),
                        %method,
                        path,
                        request_id = %rid,
                        "rejected"
                    ),
                    None => tracing::info!(
                        rule = r.rule.name(),
                        key = r.key,
                        reason = reason.as_str(),
                        shadow = r.rule.is_shadow(),
                        "rejected"
                    ),
                }
            }
        }
    }
}

/// Whether `request` (on `route`) needs a trusted token: every request
/// under `jwt.required: true`, else one a `jwt_required` rule matches.
fn requires_token(
    live: &Live,
    request: &ratewarden_tower::view::RequestView<'_>,
    route: Option<&str>,
) -> bool {
    let config = &live.config;
    if config.jwt.as_ref().is_some_and(|j| j.required) {
        return true;
    }
    let route = Some(route.unwrap_or(crate::upstream::route::DEFAULT));
    !config.token_rules.is_empty()
        && config.policy.rules.iter().any(|r| {
            config.token_rules.iter().any(|n| n == r.rule.name())
                && r.matcher.matches(request, route)
        })
}

/// True once in eight calls on each thread.
fn every_eighth() -> bool {
    thread_local! {
        static N: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
    }
    N.with(|n| {
        let v = n.get().wrapping_add(1);
        n.set(v);
        v % 8 == 0
    })
}

/// What the startup log says about the config it loaded.
#[derive(Debug)]
pub struct Banner {
    /// The proxy listener speaks TLS.
    pub tls: bool,
    /// The upstream.
    pub upstream: String,
    /// The store, without a password.
    pub store: String,
    /// One line per rule: name, algorithm, limit, key, what it matches.
    pub rules: Vec<String>,
    /// One line per Envoy descriptor limit: where in the tree, how much.
    pub rls: Vec<String>,
}

/// The banner of `config`.
pub fn banner(config: &Config) -> Banner {
    use crate::config::StoreSpec;
    use ratewarden::store::redis::redact;
    let store = match &config.store {
        StoreSpec::Memory { max_keys } => format!("memory (up to {max_keys} keys)"),
        StoreSpec::Redis {
            sentinel: Some(sc), ..
        } => format!(
            "redis sentinel master {} via {}",
            sc.master,
            sc.nodes
                .iter()
                .map(|u| redact(u))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        StoreSpec::Redis { url: Some(u), .. } => format!("redis {}", redact(u)),
        StoreSpec::Redis { cluster, .. } => format!(
            "redis cluster {}",
            cluster
                .iter()
                .map(|u| redact(u))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let rules = config
        .policy
        .rules
        .iter()
        .map(|r| {
            let spec = r.rule.spec();
            let amount = if spec.algorithm.holds_leases() {
                format!("{} in flight", spec.limit)
            } else if let Some(c) = &spec.calendar {
                format!(
                    "{} per {} ({})",
                    spec.limit,
                    c.period_kind().name(),
                    c.zone()
                )
            } else {
                format!("{} per {:?}", spec.limit, spec.window)
            };
            let key: Vec<String> = r.key.iter().map(ToString::to_string).collect();
            // What changes how it counts or refuses, as the file says it.
            let mut extra = String::new();
            if let ratewarden::Counting::Failures { reset_on_success } = spec.counting {
                extra.push_str(", count: failures");
                if !reset_on_success {
                    extra.push_str(" (kept on success)");
                }
            }
            if let Some(gap) = spec.min_interval {
                extra.push_str(&format!(", min_interval {gap:?}"));
            }
            if let Some(p) = &spec.penalty {
                extra.push_str(&format!(", penalty {:?}", p.duration));
                if p.multiplier > 1 {
                    extra.push_str(&format!(" x{} up to {:?}", p.multiplier, p.max));
                }
            }
            if let Some(status) = spec.status {
                extra.push_str(&format!(", status {status}"));
            }
            if let Some(t) = &r.tiers {
                let tiers: Vec<String> = t
                    .values
                    .iter()
                    .map(|v| match &v.rule {
                        None => format!("{} unlimited", v.name),
                        Some(rule) => {
                            format!("{} {} per {:?}", v.name, rule.limit(), rule.window())
                        }
                    })
                    .collect();
                extra.push_str(&format!(
                    ", tiers by {} (default {}): {}",
                    t.from,
                    t.values[t.default].name,
                    tiers.join(", ")
                ));
            }
            format!(
                "{}: {} {amount} per [{}], {}{extra}{}",
                spec.name,
                spec.algorithm,
                key.join(", "),
                r.matcher,
                if spec.shadow { " (shadow)" } else { "" }
            )
        })
        .collect();
    let rls = config
        .rls
        .iter()
        .flat_map(|r| r.domains.limits())
        .map(|l| match &l.rule {
            _ if l.unlimited => format!("{}: unlimited", l.full_key),
            None => format!("{}: 0 (every request over)", l.full_key),
            Some(rule) => {
                let spec = rule.spec();
                format!(
                    "{}: {} {} per {:?}{}",
                    l.full_key,
                    spec.algorithm,
                    spec.limit,
                    spec.window,
                    if spec.shadow { " (shadow)" } else { "" }
                )
            }
        })
        .collect();
    Banner {
        tls: config.tls.is_some(),
        upstream: config.upstream.to_string(),
        store,
        rules,
        rls,
    }
}
