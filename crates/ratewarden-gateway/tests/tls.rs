//! TLS end to end, with certificates made for each test (rcgen): the
//! listener over HTTP/1.1 (on the gateway's own path) and h2, certificates
//! chosen by SNI and renewed in place, client certificates on the admin
//! listener, https upstreams signed by a private CA (pooled, with and
//! without a client certificate, and a wrong CA), Redis over TLS, and seed
//! 002's file against a local https upstream.

#[path = "../../ratewarden/tests/common/mod.rs"]
mod common;
mod grpc_echo;
mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::net::TcpStream;

use support::{Upstream, gateway_file, scratch_dir, send};

/// A certificate authority for one test.
struct Ca {
    params: CertificateParams,
    key: KeyPair,
    pem: String,
}

impl Ca {
    fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().unwrap();
        let pem = params.self_signed(&key).unwrap().pem();
        Self { params, key, pem }
    }

    /// A certificate for `names` (DNS names or IP addresses) and its key, PEM.
    fn issue(&self, names: &[&str]) -> (String, String) {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names.clone()).unwrap();
        params
            .distinguished_name
            .push(DnType::CommonName, &names[0]);
        let key = KeyPair::generate().unwrap();
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn roots(&self) -> rustls::RootCertStore {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(self.pem.as_bytes()).unwrap())
            .unwrap();
        roots
    }
}

/// Writes `text` to `dir/name`; the path.
fn put(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// A certificate's DER from its PEM.
fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).unwrap()
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    ratewarden_gateway::tls::provider()
}

/// A TLS client trusting `ca`, offering `alpn`, with a client certificate
/// when given.
fn client_config(
    ca: &Ca,
    alpn: &[&[u8]],
    client: Option<&(String, String)>,
) -> Arc<rustls::ClientConfig> {
    let b = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(ca.roots());
    let mut c = match client {
        None => b.with_no_client_auth(),
        Some((cert, key)) => b
            .with_client_auth_cert(
                vec![der(cert)],
                PrivateKeyDer::from_pem_slice(key.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    c.alpn_protocols = alpn.iter().map(|a| a.to_vec()).collect();
    Arc::new(c)
}

type Tls = tokio_rustls::client::TlsStream<TcpStream>;

async fn connect(
    addr: SocketAddr,
    name: &str,
    config: Arc<rustls::ClientConfig>,
) -> std::io::Result<Tls> {
    let tcp = TcpStream::connect(addr).await?;
    let name = ServerName::try_from(name.to_owned()).unwrap();
    tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
}

/// The certificate the server showed.
fn shown(s: &Tls) -> CertificateDer<'static> {
    s.get_ref().1.peer_certificates().unwrap()[0]
        .clone()
        .into_owned()
}

/// An HTTP/1.1 connection over `s`.
async fn h1(s: Tls) -> hyper::client::conn::http1::SendRequest<Empty<Bytes>> {
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .unwrap();
    tokio::spawn(conn);
    sender
}

async fn get(
    sender: &mut hyper::client::conn::http1::SendRequest<Empty<Bytes>>,
    path: &str,
) -> (StatusCode, String) {
    let req = Request::get(path)
        .header("host", "localhost")
        .body(Empty::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// An HTTP/2 connection over TLS to `addr` as `localhost`, trusting `ca`,
/// h2 chosen by ALPN (asserted).
async fn h2_over_tls<B>(addr: SocketAddr, ca: &Ca) -> hyper::client::conn::http2::SendRequest<B>
where
    B: http_body::Body + Send + Unpin + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let s = connect(addr, "localhost", client_config(ca, &[b"h2"], None))
        .await
        .unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    let (sender, conn) =
        hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    sender
}

/// A gateway started from `yaml` written to a file in `dir` (so that it
/// watches the file and the TLS files it names).
async fn gateway_in(dir: &Path, yaml: &str, upstream: &str) -> ratewarden_gateway::server::Running {
    let file = put(dir, "ratewarden.yaml", yaml);
    gateway_file(yaml, upstream, None, Some(file)).await
}

#[tokio::test]
async fn the_tls_listener_serves_http1_and_h2_and_limits_over_both() {
    let dir = scratch_dir("rw-tls");
    let ca = Ca::new("test ca");
    let (cert, key) = ca.issue(&["localhost"]);
    let (c, k) = (put(&dir, "s.pem", &cert), put(&dir, "s.key", &key));
    let up = Upstream::start().await;
    let yaml = format!(
        "tls: {{cert: {}, key: {}}}\nrules:\n  - {{name: three, limit: 3, window: 1h}}\n",
        c.display(),
        k.display()
    );
    let gw = gateway_in(&dir, &yaml, &up.url()).await;

    // HTTP/1.1, chosen by ALPN.
    let s = connect(
        gw.listen,
        "localhost",
        client_config(&ca, &[b"http/1.1"], None),
    )
    .await
    .unwrap();
    assert_eq!(s.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    assert_eq!(shown(&s), der(&cert));
    let mut h = h1(s).await;
    let (status, body) = get(&mut h, "/hello").await;
    assert_eq!(status, 200);
    assert!(body.starts_with("xff=127.0.0.1;"), "{body}");
    // Kept alive: a second request on the same TLS connection.
    assert_eq!(get(&mut h, "/again").await.0, 200);

    // h2, chosen by ALPN: the same rule counts across both.
    let mut sender = h2_over_tls(gw.listen, &ca).await;
    let mut statuses = vec![];
    for _ in 0..2 {
        let req = Request::get("https://localhost/h2")
            .body(Empty::<Bytes>::new())
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.version(), Version::HTTP_2);
        statuses.push(resp.status().as_u16());
    }
    assert_eq!(statuses, [200, 429], "three allowed in all, over both");
    assert_eq!(up.hits(), 3);

    // TLS 1.2 too (the limit is spent: a 429 over it).
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS12])
        .unwrap()
        .with_root_certificates(ca.roots())
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let s = connect(gw.listen, "localhost", Arc::new(cfg))
        .await
        .unwrap();
    assert_eq!(
        s.get_ref().1.protocol_version(),
        Some(rustls::ProtocolVersion::TLSv1_2)
    );
    assert_eq!(get(&mut h1(s).await, "/twelve").await.0, 429);

    // A plain-text request to the TLS port is no request at all.
    let plain = tokio::time::timeout(
        Duration::from_secs(5),
        support::client().get(format!("http://{}/", gw.listen).parse().unwrap()),
    )
    .await
    .unwrap();
    assert!(plain.is_err(), "cleartext must not be served");
    assert_eq!(up.hits(), 3);
    gw.shutdown().await;
}

/// The gateway's own HTTP/1.1 path serves TLS connections: driven
/// directly, with a hand-over to hyper that would record being used.
/// Behind the TLS listener the upstream is told the client came over
/// https, on the listener's port, for the Host it asked for, on HTTP/1.1
/// and on h2; a client's own `X-Forwarded-Proto: http` is replaced.
#[tokio::test]
async fn the_tls_listener_tells_the_upstream_https() {
    let dir = scratch_dir("rw-tls");
    let ca = Ca::new("test ca");
    let (cert, key) = ca.issue(&["localhost"]);
    let (c, k) = (put(&dir, "s.pem", &cert), put(&dir, "s.key", &key));
    let up = Upstream::start().await;
    let yaml = format!(
        "tls: {{cert: {}, key: {}}}\npreserve_host: true\nrequest_headers: {{set: {{X-Env: tls}}}}\nrules: []\n",
        c.display(),
        k.display()
    );
    let gw = gateway_in(&dir, &yaml, &up.url()).await;
    let port = gw.listen.port().to_string();
    let field = |body: &str, name: &str| -> Vec<String> {
        body.lines()
            .filter_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_owned))
            .collect()
    };
    // HTTP/1.1: the gateway's own path.
    let s = connect(
        gw.listen,
        "localhost",
        client_config(&ca, &[b"http/1.1"], None),
    )
    .await
    .unwrap();
    let mut h = h1(s).await;
    let req = Request::get("/headers")
        .header("host", "localhost")
        .header("x-forwarded-proto", "http")
        .body(Empty::new())
        .unwrap();
    let resp = h.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(field(&body, "x-forwarded-proto"), ["https"], "{body}");
    assert_eq!(field(&body, "x-forwarded-port"), [port.as_str()], "{body}");
    assert_eq!(field(&body, "x-forwarded-host"), ["localhost"], "{body}");
    // `preserve_host` and `request_headers` behind the TLS listener too.
    assert_eq!(field(&body, "host"), ["localhost"], "{body}");
    assert_eq!(field(&body, "x-env"), ["tls"], "{body}");
    // h2: hyper's path.
    let s = connect(gw.listen, "localhost", client_config(&ca, &[b"h2"], None))
        .await
        .unwrap();
    let (mut sender, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        TokioIo::new(s),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let req = Request::get(format!("https://localhost:{port}/headers"))
        .body(Empty::<Bytes>::new())
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body).into_owned();
    assert_eq!(field(&body, "x-forwarded-proto"), ["https"], "{body}");
    assert_eq!(field(&body, "x-forwarded-port"), [port.as_str()], "{body}");
    assert_eq!(
        field(&body, "x-forwarded-host"),
        [format!("localhost:{port}")],
        "{body}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn tls_connections_are_served_by_the_http1_path_not_handed_to_hyper() {
    use ratewarden_gateway::wire::idle::{Activity, Watched};
    use ratewarden_gateway::wire::stream::ClientIo;

    let dir = scratch_dir("rw-tls");
    let ca = Ca::new("test ca");
    let (cert, key) = ca.issue(&["localhost"]);
    let (c, k) = (put(&dir, "s.pem", &cert), put(&dir, "s.key", &key));
    let up = Upstream::start().await;
    let yaml = format!(
        "tls: {{cert: {}, key: {}}}\nrules:\n  - {{name: one, limit: 1, window: 1h}}\n",
        c.display(),
        k.display()
    );
    let overrides = ratewarden_gateway::config::Overrides {
        upstream: Some(up.url()),
        ..Default::default()
    };
    let config = ratewarden_gateway::config::load(&yaml, "t.yaml", &overrides).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(config.tls.as_ref().unwrap().config.clone());
    let gw = ratewarden_gateway::gateway::Gateway::new(config, None).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let handed = Arc::new(AtomicBool::new(false));
    let h = handed.clone();
    let server = tokio::spawn(async move {
        let (tcp, peer) = listener.accept().await.unwrap();
        let tls = acceptor.accept(tcp).await.unwrap();
        let io = Watched::new(ClientIo::Tls(Box::new(tls)), Arc::new(Activity::default()));
        let (_stop, stopped) = tokio::sync::watch::channel(false);
        let client = ratewarden_gateway::proxy::forward::Client {
            peer,
            tls: true,
            port: addr.port(),
            sni: None,
        };
        ratewarden_gateway::proxy::serve_connection(
            gw,
            io,
            client,
            stopped,
            move |_io| async move {
                h.store(true, Ordering::SeqCst);
                Ok::<(), std::io::Error>(())
            },
        )
        .await
    });
    let s = connect(addr, "localhost", client_config(&ca, &[b"http/1.1"], None))
        .await
        .unwrap();
    let mut h = h1(s).await;
    assert_eq!(get(&mut h, "/a").await.0, 200);
    assert_eq!(get(&mut h, "/b").await.0, 429);
    drop(h);
    server.await.unwrap().unwrap();
    assert!(!handed.load(Ordering::SeqCst), "served without hyper");
    assert_eq!(up.hits(), 1);
}

#[tokio::test]
async fn sni_chooses_the_certificate_and_an_unknown_name_gets_the_first() {
    let dir = scratch_dir("rw-tls");
    let ca = Ca::new("test ca");
    let (a_cert, a_key) = ca.issue(&["a.test"]);
    let (b_cert, b_key) = ca.issue(&["*.b.test"]);
    let yaml = format!(
        "tls:\n  certificates:\n    - {{cert: {}, key: {}}}\n    - {{cert: {}, key: {}}}\nrules: []\n",
        put(&dir, "a.pem", &a_cert).display(),
        put(&dir, "a.key", &a_key).display(),
        put(&dir, "b.pem", &b_cert).display(),
        put(&dir, "b.key", &b_key).display(),
    );
    let gw = gateway_in(&dir, &yaml, "echo").await;
    let cfg = client_config(&ca, &[b"http/1.1"], None);
    let s = connect(gw.listen, "www.b.test", cfg.clone()).await.unwrap();
    assert_eq!(shown(&s), der(&b_cert), "the wildcard's certificate");
    let s = connect(gw.listen, "a.test", cfg.clone()).await.unwrap();
    assert_eq!(shown(&s), der(&a_cert));
    // No certificate covers it: the first is shown, and the client refuses it.
    let err = connect(gw.listen, "c.test", cfg).await.unwrap_err();
    assert!(
        err.to_string().contains("certificate not valid for name"),
        "{err}"
    );
    gw.shutdown().await;
}

#[tokio::test]
async fn a_renewed_certificate_serves_new_connections_and_a_bad_one_is_ignored() {
    let dir = scratch_dir("rw-tls");
    let ca = Ca::new("test ca");
    let (old_cert, old_key) = ca.issue(&["localhost"]);
    let (c, k) = (put(&dir, "s.pem", &old_cert), put(&dir, "s.key", &old_key));
    let up = Upstream::start().await;
    let yaml = format!(
        "tls: {{cert: {}, key: {}}}\nrules: []\n",
        c.display(),
        k.display()
    );
    let gw = gateway_in(&dir, &yaml, &up.url()).await;
    let cfg = client_config(&ca, &[b"http/1.1"], None);
    let before = connect(gw.listen, "localhost", cfg.clone()).await.unwrap();
    assert_eq!(shown(&before), der(&old_cert));
    let mut kept = h1(before).await;
    assert_eq!(get(&mut kept, "/").await.0, 200);

    // Renewed in place, as certbot does: the key, then the certificate.
    let (new_cert, new_key) = ca.issue(&["localhost"]);
    std::fs::write(&k, &new_key).unwrap();
    std::fs::write(&c, &new_cert).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = connect(gw.listen, "localhost", cfg.clone()).await.unwrap();
        if shown(&s) == der(&new_cert) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the renewed certificate was never served"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The connection opened before still works.
    assert_eq!(get(&mut kept, "/still").await.0, 200);

    // A key that is not the certificate's: the reload fails, is counted,
    // and the renewed certificate keeps being served.
    let (_, stray_key) = ca.issue(&["localhost"]);
    std::fs::write(&k, &stray_key).unwrap();
    let metrics =
        |admin: SocketAddr| async move { send(admin, "GET", "/metrics", &[], "").await.body };
    let admin = gw.admin.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !metrics(admin)
        .await
        .contains("ratewarden_config_reloads_total{result=\"failure\"} 1")
    {
        assert!(Instant::now() < deadline, "the bad pair was never tried");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = connect(gw.listen, "localhost", cfg).await.unwrap();
    assert_eq!(shown(&s), der(&new_cert));
    gw.shutdown().await;
}

#[tokio::test]
async fn the_admin_listener_can_require_a_client_certificate_instead_of_a_token() {
    let dir = scratch_dir("rw-tls");
    let ca = Ca::new("server ca");
    let clients = Ca::new("client ca");
    let (cert, key) = ca.issue(&["localhost"]);
    let yaml = format!(
        "admin:\n  tls: {{cert: {}, key: {}, client_ca: {}}}\nrules: []\n",
        put(&dir, "s.pem", &cert).display(),
        put(&dir, "s.key", &key).display(),
        put(&dir, "clients.pem", &clients.pem).display(),
    );
    let gw = gateway_in(&dir, &yaml, "echo").await;
    let admin = gw.admin.unwrap();
    // Without a client certificate: no handshake, no answer.
    let refused = async {
        let s = connect(admin, "localhost", client_config(&ca, &[b"http/1.1"], None)).await?;
        // TLS 1.3: the refusal arrives with the first read.
        let mut h = hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(s))
            .await
            .map_err(std::io::Error::other)?;
        tokio::spawn(h.1);
        let req = Request::get("/healthz").body(Empty::new()).unwrap();
        h.0.send_request(req).await.map_err(std::io::Error::other)?;
        Ok::<(), std::io::Error>(())
    };
    assert!(refused.await.is_err());
    // A certificate the client CA signed: in.
    let me = clients.issue(&["operator"]);
    let s = connect(
        admin,
        "localhost",
        client_config(&ca, &[b"http/1.1"], Some(&me)),
    )
    .await
    .unwrap();
    let mut h = h1(s).await;
    assert_eq!(
        get(&mut h, "/healthz").await,
        (StatusCode::OK, "ok\n".into())
    );
    // One signed by another CA: refused.
    let stranger = Ca::new("other").issue(&["operator"]);
    let s = connect(
        admin,
        "localhost",
        client_config(&ca, &[b"http/1.1"], Some(&stranger)),
    )
    .await;
    let failed = match s {
        Err(_) => true,
        Ok(s) => {
            let mut h = h1(s).await;
            let req = Request::get("/healthz").body(Empty::new()).unwrap();
            h.send_request(req).await.is_err()
        }
    };
    assert!(failed, "a client certificate from another CA");
    // The proxy listener stays plain.
    assert_eq!(send(gw.listen, "GET", "/", &[], "").await.status, 200);
    gw.shutdown().await;
}

/// An https upstream: a TLS server with `cert`, asking for a client
/// certificate signed by `client_ca` when given. It answers who it is and
/// whether the gateway sent a certificate, and counts connections.
struct TlsUpstream {
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
    async fn start(cert: &(String, String), client_ca: Option<&Ca>) -> Self {
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

    fn url(&self) -> String {
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
        let r = send(gw.listen, "GET", &format!("/n/{i}"), &[], "").await;
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.body, format!("tls upstream /n/{i} client-cert=false"));
    }
    // HTTP/1.0 goes through hyper's path, to the same pool's kind of
    // connection.
    let r = support::binary_free_http10(gw.listen, "/ten").await;
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
    let r = send(gw.listen, "GET", "/m", &[], "").await;
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
    let r = send(gw.listen, "GET", "/m", &[], "").await;
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
        let r = send(gw.listen, "GET", "/", &[], "").await;
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
    let r = support::binary_free_http10(gw.listen, "/").await;
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
    let r = send(gw.listen, "GET", "/", &[], "").await;
    assert_eq!(r.status, 502);
    assert!(
        r.body
            .contains("certificate not valid for name \\\"localhost\\\""),
        "{}",
        r.body
    );
    gw.shutdown().await;
}

/// Certificates for a Redis server reached as 127.0.0.1, and a client's.
struct RedisPki {
    server: (PathBuf, PathBuf),
    ca: PathBuf,
    client: (PathBuf, PathBuf),
    /// Where the files are, removed with the last of their users.
    _dir: support::Scratch,
}

impl RedisPki {
    fn new() -> Self {
        let dir = scratch_dir("rw-redis-tls");
        let ca = Ca::new("redis ca");
        let (cert, key) = ca.issue(&["127.0.0.1", "localhost"]);
        let server = (
            put(&dir, "server.pem", &cert),
            put(&dir, "server.key", &key),
        );
        let (cc, ck) = ca.issue(&["gateway"]);
        let client = (put(&dir, "client.pem", &cc), put(&dir, "client.key", &ck));
        Self {
            server,
            ca: put(&dir, "ca.pem", &ca.pem),
            client,
            _dir: dir,
        }
    }

    /// The server's files; clients must show a certificate.
    fn files(&self) -> common::RedisTlsFiles<'_> {
        common::RedisTlsFiles {
            cert: &self.server.0,
            key: &self.server.1,
            ca: &self.ca,
            require_clients: true,
        }
    }

    fn store_tls(&self) -> String {
        format!(
            "tls: {{ca: {}, client_cert: {}, client_key: {}}}",
            self.ca.display(),
            self.client.0.display(),
            self.client.1.display()
        )
    }
}

/// One limit of 2 per client over `store`, through two gateways sharing
/// it: the third request, on either, is refused.
async fn limited_across_two_gateways(store: &str) {
    let yaml = format!(
        "store:\n{store}\n  on_error: deny\nrules:\n  - {{name: two, limit: 2, window: 1h}}\n"
    );
    let a = support::gateway(&yaml, "echo", None).await;
    let b = support::gateway(&yaml, "echo", None).await;
    assert_eq!(send(a.listen, "GET", "/", &[], "").await.status, 200);
    assert_eq!(send(b.listen, "GET", "/", &[], "").await.status, 200);
    assert_eq!(send(a.listen, "GET", "/", &[], "").await.status, 429);
    assert_eq!(send(b.listen, "GET", "/", &[], "").await.status, 429);
    a.shutdown().await;
    b.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_over_tls_standalone_with_a_client_certificate() {
    let pki = RedisPki::new();
    let redis = common::RedisServer::start_tls(false, &pki.files());
    let store = format!(
        "  type: redis\n  url: {}\n  {}",
        redis.tls_url(),
        pki.store_tls()
    );
    limited_across_two_gateways(&store).await;
    // The state is in that server.
    assert_ne!(redis.cli(&["dbsize"]), "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_over_tls() {
    let pki = RedisPki::new();
    let cluster = common::RedisCluster::start_tls(&pki.files());
    let urls: Vec<String> = cluster.tls_urls();
    // (A debug build's first TLS handshakes to three nodes can take longer
    // than the default 50 ms.)
    let store = format!(
        "  type: redis\n  timeout: 2s\n  cluster: [{}]\n  {}",
        urls.join(", "),
        pki.store_tls()
    );
    limited_across_two_gateways(&store).await;
    let keys: usize = cluster
        .nodes
        .iter()
        .map(|n| n.cli(&["dbsize"]).parse::<usize>().unwrap())
        .sum();
    assert!(keys > 0, "state in the cluster");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seed_002s_file_runs_against_a_local_https_upstream() {
    let dir = scratch_dir("rw-seed-002");
    let ca = Ca::new("local ca");
    let up = TlsUpstream::start(&ca.issue(&["localhost"]), None).await;
    // The system's trust store, as the gateway reads it: SSL_CERT_FILE.
    let trust = put(&dir, "ca.pem", &ca.pem);
    let seed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/seed-002-go-gateway.yaml");
    let bin = support::spawn_binary(
        &seed,
        &up.url(),
        &[("SSL_CERT_FILE", trust.to_str().unwrap())],
        Some(dir),
    );
    let addr = bin.listen;
    // The seed's API rule: 5 comment writes per minute per client.
    let mut statuses = vec![];
    for _ in 0..6 {
        let r = send(addr, "POST", "/api/item/7/comment", &[], "hi").await;
        statuses.push(r.status.as_u16());
        if r.status == 200 {
            assert_eq!(r.body, "tls upstream /api/item/7/comment client-cert=false");
            assert!(r.header("x-ratelimit-remaining").is_some());
        }
    }
    assert_eq!(statuses, [200, 200, 200, 200, 200, 429]);
}

/// On the TLS listener the first-run hint shows curl the certificate
/// (`--cacert`): without it, a self-signed certificate makes curl print
/// nothing but an error.
#[tokio::test]
async fn the_tls_hint_shows_curl_the_certificate() {
    let dir = scratch_dir("rw-tls-hint");
    let ca = Ca::new("test ca");
    let (cert, key) = ca.issue(&["localhost", "127.0.0.1"]);
    let (c, k) = (put(&dir, "s.pem", &cert), put(&dir, "s.key", &key));
    let file = put(
        &dir,
        "ratewarden.yaml",
        &format!(
            "admin: {{listen: 127.0.0.1:0}}\ntls: {{cert: {}, key: {}}}\n",
            c.display(),
            k.display()
        ),
    );
    let bin = support::spawn_binary(&file, "echo", &[], None);
    let hint = bin.wait_for_line(|l| l.starts_with("try:"));
    assert!(
        hint.contains(&format!("curl -si --cacert {} https://", c.display())),
        "{hint}"
    );
    bin.wait_for_line(|l| l.contains("--resolve"));
}

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
    let mut sender = h2_over_tls(gw.listen, &ca).await;
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
    let channel = tonic::transport::Channel::from_shared(format!("http://{}", gw.listen))
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
    let client = tonic_over_tls(gw.listen, &ca).await;
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
        let channel = tonic::transport::Channel::from_shared(format!("http://{}", gw.listen))
            .unwrap()
            .connect()
            .await
            .unwrap();
        grpc_echo::all_four(tonic::client::Grpc::new(channel), &echo).await;
        gw.shutdown().await;
    }
}
