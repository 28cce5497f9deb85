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

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::pin::{Pin, pin};
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use http::header::HeaderMap;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::Sleep;

mod buffers;
mod chunked;
mod exchange;
mod reject_cache;
mod request;
mod response;
mod write;

use crate::config::Upstream;
use crate::gateway::{Gateway, Refusal};
use crate::idle::Watched;

use exchange::Forward;
use reject_cache::write_rejection;
pub use request::{MAX_BODY, MAX_HEAD};
use request::{Parsed, header_map, parse_request};
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
