//! The end phase: once per request, whatever happened, when its answer has
//! ended (the last body byte or the trailers, the client gone, the upstream
//! failed, or the gateway's own answer written): what the answer cost is
//! settled, the `concurrency` leases go back, the route counts the answer
//! and the access log gets its line. pingora's `logging` phase; Envoy's
//! `onDestroy`. Never at the response head: a streamed answer's cost (its
//! status in gRPC's trailers, the tokens it carried) is known only here.

use std::future::Future;

use ratewarden_tower::admission::{AnswerCost, Held, Settlement};

use super::tap::Metered;
use super::{Counted, Flow, Line, Read, Tap};
use crate::store::AnyStore;

/// How an answer ended, as the end phase reads it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Outcome {
    /// The status the client was sent (499: it left before an answer).
    pub(crate) status: u16,
    /// A gRPC answer's `grpc-status`, from its trailers or a trailers-only
    /// head: what `count: failures` rules read instead of the status.
    pub(crate) grpc_status: Option<u16>,
    /// Body bytes the client was sent, when known (a relayed answer's:
    /// what its [`Tap`] counted).
    pub(crate) bytes: Option<u64>,
    /// The upstream gave the answer (else the gateway did).
    pub(crate) from_upstream: bool,
}

impl Outcome {
    /// The gateway's own answer of `status`, `bytes` long.
    pub(crate) fn own(status: u16, bytes: Option<u64>) -> Self {
        Self {
            status,
            bytes,
            ..Self::default()
        }
    }
}

/// What the end phase needs, carried to where a request's answer ends: its
/// flow, what the answer settles, its leases. Made when the request
/// arrives and kept in place (a flow carries its request id: moving it
/// from future to future cost the HTTP/1.1 path a copy each time).
pub(crate) struct End {
    pub(crate) flow: Flow,
    pub(crate) settlement: Option<Settlement<AnyStore>>,
    pub(crate) held: Option<Held>,
    /// What the answer's body showed as it was relayed.
    pub(crate) tap: Tap,
}

impl End {
    /// The end of a request that arrives under `live` with `X-Request-Id`
    /// `given`: its flow starts (phase 1).
    #[inline]
    pub(crate) fn start<'w>(
        gw: &std::sync::Arc<crate::gateway::Gateway>,
        live: &std::sync::Arc<crate::gateway::Live>,
        given: Option<&[u8]>,
        trace: impl FnOnce() -> (Option<&'w [u8]>, Option<&'w [u8]>),
    ) -> Self {
        Self {
            flow: Flow::start(gw, live, given, trace),
            settlement: None,
            held: None,
            tap: Tap::default(),
        }
    }

    /// The request's flow.
    pub(crate) fn flow(&self) -> &Flow {
        &self.flow
    }

    /// Gives the leases back now, waiting for the store: the answer's last
    /// bytes are about to go out, and a client that sends its next request
    /// at once must find its slot free. ([`End::finish`] gives back any
    /// still held.)
    pub(crate) async fn release_leases(&mut self) {
        if let Some(h) = self.held.take() {
            h.release().await;
        }
    }

    /// The end phase, which each wire runs once per request (the driver
    /// where the gateway answers; the wire's relay where the upstream's
    /// answer ends). Gives the leases back, counts the answer under its
    /// route, writes the access log's line (`line` is asked only when there
    /// is a log), and returns what settling costs the store, if anything:
    /// the `count: failures` rules on the answer's status (or gRPC status),
    /// which a wire awaits (the HTTP/1.1 path, before its next request) or
    /// spawns (where a body ends). A store error is not fatal: the store
    /// counted it.
    pub(crate) fn finish<'a>(
        &mut self,
        mut outcome: Outcome,
        line: impl FnOnce() -> Line<'a>,
    ) -> Option<impl Future<Output = ()> + Send + 'static> {
        self.held = None;
        if outcome.from_upstream {
            outcome.bytes = outcome.bytes.or(Some(self.tap.bytes));
        }
        let flow = &self.flow;
        let (status, from_upstream) = (outcome.status, outcome.from_upstream);
        match &flow.counted {
            Counted::Route(c) => c.response(status, from_upstream),
            Counted::Echo => flow.live.unrouted[0].response(status, from_upstream),
            Counted::None => flow.live.unrouted[1].response(status, false),
        }
        // What the answer cost each rule charged by it: what its meter
        // read; nothing when the upstream failed before any output (the
        // gateway's own 5xx, or the upstream's with no body); unknown
        // otherwise (the reservation stays: the safe side).
        let reads = if self.tap.reads() {
            self.tap.read()
        } else {
            Vec::new()
        };
        let nothing = outcome.status >= 500 && (!outcome.from_upstream || self.tap.bytes == 0);
        let gone = outcome.status == super::CLIENT_GONE;
        let cost_of = move |reads: &[Metered], rule: &str| match reads
            .iter()
            .find(|m| m.rule == rule)
            .map(|m| m.read)
        {
            _ if nothing => AnswerCost::Nothing,
            Some(Read::Cost(c)) => AnswerCost::Known(c),
            Some(Read::Missing(_)) | None => AnswerCost::Unknown,
        };
        let traced = self.flow.trace.take();
        let flow = &self.flow;
        let line = (flow.gw.access.is_some() || traced.is_some()).then(line);
        if let (Some(t), Some(line), Some(tracer)) = (traced, &line, &flow.live.tracer) {
            let target = String::from_utf8_lossy(line.target);
            let path = target.split('?').next().unwrap_or_default();
            tracer.send(t.spans(status, line.method, path, &tracer.store));
        }
        if let (Some(log), Some(line)) = (&flow.gw.access, line) {
            let n = &flow.note;
            let (time, duration) = crate::observe::access::since(flow.arrival);
            // An LLM call's account: its usage, what was reserved and what
            // charged (the reservation, when nothing is settled).
            let llm = reads
                .iter()
                .find(|m| m.tokens.is_some() || m.model.is_some())
                .map(|m| {
                    let reserved = self
                        .settlement
                        .as_ref()
                        .and_then(|s| s.owed().iter().find(|o| o.rule.name() == m.rule))
                        .and_then(|o| o.reserved)
                        .unwrap_or(0);
                    let charged = match cost_of(&reads, &m.rule) {
                        _ if gone => reserved,
                        AnswerCost::Known(c) => c,
                        AnswerCost::Nothing => 0,
                        AnswerCost::Unknown => reserved,
                    };
                    crate::observe::access::LlmLine {
                        model: m.model.clone(),
                        tokens_in: m.tokens.map(|t| t.input + t.cached),
                        tokens_out: m.tokens.map(|t| t.output),
                        reserved,
                        charged,
                    }
                });
            log.log(&crate::observe::access::Record {
                time,
                peer: line.peer,
                method: line.method,
                target: line.target,
                version: line.version,
                status,
                bytes: outcome.bytes,
                duration,
                request_id: &flow.rid,
                identity: n.identity.as_deref(),
                key: n.key.as_deref(),
                consumer: n.consumer.as_ref().map(|c| c.name.as_str()),
                rule: n.rule.as_ref().map(ratewarden::Rule::name),
                tier: n.rule.as_ref().and_then(|r| {
                    if r.is_override() {
                        Some("override")
                    } else {
                        r.tier()
                    }
                }),
                referer: line.referer,
                user_agent: line.user_agent,
                llm: llm.as_ref(),
            });
        }
        // A client that left before any answer settles nothing: there was
        // no answer to count as a failure or a success.
        if gone {
            return None;
        }
        let settlement = self.settlement.take()?;
        let metrics = &flow.gw.metrics;
        for m in &reads {
            if let Some(t) = m.tokens {
                metrics.llm_tokens(&m.rule, t.dialect, [t.input, t.cached, t.output]);
            }
            if let (Read::Missing(reason), false) = (m.read, nothing) {
                let n = metrics.cost_missing(&m.rule, reason);
                missing_logged(&m.rule, reason, n);
            }
        }
        Some(
            settlement.on_end(outcome.status, outcome.grpc_status, move |o| {
                cost_of(&reads, o.rule.name())
            }),
        )
    }
}

/// Logs an answer whose cost could not be read, once per 10 s (the count
/// says how many in all: `ratewarden_llm_usage_missing_total`).
fn missing_logged(rule: &str, reason: &str, so_far: u64) {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    if now >= last + 10
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
    {
        tracing::warn!(
            rule,
            reason,
            so_far,
            "an answer to rule {rule} named no cost that could be read ({reason}): its reservation stays charged ({so_far} so far)"
        );
    }
}
