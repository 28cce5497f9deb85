//! The authorisation listener (`authz: {listen}`): decisions for the
//! proxies people already run, each through its own hook's contract, with
//! the same rules as the gateway, through the one admission path.
//!
//! | path | proxy | the request it describes |
//! |---|---|---|
//! | `/authz/nginx` | nginx `auth_request` | `X-Original-Method`, `X-Original-URI`; the client from the forwarding header (`X-Forwarded-For`) |
//! | `/authz/forward` | Traefik ForwardAuth, Caddy `forward_auth` | `X-Forwarded-Method`, `-Uri`, `-Host`, `-Proto`, `-For` |
//! | `/authz/envoy/...` | Envoy `ext_authz` (HTTP, `path_prefix: /authz/envoy`) | the method, the path after the prefix, the headers |
//! | gRPC `envoy.service.auth.v3.Authorization/Check` | Envoy `ext_authz` (gRPC) | `attributes.request.http`, `attributes.source.address` |
//!
//! The proxy is the peer: the client address its headers name is believed
//! only from `identity.trusted_proxies`, as `identity: {from: forwarded}`
//! believes a forwarded one; otherwise the client is the proxy. The
//! request described goes through the one flow
//! ([`crate::proxy::flow::run`]) as a proxied request does, to be decided,
//! counted under its route and logged; the hook's verdict is its answer.

use std::net::IpAddr;
use std::sync::Arc;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use prost::Message;
use ratewarden::Decision;
use ratewarden_tower::admission::Refusal;
use ratewarden_tower::identity::ClientIp;
use ratewarden_tower::view::{Fields, RequestView};

use crate::answer::{Body, empty_body};
use crate::gateway::{Gateway, Live};
use crate::proxy::flow::{
    End, Flow, Line, Outcome, Own, Target, Tried, Wire, add_rate_headers, refusal_answer,
};
use crate::proxy::forward::rule_path;
use crate::upstream::route::{Chosen, Group};

use super::envoy_auth::{
    CheckRequest, CheckResponse, DeniedHttpResponse, HeaderValue as PbHeader, HeaderValueOption,
    HttpResponse, HttpStatus, OkHttpResponse, RpcStatus,
};

/// The gRPC method Envoy calls.
pub(crate) const CHECK: &str = "/envoy.service.auth.v3.Authorization/Check";

/// The header telling nginx's `error_page` what the other dialects would
/// have answered (nginx's `auth_request` takes only 2xx, 401 and 403).
pub(crate) const NGINX_STATUS: &str = "x-ratewarden-status";

/// Largest body taken (a gRPC `CheckRequest`).
const MAX_BODY: usize = 64 << 10;

/// Which hook's contract a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dialect {
    /// nginx `auth_request`.
    Nginx,
    /// Traefik ForwardAuth, Caddy `forward_auth`.
    Forward,
    /// Envoy's HTTP `ext_authz`: the original path follows the prefix.
    Envoy,
}

/// A request a proxy describes, as the gateway would have received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Asked {
    /// The method.
    pub method: Method,
    /// The target (path and query) as the client sent it.
    pub target: String,
    /// The path as a rule sees it.
    pub path: String,
    /// The request's header fields as the client sent them (`Host` the
    /// original's), without the hook's own fields.
    pub headers: HeaderMap,
    /// The client: the address the proxy names when it is trusted, else
    /// the proxy.
    pub client: IpAddr,
}

impl Asked {
    /// The one request view of it.
    pub(crate) fn view(&self) -> RequestView<'_> {
        RequestView {
            target: &self.target,
            fields: Fields::Map(&self.headers),
            peer: Some(self.client),
            ..RequestView::bare(&self.method, &self.path)
        }
    }
}

/// Why a hook's request describes no request (answered 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Bad(pub String);

/// Fields a hook adds about the request, never the request's own.
fn hook_field(name: &str) -> bool {
    matches!(
        name,
        "x-original-method"
            | "x-original-uri"
            | "x-original-url"
            | "x-forwarded-method"
            | "x-forwarded-uri"
            | "x-forwarded-host"
            | "x-forwarded-proto"
            | "x-forwarded-port"
            | "x-forwarded-for"
            | "x-real-ip"
            | "forwarded"
            | "content-length"
            | "transfer-encoding"
            | "connection"
            | "keep-alive"
            | "te"
            | "upgrade"
            | "expect"
    )
}

/// The first value of `name` as text.
fn text<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
}

/// What `dialect` says a request is: from the hook's request (`method`,
/// `target`, `headers`) sent by `proxy`, whose naming of the client is
/// believed when `client_ip` trusts it: read from the one forwarding
/// header the operator names (`identity.header` under `from: forwarded`,
/// else `X-Forwarded-For`), by the one walker every front end uses
/// ([`ClientIp::behind`]). Bytes from a proxy's hook are hostile like any:
/// a bad method, target or address is refused, never guessed.
pub(crate) fn describe(
    dialect: Dialect,
    method: &Method,
    target: &str,
    headers: &HeaderMap,
    proxy: IpAddr,
    client_ip: &ClientIp,
) -> Result<Asked, Bad> {
    let need = |name: &str| text(headers, name).ok_or_else(|| Bad(format!("`{name}` is missing")));
    match dialect {
        Dialect::Nginx => describe_parts(
            need("x-original-method")?,
            need("x-original-uri")?,
            text(headers, "host"),
            headers,
            proxy,
            client_ip,
        ),
        Dialect::Forward => describe_parts(
            need("x-forwarded-method")?,
            need("x-forwarded-uri")?,
            text(headers, "x-forwarded-host").or_else(|| text(headers, "host")),
            headers,
            proxy,
            client_ip,
        ),
        Dialect::Envoy => {
            // The original path follows the prefix; `/authz/envoy` alone
            // (or with a query) is the root.
            let rest = target.strip_prefix("/authz/envoy").unwrap_or(target);
            let original = if rest.is_empty() || rest.starts_with('?') {
                format!("/{rest}")
            } else {
                rest.to_owned()
            };
            describe_parts(
                method.as_str(),
                &original,
                text(headers, "host"),
                headers,
                proxy,
                client_ip,
            )
        }
    }
}

fn describe_parts(
    method: &str,
    target: &str,
    host: Option<&str>,
    headers: &HeaderMap,
    proxy: IpAddr,
    client_ip: &ClientIp,
) -> Result<Asked, Bad> {
    let method = Method::from_bytes(method.as_bytes())
        .map_err(|_| Bad(format!("{method:?} is not a method")))?;
    if !target.starts_with('/') {
        return Err(Bad(format!(
            "the original URI {target:?} is not a path (origin-form, `/...`)"
        )));
    }
    let path = rule_path(&method, target)
        .map_err(|e| Bad(format!("the original URI {target:?} is refused: {e:?}")))?
        .into_owned();
    let client = if client_ip.trusted(proxy) {
        client_ip.behind(proxy, Fields::Map(headers))
    } else {
        proxy
    };
    let mut fields = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if !hook_field(name.as_str()) && name != header::HOST {
            fields.append(name.clone(), value.clone());
        }
    }
    if let Some(h) = host.and_then(|h| HeaderValue::from_str(h).ok()) {
        fields.insert(header::HOST, h);
    }
    Ok(Asked {
        method,
        target: target.to_owned(),
        path,
        headers: fields,
        client,
    })
}

/// What Envoy's gRPC `CheckRequest` says a request is.
pub(crate) fn describe_check(
    check: &CheckRequest,
    proxy: IpAddr,
    client_ip: &ClientIp,
) -> Result<Asked, Bad> {
    let attrs = check
        .attributes
        .as_ref()
        .ok_or_else(|| Bad("the CheckRequest has no attributes".into()))?;
    let http = attrs
        .request
        .as_ref()
        .and_then(|r| r.http.as_ref())
        .ok_or_else(|| Bad("the CheckRequest has no attributes.request.http".into()))?;
    let mut headers = HeaderMap::new();
    for (k, v) in &http.headers {
        // Envoy sends pseudo-headers (`:authority`, `:path`) too.
        if k.starts_with(':') {
            continue;
        }
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            headers.append(n, v);
        }
    }
    let source = attrs
        .source
        .as_ref()
        .and_then(|s| s.address.as_ref())
        .and_then(|a| a.socket_address.as_ref())
        .and_then(|s| s.address.parse::<IpAddr>().ok());
    let host = (!http.host.is_empty()).then_some(http.host.as_str());
    let target = if http.path.is_empty() {
        "/"
    } else {
        &http.path
    };
    let mut asked = describe_parts(
        if http.method.is_empty() {
            "GET"
        } else {
            &http.method
        },
        target,
        host,
        &headers,
        proxy,
        // `source.address` is the client, not a forwarding header: it
        // stands when the proxy is trusted.
        &ClientIp::default(),
    )?;
    asked.client = match source {
        Some(ip) if client_ip.trusted(proxy) => ip,
        _ => proxy,
    };
    Ok(asked)
}

/// The hook's request as a wire of the one flow ([`crate::proxy::flow`]):
/// the request it describes, decided as a proxied one and counted under
/// its route with an access log line, but sent nowhere: the answer is the
/// dialect's verdict ([`Target::Itself`]).
struct Hook {
    asked: Asked,
    /// The hook request's own `X-Request-Id`.
    rid: Option<HeaderValue>,
    /// How the verdict is written: an HTTP dialect's answer, or gRPC's
    /// `CheckResponse`.
    how: How,
}

#[derive(Clone, Copy)]
enum How {
    Http(Dialect),
    Grpc,
}

impl Wire for Hook {
    type Done = Response<Body>;
    type Head = ();

    fn request_id(&self) -> Option<&[u8]> {
        self.rid.as_ref().map(HeaderValue::as_bytes)
    }

    fn trace_fields(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        let h = &self.asked.headers;
        (
            h.get("traceparent").map(HeaderValue::as_bytes),
            h.get("tracestate").map(HeaderValue::as_bytes),
        )
    }

    fn method(&self) -> &Method {
        &self.asked.method
    }

    fn target(&self) -> &str {
        &self.asked.target
    }

    fn view<'a>(&'a self, path: &'a str, target: &'a str) -> RequestView<'a> {
        RequestView {
            path,
            target,
            ..self.asked.view()
        }
    }

    fn route<'l>(
        &self,
        flow: &mut Flow,
        live: &'l Live,
        request: &RequestView<'_>,
    ) -> (Option<&'l str>, Target) {
        // The request's route, for its rules and its counts; its servers
        // are the proxy's business.
        let name = flow
            .route(live, request)
            .map_or(crate::upstream::route::DEFAULT, |(n, _)| n);
        (Some(name), Target::Itself)
    }

    async fn answer(
        &mut self,
        flow: &Flow,
        own: Own<'_>,
    ) -> std::io::Result<(Response<Body>, Outcome)> {
        let live = &flow.live;
        let verdict = match own {
            Own::Admitted(pass) => Ok(pass.decision.as_ref()),
            Own::Refused(refusal) => Err(refusal),
            Own::Edge(e) => {
                let answer = crate::answer::problem_response(e.status(), &e.detail());
                return Ok(self.dialect(answer));
            }
            Own::Answer(a) => return Ok(self.dialect(a)),
        };
        let answer = match self.how {
            How::Grpc => {
                let (status, response) = check_response(verdict, live).await;
                let outcome = Outcome::own(status, None);
                return Ok((
                    grpc_answer(Some(Bytes::from(response.encode_to_vec())), OK, ""),
                    outcome,
                ));
            }
            How::Http(_) => match verdict {
                Ok(d) => {
                    let mut r = Response::new(empty_body());
                    add_rate_headers(d, r.headers_mut(), live.config.headers);
                    r
                }
                Err(refusal) => refusal_answer(refusal, &live.config, None),
            },
        };
        Ok(self.dialect(answer))
    }

    async fn attempt(&mut self, _: &Flow, _: &Chosen<'_>, _: &Group) -> Tried<()> {
        // (`Target::Itself`: never tried.)
        Tried::Answer(crate::answer::problem_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "an authorisation hook has no upstream",
        ))
    }

    async fn relay(
        &mut self,
        _: End,
        _: Option<ratewarden::Decision>,
        (): (),
        _: Chosen<'_>,
    ) -> std::io::Result<Response<Body>> {
        Ok(Response::new(empty_body()))
    }

    fn gone(&mut self) -> Response<Body> {
        Response::new(empty_body())
    }

    fn line(&self) -> Line<'_> {
        Line {
            peer: self.asked.client,
            method: self.asked.method.as_str(),
            target: self.asked.target.as_bytes(),
            version: "HTTP/1.1",
            referer: None,
            user_agent: None,
        }
    }
}

impl Hook {
    /// `answer` in the hook's terms, and what the end phase reads of it.
    fn dialect(&self, answer: Response<Body>) -> (Response<Body>, Outcome) {
        let status = answer.status().as_u16();
        let answer = match self.how {
            How::Http(d) => in_dialect(d, answer),
            How::Grpc => {
                let code = if status == 503 {
                    UNAVAILABLE
                } else {
                    INVALID_ARGUMENT
                };
                grpc_answer(
                    None,
                    code,
                    &format!("the request it describes was answered {status}"),
                )
            }
        };
        (answer, Outcome::own(status, None))
    }
}

/// Envoy's `CheckResponse` for a verdict, and the HTTP status the request
/// it describes gets.
async fn check_response(
    verdict: Result<Option<&Decision>, &Refusal>,
    live: &Live,
) -> (u16, CheckResponse) {
    match verdict {
        Ok(d) => {
            let mut to_client = vec![];
            if let Some(d) = d {
                for (name, value) in d.headers(live.config.headers) {
                    to_client.push(option(name, &value));
                }
            }
            let response = CheckResponse {
                status: Some(RpcStatus {
                    code: OK,
                    ..Default::default()
                }),
                http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                    response_headers_to_add: to_client,
                })),
            };
            (200, response)
        }
        Err(refusal) => {
            let answer = refusal_answer(refusal, &live.config, None);
            let status = answer.status();
            let code = match &refusal {
                Refusal::Unavailable(_) => UNAVAILABLE,
                Refusal::Unauthenticated | Refusal::NoConsumer => UNAUTHENTICATED,
                _ => PERMISSION_DENIED,
            };
            let headers = answer
                .headers()
                .iter()
                .filter_map(|(k, v)| Some(option(k.as_str(), v.to_str().ok()?)))
                .collect();
            let body = answer
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            let response = CheckResponse {
                status: Some(RpcStatus {
                    code,
                    ..Default::default()
                }),
                http_response: Some(HttpResponse::DeniedResponse(DeniedHttpResponse {
                    status: Some(HttpStatus {
                        code: i32::from(status.as_u16()),
                    }),
                    headers,
                    body: String::from_utf8_lossy(&body).into_owned(),
                })),
            };
            (status.as_u16(), response)
        }
    }
}

/// Handles one request on the authorisation listener.
pub(crate) async fn handle(
    gw: &Arc<Gateway>,
    req: Request<Incoming>,
    client: crate::proxy::forward::Client,
) -> Response<Body> {
    let live = gw.live();
    let untrusting = ClientIp::default();
    let client_ip = live
        .config
        .policy
        .identity
        .client_ip()
        .unwrap_or(&untrusting);
    let proxy = client.peer.ip();
    let rid = req.headers().get("x-request-id").cloned();
    let path = req.uri().path();
    if path == CHECK {
        let asked = match read_check(req, proxy, client_ip).await {
            Ok(a) => a,
            Err(answer) => return answer,
        };
        return run_hook(
            gw,
            &live,
            Hook {
                asked,
                rid,
                how: How::Grpc,
            },
        )
        .await;
    }
    let dialect = if path == "/authz/nginx" {
        Dialect::Nginx
    } else if path == "/authz/forward" {
        Dialect::Forward
    } else if path == "/authz/envoy" || path.starts_with("/authz/envoy/") {
        Dialect::Envoy
    } else {
        return crate::answer::problem_response(
            StatusCode::NOT_FOUND,
            "authz paths: /authz/nginx, /authz/forward, /authz/envoy/..., and gRPC envoy.service.auth.v3.Authorization/Check",
        );
    };
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    let asked = match describe(
        dialect,
        req.method(),
        &target,
        req.headers(),
        proxy,
        client_ip,
    ) {
        Ok(a) => a,
        Err(Bad(why)) => {
            tracing::debug!(why, "authz: a request that describes no request");
            let answer = crate::answer::problem_response(StatusCode::BAD_REQUEST, &why);
            return in_dialect(dialect, answer);
        }
    };
    run_hook(
        gw,
        &live,
        Hook {
            asked,
            rid,
            how: How::Http(dialect),
        },
    )
    .await
}

/// The hook's request through the one flow.
async fn run_hook(gw: &Arc<Gateway>, live: &Arc<Live>, mut hook: Hook) -> Response<Body> {
    match crate::proxy::flow::run(gw, live, &mut hook).await {
        Ok(r) => r,
        // (This wire's answers are built, not written: nothing fails.)
        Err(_) => Response::new(empty_body()),
    }
}

/// `answer` as `dialect` can carry it: nginx takes only 2xx, 401 and 403
/// from `auth_request` (anything else becomes a 500), so every other
/// refusal is a 403 saying the status the others would get in
/// [`NGINX_STATUS`]; its `error_page` turns it back (the README's recipe).
fn in_dialect(dialect: Dialect, mut answer: Response<Body>) -> Response<Body> {
    let status = answer.status();
    if dialect == Dialect::Nginx
        && !status.is_success()
        && status != StatusCode::UNAUTHORIZED
        && status != StatusCode::FORBIDDEN
    {
        answer.headers_mut().insert(
            HeaderName::from_static(NGINX_STATUS),
            HeaderValue::from(status.as_u16()),
        );
        *answer.status_mut() = StatusCode::FORBIDDEN;
    } else if dialect == Dialect::Nginx && !status.is_success() {
        answer.headers_mut().insert(
            HeaderName::from_static(NGINX_STATUS),
            HeaderValue::from(status.as_u16()),
        );
    }
    answer
}

/// A gRPC answer: one message and `grpc-status: 0`, or a trailers-only
/// status.
fn grpc_answer(message: Option<Bytes>, code: i32, text: &str) -> Response<Body> {
    let mut trailers = HeaderMap::new();
    crate::wire::grpc::put_status(&mut trailers, code, text);
    let mut r = match message {
        Some(m) => {
            let mut framed = BytesMut::with_capacity(5 + m.len());
            framed.put_u8(0);
            framed.put_u32(m.len() as u32);
            framed.put_slice(&m);
            let frames = vec![
                Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(framed.freeze())),
                Ok(hyper::body::Frame::trailers(trailers)),
            ];
            Response::new(
                http_body_util::StreamBody::new(futures_util::stream::iter(frames))
                    .map_err(|never| match never {})
                    .boxed_unsync(),
            )
        }
        None => {
            // Trailers-only: the status in the headers.
            let mut r = Response::new(empty_body());
            r.headers_mut().extend(trailers);
            r
        }
    };
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    r
}

/// gRPC codes used here.
const OK: i32 = 0;
const INVALID_ARGUMENT: i32 = 3;
const PERMISSION_DENIED: i32 = 7;
const UNAVAILABLE: i32 = 14;
const UNAUTHENTICATED: i32 = 16;
const UNIMPLEMENTED: i32 = 12;

/// Envoy's gRPC `Check` read: the request it describes, or the gRPC
/// status saying why it describes none.
async fn read_check(
    req: Request<Incoming>,
    proxy: IpAddr,
    client_ip: &ClientIp,
) -> Result<Asked, Response<Body>> {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return Err(grpc_answer(
                None,
                INVALID_ARGUMENT,
                "request larger than 64 KiB or unreadable",
            ));
        }
    };
    let mut buf = body;
    if buf.len() < 5 {
        return Err(grpc_answer(None, INVALID_ARGUMENT, "no message"));
    }
    let compressed = buf.get_u8();
    let len = buf.get_u32() as usize;
    if compressed != 0 {
        return Err(grpc_answer(
            None,
            UNIMPLEMENTED,
            "compressed messages are not taken",
        ));
    }
    if len != buf.len() {
        return Err(grpc_answer(None, INVALID_ARGUMENT, "one message per call"));
    }
    let check = match CheckRequest::decode(buf) {
        Ok(c) => c,
        Err(e) => {
            return Err(grpc_answer(
                None,
                INVALID_ARGUMENT,
                &format!("bad CheckRequest: {e}"),
            ));
        }
    };
    describe_check(&check, proxy, client_ip)
        .map_err(|Bad(why)| grpc_answer(None, INVALID_ARGUMENT, &why))
}

/// A header for Envoy to add.
fn option(name: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(PbHeader {
            key: name.to_ascii_lowercase(),
            value: value.to_owned(),
        }),
    }
}
