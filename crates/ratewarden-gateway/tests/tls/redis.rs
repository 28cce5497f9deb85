//! Redis over TLS (standalone with a client certificate, and Cluster), and
//! seed 002's file against a local https upstream.

use super::upstream::TlsUpstream;
use super::*;

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
    assert_eq!(send(a.listen(), "GET", "/", &[], "").await.status, 200);
    assert_eq!(send(b.listen(), "GET", "/", &[], "").await.status, 200);
    assert_eq!(send(a.listen(), "GET", "/", &[], "").await.status, 429);
    assert_eq!(send(b.listen(), "GET", "/", &[], "").await.status, 429);
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
