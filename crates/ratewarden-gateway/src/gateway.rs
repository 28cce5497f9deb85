//! The gateway's state, and what it records about each decision of the one
//! admission path ([`ratewarden_tower::admission`]): the configuration in
//! force and the limiter it runs on, swapped whole on reload; metrics and
//! log lines per decision. The front ends (`proxy::h1`, `proxy::hyper`,
//! `admin`) build a request's facts, call [`Gateway::admit`], and render.

use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwap;
use http::header::{HeaderMap, HeaderValue};
use http::{Response, StatusCode};
use ratewarden::{Decision, HeaderStyle, Limiter, Mode, Reason};
use ratewarden_tower::admission::{Admitted, Facts, Refusal};
use ratewarden_tower::insert_headers;

pub use crate::answer::Body;
use crate::answer::problem_body;
use crate::config::{Config, Upstream};
use crate::metrics::{Metrics, RuleCounts};
use crate::store::AnyStore;
use crate::upstream::Pool;

/// The configuration in force and the limiter it runs on; swapped whole on reload.
pub struct Live {
    /// The validated configuration.
    pub config: Config,
    /// Decisions over the configured store (shared with the guards that
    /// release `concurrency` leases).
    pub limiter: Arc<Limiter<AnyStore>>,
    /// Connections to the configured upstream (none for the echo upstream).
    pub pool: Option<Arc<Pool>>,
    /// Deciding a request may read its headers (identity or key from a
    /// header, forwarding headers): the HTTP/1.1 path builds a `HeaderMap`
    /// only then.
    pub reads_headers: bool,
    /// Each rule's decision counts, by rule id.
    counts: Vec<(u64, Arc<RuleCounts>)>,
}

impl Live {
    fn new(
        config: Config,
        limiter: Arc<Limiter<AnyStore>>,
        pool: Option<Arc<Pool>>,
        metrics: &Metrics,
    ) -> Self {
        let reads_headers = config.policy.reads_headers();
        let counts = config
            .policy
            .rules
            .iter()
            .map(|r| (r.rule.id(), metrics.counts(r.rule.name())))
            .collect();
        Self {
            config,
            limiter,
            pool,
            reads_headers,
            counts,
        }
    }

    /// The decision counts of the rule with this id.
    fn counts(&self, id: u64) -> Option<&RuleCounts> {
        self.counts
            .iter()
            .find(|(i, _)| *i == id)
            .map(|(_, c)| &**c)
    }
}

/// Everything a request needs; shared by all connections.
pub struct Gateway {
    live: ArcSwap<Live>,
    clock: Option<Arc<dyn ratewarden::clock::Clock>>,
    /// Metrics, exported by the admin API.
    pub metrics: Metrics,
}

/// Adds `decision`'s rate-limit headers (none when no rule matched).
pub(crate) fn add_rate_headers(
    decision: Option<&Decision>,
    headers: &mut HeaderMap,
    style: HeaderStyle,
) {
    if let Some(d) = decision {
        insert_headers(headers, d.header_fields(style));
    }
}

/// The answer to a refusal: the decision's rejection for
/// [`Refusal::Limited`], a problem body for the others.
pub(crate) fn refusal_answer(refusal: &Refusal, config: &Config) -> Response<Body> {
    match refusal {
        Refusal::Limited(d) => crate::answer::rejection(d, config.status, config.headers),
        other => problem_body(other.status(config.status), other.problem(config.status)),
    }
}

impl Gateway {
    /// A gateway running `config` on a new store.
    pub fn new(
        config: Config,
        clock: Option<Arc<dyn ratewarden::clock::Clock>>,
    ) -> Result<Arc<Self>, ratewarden::StoreError> {
        let store = AnyStore::new(&config.store, clock.clone())?;
        let pool = pool_for(&config, None);
        let metrics = Metrics::default();
        let live = Live::new(config, Arc::new(Limiter::new(store)), pool, &metrics);
        Ok(Arc::new(Self {
            live: ArcSwap::from_pointee(live),
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
        let limiter = if old.config.store == config.store {
            old.limiter.clone()
        } else {
            Arc::new(Limiter::new(AnyStore::new(
                &config.store,
                self.clock.clone(),
            )?))
        };
        // Same upstream: keep its warm connections.
        let pool = pool_for(&config, old.pool.as_ref());
        self.live
            .store(Arc::new(Live::new(config, limiter, pool, &self.metrics)));
        Ok(())
    }

    /// Runs a proxied request through the one admission path, records the
    /// decision (metrics, a log line per rejection) and waits out a
    /// `mode: delay` hold. `Err` says why the request must not go on.
    pub(crate) async fn admit<'l>(
        &self,
        live: &'l Live,
        facts: &Facts<'_>,
    ) -> Result<Admitted<'l>, Refusal> {
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
                    self.record(live, d);
                }
            }
            Err(Refusal::Limited(d)) => {
                self.metrics.decision_time(started.elapsed());
                self.record(live, d);
            }
            Err(Refusal::Denied(identity)) => tracing::info!(identity, "denied by `deny:`"),
            Err(Refusal::Unavailable(e)) => {
                tracing::warn!(error = %e, "limiter unavailable; on_error: deny");
            }
            Err(Refusal::NoIdentity(_)) => {}
        }
        let admitted = res?;
        if let Some(d) = &admitted.decision
            && !d.delay.is_zero()
        {
            tokio::time::sleep(d.delay).await;
        }
        Ok(admitted)
    }

    /// Counts a decision per rule, tracks bans, logs each rule's rejection.
    pub(crate) fn record(&self, live: &Live, d: &Decision) {
        for r in &d.rules {
            if let Some(c) = live.counts(r.rule.id()) {
                c.add(r.label());
            }
            if let Some(reason) = r.reason {
                let banned = reason == Reason::Banned
                    || (reason == Reason::Limit && r.rule.spec().penalty.is_some());
                if banned && let Some(left) = r.retry_after {
                    self.metrics
                        .banned(r.rule.name(), &r.key, Instant::now() + left);
                }
                tracing::info!(
                    rule = r.rule.name(),
                    key = r.key,
                    reason = reason.as_str(),
                    shadow = r.rule.is_shadow(),
                    "rejected"
                );
            }
        }
    }

    /// Settles the `count: failures` rules of `admitted` on the answer's
    /// `status`; a store error is counted, not fatal.
    pub(crate) async fn settle(&self, live: &Live, admitted: &Admitted<'_>, status: u16) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        if admitted.settle(&live.limiter, status, None).await.is_err() {
            self.metrics.store_error();
        }
    }
}

/// The pool for the configured upstream: `old` when it already serves that
/// address with the same TLS client.
fn pool_for(config: &Config, old: Option<&Arc<Pool>>) -> Option<Arc<Pool>> {
    let Upstream::Url(base) = &config.upstream else {
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
    let tls = config.upstream_tls.clone();
    match old {
        Some(p) if p.addr() == addr && p.host() == host.as_ref() && p.tls() == tls.as_ref() => {
            Some(p.clone())
        }
        _ => Some(Pool::new(addr, host, tls)),
    }
}
