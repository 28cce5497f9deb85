//! A sampled request's spans (issue 50), gathered as its phases run and
//! sent when it ends: the server span (OpenTelemetry's HTTP conventions and
//! the decision), a child for the store's decision, and a child (kind
//! client) for the upstream's exchange, whose id the upstream receives in
//! `traceparent`. A request that is not sampled carries none of this
//! (`Flow::trace` is `None`): its cost is one branch per phase.

use ratewarden_tower::admission::Refusal;

use crate::observe::trace::{Ids, proto, unix_nanos};

/// What a sampled request's spans say, so far.
pub(crate) struct Traced {
    pub(crate) ids: Ids,
    start: u64,
    /// The decision's span: its start and end.
    store: Option<(u64, u64)>,
    /// The decision's attributes on the server span.
    decision: Vec<proto::KeyValue>,
    /// Why it was refused, for the server span's status.
    refused: Option<String>,
    upstream: Option<Upstream>,
    /// The route's name, for `http.route` and the span's name.
    route: Option<String>,
}

struct Upstream {
    span_id: [u8; 8],
    start: u64,
    server: Option<String>,
    events: Vec<proto::Event>,
    error: Option<String>,
}

impl Traced {
    pub(crate) fn new(ids: Ids, arrival: quanta::Instant) -> Box<Self> {
        Box::new(Self {
            ids,
            start: unix_nanos(arrival),
            store: None,
            decision: vec![],
            refused: None,
            upstream: None,
            route: None,
        })
    }

    /// The decision ran from `from` to now.
    pub(crate) fn decided(
        &mut self,
        from: quanta::Instant,
        decision: Option<&ratewarden::Decision>,
        refusal: Option<&Refusal>,
        consumer: Option<&str>,
        route: Option<&str>,
    ) {
        self.route = route.map(str::to_owned);
        self.store = Some((unix_nanos(from), unix_nanos(quanta::Instant::now())));
        let d = decision.or(match refusal {
            Some(Refusal::Limited(d)) => Some(d),
            _ => None,
        });
        let a = &mut self.decision;
        if let Some(d) = d {
            // The rule that binds: the refusing one, else the one nearest
            // its limit.
            let by = d
                .rules
                .iter()
                .find(|r| !r.allowed())
                .or_else(|| d.rules.iter().min_by_key(|r| r.remaining));
            if let Some(r) = by {
                a.push(proto::s("ratewarden.rule", r.rule.name()));
                if let Some(t) = r.rule.tier() {
                    a.push(proto::s("ratewarden.tier", t));
                }
                match consumer {
                    Some(c) => a.push(proto::s("ratewarden.key", c)),
                    None => a.push(proto::s("ratewarden.key", r.key.as_str())),
                }
                a.push(proto::i("ratewarden.remaining", r.remaining as i64));
                a.push(proto::i(
                    "ratewarden.reset_after",
                    r.reset_after.as_millis() as i64,
                ));
            }
        }
        let limited = refusal.is_some();
        a.push(proto::b("ratewarden.limited", limited));
        if let Some(r) = refusal {
            self.refused = Some(match r {
                Refusal::Limited(d) => match d.rules.iter().find(|r| !r.allowed()) {
                    Some(r) => format!(
                        "refused by rule {}: {}",
                        r.rule.name(),
                        r.reason.map_or("limited", |x| x.as_str())
                    ),
                    None => "refused: limited".into(),
                },
                other => format!("refused: {}", refusal_kind(other)),
            });
        }
    }

    /// The upstream's exchange begins: its span's id, which the upstream
    /// receives as its parent.
    pub(crate) fn upstream_begins(&mut self) -> [u8; 8] {
        let span_id = self.ids.child();
        self.upstream = Some(Upstream {
            span_id,
            start: unix_nanos(quanta::Instant::now()),
            server: None,
            events: vec![],
            error: None,
        });
        span_id
    }

    /// The `traceparent` the upstream is sent.
    pub(crate) fn upstream_traceparent(&self) -> Option<[u8; 55]> {
        let u = self.upstream.as_ref()?;
        Some(crate::observe::trace::traceparent(
            &self.ids.trace_id,
            &u.span_id,
            true,
        ))
    }

    /// A server of the upstream could not be connected to: the next is
    /// tried (an event on the upstream's span).
    pub(crate) fn retried(&mut self, server: &str, error: &str) {
        if let Some(u) = &mut self.upstream {
            u.events.push(proto::Event {
                time_unix_nano: unix_nanos(quanta::Instant::now()),
                name: "retry".into(),
                attributes: vec![
                    proto::s("server.address", server),
                    proto::s("error.message", error),
                ],
            });
        }
    }

    /// The server that answered (or failed).
    pub(crate) fn tried(&mut self, server: &str, error: Option<String>) {
        if let Some(u) = &mut self.upstream {
            u.server = Some(server.to_owned());
            u.error = error;
        }
    }

    /// The request's spans, its answer `status` sent, now.
    pub(crate) fn spans(
        self,
        status: u16,
        method: &str,
        path: &str,
        store: &(&'static str, Option<String>),
    ) -> Vec<proto::Span> {
        let end = unix_nanos(quanta::Instant::now());
        let Self {
            ids,
            start,
            store: decided,
            decision,
            refused,
            upstream,
            route,
        } = self;
        let route = route.as_deref();
        let trace_id = ids.trace_id.to_vec();
        let state = ids.state.as_deref().unwrap_or("").to_owned();
        let mut spans = Vec::with_capacity(3);
        if let Some((from, to)) = decided {
            let mut attributes = vec![proto::s("db.system.name", store.0)];
            if let Some(node) = &store.1 {
                attributes.push(proto::s("server.address", node.as_str()));
            }
            attributes.push(proto::s("db.operation.name", "decide"));
            spans.push(proto::Span {
                trace_id: trace_id.clone(),
                span_id: ids.child().to_vec(),
                trace_state: state.clone(),
                parent_span_id: ids.span_id.to_vec(),
                name: "ratewarden decide".into(),
                kind: proto::KIND_CLIENT,
                start_time_unix_nano: from,
                end_time_unix_nano: to,
                attributes,
                events: vec![],
                status: None,
            });
        }
        if let Some(u) = upstream {
            let mut attributes = vec![proto::s("http.request.method", method)];
            if let Some(s) = &u.server {
                attributes.push(proto::s("server.address", s.as_str()));
            }
            if u.error.is_none() && u.server.is_some() {
                attributes.push(proto::i("http.response.status_code", i64::from(status)));
            }
            spans.push(proto::Span {
                trace_id: trace_id.clone(),
                span_id: u.span_id.to_vec(),
                trace_state: state.clone(),
                parent_span_id: ids.span_id.to_vec(),
                name: method.to_owned(),
                kind: proto::KIND_CLIENT,
                start_time_unix_nano: u.start,
                end_time_unix_nano: end,
                attributes,
                events: u.events,
                status: u.error.map(|message| proto::Status {
                    message,
                    code: proto::STATUS_ERROR,
                }),
            });
        }
        let mut attributes = vec![
            proto::s("http.request.method", method),
            proto::s("url.path", path),
            proto::i("http.response.status_code", i64::from(status)),
        ];
        if let Some(r) = route {
            attributes.push(proto::s("http.route", r));
        }
        attributes.extend(decision);
        let status = match refused {
            Some(message) => Some(proto::Status {
                message,
                code: proto::STATUS_ERROR,
            }),
            None if status >= 500 => Some(proto::Status {
                message: String::new(),
                code: proto::STATUS_ERROR,
            }),
            None => None,
        };
        spans.push(proto::Span {
            trace_id,
            span_id: ids.span_id.to_vec(),
            trace_state: state,
            parent_span_id: ids.parent.map(|p| p.to_vec()).unwrap_or_default(),
            name: match route {
                Some(r) => format!("{method} {r}"),
                None => method.to_owned(),
            },
            kind: proto::KIND_SERVER,
            start_time_unix_nano: start,
            end_time_unix_nano: end,
            attributes,
            events: vec![],
            status,
        });
        spans
    }
}

fn refusal_kind(r: &Refusal) -> &'static str {
    match r {
        Refusal::Limited(_) => "limited",
        Refusal::Denied(_) => "denied",
        Refusal::NoIdentity(_) => "no identity",
        Refusal::Unavailable(_) => "store unavailable",
        Refusal::Unauthenticated => "unauthenticated",
        Refusal::NoConsumer => "no consumer",
        Refusal::MissingPart { .. } => "missing key part",
    }
}
