//! `client_max_body_size`: a request body over the bound is a 413, on the
//! HTTP/1.1 path and on hyper's (HTTP/2), for a declared length and for a
//! body whose length is not declared (chunked, or an HTTP/2 stream).

mod support;

use std::convert::Infallible;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::Frame;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use support::{Upstream, gateway};

const YAML: &str = "client_max_body_size: 1k\nrules: []\n";

/// A POST of `body` (its length declared) over HTTP/1.1 or h2c.
async fn post(addr: std::net::SocketAddr, h2: bool, body: Vec<u8>) -> StatusCode {
    let mut b = Client::builder(TokioExecutor::new());
    b.http2_only(h2);
    let client = b.build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/"))
        .body(Full::new(Bytes::from(body)))
        .unwrap();
    client.request(req).await.unwrap().status()
}

#[tokio::test]
async fn a_declared_length_over_the_bound_is_a_413_on_both_paths() {
    let up = Upstream::start().await;
    let gw = gateway(YAML, &up.url(), None).await;
    for h2 in [false, true] {
        assert_eq!(
            post(gw.listen(), h2, vec![b'a'; 1024]).await,
            StatusCode::OK
        );
        assert_eq!(
            post(gw.listen(), h2, vec![b'a'; 1025]).await,
            StatusCode::PAYLOAD_TOO_LARGE,
            "h2: {h2}"
        );
    }
    assert_eq!(up.hits(), 2, "a refused body never reaches the upstream");
    gw.shutdown().await;
    // The default is nginx's 1 MiB; 0 is no bound.
    let gw = gateway("rules: []\n", &up.url(), None).await;
    assert_eq!(
        post(gw.listen(), false, vec![b'a'; (1 << 20) + 1]).await,
        StatusCode::PAYLOAD_TOO_LARGE
    );
    gw.shutdown().await;
    let gw = gateway("client_max_body_size: 0\nrules: []\n", &up.url(), None).await;
    assert_eq!(
        post(gw.listen(), false, vec![b'a'; (1 << 20) + 1]).await,
        StatusCode::OK
    );
    gw.shutdown().await;
}

/// A chunked body on the HTTP/1.1 path, over the bound once decoded.
#[tokio::test]
async fn a_chunked_body_over_the_bound_is_a_413() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = Upstream::start().await;
    let gw = gateway(YAML, &up.url(), None).await;
    let chunk = format!("258\r\n{}\r\n", "a".repeat(600));
    for (chunks, want) in [(1, "HTTP/1.1 200"), (2, "HTTP/1.1 413")] {
        let mut s = tokio::net::TcpStream::connect(gw.listen()).await.unwrap();
        let mut req =
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
                .to_owned();
        for _ in 0..chunks {
            req.push_str(&chunk);
        }
        req.push_str("0\r\n\r\n");
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = Vec::new();
        s.read_to_end(&mut out).await.unwrap();
        let out = String::from_utf8_lossy(&out);
        assert!(out.starts_with(want), "{chunks} chunks: {out}");
    }
    assert_eq!(up.hits(), 1);
    gw.shutdown().await;
}

/// An HTTP/2 body with no declared length, streamed past the bound.
#[tokio::test]
async fn an_h2_stream_past_the_bound_is_a_413() {
    let up = Upstream::start().await;
    let gw = gateway(YAML, &up.url(), None).await;
    let mut b = Client::builder(TokioExecutor::new());
    b.http2_only(true);
    let client = b.build_http();
    for (frames, want) in [(1, StatusCode::OK), (3, StatusCode::PAYLOAD_TOO_LARGE)] {
        let chunks: Vec<Result<Frame<Bytes>, Infallible>> = (0..frames)
            .map(|_| Ok(Frame::data(Bytes::from(vec![b'a'; 600]))))
            .collect();
        let body = StreamBody::new(futures_util::stream::iter(chunks)).boxed();
        let req = Request::post(format!("http://{}/", gw.listen()))
            .body(body)
            .unwrap();
        let resp = client.request(req).await.unwrap();
        assert_eq!(resp.status(), want, "{frames} frames of 600 bytes");
    }
    gw.shutdown().await;
}

/// A chunked HTTP/1.1 body past 64 KiB is streamed by hyper's path: one
/// that grows past the bound there is a 413 too.
#[tokio::test]
async fn a_long_chunked_body_streamed_by_hyper_past_the_bound_is_a_413() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let up = Upstream::start().await;
    let gw = gateway("client_max_body_size: 100k\nrules: []\n", &up.url(), None).await;
    // 16 KiB chunks: 4 (64 KiB) fit, 8 (128 KiB) do not.
    let chunk = format!("4000\r\n{}\r\n", "a".repeat(16 * 1024));
    for (chunks, want) in [(4, "HTTP/1.1 200"), (8, "HTTP/1.1 413")] {
        let mut s = tokio::net::TcpStream::connect(gw.listen()).await.unwrap();
        let head =
            "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n";
        s.write_all(head.as_bytes()).await.unwrap();
        for _ in 0..chunks {
            // The gateway may answer and close before the last chunks.
            if s.write_all(chunk.as_bytes()).await.is_err() {
                break;
            }
        }
        let _ = s.write_all(b"0\r\n\r\n").await;
        let mut out = Vec::new();
        let _ = s.read_to_end(&mut out).await;
        let out = String::from_utf8_lossy(&out);
        assert!(
            out.starts_with(want),
            "{chunks} chunks: {}",
            &out[..out.len().min(200)]
        );
    }
    gw.shutdown().await;
}
