//! Routes: which group of upstream servers a request goes to, and how a
//! group chooses a server and keeps track of the ones that fail.
//!
//! A route matches like a rule (method, normalised path); the first that
//! matches wins, else the top-level `upstream:` (the route `default`). A
//! group balances over its servers (round robin, least requests, or a hash
//! of the client's identity); a server that fails `failures` times in a row
//! (could not connect, broke, timed out) is ejected for `eject_for`, doubled
//! on each ejection in a row up to 8 times; when that time is up, the next
//! request it gets is the probe that takes it back. An active check (`GET
//! path` every `interval`) ejects a server that answers anything but 2xx or
//! 3xx, and takes it back when it does again. A request whose connection
//! could not be made (nothing was sent) is tried on the next server; when
//! no server is left, the answer is 502.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use ratewarden_tower::view::RequestView;

use crate::config::{Matcher, RouteSpec, ServerSpec};
use crate::observe::metrics::{Metrics, ServerCounts};
use crate::upstream::pool::Pool;

pub(crate) use crate::config::{Active, Balance, Passive};

/// One upstream server of a group.
#[derive(Debug)]
pub struct Server {
    /// The URL's path prefix, without its trailing `/`.
    pub prefix: String,
    /// Its connections.
    pub pool: Arc<Pool>,
    /// `host:port`, for metrics and logs.
    pub label: String,
    inflight: AtomicUsize,
    failures: AtomicU32,
    /// Ejected until this many µs after the group's epoch; 0: not ejected.
    down_until: AtomicU64,
    ejections: AtomicU32,
    /// The active check's verdict (true: failing).
    check_failing: AtomicBool,
    counts: Arc<ServerCounts>,
}

/// A route's servers.
#[derive(Debug)]
pub struct Group {
    /// The route's name.
    pub route: String,
    /// Its servers.
    pub servers: Vec<Server>,
    /// Whether the client's `Host` goes upstream, not the server's.
    pub preserve_host: bool,
    /// Fields set or removed upstream (`request_headers`).
    pub request_headers: crate::config::RequestHeaders,
    /// A server speaks HTTP/2 (h2c): the group's requests go by hyper's
    /// path, which streams both ways with trailers.
    pub h2: bool,
    /// Its answers and its upstream's time, for the metrics.
    pub counts: Arc<crate::observe::metrics::RouteCounts>,
    balance: Balance,
    passive: Option<Passive>,
    next: AtomicUsize,
    epoch: Instant,
}

/// A server taken for one request: counted in flight until dropped.
#[derive(Debug)]
pub struct Chosen<'g> {
    group: &'g Group,
    /// Its index in the group.
    pub index: usize,
}

impl<'g> Chosen<'g> {
    /// The server.
    pub fn server(&self) -> &'g Server {
        &self.group.servers[self.index]
    }
}

impl Drop for Chosen<'_> {
    fn drop(&mut self) {
        self.server().inflight.fetch_sub(1, Ordering::Relaxed);
    }
}

pub(crate) use crate::observe::metrics::Outcome;

impl Group {
    fn now(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    fn up(&self, i: usize, now: u64) -> bool {
        let s = &self.servers[i];
        s.down_until.load(Ordering::Relaxed) <= now && !s.check_failing.load(Ordering::Relaxed)
    }

    /// A server for a request from `client` (the identity, for `hash`),
    /// not one of `tried`; `None` when every server is down or tried.
    pub fn choose(&self, client: &str, tried: &[usize]) -> Option<Chosen<'_>> {
        let now = self.now();
        let n = self.servers.len();
        let eligible = |i: usize| !tried.contains(&i) && self.up(i, now);
        let index = match self.balance {
            Balance::RoundRobin => {
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                (0..n).map(|k| (start + k) % n).find(|&i| eligible(i))
            }
            Balance::LeastRequests => {
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                (0..n)
                    .map(|k| (start + k) % n)
                    .filter(|&i| eligible(i))
                    .min_by_key(|&i| self.servers[i].inflight.load(Ordering::Relaxed))
            }
            Balance::Hash => (0..n)
                .filter(|&i| eligible(i))
                .max_by_key(|&i| rendezvous(client, &self.servers[i].label)),
        }?;
        self.servers[index].inflight.fetch_add(1, Ordering::Relaxed);
        Some(Chosen { group: self, index })
    }

    /// Records how an attempt on server `i` went; ejects it after
    /// `failures` in a row (passive checks on), takes it back on success.
    pub fn record(&self, i: usize, outcome: Outcome) {
        let s = &self.servers[i];
        s.counts.add(outcome);
        match outcome {
            Outcome::Answered => {
                let was = s.failures.swap(0, Ordering::Relaxed);
                if s.ejections.swap(0, Ordering::Relaxed) > 0 {
                    s.down_until.store(0, Ordering::Relaxed);
                    tracing::info!(route = self.route, server = s.label, "upstream server back");
                } else if was > 0 {
                    s.down_until.store(0, Ordering::Relaxed);
                }
            }
            Outcome::Failed | Outcome::TimedOut => {
                let Some(p) = self.passive else {
                    return;
                };
                let failures = s.failures.fetch_add(1, Ordering::Relaxed) + 1;
                if failures < p.failures {
                    return;
                }
                let n = s.ejections.fetch_add(1, Ordering::Relaxed).min(3);
                let length = p.eject_for * (1 << n);
                s.down_until
                    .store(self.now() + length.as_micros() as u64, Ordering::Relaxed);
                // The probe after the ejection counts alone: one more
                // failure ejects again, for longer.
                s.failures.store(p.failures - 1, Ordering::Relaxed);
                tracing::warn!(
                    route = self.route,
                    server = s.label,
                    failures,
                    ejected_for = ?length,
                    "upstream server ejected"
                );
            }
        }
    }

    /// Whether server `i` takes requests now (for metrics).
    pub fn is_up(&self, i: usize) -> bool {
        self.up(i, self.now())
    }
}

/// A server's weight for `client` (rendezvous hashing): FNV-1a of both.
fn rendezvous(client: &str, server: &str) -> u64 {
    let mut h = ratewarden::fnv1a(client.bytes().chain([0xFF]).chain(server.bytes()));
    // A final mix: FNV's low bits are weak for short inputs.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^ (h >> 33)
}

/// Every route, and the default.
#[derive(Debug)]
pub struct Router {
    routes: Vec<(String, Matcher, Arc<Group>)>,
    default: Option<Arc<Group>>,
}

/// The name of the route of the top-level `upstream:`.
pub(crate) const DEFAULT: &str = crate::config::DEFAULT_ROUTE;

/// Which of `routes` (their matchers, in order) a request takes: the first
/// whose match takes it; `None` is the default route. The one rule for the
/// router and for `simulate` (which picks routes without servers).
pub(crate) fn chosen<'a>(
    routes: impl IntoIterator<Item = &'a Matcher>,
    request: &RequestView<'_>,
) -> Option<usize> {
    routes.into_iter().position(|m| m.matches(request, None))
}

impl Router {
    /// Groups for `routes` and the `default` servers (none: the echo
    /// upstream), reusing `old`'s pools where a server is unchanged.
    pub fn new(
        routes: &[RouteSpec],
        default: Option<&ServerSpec>,
        preserve_host: bool,
        request_headers: &crate::config::RequestHeaders,
        old: Option<&Router>,
        metrics: &Metrics,
    ) -> Self {
        let pools: Vec<Arc<Pool>> = old
            .map(|o| {
                o.groups()
                    .flat_map(|g| g.servers.iter().map(|s| s.pool.clone()))
                    .collect()
            })
            .unwrap_or_default();
        let group = |route: &str, spec: &crate::config::GroupSpec| {
            let servers: Vec<Server> = spec
                .servers
                .iter()
                .map(|s| server(route, s, &pools, metrics))
                .collect();
            Arc::new(Group {
                route: route.to_owned(),
                h2: servers.iter().any(|s| s.pool.is_h2()),
                servers,
                balance: spec.balance,
                preserve_host: spec.preserve_host.unwrap_or(preserve_host),
                counts: metrics.route(route),
                request_headers: spec
                    .request_headers
                    .clone()
                    .unwrap_or_else(|| request_headers.clone()),
                // Nothing to fall back to with one server: never ejected.
                passive: if spec.servers.len() > 1 {
                    spec.passive
                } else {
                    None
                },
                next: AtomicUsize::new(0),
                epoch: Instant::now(),
            })
        };
        let router = Self {
            routes: routes
                .iter()
                .map(|r| (r.name.clone(), r.matcher.clone(), group(&r.name, &r.group)))
                .collect(),
            default: default.map(|s| {
                group(
                    DEFAULT,
                    &crate::config::GroupSpec {
                        servers: vec![s.clone()],
                        preserve_host: None,
                        request_headers: None,
                        balance: Balance::RoundRobin,
                        passive: None,
                        active: None,
                    },
                )
            }),
        };
        for (r, (_, _, g)) in routes.iter().zip(&router.routes) {
            if let Some(a) = &r.group.active {
                for i in 0..g.servers.len() {
                    crate::wire::spawn(check(Arc::downgrade(g), i, a.clone()));
                }
            }
        }
        router
    }

    /// The route for a request: the first whose match takes it, else the
    /// default (`None`: the echo upstream).
    pub fn route(&self, request: &RequestView<'_>) -> Option<(&str, &Arc<Group>)> {
        match chosen(self.routes.iter().map(|(_, m, _)| m), request) {
            Some(i) => {
                let (name, _, g) = &self.routes[i];
                Some((name, g))
            }
            None => self.default.as_ref().map(|g| (DEFAULT, g)),
        }
    }

    /// The name of the route a request goes to (`default` for the echo
    /// upstream too), for rules that match on it.
    pub fn route_name(&self, request: &RequestView<'_>) -> &str {
        self.route(request).map_or(DEFAULT, |(n, _)| n)
    }

    /// Every group.
    pub fn groups(&self) -> impl Iterator<Item = &Arc<Group>> {
        self.routes.iter().map(|(_, _, g)| g).chain(&self.default)
    }

    /// `ratewarden_upstream_server_up{route,server}`: 1 while a server
    /// takes requests, 0 while it is ejected or failing its check.
    pub fn render(&self, out: &mut String) {
        use std::fmt::Write as _;
        out.push_str("# HELP ratewarden_upstream_server_up Whether an upstream server takes requests (0: ejected or failing its check).\n# TYPE ratewarden_upstream_server_up gauge\n");
        for g in self.groups() {
            for (i, s) in g.servers.iter().enumerate() {
                let _ = writeln!(
                    out,
                    "ratewarden_upstream_server_up{{route=\"{}\",server=\"{}\"}} {}",
                    g.route,
                    s.label,
                    u8::from(g.is_up(i))
                );
            }
        }
    }

    /// Whether a request may go to the echo upstream (no default
    /// servers) or to HTTP/2 servers: then hyper serves every request,
    /// the HTTP/1.1 path none (it streams HTTP/1.1 only).
    pub fn hyper_only(&self) -> bool {
        self.default.is_none() || self.groups().any(|g| g.h2)
    }
}

fn server(route: &str, s: &ServerSpec, pools: &[Arc<Pool>], metrics: &Metrics) -> Server {
    let host = s.url.host().unwrap_or("127.0.0.1");
    let port = s
        .url
        .port_u16()
        .unwrap_or(if s.url.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    // A bracketed IPv6 literal keeps its brackets: `[::1]:8080`.
    let addr = format!("{host}:{port}");
    let host_header = s
        .url
        .authority()
        .and_then(|a| http::HeaderValue::from_str(a.as_str()).ok());
    // HTTP/2 with prior knowledge: `h2c://`, or `protocol: h2` on http://.
    let protocol = match s.url.scheme_str() {
        Some("h2c") => crate::config::Protocol::H2,
        _ => s.protocol,
    };
    let pool = pools
        .iter()
        .find(|p| {
            p.addr() == addr
                && p.host() == host_header.as_ref()
                && p.tls() == s.tls.as_ref()
                && p.protocol() == protocol
        })
        .cloned()
        .unwrap_or_else(|| Pool::new(addr.clone(), host_header, s.tls.clone(), protocol));
    Server {
        prefix: s.url.path().trim_end_matches('/').to_owned(),
        pool,
        counts: metrics.server_counts(route, &addr),
        label: addr,
        inflight: AtomicUsize::new(0),
        failures: AtomicU32::new(0),
        down_until: AtomicU64::new(0),
        ejections: AtomicU32::new(0),
        check_failing: AtomicBool::new(false),
    }
}

/// The active check of server `i` of `group`, until the group is gone (a
/// reload replaced it).
async fn check(group: Weak<Group>, i: usize, a: Active) {
    let mut every = tokio::time::interval(a.interval);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        let Some(g) = group.upgrade() else { return };
        let s = &g.servers[i];
        let ok = tokio::time::timeout(a.timeout, probe(&s.pool, &a.path))
            .await
            .unwrap_or(Err("no answer in time".into()));
        let was_failing = s.check_failing.swap(ok.is_err(), Ordering::Relaxed);
        match (&ok, was_failing) {
            (Err(why), false) => tracing::warn!(
                route = g.route,
                server = s.label,
                path = a.path,
                reason = %why,
                "upstream server failed its check: ejected until it passes"
            ),
            (Ok(()), true) => {
                tracing::info!(
                    route = g.route,
                    server = s.label,
                    "upstream server passed its check: back"
                )
            }
            _ => {}
        }
    }
}

/// The active check on a new connection, spoken as the server's requests
/// are (HTTP/1.1, or HTTP/2 for h2c, `protocol: h2` and servers that chose
/// h2 by ALPN): `GET path` answered 2xx or 3xx, or, for a path of
/// `/grpc.health.v1.Health/Check` (optionally `?service=NAME`), the gRPC
/// health check answered SERVING with grpc-status 0.
async fn probe(pool: &Pool, path: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (mut s, h2) = pool.connect_check().await.map_err(|e| e.to_string())?;
    let host = pool
        .host()
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    if h2 {
        return probe_h2(pool, s, host, path).await;
    }
    let req = format!(
        "GET {path} HTTP/1.1\r\nhost: {host}\r\nuser-agent: ratewarden-check\r\nconnection: close\r\n\r\n"
    );
    s.write_all(req.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    s.flush().await.map_err(|e| e.to_string())?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).await.map_err(|e| e.to_string())?;
    match &head[..] {
        [
            b'H',
            b'T',
            b'T',
            b'P',
            b'/',
            _,
            b'.',
            _,
            b' ',
            b'2' | b'3',
            _,
            _,
        ] => Ok(()),
        _ => Err(format!(
            "answered {}",
            String::from_utf8_lossy(&head[9..]).trim()
        )),
    }
}

/// The gRPC health service's Check method.
const GRPC_HEALTH: &str = "/grpc.health.v1.Health/Check";

/// [`probe`] over HTTP/2.
async fn probe_h2(
    pool: &Pool,
    s: crate::wire::stream::UpstreamIo,
    host: &str,
    path: &str,
) -> Result<(), String> {
    use crate::wire::grpc::{
        HealthCheckRequest, HealthCheckResponse, ServingStatus, framed, unframe,
    };
    use http_body_util::{BodyExt, Full};
    use prost::Message as _;
    let mut sender = crate::upstream::pool::h2_handshake::<Full<bytes::Bytes>>(s)
        .await
        .map_err(|e| e.to_string())?;
    let scheme = pool.scheme();
    let grpc = path
        .strip_prefix(GRPC_HEALTH)
        .filter(|rest| rest.is_empty() || rest.starts_with('?'))
        .map(|rest| {
            let service = rest.strip_prefix("?service=").unwrap_or("").to_owned();
            framed(&HealthCheckRequest { service })
        });
    let uri = format!(
        "{scheme}://{host}{}",
        if grpc.is_some() { GRPC_HEALTH } else { path }
    );
    let builder = http::Request::builder()
        .uri(uri)
        .version(http::Version::HTTP_2)
        .header(http::header::USER_AGENT, "ratewarden-check");
    let is_grpc = grpc.is_some();
    let req = match grpc {
        Some(body) => builder
            .method(http::Method::POST)
            .header(http::header::CONTENT_TYPE, "application/grpc")
            .header(http::header::TE, "trailers")
            .body(Full::new(bytes::Bytes::from(body))),
        None => builder.body(Full::new(bytes::Bytes::new())),
    }
    .map_err(|e| e.to_string())?;
    sender.ready().await.map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status();
    if !is_grpc {
        return if status.is_success() || status.is_redirection() {
            Ok(())
        } else {
            Err(format!("answered {status}"))
        };
    }
    if status != http::StatusCode::OK {
        return Err(format!("answered {status}"));
    }
    // Trailers-only (an error) carries grpc-status in the head.
    let head_status = resp.headers().get("grpc-status").cloned();
    // A health answer is a few bytes: read at most 1 KiB of it.
    let body = http_body_util::Limited::new(resp.into_body(), 1024)
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    let grpc_status =
        head_status.or_else(|| body.trailers().and_then(|t| t.get("grpc-status").cloned()));
    match grpc_status.as_ref().map(|v| v.as_bytes()) {
        Some(b"0") => {}
        Some(other) => {
            return Err(format!(
                "gRPC health check: grpc-status {}",
                String::from_utf8_lossy(other)
            ));
        }
        None => return Err("gRPC health check: no grpc-status".into()),
    }
    // One uncompressed message, length-prefixed: SERVING?
    let bytes = body.to_bytes();
    let Some(message) = unframe(&bytes) else {
        return Err("gRPC health check: not one uncompressed message".into());
    };
    match HealthCheckResponse::decode(message) {
        Ok(r) if r.status == ServingStatus::Serving as i32 => Ok(()),
        Ok(_) => Err("gRPC health check: not SERVING".into()),
        Err(e) => Err(format!(
            "gRPC health check: the answer does not decode: {e}"
        )),
    }
}
