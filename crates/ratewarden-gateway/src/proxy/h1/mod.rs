//! The HTTP/1.1 proxy path.
//!
//! Most traffic through a gateway is plain HTTP/1.1 with small or no
//! request bodies. For that traffic one task per client connection does
//! everything nginx does in its event loop: read a request head (parsed by
//! `httparse`, the parser hyper uses), decide, write the request to a pooled
//! upstream connection it holds for the exchange, read the response head and
//! relay the body. There is no second task per upstream connection, no
//! `HeaderMap` unless a rule reads headers, and the rate-limit headers are
//! written straight into the response head. hyper did the same work with
//! two protocol state machines and a task hand-off per request: about 2 µs
//! more CPU per proxied request (BENCHMARKS.md).
//!
//! Chunked request bodies are read whole (up to [`MAX_BODY`] of data),
//! checked, and forwarded with a length, as nginx does with request
//! buffering on: a malformed one is answered 400 and none of it reaches the
//! upstream. A head must arrive within `client_header_timeout` of its
//! first bytes, a body within `client_body_timeout` of its head, or the
//! answer is 408.
//!
//! Anything else on a connection (HTTP/1.0, HTTP/2, `Expect`, `Upgrade`,
//! larger request bodies, absolute-form targets, heads over [`MAX_HEAD`]
//! or that do not parse, the echo upstream) hands the
//! connection, with the bytes already read, to hyper for the rest of its
//! life: hyper's behaviour there is unchanged, including its errors.

use std::future::Future;
use std::io;
use std::ops::Range;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio::time::Sleep;

mod buffers;
pub(crate) mod chunked;
mod exchange;
mod reject_cache;
pub(crate) mod request;
pub(crate) mod response;
mod write;

use crate::gateway::Gateway;
use crate::observe::request_id::RequestId;
use crate::proxy::forward::{self, Edge};
use crate::wire::idle::Watched;
use crate::wire::stream::ClientIo;

use chunked::{Chunks, valid_trailers};
use exchange::within;
use request::{BodyLen, Head, Parsed, parse_request};
pub(crate) use request::{MAX_BODY, MAX_HEAD};
use write::{RateFields, write_answer};

/// One client connection's buffers, reused from request to request.
#[derive(Default)]
struct Conn {
    /// Bytes read from the client not yet answered.
    input: BytesMut,
    /// The next write (a request head and body, or a response head).
    out: Vec<u8>,
    /// Bytes read from the upstream.
    up: BytesMut,
    /// Header offsets of the request in `input`.
    fields: Vec<(Range<usize>, Range<usize>)>,
    /// Where the request's body data is in `input` (one span, or a chunked
    /// body's chunks).
    body: Vec<Range<usize>>,
    /// Header offsets of the response in `up`.
    up_fields: Vec<(Range<usize>, Range<usize>)>,
    /// The decision's header lines.
    rate: RateFields,
    /// The deadline of a slow client read, or of the upstream's answer;
    /// reset per use (a new tokio timer per request measured 4.5% of
    /// forwarding throughput; see upstream.rs). Never armed for a request
    /// whose head and body come in one read, the common case.
    timer: Option<Pin<Box<Sleep>>>,
}

/// `timer`, set to fire `after` from now (created on first use).
fn arm(timer: &mut Option<Pin<Box<Sleep>>>, after: Duration) -> &mut Pin<Box<Sleep>> {
    let deadline = tokio::time::Instant::now() + after;
    match timer {
        Some(t) => t.as_mut().reset(deadline),
        None => *timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
    }
    timer.as_mut().expect("just set")
}

/// What reading a request gave.
enum Next {
    /// A whole request head.
    Serve(Head),
    /// The client is gone, or the gateway is stopping between requests.
    Close,
    /// Not for this path: hyper takes the connection.
    Hyper,
    /// Refused at the edge: answered, then the connection closes.
    Refuse(Edge),
}

impl Conn {
    /// Reads until `input` starts with a whole request head. The head's
    /// first bytes start `client_header_timeout` (the wait before them is
    /// `client_idle_timeout`'s).
    async fn read_head<F: Future<Output = ()>>(
        &mut self,
        io: &mut Watched<ClientIo>,
        stopping: &mut Pin<&mut F>,
        gw: &Gateway,
    ) -> io::Result<Next> {
        let mut armed = false;
        loop {
            if !self.input.is_empty() {
                match parse_request(&self.input, &mut self.fields) {
                    Parsed::Complete(h) => return Ok(Next::Serve(h)),
                    Parsed::Partial if self.input.len() < MAX_HEAD => {}
                    Parsed::Refused(e) => return Ok(Next::Refuse(e)),
                    _ => return Ok(Next::Hyper),
                }
            }
            // A head ends with a line feed: bytes without one (a client
            // trickling its head) are not worth parsing again.
            loop {
                if self.input.is_empty() {
                    // Between requests: wait holding no buffers (an idle
                    // kept-alive connection costs its task and socket only).
                    self.release();
                    tokio::select! {
                        biased;
                        ready = io.readable() => ready?,
                        // Shutting down: a connection between requests closes.
                        () = stopping.as_mut() => return Ok(Next::Close),
                    }
                    self.acquire();
                } else if !armed {
                    arm(&mut self.timer, gw.live().config.client_header_timeout);
                    armed = true;
                }
                self.input.reserve(4096);
                let n = match (&mut self.timer, armed) {
                    (Some(timer), true) => {
                        match within(timer, io.read_buf(&mut self.input)).await {
                            Some(n) => n?,
                            None => return Ok(Next::Refuse(Edge::HeadTimeout)),
                        }
                    }
                    _ => io.read_buf(&mut self.input).await?,
                };
                if n == 0 {
                    return Ok(Next::Close);
                }
                let fresh = &self.input[self.input.len() - n..];
                if fresh.contains(&b'\n') || self.input.len() >= MAX_HEAD {
                    break;
                }
            }
        }
    }

    /// Reads the body of `head` into `input`, its data spans into `body`:
    /// `Ok(Ok(n))` when the request is the first `n` bytes of `input`. The
    /// body must arrive within `client_body_timeout` of the head.
    async fn read_body(
        &mut self,
        io: &mut Watched<ClientIo>,
        head: &Head,
        gw: &Gateway,
    ) -> io::Result<Result<usize, Next>> {
        self.body.clear();
        let mut armed = false;
        // `client_max_body_size` (0: none): a declared length is refused
        // before any of the body is read, a chunked one as it grows.
        let max = gw.live().config.client_max_body_size;
        let too_large = |n: usize| max != 0 && n as u64 > max;
        match head.body {
            BodyLen::Length(n) if too_large(n) => Ok(Err(Next::Refuse(Edge::TooLarge(max)))),
            BodyLen::Length(n) => {
                let whole = head.len + n;
                while self.input.len() < whole {
                    if !armed {
                        arm(&mut self.timer, gw.live().config.client_body_timeout);
                        armed = true;
                    }
                    self.input.reserve(whole - self.input.len());
                    let timer = self.timer.as_mut().expect("armed");
                    match within(timer, io.read_buf(&mut self.input)).await {
                        None => return Ok(Err(Next::Refuse(Edge::BodyTimeout))),
                        Some(Ok(0)) | Some(Err(_)) => return Ok(Err(Next::Close)),
                        Some(_) => {}
                    }
                }
                if n > 0 {
                    self.body.push(head.len..whole);
                }
                Ok(Ok(whole))
            }
            BodyLen::Chunked => {
                let mut chunks = Chunks::default();
                let mut trailer = vec![];
                let mut pos = head.len;
                loop {
                    if pos < self.input.len() {
                        let (data_from, trailer_from) = (self.body.len(), trailer.len());
                        let ended = chunks.decode(&self.input[pos..], &mut self.body, &mut trailer);
                        for r in self.body[data_from..]
                            .iter_mut()
                            .chain(&mut trailer[trailer_from..])
                        {
                            *r = r.start + pos..r.end + pos;
                        }
                        let data: usize = self.body.iter().map(ExactSizeIterator::len).sum();
                        if too_large(data) {
                            return Ok(Err(Next::Refuse(Edge::TooLarge(max))));
                        }
                        match ended {
                            Err(_) => return Ok(Err(Next::Refuse(Edge::BadBody))),
                            Ok(Some(n)) => {
                                let section: Vec<u8> = trailer
                                    .iter()
                                    .flat_map(|r| self.input[r.clone()].iter().copied())
                                    .collect();
                                if !valid_trailers(&section) {
                                    return Ok(Err(Next::Refuse(Edge::BadBody)));
                                }
                                return Ok(Ok(pos + n));
                            }
                            Ok(None) => pos = self.input.len(),
                        }
                        // Too large to hold: hyper streams it (from the head).
                        if data > MAX_BODY || pos - head.len > MAX_BODY + MAX_HEAD {
                            return Ok(Err(Next::Hyper));
                        }
                    }
                    if !armed {
                        arm(&mut self.timer, gw.live().config.client_body_timeout);
                        armed = true;
                    }
                    self.input.reserve(4096);
                    let timer = self.timer.as_mut().expect("armed");
                    match within(timer, io.read_buf(&mut self.input)).await {
                        None => return Ok(Err(Next::Refuse(Edge::BodyTimeout))),
                        Some(Ok(0)) | Some(Err(_)) => return Ok(Err(Next::Close)),
                        Some(_) => {}
                    }
                }
            }
        }
    }
}

/// Serves one client connection: HTTP/1.1 here, anything else through
/// `hyper` (given the stream with the bytes read so far). Returns when the
/// client closes, asks to, or `stop` turns true between requests.
pub async fn serve_connection<H, F, E>(
    gw: Arc<Gateway>,
    mut io: Watched<ClientIo>,
    client: forward::Client,
    stop: watch::Receiver<bool>,
    hyper: H,
) -> Result<(), E>
where
    H: FnOnce(Watched<ClientIo>) -> F,
    F: Future<Output = Result<(), E>>,
    E: From<io::Error>,
{
    match serve(&gw, &mut io, client, stop).await? {
        Some(read) => hand_over(io, read, hyper).await,
        None => {
            // A TLS client is told the connection ends (close_notify), so
            // that it can tell an end from a cut; bounded, as the client
            // may not read it. (TCP: the socket's close says it.)
            if io.get_ref().is_tls() {
                let _ = tokio::time::timeout(Duration::from_secs(1), io.shutdown()).await;
            }
            Ok(())
        }
    }
}

/// Serves requests until the connection ends (`None`) or goes to hyper
/// (`Some`, with the bytes already read). Each request goes through the
/// one flow ([`crate::proxy::flow::run`]) with this path as its wire
/// ([`exchange::H1`]): reading heads and bodies here, writing there.
async fn serve(
    gw: &Arc<Gateway>,
    io: &mut Watched<ClientIo>,
    client: forward::Client,
    mut stop: watch::Receiver<bool>,
) -> io::Result<Option<BytesMut>> {
    let mut c = Conn::default();
    let mut stopping = pin!(async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    loop {
        let head = match c.read_head(io, &mut stopping, gw).await? {
            Next::Serve(h) => h,
            Next::Close => return Ok(None),
            Next::Hyper => return Ok(Some(c.input)),
            Next::Refuse(e) => return refuse(io, &mut c.out, e, None).await.map(|()| None),
        };
        let whole = match c.read_body(io, &head, gw).await? {
            Ok(n) => n,
            Err(Next::Hyper) => return Ok(Some(c.input)),
            Err(Next::Refuse(e)) => {
                // A grpc-web request's refusal is a gRPC status.
                let grpc =
                    crate::proxy::flow::grpc_kind(field(&c.input, &c.fields, b"content-type"));
                return refuse(io, &mut c.out, e, grpc).await.map(|()| None);
            }
            Err(_) => return Ok(None),
        };
        let live = gw.live();
        // A config that may send a request to the echo upstream or to HTTP/2
        // servers has hyper serve every request (it streams both ways with
        // trailers): the connection goes there before any phase runs, so
        // that none runs twice.
        if live.router.hyper_only() {
            return Ok(Some(c.input));
        }
        let underscores = live.config.underscores_in_headers;
        let mut wire = exchange::H1::new(&mut c, io, &head, &client, underscores);
        let keep = crate::proxy::flow::run(gw, &live, &mut wire).await?;
        c.input.advance(whole);
        if !keep {
            return Ok(None);
        }
        c.trim();
    }
}

/// The value of the request's first field called `name`.
fn field<'a>(
    input: &'a [u8],
    fields: &[(Range<usize>, Range<usize>)],
    name: &[u8],
) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(n, _)| input[n.clone()].eq_ignore_ascii_case(name))
        .map(|(_, v)| &input[v.clone()])
}

/// `answer` with the request's id.
fn with_id(
    mut answer: http::Response<crate::gateway::Body>,
    rid: &RequestId,
) -> http::Response<crate::gateway::Body> {
    if let Ok(v) = http::HeaderValue::from_bytes(rid.as_bytes()) {
        answer
            .headers_mut()
            .insert(crate::observe::request_id::HEADER, v);
    }
    answer
}

/// Answers a request the edge refused; the connection then closes (where
/// the request ends is unknown, or the client cannot be trusted to frame
/// the next one).
async fn refuse(
    io: &mut Watched<ClientIo>,
    out: &mut Vec<u8>,
    e: Edge,
    grpc: Option<crate::proxy::flow::Grpc>,
) -> io::Result<()> {
    tracing::debug!(status = e.status().as_u16(), reason = %e.detail(), "refused at the edge");
    write_answer(io, out, crate::proxy::flow::edge_answer(e, grpc), true).await
}

/// Gives the connection to hyper, the bytes already read to be read again.
/// (Boxed: only the connections that go there need hyper's 1.8 KB state.)
async fn hand_over<H, F>(mut io: Watched<ClientIo>, read: BytesMut, hyper: H) -> F::Output
where
    H: FnOnce(Watched<ClientIo>) -> F,
    F: Future,
{
    io.unread(read.freeze());
    Box::pin(hyper(io)).await
}
