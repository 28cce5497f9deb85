//! TLS end to end, with certificates made for each test (rcgen): the
//! listener over HTTP/1.1 (on the gateway's own path) and h2, certificates
//! chosen by SNI and renewed in place, client certificates on the admin
//! listener, https upstreams signed by a private CA (pooled, with and
//! without a client certificate, and a wrong CA), Redis over TLS, and seed
//! 002's file against a local https upstream.

#[path = "../../../ratewarden/tests/common/mod.rs"]
mod common;
mod grpc;
#[path = "../grpc_echo/mod.rs"]
mod grpc_echo;
mod redis;
#[path = "../support/mod.rs"]
mod support;
mod upstream;

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
        gw.listen(),
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
    let mut sender = h2_over_tls(gw.listen(), &ca).await;
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
    let s = connect(gw.listen(), "localhost", Arc::new(cfg))
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
        support::client().get(format!("http://{}/", gw.listen()).parse().unwrap()),
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
    let port = gw.listen().port().to_string();
    let field = |body: &str, name: &str| -> Vec<String> {
        body.lines()
            .filter_map(|l| l.strip_prefix(&format!("{name}: ")).map(str::to_owned))
            .collect()
    };
    // HTTP/1.1: the gateway's own path.
    let s = connect(
        gw.listen(),
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
    let s = connect(gw.listen(), "localhost", client_config(&ca, &[b"h2"], None))
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
    let s = connect(gw.listen(), "www.b.test", cfg.clone())
        .await
        .unwrap();
    assert_eq!(shown(&s), der(&b_cert), "the wildcard's certificate");
    let s = connect(gw.listen(), "a.test", cfg.clone()).await.unwrap();
    assert_eq!(shown(&s), der(&a_cert));
    // No certificate covers it: the first is shown, and the client refuses it.
    let err = connect(gw.listen(), "c.test", cfg).await.unwrap_err();
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
    let before = connect(gw.listen(), "localhost", cfg.clone())
        .await
        .unwrap();
    assert_eq!(shown(&before), der(&old_cert));
    let mut kept = h1(before).await;
    assert_eq!(get(&mut kept, "/").await.0, 200);

    // Renewed in place, as certbot does: the key, then the certificate.
    let (new_cert, new_key) = ca.issue(&["localhost"]);
    std::fs::write(&k, &new_key).unwrap();
    std::fs::write(&c, &new_cert).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = connect(gw.listen(), "localhost", cfg.clone())
            .await
            .unwrap();
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
    let s = connect(gw.listen(), "localhost", cfg).await.unwrap();
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
    assert_eq!(send(gw.listen(), "GET", "/", &[], "").await.status, 200);
    gw.shutdown().await;
}
