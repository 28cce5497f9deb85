//! Envoy's rate limit service (`envoy.service.ratelimit.v3`), a drop-in
//! for envoyproxy/ratelimit: its descriptor configuration ([`config`]), its
//! matching, its response, on every ratewarden algorithm.
//!
//! A `ShouldRateLimit` call goes down the one admission path
//! ([`ratewarden_tower::admission::decide_ops`]): each descriptor that
//! reaches a limit becomes one op (its rule, its key: the descriptor's
//! entries), and all of them are decided in one store call,
//! all-or-nothing: if one descriptor is over its limit, no descriptor is
//! charged. (envoyproxy/ratelimit charges every descriptor, the one over
//! included; limitador checks, then updates in a second round trip.)
//!
//! The server ([`serve`]) is HTTP/2 on its own listener (`rls.listen`),
//! with `grpc.health.v1` ([`health`]) and, in a build with the
//! `reflection` feature, server reflection (v1 and v1alpha).

/// The descriptor configuration is config's (`config::rls`): config is a
/// leaf that imports none of the modules that run what it describes.
pub(crate) use crate::config::rls as config;
pub(crate) use crate::config::rls::RlsSpec;
mod health;
#[cfg(feature = "reflection")]
mod reflection;
pub(crate) mod tree;
pub(crate) mod wire;

use std::sync::Arc;
use std::time::Duration;

use ratewarden::{Mode, Op, Rule};
use ratewarden_tower::admission::{OpsRefusal, decide_ops};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::gateway::Gateway;
use crate::wire::grpc::unframe;
use config::Limit;
use tree::Trees;

/// A call that fails: its gRPC status code and message, answered
/// trailers-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Status {
    code: u8,
    message: String,
}

impl Status {
    fn new(code: u8, message: impl Into<String>) -> Self {
        Status {
            code,
            message: message.into(),
        }
    }
    fn cancelled(message: impl Into<String>) -> Self {
        Self::new(1, message)
    }
    fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(3, message)
    }
    fn deadline_exceeded(message: impl Into<String>) -> Self {
        Self::new(4, message)
    }
    fn not_found(message: impl Into<String>) -> Self {
        Self::new(5, message)
    }
    fn resource_exhausted(message: impl Into<String>) -> Self {
        Self::new(8, message)
    }
    fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(9, message)
    }
    fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(12, message)
    }
    fn unavailable(message: impl Into<String>) -> Self {
        Self::new(14, message)
    }

    /// The trailers-only answer: `grpc-status` and `grpc-message`
    /// (percent-encoded, as gRPC requires) in the head.
    fn head(&self) -> http::Response<()> {
        let mut r = http::Response::new(());
        let h = r.headers_mut();
        h.insert(http::header::CONTENT_TYPE, APPLICATION_GRPC);
        crate::wire::grpc::put_status(h, i32::from(self.code), &self.message);
        r
    }
}

/// `RateLimitResponse.Code` of Envoy's `envoy.service.ratelimit.v3`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    Ok = 1,
    OverLimit = 2,
}

/// The descriptors of `envoy/service/ratelimit/v3/rls.proto` and the files
/// it imports, for server reflection: taken from envoy-types' own
/// descriptor set (`cargo run --example rls_descriptors`).
#[cfg(feature = "reflection")]
pub(crate) const DESCRIPTORS: &[u8] = include_bytes!("rls_descriptors.bin");

/// The service, answering from the gateway's live config and store.
/// The service's gRPC name (health reports it serving).
const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";

/// The method's path.
const METHOD: &str = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit";

/// Largest request message taken, as tonic's default (4 MiB).
const MAX_MESSAGE: usize = 4 << 20;

/// `ShouldRateLimit`, one unary call, answered without tonic's generated
/// server: its codec streams a unary body through several layers (a
/// decoder, an encoder stream, boxed futures), which cost more per call
/// than the decision. The request is one length-prefixed message
/// (uncompressed: Envoy does not compress these calls, and a compressed
/// one is refused with UNIMPLEMENTED); the answer is one message and its
/// trailers, or a trailers-only status.
async fn should_rate_limit(
    gw: &Gateway,
    trees: &Trees,
    req: http::Request<h2::RecvStream>,
) -> Result<bytes::Bytes, Status> {
    // The call's span, when tracing is on and it is sampled: its parent
    // from the call's gRPC metadata (Envoy passes its span there).
    let live = gw.live();
    let traced = live.tracer.as_ref().and_then(|t| {
        let h = req.headers();
        t.begin(
            h.get("traceparent").map(http::HeaderValue::as_bytes),
            h.get("tracestate").map(http::HeaderValue::as_bytes),
        )
        .map(|ids| (ids, quanta::Instant::now()))
    });
    let message = read_message(gw, req, MAX_MESSAGE).await?;
    let request = wire::decode(&message)
        .map_err(|e| Status::invalid_argument(format!("the request does not decode: {e}")))?;
    let answer = decide(gw, trees, &request).await;
    if let (Some((ids, from)), Some(tracer)) = (traced, &live.tracer) {
        let outcome = match &answer {
            Ok((_, over)) => Ok(*over),
            Err(s) => Err(s.message.as_str()),
        };
        tracer.send([crate::observe::trace::rls_span(
            ids,
            from,
            request.domain,
            request.descriptors.len(),
            outcome,
        )]);
    }
    answer.map(|(framed, _)| framed)
}

/// A unary call's request message, at most `max_message` bytes: one
/// uncompressed, length-prefixed frame (a compressed call is refused with
/// UNIMPLEMENTED), read whole by [`read_whole`]. The listener's methods
/// all read theirs here.
async fn read_message(
    gw: &Gateway,
    req: http::Request<h2::RecvStream>,
    max_message: usize,
) -> Result<bytes::Bytes, Status> {
    if req
        .headers()
        .get(GRPC_ENCODING)
        .is_some_and(|e| e.as_bytes() != b"identity")
    {
        return Err(Status::unimplemented(
            "compressed requests are not accepted (grpc-accept-encoding: identity)",
        ));
    }
    let body = read_whole(gw, req.into_body(), max_message).await?;
    if unframe(&body).is_none() {
        return Err(Status::invalid_argument(
            "the request is not one uncompressed, length-prefixed gRPC message",
        ));
    }
    Ok(body.slice(5..))
}

/// A request body, whole: one message of up to `max_message` bytes and
/// its frame's head. One DATA frame (a unary
/// call's usual shape, an empty END_STREAM frame aside) is taken as it is.
///
/// Within `client_body_timeout`, as a proxied request's body: a client
/// that opens calls and sends their bodies slowly, or never, holds a
/// stream at most that long from when it first waits (DEADLINE_EXCEEDED).
/// The timer is made only
/// when the body is not all there when asked: a timer for every call
/// would cost more than the rest of reading it.
async fn read_whole(
    gw: &Gateway,
    mut body: h2::RecvStream,
    max_message: usize,
) -> Result<bytes::Bytes, Status> {
    use std::future::Future as _;
    use std::task::Poll;
    let mut first = bytes::Bytes::new();
    let mut rest: Option<bytes::BytesMut> = None;
    let mut deadline: Option<(Duration, std::pin::Pin<Box<tokio::time::Sleep>>)> = None;
    loop {
        let next = std::future::poll_fn(|cx| match body.poll_data(cx) {
            Poll::Ready(data) => Poll::Ready(Ok(data)),
            Poll::Pending => {
                let (limit, timer) = deadline.get_or_insert_with(|| {
                    let limit = gw.live().config.client_body_timeout;
                    (limit, Box::pin(tokio::time::sleep(limit)))
                });
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(*limit)),
                    Poll::Pending => Poll::Pending,
                }
            }
        })
        .await
        .map_err(|limit| {
            Status::deadline_exceeded(format!(
                "the request's body did not come within {limit:?} (client_body_timeout)"
            ))
        })?;
        let Some(chunk) = next else { break };
        let chunk = chunk
            .map_err(|e| Status::cancelled(format!("the request could not be read whole: {e}")))?;
        if !chunk.is_empty() {
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        if first.len() + rest.as_ref().map_or(0, |r| r.len()) + chunk.len() > max_message + 5 {
            return Err(Status::resource_exhausted(format!(
                "the request is over {max_message} bytes"
            )));
        }
        if chunk.is_empty() {
            continue;
        }
        match &mut rest {
            Some(r) => r.extend_from_slice(&chunk),
            None if first.is_empty() => first = chunk,
            None => {
                let mut r = bytes::BytesMut::with_capacity(first.len() + chunk.len());
                r.extend_from_slice(&first);
                r.extend_from_slice(&chunk);
                rest = Some(r);
            }
        }
    }
    Ok(rest.map_or(first, bytes::BytesMut::freeze))
}

const GRPC_ENCODING: http::HeaderName = http::HeaderName::from_static("grpc-encoding");
const GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
const APPLICATION_GRPC: http::HeaderValue = http::HeaderValue::from_static("application/grpc");

/// Sends a unary call's answer: the head, the message, `grpc-status: 0`;
/// or, for an error, a trailers-only status.
fn send_unary(
    respond: &mut h2::server::SendResponse<bytes::Bytes>,
    answer: Result<bytes::Bytes, Status>,
) {
    let message = match answer {
        Ok(m) => m,
        Err(s) => {
            let _ = respond.send_response(s.head(), true);
            return;
        }
    };
    let mut head = http::Response::new(());
    head.headers_mut()
        .insert(http::header::CONTENT_TYPE, APPLICATION_GRPC);
    let Ok(mut send) = respond.send_response(head, false) else {
        return;
    };
    // A few hundred bytes: within any window a client opens, and buffered
    // by h2 until the window allows if not.
    if send.send_data(message, false).is_ok() {
        let mut trailers = http::HeaderMap::with_capacity(1);
        trailers.insert(GRPC_STATUS, http::HeaderValue::from_static("0"));
        let _ = send.send_trailers(trailers);
    }
}

/// What became of one descriptor before the store was asked.
enum Plan<'a> {
    /// No limit applies (none matched, or another replaces it).
    Free,
    /// `unlimited: true`.
    Unlimited(&'a Limit),
    /// `requests_per_unit: 0`: over, always.
    Blocked(&'a Limit),
    /// Decided by the store: op `at` of the charged (or peeked) ops.
    Charged(&'a Limit, Rule, usize),
    Peeked(&'a Limit, Rule, usize),
    /// `is_negative_hits`: given back, then peeked (op `at` of those).
    Refunded(&'a Limit, Rule, usize),
}

/// A request's override of a descriptor's limit (`limit:` in Envoy's
/// route config): a fixed window of that many requests per unit.
fn override_limit(domain: &str, entries: &[(&str, &str)], rpu: u32, unit: i32) -> Option<Limit> {
    let secs = config::unit_seconds(unit)?;
    let mut full_key = domain.to_owned();
    for (k, v) in entries {
        full_key.push('.');
        full_key.push_str(k);
        if !v.is_empty() {
            full_key.push('_');
            full_key.push_str(v);
        }
    }
    // A plain fixed window on the unit, as a configured limit counts
    // (envoyproxy/ratelimit's counter per unit).
    let rule = Rule::builder(full_key.clone())
        .algorithm(ratewarden::algorithm::Kind::FixedWindow)
        .limit(u64::from(rpu), Duration::from_secs(secs))
        .build()
        .ok()?;
    Some(Limit {
        full_key,
        name: String::new(),
        replaces: vec![],
        unlimited: false,
        shadow: false,
        detailed: false,
        rule: Some(rule),
        window: Duration::from_secs(secs),
        unit,
        requests_per_unit: rpu,
    })
}

/// Longest op key kept as it is; a longer one keeps its first
/// [`KEPT`] bytes and a fingerprint of the whole.
const MAX_KEY: usize = 512;
const KEPT: usize = 480;

/// The key of a descriptor's op: its entries, `key_value` joined by `.`.
/// Descriptor values come from requests (a path, a header): a key past
/// [`MAX_KEY`] bytes is cut and a 64-bit FNV-1a of the whole appended, so
/// no value makes a key of unbounded size, and two long values share a
/// counter only if they also share that hash (the safe side: counted
/// together).
fn op_key(entries: &[(&str, &str)]) -> String {
    let len: usize = entries.iter().map(|(k, v)| k.len() + v.len() + 2).sum();
    let mut key = String::with_capacity(len);
    for (i, (k, v)) in entries.iter().enumerate() {
        if i > 0 {
            key.push('.');
        }
        key.push_str(k);
        key.push('_');
        key.push_str(v);
    }
    if key.len() > MAX_KEY {
        let hash = ratewarden::fnv1a(key.bytes());
        let mut cut = KEPT;
        while !key.is_char_boundary(cut) {
            cut -= 1;
        }
        key.truncate(cut);
        key.push_str(&format!("#{hash:016x}"));
    }
    key
}

/// A call's descriptors, and what is made of each: a few, on the stack.
type Few<T> = wire::Few<T, 4>;

/// Decides one `ShouldRateLimit` call: its answer, as one gRPC frame.
/// The call's answer, framed, and whether it was over a limit.
async fn decide(
    gw: &Gateway,
    trees: &Trees,
    req: &wire::Request<'_>,
) -> Result<(bytes::Bytes, bool), Status> {
    if req.domain.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit domain must not be empty",
        ));
    }
    if req.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "rate limit descriptor list must not be empty",
        ));
    }
    let live = gw.live();
    let Some(spec) = live.config.rls.as_ref() else {
        return Err(Status::failed_precondition(
            "no `rls:` in the running configuration",
        ));
    };
    let built = trees.of(&spec.domains);
    let domains = &built.1;
    // Overrides made per call (rare: none, and no allocation, usually).
    let overrides: Vec<Option<Limit>>;
    // The entries and what is worked out from them are not kept across
    // the store call: the call's future stays small (it is moved when the
    // call starts).
    let (reached, keys) = {
        let entries: Few<&[(&str, &str)]> =
            req.descriptors.iter().map(|d| req.entries_of(d)).collect();
        // A domain with no config answers OK (no limit) before any
        // override is looked at, as envoyproxy/ratelimit does.
        overrides = if domains.has(req.domain) && req.descriptors.iter().any(|d| d.limit.is_some())
        {
            req.descriptors
                .iter()
                .zip(&entries)
                .map(|(d, e)| {
                    d.limit
                        .as_ref()
                        .and_then(|&(rpu, unit)| override_limit(req.domain, e, rpu, unit))
                })
                .collect()
        } else {
            Vec::new()
        };
        // Limits reached.
        let mut reached: Few<Option<&Limit>> = entries
            .iter()
            .enumerate()
            .map(|(i, e)| match overrides.get(i).and_then(Option::as_ref) {
                Some(l) => Some(l),
                None => domains.limit(req.domain, e).map(|l| &**l),
            })
            .collect();
        // `replaces`: a limit named by another reached limit does not apply.
        let replaced: Few<&str> = reached
            .iter()
            .flatten()
            .flat_map(|l| l.replaces.iter().map(String::as_str))
            .collect();
        for r in &mut reached {
            if r.is_some_and(|l| !l.name.is_empty() && replaced.contains(&l.name.as_str())) {
                *r = None;
            }
        }
        let keys: Few<String> = entries.iter().map(|e| op_key(e)).collect();
        (reached, keys)
    };
    // Each descriptor's weight: its own `hits_addend` (an explicit 0 is a
    // peek), else the request's (0, which proto3 cannot tell from unset,
    // is 1).
    let call_weight = u64::from(req.hits_addend.max(1));
    let mut plans: Few<Plan<'_>> = Few::new();
    let (mut charged, mut peeked, mut refunded) = (0, 0, 0);
    for (i, d) in req.descriptors.iter().enumerate() {
        plans.push(match reached[i] {
            None => Plan::Free,
            Some(l) if l.unlimited => Plan::Unlimited(l),
            Some(l) => {
                let Some(rule) = l.rule.clone() else {
                    plans.push(Plan::Blocked(l));
                    continue;
                };
                match d.hits_addend {
                    Some(0) => {
                        peeked += 1;
                        Plan::Peeked(l, rule, peeked - 1)
                    }
                    _ if d.is_negative_hits => {
                        refunded += 1;
                        Plan::Refunded(l, rule, refunded - 1)
                    }
                    _ => {
                        charged += 1;
                        Plan::Charged(l, rule, charged - 1)
                    }
                }
            }
        });
    }
    let weight_of = |i: usize| match req.descriptors[i].hits_addend {
        Some(w) if w > 0 => w,
        _ => call_weight,
    };
    // Peeks and refunds are rare: no room kept for them.
    let (mut charge_ops, mut peek_ops, mut refund_ops) = (Few::new(), Vec::new(), Vec::new());
    for (i, plan) in plans.iter().enumerate() {
        match plan {
            Plan::Charged(_, rule, _) => {
                charge_ops.push(Op::new(rule, &keys[i]).weighing(weight_of(i)))
            }
            Plan::Peeked(_, rule, _) => peek_ops.push(Op::new(rule, &keys[i])),
            Plan::Refunded(_, rule, _) => {
                refund_ops.push(Op::new(rule, &keys[i]).weighing(weight_of(i)))
            }
            _ => {}
        }
    }
    let store_failed = |e: &ratewarden::StoreError| {
        tracing::warn!(domain = %req.domain, error = %e, "rls: the store could not decide; on_error: deny: UNAVAILABLE");
        Status::unavailable(format!("the limiter's store could not decide: {e}"))
    };
    // Refunds first (they give room back), settled like `/v1/report`;
    // then peeked for their status.
    let refunded_decision = if refund_ops.is_empty() {
        None
    } else {
        if let Err(e) = live
            .limiter
            .settle(&refund_ops, ratewarden::Settle::Refund(1))
            .await
        {
            return Err(store_failed(&e));
        }
        let peek: Vec<Op<'_>> = refund_ops.iter().map(|op| op.weighing(0)).collect();
        decided(&live.limiter, &peek, Mode::Peek)
            .await
            .map_err(|e| store_failed(&e))?
    };
    let charged_decision = decided(&live.limiter, &charge_ops, Mode::Apply)
        .await
        .map_err(|e| store_failed(&e))?;
    // Recorded as every decision is: per-rule counts, keys near their
    // limit for `/v1/keys`, bans seen, the refusal log.
    if let Some(d) = &charged_decision {
        gw.record(&live, d, None);
    }
    let peeked_decision = decided(&live.limiter, &peek_ops, Mode::Peek)
        .await
        .map_err(|e| store_failed(&e))?;
    let mut statuses: Few<wire::Status<'_>> = Few::new();
    let mut over = false;
    for (i, plan) in plans.iter().enumerate() {
        let (status, code) = match plan {
            Plan::Free => (
                wire::Status {
                    code: Code::Ok as i32,
                    limit: None,
                    remaining: 0,
                    until_reset: None,
                },
                "no_limit",
            ),
            Plan::Unlimited(_) => (
                wire::Status {
                    code: Code::Ok as i32,
                    limit: None,
                    remaining: u32::MAX,
                    until_reset: None,
                },
                "unlimited",
            ),
            Plan::Blocked(l) => {
                over |= !l.shadow;
                (
                    wire::Status {
                        code: if l.shadow { Code::Ok } else { Code::OverLimit } as i32,
                        limit: Some((&l.name, 0, l.unit)),
                        remaining: 0,
                        until_reset: Some(until_boundary(l.window)),
                    },
                    if l.shadow {
                        "shadow_over_limit"
                    } else {
                        "over_limit"
                    },
                )
            }
            Plan::Charged(l, _, at) | Plan::Peeked(l, _, at) | Plan::Refunded(l, _, at) => {
                let d = match plan {
                    Plan::Charged(..) => charged_decision.as_ref(),
                    Plan::Peeked(..) => peeked_decision.as_ref(),
                    _ => refunded_decision.as_ref(),
                };
                let r = &d.expect("decided").rules[*at];
                // A refund only gives room back: never refused.
                let refund = matches!(plan, Plan::Refunded(..));
                // A peek (`hits_addend: 0`) costs nothing: what is left
                // now, and OK at the limit (over it only when banned or
                // too soon), as envoyproxy/ratelimit answers one. It was
                // decided at one request's cost: that is added back.
                let peek = matches!(plan, Plan::Peeked(..));
                let (refused, remaining) = if peek {
                    match r.reason {
                        None => (false, r.remaining.saturating_add(r.rule.cost(1))),
                        Some(ratewarden::Reason::Limit) => (false, r.remaining),
                        Some(_) => (true, 0),
                    }
                } else {
                    (!r.allowed() && !refund, r.remaining)
                };
                let remaining = remaining.min(u64::from(l.requests_per_unit).max(1));
                let code = match (refused, l.shadow) {
                    _ if refund => "refunded",
                    (false, _) => "ok",
                    (true, true) => "shadow_over_limit",
                    (true, false) => "over_limit",
                };
                over |= refused && !l.shadow;
                (
                    wire::Status {
                        code: if refused && !l.shadow {
                            Code::OverLimit
                        } else {
                            Code::Ok
                        } as i32,
                        limit: Some((&l.name, l.requests_per_unit, l.unit)),
                        // OVER_LIMIT reports nothing left, whatever a
                        // `hits_addend` overshot by (envoyproxy/ratelimit).
                        remaining: if refused && !l.shadow {
                            0
                        } else {
                            u32::try_from(remaining).unwrap_or(u32::MAX)
                        },
                        until_reset: Some(r.reset_after),
                    },
                    code,
                )
            }
        };
        let label = match plan {
            Plan::Free => None,
            Plan::Unlimited(l)
            | Plan::Blocked(l)
            | Plan::Charged(l, ..)
            | Plan::Peeked(l, ..)
            | Plan::Refunded(l, ..) => Some((l.full_key.as_str(), l.detailed)),
        };
        gw.metrics.rls(req.domain, label, &keys[i], code);
        statuses.push(status);
    }
    let mut headers = vec![];
    if spec.headers.legacy || spec.headers.ietf {
        // The headers of every decided descriptor together, as the
        // proxy's of every rule: the binding one's numbers.
        let mut all = ratewarden::Decision {
            allowed: !over,
            delay: Duration::ZERO,
            rules: vec![],
        };
        for d in [&charged_decision, &peeked_decision, &refunded_decision]
            .into_iter()
            .flatten()
        {
            all.rules.extend(d.rules.iter().cloned());
        }
        if !all.rules.is_empty() {
            headers = all.headers(spec.headers);
        }
    }
    let mut headers: Vec<(&str, String)> = headers;
    if let Some([limit, remaining, reset]) = &spec.envoy_headers
        // The descriptor with the least left, as envoyproxy/ratelimit
        // picks it; its limit per unit, and the seconds to the unit's end.
        && let Some(s) = statuses
            .iter()
            .filter(|s| s.limit.is_some_and(|(_, rpu, _)| rpu > 0))
            .min_by_key(|s| s.remaining)
        && let Some((_, rpu, unit)) = s.limit
    {
        headers.push((limit.as_str(), rpu.to_string()));
        headers.push((remaining.as_str(), s.remaining.to_string()));
        let secs = config::unit_seconds(unit).unwrap_or(1);
        headers.push((
            reset.as_str(),
            ratewarden::decision::whole_secs(until_boundary(Duration::from_secs(secs)))
                .max(1)
                .to_string(),
        ));
    }
    let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut framed = Vec::new();
    wire::frame(
        &mut framed,
        if over { Code::OverLimit } else { Code::Ok } as i32,
        &statuses,
        &headers,
    );
    Ok((bytes::Bytes::from(framed), over))
}

/// `ops` decided together, through the admission path's one store call
/// (`None` when there are none). Here a rejection is a decision like any
/// other: its statuses say which descriptor was over.
async fn decided(
    limiter: &ratewarden::Limiter<crate::store::AnyStore>,
    ops: &[Op<'_>],
    mode: Mode,
) -> Result<Option<ratewarden::Decision>, ratewarden::StoreError> {
    if ops.is_empty() {
        return Ok(None);
    }
    match decide_ops(limiter, ops, 1, mode).await {
        Ok((d, _)) | Err(OpsRefusal::Limited(d)) => Ok(Some(d)),
        Err(OpsRefusal::Unavailable(e)) => Err(e),
    }
}

/// Until the next multiple of `window` since the epoch (where a fixed
/// window of it ends).
fn until_boundary(window: Duration) -> Duration {
    let w = window.as_micros().max(1);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_micros();
    Duration::from_micros(u64::try_from(w - now % w).unwrap_or(0))
}

/// What a connection's calls are answered by.
struct Services {
    gw: Arc<Gateway>,
    /// The descriptor tree of the configuration in force.
    trees: Trees,
    #[cfg(feature = "reflection")]
    reflection: reflection::Reflection,
}

impl Services {
    /// Answers one call (one HTTP/2 stream).
    async fn call(
        &self,
        req: http::Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<bytes::Bytes>,
    ) {
        let path = req.uri().path();
        if path == METHOD {
            let answer = should_rate_limit(&self.gw, &self.trees, req).await;
            return send_unary(&mut respond, answer);
        }
        if path.starts_with(health::SERVICE_PATH) {
            return health::call(&self.gw, req, respond).await;
        }
        #[cfg(feature = "reflection")]
        if reflection::serves(path) {
            // Boxed: tonic's futures are large, and every call's future is
            // as large as its largest branch (it is moved when the call
            // starts).
            return Box::pin(self.reflection.call(req, respond)).await;
        }
        send_unary(
            &mut respond,
            Err(Status::unimplemented("no such service or method here")),
        );
    }
}

/// Serves one HTTP/2 connection on h2 directly: its calls run inside the
/// connection's task (no task spawned per call, no body channel between
/// tasks), and what they answer is written when the connection is next
/// driven, several answers to a write. Settings as hyper's defaults.
async fn connection(stream: tokio::net::TcpStream, services: &Services) {
    use futures_util::StreamExt as _;
    use std::task::Poll;
    let mut builder = h2::server::Builder::new();
    builder
        .initial_window_size(1 << 20)
        .initial_connection_window_size(1 << 20)
        .max_frame_size(16 << 10)
        .max_header_list_size(16 << 10)
        .max_concurrent_streams(200)
        .max_send_buffer_size(400 << 10)
        .max_local_error_reset_streams(Some(1024));
    // A client that connects and never speaks HTTP/2 holds its socket no
    // longer than a request head may take (`client_header_timeout`).
    let limit = services.gw.live().config.client_header_timeout;
    let handshake = builder.handshake::<_, bytes::Bytes>(stream);
    let Ok(Ok(mut conn)) = tokio::time::timeout(limit, handshake).await else {
        return;
    };
    let mut calls = futures_util::stream::FuturesUnordered::new();
    std::future::poll_fn(|cx| {
        loop {
            let mut moved = false;
            // Reads what came (and writes what was answered).
            loop {
                match conn.poll_accept(cx) {
                    Poll::Ready(Some(Ok((req, respond)))) => {
                        calls.push(services.call(req, respond));
                        moved = true;
                    }
                    // Closed, or broken: its calls cannot answer any more.
                    Poll::Ready(Some(Err(_)) | None) => return Poll::Ready(()),
                    Poll::Pending => break,
                }
            }
            while let Poll::Ready(Some(())) = calls.poll_next_unpin(cx) {
                moved = true;
            }
            if !moved {
                return Poll::Pending;
            }
        }
    })
    .await;
}

/// Serves the rate limit service, health (and reflection) on `listener`
/// (HTTP/2, cleartext) until `stop` turns true.
pub(crate) async fn serve(
    listener: TcpListener,
    gw: Arc<Gateway>,
    mut stop: watch::Receiver<bool>,
) {
    #[cfg(feature = "reflection")]
    let Some(reflection) = reflection::Reflection::new() else {
        tracing::error!("rls: the reflection descriptors do not load; not serving");
        return;
    };
    let services = Arc::new(Services {
        gw,
        trees: Trees::default(),
        #[cfg(feature = "reflection")]
        reflection,
    });
    let mut failures = crate::wire::AcceptFailures::default();
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.wait_for(|s| *s) => return,
        };
        let stream = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                failures.failed("rls", &e).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let services = services.clone();
        crate::wire::spawn(async move { connection(stream, &services).await });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_body_is_one_uncompressed_length_prefixed_message() {
        assert_eq!(unframe(&[0, 0, 0, 0, 3, 7, 8, 9]), Some(&[7u8, 8, 9][..]));
        assert_eq!(unframe(&[0, 0, 0, 0, 0]), Some(&[][..]));
        // Compressed, a length that is not the rest, too short: refused.
        assert_eq!(unframe(&[1, 0, 0, 0, 1, 7]), None);
        assert_eq!(unframe(&[0, 0, 0, 0, 2, 7]), None);
        assert_eq!(unframe(&[0, 0, 0, 0, 1, 7, 8]), None);
        assert_eq!(unframe(&[0, 0, 0]), None);
        assert_eq!(unframe(&[]), None);
        // Any bytes: an answer, never a panic; what is taken decodes or is
        // refused by prost, never read out of bounds.
        let mut next = wire::tests::xorshift(0x9E37_79B9_7F4A_7C15);
        for n in 0..2_000usize {
            let body: Vec<u8> = (0..n % 64).map(|_| next() as u8).collect();
            if let Some(m) = unframe(&body) {
                assert_eq!(m.len() + 5, body.len());
                let _ = wire::decode(m);
            }
        }
    }

    #[test]
    fn long_keys_are_cut_and_fingerprinted() {
        let short = op_key(&[("path", "/a"), ("user", "u1")]);
        assert_eq!(short, "path_/a.user_u1");
        let long_a = "é".repeat(400);
        let mut long_b = long_a.clone();
        long_b.push('x');
        let (a, b) = (op_key(&[("p", &long_a)]), op_key(&[("p", &long_b)]));
        assert!(
            a.len() <= MAX_KEY && b.len() <= MAX_KEY,
            "{} {}",
            a.len(),
            b.len()
        );
        assert_ne!(a, b, "same prefix, different values: different keys");
        assert_eq!(a, op_key(&[("p", &long_a)]), "stable");
    }
}
