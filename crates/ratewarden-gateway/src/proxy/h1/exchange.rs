//! One exchange with the upstream: send the request, relay the answer.

use std::future::{Future, poll_fn};
use std::io;
use std::ops::Range;
use std::pin::{Pin, pin};
use std::task::Poll;

use bytes::{Buf, BytesMut};
use http::{Method, StatusCode};
use std::task::Context;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Sleep;

use super::Conn;
use super::chunked::Chunks;
use super::request::Head;
use super::response::{Framing, MAX_UPSTREAM_HEAD, UpHead, parse_response};
use super::write::{http_date, push_field, status_line, write_answer};
use smallvec::SmallVec;

use super::request::BodyLen;
use crate::proxy::failover::Failover;
use crate::proxy::flow::{Flow, add_rate_headers};
use crate::proxy::forward::{
    X_FORWARDED, dropped_request_field, drops_length, is_hop_by_hop, push_forwarded_for, tls_cause,
    x_forwarded_index, x_forwarded_values,
};
use crate::upstream::pool::{Pool, UpstreamError};
use crate::wire::idle::Watched;
use crate::wire::stream::{ClientIo, UpstreamIo};
use ratewarden_tower::admission::{Admitted, Held};

/// Bytes read from the upstream at a time while relaying a body.
pub(crate) const RELAY: usize = 64 * 1024;
/// Bytes a client may pipeline while its request waits for the upstream's
/// answer and the wait still watches it (beyond them it is no longer
/// watched until the answer comes: the bytes wait in the socket).
const PIPELINED: usize = 64 * 1024;

/// The status the access log gives a request whose client left before the
/// upstream answered (nginx's 499): nothing was sent back.
pub(crate) const CLIENT_GONE: u16 = 499;

/// The client of a request waiting for the upstream's answer, watched
/// meanwhile: HTTP/2 learns that a client left from a stream reset, HTTP/1.1
/// only by reading. So that a client that leaves frees its request's
/// leases at once, and its upstream request is cancelled, not at
/// `upstream_timeout`. Bytes the client pipelines meanwhile are kept in
/// `input`, after the request, up to [`PIPELINED`] more.
pub(crate) struct ClientWatch<'a> {
    io: &'a mut Watched<ClientIo>,
    input: &'a mut BytesMut,
    limit: usize,
}

impl<'a> ClientWatch<'a> {
    pub(crate) fn new(io: &'a mut Watched<ClientIo>, input: &'a mut BytesMut) -> Self {
        let limit = input.len() + PIPELINED;
        Self { io, input, limit }
    }

    /// Whether the client's connection has ended or failed. The socket's
    /// readiness is asked first, without a syscall (tokio cleared it at
    /// the request's short read): a client that sends nothing costs that
    /// check, and a registration for the next event.
    fn poll_gone(&mut self, cx: &mut Context<'_>) -> bool {
        while self.input.len() < self.limit {
            match self.io.poll_readable(cx) {
                Poll::Pending => return false,
                Poll::Ready(Err(_)) => return true,
                Poll::Ready(Ok(())) => {}
            }
            let mut buf = [std::mem::MaybeUninit::<u8>::uninit(); 4096];
            let mut read = ReadBuf::uninit(&mut buf);
            match Pin::new(&mut *self.io).poll_read(cx, &mut read) {
                Poll::Pending => return false,
                Poll::Ready(Ok(())) if read.filled().is_empty() => return true,
                Poll::Ready(Ok(())) => self.input.extend_from_slice(read.filled()),
                Poll::Ready(Err(_)) => return true,
            }
        }
        false
    }
}

/// How a wait for the upstream ended before its answer.
enum Waited<T> {
    Done(T),
    TimedOut,
    ClientGone,
}

/// Runs `fut` until `timer` fires, watching `client` meanwhile.
async fn waiting<F: Future>(
    timer: &mut Pin<Box<Sleep>>,
    client: &mut ClientWatch<'_>,
    fut: F,
) -> Waited<F::Output> {
    let mut fut = pin!(fut);
    poll_fn(|cx| {
        if let Poll::Ready(v) = fut.as_mut().poll(cx) {
            return Poll::Ready(Waited::Done(v));
        }
        if timer.as_mut().poll(cx).is_ready() {
            return Poll::Ready(Waited::TimedOut);
        }
        if client.poll_gone(cx) {
            return Poll::Ready(Waited::ClientGone);
        }
        Poll::Pending
    })
    .await
}

/// Runs `fut` until `timer` fires (`None`).
pub(crate) async fn within<F: Future>(timer: &mut Pin<Box<Sleep>>, fut: F) -> Option<F::Output> {
    let mut fut = pin!(fut);
    poll_fn(|cx| match fut.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending => timer.as_mut().poll(cx).map(|()| None),
    })
    .await
}

/// Why an upstream exchange produced no response head.
pub(crate) enum Failed {
    /// No head within `upstream_timeout`: 504.
    Timeout,
    /// Could not connect (nothing was sent): another server may be tried.
    Connect(UpstreamError),
    /// The exchange broke: 502, saying `.0` (and logging `.1`).
    Broken(std::borrow::Cow<'static, str>, String),
    /// The client left while it waited: nothing to answer.
    ClientGone,
}

/// Everything one exchange with the upstream needs besides the buffers.
pub(crate) struct Forward<'a> {
    /// The request's flow (its configuration, id and settling).
    pub(crate) flow: &'a Flow<'a>,
    /// The route's servers.
    pub(crate) group: &'a crate::upstream::route::Group,
    /// The target sent after `prefix` when it is not the client's as it
    /// came (see [`crate::proxy::forward::upstream_target`]).
    pub(crate) rewritten: Option<&'a str>,
    pub(crate) client: &'a crate::proxy::forward::Client,
    pub(crate) head: &'a Head,
    pub(crate) admitted: &'a Admitted<'a>,
    /// The request's `concurrency` leases, if any (given back when its
    /// answer ends, or when the connection's task is dropped).
    pub(crate) held: Option<Held>,
}

/// How an exchange ended, for the access log.
pub(crate) struct Answered {
    /// The client connection may carry another request.
    pub(crate) keep: bool,
    /// The status sent.
    pub(crate) status: u16,
    /// Whether the upstream answered (else the gateway did: 502, 504).
    pub(crate) from_upstream: bool,
    /// Body bytes sent, when the answer had a length.
    pub(crate) bytes: Option<u64>,
}

/// Gives the leases in `held` back: the request has ended.
async fn ended(held: &mut Option<Held>) {
    if let Some(h) = held.take() {
        h.release().await;
    }
}

impl Conn {
    /// Forwards the request in `input` and relays the answer; `keep` is
    /// false when the client connection must close afterwards.
    pub(crate) async fn exchange(
        &mut self,
        io: &mut Watched<ClientIo>,
        mut to: Forward<'_>,
        answering: crate::wire::idle::Answering,
    ) -> io::Result<Answered> {
        let head = to.head;
        let live = to.flow.live;
        let timeout = live.config.upstream_timeout;
        // One deadline for every attempt. (Taken out of `self` while the
        // attempts also write the request into `self.out`.)
        let mut slot = self.timer.take();
        let timer = super::arm(&mut slot, timeout);
        let client = to.admitted.who().identity.as_str();
        let mut attempts = Failover::new(to.group, to.flow.metrics(), client);
        let answered = loop {
            let chosen = match attempts.next() {
                Ok(c) => c,
                Err(answer) => break Err(*answer),
            };
            let server = chosen.server();
            self.request_head(&to, server);
            let answered = exchange_head(
                &server.pool,
                timer,
                &self.out,
                &mut self.up,
                &mut self.up_fields,
                &head.method,
                &mut ClientWatch::new(io, &mut self.input),
            )
            .await;
            match answered {
                Ok(a) => {
                    attempts.answered(&chosen);
                    break Ok((a, chosen));
                }
                Err(Failed::Connect(e)) => attempts.unsent(&chosen, &e),
                Err(Failed::Timeout) => break Err(attempts.timed_out(&chosen, timeout)),
                Err(Failed::Broken(why, error)) => break Err(attempts.broke(&chosen, why, error)),
                Err(Failed::ClientGone) => {
                    // The client left: the upstream's request is dropped
                    // with its connection, the leases go back now, nothing
                    // is settled (no answer was seen), and the connection
                    // ends.
                    attempts.done();
                    drop(chosen);
                    self.timer = slot;
                    ended(&mut to.held).await;
                    return Ok(Answered {
                        keep: false,
                        status: CLIENT_GONE,
                        from_upstream: false,
                        bytes: None,
                    });
                }
            }
        };
        self.timer = slot;
        let ((mut up, resp), chosen) = match answered {
            Ok(a) => a,
            Err(mut answer) => {
                if let Ok(v) = http::HeaderValue::from_bytes(to.flow.rid.as_bytes()) {
                    answer
                        .headers_mut()
                        .insert(crate::observe::request_id::HEADER, v);
                }
                let status = answer.status().as_u16();
                to.flow.settle(to.admitted, status).await;
                add_rate_headers(
                    to.admitted.decision.as_ref(),
                    answer.headers_mut(),
                    live.config.headers,
                );
                ended(&mut to.held).await;
                write_answer(io, &mut self.out, answer, head.close).await?;
                return Ok(Answered {
                    keep: !head.close,
                    status,
                    from_upstream: false,
                    bytes: None,
                });
            }
        };
        to.flow.settle(to.admitted, resp.status).await;
        let bytes = match resp.framing {
            Framing::Empty => Some(0),
            Framing::Length(n) => Some(n),
            _ => None,
        };
        let close = head.close || resp.framing == Framing::Close;
        self.response_head(&resp, &to, close);
        // From here `up` holds the body bytes read so far.
        self.up.advance(resp.len);
        let (out, body) = (&mut self.out, &mut self.up);
        // The request's leases are given back as its answer ends: before
        // the last write, so a client sending its next request at once
        // finds its slot free.
        let held = &mut to.held;
        let ended_clean = match resp.framing {
            Framing::Empty => {
                ended(held).await;
                io.write_all(out).await?;
                body.is_empty()
            }
            Framing::Length(n) if body.len() as u64 >= n && n <= RELAY as u64 => {
                // The whole answer in one write.
                let n = n as usize;
                out.extend_from_slice(&body[..n]);
                ended(held).await;
                io.write_all(out).await?;
                body.len() == n
            }
            Framing::Length(n) => {
                io.write_all(out).await?;
                drop(answering);
                relay_length(&mut up, io, body, n).await?;
                ended(held).await;
                body.is_empty()
            }
            Framing::Chunked => {
                io.write_all(out).await?;
                drop(answering);
                let clean = relay_chunked(&mut up, io, body).await?;
                ended(held).await;
                clean
            }
            Framing::Close => {
                io.write_all(out).await?;
                drop(answering);
                relay_to_close(&mut up, io, body).await?;
                ended(held).await;
                false
            }
        };
        // (TLS: the last records may still wait in rustls; a no-op for TCP.)
        io.flush().await?;
        body.clear();
        if resp.reusable && ended_clean {
            chosen.server().pool.put_stream(up);
        }
        Ok(Answered {
            keep: !close,
            status: resp.status,
            from_upstream: true,
            bytes,
        })
    }

    /// The request to the upstream, in `out`: the target under the
    /// upstream's path prefix,
    /// dropped fields left out (hop-by-hop, and `_` names unless kept),
    /// `Host` set to the upstream's (the client's under `preserve_host`),
    /// the peer appended to `X-Forwarded-For`, `X-Forwarded-Host`, `-Proto`
    /// and `-Port` set (kept as sent only from a trusted proxy), then the
    /// body: as read, or decoded from chunks and sent with its length.
    pub(crate) fn request_head(
        &mut self,
        to: &Forward<'_>,
        server: &crate::upstream::route::Server,
    ) {
        let (input, out, head) = (&self.input, &mut self.out, to.head);
        let live = to.flow.live;
        let keep_underscores = live.config.underscores_in_headers;
        out.clear();
        out.extend_from_slice(head.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(server.prefix.as_bytes());
        match to.rewritten {
            Some(t) => out.extend_from_slice(t.as_bytes()),
            None => out.extend_from_slice(&input[head.target.clone()]),
        }
        out.extend_from_slice(b" HTTP/1.1\r\n");
        // `request_headers`: a Host it sets wins; the fields it sets or
        // removes are not the client's (most routes have none).
        let extra = &to.group.request_headers;
        let edits = !extra.set.is_empty() || !extra.remove.is_empty();
        let host = match extra.get("host") {
            Some(h) => Some(h),
            None if to.group.preserve_host => None,
            None => server.pool.host(),
        };
        if let Some(h) = host {
            push_field(out, b"host", h.as_bytes());
        }
        let trusted = live.config.trusts(to.client.peer.ip());
        // A client's own chain goes on only from a trusted proxy (or
        // under `x_forwarded_for: append`); else the peer replaces it.
        let keep_chain = trusted || live.config.x_forwarded_for_append;
        let (mut kept, mut asked) = ([false; 3], None);
        let mut chain: SmallVec<[&[u8]; 2]> = SmallVec::new();
        let forwarded = live.config.forwarded;
        let mut forwarded_chain: SmallVec<[&[u8]; 2]> = SmallVec::new();
        for (name, value) in &self.fields {
            let (name, value) = (&input[name.clone()], &input[value.clone()]);
            if name.eq_ignore_ascii_case(b"x-forwarded-for") {
                if keep_chain {
                    chain.push(value);
                }
            } else if forwarded && name.eq_ignore_ascii_case(b"forwarded") {
                // A trusted proxy's elements go on, ours after them; a
                // client's are replaced.
                if trusted {
                    forwarded_chain.push(value);
                }
            } else if name.eq_ignore_ascii_case(b"x-request-id") {
                // Ours goes instead (the client's, when it was valid).
            } else if let Some(i) = x_forwarded_index(name) {
                // A client's is replaced; a trusted proxy's first is kept.
                if trusted && !kept[i] && !(edits && extra.replaces(name)) {
                    kept[i] = true;
                    push_field(out, name, value);
                }
            } else {
                let is_host = name.eq_ignore_ascii_case(b"host");
                if asked.is_none() && is_host {
                    asked = Some(value);
                }
                let replaced = (host.is_some() && is_host) || (edits && extra.replaces(name));
                if !dropped_request_field(name, keep_underscores) && !replaced {
                    push_field(out, name, value);
                }
            }
        }
        for (name, value) in &extra.set {
            if *name == http::header::HOST {
                continue;
            }
            if let Some(i) = x_forwarded_index(name.as_str().as_bytes()) {
                kept[i] = true;
            }
            push_field(out, name.as_str().as_bytes(), value.as_bytes());
        }
        for name in &extra.remove {
            if let Some(i) = x_forwarded_index(name.as_str().as_bytes()) {
                kept[i] = true;
            }
        }
        if head.body == BodyLen::Chunked {
            let n: usize = self.body.iter().map(ExactSizeIterator::len).sum();
            push_field(
                out,
                b"content-length",
                itoa::Buffer::new().format(n).as_bytes(),
            );
        }
        push_field(out, b"x-request-id", to.flow.rid.as_bytes());
        let mut port = itoa::Buffer::new();
        let ours = x_forwarded_values(to.client, asked, &mut port);
        for (i, v) in ours.into_iter().enumerate() {
            if let (false, Some(v)) = (kept[i], v) {
                push_field(out, X_FORWARDED[i].as_bytes(), v);
            }
        }
        if forwarded {
            out.extend_from_slice(b"forwarded: ");
            for hop in &forwarded_chain {
                out.extend_from_slice(hop);
                out.extend_from_slice(b", ");
            }
            crate::proxy::forward::forwarded_element(out, to.client, asked);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"x-forwarded-for: ");
        push_forwarded_for(out, chain, to.client.peer.ip());
        out.extend_from_slice(b"\r\n\r\n");
        for span in &self.body {
            out.extend_from_slice(&input[span.clone()]);
        }
    }

    /// The response head to the client, in `out`: the upstream's status and
    /// fields minus hop-by-hop ones, the framing this hop uses, the
    /// decision's rate-limit fields.
    pub(crate) fn response_head(&mut self, resp: &UpHead, to: &Forward<'_>, close: bool) {
        let (up, out, rate) = (&self.up, &mut self.out, &mut self.rate);
        out.clear();
        let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
        status_line(out, status, Some(&up[resp.reason.clone()]));
        rate.render(to.admitted.decision.as_ref(), to.flow.live.config.headers);
        for (name, value) in &self.up_fields {
            let name_bytes = &up[name.clone()];
            let dropped = is_hop_by_hop(name_bytes)
                || resp
                    .listed
                    .iter()
                    .any(|l| up[l.clone()].eq_ignore_ascii_case(name_bytes))
                || rate.sets(name_bytes)
                || name_bytes.eq_ignore_ascii_case(b"x-request-id")
                || (drops_length(resp.transfer_encoding)
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
        push_field(out, b"x-request-id", to.flow.rid.as_bytes());
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
pub(crate) async fn exchange_head(
    pool: &Pool,
    timer: &mut Pin<Box<Sleep>>,
    request: &[u8],
    up: &mut BytesMut,
    fields: &mut Vec<(Range<usize>, Range<usize>)>,
    method: &Method,
    client: &mut ClientWatch<'_>,
) -> Result<(UpstreamIo, UpHead), Failed> {
    let head_request = method == Method::HEAD;
    let mut pooled = pool.take_stream();
    loop {
        let reused = pooled.is_some();
        let mut stream = match pooled.take() {
            Some(s) => s,
            // Boxed: connecting is rare and its future large.
            None => match waiting(timer, client, Box::pin(pool.connect_stream())).await {
                Waited::TimedOut => return Err(Failed::Timeout),
                Waited::ClientGone => return Err(Failed::ClientGone),
                Waited::Done(Err(e)) => return Err(Failed::Connect(e)),
                Waited::Done(Ok(s)) => s,
            },
        };
        up.clear();
        let sent = waiting(timer, client, async {
            stream.write_all(request).await?;
            stream.flush().await?;
            read_head(&mut stream, up, fields, head_request).await
        })
        .await;
        match sent {
            Waited::TimedOut => return Err(Failed::Timeout),
            Waited::ClientGone => return Err(Failed::ClientGone),
            Waited::Done(Ok(resp)) => return Ok((stream, resp)),
            Waited::Done(Err(_)) if reused && up.is_empty() && method.is_idempotent() => {
                pooled = None;
                continue;
            }
            Waited::Done(Err(e)) => {
                let why = match tls_cause(&e) {
                    Some(why) => why,
                    None if e.kind() == io::ErrorKind::InvalidData => {
                        "the answer was not valid HTTP".into()
                    }
                    None => "the exchange broke before an answer".into(),
                };
                return Err(Failed::Broken(why, e.to_string()));
            }
        }
    }
}

/// Reads a response head (skipping interim 1xx ones) into `up`.
pub(crate) async fn read_head(
    stream: &mut UpstreamIo,
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
pub(crate) async fn refill(up: &mut UpstreamIo, buf: &mut BytesMut) -> io::Result<usize> {
    buf.clear();
    buf.reserve(RELAY);
    up.read_buf(buf).await
}

pub(crate) fn cut_short() -> io::Error {
    io::ErrorKind::UnexpectedEof.into()
}

/// Relays a body of `left` bytes, starting with those in `buf`; bytes past
/// its end stay in `buf`.
pub(crate) async fn relay_length<S: AsyncWrite + Unpin>(
    up: &mut UpstreamIo,
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
pub(crate) async fn relay_chunked<S: AsyncWrite + Unpin>(
    up: &mut UpstreamIo,
    io: &mut S,
    buf: &mut BytesMut,
) -> io::Result<bool> {
    let mut chunks = Chunks::default();
    loop {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad chunked framing");
        match chunks.feed(buf).map_err(|_| bad())? {
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
pub(crate) async fn relay_to_close<S: AsyncWrite + Unpin>(
    up: &mut UpstreamIo,
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
