//! `Upgrade` (WebSocket) requests: decided like any request, then sent to
//! a server on a connection of their own (one attempt of the flow's,
//! [`attempt`]); when it answers 101, both connections are spliced into a
//! byte tunnel until either side closes or nothing moves for
//! `client_idle_timeout`. The tunnel is one request: it holds a
//! `concurrency` slot while it is open (renewed), and its end is the
//! request's end phase.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::request::Parts;
use http::{Response, StatusCode, Version};
use http_body_util::{BodyExt, Empty};
use hyper::upgrade::OnUpgrade;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::answer::Body;
use crate::proxy::flow::Tried;
use crate::proxy::forward::{UpstreamFailure, aim, strip_hop_by_hop, upstream_failed};
use crate::upstream::route::{Group, Server};

/// An upstream's answer as hyper's path read it.
pub(crate) enum Answered {
    /// An answer to relay.
    Response(Response<Body>),
    /// A 101 that switched protocols: the answer, and the server's side of
    /// the tunnel.
    Tunnel(Response<Body>, OnUpgrade),
}

/// The protocol a request asks to switch to: an HTTP/1.1 request with
/// `Connection: upgrade` and an `Upgrade` field.
pub(crate) fn asked(parts: &Parts) -> Option<HeaderValue> {
    if parts.version != Version::HTTP_11 {
        return None;
    }
    let upgrade = parts
        .headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    if !upgrade {
        return None;
    }
    parts.headers.get(header::UPGRADE).cloned()
}

/// One attempt of an `Upgrade` request (`parts`, its fields already made
/// for the upstream by [`request_fields`]) on `server`: its own
/// connection, the upgrade asked for `protocol`, the answer's head read
/// within `timeout`.
pub(crate) async fn attempt(
    server: &Server,
    group: &Group,
    parts: &Parts,
    protocol: &HeaderValue,
    target: &str,
    timeout: Duration,
) -> Tried<Answered> {
    // HTTP/2 has no `Upgrade`: an HTTP/2-only server cannot take the
    // tunnel (the server is not at fault, so not counted as failed).
    if server.pool.is_h2() {
        return Tried::Answer(upstream_failed(
            &server.label,
            UpstreamFailure::Broken {
                why: "the server speaks HTTP/2 only, which has no Upgrade".into(),
                error: "an Upgrade request for an HTTP/2-only server".into(),
            },
        ));
    }
    let io = match tokio::time::timeout(timeout, server.pool.connect_stream()).await {
        Ok(Ok(io)) => io,
        Ok(Err(e)) => return Tried::Unsent(e),
        Err(_) => return Tried::TimedOut,
    };
    let mut req = http::Request::new(Empty::<bytes::Bytes>::new());
    *req.method_mut() = parts.method.clone();
    *req.headers_mut() = parts.headers.clone();
    if let Err(refused) = aim(&mut req, server, target, group) {
        return Tried::Answer(*refused);
    }
    req.headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    req.headers_mut().insert(header::UPGRADE, protocol.clone());
    let exchanged = tokio::time::timeout(timeout, async {
        let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
        crate::wire::spawn(async move {
            let _ = conn.with_upgrades().await;
        });
        sender.send_request(req).await
    })
    .await;
    let mut resp = match exchanged {
        Ok(Ok(r)) => r,
        Ok(Err(e)) => {
            return Tried::Broke("the exchange broke before an answer".into(), e.to_string());
        }
        Err(_) => return Tried::TimedOut,
    };
    if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
        // No tunnel: the server's answer, as any other.
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        parts
            .extensions
            .insert(crate::observe::metrics::FromUpstream);
        return Tried::Answered(Answered::Response(Response::from_parts(
            parts,
            body.map_err(|e| Box::new(e) as _).boxed_unsync(),
        )));
    }
    let up = hyper::upgrade::on(&mut resp);
    let (parts, _) = resp.into_parts();
    let mut answer = Response::new(crate::answer::empty_body());
    *answer.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    // The 101's fields as the server sent them (its Upgrade and Connection
    // included: they are what switches the client too).
    *answer.headers_mut() = parts.headers;
    answer
        .extensions_mut()
        .insert(crate::observe::metrics::FromUpstream);
    Tried::Answered(Answered::Tunnel(answer, up))
}

/// Splices the client's upgraded connection (`client`, once hyper hands it
/// over after the 101) with the server's, in a task of its own, then calls
/// `ended` (the request's end phase) with the bytes the client was sent,
/// when the tunnel has ended, however it ends.
pub(crate) fn splice_then(
    client: Option<OnUpgrade>,
    server: OnUpgrade,
    idle: Duration,
    ended: impl FnOnce(u64) + Send + 'static,
) {
    crate::wire::spawn(async move {
        let mut sent = 0;
        if let (Some(client), Ok(server)) = (client, server.await)
            && let Ok(client) = client.await
        {
            sent = splice(TokioIo::new(client), TokioIo::new(server), idle).await;
        }
        ended(sent);
    });
}

/// Copies bytes both ways until either side closes, or until nothing
/// moved either way for `idle`; the bytes `b` sent `a`.
async fn splice<A, B>(a: A, b: B, idle: Duration) -> u64
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    // Milliseconds from `start` to the last byte moved, either way.
    let last = AtomicU64::new(0);
    let (to_b, to_a) = (AtomicU64::new(0), AtomicU64::new(0));
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let one = pump(ar, bw, start, &last, &to_b);
    let two = pump(br, aw, start, &last, &to_a);
    let watchdog = async {
        let idle_ms = idle.as_millis() as u64;
        loop {
            tokio::time::sleep(idle / 4).await;
            let quiet = start.elapsed().as_millis() as u64 - last.load(Ordering::Relaxed);
            if quiet >= idle_ms {
                tracing::debug!(?idle, "tunnel idle: closed");
                return;
            }
        }
    };
    tokio::select! {
        _ = async { tokio::join!(one, two) } => {}
        () = watchdog => {}
    }
    to_a.load(Ordering::Relaxed)
}

/// Copies `from` to `to` until `from` ends or either side fails, noting in
/// `last` when bytes last moved; then shuts `to` for writing.
async fn pump<R, W>(mut from: R, mut to: W, start: Instant, last: &AtomicU64, moved: &AtomicU64)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).await.is_err() || to.flush().await.is_err() {
                    break;
                }
                last.store(start.elapsed().as_millis() as u64, Ordering::Relaxed);
                moved.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }
    let _ = to.shutdown().await;
}

/// The fields of an upgrade request that go to the server: none of the
/// hop-by-hop ones but `Upgrade` (set again by [`open`]).
pub(crate) fn request_fields(mut h: HeaderMap) -> HeaderMap {
    strip_hop_by_hop(&mut h);
    h.remove(HeaderName::from_static("upgrade"));
    h
}
