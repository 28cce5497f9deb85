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
//! request described becomes a [`RequestView`] and [`Facts`] as a proxied
//! request does, and is decided by [`Gateway::admit`].

use std::net::IpAddr;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use prost::Message;
use ratewarden::Decision;
use ratewarden_tower::admission::{Facts, Identity, Refusal};
use ratewarden_tower::identity::ClientIp;
use ratewarden_tower::view::{Fields, RequestView};

use crate::answer::{Body, empty_body};
use crate::gateway::Gateway;
use crate::proxy::forward::rule_path;

use super::envoy_auth::{
    CheckRequest, CheckResponse, DeniedHttpResponse, HeaderValue as PbHeader, HeaderValueOption,
    HttpResponse, HttpStatus, OkHttpResponse, RpcStatus,
};

/// The gRPC method Envoy calls.
pub const CHECK: &str = "/envoy.service.auth.v3.Authorization/Check";

/// The header telling nginx's `error_page` what the other dialects would
/// have answered (nginx's `auth_request` takes only 2xx, 401 and 403).
pub const NGINX_STATUS: &str = "x-ratewarden-status";

/// Largest body taken (a gRPC `CheckRequest`).
const MAX_BODY: usize = 64 << 10;

/// Which hook's contract a request speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// nginx `auth_request`.
    Nginx,
    /// Traefik ForwardAuth, Caddy `forward_auth`.
    Forward,
    /// Envoy's HTTP `ext_authz`: the original path follows the prefix.
    Envoy,
}

/// A request a proxy describes, as the gateway would have received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Asked {
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
    pub fn view(&self) -> RequestView<'_> {
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
pub struct Bad(pub String);

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
pub fn describe(
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
pub fn describe_check(
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

/// How a decision is answered in a dialect.
enum Verdict {
    Admitted(Option<Decision>),
    Refused(Refusal),
}

/// Decides what `asked` describes, through the one admission path.
async fn decide(
    gw: &Gateway,
    asked: &Asked,
    rid: &crate::observe::request_id::RequestId,
) -> Verdict {
    let live = gw.live();
    let request = asked.view();
    let claims = match gw.required_claims(&live, &request) {
        Ok(c) => c,
        Err(r) => return Verdict::Refused(r),
    };
    let request = request.with_claims(claims.as_ref().map(|c| c as _));
    let facts = Facts {
        request,
        identity: Identity::Resolve,
        route: Some(live.router.route_name(&request)),
    };
    match gw.admit(&live, &facts, rid).await {
        Ok(a) => Verdict::Admitted(a.decision),
        Err(r) => Verdict::Refused(r),
    }
}

/// Handles one request on the authorisation listener.
pub async fn handle(
    gw: &Gateway,
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
    let rid = crate::observe::request_id::RequestId::keep_or_make(
        req.headers().get("x-request-id").map(HeaderValue::as_bytes),
        quanta::Instant::now(),
    );
    let path = req.uri().path();
    if path == CHECK {
        return grpc_check(gw, req, proxy, client_ip, &rid).await;
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
            tracing::debug!(why, request_id = %rid, "authz: a request that describes no request");
            let answer = crate::answer::problem_response(StatusCode::BAD_REQUEST, &why);
            return in_dialect(dialect, answer);
        }
    };
    let answer = match decide(gw, &asked, &rid).await {
        Verdict::Admitted(d) => {
            let mut r = Response::new(empty_body());
            crate::proxy::flow::add_rate_headers(d.as_ref(), r.headers_mut(), live.config.headers);
            r
        }
        Verdict::Refused(refusal) => {
            crate::proxy::flow::refusal_answer(&refusal, &live.config, None)
        }
    };
    in_dialect(dialect, answer)
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

/// Envoy's gRPC `Check`.
async fn grpc_check(
    gw: &Gateway,
    req: Request<Incoming>,
    proxy: IpAddr,
    client_ip: &ClientIp,
    rid: &crate::observe::request_id::RequestId,
) -> Response<Body> {
    let body = match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            return grpc_answer(
                None,
                INVALID_ARGUMENT,
                "request larger than 64 KiB or unreadable",
            );
        }
    };
    let mut buf = body;
    if buf.len() < 5 {
        return grpc_answer(None, INVALID_ARGUMENT, "no message");
    }
    let compressed = buf.get_u8();
    let len = buf.get_u32() as usize;
    if compressed != 0 {
        return grpc_answer(None, UNIMPLEMENTED, "compressed messages are not taken");
    }
    if len != buf.len() {
        return grpc_answer(None, INVALID_ARGUMENT, "one message per call");
    }
    let check = match CheckRequest::decode(buf) {
        Ok(c) => c,
        Err(e) => return grpc_answer(None, INVALID_ARGUMENT, &format!("bad CheckRequest: {e}")),
    };
    let asked = match describe_check(&check, proxy, client_ip) {
        Ok(a) => a,
        Err(Bad(why)) => return grpc_answer(None, INVALID_ARGUMENT, &why),
    };
    let live = gw.live();
    let response = match decide(gw, &asked, rid).await {
        Verdict::Admitted(d) => {
            let mut to_client = vec![];
            if let Some(d) = d {
                for (name, value) in d.headers(live.config.headers) {
                    to_client.push(option(name, &value));
                }
            }
            CheckResponse {
                status: Some(RpcStatus {
                    code: OK,
                    ..Default::default()
                }),
                http_response: Some(HttpResponse::OkResponse(OkHttpResponse {
                    response_headers_to_add: to_client,
                })),
            }
        }
        Verdict::Refused(refusal) => {
            let answer = crate::proxy::flow::refusal_answer(&refusal, &live.config, None);
            let status = answer.status();
            let code = match &refusal {
                Refusal::Unavailable(_) => UNAVAILABLE,
                Refusal::Unauthenticated => UNAUTHENTICATED,
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
            CheckResponse {
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
            }
        }
    };
    grpc_answer(Some(Bytes::from(response.encode_to_vec())), OK, "")
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
