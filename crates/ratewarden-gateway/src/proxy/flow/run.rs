//! The one driver of a request's phases ([`run`]) and what a wire supplies
//! to it ([`Wire`]). The order of phases, the upstream attempts with
//! failover, and the end phase exist here once; a wire reads, writes and
//! relays in its own framing.

use std::future::Future;
use std::io;
use std::sync::Arc;

use http::{Method, Response};
use ratewarden_tower::admission::Refusal;
use ratewarden_tower::view::RequestView;

use super::{CLIENT_GONE, Decided, End, Flow, Line, Outcome, Pass};
use crate::answer::Body;
use crate::gateway::{Gateway, Live};
use crate::proxy::failover::Failover;
use crate::proxy::forward::Edge;
use crate::upstream::pool::UpstreamError;
use crate::upstream::route::{Chosen, Group};

/// Where an admitted request goes.
pub(crate) enum Target {
    /// A route's servers.
    Upstream(Arc<Group>),
    /// Nowhere: the wire answers it itself ([`Own::Admitted`]): the echo
    /// upstream, an authorisation hook's "go on".
    Itself,
}

/// The gateway's own answers, which a wire writes in its framing.
pub(crate) enum Own<'a> {
    /// A refusal (the HTTP/1.1 path writes a limit's from its cache; a gRPC
    /// request's is a gRPC status).
    Refused(&'a Refusal),
    /// The edge's refusal, before any rule saw the request.
    Edge(Edge),
    /// A whole answer: a failed upstream's (502, 504, with the decision's
    /// rate-limit headers), or the client's body that failed.
    Answer(Response<Body>),
    /// A request admitted to go nowhere ([`Target::Itself`]).
    Admitted(&'a Pass),
}

/// How one attempt on a server went.
pub(crate) enum Tried<H> {
    /// It answered: the answer's head, as the wire read it.
    Answered(H),
    /// It could not be connected to: nothing was sent, the next server may
    /// be tried.
    Unsent(UpstreamError),
    /// No answer's head within `upstream_timeout`: 504.
    TimedOut,
    /// The exchange broke after the request went out: 502, saying the
    /// first (and logging the second).
    Broke(std::borrow::Cow<'static, str>, String),
    /// The wire's own answer, the server not at fault (the client's body
    /// failed, a target that cannot be sent).
    Answer(Response<Body>),
    /// The client left while the attempt waited: nothing is answered.
    ClientGone,
}

/// What a wire does for the flow; the rest is [`run`]'s.
pub(crate) trait Wire {
    /// What the wire's caller gets once the request is done (the HTTP/1.1
    /// path: whether the connection goes on; hyper's: the response).
    type Done;
    /// An upstream answer's head, as the wire read it.
    type Head;

    /// The request's `X-Request-Id`, as sent.
    fn request_id(&self) -> Option<&[u8]>;
    /// Why the edge refuses the request before the flow reads it (a bad
    /// `Host`, a body declared too large), if it does.
    fn edge(&self) -> Option<Edge> {
        None
    }
    /// The request's `traceparent` and `tracestate`, as sent.
    fn trace_fields(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        (None, None)
    }
    /// The request's method.
    fn method(&self) -> &Method;
    /// The target as the client sent it (origin form, or `*`).
    fn target(&self) -> &str;
    /// Reads the request's body whole before the decision, when a rule
    /// reads it (the HTTP/1.1 path has already: a body of declared
    /// length); the edge's refusal when it fails (too large, stalled,
    /// malformed).
    fn read_body(&mut self, _flow: &Flow) -> impl Future<Output = Result<(), Edge>> + Send {
        async { Ok(()) }
    }
    /// The request's body, when the wire read it whole before the flow (the
    /// HTTP/1.1 path, a body of declared length): what a rule charged by an
    /// LLM's usage reserves is read from it.
    fn body(&self) -> Option<&[u8]> {
        None
    }
    /// Sends `body` upstream in place of the request's own (which the wire
    /// read whole: [`Wire::body`]), with its length; a wire that sends no
    /// body upstream has nothing to replace.
    fn replace_body(&mut self, _body: Vec<u8>) {}
    /// The one view of the request, with `path` as a rule sees it and
    /// `target` as [`Wire::target`] gave it (asked once).
    fn view<'a>(&'a self, path: &'a str, target: &'a str) -> RequestView<'a>;
    /// Where a request goes: the router's route for `request` by default
    /// (its name for the rules that match on it, and its servers).
    fn route<'l>(
        &self,
        flow: &mut Flow,
        live: &'l Live,
        request: &RequestView<'_>,
    ) -> (Option<&'l str>, Target) {
        match flow.route(live, request) {
            Some((name, group)) => (Some(name), Target::Upstream(group.clone())),
            None => (None, Target::Itself),
        }
    }
    /// Writes one of the gateway's own answers; what the end phase reads
    /// of it.
    fn answer(
        &mut self,
        flow: &Flow,
        own: Own<'_>,
    ) -> impl Future<Output = io::Result<(Self::Done, Outcome)>> + Send;
    /// Readies the request for its upstream, once, before the first attempt
    /// (the target it is sent with); the edge's refusal otherwise.
    fn prepare(&mut self, _flow: &Flow) -> Result<(), Edge> {
        Ok(())
    }
    /// One attempt on `chosen`, a server of `group`: the request sent, the
    /// answer's head read.
    fn attempt(
        &mut self,
        flow: &Flow,
        chosen: &Chosen<'_>,
        group: &Group,
    ) -> impl Future<Output = Tried<Self::Head>> + Send;
    /// Relays `head`'s answer: the head with `decision`'s rate-limit
    /// headers, the body through the wire's tap; finishes `end` (exactly
    /// once) when the answer has ended, however it ends.
    fn relay(
        &mut self,
        end: End,
        decision: Option<ratewarden::Decision>,
        head: Self::Head,
        chosen: Chosen<'_>,
    ) -> impl Future<Output = io::Result<Self::Done>> + Send;
    /// What the caller gets when the client left before an answer.
    fn gone(&mut self) -> Self::Done;
    /// The access log's line (asked only when there is a log).
    fn line(&self) -> Line<'_>;
}

/// Runs one request through its phases, in order, on `wire`.
pub(crate) async fn run<W: Wire + Send>(
    gw: &Arc<Gateway>,
    live: &Arc<Live>,
    wire: &mut W,
) -> io::Result<W::Done> {
    // The trace fields are looked up only when tracing is on.
    let mut end = End::start(gw, live, wire.request_id(), || wire.trace_fields());
    if let Some(e) = wire.edge() {
        return answered(wire, &mut end, Own::Edge(e)).await;
    }
    // A rule that reads the body (a `json:` key part, a cost reserved from
    // it) has it read whole first.
    if live.reads_body()
        && let Err(e) = wire.read_body(&end.flow).await
    {
        return answered(wire, &mut end, Own::Edge(e)).await;
    }
    // Phases 2 to 5, borrowing the request from the wire until admission
    // has decided.
    let (target, decided) = {
        let target = wire.target();
        let path = match end.flow.rule_path(wire.method(), target) {
            Ok(p) => p,
            Err(e) => return answered(wire, &mut end, Own::Edge(e)).await,
        };
        let request = wire.view(&path, target);
        let (route, target) = wire.route(&mut end.flow, live, &request);
        let body = wire.body();
        let from = end.flow.trace.is_some().then(quanta::Instant::now);
        let decided = end.flow.decide(request, route, body).await;
        if let (Some(t), Some(from)) = (&mut end.flow.trace, from) {
            let (decision, refusal) = match &decided {
                Decided::Refused(r) => (None, Some(r)),
                Decided::Admitted(p) => (p.decision.as_ref(), None),
            };
            let consumer = end.flow.note.consumer.as_ref().map(|c| c.name.as_str());
            t.decided(from, decision, refusal, consumer, route);
            // The trace as an exemplar of the decision's time and of the
            // refusing rule's count.
            let metrics = &end.flow.gw.metrics;
            metrics.decision_exemplar(from.elapsed(), t.ids.trace_id);
            if let Some(Refusal::Limited(d)) = refusal
                && let Some(by) = d.rules.iter().find(|r| !r.allowed())
            {
                metrics.refusal_exemplar(by.rule.name(), t.ids.trace_id);
            }
        }
        (target, decided)
    };
    let mut pass = match decided {
        Decided::Refused(r) => return answered(wire, &mut end, Own::Refused(&r)).await,
        Decided::Admitted(pass) => pass,
    };
    if let Some(body) = pass.body.take() {
        wire.replace_body(body);
    }
    end.settlement = pass.settlement.take();
    end.held = pass.held.take();
    if let Some(s) = &end.settlement {
        let model = end.flow.llm_model.take();
        super::cost::meter(&mut end.tap, &live.config.costs, s.owed(), model);
    }
    let group = match target {
        Target::Itself => return answered(wire, &mut end, Own::Admitted(&pass)).await,
        Target::Upstream(g) => g,
    };
    if let Some(t) = &mut end.flow.trace {
        t.upstream_begins();
    }
    if let Err(e) = wire.prepare(&end.flow) {
        return answered(wire, &mut end, Own::Edge(e)).await;
    }
    // Phase 7: the attempts, one server after another while none could be
    // connected to.
    let timeout = live.config.upstream_timeout;
    let mut attempts = Failover::new(&group, &gw.metrics, &pass.identity);
    let answered_by = loop {
        let chosen = match attempts.next() {
            Ok(c) => c,
            Err(failed) => break Err(*failed),
        };
        let tried = wire.attempt(&end.flow, &chosen, &group).await;
        if let Some(t) = &mut end.flow.trace {
            let server = &chosen.server().label;
            match &tried {
                Tried::Answered(_) => t.tried(server, None),
                Tried::Unsent(e) => t.retried(server, &e.to_string()),
                Tried::TimedOut => t.tried(server, Some(format!("no answer within {timeout:?}"))),
                Tried::Broke(why, _) => t.tried(server, Some(why.to_string())),
                Tried::Answer(_) | Tried::ClientGone => {}
            }
        }
        match tried {
            Tried::Answered(head) => {
                attempts.answered(&chosen);
                break Ok((head, chosen));
            }
            Tried::Unsent(e) => attempts.unsent(&chosen, &e),
            Tried::TimedOut => break Err(attempts.timed_out(&chosen, timeout)),
            Tried::Broke(why, error) => break Err(attempts.broke(&chosen, why, error)),
            Tried::Answer(answer) => {
                attempts.done();
                break Err(answer);
            }
            Tried::ClientGone => {
                // The upstream's request was dropped with its connection;
                // nothing is settled (no answer was seen).
                attempts.done();
                drop(chosen);
                finish(&mut end, Outcome::own(CLIENT_GONE, None), wire).await;
                return Ok(wire.gone());
            }
        }
    };
    match answered_by {
        Ok((head, chosen)) => wire.relay(end, pass.decision, head, chosen).await,
        Err(mut failed) => {
            super::add_rate_headers(
                pass.decision.as_ref(),
                failed.headers_mut(),
                live.config.headers,
            );
            answered(wire, &mut end, Own::Answer(failed)).await
        }
    }
}

/// The gateway's own answer written, then the end phase.
async fn answered<W: Wire>(wire: &mut W, end: &mut End, own: Own<'_>) -> io::Result<W::Done> {
    match wire.answer(&end.flow, own).await {
        Ok((done, outcome)) => {
            finish(end, outcome, wire).await;
            Ok(done)
        }
        Err(e) => {
            // The client went away while it was written.
            finish(end, Outcome::own(CLIENT_GONE, None), wire).await;
            Err(e)
        }
    }
}

/// The end phase, its store call awaited.
async fn finish<W: Wire>(end: &mut End, outcome: Outcome, wire: &W) {
    if let Some(settle) = end.finish(outcome, || wire.line()) {
        settle.await;
    }
}
