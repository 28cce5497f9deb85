//! hyper's path: HTTP/2, HTTP/1.0 and whatever the HTTP/1.1 path hands
//! over. hyper parses; the edge checks, the path rules see, the target and
//! fields sent upstream and the failure answers are [`super::forward`]'s,
//! as on the HTTP/1.1 path.

use std::io;
use std::sync::Arc;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::answer::Body;
use crate::gateway::{Gateway, Live};
use crate::observe::request_id::{self, RequestId};
use crate::proxy::failover::unsent_why;
use crate::proxy::flow::{
    End, Flow, Grpc, Line, Outcome, Own, Tried, Wire, add_rate_headers, edge_answer, grpc_kind,
    refusal_answer,
};
use crate::proxy::forward::{
    self, Edge, aim, check_host, drops_length, push_forwarded_for, strip_hop_by_hop, tls_cause,
};
use crate::proxy::tunnel::Answered;
use crate::upstream::pool::{BodyFault, BodyFaults, ClientBody, SendFailed, UpstreamError};
use crate::upstream::route::{Chosen, Group};
use ratewarden_tower::view::{Fields, RequestView};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
/// [`forward::X_FORWARDED`] as header names, made at compile time.
const X_FORWARDED_NAMES: [HeaderName; 3] = [
    HeaderName::from_static(forward::X_FORWARDED[0]),
    HeaderName::from_static(forward::X_FORWARDED[1]),
    HeaderName::from_static(forward::X_FORWARDED[2]),
];

/// Removes the request fields whose names contain `_` (see
/// [`forward::dropped_request_field`]).
fn strip_underscores(h: &mut HeaderMap) {
    let found: Vec<HeaderName> = h
        .keys()
        .filter(|k| k.as_str().contains('_'))
        .cloned()
        .collect();
    for n in found {
        h.remove(n);
    }
}

/// What the edge refuses of a request hyper parsed: `CONNECT`, a missing,
/// repeated or invalid `Host` on HTTP/1.1 (a repeated or invalid one on
/// HTTP/1.0), an HTTP/2 `:authority` that disagrees with `Host`, an
/// HTTP/1.x absolute-form target whose authority disagrees with `Host`
/// (RFC 9112 §3.2.2 makes the target's win; refusing keeps one authority
/// for rules, routes and the upstream alike), and userinfo in either.
pub(crate) fn edge_check(parts: &Parts) -> Result<(), Edge> {
    if parts.method == Method::CONNECT {
        return Err(Edge::Connect);
    }
    if parts
        .uri
        .authority()
        .is_some_and(|a| a.as_str().contains('@'))
    {
        return Err(Edge::Userinfo);
    }
    let hosts = || {
        parts
            .headers
            .get_all(header::HOST)
            .iter()
            .map(HeaderValue::as_bytes)
    };
    // An absolute-form target (HTTP/1.x): its authority and `Host` name
    // one host, or the request is refused.
    let absolute =
        |hosts: &mut dyn Iterator<Item = &[u8]>| match (parts.uri.authority(), hosts.next()) {
            (Some(a), Some(h)) => {
                let default = if parts.uri.scheme() == Some(&http::uri::Scheme::HTTPS) {
                    443
                } else {
                    80
                };
                if forward::same_authority(a.as_str(), h, default) {
                    Ok(())
                } else {
                    Err(Edge::AuthorityMismatch)
                }
            }
            _ => Ok(()),
        };
    match parts.version {
        Version::HTTP_11 => check_host(hosts()).and_then(|()| absolute(&mut hosts())),
        Version::HTTP_2 | Version::HTTP_3 => {
            let mut all = hosts();
            match (parts.uri.authority(), all.next(), all.next()) {
                (_, Some(_), Some(_)) => Err(Edge::TwoHosts),
                (Some(a), Some(h), None)
                    if !a.as_str().as_bytes().eq_ignore_ascii_case(h.trim_ascii()) =>
                {
                    Err(Edge::AuthorityMismatch)
                }
                _ => Ok(()),
            }
        }
        _ => match hosts().count() {
            0 => Ok(()),
            _ => check_host(hosts()).and_then(|()| absolute(&mut hosts())),
        },
    }
}

/// Handles one request on hyper's path, through the one flow
/// ([`crate::proxy::flow::run`]) with hyper's parts and bodies as its wire:
/// the answer carries the request's id.
pub(crate) async fn handle(
    gw: &Arc<Gateway>,
    req: Request<Incoming>,
    client: forward::Client,
) -> Response<Body> {
    let live = gw.live();
    let mut wire = Hyper::new(req, client, &live, gw.access.is_some());
    let mut resp = match crate::proxy::flow::run(gw, &live, &mut wire).await {
        Ok(r) => r,
        // (This wire's answers are built, not written: nothing fails.)
        Err(_) => Response::new(crate::answer::empty_body()),
    };
    if let Some(Ok(v)) = wire.rid.map(|r| HeaderValue::from_bytes(r.as_bytes())) {
        resp.headers_mut().insert(request_id::HEADER, v);
    }
    resp
}

/// What the access log's line needs of a request, kept before hyper's
/// parts go to the upstream (only when there is a log).
struct Kept {
    peer: std::net::IpAddr,
    method: Method,
    target: String,
    version: &'static str,
    referer: Option<Vec<u8>>,
    user_agent: Option<Vec<u8>>,
}

impl Kept {
    fn line(&self) -> Line<'_> {
        Line {
            peer: self.peer,
            method: self.method.as_str(),
            target: self.target.as_bytes(),
            version: self.version,
            referer: self.referer.as_deref(),
            user_agent: self.user_agent.as_deref(),
        }
    }
}

/// hyper's path as a wire of the one flow: the request's parts and body,
/// the answers built as responses for hyper to write.
struct Hyper {
    parts: Parts,
    /// The client's body, until the request upstream is made of it.
    body: Option<Incoming>,
    /// The client's body read whole before the decision (a rule charged by
    /// an LLM's usage reads it), with its trailers.
    buffered: Option<(bytes::Bytes, Option<HeaderMap>)>,
    /// The request upstream, made and not sent (hyper hands back one a
    /// server could not be connected to, for the next).
    outgoing: Option<Request<ClientBody>>,
    fault: Option<Arc<BodyFaults>>,
    client: forward::Client,
    /// Why the edge refuses it, found when it was read.
    edge: Option<Edge>,
    /// A gRPC request: its refusals are gRPC statuses.
    grpc: Option<Grpc>,
    /// An `Upgrade` request (a tunnel): the protocol asked for, and the
    /// client's side of the upgrade.
    upgrade: Option<(HeaderValue, Option<hyper::upgrade::OnUpgrade>)>,
    /// The target sent after the server's prefix.
    upstream_target: String,
    /// The request id the flow chose, for the answer's header.
    rid: Option<RequestId>,
    kept: Option<Kept>,
}

impl Hyper {
    fn new(req: Request<Incoming>, client: forward::Client, live: &Live, logged: bool) -> Self {
        let (mut parts, body) = req.into_parts();
        let grpc = grpc_kind(
            parts
                .headers
                .get(http::header::CONTENT_TYPE)
                .map(|v| v.as_bytes()),
        );
        // A declared length over `client_max_body_size` is refused before
        // any rule counts the request (nginx: before it is proxied).
        let max = live.config.client_max_body_size;
        let declared = parts
            .headers
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
        let edge = edge_check(&parts).err().or_else(|| {
            (max != 0 && declared.is_some_and(|n| n > max)).then_some(Edge::TooLarge(max))
        });
        if !live.config.underscores_in_headers {
            strip_underscores(&mut parts.headers);
        }
        let kept = logged.then(|| {
            let header = |n: HeaderName| parts.headers.get(n).map(|v| v.as_bytes().to_vec());
            Kept {
                peer: client.peer.ip(),
                method: parts.method.clone(),
                target: parts
                    .uri
                    .path_and_query()
                    .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
                version: version_name(parts.version),
                referer: header(header::REFERER),
                user_agent: header(header::USER_AGENT),
            }
        });
        let upgrade = super::tunnel::asked(&parts).map(|protocol| {
            let on = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
            (protocol, on)
        });
        Self {
            parts,
            body: Some(body),
            buffered: None,
            outgoing: None,
            fault: None,
            client,
            edge,
            grpc,
            upgrade,
            upstream_target: String::new(),
            rid: None,
            kept,
        }
    }

    /// What the request's forwarding fields are made of.
    fn forwarding(&self, live: &Live) -> Forwarding {
        let peer = self.client.peer.ip();
        Forwarding {
            client: self.client.clone(),
            rfc7239: live.config.forwarded,
            trusted: live.config.trusts(peer),
            keep_chain: live.config.keeps_forwarded_for(peer),
            asked: asked_host(&self.parts),
        }
    }
}

impl Wire for Hyper {
    type Done = Response<Body>;
    type Head = Answered;

    fn request_id(&self) -> Option<&[u8]> {
        self.parts
            .headers
            .get(request_id::HEADER)
            .map(HeaderValue::as_bytes)
    }

    fn trace_fields(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        let h = &self.parts.headers;
        (
            h.get("traceparent").map(HeaderValue::as_bytes),
            h.get("tracestate").map(HeaderValue::as_bytes),
        )
    }

    fn edge(&self) -> Option<Edge> {
        self.edge
    }

    fn method(&self) -> &Method {
        &self.parts.method
    }

    fn target(&self) -> &str {
        self.parts.uri.path_and_query().map_or("/", |p| p.as_str())
    }

    async fn read_body(&mut self, flow: &Flow) -> Result<(), Edge> {
        if self.upgrade.is_some() {
            return Ok(());
        }
        let Some(body) = self.body.take() else {
            return Ok(());
        };
        let config = &flow.live.config;
        let max = config.client_max_body_size;
        let (body, fault) = ClientBody::new(body, config.client_body_timeout, max);
        match http_body_util::BodyExt::collect(body).await {
            Ok(whole) => {
                let trailers = whole.trailers().cloned();
                self.buffered = Some((whole.to_bytes(), trailers));
                Ok(())
            }
            Err(_) => Err(match fault.get() {
                Some(BodyFault::Stalled) => Edge::BodyTimeout,
                Some(BodyFault::TooLarge) => Edge::TooLarge(max),
                _ => Edge::BadBody,
            }),
        }
    }

    fn body(&self) -> Option<&[u8]> {
        self.buffered.as_ref().map(|(b, _)| &b[..])
    }

    fn replace_body(&mut self, body: Vec<u8>) {
        if let Some((data, _)) = &mut self.buffered {
            self.parts
                .headers
                .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
            *data = body.into();
        }
    }

    fn view<'a>(&'a self, path: &'a str, target: &'a str) -> RequestView<'a> {
        RequestView {
            method: &self.parts.method,
            path,
            target,
            authority: self.parts.uri.authority().map(|a| a.as_str()),
            fields: Fields::Map(&self.parts.headers),
            peer: Some(self.client.peer.ip()),
            sni: self.client.sni(),
            claims: None,
            body: None,
            consumer: None,
        }
    }

    async fn answer(&mut self, flow: &Flow, own: Own<'_>) -> io::Result<(Response<Body>, Outcome)> {
        self.rid = Some(flow.rid.clone());
        let live = &flow.live;
        let answer = match own {
            Own::Refused(refusal) => refusal_answer(refusal, &live.config, self.grpc),
            Own::Edge(e) => edge_answer(e, self.grpc),
            Own::Answer(a) => a,
            Own::Admitted(pass) => crate::answer::echo(
                &self.parts.method,
                self.target(),
                &pass.identity,
                pass.decision.as_ref(),
                live.config.headers,
            ),
        };
        let outcome = Outcome {
            status: answer.status().as_u16(),
            bytes: http_body::Body::size_hint(answer.body()).exact(),
            from_upstream: answer
                .extensions()
                .get::<crate::observe::metrics::FromUpstream>()
                .is_some(),
            ..Outcome::default()
        };
        Ok((answer, outcome))
    }

    fn prepare(&mut self, flow: &Flow) -> Result<(), Edge> {
        self.rid = Some(flow.rid.clone());
        let live = &flow.live;
        let sent = self.parts.uri.path_and_query().map_or("/", |p| p.as_str());
        self.upstream_target =
            forward::upstream_target(sent, live.config.upstream_path)?.into_owned();
        let forwarding = self.forwarding(live);
        if self.upgrade.is_some() {
            let mut headers =
                super::tunnel::request_fields(std::mem::take(&mut self.parts.headers));
            forwarding_fields(&mut headers, &forwarding, flow);
            self.parts.headers = headers;
            return Ok(());
        }
        let (body, fault) = match (self.buffered.take(), self.body.take()) {
            (Some((data, trailers)), _) => ClientBody::buffered(data, trailers),
            (None, Some(body)) => ClientBody::new(
                body,
                live.config.client_body_timeout,
                live.config.client_max_body_size,
            ),
            (None, None) => return Ok(()),
        };
        self.fault = Some(fault);
        // The parts go upstream (not copied: a header map's copy allocates
        // per field); the method and target stay for what is asked after.
        let (mut kept, ()) = Request::new(()).into_parts();
        kept.method = self.parts.method.clone();
        kept.uri = self.parts.uri.clone();
        let mut parts = std::mem::replace(&mut self.parts, kept);
        parts.version = Version::HTTP_11;
        strip_hop_by_hop(&mut parts.headers);
        forwarding_fields(&mut parts.headers, &forwarding, flow);
        self.outgoing = Some(Request::from_parts(parts, body));
        Ok(())
    }

    async fn attempt(
        &mut self,
        flow: &Flow,
        chosen: &Chosen<'_>,
        group: &Group,
    ) -> Tried<Answered> {
        let live = &flow.live;
        let server = chosen.server();
        if let Some((protocol, _)) = &self.upgrade {
            return super::tunnel::attempt(
                server,
                group,
                &self.parts,
                protocol,
                &self.upstream_target,
                live.config.upstream_timeout,
            )
            .await;
        }
        let Some(mut req) = self.outgoing.take() else {
            return Tried::Broke("the request was already sent".into(), "no request".into());
        };
        if let Err(refused) = aim(&mut req, server, &self.upstream_target, group) {
            return Tried::Answer(*refused);
        }
        let sent = server.pool.send(req, live.config.upstream_timeout).await;
        let fault = self.fault.as_ref().and_then(|f| f.get());
        match sent {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                if drops_length(parts.headers.contains_key(header::TRANSFER_ENCODING)) {
                    parts.headers.remove(header::CONTENT_LENGTH);
                }
                strip_hop_by_hop(&mut parts.headers);
                parts
                    .extensions
                    .insert(crate::observe::metrics::FromUpstream);
                Tried::Answered(Answered::Response(Response::from_parts(
                    parts,
                    body.map_err(|e| Box::new(e) as _).boxed_unsync(),
                )))
            }
            Err(SendFailed {
                error: e @ (UpstreamError::Connect { .. } | UpstreamError::Tls { .. }),
                unsent: Some(back),
            }) => {
                self.outgoing = Some(back);
                Tried::Unsent(e)
            }
            // The client's body failed, not the server.
            Err(_) if fault.is_some() => {
                let e = match fault {
                    Some(BodyFault::Broke) => Edge::BadBody,
                    Some(BodyFault::Stalled) => Edge::BodyTimeout,
                    _ => Edge::TooLarge(live.config.client_max_body_size),
                };
                Tried::Answer(edge_answer(e, self.grpc))
            }
            Err(SendFailed {
                error: UpstreamError::Timeout(_),
                ..
            }) => Tried::TimedOut,
            Err(SendFailed { error: e, .. }) => {
                let why = match &e {
                    UpstreamError::Connect { .. } | UpstreamError::Tls { .. } => unsent_why(&e),
                    other => tls_cause(other)
                        .unwrap_or_else(|| "the exchange broke before an answer".into()),
                };
                Tried::Broke(why, e.to_string())
            }
        }
    }

    async fn relay(
        &mut self,
        end: End,
        decision: Option<ratewarden::Decision>,
        head: Answered,
        _chosen: Chosen<'_>,
    ) -> io::Result<Response<Body>> {
        let style = end.flow().live.config.headers;
        let kept = self.kept.take();
        let (mut resp, tunnel) = match head {
            Answered::Response(r) => (r, None),
            Answered::Tunnel(r, server) => (r, Some(server)),
        };
        add_rate_headers(decision.as_ref(), resp.headers_mut(), style);
        if let Some(d) = &decision {
            for (name, value) in super::flow::shaped::admitted_fields(d, &end.flow().live.config) {
                if let Ok(v) = HeaderValue::from_str(&value) {
                    resp.headers_mut().insert(name, v);
                }
            }
        }
        let status = resp.status().as_u16();
        if let Some(server) = tunnel {
            // A tunnel is one request: it ends when the tunnel does.
            let on = self.upgrade.take().and_then(|(_, on)| on);
            let idle = end.flow().live.config.client_idle_timeout;
            super::tunnel::splice_then(on, server, idle, move |sent| {
                finish_spawned(
                    end,
                    Outcome {
                        status,
                        bytes: Some(sent),
                        from_upstream: true,
                        ..Outcome::default()
                    },
                    kept,
                );
            });
            return Ok(resp);
        }
        // A gRPC answer's outcome is its `grpc-status`: in its headers when
        // trailers-only, else in its trailers, at the end of the stream.
        let outcome = Outcome {
            status,
            grpc_status: self.grpc.and_then(|_| grpc_status(resp.headers())),
            from_upstream: true,
            ..Outcome::default()
        };
        let mut end = end;
        if end.tap.reads() {
            for (name, value) in resp.headers() {
                end.tap.field(name.as_str(), value.as_bytes());
            }
        }
        Ok(resp.map(|body| Ending::new(body, end, outcome, kept).boxed_unsync()))
    }

    fn gone(&mut self) -> Response<Body> {
        Response::new(crate::answer::empty_body())
    }

    fn line(&self) -> Line<'_> {
        match &self.kept {
            Some(k) => k.line(),
            None => Line {
                peer: self.client.peer.ip(),
                method: self.parts.method.as_str(),
                target: self.target().as_bytes(),
                version: version_name(self.parts.version),
                referer: None,
                user_agent: None,
            },
        }
    }
}

/// The end phase where no request scope is left to await its store call:
/// spawned.
fn finish_spawned(mut end: End, outcome: Outcome, kept: Option<Kept>) {
    let settle = end.finish(outcome, || {
        kept.as_ref()
            .map(Kept::line)
            .expect("kept when there is a log")
    });
    if let Some(settle) = settle {
        crate::wire::spawn(settle);
    }
}

/// An answer's body on its way to the client, feeding the end phase's
/// [`Tap`](super::flow::Tap) (bytes, and a meter's reading), reading a
/// gRPC status in the trailers, and finishing the request's end once, when
/// the body has ended (the last frame handed on) or is dropped (the client
/// gone, or the upstream cut it).
struct Ending {
    inner: Body,
    end: Option<(End, Option<Kept>)>,
    outcome: Outcome,
}

impl Ending {
    fn new(inner: Body, end: End, outcome: Outcome, kept: Option<Kept>) -> Self {
        let mut this = Self {
            inner,
            end: Some((end, kept)),
            outcome,
        };
        if http_body::Body::is_end_stream(&this.inner) {
            // Nothing to send (never polled): the answer has ended.
            this.finish();
        }
        this
    }

    /// The end phase, once.
    fn finish(&mut self) {
        if let Some((end, kept)) = self.end.take() {
            finish_spawned(end, self.outcome, kept);
        }
    }
}

impl http_body::Body for Ending {
    type Data = bytes::Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        let this = &mut *self;
        let polled = std::pin::Pin::new(&mut this.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some((end, _)) = &mut this.end {
                    if let Some(data) = frame.data_ref() {
                        end.tap.data(data);
                    } else if let Some(t) = frame.trailers_ref() {
                        if let Some(code) = grpc_status(t) {
                            this.outcome.grpc_status = Some(code);
                        }
                        if end.tap.reads() {
                            for (name, value) in t {
                                end.tap.trailer(name.as_str(), value.as_bytes());
                            }
                        }
                    }
                }
            }
            Poll::Ready(Some(Err(_)) | None) => this.finish(),
            Poll::Pending => {}
        }
        if this.end.is_some() && this.inner.is_end_stream() {
            // The last frame is handed on: the answer has ended.
            this.finish();
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Ending {
    fn drop(&mut self) {
        // Dropped before its end: the client left, or the stream broke.
        self.finish();
    }
}

/// The Host a request asked for: its `Host` field, or an HTTP/2 request's
/// `:authority`.
fn asked_host(parts: &Parts) -> Option<HeaderValue> {
    parts.headers.get(header::HOST).cloned().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    })
}

/// What the forwarding fields of one request are made from.
struct Forwarding {
    client: forward::Client,
    /// `forwarded: true`: RFC 7239 `Forwarded` too.
    rfc7239: bool,
    /// The peer is a trusted proxy: its `X-Forwarded-*` are kept.
    trusted: bool,
    /// Its `X-Forwarded-For` goes on (see `Config::keeps_forwarded_for`).
    keep_chain: bool,
    /// The Host the client asked for.
    asked: Option<HeaderValue>,
}

/// `X-Forwarded-For` (the peer appended), `X-Forwarded-Host`, `-Proto` and
/// `-Port` (see [`forward::X_FORWARDED`]: a client's replaced, a trusted
/// proxy's kept), the request id, and `Host` as asked where the request
/// had none (HTTP/2: `:authority`), for `preserve_host`.
fn forwarding_fields(h: &mut HeaderMap, f: &Forwarding, flow: &Flow) {
    let rid = &flow.rid;
    // A sampled request's upstream gets our span as its parent.
    if let Some(t) = flow.trace.as_ref().and_then(|t| t.upstream_traceparent())
        && let Ok(v) = HeaderValue::from_bytes(&t)
    {
        h.insert("traceparent", v);
    }
    let mut xff = Vec::new();
    // (The incoming chain is looked up only when it is kept.)
    let chain = f.keep_chain.then(|| h.get_all(X_FORWARDED_FOR));
    push_forwarded_for(
        &mut xff,
        chain
            .iter()
            .flat_map(|c| c.iter())
            .map(HeaderValue::as_bytes),
        f.client.peer.ip(),
    );
    if let Ok(v) = HeaderValue::from_bytes(&xff) {
        h.insert(X_FORWARDED_FOR, v);
    }
    if let Ok(v) = HeaderValue::from_bytes(rid.as_bytes()) {
        h.insert(request_id::HEADER, v);
    }
    let mut port = itoa::Buffer::new();
    let ours = forward::x_forwarded_values(
        &f.client,
        f.asked.as_ref().map(HeaderValue::as_bytes),
        &mut port,
    );
    for (name, value) in X_FORWARDED_NAMES.into_iter().zip(ours) {
        if f.trusted && h.contains_key(&name) {
            continue;
        }
        match value.and_then(|v| HeaderValue::from_bytes(v).ok()) {
            Some(v) => h.insert(name, v),
            None => h.remove(name),
        };
    }
    if f.rfc7239 {
        let mut v = Vec::new();
        if f.trusted {
            for hop in h.get_all(header::FORWARDED) {
                v.extend_from_slice(hop.as_bytes());
                v.extend_from_slice(b", ");
            }
        }
        forward::forwarded_element(
            &mut v,
            &f.client,
            f.asked.as_ref().map(HeaderValue::as_bytes),
        );
        if let Ok(v) = HeaderValue::from_bytes(&v) {
            h.insert(header::FORWARDED, v);
        }
    }
    if let (false, Some(asked)) = (h.contains_key(header::HOST), &f.asked) {
        h.insert(header::HOST, asked.clone());
    }
}

/// `HTTP/1.1` and the like, for the access log.
fn version_name(v: Version) -> &'static str {
    match v {
        Version::HTTP_09 => "HTTP/0.9",
        Version::HTTP_10 => "HTTP/1.0",
        Version::HTTP_11 => "HTTP/1.1",
        Version::HTTP_2 => "HTTP/2.0",
        Version::HTTP_3 => "HTTP/3.0",
        _ => "HTTP",
    }
}

/// The `grpc-status` of a header block.
fn grpc_status(h: &http::HeaderMap) -> Option<u16> {
    h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()
}
