//! The HTTP/1.1 path as a wire of the one flow: the gateway's own answers
//! written in its framing, one attempt on an upstream server (the request
//! sent, the answer's head read), and the answer relayed.

use std::future::{Future, poll_fn};
use std::io;
use std::ops::Range;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use http::{Method, StatusCode};
use ratewarden_tower::admission::Refusal;
use ratewarden_tower::view::{Fields, RequestView};
use smallvec::SmallVec;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::time::Sleep;

use super::Conn;
use super::chunked::Chunks;
use super::reject_cache::write_rejection;
use super::request::{BodyLen, Head};
use super::response::{Framing, MAX_UPSTREAM_HEAD, UpHead, parse_response};
use super::with_id;
use super::write::{http_date, push_field, status_line, write_answer};
use crate::proxy::flow::{
    End, Flow, Line, Outcome, Own, Tap, Tried, Wire, grpc_kind, refusal_answer,
};
use crate::proxy::forward::{
    Edge, X_FORWARDED, dropped_request_field, drops_length, is_hop_by_hop, push_forwarded_for,
    tls_cause, upstream_target, x_forwarded_index, x_forwarded_values,
};
use crate::upstream::pool::{Pool, UpstreamError};
use crate::upstream::route::{Chosen, Group};
use crate::wire::idle::Watched;
use crate::wire::stream::{ClientIo, UpstreamIo};

/// Bytes read from the upstream at a time while relaying a body.
pub(crate) const RELAY: usize = 64 * 1024;
/// Bytes a client may pipeline while its request waits for the upstream's
/// answer and the wait still watches it (beyond them it is no longer
/// watched until the answer comes: the bytes wait in the socket).
const PIPELINED: usize = 64 * 1024;

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

/// The HTTP/1.1 path as a wire of the one flow ([`crate::proxy::flow`]):
/// the request read into `conn`'s buffers, the gateway's own answers and
/// the upstream's written on `io`.
pub(crate) struct H1<'c> {
    pub(crate) conn: &'c mut Conn,
    pub(crate) io: &'c mut Watched<ClientIo>,
    pub(crate) head: &'c Head,
    pub(crate) client: &'c crate::proxy::forward::Client,
    /// `underscores_in_headers`, read once.
    pub(crate) underscores: bool,
    /// The connection is answering (for the idle watchdog) until the
    /// answer's head is written.
    pub(crate) answering: Option<crate::wire::idle::Answering>,
    /// The target sent after the server's prefix when it is not the
    /// client's as it came (see [`crate::proxy::forward::upstream_target`]).
    rewritten: Option<String>,
    /// A chunked body's pieces joined, when a rule reads the body.
    joined: Option<Vec<u8>>,
    /// The body sent upstream in place of the client's, when a rule edited
    /// it ([`Wire::replace_body`]).
    replaced: Option<Vec<u8>>,
}

impl<'c> H1<'c> {
    pub(crate) fn new(
        conn: &'c mut Conn,
        io: &'c mut Watched<ClientIo>,
        head: &'c Head,
        client: &'c crate::proxy::forward::Client,
        underscores: bool,
    ) -> Self {
        let answering = Some(io.activity().answering());
        Self {
            conn,
            io,
            head,
            client,
            underscores,
            answering,
            rewritten: None,
            joined: None,
            replaced: None,
        }
    }

    /// The request's first field called `name`.
    fn field(&self, name: &[u8]) -> Option<&[u8]> {
        super::field(&self.conn.input, &self.conn.fields, name)
    }
}

impl Wire for H1<'_> {
    /// Whether the connection may carry another request.
    type Done = bool;
    type Head = (UpstreamIo, UpHead);

    fn request_id(&self) -> Option<&[u8]> {
        self.field(b"x-request-id")
    }

    fn trace_fields(&self) -> (Option<&[u8]>, Option<&[u8]>) {
        (self.field(b"traceparent"), self.field(b"tracestate"))
    }

    fn method(&self) -> &Method {
        &self.head.method
    }

    fn target(&self) -> &str {
        // Visible ASCII (`parse_request` checked it).
        std::str::from_utf8(&self.conn.input[self.head.target.clone()]).unwrap_or("/")
    }

    async fn read_body(&mut self, _flow: &Flow) -> Result<(), Edge> {
        // Read whole already; a chunked body's pieces joined for the rules.
        if self.conn.body.len() > 1 {
            let input = &self.conn.input;
            self.joined = Some(
                self.conn
                    .body
                    .iter()
                    .flat_map(|r| &input[r.clone()])
                    .copied()
                    .collect(),
            );
        }
        Ok(())
    }

    fn body(&self) -> Option<&[u8]> {
        match (&self.joined, self.conn.body.as_slice()) {
            (Some(j), _) => Some(j),
            (None, [one]) => self.conn.input.get(one.clone()),
            _ => None,
        }
    }

    fn replace_body(&mut self, body: Vec<u8>) {
        self.replaced = Some(body);
    }

    fn view<'a>(&'a self, path: &'a str, target: &'a str) -> RequestView<'a> {
        RequestView {
            method: &self.head.method,
            path,
            target,
            authority: None,
            fields: Fields::Raw {
                head: &self.conn.input[..self.head.len],
                spans: &self.conn.fields,
                underscores: self.underscores,
            },
            peer: Some(self.client.peer.ip()),
            sni: self.client.sni(),
            claims: None,
            body: None,
            consumer: None,
        }
    }

    async fn answer(&mut self, flow: &Flow, own: Own<'_>) -> io::Result<(bool, Outcome)> {
        let live = &flow.live;
        let close = self.head.close;
        let grpc = || grpc_kind(self.field(b"content-type"));
        let answer = match own {
            Own::Refused(Refusal::Limited(d))
                if grpc().is_none()
                    && crate::proxy::flow::shaped::shape_of(d, &live.config).is_none() =>
            {
                // The refusing rule's status, else the default; the bytes
                // from the thread's last rejection when they read the same.
                let status = Refusal::limited_status(d, live.config.status);
                let how = (status, live.config.headers);
                let c = &mut *self.conn;
                let body = write_rejection(&mut c.out, &mut c.rate, d, how, close, &flow.rid);
                self.io.write_all(&c.out).await?;
                self.io.flush().await?;
                self.answering = None;
                return Ok((!close, Outcome::own(status.as_u16(), Some(body as u64))));
            }
            Own::Refused(refusal) => refusal_answer(refusal, &live.config, grpc()),
            Own::Edge(e) => e.answer(),
            Own::Answer(a) => a,
            Own::Admitted(pass) => crate::answer::echo(
                &self.head.method,
                self.target(),
                &pass.identity,
                pass.decision.as_ref(),
                live.config.headers,
            ),
        };
        let status = answer.status().as_u16();
        let bytes = http_body::Body::size_hint(answer.body()).exact();
        write_answer(
            self.io,
            &mut self.conn.out,
            with_id(answer, &flow.rid),
            close,
        )
        .await?;
        self.answering = None;
        Ok((!close, Outcome::own(status, bytes)))
    }

    fn prepare(&mut self, flow: &Flow) -> Result<(), Edge> {
        self.rewritten = match upstream_target(self.target(), flow.live.config.upstream_path)? {
            std::borrow::Cow::Owned(t) => Some(t),
            std::borrow::Cow::Borrowed(_) => None,
        };
        // One deadline for every attempt.
        super::arm(&mut self.conn.timer, flow.live.config.upstream_timeout);
        Ok(())
    }

    async fn attempt(
        &mut self,
        flow: &Flow,
        chosen: &Chosen<'_>,
        group: &Group,
    ) -> Tried<Self::Head> {
        let server = chosen.server();
        self.conn.request_head(
            flow,
            group,
            server,
            self.client,
            self.head,
            (self.rewritten.as_deref(), self.replaced.as_deref()),
        );
        let c = &mut *self.conn;
        let timer = c.timer.as_mut().expect("armed by prepare");
        let answered = exchange_head(
            &server.pool,
            timer,
            &c.out,
            &mut c.up,
            &mut c.up_fields,
            &self.head.method,
            &mut ClientWatch::new(self.io, &mut c.input),
        )
        .await;
        match answered {
            Ok(head) => Tried::Answered(head),
            Err(Failed::Connect(e)) => Tried::Unsent(e),
            Err(Failed::Timeout) => Tried::TimedOut,
            Err(Failed::Broken(why, error)) => Tried::Broke(why, error),
            Err(Failed::ClientGone) => Tried::ClientGone,
        }
    }

    async fn relay(
        &mut self,
        mut end: End,
        decision: Option<ratewarden::Decision>,
        (mut up, resp): Self::Head,
        chosen: Chosen<'_>,
    ) -> io::Result<bool> {
        let close = self.head.close || resp.framing == Framing::Close;
        self.conn
            .response_head(&resp, end.flow(), decision.as_ref(), close);
        let outcome = Outcome {
            status: resp.status,
            from_upstream: true,
            ..Outcome::default()
        };
        if end.tap.reads() {
            for (name, value) in &self.conn.up_fields {
                let name = std::str::from_utf8(&self.conn.up[name.clone()]).unwrap_or("");
                end.tap.field(name, &self.conn.up[value.clone()]);
            }
        }
        // From here `up` holds the body bytes read so far.
        self.conn.up.advance(resp.len);
        let relayed = relay_body(self, &mut end, &resp, &mut up).await;
        // (Cut short, the tap counted what the client was sent.)
        if let Some(settle) = end.finish(outcome, || self.line()) {
            settle.await;
        }
        let ended_clean = relayed?;
        // (TLS: the last records may still wait in rustls; a no-op for TCP.)
        self.io.flush().await?;
        self.conn.up.clear();
        if resp.reusable && ended_clean {
            chosen.server().pool.put_stream(up);
        }
        Ok(!close)
    }

    fn gone(&mut self) -> bool {
        false
    }

    fn line(&self) -> Line<'_> {
        let (mut referer, mut user_agent) = (None, None);
        let input = &self.conn.input;
        // One pass over the fields for both; the length first.
        for (n, v) in &self.conn.fields {
            let name = &input[n.clone()];
            let slot = match name.len() {
                7 if name.eq_ignore_ascii_case(b"referer") => &mut referer,
                10 if name.eq_ignore_ascii_case(b"user-agent") => &mut user_agent,
                _ => continue,
            };
            if slot.is_none() {
                *slot = Some(&input[v.clone()]);
            }
        }
        Line {
            peer: self.client.peer.ip(),
            method: self.head.method.as_str(),
            target: &input[self.head.target.clone()],
            version: "HTTP/1.1",
            referer,
            user_agent,
        }
    }
}

/// Relays the body of the answer whose head is in the wire's `out`, its
/// first bytes in `up`; the request's leases are given back as it ends,
/// before its last write, so that a client sending its next request at
/// once finds its slot free. `Ok(true)` when it ended exactly where the
/// upstream stopped sending (the connection may be pooled).
async fn relay_body(
    w: &mut H1<'_>,
    end: &mut End,
    resp: &UpHead,
    up: &mut UpstreamIo,
) -> io::Result<bool> {
    let (out, body, io) = (&mut w.conn.out, &mut w.conn.up, &mut *w.io);
    Ok(match resp.framing {
        Framing::Empty => {
            end.release_leases().await;
            io.write_all(out).await?;
            body.is_empty()
        }
        Framing::Length(n) if body.len() as u64 >= n && n <= RELAY as u64 => {
            // The whole answer in one write.
            let n = n as usize;
            out.extend_from_slice(&body[..n]);
            end.release_leases().await;
            io.write_all(out).await?;
            end.tap.data(&body[..n]);
            body.len() == n
        }
        Framing::Length(n) => {
            io.write_all(out).await?;
            w.answering = None;
            relay_length(up, io, body, n, &mut end.tap).await?;
            end.release_leases().await;
            body.is_empty()
        }
        Framing::Chunked => {
            io.write_all(out).await?;
            w.answering = None;
            let clean = relay_chunked(up, io, body, &mut end.tap).await?;
            end.release_leases().await;
            clean
        }
        Framing::Close => {
            io.write_all(out).await?;
            w.answering = None;
            relay_to_close(up, io, body, &mut end.tap).await?;
            end.release_leases().await;
            false
        }
    })
}

impl Conn {
    /// The request to the upstream, in `out`: the target under the
    /// upstream's path prefix,
    /// dropped fields left out (hop-by-hop, and `_` names unless kept),
    /// `Host` set to the upstream's (the client's under `preserve_host`),
    /// the peer appended to `X-Forwarded-For`, `X-Forwarded-Host`, `-Proto`
    /// and `-Port` set (kept as sent only from a trusted proxy), then the
    /// body: as read, or decoded from chunks and sent with its length.
    pub(crate) fn request_head(
        &mut self,
        flow: &Flow,
        group: &Group,
        server: &crate::upstream::route::Server,
        client: &crate::proxy::forward::Client,
        head: &Head,
        (rewritten, replaced): (Option<&str>, Option<&[u8]>),
    ) {
        let (input, out) = (&self.input, &mut self.out);
        let live = &flow.live;
        let keep_underscores = live.config.underscores_in_headers;
        out.clear();
        out.extend_from_slice(head.method.as_str().as_bytes());
        out.push(b' ');
        out.extend_from_slice(server.prefix.as_bytes());
        match rewritten {
            Some(t) => out.extend_from_slice(t.as_bytes()),
            None => out.extend_from_slice(&input[head.target.clone()]),
        }
        out.extend_from_slice(b" HTTP/1.1\r\n");
        // `request_headers`: a Host it sets wins; the fields it sets or
        // removes are not the client's (most routes have none).
        let extra = &group.request_headers;
        let edits = !extra.set.is_empty() || !extra.remove.is_empty();
        let host = match extra.get("host") {
            Some(h) => Some(h),
            None if group.preserve_host => None,
            None => server.pool.host(),
        };
        if let Some(h) = host {
            push_field(out, b"host", h.as_bytes());
        }
        let trusted = live.config.trusts(client.peer.ip());
        // A client's own chain goes on only from a trusted proxy (or
        // under `x_forwarded_for: append`); else the peer replaces it.
        let keep_chain = trusted || live.config.x_forwarded_for_append;
        let (mut kept, mut asked) = ([false; 3], None);
        let mut chain: SmallVec<[&[u8]; 2]> = SmallVec::new();
        let forwarded = live.config.forwarded;
        let mut forwarded_chain: SmallVec<[&[u8]; 2]> = SmallVec::new();
        // An edited body goes with its own length.
        let replaced_body = replaced.is_some();
        // A sampled request's upstream gets our span as its parent.
        let traceparent = flow.trace.as_ref().and_then(|t| t.upstream_traceparent());
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
            } else if traceparent.is_some() && name.eq_ignore_ascii_case(b"traceparent") {
                // Ours goes instead.
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
                let replaced = (host.is_some() && is_host)
                    || (edits && extra.replaces(name))
                    || (replaced_body && name.eq_ignore_ascii_case(b"content-length"));
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
        if let Some(b) = replaced {
            push_field(
                out,
                b"content-length",
                itoa::Buffer::new().format(b.len()).as_bytes(),
            );
        } else if head.body == BodyLen::Chunked {
            let n: usize = self.body.iter().map(ExactSizeIterator::len).sum();
            push_field(
                out,
                b"content-length",
                itoa::Buffer::new().format(n).as_bytes(),
            );
        }
        push_field(out, b"x-request-id", flow.rid.as_bytes());
        if let Some(t) = &traceparent {
            push_field(out, b"traceparent", t);
        }
        let mut port = itoa::Buffer::new();
        let ours = x_forwarded_values(client, asked, &mut port);
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
            crate::proxy::forward::forwarded_element(out, client, asked);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(b"x-forwarded-for: ");
        push_forwarded_for(out, chain, client.peer.ip());
        out.extend_from_slice(b"\r\n\r\n");
        match replaced {
            Some(b) => out.extend_from_slice(b),
            None => {
                for span in &self.body {
                    out.extend_from_slice(&input[span.clone()]);
                }
            }
        }
    }

    /// The response head to the client, in `out`: the upstream's status and
    /// fields minus hop-by-hop ones, the framing this hop uses, the
    /// decision's rate-limit fields.
    pub(crate) fn response_head(
        &mut self,
        resp: &UpHead,
        flow: &Flow,
        decision: Option<&ratewarden::Decision>,
        close: bool,
    ) {
        let (up, out, rate) = (&self.up, &mut self.out, &mut self.rate);
        out.clear();
        let status = StatusCode::from_u16(resp.status).unwrap_or(StatusCode::BAD_GATEWAY);
        status_line(out, status, Some(&up[resp.reason.clone()]));
        rate.render(decision, flow.live.config.headers);
        // A rule with an LLM's refusal shape: the vendor's headers too, in
        // place of the upstream's.
        let vendor = decision.map_or_else(Vec::new, |d| {
            crate::proxy::flow::shaped::admitted_fields(d, &flow.live.config)
        });
        for (name, value) in &self.up_fields {
            let name_bytes = &up[name.clone()];
            let dropped = is_hop_by_hop(name_bytes)
                || vendor
                    .iter()
                    .any(|(v, _)| v.as_bytes().eq_ignore_ascii_case(name_bytes))
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
        push_field(out, b"x-request-id", flow.rid.as_bytes());
        for (name, value) in &vendor {
            push_field(out, name.as_bytes(), value.as_bytes());
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
    tap: &mut Tap,
) -> io::Result<()> {
    loop {
        let n = buf.len().min(left.try_into().unwrap_or(usize::MAX));
        io.write_all(&buf[..n]).await?;
        tap.data(&buf[..n]);
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
/// The tap counts the bytes as sent (framing included) and, when it reads
/// the body, is fed the chunks' data and the trailer fields, decoded.
pub(crate) async fn relay_chunked<S: AsyncWrite + Unpin>(
    up: &mut UpstreamIo,
    io: &mut S,
    buf: &mut BytesMut,
    tap: &mut Tap,
) -> io::Result<bool> {
    let mut chunks = Chunks::default();
    let (mut data, mut trailer) = (Vec::new(), Vec::new());
    loop {
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "bad chunked framing");
        let ended = if tap.reads() {
            data.clear();
            trailer.clear();
            chunks
                .decode(buf, &mut data, &mut trailer)
                .map_err(|_| bad())?
        } else {
            chunks.feed(buf).map_err(|_| bad())?
        };
        let n = ended.unwrap_or(buf.len());
        io.write_all(&buf[..n]).await?;
        tap.counted(n);
        if tap.reads() {
            for r in &data {
                tap.meter_data(&buf[r.clone()]);
            }
            for r in &trailer {
                let line = &buf[r.clone()];
                if let Some(colon) = line.iter().position(|&b| b == b':') {
                    let name = String::from_utf8_lossy(&line[..colon]).to_ascii_lowercase();
                    tap.trailer(name.trim(), line[colon + 1..].trim_ascii());
                }
            }
        }
        if let Some(end) = ended {
            return Ok(end == buf.len());
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
    tap: &mut Tap,
) -> io::Result<()> {
    loop {
        io.write_all(buf).await?;
        tap.data(buf);
        if refill(up, buf).await? == 0 {
            return Ok(());
        }
    }
}
