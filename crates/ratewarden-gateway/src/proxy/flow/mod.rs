//! The request flow: the phases every request goes through, written once,
//! and the one driver that runs them in order ([`run`]) for every wire: the
//! HTTP/1.1 path (`proxy::h1`), hyper's path (`proxy::hyper`: HTTP/2,
//! HTTP/1.0, what the first hands over, and `Upgrade` tunnels), and the
//! authorisation hooks (`front::authz`). A wire supplies only what differs
//! ([`Wire`]): reading the request into a view, writing the gateway's own
//! answers in its framing, trying one server, and relaying an answer with a
//! tap on it. After pingora's `ProxyHttp`.
//!
//! 1. the request id: [`Flow::start`]
//! 2. the path a rule sees: [`Flow::rule_path`]
//! 3. the route: [`Flow::route`]
//! 4. the request view: the wire's ([`Wire::view`]: the bytes it read, or
//!    hyper's parts), the one view every fact is read through
//! 5. admit: [`Flow::decide`], through the one admission path
//! 6. a refusal, answered by the wire ([`answers::refusal_answer`]; the
//!    HTTP/1.1 path writes the same bytes from its cache)
//! 7. upstream attempts with failover, once ([`run`] over
//!    [`crate::proxy::failover::Failover`]), each the wire's
//!    ([`Wire::attempt`])
//! 8. the answer, relayed by the wire with the decision's rate-limit
//!    headers ([`Wire::relay`])
//! 9. **the end**, once per request whatever happened, when the answer has
//!    ended (its last byte or trailers, the client gone, the upstream
//!    failed): [`End::finish`] with the [`Outcome`] settles what the answer
//!    cost, gives the `concurrency` leases back, counts the answer and
//!    writes the access log's line.

pub(crate) mod answers;
mod cost;
mod end;
pub(crate) mod llm;
mod reserve;
mod run;
pub(crate) mod shaped;
pub(crate) mod tap;
mod traced;

use std::borrow::Cow;
use std::net::IpAddr;
use std::sync::Arc;

use ratewarden::{Decision, Rule};
use ratewarden_tower::admission::{Facts, Held, Identity, Refusal, Reserve, Settlement};
use ratewarden_tower::policy::PolicyRule;
use ratewarden_tower::view::RequestView;

use ratewarden::store::Mode;

use crate::config::cost::CostSource;
use crate::gateway::{Gateway, Live};
use crate::observe::metrics::RouteCounts;
use crate::observe::request_id::RequestId;
use crate::proxy::forward::{self, Edge};
use crate::store::AnyStore;
use crate::upstream::route::Group;

pub(crate) use answers::{Grpc, add_rate_headers, edge_answer, grpc_kind, refusal_answer};
pub(crate) use end::{End, Outcome};
pub(crate) use reserve::Reservations;
pub(crate) use run::{Own, Target, Tried, Wire, run};
pub(crate) use tap::{Read, Tap};

/// The status the access log gives a request whose client left before it
/// was answered (nginx's 499): nothing was sent back.
pub(crate) const CLIENT_GONE: u16 = 499;

/// One request's passage: what the phases learnt, for the ones after. Owns
/// what it reads (the gateway, the configuration in force), so that the
/// end phase can run where the answer ends, after the request's scope (a
/// body hyper streams, a tunnel).
pub(crate) struct Flow {
    pub(crate) gw: Arc<Gateway>,
    /// The configuration the request is decided under (one for all its
    /// phases, a reload meanwhile notwithstanding).
    pub(crate) live: Arc<Live>,
    /// Its id: the client's when valid, else a new one.
    pub(crate) rid: RequestId,
    arrival: quanta::Instant,
    /// What the access log and the metrics say of the answer.
    pub(crate) note: Note,
    counted: Counted,
    /// The model an LLM request's body names (read only when a rule is
    /// charged by an LLM's usage).
    pub(crate) llm_model: Option<String>,
    /// Its spans, when it is sampled.
    pub(crate) trace: Option<Box<traced::Traced>>,
}

/// Whose answer counts the request's answer.
enum Counted {
    /// No route was chosen (refused before, or at the edge).
    None,
    /// The route's.
    Route(Arc<RouteCounts>),
    /// No route took it: the echo upstream's, under the default route.
    Echo,
}

/// What the access log says of an answer, gathered as it is made.
#[derive(Default)]
pub(crate) struct Note {
    /// The client's identity, when a rule limits it.
    identity: Option<String>,
    /// The refusing rule's key.
    key: Option<String>,
    /// The refusing rule.
    rule: Option<Rule>,
    /// The consumer the request's API key named.
    pub(crate) consumer: Option<std::sync::Arc<ratewarden_tower::consumers::Consumer>>,
}

/// What the wire knows for the access log's line.
pub(crate) struct Line<'a> {
    pub(crate) peer: IpAddr,
    pub(crate) method: &'a str,
    /// The target as the client sent it.
    pub(crate) target: &'a [u8],
    pub(crate) version: &'static str,
    pub(crate) referer: Option<&'a [u8]>,
    pub(crate) user_agent: Option<&'a [u8]>,
}

/// What admission decided.
pub(crate) enum Decided {
    /// Not to go on.
    Refused(Refusal),
    /// To go on.
    Admitted(Pass),
}

/// A request admission let through: what the phases after it need, owned
/// (the admission itself borrowed the policy only while it decided).
pub(crate) struct Pass {
    /// The decision, for the answer's rate-limit headers; `None` when no
    /// rule matched.
    pub(crate) decision: Option<Decision>,
    /// The client's identity (for `balance: hash`; the echo says it).
    pub(crate) identity: String,
    /// What the answer settles when it has ended.
    pub(crate) settlement: Option<Settlement<AnyStore>>,
    /// Its `concurrency` leases, given back when it ends (or is dropped).
    pub(crate) held: Option<Held>,
    /// The request's body as it goes upstream, when an LLM rule edited it
    /// (`cap_max_output`, `include_usage`).
    pub(crate) body: Option<Vec<u8>>,
}

impl Flow {
    /// Phase 1: a request arrives under `live`, carrying `X-Request-Id`
    /// `given` (kept when valid).
    #[inline]
    pub(crate) fn start<'w>(
        gw: &Arc<Gateway>,
        live: &Arc<Live>,
        given: Option<&[u8]>,
        trace_fields: impl FnOnce() -> (Option<&'w [u8]>, Option<&'w [u8]>),
    ) -> Self {
        let arrival = crate::observe::access::arrived();
        let trace = live.tracer.as_ref().and_then(|t| {
            let (traceparent, tracestate) = trace_fields();
            t.begin(traceparent, tracestate)
                .map(|ids| traced::Traced::new(ids, arrival))
        });
        Self {
            trace,
            gw: gw.clone(),
            live: live.clone(),
            rid: RequestId::keep_or_make(given, arrival),
            arrival,
            note: Note::default(),
            counted: Counted::None,
            llm_model: None,
        }
    }

    /// Phase 2: the path rules and routes see, from the target as sent; an
    /// edge refusal otherwise.
    #[inline]
    pub(crate) fn rule_path<'t>(
        &self,
        method: &http::Method,
        target: &'t str,
    ) -> Result<Cow<'t, str>, Edge> {
        forward::rule_path(method, target)
    }

    /// Phase 3: the route `request` takes under `live` (the flow's own;
    /// `None`: the echo upstream's, when there are no servers).
    #[inline]
    pub(crate) fn route<'l>(
        &mut self,
        live: &'l Live,
        request: &RequestView<'_>,
    ) -> Option<(&'l str, &'l Arc<Group>)> {
        let chosen = live.router.route(request);
        self.counted = match chosen {
            Some((_, g)) => Counted::Route(g.counts.clone()),
            None => Counted::Echo,
        };
        chosen
    }

    /// Phases 4 and 5: `request` on `route`, through the one admission
    /// path; noting who the client is and, for a refusal, the rule that
    /// refused and its key. `body`, the request's body when the wire read
    /// it whole, sizes what a rule charged by an LLM's usage reserves.
    pub(crate) async fn decide(
        &mut self,
        request: RequestView<'_>,
        route: Option<&str>,
        body: Option<&[u8]>,
    ) -> Decided {
        // (Borrowed apart: the note is written while the admission borrows
        // the configuration.)
        let Self {
            gw,
            live,
            rid,
            note,
            llm_model,
            trace,
            ..
        } = self;
        let logged = gw.access.is_some() || trace.is_some();
        let claims = match gw.required_claims(live, &request, route) {
            Ok(c) => c,
            Err(r) => return Decided::Refused(r),
        };
        let consumer = match gw.consumer(live, &request) {
            Ok(c) => c,
            Err(r) => return Decided::Refused(r),
        };
        if let (true, Some(c)) = (logged, &consumer) {
            note.consumer = Some(c.clone());
        }
        // The body's JSON, when a rule reads it (`json:` key parts; a rule
        // charged by an LLM's usage reserves what it asks).
        let costs = &live.config.costs;
        let by_llm = costs.iter().any(|c| matches!(c.source, CostSource::Llm(_)));
        let json = body.filter(|_| live.reads_body()).and_then(llm::body_json);
        if let (Some(v), true) = (&json, by_llm) {
            *llm_model = llm::model_of(v);
        }
        let fields = json.as_ref().map(crate::jwt::BodyFields);
        let request = request
            .with_claims(claims.as_ref().map(|c| c as _))
            .with_consumer(consumer.as_deref())
            .with_body(fields.as_ref().map(|f| f as _));
        let (path, len) = (request.path, body.map_or(0, <[u8]>::len));
        // What a rule charged by an LLM's usage reserves; `cap_max_output`
        // lowers the output part (per choice) to what a peek found left.
        let reservations = Reservations::new(costs, json.as_ref(), path, len);
        let reserve = |r: &PolicyRule| reservations.of(r);
        let facts = Facts {
            request,
            identity: Identity::Resolve,
            route: Some(route.unwrap_or(crate::upstream::route::DEFAULT)),
            reserve: by_llm.then_some(&reserve as &Reserve<'_>),
        };
        if json.is_some() && live.caps_max_output() {
            // A peek (nothing charged): a refusal by a capping rule says
            // what is left, and the reservation is made to fit it.
            let peeked = live
                .config
                .policy
                .admit(&live.limiter, &facts, 1, Mode::Peek)
                .await;
            if let Err(Refusal::Limited(d)) = peeked {
                reservations.fit(&d);
            }
        }
        match gw.admit(live, &facts, rid).await {
            Ok(mut admitted) => {
                if logged && admitted.who().limited {
                    note.identity = Some(admitted.who().identity.clone());
                }
                let held = admitted.hold(&live.limiter);
                let body = reservations.edited();
                let settlement = admitted.settlement(&live.limiter);
                let decision = admitted.decision.take();
                let identity = admitted.into_who().identity;
                Decided::Admitted(Pass {
                    decision,
                    identity,
                    settlement,
                    held,
                    body,
                })
            }
            Err(refusal) => {
                if let (true, Refusal::Limited(d)) = (logged, &refusal) {
                    note.refused_by(d);
                    // The client's identity, apart from the refusing key;
                    // asked again only for a logged refusal.
                    note.identity = live
                        .config
                        .policy
                        .identify(&facts)
                        .ok()
                        .filter(|w| w.limited)
                        .map(|w| w.identity);
                }
                Decided::Refused(refusal)
            }
        }
    }
}

impl Note {
    /// The rule that refused `d`, and its key, for the log.
    fn refused_by(&mut self, d: &Decision) {
        if let Some(by) = d.rules.iter().find(|r| !r.allowed()) {
            self.key = Some(by.key.clone());
            self.rule = Some(by.rule.clone());
        }
    }
}
