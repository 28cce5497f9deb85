//! hyper's path: HTTP/2, HTTP/1.0 and whatever the HTTP/1.1 path hands
//! over. hyper parses; the edge checks, the path rules see, the target and
//! fields sent upstream and the failure answers are [`super::forward`]'s,
//! as on the HTTP/1.1 path.

use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Method, Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;

use crate::answer::{Body, respond};
use crate::gateway::Gateway;
use crate::observe::request_id::{self, RequestId};
use crate::proxy::failover::{Failover, unsent_why};
use crate::proxy::flow::{Decided, Flow, Line, add_rate_headers, edge_answer, refusal_answer};
use crate::proxy::forward::{
    self, Edge, check_host, drops_length, is_hop_by_hop, push_forwarded_for, tls_cause,
};
use crate::upstream::pool::{BodyFault, BodyFaults, ClientBody, SendFailed, UpstreamError};
use ratewarden_tower::admission::Held;
use ratewarden_tower::view::{Fields, RequestView};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Removes the hop-by-hop headers and those `Connection` names. One pass
/// over the names present (a handful), then hashed removals of only those
/// found: this runs twice per proxied request, and upstreams commonly send
/// `Connection: keep-alive`.
pub(crate) fn strip_hop_by_hop(h: &mut HeaderMap) {
    let mut found: Vec<HeaderName> = h
        .keys()
        .filter(|k| is_hop_by_hop(k.as_str().as_bytes()))
        .cloned()
        .collect();
    if found.is_empty() {
        return;
    }
    if found.contains(&header::CONNECTION) {
        found.extend(
            h.get_all(header::CONNECTION)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .flat_map(|v| v.split(','))
                .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok()),
        );
    }
    for n in found {
        h.remove(n);
    }
}

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
/// ([`crate::proxy::flow`]): the answer carries the request's id; the access log
/// gets a line.
pub async fn handle(
    gw: &Gateway,
    req: Request<Incoming>,
    client: forward::Client,
) -> Response<Body> {
    let live = gw.live();
    let given = req.headers().get(request_id::HEADER);
    let mut flow = Flow::start(gw, &live, given.map(HeaderValue::as_bytes));
    // What the log's line needs of the request, kept before hyper's parts
    // go to the upstream.
    let line = flow.logged().then(|| {
        let header = |n: HeaderName| req.headers().get(n).map(|v| v.as_bytes().to_vec());
        (
            req.method().clone(),
            req.uri()
                .path_and_query()
                .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned()),
            version_name(req.version()),
            header(header::REFERER),
            header(header::USER_AGENT),
        )
    });
    let peer = client.peer.ip();
    let mut resp = answer(&mut flow, req, client).await;
    flow.note.status = resp.status().as_u16();
    flow.note.bytes = http_body::Body::size_hint(resp.body()).exact();
    flow.note.from_upstream = resp
        .extensions()
        .get::<crate::observe::metrics::FromUpstream>()
        .is_some();
    if let Ok(v) = HeaderValue::from_bytes(flow.rid.as_bytes()) {
        resp.headers_mut().insert(request_id::HEADER, v);
    }
    let line = line.as_ref();
    flow.finish(|| {
        let (method, target, version, referer, user_agent) = line.expect("kept when logged");
        Line {
            peer,
            method: method.as_str(),
            target: target.as_bytes(),
            version,
            referer: referer.as_deref(),
            user_agent: user_agent.as_deref(),
        }
    });
    resp
}

/// The answer to one request on hyper's path: the flow's phases, with
/// hyper's parts as the request and its bodies as the wire.
async fn answer(
    flow: &mut Flow<'_>,
    req: Request<Incoming>,
    client: forward::Client,
) -> Response<Body> {
    let peer = client.peer;
    let live = flow.live;
    let (mut parts, body) = req.into_parts();
    // A gRPC request's refusals are gRPC statuses.
    let grpc = crate::proxy::flow::grpc_kind(
        parts
            .headers
            .get(http::header::CONTENT_TYPE)
            .map(|v| v.as_bytes()),
    );
    if let Err(e) = edge_check(&parts) {
        return edge_answer(e, grpc);
    }
    // A declared length over `client_max_body_size` is refused before
    // any rule counts the request (nginx: before it is proxied).
    let max = live.config.client_max_body_size;
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok()?.trim().parse::<u64>().ok());
    if max != 0 && declared.is_some_and(|n| n > max) {
        return edge_answer(Edge::TooLarge(max), grpc);
    }
    if !live.config.underscores_in_headers {
        strip_underscores(&mut parts.headers);
    }
    let target = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let path = match flow.rule_path(&parts.method, target) {
        Ok(p) => p.into_owned(),
        Err(e) => return edge_answer(e, grpc),
    };
    let request = RequestView {
        method: &parts.method,
        path: &path,
        target,
        authority: parts.uri.authority().map(|a| a.as_str()),
        fields: Fields::Map(&parts.headers),
        peer: Some(peer.ip()),
        sni: client.sni(),
        claims: None,
    };
    let route = flow.route(&request);
    let (admitted, mut held) = match flow.decide(request, route.map(|(n, _)| n)).await {
        Decided::Refused(refusal) => {
            return refusal_answer(&refusal, &live.config, grpc);
        }
        Decided::Admitted(a, held) => (a, held),
    };
    let forwarding = Forwarding {
        client,
        rfc7239: live.config.forwarded,
        trusted: live.config.trusts(peer.ip()),
        keep_chain: live.config.keeps_forwarded_for(peer.ip()),
        asked: asked_host(&parts),
    };
    let mut resp = match route.map(|(_, g)| g) {
        None => echo(&parts, &admitted.who().identity),
        Some(group) if super::tunnel::asked(&parts).is_some() => {
            let protocol = super::tunnel::asked(&parts).expect("just checked");
            let on = parts.extensions.remove::<hyper::upgrade::OnUpgrade>();
            let sent = parts.uri.path_and_query().map_or("/", |p| p.as_str());
            let target = match forward::upstream_target(sent, live.config.upstream_path) {
                Ok(t) => t.into_owned(),
                Err(e) => return e.answer(),
            };
            let mut headers = super::tunnel::request_fields(std::mem::take(&mut parts.headers));
            forwarding_fields(&mut headers, &forwarding, &flow.rid);
            let t = super::tunnel::Tunnel {
                attempts: Failover::new(group, flow.metrics(), &admitted.who().identity),
                target,
                headers,
                protocol,
                method: parts.method.clone(),
                timeout: live.config.upstream_timeout,
                idle: live.config.client_idle_timeout,
                held: held.take(),
            };
            super::tunnel::open(t, on).await
        }
        Some(group) => {
            let (body, fault) = ClientBody::new(
                body,
                live.config.client_body_timeout,
                live.config.client_max_body_size,
            );
            let to = Upstreamed {
                group,
                client: &admitted.who().identity,
                forwarding,
                timeout: live.config.upstream_timeout,
                max_body: live.config.client_max_body_size,
                how: live.config.upstream_path,
                grpc,
            };
            forward(flow, Request::from_parts(parts, body), &to, &fault).await
        }
    };
    // A gRPC answer's outcome is its `grpc-status`, not its HTTP 200: in
    // its headers when trailers-only, else in its trailers, at the end of
    // the stream.
    let grpc_answer = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
    if grpc_answer {
        if let Some(settlement) = admitted.grpc_settlement(&live.limiter) {
            match grpc_status(resp.headers()) {
                Some(code) => settlement.settle(code).await,
                None => resp = resp.map(|body| settled_at_trailers(body, settlement)),
            }
        }
    } else {
        flow.settle(&admitted, resp.status().as_u16()).await;
    }
    add_rate_headers(
        admitted.decision.as_ref(),
        resp.headers_mut(),
        live.config.headers,
    );
    if let Some(held) = held {
        resp = resp.map(|body| body.with_held(held));
    }
    resp
}

/// Forwards an admitted request to a server of the route, and its answer
/// back (failing over as [`Failover`] says).
async fn forward(
    flow: &Flow<'_>,
    req: Request<ClientBody>,
    to: &Upstreamed<'_>,
    fault: &BodyFaults,
) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    // Origin form (`/path?query`) on the upstream connection, under the
    // server's path prefix if it has one.
    let sent = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let target = match forward::upstream_target(sent, to.how) {
        Ok(t) => t.into_owned(),
        Err(e) => return e.answer(),
    };
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    forwarding_fields(&mut parts.headers, &to.forwarding, &flow.rid);
    let mut req = Request::from_parts(parts, body);
    let mut attempts = Failover::new(to.group, flow.metrics(), to.client);
    loop {
        let chosen = match attempts.next() {
            Ok(c) => c,
            Err(answer) => return *answer,
        };
        let server = chosen.server();
        if let Err(refused) = aim(&mut req, server, &target, to.group) {
            return *refused;
        }
        let res = match server.pool.send(req, to.timeout).await {
            Err(SendFailed {
                error: e @ (UpstreamError::Connect { .. } | UpstreamError::Tls { .. }),
                unsent: Some(back),
            }) => {
                attempts.unsent(&chosen, &e);
                req = back;
                continue;
            }
            other => other,
        };
        let fault = fault.get();
        return match res {
            Ok(resp) => {
                attempts.answered(&chosen);
                let (mut parts, body) = resp.into_parts();
                if drops_length(parts.headers.contains_key(header::TRANSFER_ENCODING)) {
                    parts.headers.remove(header::CONTENT_LENGTH);
                }
                strip_hop_by_hop(&mut parts.headers);
                parts
                    .extensions
                    .insert(crate::observe::metrics::FromUpstream);
                Response::from_parts(parts, body.map_err(|e| Box::new(e) as _).boxed_unsync())
            }
            // The client's body failed, not the server.
            Err(_) if fault.is_some() => {
                attempts.done();
                let e = match fault {
                    Some(BodyFault::Broke) => Edge::BadBody,
                    Some(BodyFault::Stalled) => Edge::BodyTimeout,
                    _ => Edge::TooLarge(to.max_body),
                };
                edge_answer(e, to.grpc)
            }
            Err(SendFailed {
                error: UpstreamError::Timeout(t),
                ..
            }) => attempts.timed_out(&chosen, t),
            Err(SendFailed { error: e, .. }) => {
                let why = match &e {
                    UpstreamError::Connect { .. } | UpstreamError::Tls { .. } => unsent_why(&e),
                    other => tls_cause(other)
                        .unwrap_or_else(|| "the exchange broke before an answer".into()),
                };
                attempts.broke(&chosen, why, e.to_string())
            }
        };
    }
}

/// `X-Forwarded-For` with the peer appended, and the request id.
/// Points `req` at `server`: the target under its path prefix, and its
/// `Host`. A target that cannot be made a URI is answered with a 400 (the
/// `Err`).
pub(super) fn aim<B>(
    req: &mut Request<B>,
    server: &crate::upstream::route::Server,
    target: &str,
    group: &crate::upstream::route::Group,
) -> Result<(), Box<Response<Body>>> {
    // (An HTTP/2 server's request is put in HTTP/2's form by its pool.)
    *req.version_mut() = http::Version::HTTP_11;
    *req.uri_mut() = match format!("{}{target}", server.prefix).parse::<Uri>() {
        Ok(u) => u,
        Err(_) => {
            return Err(Box::new(crate::answer::problem_response(
                StatusCode::BAD_REQUEST,
                "request target cannot be forwarded",
            )));
        }
    };
    // Under `preserve_host` the client's (set by `forwarding_fields`, an
    // HTTP/2 request's `:authority` too) stays.
    if !group.preserve_host {
        match server.pool.host() {
            Some(host) => req.headers_mut().insert(header::HOST, host.clone()),
            None => req.headers_mut().remove(header::HOST),
        };
    }
    // `request_headers` last: what it sets wins (Host included), what it
    // removes goes.
    let extra = &group.request_headers;
    for name in &extra.remove {
        req.headers_mut().remove(name);
    }
    for (name, value) in &extra.set {
        req.headers_mut().insert(name.clone(), value.clone());
    }
    Ok(())
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
fn forwarding_fields(h: &mut HeaderMap, f: &Forwarding, rid: &RequestId) {
    let mut xff = Vec::new();
    let chain = h.get_all(X_FORWARDED_FOR);
    push_forwarded_for(
        &mut xff,
        chain
            .iter()
            .filter(|_| f.keep_chain)
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
    for (name, value) in forward::X_FORWARDED.iter().zip(ours) {
        let name = HeaderName::from_static(name);
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

/// Where and how an admitted request goes upstream.
struct Upstreamed<'a> {
    group: &'a crate::upstream::route::Group,
    /// The identity, for `balance: hash`.
    client: &'a str,
    forwarding: Forwarding,
    timeout: Duration,
    /// `client_max_body_size`, for its 413.
    max_body: u64,
    how: crate::config::UpstreamPath,
    /// A gRPC request: its refusals are gRPC statuses.
    grpc: Option<crate::proxy::flow::Grpc>,
}

/// A body that holds `held` until it is dropped.
trait WithHeld {
    fn with_held(self, held: Held) -> Body;
}

impl WithHeld for Body {
    fn with_held(self, held: Held) -> Body {
        if http_body::Body::is_end_stream(&self) {
            // Nothing to send (never polled): the request has ended.
            return self;
        }
        // The tower layer's guard: the leases go back as the last frame is
        // handed on, or when the body is dropped.
        ratewarden_tower::Guarded::new(self, Some(held)).boxed_unsync()
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

/// The built-in upstream: says what it received.
fn echo(req: &Parts, identity: &str) -> Response<Body> {
    let text = format!(
        "ratewarden echo: {} {} from {identity}\n",
        req.method, req.uri
    );
    let mut r = respond(StatusCode::OK, "text/plain; charset=utf-8", text);
    r.extensions_mut()
        .insert(crate::observe::metrics::FromUpstream);
    r
}

/// The `grpc-status` of a header block.
fn grpc_status(h: &http::HeaderMap) -> Option<u16> {
    h.get("grpc-status")?.to_str().ok()?.trim().parse().ok()
}

/// `body`, settling `settlement` on the `grpc-status` of its trailers
/// when they pass (off the answer's way, in a task of their own).
fn settled_at_trailers(
    body: Body,
    settlement: ratewarden_tower::admission::GrpcSettlement<crate::store::AnyStore>,
) -> Body {
    let mut settlement = Some(settlement);
    http_body_util::BodyExt::map_frame(body, move |frame| {
        if let Some(t) = frame.trailers_ref()
            && let Some(code) = grpc_status(t)
            && let Some(s) = settlement.take()
        {
            crate::wire::spawn(s.settle(code));
        }
        frame
    })
    .boxed_unsync()
}
