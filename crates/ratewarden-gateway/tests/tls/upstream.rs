//! https upstreams: a private CA, pooled connections, mTLS, and the 502s
//! that say why.

use super::*;

/// An https upstream: a TLS server with `cert`, asking for a client
/// certificate signed by `client_ca` when given. It answers who it is and
/// whether the gateway sent a certificate, and counts connections.
pub(super) struct TlsUpstream {
    addr: SocketAddr,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for TlsUpstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TlsUpstream {
    pub(super) async fn start(cert: &(String, String), client_ca: Option<&Ca>) -> Self {
        let b = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap();
        let b = match client_ca {
            None => b.with_no_client_auth(),
            Some(ca) => b.with_client_cert_verifier(
                rustls::server::WebPkiClientVerifier::builder_with_provider(
                    Arc::new(ca.roots()),
                    provider(),
                )
                .build()
                .unwrap(),
            ),
        };
        let config = b
            .with_single_cert(
                vec![der(&cert.0)],
                PrivateKeyDer::from_pem_slice(cert.1.as_bytes()).unwrap(),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let connections = Arc::new(AtomicUsize::new(0));
        let n = connections.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, n) = (acceptor.clone(), n.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    n.fetch_add(1, Ordering::SeqCst);
                    let client = tls.get_ref().1.peer_certificates().is_some();
                    let svc = service_fn(move |req: Request<Incoming>| async move {
                        let text = format!("tls upstream {} client-cert={client}", req.uri());
                        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from(text))))
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(tls), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            connections,
            task,
        }
    }

    pub(super) fn url(&self) -> String {
        format!("https://localhost:{}", self.addr.port())
    }
}

#[tokio::test]
async fn an_https_upstream_signed_by_a_private_ca_is_reached_over_pooled_connections() {
    let dir = scratch_dir("rw-tls");
    let ca = Ca::new("private ca");
    let up = TlsUpstream::start(&ca.issue(&["localhost"]), None).await;
    let yaml = format!(
        "upstream_tls: {{ca: {}}}\nrules: []\n",
        put(&dir, "ca.pem", &ca.pem).display()
    );
    let gw = gateway_in(&dir, &yaml, &up.url()).await;
    for i in 0..5 {
        let r = send(gw.listen(), "GET", &format!("/n/{i}"), &[], "").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body, format!("tls upstream /n/{i} client-cert=false"));
    }
    // HTTP/1.0 goes through hyper's path, to the same pool's kind of
    // connection.
    let r = support::binary_free_http10(gw.listen(), "/ten").await;
    assert!(r.contains("tls upstream /ten"), "{r}");
    assert!(
        up.connections.load(Ordering::SeqCst) <= 2,
        "kept alive and reused: {} TLS connections for 6 requests",
        up.connections.load(Ordering::SeqCst)
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn mtls_to_the_upstream_and_a_refused_or_missing_client_certificate() {
    let dir = scratch_dir("rw-tls");
    let ca = Ca::new("private ca");
    let clients = Ca::new("client ca");
    let up = TlsUpstream::start(&ca.issue(&["upstream.internal"]), Some(&clients)).await;
    let me = clients.issue(&["gateway"]);
    let ca_file = put(&dir, "ca.pem", &ca.pem);
    let (c, k) = (put(&dir, "me.pem", &me.0), put(&dir, "me.key", &me.1));
    // The upstream is addressed by IP; its certificate names another host.
    let url = format!("https://127.0.0.1:{}", up.addr.port());
    let yaml = format!(
        "upstream_tls: {{ca: {}, server_name: upstream.internal, client_cert: {}, client_key: {}}}\nrules: []\n",
        ca_file.display(),
        c.display(),
        k.display()
    );
    let gw = gateway_in(&dir, &yaml, &url).await;
    let r = send(gw.listen(), "GET", "/m", &[], "").await;
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.body, "tls upstream /m client-cert=true");
    gw.shutdown().await;

    // Without the client certificate: the upstream refuses the handshake.
    let dir = scratch_dir("rw-tls");
    let yaml = format!(
        "upstream_tls: {{ca: {}, server_name: upstream.internal}}\nrules: []\n",
        put(&dir, "ca.pem", &ca.pem).display()
    );
    let gw = gateway_in(&dir, &yaml, &url).await;
    let r = send(gw.listen(), "GET", "/m", &[], "").await;
    assert_eq!(r.status, 502);
    assert!(
        r.body
            .contains("the TLS handshake failed: received fatal alert: CertificateRequired"),
        "{}",
        r.body
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn an_upstream_certificate_from_another_ca_or_for_another_name_is_a_502_saying_why() {
    let dir = scratch_dir("rw-tls");
    let trusted = Ca::new("trusted");
    let other = Ca::new("other");
    let up = TlsUpstream::start(&other.issue(&["localhost"]), None).await;
    let yaml = format!(
        "upstream_tls: {{ca: {}}}\nrules: []\n",
        put(&dir, "ca.pem", &trusted.pem).display()
    );
    let gw = gateway_in(&dir, &yaml, &up.url()).await;
    for _ in 0..2 {
        // (Twice: no failed connection is pooled.)
        let r = send(gw.listen(), "GET", "/", &[], "").await;
        assert_eq!(r.status, 502);
        assert_eq!(r.header("content-type"), Some("application/problem+json"));
        assert!(
            r.body
                .contains("the TLS handshake failed: invalid peer certificate: UnknownIssuer"),
            "{}",
            r.body
        );
    }
    // hyper's path (HTTP/1.0) says the same.
    let r = support::binary_free_http10(gw.listen(), "/").await;
    assert!(
        r.starts_with("HTTP/1.0 502") || r.starts_with("HTTP/1.1 502"),
        "{r}"
    );
    assert!(r.contains("UnknownIssuer"), "{r}");
    assert_eq!(
        up.connections.load(Ordering::SeqCst),
        0,
        "no request got through"
    );
    gw.shutdown().await;

    // The right CA, the wrong name.
    let up = TlsUpstream::start(&trusted.issue(&["elsewhere.test"]), None).await;
    let gw = gateway_in(&dir, &yaml, &up.url()).await;
    let r = send(gw.listen(), "GET", "/", &[], "").await;
    assert_eq!(r.status, 502);
    assert!(
        r.body
            .contains("certificate not valid for name \\\"localhost\\\""),
        "{}",
        r.body
    );
    gw.shutdown().await;
}
