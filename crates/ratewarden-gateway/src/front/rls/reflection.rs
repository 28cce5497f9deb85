//! Server reflection (v1 and v1alpha) on the RLS listener, in a build with
//! the `reflection` feature: tonic-reflection's services, over the
//! descriptors of the rate limit service and of `grpc.health.v1`, so that
//! a client without the .proto files (grpcurl) can list and call them. A
//! feature because it brings tonic and its descriptors into the build
//! (issue 38: the build's time), and Envoy, the service's client, never
//! asks.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;

use tonic::body::Body;
use tonic::codegen::Service;

/// A tonic service, called with a request, boxed.
type Call = Box<
    dyn Fn(http::Request<Body>) -> Pin<Box<dyn Future<Output = http::Response<Body>> + Send>>
        + Send
        + Sync,
>;

/// The two versions of the reflection service.
pub(super) struct Reflection {
    v1: Call,
    v1alpha: Call,
}

/// Whether `path` is a reflection method's.
pub(super) fn serves(path: &str) -> bool {
    path.starts_with("/grpc.reflection.v1.ServerReflection/")
        || path.starts_with("/grpc.reflection.v1alpha.ServerReflection/")
}

fn boxed<S>(service: S) -> Call
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    Box::new(move |req| {
        let mut service = service.clone();
        Box::pin(async move {
            match service.call(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            }
        })
    })
}

impl Reflection {
    /// Both versions over the service's descriptors; `None` if they do
    /// not load.
    pub(super) fn new() -> Option<Self> {
        let v1 = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(super::DESCRIPTORS)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1()
            .ok()?;
        let v1alpha = tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(super::DESCRIPTORS)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .build_v1alpha()
            .ok()?;
        Some(Reflection {
            v1: boxed(v1),
            v1alpha: boxed(v1alpha),
        })
    }

    /// Answers one reflection call.
    pub(super) async fn call(
        &self,
        req: http::Request<h2::RecvStream>,
        mut respond: h2::server::SendResponse<bytes::Bytes>,
    ) {
        let (head, body) = req.into_parts();
        let req = http::Request::from_parts(head, Body::new(H2Body(body)));
        let answer = if req.uri().path().starts_with("/grpc.reflection.v1.") {
            (self.v1)(req).await
        } else {
            (self.v1alpha)(req).await
        };
        send_streamed(&mut respond, answer).await;
    }
}

/// A request body from h2, as tonic's services read one.
struct H2Body(h2::RecvStream);

impl http_body::Body for H2Body {
    type Data = bytes::Bytes;
    type Error = h2::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<bytes::Bytes>, h2::Error>>> {
        use std::task::Poll;
        match self.0.poll_data(cx) {
            Poll::Ready(Some(Ok(d))) => {
                let _ = self.0.flow_control().release_capacity(d.len());
                Poll::Ready(Some(Ok(http_body::Frame::data(d))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e))),
            Poll::Ready(None) => match self.0.poll_trailers(cx) {
                Poll::Ready(Ok(Some(t))) => Poll::Ready(Some(Ok(http_body::Frame::trailers(t)))),
                Poll::Ready(Ok(None)) => Poll::Ready(None),
                Poll::Ready(Err(e)) => Poll::Ready(Some(Err(e))),
                Poll::Pending => Poll::Pending,
            },
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.0.is_end_stream()
    }
}

/// Sends a tonic service's answer (health, reflection: streams of any
/// length), as much at a time as the client's window takes.
async fn send_streamed(
    respond: &mut h2::server::SendResponse<bytes::Bytes>,
    answer: http::Response<tonic::body::Body>,
) {
    use http_body::Body as _;
    use http_body_util::BodyExt as _;
    let (head, mut body) = answer.into_parts();
    let end = body.is_end_stream();
    let Ok(mut send) = respond.send_response(http::Response::from_parts(head, ()), end) else {
        return;
    };
    if end {
        return;
    }
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(_) => {
                send.send_reset(h2::Reason::INTERNAL_ERROR);
                return;
            }
        };
        let mut data = match frame.into_data() {
            Ok(d) => d,
            Err(frame) => {
                if let Ok(t) = frame.into_trailers() {
                    let _ = send.send_trailers(t);
                }
                return;
            }
        };
        while !data.is_empty() {
            send.reserve_capacity(data.len());
            match std::future::poll_fn(|cx| send.poll_capacity(cx)).await {
                Some(Ok(0)) => continue,
                Some(Ok(n)) => {
                    let chunk = data.split_to(n.min(data.len()));
                    if send.send_data(chunk, false).is_err() {
                        return;
                    }
                }
                _ => return,
            }
        }
    }
    let _ = send.send_data(bytes::Bytes::new(), true);
}
