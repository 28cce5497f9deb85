//! An upstream to proxy to, a gateway started in-process, and a client.

#![allow(
    dead_code,
    missing_docs,
    unreachable_pub,
    missing_debug_implementations
)]

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use ratewarden::clock::{Clock, ManualClock};
use ratewarden_gateway::config::{self, Overrides};
use ratewarden_gateway::server::{self, Running, Source};

pub mod llm;

/// A test upstream: `/status/N` answers N; `POST /coupons` answers 200 for
/// the body `RIGHT` and 400 otherwise; `/slow` answers after 3 s; anything
/// else 200 with the X-Forwarded-For and Host it received.
pub struct Upstream {
    pub addr: SocketAddr,
    pub hits: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Upstream {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn upstream_handle(
    req: Request<Incoming>,
    hits: Arc<AtomicUsize>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    hits.fetch_add(1, Ordering::SeqCst);
    let path = req.uri().path().to_owned();
    let xff = req
        .headers()
        .get("x-forwarded-for")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let host = req
        .headers()
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let hop = req.headers().contains_key("x-hop");
    // `/headers`: every field as received, `name: value` a line (names in
    // lower case, in order), as a Django app's `request.META` would show.
    let fields: String = req
        .headers()
        .iter()
        .map(|(n, v)| format!("{n}: {}\n", String::from_utf8_lossy(v.as_bytes())))
        .collect();
    let rid = req
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    let method = req.method().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (status, text) = if path == "/headers" {
        (StatusCode::OK, fields)
    } else if let Some(code) = path.strip_prefix("/status/") {
        (
            StatusCode::from_u16(code.parse().unwrap_or(500))
                .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            String::new(),
        )
    } else if path == "/coupons" && method == Method::POST {
        if &body[..] == b"RIGHT" {
            (StatusCode::OK, "redeemed".into())
        } else {
            (StatusCode::BAD_REQUEST, "wrong code".into())
        }
    } else if path == "/slow" {
        tokio::time::sleep(Duration::from_secs(3)).await;
        (StatusCode::OK, "slow".into())
    } else {
        (
            StatusCode::OK,
            format!(
                "xff={xff};host={host};hop={hop};rid={rid};body={}",
                String::from_utf8_lossy(&body)
            ),
        )
    };
    let mut r = Response::new(Full::new(Bytes::from(text)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert("connection", "x-secret".parse().unwrap());
    r.headers_mut()
        .insert("x-secret", "hop-by-hop".parse().unwrap());
    Ok(r)
}

impl Upstream {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let hits = Arc::new(AtomicUsize::new(0));
        let h = hits.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let h = h.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| upstream_handle(req, h.clone()));
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self { addr, hits, task }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn hits(&self) -> usize {
        self.hits.load(Ordering::SeqCst)
    }
}

/// A gateway on free ports in front of `upstream` (a URL, or `echo`).
pub async fn gateway(yaml: &str, upstream: &str, clock: Option<ManualClock>) -> Running {
    gateway_file(yaml, upstream, clock, None).await
}

pub async fn gateway_file(
    yaml: &str,
    upstream: &str,
    clock: Option<ManualClock>,
    path: Option<std::path::PathBuf>,
) -> Running {
    let overrides = Overrides {
        listen: Some("127.0.0.1:0".into()),
        admin_listen: Some("127.0.0.1:0".into()),
        upstream: Some(upstream.into()),
        workers: None,
    };
    let cfg = config::load(yaml, "test.yaml", &overrides).unwrap_or_else(|e| panic!("{e}"));
    server::start(
        cfg,
        Source {
            loaded: path.as_ref().map(|_| yaml.to_owned()),
            path,
            overrides,
            clock: clock.map(|c| Arc::new(c) as Arc<dyn Clock>),
        },
    )
    .await
    .unwrap()
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: String,
}

impl Reply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

/// Waits (up to 10 s) until `/metrics` on `admin` contains `want`.
pub async fn wait_for_metric(admin: SocketAddr, want: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let m = send(admin, "GET", "/metrics", &[], "").await.body;
        if m.contains(want) {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "`{want}` never showed: {m}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub async fn send(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Reply {
    let mut b = Request::builder()
        .method(method)
        .uri(format!("http://{addr}{path}"));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let resp = client()
        .request(b.body(Full::new(Bytes::from(body.to_owned()))).unwrap())
        .await
        .unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body =
        String::from_utf8_lossy(&resp.into_body().collect().await.unwrap().to_bytes()).into_owned();
    Reply {
        status,
        headers,
        body,
    }
}

pub fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// An upstream that holds every request until the gate opens: requests in
/// flight stay in flight for as long as a test needs.
pub struct Gated {
    pub addr: SocketAddr,
    pub arrived: Arc<AtomicUsize>,
    open: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Gated {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Gated {
    pub async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let arrived = Arc::new(AtomicUsize::new(0));
        let (open, gate) = tokio::sync::watch::channel(false);
        let a = arrived.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (a, gate) = (a.clone(), gate.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |_req: Request<Incoming>| {
                        let (a, mut gate) = (a.clone(), gate.clone());
                        async move {
                            a.fetch_add(1, Ordering::SeqCst);
                            let _ = gate.wait_for(|open| *open).await;
                            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from("done"))))
                        }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Self {
            addr,
            arrived,
            open,
            task,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Requests that reached the upstream so far.
    pub fn arrived(&self) -> usize {
        self.arrived.load(Ordering::SeqCst)
    }

    /// Lets every request held, and every later one, through.
    pub fn open(&self) {
        let _ = self.open.send(true);
    }

    /// Holds requests again from now on.
    pub fn close(&self) {
        let _ = self.open.send(false);
    }
}

/// `algorithm: concurrency`: 100 concurrent requests to an upstream that
/// holds them: exactly `limit` are in flight, the rest are refused with
/// `Retry-After: 1`; once those end, new requests get in again.
pub async fn in_flight_is_exact(yaml: &str) {
    let up = Gated::start().await;
    let gw = gateway(yaml, &up.url(), None).await;
    let mut tasks = vec![];
    for _ in 0..100 {
        let addr = gw.listen();
        tasks.push(tokio::spawn(async move {
            send(addr, "GET", "/generate", &[("x-user-id", "u1")], "").await
        }));
    }
    // The 10 admitted stay in flight until the gate opens; the 90 others
    // come back refused meanwhile.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while tasks.iter().filter(|t| t.is_finished()).count() < 90 {
        assert!(std::time::Instant::now() < deadline, "90 refusals");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(up.arrived(), 10, "in flight at once");
    let mut refused = 0;
    let mut pending = vec![];
    for t in tasks {
        if t.is_finished() {
            let r = t.await.unwrap();
            assert_eq!(r.status, 429);
            assert_eq!(r.header("retry-after"), Some("1"));
            assert_eq!(r.header("x-ratelimit-remaining"), Some("0"));
            refused += 1;
        } else {
            pending.push(t);
        }
    }
    up.open();
    let mut ok = 0;
    for t in pending {
        let r = t.await.unwrap();
        match r.status.as_u16() {
            200 => ok += 1,
            429 => refused += 1,
            s => panic!("status {s}"),
        }
    }
    assert_eq!((ok, refused), (10, 90));
    assert_eq!(up.arrived(), 10, "never more than 10 reached the upstream");
    // Their leases were released as their answers ended.
    let r = send(gw.listen(), "GET", "/generate", &[("x-user-id", "u1")], "").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-ratelimit-remaining"), Some("9"));
    gw.shutdown().await;
}

/// The real `ratewarden` binary on free ports with `yaml` (plus a free
/// admin port) in front of `upstream`, killed when dropped.
pub struct Binary {
    pub child: std::process::Child,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    /// The authorisation listener, when it has one.
    pub authz: Option<SocketAddr>,
    /// Its scratch directory, when it holds it (removed after it stops).
    _dir: Option<Scratch>,
    /// Every line the binary wrote to its standard output so far.
    pub lines: Arc<std::sync::Mutex<Vec<String>>>,
}

impl Binary {
    /// Waits (at most 10 s) for an output line `pred` accepts; the line.
    pub fn wait_for_line(&self, pred: impl Fn(&str) -> bool) -> String {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(l) = self.lines.lock().unwrap().iter().find(|l| pred(l)) {
                return l.clone();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no such line in:\n{}",
                self.lines.lock().unwrap().join("")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Binary {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn binary(yaml: &str, upstream: &str) -> Binary {
    let dir = scratch_dir("rw-hostile");
    let file = dir.join("ratewarden.yaml");
    std::fs::write(&file, format!("admin: {{listen: 127.0.0.1:0}}\n{yaml}")).unwrap();
    spawn_binary(&file, upstream, &[], Some(dir))
}

/// A fresh directory under the temp dir, unique per call, removed with
/// what is in it when dropped (a failed test's too).
pub fn scratch_dir(prefix: &str) -> Scratch {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    let dir = std::env::temp_dir().join(format!("{prefix}-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// See [`scratch_dir`].
#[derive(Debug)]
pub struct Scratch(std::path::PathBuf);

impl std::ops::Deref for Scratch {
    type Target = std::path::Path;

    fn deref(&self) -> &std::path::Path {
        &self.0
    }
}

impl AsRef<std::path::Path> for Scratch {
    fn as_ref(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The real binary serving the config `file` (listeners on free ports) in
/// front of `upstream`, with `env` set; `dir`, if given, is removed when
/// it stops.
pub fn spawn_binary(
    file: &std::path::Path,
    upstream: &str,
    env: &[(&str, &str)],
    dir: Option<Scratch>,
) -> Binary {
    let file = file.display().to_string();
    let args = [
        "serve",
        "--workers",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "-c",
        &file,
    ];
    spawn_binary_with(&args, env, dir)
}

/// The real binary run with `args`, which must make it serve with an
/// admin listener; `dir`, if given, is removed when it stops.
pub fn spawn_binary_with(args: &[&str], env: &[(&str, &str)], dir: Option<Scratch>) -> Binary {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"));
    cmd.args(args).envs(env.iter().copied());
    spawn_command(cmd, dir)
}

/// The real binary serving `file` (as [`spawn_binary`]) with at most
/// `nofile` file descriptors (`ulimit -n`, by the shell that starts it).
pub fn spawn_binary_nofile(file: &std::path::Path, upstream: &str, nofile: u32) -> Binary {
    let mut cmd = std::process::Command::new("sh");
    cmd.args([
        "-c",
        &format!("ulimit -n {nofile} && exec \"$0\" \"$@\""),
        env!("CARGO_BIN_EXE_ratewarden"),
        "serve",
        "--workers",
        "1",
        "--listen",
        "127.0.0.1:0",
        "--admin-listen",
        "127.0.0.1:0",
        "--upstream",
        upstream,
        "-c",
        &file.display().to_string(),
    ]);
    spawn_command(cmd, None)
}

/// `cmd`, which must run the binary serving with an admin listener, with
/// its log read; `dir`, if given, is removed when it stops.
pub fn spawn_command(mut cmd: std::process::Command, dir: Option<Scratch>) -> Binary {
    let mut child = cmd
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    // `key=value` in a text line, or `"key":"value"` in a JSON one.
    let addr_after = |line: &str, key: &str| -> Option<SocketAddr> {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(line) {
            return v[key].as_str()?.parse().ok();
        }
        let key = format!("{key}=");
        let rest = &line[line.find(&key)? + key.len()..];
        let end = rest.find([' ', ')']).unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    let lines = Arc::new(std::sync::Mutex::new(Vec::new()));
    let (listen, admin, authz) = loop {
        let mut line = String::new();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "exited before serving:\n{}",
            lines.lock().unwrap().join("")
        );
        lines.lock().unwrap().push(line.clone());
        if line.contains("ratewarden serving") {
            // `listen=off`: no proxy listener (a gateway of hooks alone).
            break (
                addr_after(&line, "listen").unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0))),
                addr_after(&line, "admin").unwrap(),
                addr_after(&line, "authz"),
            );
        }
    };
    // Keep the log (and drain it, so the pipe never fills).
    let kept = lines.clone();
    std::thread::spawn(move || {
        for line in out.lines() {
            match line {
                Ok(l) => kept.lock().unwrap().push(l + "\n"),
                Err(_) => return,
            }
        }
    });
    Binary {
        child,
        listen,
        admin,
        authz,
        _dir: dir,
        lines,
    }
}

/// An HTTP/1.0 request (which the gateway's own HTTP/1.1 path hands to
/// hyper) over a raw socket: the whole answer, read to the close.
pub async fn binary_free_http10(addr: SocketAddr, path: &str) -> String {
    raw(
        addr,
        &format!("GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n"),
    )
    .await
}

/// `request`'s bytes, as written, over a raw socket: the whole answer,
/// read to the close (the request must end the connection).
pub async fn raw(addr: SocketAddr, request: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut out))
        .await
        .expect("an answer within 10 s")
        .unwrap();
    String::from_utf8_lossy(&out).into_owned()
}

/// What `/v1/keys` on `admin` says is left of `rule` for a client on
/// 127.0.0.1 (its `remaining`: one less than what is unused, as a
/// request's would be).
pub async fn left(admin: SocketAddr, rule: &str) -> u64 {
    let body = send(admin, "GET", &format!("/v1/keys/{rule}/127.0.0.1"), &[], "")
        .await
        .body;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["remaining"]
        .as_u64()
        .unwrap_or_else(|| panic!("no remaining: {v}"))
}

/// Polls [`left`] until it is `want`, for 10 s (an end phase's store call
/// may follow the answer by a moment).
pub async fn wait_left(admin: SocketAddr, rule: &str, want: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let got = left(admin, rule).await;
        if got == want {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "left {got}, not {want}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One test body per function named, run on both HTTP paths: each test
/// file defines `Path` with `H1` (the gateway's own HTTP/1.1 path) and `H2`
/// (h2c: hyper's path), and `async fn name(path: Path)` per body.
#[allow(unused_macros)]
macro_rules! both_paths {
    ($($name:ident),* $(,)?) => {
        mod h1 {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Path::H1).await;
                }
            )*
        }
        mod h2 {
            $(
                #[tokio::test]
                async fn $name() {
                    super::$name(super::Path::H2).await;
                }
            )*
        }
    };
}
#[allow(unused_imports)]
pub(crate) use both_paths;

/// The README's block between `<!-- recipe:NAME -->` and
/// `<!-- /recipe:NAME -->`, without its code fence: what the recipe
/// tests run as written.
pub fn recipe(name: &str) -> String {
    // The README and every page of the book, whichever holds it.
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let mut readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut dirs = vec![root.join("docs/src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "md") {
                readme.push_str(&std::fs::read_to_string(&p).unwrap());
            }
        }
    }
    let start = format!("<!-- recipe:{name} -->");
    let end = format!("<!-- /recipe:{name} -->");
    let at = readme
        .find(&start)
        .unwrap_or_else(|| panic!("no {start} in the README or the book"))
        + start.len();
    let block = &readme[at..at + readme[at..].find(&end).unwrap()];
    let body = block.trim().split_once('\n').unwrap().1;
    body.trim_end().trim_end_matches("```").to_owned()
}

/// The path of the tool `name`, from Debian's `package`; a test that needs
/// it fails saying how to install it when it is missing.
pub fn tool(name: &str, package: &str) -> String {
    for dir in ["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"] {
        let p = format!("{dir}/{name}");
        if std::path::Path::new(&p).exists() {
            return p;
        }
    }
    panic!("no `{name}`: `apt-get install {package}` (./test installs it)");
}

/// A free loopback port (free when asked).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits (at most 15 s) until `addr` accepts connections.
pub async fn wait_until_up(addr: SocketAddr) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(std::time::Instant::now() < deadline, "{addr} never opened");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A server process of a test (nginx, Caddy), stopped when dropped: asked
/// with SIGTERM, then waited for (killed after 5 s). A SIGKILL to nginx's
/// master left its worker running, orphaned, after the tests had ended.
pub struct Stopped(pub std::process::Child, pub Option<Scratch>);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            match self.0.try_wait() {
                Ok(Some(_)) | Err(_) => return,
                Ok(None) if std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20))
                }
                Ok(None) => {
                    let _ = self.0.kill();
                    let _ = self.0.wait();
                    return;
                }
            }
        }
    }
}

/// Debian's nginx running `http` (the body of its `http { }` block), one
/// process (`master_process off`: nothing is left behind when it stops),
/// in the foreground, its files in a scratch directory; the address is
/// the caller's to wait for.
pub fn nginx(http: &str) -> Stopped {
    let nginx = tool("nginx", "nginx-light");
    let dir = scratch_dir("rw-nginx");
    let d = dir.display();
    let conf = format!(
        "master_process off;\nworker_processes 1;\nerror_log {d}/error.log warn;\npid {d}/nginx.pid;\ndaemon off;\n\
         events {{ worker_connections 256; }}\nhttp {{\n access_log off;\n client_body_temp_path {d}/cb;\n\
         proxy_temp_path {d}/pt;\n fastcgi_temp_path {d}/ft;\n uwsgi_temp_path {d}/ut;\n scgi_temp_path {d}/st;\n{http}\n}}\n"
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let child = std::process::Command::new(nginx)
        .args(["-p", &d.to_string(), "-c", &format!("{d}/nginx.conf")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit())
        .spawn()
        .unwrap();
    Stopped(child, Some(dir))
}
