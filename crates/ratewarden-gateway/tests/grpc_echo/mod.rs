//! A gRPC service with all four kinds of call, served and called by
//! tonic itself (`tonic::server::Grpc`, `tonic::client::Grpc`), its
//! messages raw bytes through a codec of the test's own, so no code is
//! generated. Each streaming call proves it is not buffered on the way:
//!
//! - `Unary`: its message back; `missing` is answered NOT_FOUND;
//! - `Server`: for a message of one byte `n`, `n` messages `[0]`..`[n-1]`,
//!   the last only after the client has said (by `Echo::release`) that
//!   it read the first; a second byte `c`, if not 0, ends the stream with
//!   gRPC status `c` in its trailers (after the messages);
//! - `Client`: how many messages, and how many bytes, it was sent; the
//!   server signals `Echo::got_first` when the first one arrives, and the
//!   client sends the rest only then;
//! - `Bidi`: each message back as it arrives (ping-pong).
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use futures_util::{Stream, StreamExt};
use http::uri::PathAndQuery;
use tokio::sync::Notify;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::{Request, Response, Status, Streaming};

/// Messages as raw bytes.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Raw;

impl Codec for Raw {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Bytes;
    type Error = Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

/// The service's shared signals.
#[derive(Debug, Clone, Default)]
pub(crate) struct Echo {
    /// The client stream's first message reached the server.
    pub(crate) got_first: Arc<Notify>,
    /// The client read the server stream's first message.
    pub(crate) release: Arc<Notify>,
}

type BoxStream = Pin<Box<dyn Stream<Item = Result<Bytes, Status>> + Send>>;
type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// A closure as the tower service tonic's method handlers take.
struct Method<F>(F);

impl<F, Fut, Req, Resp> tonic::codegen::Service<Req> for Method<F>
where
    F: FnMut(Req) -> Fut,
    Fut: Future<Output = Result<Resp, Status>>,
{
    type Response = Resp;
    type Error = Status;
    type Future = Fut;
    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Status>> {
        Poll::Ready(Ok(()))
    }
    fn call(&mut self, req: Req) -> Fut {
        (self.0)(req)
    }
}

impl tonic::server::NamedService for Echo {
    const NAME: &'static str = "echo.Echo";
}

impl tonic::codegen::Service<http::Request<tonic::body::Body>> for Echo {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<tonic::body::Body>) -> Self::Future {
        let me = self.clone();
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(Raw);
            let path = req.uri().path().to_owned();
            Ok(match path.as_str() {
                "/echo.Echo/Unary" => {
                    grpc.unary(
                        Method(|r: Request<Bytes>| async move {
                            let m = r.into_inner();
                            if &m[..] == b"missing" {
                                Err(Status::not_found("no such thing"))
                            } else {
                                Ok(Response::new(m))
                            }
                        }),
                        req,
                    )
                    .await
                }
                "/echo.Echo/Server" => {
                    let release = me.release.clone();
                    grpc.server_streaming(
                        Method(move |r: Request<Bytes>| {
                            let release = release.clone();
                            async move {
                                let m = r.into_inner();
                                let n = m.first().copied().unwrap_or(0);
                                let code = m.get(1).copied().unwrap_or(0);
                                let s: BoxStream = futures_util::stream::unfold(0u8, move |i| {
                                    let release = release.clone();
                                    async move {
                                        if i == n && code != 0 {
                                            let status = Status::new(
                                                tonic::Code::from_i32(i32::from(code)),
                                                "ended as asked",
                                            );
                                            return Some((Err(status), i + 1));
                                        }
                                        if i >= n {
                                            return None;
                                        }
                                        // The last only once the client
                                        // has read the first.
                                        if i + 1 == n && n > 1 {
                                            release.notified().await;
                                        }
                                        Some((Ok(Bytes::from(vec![i])), i + 1))
                                    }
                                })
                                .boxed();
                                Ok(Response::new(s))
                            }
                        }),
                        req,
                    )
                    .await
                }
                "/echo.Echo/Client" => {
                    let got_first = me.got_first.clone();
                    grpc.client_streaming(
                        Method(move |r: Request<Streaming<Bytes>>| {
                            let got_first = got_first.clone();
                            async move {
                                let mut s = r.into_inner();
                                let (mut count, mut bytes) = (0u32, 0usize);
                                while let Some(m) = s.message().await? {
                                    if count == 0 {
                                        got_first.notify_one();
                                    }
                                    count += 1;
                                    bytes += m.len();
                                }
                                Ok(Response::new(Bytes::from(format!("{count}:{bytes}"))))
                            }
                        }),
                        req,
                    )
                    .await
                }
                "/echo.Echo/Bidi" => {
                    grpc.streaming(
                        Method(|r: Request<Streaming<Bytes>>| async move {
                            let s: BoxStream = r.into_inner().boxed();
                            Ok(Response::new(s))
                        }),
                        req,
                    )
                    .await
                }
                _ => Status::unimplemented(path).into_http(),
            })
        })
    }
}

/// A tonic server with [`Echo`] on `listener` (h2c).
pub(crate) fn serve(listener: tokio::net::TcpListener, echo: Echo) {
    let incoming = futures_util::stream::unfold(listener, |l| async move {
        Some((l.accept().await.map(|(s, _)| s), l))
    });
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(echo)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
}

/// A client of [`Echo`] on any tonic channel.
#[derive(Debug, Clone)]
pub(crate) struct Client<T>(pub tonic::client::Grpc<T>);

/// How long a streamed message may take: past it, something buffered.
const STREAMED: Duration = Duration::from_secs(5);

impl<T> Client<T>
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    async fn ready(&mut self) -> Result<(), Status> {
        self.0
            .ready()
            .await
            .map_err(|e| Status::unknown(format!("not ready: {}", e.into())))
    }

    /// `Unary`.
    pub(crate) async fn unary(&mut self, m: &'static [u8]) -> Result<Response<Bytes>, Status> {
        self.ready().await?;
        self.0
            .unary(
                Request::new(Bytes::from_static(m)),
                PathAndQuery::from_static("/echo.Echo/Unary"),
                Raw,
            )
            .await
    }

    /// `Server` for `n` messages: checks that the first arrives before
    /// the server sends the last, releases it, and returns them all.
    pub(crate) async fn server_stream(&mut self, echo: &Echo, n: u8) -> Result<Vec<Bytes>, Status> {
        self.ready().await?;
        let mut s = self
            .0
            .server_streaming(
                Request::new(Bytes::from(vec![n])),
                PathAndQuery::from_static("/echo.Echo/Server"),
                Raw,
            )
            .await?
            .into_inner();
        let first = tokio::time::timeout(STREAMED, s.message())
            .await
            .expect("the server stream's first message arrives before its last is sent")?
            .expect("a first message");
        echo.release.notify_one();
        let mut all = vec![first];
        while let Some(m) = s.message().await? {
            all.push(m);
        }
        Ok(all)
    }

    /// `Client` with `n` messages of `size` bytes: the second is sent only
    /// once the server has read the first. Returns the server's
    /// `count:bytes`.
    pub(crate) async fn client_stream(
        &mut self,
        echo: &Echo,
        n: u32,
        size: usize,
    ) -> Result<Response<Bytes>, Status> {
        self.ready().await?;
        let got_first = echo.got_first.clone();
        let messages = futures_util::stream::unfold(0u32, move |i| {
            let got_first = got_first.clone();
            async move {
                if i >= n {
                    return None;
                }
                if i == 1 {
                    tokio::time::timeout(STREAMED, got_first.notified())
                        .await
                        .expect("the client stream's first message reaches the server before the second is sent");
                }
                Some((Bytes::from(vec![b'x'; size]), i + 1))
            }
        });
        self.0
            .client_streaming(
                Request::new(messages),
                PathAndQuery::from_static("/echo.Echo/Client"),
                Raw,
            )
            .await
    }

    /// `Bidi`: `n` messages, each sent only after the answer to the one
    /// before came back. Returns the answers.
    pub(crate) async fn bidi(&mut self, n: u8) -> Result<Vec<Bytes>, Status> {
        self.ready().await?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Bytes>(1);
        let outgoing =
            futures_util::stream::unfold(
                rx,
                |mut rx| async move { rx.recv().await.map(|m| (m, rx)) },
            );
        tx.send(Bytes::from(vec![0])).await.unwrap();
        let mut answers = self
            .0
            .streaming(
                Request::new(outgoing),
                PathAndQuery::from_static("/echo.Echo/Bidi"),
                Raw,
            )
            .await?
            .into_inner();
        let mut got = vec![];
        for i in 0..n {
            let m = tokio::time::timeout(STREAMED, answers.message())
                .await
                .expect("each answer while the client's stream is open")?
                .expect("an answer");
            got.push(m);
            if i + 1 < n {
                tx.send(Bytes::from(vec![i + 1])).await.unwrap();
            }
        }
        drop(tx);
        assert!(answers.message().await?.is_none(), "the stream ended");
        Ok(got)
    }
}

/// Every kind of call, admitted, through `grpc`; the next call then gets
/// RESOURCE_EXHAUSTED with retry-after (the rule's limit, [`RULE`], is
/// exactly the calls made here: 5).
pub(crate) async fn all_four<T>(grpc: tonic::client::Grpc<T>, echo: &Echo)
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone,
    T::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let mut c = Client(grpc);
    let r = c.unary(b"hello").await.unwrap();
    assert_eq!(&r.get_ref()[..], b"hello");
    let e = c.unary(b"missing").await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert_eq!(e.message(), "no such thing", "the server's own status");
    let s = c.server_stream(echo, 3).await.unwrap();
    assert_eq!(s, [&[0u8][..], &[1], &[2]]);
    let r = c.client_stream(echo, 4, 1000).await.unwrap();
    assert_eq!(&r.get_ref()[..], b"4:4000");
    let b = c.bidi(3).await.unwrap();
    assert_eq!(b, [&[0u8][..], &[1], &[2]]);
    // The sixth call: over the limit, refused as gRPC clients understand.
    let refused = c.client_stream(echo, 1, 10).await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert!(
        refused.metadata().get("retry-after").is_some(),
        "{:?}",
        refused.metadata()
    );
}

/// The rule [`all_four`] expects, on every call of the service.
pub(crate) const RULE: &str = "rules:\n  - {name: echo, match: {path_prefix: /echo.Echo/}, key: [global], limit: 5, window: 1h}\n";
