//! gRPC over TLS: through the TLS listener's h2, and to an https upstream
//! that chooses h2 by ALPN.

use super::*;

/// gRPC over the TLS listener's h2 (hyper's path), to an h2c tonic server:
/// a unary call's answer and trailers, a server stream's first message
/// before the stream ends, and a refusal as RESOURCE_EXHAUSTED, all over
/// one TLS connection with ALPN h2.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_the_tls_listener_streams_with_trailers_and_is_refused_as_grpc() {
    use prost::Message;
    use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
    // The tonic server.
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("svc", tonic_health::ServingStatus::Serving)
        .await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let _reporter = reporter;
        let incoming = futures_util::stream::unfold(listener, |l| async move {
            Some((l.accept().await.map(|(s, _)| s), l))
        });
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming(incoming)
            .await
            .unwrap();
    });
    let dir = scratch_dir("rw-tls-grpc");
    let ca = Ca::new("test ca");
    let (cert, key) = ca.issue(&["localhost"]);
    let (c, k) = (put(&dir, "s.pem", &cert), put(&dir, "s.key", &key));
    let yaml = format!(
        "tls: {{cert: {}, key: {}}}\nrules:\n  - {{name: calls, match: {{path_prefix: /grpc.health.v1.Health/}}, key: [global], limit: 2, window: 1h}}\n",
        c.display(),
        k.display()
    );
    let gw = gateway_in(&dir, &yaml, &format!("h2c://{server}")).await;
    let mut sender = h2_over_tls(gw.listen(), &ca).await;
    let call = |method: &str| {
        let msg = HealthCheckRequest {
            service: "svc".into(),
        }
        .encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
        framed.extend_from_slice(&msg);
        Request::post(format!("https://localhost/grpc.health.v1.Health/{method}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .body(Full::new(Bytes::from(framed)))
            .unwrap()
    };
    // Unary: one message, then trailers with grpc-status 0.
    let resp = sender.send_request(call("Check")).await.unwrap();
    assert_eq!(resp.status(), 200);
    let body = resp.into_body().collect().await.unwrap();
    let trailers = body.trailers().cloned().expect("trailers through");
    assert_eq!(trailers.get("grpc-status").unwrap(), "0");
    let bytes = body.to_bytes();
    let answer = HealthCheckResponse::decode(&bytes[5..]).unwrap();
    assert_eq!(answer.status, 1, "SERVING");
    // Server streaming: the first message arrives, the stream still open.
    let resp = sender.send_request(call("Watch")).await.unwrap();
    let mut body = resp.into_body();
    let first = tokio::time::timeout(Duration::from_secs(5), body.frame())
        .await
        .expect("streamed, not buffered")
        .unwrap()
        .unwrap();
    let data = first.into_data().expect("a message");
    assert_eq!(HealthCheckResponse::decode(&data[5..]).unwrap().status, 1);
    drop(body);
    // The limit (2 calls): refused as gRPC, trailers-only.
    let resp = sender.send_request(call("Check")).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers().get("grpc-status").unwrap(), "8");
    assert!(resp.headers().get("retry-after").is_some());
    gw.shutdown().await;
}

/// An `https://` upstream that chooses h2 by ALPN (a tonic server behind
/// TLS, its certificate from a private CA): a gRPC client's calls reach it
/// over HTTP/2, a unary call and a server stream with their trailers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_upstream_choosing_h2_by_alpn_serves_grpc_through_the_gateway() {
    use tonic_health::pb::HealthCheckRequest;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::health_client::HealthClient;
    let dir = scratch_dir("rw-tls-h2");
    let ca = Ca::new("private ca");
    let (reporter, health) = tonic_health::server::health_reporter();
    reporter
        .set_service_status("svc", tonic_health::ServingStatus::Serving)
        .await;
    let h2_connections = Arc::new(AtomicUsize::new(0));
    let port = h2_tls_server(&ca, health, h2_connections.clone()).await;
    let yaml = format!(
        "upstream_tls: {{ca: {}}}\nrules: []\n",
        put(&dir, "ca.pem", &ca.pem).display()
    );
    let gw = gateway_in(&dir, &yaml, &format!("https://localhost:{port}")).await;
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", gw.listen()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut client = HealthClient::new(channel);
    for _ in 0..3 {
        let r = client
            .check(HealthCheckRequest {
                service: "svc".into(),
            })
            .await
            .unwrap();
        assert_eq!(r.get_ref().status, ServingStatus::Serving as i32);
    }
    let e = client
        .check(HealthCheckRequest {
            service: "nope".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    let mut watch = client
        .watch(HealthCheckRequest {
            service: "svc".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(5), watch.message())
        .await
        .expect("streamed")
        .unwrap()
        .unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    drop((watch, client));
    assert_eq!(
        h2_connections.load(Ordering::SeqCst),
        1,
        "one HTTP/2 connection, chosen by ALPN, for every call"
    );
    gw.shutdown().await;
}

/// A TLS server on a free port of 127.0.0.1 that speaks h2 only (ALPN),
/// with a certificate for `localhost` from `ca`, serving the tonic service
/// `svc`; each connection that chose h2 is counted in `h2_connections`.
/// Returns its port.
async fn h2_tls_server<S>(ca: &Ca, svc: S, h2_connections: Arc<AtomicUsize>) -> u16
where
    S: tonic::codegen::Service<
            Request<tonic::body::Body>,
            Response = Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let (cert, key) = ca.issue(&["localhost"]);
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![der(&cert)],
            PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
        )
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                continue;
            };
            let (acceptor, svc, seen) = (acceptor.clone(), svc.clone(), h2_connections.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                if tls.get_ref().1.alpn_protocol() == Some(b"h2") {
                    seen.fetch_add(1, Ordering::SeqCst);
                }
                let service = service_fn(move |req: Request<Incoming>| {
                    let mut svc = svc.clone();
                    async move { svc.call(req.map(tonic::body::Body::new)).await }
                });
                let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    port
}

/// hyper's HTTP/2 client connection as the tower service tonic's client
/// takes (tonic's own transport here has no TLS).
#[derive(Clone)]
struct H2(hyper::client::conn::http2::SendRequest<tonic::body::Body>);

impl tonic::codegen::Service<Request<tonic::body::Body>> for H2 {
    type Response = Response<Incoming>;
    type Error = hyper::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Incoming>, hyper::Error>> + Send>,
    >;
    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), hyper::Error>> {
        self.0.poll_ready(cx)
    }
    fn call(&mut self, req: Request<tonic::body::Body>) -> Self::Future {
        Box::pin(self.0.send_request(req))
    }
}

/// A tonic client over TLS (ALPN h2) to `addr`, trusting `ca`.
async fn tonic_over_tls(addr: SocketAddr, ca: &Ca) -> tonic::client::Grpc<H2> {
    let sender = h2_over_tls(addr, ca).await;
    tonic::client::Grpc::with_origin(H2(sender), "https://localhost".parse().unwrap())
}

/// The gateway's TLS listener (h2, hyper's path) to an h2c tonic server:
/// all four kinds of call from a tonic client, then RESOURCE_EXHAUSTED.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_four_kinds_of_call_over_the_tls_listener() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let server = listener.local_addr().unwrap();
    let echo = grpc_echo::Echo::default();
    grpc_echo::serve(listener, echo.clone());
    let dir = scratch_dir("rw-tls-echo");
    let ca = Ca::new("test ca");
    let (cert, key) = ca.issue(&["localhost"]);
    let (c, k) = (put(&dir, "s.pem", &cert), put(&dir, "s.key", &key));
    let yaml = format!(
        "tls: {{cert: {}, key: {}}}\n{}",
        c.display(),
        k.display(),
        grpc_echo::RULE
    );
    let gw = gateway_in(&dir, &yaml, &format!("h2c://{server}")).await;
    let client = tonic_over_tls(gw.listen(), &ca).await;
    grpc_echo::all_four(client, &echo).await;
    gw.shutdown().await;
}

/// An https upstream speaking h2 only (a tonic server behind a private
/// CA's certificate): all four kinds of call through the gateway, the
/// server found by ALPN (`https://`) and given as `protocol: h2`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_four_kinds_of_call_to_an_https_h2_upstream() {
    let dir = scratch_dir("rw-tls-h2-echo");
    let ca = Ca::new("private ca");
    let echo = grpc_echo::Echo::default();
    let port = h2_tls_server(&ca, echo.clone(), Arc::new(AtomicUsize::new(0))).await;
    let ca_file = put(&dir, "ca.pem", &ca.pem);
    for server in [
        format!("https://localhost:{port}"),
        format!("{{url: \"https://localhost:{port}\", protocol: h2}}"),
    ] {
        let yaml = format!(
            "upstream_tls: {{ca: {}}}\nroutes:\n  - name: grpc\n    match: {{path_prefix: /}}\n    upstream: {{servers: [{server}]}}\n{}",
            ca_file.display(),
            grpc_echo::RULE
        );
        let gw = gateway_in(&dir, &yaml, "http://127.0.0.1:9").await;
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", gw.listen()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        grpc_echo::all_four(tonic::client::Grpc::new(channel), &echo).await;
        gw.shutdown().await;
    }
}
