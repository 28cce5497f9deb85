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
//! Anything else on a connection (HTTP/1.0, HTTP/2, `Expect`, `Upgrade`,
//! chunked or large request bodies, absolute-form targets, heads over
//! [`MAX_HEAD`] or that do not parse, the echo or an https upstream) hands
//! the connection, with the bytes already read, to hyper for the rest of
//! its life: hyper's behaviour there is unchanged, including its errors.

use std::future::{Future, poll_fn};
use std::io;
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::ops::Range;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::{Buf, BytesMut};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode};
use http_body_util::BodyExt;
use ratewarden::FieldRef;
use ratewarden::decision::whole_secs;
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Sleep;

use crate::config::Upstream;
use crate::gateway::{Admitted, Body, Gateway, Live, Refusal, problem_response};
use crate::idle::Watched;
use crate::upstream::Pool;

/// Longest request head this path reads; longer ones go to hyper (which
/// answers 431 past its own limit).
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in a request or response head this path parses
/// (hyper's limit too).
const MAX_HEADERS: usize = 100;
/// Largest request body this path buffers before forwarding (nginx buffers
/// request bodies too); larger and chunked ones are streamed by hyper.
pub const MAX_BODY: usize = 64 * 1024;
/// Longest upstream response head accepted (beyond: 502).
const MAX_UPSTREAM_HEAD: usize = 64 * 1024;
/// Bytes read from the upstream at a time while relaying a body.
const RELAY: usize = 64 * 1024;
thread_local! {
    /// Client buffers of connections waiting between requests, for the next
    /// request on any connection of this thread: a pool, because buffers
    /// freed and allocated per request cost 1.8% CPU per forwarded request.
    static SPARE: std::cell::RefCell<Vec<(BytesMut, Vec<u8>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// At most this many spare buffer pairs (8 KiB each) per thread.
const SPARE_MAX: usize = 64;

/// Buffers grown past this by a large request or answer are freed, not
/// kept: an answer buffer after its exchange, a read buffer when its
/// connection goes idle (not kept as a spare).
const KEEP_BUFFER: usize = 16 * 1024;

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Whether `name` (any case) is a hop-by-hop header.
pub(crate) fn is_hop_by_hop(name: &[u8]) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

/// A parsed request head: where its parts are in the connection's buffer.
struct Head {
    /// Bytes of the head, blank line included.
    len: usize,
    method: Method,
    target: Range<usize>,
    /// `Content-Length` (0 when absent).
    body: usize,
    /// The client asked to close after this exchange.
    close: bool,
}

enum Parsed {
    Complete(Head),
    Partial,
    /// Valid or not, not for this path: hyper takes the connection.
    Elsewhere,
}

/// Offsets of `part` inside `buf` (`part` is a slice of `buf`).
fn span(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// Parses the request head at the start of `buf`, recording its header
/// fields as (name, value) offsets in `fields`.
fn parse_request(buf: &[u8], fields: &mut Vec<(Range<usize>, Range<usize>)>) -> Parsed {
    // Left uninitialised: parsing writes the fields it returns (zeroing 100
    // of them per parse would cost more than the parse of a small head).
    let mut raw = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Elsewhere,
    };
    let (Some(1), Some(method), Some(target)) = (req.version, req.method, req.path) else {
        return Parsed::Elsewhere;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Elsewhere;
    };
    // Origin form only, in the characters `http::Uri` accepts; no fragment.
    let plain = |b: &u8| (0x21..=0x7e).contains(b) && !b"#\"<>\\^`{|}".contains(b);
    if !target.starts_with('/') || !target.as_bytes().iter().all(plain) {
        return Parsed::Elsewhere;
    }
    fields.clear();
    let mut body = None;
    let mut close = false;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            match (body, decimal(h.value)) {
                (None, Some(n)) => body = Some(n),
                _ => return Parsed::Elsewhere,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"expect")
            || name.eq_ignore_ascii_case(b"upgrade")
        {
            return Parsed::Elsewhere;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if !token.is_empty() && !token.eq_ignore_ascii_case(b"keep-alive") {
                    // Names more hop-by-hop headers: rare; hyper's path drops them.
                    return Parsed::Elsewhere;
                }
            }
        }
        fields.push((span(buf, name), span(buf, h.value)));
    }
    let body = body.unwrap_or(0);
    if body > MAX_BODY as u64 {
        return Parsed::Elsewhere;
    }
    Parsed::Complete(Head {
        len,
        method,
        target: span(buf, target.as_bytes()),
        body: body as usize,
        close,
    })
}

/// A `Content-Length` value: decimal digits only.
fn decimal(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

/// How an upstream response's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// No body (HEAD, 1xx, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked: relayed as it comes, its end found by [`Chunks`].
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// A parsed upstream response head.
struct UpHead {
    len: usize,
    status: u16,
    reason: Range<usize>,
    framing: Framing,
    /// The connection can carry another request after this body.
    reusable: bool,
    /// Names the upstream's `Connection` header lists (not forwarded).
    listed: Vec<Range<usize>>,
    /// The upstream sent a `Date`.
    dated: bool,
}

/// Parses a response head at the start of `buf`: `Ok(None)` when more bytes
/// are needed, `Err` when it is not a valid HTTP/1.x head.
fn parse_response(
    buf: &[u8],
    head_request: bool,
    fields: &mut Vec<(Range<usize>, Range<usize>)>,
) -> Result<Option<UpHead>, ()> {
    let mut raw = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, buf, &mut raw);
    let len = match parsed {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(()),
    };
    let (Some(version), Some(status)) = (resp.version, resp.code) else {
        return Err(());
    };
    let reason = span(buf, resp.reason.unwrap_or("").as_bytes());
    fields.clear();
    let mut length = None;
    let mut chunked = None;
    let mut close = version == 0;
    let mut listed = vec![];
    let mut dated = false;
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            match (length, decimal(h.value)) {
                (None, Some(n)) => length = Some(n),
                (Some(a), Some(b)) if a == b => {}
                _ => return Err(()),
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // The last coding decides; anything but chunked runs to close.
            let last = h.value.rsplit(|b| *b == b',').next().unwrap_or(b"");
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    close &= version != 0;
                } else if !token.is_empty() {
                    listed.push(span(buf, token));
                }
            }
        } else if name.eq_ignore_ascii_case(b"date") {
            dated = true;
        }
        fields.push((span(buf, name), span(buf, h.value)));
    }
    let framing = if head_request || status < 200 || status == 204 || status == 304 {
        Framing::Empty
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::Close,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        }
    };
    Ok(Some(UpHead {
        len,
        status,
        reason,
        reusable: !close && framing != Framing::Close,
        framing,
        listed,
        dated,
    }))
}

/// Finds where a chunked body ends while it is relayed byte for byte.
#[derive(Debug, Default)]
struct Chunks {
    state: ChunkState,
    size: u64,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum ChunkState {
    #[default]
    Size,
    Extension,
    SizeLf,
    Data,
    DataCr,
    DataLf,
    TrailerLine,
    TrailerStart,
    EndLf,
    Done,
}

impl Chunks {
    /// Reads `bytes`: `Ok(Some(n))` when the body ends after `n` of them,
    /// `Ok(None)` when all of them belong to it, `Err` on bad framing.
    fn feed(&mut self, bytes: &[u8]) -> Result<Option<usize>, ()> {
        use ChunkState::*;
        let mut i = 0;
        while i < bytes.len() {
            let b = bytes[i];
            self.state = match self.state {
                Size => match b {
                    b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                        let digit = (b as char).to_digit(16).expect("hex digit");
                        self.size = self
                            .size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(u64::from(digit)))
                            .ok_or(())?;
                        Size
                    }
                    b';' | b' ' | b'\t' => Extension,
                    b'\r' => SizeLf,
                    _ => return Err(()),
                },
                Extension => match b {
                    b'\r' => SizeLf,
                    b'\n' => return Err(()),
                    _ => Extension,
                },
                SizeLf if b == b'\n' => {
                    if self.size == 0 {
                        TrailerStart
                    } else {
                        Data
                    }
                }
                Data => {
                    let take = (bytes.len() - i).min(self.size.try_into().unwrap_or(usize::MAX));
                    self.size -= take as u64;
                    i += take;
                    if self.size == 0 {
                        self.state = DataCr;
                    }
                    continue;
                }
                DataCr if b == b'\r' => DataLf,
                DataLf if b == b'\n' => Size,
                TrailerStart if b == b'\r' => EndLf,
                TrailerStart | TrailerLine => {
                    if b == b'\n' {
                        TrailerStart
                    } else {
                        TrailerLine
                    }
                }
                EndLf if b == b'\n' => {
                    self.state = Done;
                    return Ok(Some(i + 1));
                }
                _ => return Err(()),
            };
            i += 1;
        }
        Ok(None)
    }
}

/// The text of `Date:` for now, formatted once per second per thread.
fn http_date() -> [u8; 29] {
    use std::cell::Cell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: Cell<(u64, [u8; 29])> = const { Cell::new((0, [0; 29])) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let (at, text) = c.get();
        if at == secs {
            return text;
        }
        let mut text = [0; 29];
        let formatted = httpdate::fmt_http_date(now);
        text.copy_from_slice(&formatted.as_bytes()[..29]);
        c.set((secs, text));
        text
    })
}

/// Appends `name: value\r\n`.
fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A decision's rate-limit header fields as header lines, and their names
/// (an upstream field of the same name gives way to ours). Kept per
/// connection: rendering allocates nothing once the buffers have grown.
#[derive(Default)]
struct RateFields {
    lines: Vec<u8>,
    names: Vec<&'static str>,
    scratch: String,
    /// A rejection's body.
    body: String,
}

impl RateFields {
    fn render(&mut self, d: Option<&ratewarden::Decision>, style: ratewarden::HeaderStyle) {
        self.lines.clear();
        self.names.clear();
        let Some(d) = d else { return };
        let (lines, names) = (&mut self.lines, &mut self.names);
        let mut digits = itoa::Buffer::new();
        d.visit_header_fields(style, &mut self.scratch, |name, value| {
            let (text, valid) = match value {
                FieldRef::Number(n) => (digits.format(n), true),
                // The test `HeaderValue` applies: visible ASCII, spaces, tabs.
                FieldRef::Text(t) => (
                    t,
                    t.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)),
                ),
            };
            if valid {
                push_field(lines, name.as_bytes(), text.as_bytes());
                names.push(name);
            }
        });
    }

    /// Whether one of the fields is named `name`.
    fn sets(&self, name: &[u8]) -> bool {
        self.names
            .iter()
            .any(|n| n.as_bytes().eq_ignore_ascii_case(name))
    }
}

/// Runs `fut` until `timer` fires (`None`).
async fn within<F: Future>(timer: &mut Pin<Box<Sleep>>, fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending => timer.as_mut().poll(cx).map(|()| None),
    })
    .await
}

/// Why an upstream exchange produced no response head.
enum Failed {
    /// No head within `upstream_timeout`: 504.
    Timeout,
    /// Connect or exchange error: 502.
    Broken(String),
}

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
    /// Header offsets of the response in `up`.
    up_fields: Vec<(Range<usize>, Range<usize>)>,
    /// The decision's header lines.
    rate: RateFields,
    /// The upstream deadline, reset per request (a new tokio timer per
    /// request measured 4.5% of forwarding throughput; see upstream.rs).
    timer: Option<Pin<Box<Sleep>>>,
}

/// Serves one client connection: HTTP/1.1 here, anything else through
/// `hyper` (given the stream with the bytes read so far). Returns when the
/// client closes, asks to, or `stop` turns true between requests.
pub async fn serve_connection<H, F, E>(
    gw: Arc<Gateway>,
    mut io: Watched<TcpStream>,
    peer: SocketAddr,
    mut stop: watch::Receiver<bool>,
    hyper: H,
) -> Result<(), E>
where
    H: FnOnce(Watched<TcpStream>) -> F,
    F: Future<Output = Result<(), E>>,
    E: From<io::Error>,
{
    let mut c = Conn::default();
    let mut stopping = pin!(async move {
        let _ = stop.wait_for(|s| *s).await;
    });
    loop {
        let head = loop {
            if !c.input.is_empty() {
                match parse_request(&c.input, &mut c.fields) {
                    Parsed::Complete(h) => break h,
                    Parsed::Partial if c.input.len() < MAX_HEAD => {}
                    _ => return hand_over(io, c.input, hyper).await,
                }
            }
            // A head ends with a line feed: bytes without one (a client
            // trickling its head) are not worth parsing again.
            loop {
                if c.input.is_empty() {
                    // Between requests: wait holding no buffers (an idle
                    // kept-alive connection costs its task and socket only).
                    c.release();
                    tokio::select! {
                        biased;
                        ready = io.readable() => ready?,
                        // Shutting down: a connection between requests closes.
                        () = &mut stopping => return Ok(()),
                    }
                    c.acquire();
                }
                c.input.reserve(4096);
                let n = io.read_buf(&mut c.input).await?;
                if n == 0 {
                    return Ok(());
                }
                if c.input[c.input.len() - n..].contains(&b'\n') || c.input.len() >= MAX_HEAD {
                    break;
                }
            }
        };
        let whole = head.len + head.body;
        while c.input.len() < whole {
            c.input.reserve(whole - c.input.len());
            if io.read_buf(&mut c.input).await? == 0 {
                return Ok(());
            }
        }
        let live = gw.live();
        let (Upstream::Url(base), Some(pool)) = (&live.config.upstream, &live.pool) else {
            return hand_over(io, c.input, hyper).await;
        };
        if base.scheme_str() == Some("https") {
            return hand_over(io, c.input, hyper).await;
        }
        let answering = io.activity().answering();
        let headers = if live.reads_headers {
            header_map(&c.input, &c.fields)
        } else {
            HeaderMap::new()
        };
        let target = std::str::from_utf8(&c.input[head.target.clone()]).unwrap_or("/");
        let path = target.split('?').next().unwrap_or(target);
        let keep = match gw
            .admit(&live, &head.method, path, &headers, peer.ip())
            .await
        {
            Err(Refusal::Limited(d)) => {
                let how = (live.config.status, live.config.headers);
                write_rejection(&mut c.out, &mut c.rate, &d, how, head.close);
                io.write_all(&c.out).await?;
                drop(answering);
                !head.close
            }
            Err(Refusal::Answer(answer)) => {
                write_answer(&mut io, &mut c.out, answer, head.close).await?;
                drop(answering);
                !head.close
            }
            Ok(admitted) => {
                let prefix = base.path().trim_end_matches('/');
                let to = Forward {
                    gw: &gw,
                    live: &live,
                    pool,
                    prefix,
                    peer,
                    head: &head,
                    admitted: &admitted,
                };
                c.exchange(&mut io, to, answering).await?
            }
        };
        c.input.advance(whole);
        if !keep {
            return Ok(());
        }
        c.trim();
    }
}

/// Gives the connection to hyper, the bytes already read to be read again.
/// (Boxed: only the connections that go there need hyper's 1.8 KB state.)
async fn hand_over<H, F>(mut io: Watched<TcpStream>, read: BytesMut, hyper: H) -> F::Output
where
    H: FnOnce(Watched<TcpStream>) -> F,
    F: Future,
{
    io.unread(read.freeze());
    Box::pin(hyper(io)).await
}

/// Everything one exchange with the upstream needs besides the buffers.
struct Forward<'a> {
    gw: &'a Gateway,
    live: &'a Live,
    pool: &'a Arc<Pool>,
    prefix: &'a str,
    peer: SocketAddr,
    head: &'a Head,
    admitted: &'a Admitted,
}

/// The request's header fields as a `HeaderMap`, for configs whose identity,
/// forwarding or keys read headers. Fields that are not valid header names
/// or values are left out, as hyper would refuse the request.
fn header_map(buf: &[u8], fields: &[(Range<usize>, Range<usize>)]) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(fields.len());
    for (name, value) in fields {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(&buf[name.clone()]),
            HeaderValue::from_bytes(&buf[value.clone()]),
        ) {
            map.append(n, v);
        }
    }
    map
}

/// Writes a complete answer of the gateway's own (rejection, 403, 502...).
async fn write_answer<S: AsyncWrite + Unpin>(
    io: &mut S,
    out: &mut Vec<u8>,
    answer: Response<Body>,
    close: bool,
) -> io::Result<()> {
    let (parts, body) = answer.into_parts();
    // Bodies of the gateway's own answers are whole `Full` buffers.
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    out.clear();
    status_line(out, parts.status, None);
    for (name, value) in &parts.headers {
        push_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    end_answer(out, &body, close);
    io.write_all(out).await
}

/// A rejection, whole, in `out`: what [`crate::gateway::rejection`] answers
/// on hyper's path, written without a `HeaderMap` or a body to collect.
/// When it would read as the thread's last one (see [`LastRejection`]),
/// that one is copied with a fresh `Date`.
fn write_rejection(
    out: &mut Vec<u8>,
    rate: &mut RateFields,
    d: &ratewarden::Decision,
    (status, style): (StatusCode, ratewarden::HeaderStyle),
    close: bool,
) {
    let reused = LAST_REJECTION.with_borrow(|last| {
        if !last.renders_as(d, status, style, close) {
            return false;
        }
        out.clear();
        out.extend_from_slice(&last.bytes);
        out[last.date_at..last.date_at + 29].copy_from_slice(&http_date());
        true
    });
    if reused {
        return;
    }
    rate.body.clear();
    d.push_rejection_body(status.as_u16(), &mut rate.body);
    out.clear();
    status_line(out, status, None);
    push_field(out, b"content-type", b"application/problem+json");
    rate.render(Some(d), style);
    out.extend_from_slice(&rate.lines);
    let date_at = end_answer(out, rate.body.as_bytes(), close);
    LAST_REJECTION.with_borrow_mut(|last| last.keep(d, status, style, close, out, date_at));
}

thread_local! {
    static LAST_REJECTION: std::cell::RefCell<LastRejection> =
        std::cell::RefCell::new(LastRejection::default());
}

/// The last rejection written on this thread and what its bytes were
/// rendered from. A client hammering a limit (on one connection or many)
/// gets the same answer until one of its numbers changes, which with whole
/// seconds is at most once a second: copying it (and its `Date`) costs
/// less than rendering it again.
#[derive(Default)]
struct LastRejection {
    status: Option<StatusCode>,
    style: Option<ratewarden::HeaderStyle>,
    close: bool,
    /// Per rule of the decision, everything of it the answer shows.
    rules: Vec<Shown>,
    bytes: Vec<u8>,
    /// Where the value of `Date` starts in `bytes`.
    date_at: usize,
}

/// What an answer shows of one rule's decision: the rule (its spec: name,
/// limit, window, penalty, minimum interval), why it rejected, and its
/// numbers in the whole seconds the headers and body use.
struct Shown {
    rule: ratewarden::Rule,
    reason: Option<ratewarden::Reason>,
    remaining: u64,
    reset: u64,
    retry: Option<u64>,
}

impl Shown {
    fn of(r: &ratewarden::RuleDecision) -> Self {
        Self {
            rule: r.rule.clone(),
            reason: r.reason,
            remaining: r.remaining,
            reset: whole_secs(r.reset_after),
            retry: r.retry_after.map(whole_secs),
        }
    }

    fn shows(&self, r: &ratewarden::RuleDecision) -> bool {
        self.reason == r.reason
            && self.remaining == r.remaining
            && self.reset == whole_secs(r.reset_after)
            && self.retry == r.retry_after.map(whole_secs)
            && self.rule == r.rule
    }
}

impl LastRejection {
    /// Whether `d`'s rejection reads exactly as `bytes` (but for `Date`).
    fn renders_as(
        &self,
        d: &ratewarden::Decision,
        status: StatusCode,
        style: ratewarden::HeaderStyle,
        close: bool,
    ) -> bool {
        self.status == Some(status)
            && self.style == Some(style)
            && self.close == close
            && self.rules.len() == d.rules.len()
            && self.rules.iter().zip(&d.rules).all(|(s, r)| s.shows(r))
    }

    fn keep(
        &mut self,
        d: &ratewarden::Decision,
        status: StatusCode,
        style: ratewarden::HeaderStyle,
        close: bool,
        bytes: &[u8],
        date_at: usize,
    ) {
        self.status = Some(status);
        self.style = Some(style);
        self.close = close;
        self.rules.clear();
        self.rules.extend(d.rules.iter().map(Shown::of));
        self.bytes.clear();
        self.bytes.extend_from_slice(bytes);
        self.date_at = date_at;
    }
}

/// Ends one of the gateway's own answers in `out`: its length, `Date`,
/// `Connection: close` when the connection closes after it, then `body`.
/// Returns where the value of `Date` starts in `out`.
fn end_answer(out: &mut Vec<u8>, body: &[u8], close: bool) -> usize {
    push_field(
        out,
        b"content-length",
        itoa::Buffer::new().format(body.len()).as_bytes(),
    );
    let date_at = out.len() + b"date: ".len();
    push_field(out, b"date", &http_date());
    if close {
        push_field(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    date_at
}

/// Appends `HTTP/1.1 <code> <reason>\r\n`; the standard reason when `reason`
/// is `None` or empty.
fn status_line(out: &mut Vec<u8>, status: StatusCode, reason: Option<&[u8]>) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    match reason {
        Some(r) if !r.is_empty() => out.extend_from_slice(r),
        _ => out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes()),
    }
    out.extend_from_slice(b"\r\n");
}

impl Conn {
    /// After each exchange: gives back the upstream buffer (mimalloc hands
    /// it back next time at the cost of a thread-local free list pop) and an
    /// answer buffer a large head grew (see [`KEEP_BUFFER`]).
    fn trim(&mut self) {
        self.up = BytesMut::new();
        if self.out.capacity() > KEEP_BUFFER {
            self.out = Vec::with_capacity(4096);
        }
    }

    /// Between requests, nothing read and unanswered: gives back the client
    /// buffers too (as nginx frees its header buffer on a kept-alive
    /// connection), to this thread's spares.
    fn release(&mut self) {
        let mut input = std::mem::take(&mut self.input);
        let out = std::mem::take(&mut self.out);
        // Not kept: none yet, or grown by a large request (whose bytes
        // `input` advanced past still count; `try_reclaim` sees them).
        if out.capacity() == 0 || input.try_reclaim(KEEP_BUFFER) {
            return;
        }
        SPARE.with_borrow_mut(|spare| {
            if spare.len() < SPARE_MAX {
                spare.push((input, out));
            }
        });
    }

    /// Buffers for the next request: spares of this thread, else new ones.
    fn acquire(&mut self) {
        (self.input, self.out) = SPARE
            .with_borrow_mut(Vec::pop)
            .unwrap_or_else(|| (BytesMut::with_capacity(4096), Vec::with_capacity(4096)));
        self.out.clear();
    }

    /// Forwards the request in `input` and relays the answer; `Ok(false)`
    /// when the client connection must close afterwards.
    async fn exchange<S: AsyncWrite + Unpin>(
        &mut self,
        io: &mut S,
        to: Forward<'_>,
        answering: crate::idle::Answering,
    ) -> io::Result<bool> {
        let head = to.head;
        self.request_head(&to);
        let timeout = to.live.config.upstream_timeout;
        let started = Instant::now();
        let deadline = tokio::time::Instant::from_std(started) + timeout;
        let timer = match &mut self.timer {
            Some(t) => {
                t.as_mut().reset(deadline);
                t
            }
            None => self
                .timer
                .insert(Box::pin(tokio::time::sleep_until(deadline))),
        };
        let answered = exchange_head(
            to.pool,
            timer,
            &self.out,
            &mut self.up,
            &mut self.up_fields,
            &head.method,
        )
        .await;
        to.gw.metrics.upstream_time(started.elapsed());
        let (mut up, resp) = match answered {
            Ok(a) => a,
            Err(failed) => {
                let mut answer = match failed {
                    Failed::Timeout => problem_response(
                        StatusCode::GATEWAY_TIMEOUT,
                        &format!("the upstream did not answer within {timeout:?}"),
                    ),
                    Failed::Broken(e) => {
                        tracing::warn!(error = %e, "upstream failed");
                        problem_response(
                            StatusCode::BAD_GATEWAY,
                            "the upstream could not be reached",
                        )
                    }
                };
                to.gw
                    .settle(to.live, to.admitted, answer.status().as_u16())
                    .await;
                to.admitted
                    .add_headers(answer.headers_mut(), to.live.config.headers);
                write_answer(io, &mut self.out, answer, head.close).await?;
                return Ok(!head.close);
            }
        };
        to.gw.settle(to.live, to.admitted, resp.status).await;
        let close = head.close || resp.framing == Framing::Close;
        self.response_head(&resp, &to, close);
        // From here `up` holds the body bytes read so far.
        self.up.advance(resp.len);
        let (out, body) = (&mut self.out, &mut self.up);
        let ended_clean = match resp.framing {
            Framing::Empty => {
                io.write_all(out).await?;
                body.is_empty()
            }
            Framing::Length(n) if body.len() as u64 >= n && n <= RELAY as u64 => {
                // The whole answer in one write.
                let n = n as usize;
                out.extend_from_slice(&body[..n]);
                io.write_all(out).await?;
                body.len() == n
            }
            Framing::Length(n) => {
                io.write_all(out).await?;
                drop(answering);
                relay_length(&mut up, io, body, n).await?;
                body.is_empty()
            }
            Framing::Chunked => {
                io.write_all(out).await?;
                drop(answering);
                relay_chunked(&mut up, io, body).await?
            }
            Framing::Close => {
                io.write_all(out).await?;
                drop(answering);
                relay_to_close(&mut up, io, body).await?;
                false
            }
        };
        body.clear();
        if resp.reusable && ended_clean {
            to.pool.put_stream(up);
        }
        Ok(!close)
    }

    /// The request to the upstream, in `out`: origin form under the
    /// upstream's path prefix, hop-by-hop fields dropped, `Host` set to the
    /// upstream's, the peer appended to `X-Forwarded-For`, then the body.
    fn request_head(&mut self, to: &Forward<'_>) {
        let (input, out, head) = (&self.input, &mut self.out, to.head);
        out.clear();
        out.extend_from_slice(head.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(to.prefix.as_bytes());
        out.extend_from_slice(&input[head.target.clone()]);
        out.extend_from_slice(b" HTTP/1.1\r\n");
        let host = to.pool.host();
        if let Some(h) = host {
            push_field(out, b"host", h.as_bytes());
        }
        let mut chain: Vec<&[u8]> = vec![];
        for (name, value) in &self.fields {
            let (name, value) = (&input[name.clone()], &input[value.clone()]);
            if name.eq_ignore_ascii_case(b"x-forwarded-for") {
                chain.push(value);
            } else {
                let replaced = host.is_some() && name.eq_ignore_ascii_case(b"host");
                if !is_hop_by_hop(name) && !replaced {
                    push_field(out, name, value);
                }
            }
        }
        out.extend_from_slice(b"x-forwarded-for: ");
        for hop in chain {
            out.extend_from_slice(hop);
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(ratewarden_tower::identity::ip_text(to.peer.ip()).as_bytes());
        out.extend_from_slice(b"\r\n\r\n");
        out.extend_from_slice(&input[head.len..head.len + head.body]);
    }

    /// The response head to the client, in `out`: the upstream's status and
    /// fields minus hop-by-hop ones, the framing this hop uses, the
    /// decision's rate-limit fields.
    fn response_head(&mut self, resp: &UpHead, to: &Forward<'_>, close: bool) {
        let (up, out, rate) = (&self.up, &mut self.out, &mut self.rate);
        out.clear();
        let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
        status_line(out, status, Some(&up[resp.reason.clone()]));
        rate.render(to.admitted.decision.as_ref(), to.live.config.headers);
        for (name, value) in &self.up_fields {
            let name_bytes = &up[name.clone()];
            let dropped = is_hop_by_hop(name_bytes)
                || resp
                    .listed
                    .iter()
                    .any(|l| up[l.clone()].eq_ignore_ascii_case(name_bytes))
                || rate.sets(name_bytes)
                || (resp.framing == Framing::Chunked
                    && name_bytes.eq_ignore_ascii_case(b"content-length"));
            if !dropped {
                push_field(out, name_bytes, &up[value.clone()]);
            }
        }
        if !resp.dated {
            push_field(out, b"date", &http_date());
        }
        if resp.framing == Framing::Chunked {
            push_field(out, b"transfer-encoding", b"chunked");
        }
        if close {
            push_field(out, b"connection", b"close");
        }
        out.extend_from_slice(&rate.lines);
        out.extend_from_slice(b"\r\n");
    }
}

/// Sends `request` on a pooled connection (or a new one) and reads the
/// response head into `up`, all before `timer` fires. Pooled connections the
/// upstream has closed are skipped (see [`Pool::take_stream`]). One it closes
/// just as the request goes out fails before any byte of answer; the request
/// (its body is buffered whole) is then sent once more on a new connection,
/// within the same deadline, if its method is idempotent: the upstream may
/// have acted on it before closing, and like nginx we never repeat a POST.
async fn exchange_head(
    pool: &Pool,
    timer: &mut Pin<Box<Sleep>>,
    request: &[u8],
    up: &mut BytesMut,
    fields: &mut Vec<(Range<usize>, Range<usize>)>,
    method: &Method,
) -> Result<(TcpStream, UpHead), Failed> {
    let head_request = method == Method::HEAD;
    let mut pooled = pool.take_stream();
    loop {
        let reused = pooled.is_some();
        let mut stream = match pooled.take() {
            Some(s) => s,
            // Boxed: connecting is rare and its future large.
            None => match within(timer, Box::pin(pool.connect_stream())).await {
                None => return Err(Failed::Timeout),
                Some(Err(e)) => return Err(Failed::Broken(e.to_string())),
                Some(Ok(s)) => s,
            },
        };
        up.clear();
        let sent = within(timer, async {
            stream.write_all(request).await?;
            read_head(&mut stream, up, fields, head_request).await
        })
        .await;
        match sent {
            None => return Err(Failed::Timeout),
            Some(Ok(resp)) => return Ok((stream, resp)),
            Some(Err(_)) if reused && up.is_empty() && method.is_idempotent() => {
                pooled = None;
                continue;
            }
            Some(Err(e)) => return Err(Failed::Broken(e.to_string())),
        }
    }
}

/// Reads a response head (skipping interim 1xx ones) into `up`.
async fn read_head(
    stream: &mut TcpStream,
    up: &mut BytesMut,
    fields: &mut Vec<(Range<usize>, Range<usize>)>,
    head_request: bool,
) -> io::Result<UpHead> {
    loop {
        if !up.is_empty() {
            match parse_response(up, head_request, fields) {
                Ok(Some(h)) if (100..200).contains(&h.status) => {
                    // 100 Continue, 103 Early Hints: not relayed.
                    up.advance(h.len);
                    continue;
                }
                Ok(Some(h)) => return Ok(h),
                Ok(None) if up.len() < MAX_UPSTREAM_HEAD => {}
                _ => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "invalid response head from the upstream",
                    ));
                }
            }
        }
        up.reserve(8192);
        if stream.read_buf(up).await? == 0 {
            return Err(cut_short());
        }
    }
}

/// Empties `buf` and reads the upstream's next bytes into it: how many (0
/// at the end of its stream).
async fn refill(up: &mut TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    buf.clear();
    buf.reserve(RELAY);
    up.read_buf(buf).await
}

fn cut_short() -> io::Error {
    io::ErrorKind::UnexpectedEof.into()
}

/// Relays a body of `left` bytes, starting with those in `buf`; bytes past
/// its end stay in `buf`.
async fn relay_length<S: AsyncWrite + Unpin>(
    up: &mut TcpStream,
    io: &mut S,
    buf: &mut BytesMut,
    mut left: u64,
) -> io::Result<()> {
    loop {
        let n = buf.len().min(left.try_into().unwrap_or(usize::MAX));
        io.write_all(&buf[..n]).await?;
        left -= n as u64;
        if left == 0 {
            buf.advance(n);
            return Ok(());
        }
        if refill(up, buf).await? == 0 {
            return Err(cut_short());
        }
    }
}

/// Relays a chunked body as it is, starting with the bytes in `buf`;
/// `Ok(true)` when it ended exactly where the upstream stopped sending.
async fn relay_chunked<S: AsyncWrite + Unpin>(
    up: &mut TcpStream,
    io: &mut S,
    buf: &mut BytesMut,
) -> io::Result<bool> {
    let mut chunks = Chunks::default();
    loop {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad chunked framing");
        match chunks.feed(buf).map_err(|()| bad())? {
            Some(end) => {
                io.write_all(&buf[..end]).await?;
                return Ok(end == buf.len());
            }
            None => io.write_all(buf).await?,
        }
        if refill(up, buf).await? == 0 {
            return Err(cut_short());
        }
    }
}

/// Relays everything the upstream sends until it closes, starting with the
/// bytes in `buf`.
async fn relay_to_close<S: AsyncWrite + Unpin>(
    up: &mut TcpStream,
    io: &mut S,
    buf: &mut BytesMut,
) -> io::Result<()> {
    loop {
        io.write_all(buf).await?;
        if refill(up, buf).await? == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_is_reused_only_while_it_would_read_the_same() {
        use ratewarden::{Decision, HeaderStyle, Reason, Rule, RuleDecision};
        use std::time::Duration;
        let rule = |name: &str| {
            Rule::builder(name)
                .limit(5, Duration::from_secs(10))
                .build()
                .unwrap()
        };
        let rejected = |rule: &Rule, retry_ms: u64, reset_ms: u64| Decision {
            allowed: false,
            delay: Duration::ZERO,
            rules: vec![RuleDecision {
                rule: rule.clone(),
                key: "k".into(),
                reason: Some(Reason::Limit),
                remaining: 0,
                reset_after: Duration::from_millis(reset_ms),
                retry_after: Some(Duration::from_millis(retry_ms)),
            }],
        };
        let how = (StatusCode::TOO_MANY_REQUESTS, HeaderStyle::default());
        // Rendered afresh (nothing kept), and through the thread's last one.
        let fresh = |d: &Decision, close: bool| {
            LAST_REJECTION.with_borrow_mut(|l| *l = LastRejection::default());
            let mut out = vec![];
            write_rejection(&mut out, &mut RateFields::default(), d, how, close);
            String::from_utf8(out).unwrap()
        };
        let written = |d: &Decision, close: bool| {
            let mut out = vec![];
            write_rejection(&mut out, &mut RateFields::default(), d, how, close);
            String::from_utf8(out).unwrap()
        };
        // The date is the only part that may differ between two renderings.
        let undated = |s: String| {
            let at = s.find("date: ").unwrap() + 6;
            format!("{}{}", &s[..at], &s[at + 29..])
        };
        let api = rule("api");
        let first = fresh(&rejected(&api, 1500, 2000), false);
        assert!(first.contains("retry_after\":2}"), "{first}");
        // A stale date in the kept bytes, to see it rewritten.
        let kept = LAST_REJECTION.with_borrow_mut(|l| {
            let at = l.date_at;
            l.bytes[at..at + 29].copy_from_slice(b"Thu, 01 Jan 1970 00:00:00 GMT");
            l.bytes.clone()
        });
        // Other milliseconds, the same whole seconds: the kept bytes.
        let again = written(&rejected(&api, 1200, 1700), false);
        assert_eq!(undated(again.clone()), undated(first.clone()));
        assert_eq!(LAST_REJECTION.with_borrow(|l| l.bytes.clone()), kept);
        let date = &again[again.find("date: ").unwrap() + 6..][..29];
        let age = std::time::SystemTime::now()
            .duration_since(httpdate::parse_http_date(date).unwrap())
            .unwrap_or_default();
        assert!(age < Duration::from_secs(5), "a current date: {date}");
        // Anything the answer shows changes it, exactly as rendered afresh.
        for (d, close) in [
            (rejected(&api, 2500, 2000), false),
            (rejected(&api, 1500, 3000), false),
            (rejected(&api, 1500, 2000), true),
            (rejected(&rule("other"), 1500, 2000), false),
        ] {
            written(&rejected(&api, 1500, 2000), false);
            let got = written(&d, close);
            assert_ne!(undated(got.clone()), undated(first.clone()));
            assert_eq!(undated(got), undated(fresh(&d, close)));
        }
    }

    #[test]
    fn idle_connections_keep_standard_buffers_as_spares_and_free_grown_ones() {
        let spares = || SPARE.with_borrow(Vec::len);
        let mut c = Conn::default();
        c.release();
        assert_eq!(spares(), 0, "a connection that never read has none");
        c.acquire();
        c.input.extend_from_slice(b"GET / HTTP/1.1\r\n\r\n");
        c.input.advance(18);
        c.out.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        c.release();
        assert_eq!(spares(), 1);
        assert!(
            c.input.capacity() == 0 && c.out.capacity() == 0,
            "none held idle"
        );
        // The next request (on any connection) takes them, emptied.
        let mut d = Conn::default();
        d.acquire();
        assert_eq!(spares(), 0);
        assert!(d.input.is_empty() && d.out.is_empty());
        d.input.reserve(4096);
        assert!(d.out.capacity() >= 4096);
        // A 64 KiB body, read and answered: freed, not kept.
        d.input.extend_from_slice(&[b'x'; MAX_BODY]);
        d.input.advance(MAX_BODY);
        d.release();
        assert_eq!(spares(), 0);
        // At most SPARE_MAX are kept.
        let mut all: Vec<Conn> = (0..SPARE_MAX + 3).map(|_| Conn::default()).collect();
        all.iter_mut().for_each(Conn::acquire);
        all.iter_mut().for_each(Conn::release);
        assert_eq!(spares(), SPARE_MAX);
    }

    fn request(text: &str) -> Parsed {
        parse_request(text.as_bytes(), &mut vec![])
    }

    #[test]
    fn plain_requests_stay_and_everything_else_goes_to_hyper() {
        let Parsed::Complete(h) =
            request("POST /a?b=1 HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
        else {
            panic!("a plain POST is this path's");
        };
        assert_eq!((h.method, h.body, h.close), (Method::POST, 3, false));
        assert!(matches!(
            request("GET / HTTP/1.1\r\nconnection: close\r\n\r\n"),
            Parsed::Complete(Head { close: true, .. })
        ));
        assert!(matches!(request("GET / HTTP/1.1\r\nhost"), Parsed::Partial));
        for elsewhere in [
            "GET / HTTP/1.0\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 9999999\r\n\r\n",
            "GET /a|b HTTP/1.1\r\n\r\n",
            "\u{0}garbage\r\n\r\n",
        ] {
            assert!(
                matches!(request(elsewhere), Parsed::Elsewhere),
                "{elsewhere:?}"
            );
        }
    }

    fn response(text: &str, head_request: bool) -> UpHead {
        parse_response(text.as_bytes(), head_request, &mut vec![])
            .expect("valid")
            .expect("complete")
    }

    #[test]
    fn response_framing_follows_rfc_9112() {
        let r = |t: &str| response(t, false).framing;
        assert_eq!(
            r("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"),
            Framing::Length(5)
        );
        assert_eq!(
            r("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"),
            Framing::Chunked
        );
        assert_eq!(
            r("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"),
            Framing::Close
        );
        assert_eq!(r("HTTP/1.1 200 OK\r\n\r\n"), Framing::Close);
        assert_eq!(
            r("HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"),
            Framing::Empty
        );
        assert_eq!(
            response("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", true).framing,
            Framing::Empty
        );
        assert!(
            !response(
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
                false
            )
            .reusable
        );
        assert!(!response("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", false).reusable);
        assert!(response("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", false).reusable);
        assert!(
            parse_response(
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                false,
                &mut vec![]
            )
            .is_err()
        );
    }

    #[test]
    fn the_end_of_a_chunked_body_is_found_however_it_is_split() {
        let body = b"5;ext=1\r\nhello\r\n10\r\n0123456789abcdef\r\n0\r\nx-trailer: 1\r\n\r\nNEXT";
        let end = body.len() - 4;
        for split in 0..body.len() {
            let mut c = Chunks::default();
            let found = match c.feed(&body[..split]).unwrap() {
                Some(n) => n,
                None => split + c.feed(&body[split..]).unwrap().expect("ends"),
            };
            assert_eq!(found, end, "split at {split}");
        }
        assert!(Chunks::default().feed(b"zz\r\n").is_err());
        assert!(Chunks::default().feed(b"2\r\nabX").is_err());
        assert_eq!(Chunks::default().feed(b"0\r\n\r\n"), Ok(Some(5)));
    }
}
