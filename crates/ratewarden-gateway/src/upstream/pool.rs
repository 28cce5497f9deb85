//! Kept-alive HTTP/1.1 connections to the upstream.
//!
//! A connection is handed to one request at a time and comes back to the
//! pool when that request's response body has been read to its end, the
//! moment it can carry the next request. A response dropped half-read takes
//! its connection with it (hyper closes it): the next request never reads
//! the leftovers of another. hyper-util's pooled client did the same with a
//! pool-wide key lookup and a spawned task per request to watch for the
//! connection's return; here the body itself returns it.

use std::future::{Future, poll_fn};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderValue, Request, Response};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::time::{Instant, Sleep};

use crate::config::Protocol;
use crate::tls::ClientTls;
use crate::wire::stream::UpstreamIo;

/// Idle connections kept per upstream (more are opened under load, and
/// closed when they come back to a full pool).
const MAX_IDLE: usize = 512;

/// Why a request could not be sent.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Could not connect.
    #[error("connect to {addr}: {source}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// The TLS handshake failed (the upstream's certificate is not
    /// trusted, names another host, or the upstream refused ours).
    #[error("TLS handshake with {addr}: {source}")]
    Tls {
        /// `host:port`.
        addr: String,
        /// The cause (rustls's error inside).
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error(transparent)]
    Http(#[from] hyper::Error),
    /// No response head within the timeout.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Why [`Pool::send`] failed, and the request when it was not sent (it
/// can go to another server).
#[derive(Debug)]
pub struct SendFailed {
    /// What went wrong.
    pub error: UpstreamError,
    /// The request, when nothing of it was sent.
    pub unsent: Option<Request<ClientBody>>,
}

impl From<UpstreamError> for SendFailed {
    fn from(error: UpstreamError) -> Self {
        Self {
            error,
            unsent: None,
        }
    }
}

/// A kept-alive connection and its timer. The timer goes with the
/// connection from request to request and is pushed forward each time:
/// while the previous deadline has not passed, that is an atomic update in
/// tokio's timer, not a new registration (a fresh `tokio::time::timeout`
/// per request measured 4.5% of forwarding throughput).
struct Link {
    sender: SendRequest<ClientBody>,
    timer: Pin<Box<Sleep>>,
}

/// The connections to one upstream (`host:port`).
pub struct Pool {
    addr: String,
    host: Option<HeaderValue>,
    /// For an https upstream: the client and the connector built on it.
    tls: Option<(ClientTls, tokio_rustls::TlsConnector)>,
    idle: Mutex<Vec<Link>>,
    /// Idle connections of the HTTP/1.1 path ([`crate::proxy`]), which
    /// speaks to the upstream itself.
    streams: Mutex<Vec<UpstreamIo>>,
    /// An h2c server (`h2c://`), or an https one that chose h2 by ALPN:
    /// its one HTTP/2 connection, shared by every request (multiplexed),
    /// made on first use and again when it closes.
    h2: tokio::sync::Mutex<Option<hyper::client::conn::http2::SendRequest<ClientBody>>>,
    /// The server's `protocol:` (`H2` for `h2c://` too): `H2` is HTTP/2
    /// only, with prior knowledge on http://, by ALPN alone on https://.
    protocol: Protocol,
    /// For an https server on hyper's path: a connector offering h2 and
    /// http/1.1 by ALPN, and what the server chose ([`UNKNOWN`], [`H1`],
    /// [`H2`]).
    alpn: Option<(tokio_rustls::TlsConnector, std::sync::atomic::AtomicU8)>,
}

/// An https server's protocol, not asked yet.
const UNKNOWN: u8 = 0;
/// It chose http/1.1 by ALPN.
const H1: u8 = 1;
/// It chose h2 by ALPN.
const H2: u8 = 2;

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").finish_non_exhaustive()
    }
}

impl Pool {
    /// A pool for `addr` (`host:port`), empty until the first request;
    /// `host` is the `Host` header requests to it carry; with `tls`, its
    /// connections are TLS.
    pub fn new(
        addr: String,
        host: Option<HeaderValue>,
        tls: Option<ClientTls>,
        protocol: Protocol,
    ) -> Arc<Self> {
        // https: h2 offered by ALPN beside http/1.1, or alone with
        // `protocol: h2`; not at all with `protocol: http1`.
        let offer: &[&[u8]] = match protocol {
            Protocol::Auto => &[b"h2", b"http/1.1"],
            Protocol::H2 => &[b"h2"],
            Protocol::Http1 => &[],
        };
        let alpn = tls.as_ref().filter(|_| !offer.is_empty()).map(|t| {
            let mut config = (*t.config).clone();
            config.alpn_protocols = offer.iter().map(|p| p.to_vec()).collect();
            (
                tokio_rustls::TlsConnector::from(Arc::new(config)),
                std::sync::atomic::AtomicU8::new(UNKNOWN),
            )
        });
        let tls = tls.map(|t| {
            let connector = tokio_rustls::TlsConnector::from(t.config.clone());
            (t, connector)
        });
        Arc::new(Self {
            addr,
            host,
            tls,
            idle: Mutex::new(Vec::new()),
            streams: Mutex::new(Vec::new()),
            h2: tokio::sync::Mutex::new(None),
            protocol,
            alpn,
        })
    }

    /// Whether the server is spoken to in HTTP/2 only (h2c, or `protocol:
    /// h2`): its requests must go by hyper's path.
    pub fn is_h2(&self) -> bool {
        self.protocol == Protocol::H2
    }

    /// The scheme of its requests' URIs: `https` for a TLS server.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() { "https" } else { "http" }
    }

    /// The server's `protocol:`.
    pub fn protocol(&self) -> Protocol {
        self.protocol
    }

    /// A new connection for hyper's path, offering h2 by ALPN to an https
    /// server that may be offered it; whether the server chose it (a
    /// cleartext server, or one not offered h2: false).
    async fn connect_alpn(&self) -> Result<(UpstreamIo, bool), UpstreamError> {
        let Some((connector, chosen)) = &self.alpn else {
            return Ok((self.connect_stream().await?, false));
        };
        let stream = self.connect_with(Some(connector)).await?;
        let h2 =
            matches!(&stream, UpstreamIo::Tls(s) if s.get_ref().1.alpn_protocol() == Some(b"h2"));
        chosen.store(if h2 { H2 } else { H1 }, Ordering::Relaxed);
        Ok((stream, h2))
    }

    /// [`Self::send`] to an h2c server: on its shared connection (made
    /// first when there is none or it closed), the answer's head within
    /// `timeout`; the bodies stream both ways, trailers included.
    async fn send_h2(
        self: &Arc<Self>,
        req: Request<ClientBody>,
        timeout: Duration,
    ) -> Result<Response<PooledBody>, SendFailed> {
        let deadline = Instant::now() + timeout;
        let mut req = req;
        // HTTP/2: the URI in absolute form (its `:scheme` and `:authority`:
        // the host `Host` would have carried), `TE: trailers` (gRPC asks
        // for them; the one TE HTTP/2 takes).
        let scheme = self.scheme();
        let authority = req
            .headers()
            .get(http::header::HOST)
            .and_then(|h| h.to_str().ok())
            .map_or_else(|| self.addr.clone(), str::to_owned);
        let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
        // (A `Host` that makes no authority: the server's address.)
        let uri = format!("{scheme}://{authority}{path}")
            .parse()
            .or_else(|_| format!("{scheme}://{}{path}", self.addr).parse());
        if let Ok(uri) = uri {
            *req.uri_mut() = uri;
        }
        *req.version_mut() = http::Version::HTTP_2;
        req.headers_mut().remove(http::header::HOST);
        req.headers_mut()
            .insert(http::header::TE, HeaderValue::from_static("trailers"));
        let slot = &self.h2;
        let mut sender = {
            let mut shared = slot.lock().await;
            match shared.as_ref() {
                Some(s) if !s.is_closed() => s.clone(),
                _ => {
                    let made = tokio::time::timeout_at(deadline, async {
                        h2_handshake(self.connect_alpn().await?.0).await
                    })
                    .await;
                    match made {
                        Ok(Ok(s)) => {
                            *shared = Some(s.clone());
                            s
                        }
                        Ok(Err(error)) => {
                            return Err(SendFailed {
                                error,
                                unsent: Some(req),
                            });
                        }
                        Err(_) => return Err(UpstreamError::Timeout(timeout).into()),
                    }
                }
            }
        };
        if let Err(e) = sender.ready().await {
            *slot.lock().await = None;
            return Err(SendFailed {
                error: e.into(),
                unsent: Some(req),
            });
        }
        match tokio::time::timeout_at(deadline, sender.send_request(req)).await {
            Ok(Ok(resp)) => Ok(resp.map(|body| PooledBody { body, conn: None })),
            Ok(Err(e)) => Err(SendFailed {
                error: e.into(),
                unsent: None,
            }),
            Err(_) => Err(UpstreamError::Timeout(timeout).into()),
        }
    }

    /// A new connection for an active check, and whether it speaks HTTP/2
    /// (h2c, `protocol: h2`, or h2 chosen by ALPN): the check goes the way
    /// requests go.
    pub(crate) async fn connect_check(&self) -> Result<(UpstreamIo, bool), UpstreamError> {
        let (stream, chose_h2) = self.connect_alpn().await?;
        Ok((stream, chose_h2 || self.is_h2()))
    }

    /// The TLS client, for an https upstream.
    pub fn tls(&self) -> Option<&ClientTls> {
        self.tls.as_ref().map(|(t, _)| t)
    }

    /// An idle connection of the HTTP/1.1 path, if any. Connections with
    /// something to read while idle are dropped: an idle connection has
    /// nothing to say but the upstream's close (or garbage); see
    /// [`UpstreamIo::is_reusable`]. A close still in flight is caught by
    /// the caller's retry.
    pub fn take_stream(&self) -> Option<UpstreamIo> {
        loop {
            let mut stream = self.streams.lock().pop()?;
            if stream.is_reusable() {
                return Some(stream);
            }
        }
    }

    /// Gives back a connection whose last response was read to its end.
    pub fn put_stream(&self, stream: UpstreamIo) {
        let mut idle = self.streams.lock();
        if idle.len() < MAX_IDLE {
            idle.push(stream);
        }
    }

    /// A new connection to the upstream, its TLS handshake done for an
    /// https upstream (resuming an earlier session when the upstream
    /// allows: rustls keeps tickets per server name).
    pub async fn connect_stream(&self) -> Result<UpstreamIo, UpstreamError> {
        self.connect_with(self.tls.as_ref().map(|(_, c)| c)).await
    }

    /// A new connection, its TLS handshake done by `connector` when there
    /// is one (the pool's, or the ALPN one of [`Self::connect_alpn`]).
    async fn connect_with(
        &self,
        connector: Option<&tokio_rustls::TlsConnector>,
    ) -> Result<UpstreamIo, UpstreamError> {
        let stream =
            TcpStream::connect(&self.addr)
                .await
                .map_err(|source| UpstreamError::Connect {
                    addr: self.addr.clone(),
                    source,
                })?;
        // Requests are small writes on kept-alive connections: never hold one
        // back waiting for an ACK (nginx sets tcp_nodelay too).
        let _ = stream.set_nodelay(true);
        let (Some((tls, _)), Some(connector)) = (&self.tls, connector) else {
            return Ok(UpstreamIo::Plain(stream));
        };
        match connector.connect(tls.server_name.clone(), stream).await {
            Ok(s) => Ok(UpstreamIo::Tls(Box::new(s))),
            Err(source) => Err(UpstreamError::Tls {
                addr: self.addr.clone(),
                source,
            }),
        }
    }

    /// The upstream's `host:port`.
    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// The `Host` header for requests to this upstream (built once).
    pub fn host(&self) -> Option<&HeaderValue> {
        self.host.as_ref()
    }

    /// Sends `req` (origin-form URI, Host set) on an idle connection or a
    /// new one, and waits at most `timeout` for the response head
    /// (connecting included). A kept-alive connection the upstream closed
    /// meanwhile is skipped; if the upstream closes it just as the request
    /// goes out and hyper hands the request back unsent, it is sent once
    /// more on a new connection, within the same deadline.
    pub async fn send(
        self: &Arc<Self>,
        req: Request<ClientBody>,
        timeout: Duration,
    ) -> Result<Response<PooledBody>, SendFailed> {
        if self.is_h2() {
            return self.send_h2(req, timeout).await;
        }
        // An https server: asked once by ALPN whether it speaks h2.
        if let Some((_, chosen)) = &self.alpn {
            match chosen.load(Ordering::Relaxed) {
                H2 => return self.send_h2(req, timeout).await,
                UNKNOWN => {
                    let deadline = Instant::now() + timeout;
                    match tokio::time::timeout_at(deadline, self.connect_alpn()).await {
                        // The connection that asked is the first one used.
                        Ok(Ok((stream, true))) => {
                            if let Ok(sender) = h2_handshake(stream).await {
                                *self.h2.lock().await = Some(sender);
                            }
                            return self.send_h2(req, timeout).await;
                        }
                        Ok(Ok((stream, false))) => {
                            if let Ok(link) = self.link_on(stream, deadline).await {
                                self.checkin(link);
                            }
                        }
                        Ok(Err(error)) => {
                            return Err(SendFailed {
                                error,
                                unsent: Some(req),
                            });
                        }
                        Err(_) => return Err(UpstreamError::Timeout(timeout).into()),
                    }
                }
                _ => {}
            }
        }
        let deadline = Instant::now() + timeout;
        let mut req = req;
        for fresh in [false, true] {
            let checked_out = if fresh {
                None
            } else {
                self.checkout(deadline).await
            };
            let mut link = match checked_out {
                Some(l) => l,
                // Boxed: connecting is rare and its future large.
                None => match tokio::time::timeout_at(deadline, Box::pin(self.connect(deadline)))
                    .await
                {
                    Ok(Ok(l)) => l,
                    // Nothing was sent: the request comes back.
                    Ok(Err(error)) => {
                        return Err(SendFailed {
                            error,
                            unsent: Some(req),
                        });
                    }
                    Err(_) => return Err(UpstreamError::Timeout(timeout).into()),
                },
            };
            let mut answer = std::pin::pin!(link.sender.try_send_request(req));
            let answered = poll_fn(|cx| match answer.as_mut().poll(cx) {
                Poll::Ready(r) => Poll::Ready(Some(r)),
                Poll::Pending => fired(&mut link.timer, cx),
            })
            .await;
            match answered {
                None => return Err(UpstreamError::Timeout(timeout).into()),
                Some(Ok(resp)) => {
                    let (parts, body) = resp.into_parts();
                    return Ok(Response::from_parts(
                        parts,
                        PooledBody::new(body, link, self.clone()),
                    ));
                }
                Some(Err(mut e)) => match e.take_message() {
                    Some(unsent) if !fresh => req = unsent,
                    unsent => {
                        return Err(SendFailed {
                            error: e.into_error().into(),
                            unsent,
                        });
                    }
                },
            }
        }
        unreachable!("the second attempt always returns")
    }

    /// An idle connection ready for a request, its timer set to `deadline`,
    /// if any.
    async fn checkout(&self, deadline: Instant) -> Option<Link> {
        loop {
            let mut link = self.idle.lock().pop()?;
            if link.sender.is_closed() {
                continue;
            }
            link.timer.as_mut().reset(deadline);
            // Returned at the end of its last body: ready now or in a moment.
            let ready = poll_fn(|cx| match link.sender.poll_ready(cx) {
                Poll::Ready(r) => Poll::Ready(Some(r.is_ok())),
                Poll::Pending => fired(&mut link.timer, cx),
            })
            .await;
            match ready {
                Some(true) => return Some(link),
                // Closed meanwhile: the next one.
                Some(false) => continue,
                // Past the deadline: `send` times out connecting.
                None => return None,
            }
        }
    }

    async fn connect(&self, deadline: Instant) -> Result<Link, UpstreamError> {
        let stream = self.connect_stream().await?;
        self.link_on(stream, deadline).await
    }

    /// An HTTP/1.1 connection on `stream`.
    async fn link_on(&self, stream: UpstreamIo, deadline: Instant) -> Result<Link, UpstreamError> {
        // Flat writes, as on the server side (see `server::serve`).
        let (sender, conn) = http1::Builder::new()
            .writev(false)
            .handshake(TokioIo::new(stream))
            .await?;
        crate::wire::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "upstream connection ended with an error");
            }
        });
        Ok(Link {
            sender,
            timer: Box::pin(tokio::time::sleep_until(deadline)),
        })
    }

    fn checkin(&self, link: Link) {
        if link.sender.is_closed() {
            return;
        }
        let mut idle = self.idle.lock();
        if idle.len() < MAX_IDLE {
            idle.push(link);
        }
    }
}

/// An HTTP/2 connection on `stream`, its task spawned.
pub(crate) async fn h2_handshake<B>(
    stream: UpstreamIo,
) -> Result<hyper::client::conn::http2::SendRequest<B>, UpstreamError>
where
    B: Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let (sender, conn) =
        hyper::client::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
            .handshake(TokioIo::new(stream))
            .await?;
    crate::wire::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "HTTP/2 upstream connection ended with an error");
        }
    });
    Ok(sender)
}

/// `Ready(None)` once `timer` has fired, registering `cx` until then.
fn fired<T>(timer: &mut Pin<Box<Sleep>>, cx: &mut Context<'_>) -> Poll<Option<T>> {
    timer.as_mut().poll(cx).map(|()| None)
}

/// An upstream response body that gives its connection back to the pool
/// once read to the end.
pub struct PooledBody {
    body: Incoming,
    conn: Option<(Link, Arc<Pool>)>,
}

impl std::fmt::Debug for PooledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PooledBody").finish_non_exhaustive()
    }
}

impl PooledBody {
    fn new(body: Incoming, conn: Link, pool: Arc<Pool>) -> Self {
        let mut b = Self {
            body,
            conn: Some((conn, pool)),
        };
        // An empty body (HEAD, 204, 304) may never be polled at all.
        if b.body.is_end_stream() {
            b.release();
        }
        b
    }

    fn release(&mut self) {
        if let Some((conn, pool)) = self.conn.take() {
            pool.checkin(conn);
        }
    }
}

impl Body for PooledBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let polled = Pin::new(&mut this.body).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => this.release(),
            Poll::Ready(Some(Ok(_))) if this.body.is_end_stream() => this.release(),
            // A broken body: the connection goes with it.
            Poll::Ready(Some(Err(_))) => this.conn = None,
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The client's request body on its way upstream. hyper streams it, so a
/// body that breaks (malformed chunks, cut short) or stalls for longer
/// than `client_body_timeout` between two frames (nginx's per-read
/// `client_body_timeout`) fails the upstream exchange; `fault` then says
/// it was the client's doing, which is answered 400 or 408, not 502.
#[derive(Debug)]
pub struct ClientBody {
    inner: Source,
    timeout: Duration,
    timer: Option<Pin<Box<Sleep>>>,
    fault: Arc<BodyFaults>,
    /// `client_max_body_size` (0: none), and the data bytes so far.
    max: u64,
    seen: u64,
}

/// Where a [`ClientBody`]'s bytes come from.
#[derive(Debug)]
enum Source {
    /// The client, as they arrive.
    Streamed(Incoming),
    /// Read whole before the request was decided (a rule reads the body):
    /// its data, then its trailers.
    Buffered {
        data: Option<Bytes>,
        trailers: Option<http::HeaderMap>,
    },
}

/// What went wrong with a client's body on its way upstream: the client's
/// doing, answered as such (400, 408, 413), not as the upstream's (502).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyFault {
    /// Malformed, or cut short.
    Broke,
    /// Stalled longer than `client_body_timeout`.
    Stalled,
    /// Grew past `client_max_body_size`.
    TooLarge,
}

/// A [`ClientBody`]'s fault, shared with the exchange that reads the body
/// (the body is moved into hyper's client): set once, read after.
#[derive(Debug, Default)]
pub(crate) struct BodyFaults(AtomicU8);

impl BodyFaults {
    fn set(&self, f: BodyFault) {
        let v = match f {
            BodyFault::Broke => 1,
            BodyFault::Stalled => 2,
            BodyFault::TooLarge => 3,
        };
        self.0.store(v, Ordering::Relaxed);
    }

    /// The fault, if the body had one.
    pub(crate) fn get(&self) -> Option<BodyFault> {
        match self.0.load(Ordering::Relaxed) {
            1 => Some(BodyFault::Broke),
            2 => Some(BodyFault::Stalled),
            3 => Some(BodyFault::TooLarge),
            _ => None,
        }
    }
}

impl ClientBody {
    pub(crate) fn new(inner: Incoming, timeout: Duration, max: u64) -> (Self, Arc<BodyFaults>) {
        let fault = Arc::new(BodyFaults::default());
        let body = Self {
            inner: Source::Streamed(inner),
            timeout,
            timer: None,
            fault: fault.clone(),
            max,
            seen: 0,
        };
        (body, fault)
    }

    /// A body read whole before: `data`, then `trailers`.
    pub(crate) fn buffered(
        data: Bytes,
        trailers: Option<http::HeaderMap>,
    ) -> (Self, Arc<BodyFaults>) {
        let fault = Arc::new(BodyFaults::default());
        let body = Self {
            inner: Source::Buffered {
                data: Some(data).filter(|d| !d.is_empty()),
                trailers,
            },
            timeout: Duration::ZERO,
            timer: None,
            fault: fault.clone(),
            max: 0,
            seen: 0,
        };
        (body, fault)
    }
}

impl http_body::Body for ClientBody {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = &mut *self;
        let inner = match &mut this.inner {
            Source::Streamed(inner) => inner,
            Source::Buffered { data, trailers } => {
                return Poll::Ready(match (data.take(), trailers.take()) {
                    (Some(d), t) => {
                        *trailers = t;
                        Some(Ok(Frame::data(d)))
                    }
                    (None, Some(t)) => Some(Ok(Frame::trailers(t))),
                    (None, None) => None,
                });
            }
        };
        match Pin::new(inner).poll_frame(cx) {
            Poll::Ready(Some(Err(e))) => {
                this.fault.set(BodyFault::Broke);
                Poll::Ready(Some(Err(e.into())))
            }
            Poll::Ready(frame) => {
                this.timer = None;
                if let Some(Ok(data)) = frame.as_ref().map(|f| f.as_ref().map(Frame::data_ref)) {
                    this.seen += data.map_or(0, |d| d.len() as u64);
                    if this.max != 0 && this.seen > this.max {
                        // Streamed past `client_max_body_size`: the
                        // exchange fails, and the client is told 413.
                        this.fault.set(BodyFault::TooLarge);
                        return Poll::Ready(Some(Err("the request body is too large".into())));
                    }
                }
                Poll::Ready(frame.map(|f| f.map_err(Into::into)))
            }
            Poll::Pending => {
                let timeout = this.timeout;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => {
                        this.fault.set(BodyFault::Stalled);
                        Poll::Ready(Some(Err("the request body stalled".into())))
                    }
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Source::Streamed(inner) => inner.is_end_stream(),
            Source::Buffered { data, trailers } => data.is_none() && trailers.is_none(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Source::Streamed(inner) => inner.size_hint(),
            Source::Buffered { data, .. } => {
                SizeHint::with_exact(data.as_ref().map_or(0, |d| d.len() as u64))
            }
        }
    }
}
