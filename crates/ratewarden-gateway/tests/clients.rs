//! The clients where the seeds' apps live (issue 53): the Python package
//! (`clients/python`: DRF, Django, ASGI) installed into a virtualenv and
//! the npm package (`clients/node`: Express 4 and 5) installed into
//! `node_modules`, driven by the real frameworks from PyPI and npm in
//! front of the real gateway. Exact across processes because the gateway
//! decides; a gateway that goes away is `on_error`, never a 500.

mod support;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use support::{Binary, scratch_dir, send, spawn_binary};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn here() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/clients")
}

/// The test venv's Python (`./test` makes it, with Django, DRF, gunicorn,
/// FastAPI and uvicorn), with `clients/python` installed into it afresh.
fn python() -> PathBuf {
    let python = PathBuf::from(std::env::var("RATEWARDEN_SDK_PYTHON").unwrap_or_else(|_| {
        panic!(
            "this test needs the test venv: run ./test (it makes target/sdk-venv with Django, \
             djangorestframework, gunicorn, fastapi, uvicorn and httpx) and sets RATEWARDEN_SDK_PYTHON"
        )
    }));
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        let out = Command::new(&python)
            .args([
                "-m",
                "pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-deps",
            ])
            .args(["--no-build-isolation", "--force-reinstall"])
            .arg(root().join("clients/python"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "pip install clients/python: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    python
}

/// Runs `cmd`; its stdout, once it has succeeded (else its output, named
/// `what`, fails the test).
fn run(what: &str, cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{what}: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// A server process of the test's, killed when dropped.
struct App(Child, u16);

impl Drop for App {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl App {
    fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.1))
    }
}

async fn up(port: u16) {
    support::wait_until_up(SocketAddr::from(([127, 0, 0, 1], port))).await;
}

fn gateway(rules: &str) -> Binary {
    let dir = scratch_dir("rw-clients");
    let file = dir.join("rw.yaml");
    std::fs::write(&file, format!("rules:\n{rules}")).unwrap();
    spawn_binary(&file, "echo", &[], Some(dir))
}

/// `n` concurrent `GET path` on `app`: how many were answered each status.
async fn burst(
    app: SocketAddr,
    path: &'static str,
    n: usize,
) -> std::collections::BTreeMap<u16, usize> {
    let mut tasks = vec![];
    for _ in 0..n {
        tasks.push(tokio::spawn(async move {
            send(app, "GET", path, &[], "").await
        }));
    }
    let mut out = std::collections::BTreeMap::new();
    for t in tasks {
        let r = t.await.unwrap();
        if r.status == 429 {
            assert!(
                r.header("retry-after").is_some(),
                "a 429 without Retry-After"
            );
        }
        *out.entry(r.status.as_u16()).or_default() += 1;
    }
    out
}

const DJANGO_RULES: &str = "  - {name: coupon, key: [identity], algorithm: fixed_window, limit: 10, window: 5m, count: failures, reset_on_success: true, penalty: 10m}
  - {name: hot, key: [identity], algorithm: fixed_window, limit: 20, window: 1h}
";

fn gunicorn(rw: &Binary, workers: u8) -> App {
    let python = python();
    let port = support::free_port();
    let child = Command::new(python.with_file_name("gunicorn"))
        .args([
            "--workers",
            &workers.to_string(),
            "--bind",
            &format!("127.0.0.1:{port}"),
        ])
        .arg("--chdir")
        .arg(here())
        .args(["--log-level", "warning", "djangoapp.wsgi"])
        .env("RATEWARDEN_URL", format!("http://{}", rw.admin))
        .env("DJANGO_SETTINGS_MODULE", "djangoapp.settings")
        .stdout(Stdio::null())
        .spawn()
        .expect("gunicorn in the test venv");
    App(child, port)
}

/// Seed 000 in Django with DRF, four gunicorn worker processes: 100
/// concurrent requests on one key at a limit of 20 admit exactly 20; the
/// coupon freeze: 10 wrong codes freeze the user (DRF's 429 with
/// `Retry-After`), a right code forgives; the gateway stopped: `on_error:
/// allow`, no 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn django_and_drf_in_four_workers_are_exact_and_freeze_a_coupon_guesser() {
    let mut rw = gateway(DJANGO_RULES);
    let app = gunicorn(&rw, 4);
    up(app.1).await;
    let seen = burst(app.addr(), "/hot", 100).await;
    assert_eq!(seen.get(&200), Some(&20), "{seen:?}");
    assert_eq!(seen.get(&429), Some(&80), "{seen:?}");

    let coupon = |user: &'static str, code: &'static str| {
        let addr = app.addr();
        async move {
            send(
                addr,
                "POST",
                "/coupon",
                &[("x-user", user), ("content-type", "application/json")],
                &format!("{{\"code\": \"{code}\"}}"),
            )
            .await
        }
    };
    for i in 0..10 {
        assert_eq!(coupon("guesser", "WRONG").await.status, 400, "attempt {i}");
    }
    let frozen = coupon("guesser", "RIGHT").await;
    assert_eq!(
        frozen.status, 429,
        "frozen after 10 failures: {}",
        frozen.body
    );
    let wait: u64 = frozen.header("retry-after").unwrap().parse().unwrap();
    assert!(
        (500..=600).contains(&wait),
        "frozen for 10 minutes: Retry-After {wait}"
    );
    // A success forgives: 5 failures, a right code, then 9 more failures
    // are all answered (the count started again).
    for _ in 0..5 {
        assert_eq!(coupon("forgiven", "WRONG").await.status, 400);
    }
    assert_eq!(coupon("forgiven", "RIGHT").await.status, 200);
    for i in 0..9 {
        assert_eq!(
            coupon("forgiven", "WRONG").await.status,
            400,
            "attempt {i} after the success"
        );
    }

    // The gateway goes away: every request answered as on_error says.
    let _ = rw.child.kill();
    let _ = rw.child.wait();
    let seen = burst(app.addr(), "/hot", 8).await;
    assert_eq!(
        seen.get(&200),
        Some(&8),
        "on_error: allow, never a 500: {seen:?}"
    );
}

/// FastAPI behind `ratewarden.asgi`: a `concurrency` rule's slot is held
/// while a streamed answer streams, given back when it ends, and when the
/// client leaves mid-stream; a refusal is the gateway's 429.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fastapi_gives_a_streams_slot_back_when_it_ends_and_when_the_client_leaves() {
    let rw = gateway(
        "  - {name: one-stream, key: [identity], algorithm: concurrency, limit: 1, match: {path: /stream}}\n",
    );
    let python = python();
    let port = support::free_port();
    let child = Command::new(python.with_file_name("uvicorn"))
        .args([
            "fastapp:app",
            "--host",
            "127.0.0.1",
            "--port",
            &port.to_string(),
            "--log-level",
            "warning",
        ])
        .arg("--app-dir")
        .arg(here())
        .env("RATEWARDEN_URL", format!("http://{}", rw.admin))
        .stdout(Stdio::null())
        .spawn()
        .expect("uvicorn in the test venv");
    let app = App(child, port);
    up(port).await;
    // A stream read a chunk at a time over a raw socket, so that it can be
    // left half read.
    let open = || async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        s.write_all(b"GET /stream?n=5 HTTP/1.1\r\nhost: x\r\n\r\n")
            .await
            .unwrap();
        let mut buf = vec![0u8; 4096];
        let n = s.read(&mut buf).await.unwrap();
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        (s, head)
    };
    let (mut first, head) = open().await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let second = send(app.addr(), "GET", "/stream?n=1", &[], "").await;
    assert_eq!(
        second.status, 429,
        "the slot is held while the first streams"
    );
    assert!(second.header("retry-after").is_some() || second.header("ratelimit").is_some());
    // The first read to its end: the slot comes back.
    {
        use tokio::io::AsyncReadExt;
        let mut rest = vec![];
        let _ = tokio::time::timeout(Duration::from_secs(5), first.read_to_end(&mut rest)).await;
    }
    drop(first);
    let mut after = send(app.addr(), "GET", "/stream?n=1", &[], "").await;
    for _ in 0..20 {
        if after.status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        after = send(app.addr(), "GET", "/stream?n=1", &[], "").await;
    }
    assert_eq!(
        after.status, 200,
        "the slot came back when the stream ended"
    );
    // A client that leaves mid-stream gives its slot back too.
    let (left, head) = open().await;
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    drop(left);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let r = send(app.addr(), "GET", "/stream?n=1", &[], "").await;
        if r.status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot of a client that left never came back"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `python -m build` makes a wheel and an sdist of `clients/python`, and
/// `npm pack` a tarball of `clients/node`.
#[test]
fn both_packages_build() {
    let python = python();
    let out_dir = scratch_dir("rw-build");
    run(
        "python -m build",
        Command::new(&python)
            .args(["-m", "build", "--no-isolation", "--outdir"])
            .arg(&*out_dir)
            .arg(root().join("clients/python")),
    );
    let names: Vec<String> = std::fs::read_dir(&*out_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(names.iter().any(|n| n.ends_with(".whl")), "{names:?}");
    assert!(names.iter().any(|n| n.ends_with(".tar.gz")), "{names:?}");
    let npm = support::tool("npm", "npm");
    run(
        "npm pack",
        Command::new(npm)
            .args(["pack", "--pack-destination"])
            .arg(&*out_dir)
            .current_dir(root().join("clients/node")),
    );
    assert!(
        std::fs::read_dir(&*out_dir).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".tgz")),
        "no tarball"
    );
}

/// Express 4 and 5, one process each, the package from `clients/node`
/// installed into `node_modules`: 100 concurrent requests on one key at a
/// limit of 20 admit exactly 20 across both, with the gateway's headers;
/// the gateway stopped: `onError: allow`, no 500.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn express_4_and_5_in_two_processes_are_exact() {
    let installs = PathBuf::from(std::env::var("RATEWARDEN_NODE_CLIENTS").unwrap_or_else(|_| {
        panic!(
            "this test needs Express 4 and 5 installed beside clients/node: run ./test (it runs \
             npm install in target/node-clients/express4 and express5) and sets RATEWARDEN_NODE_CLIENTS"
        )
    }));
    let node = support::tool("node", "nodejs");
    let mut rw = gateway(
        "  - {name: hot, key: [identity], algorithm: fixed_window, limit: 20, window: 1h}\n",
    );
    let mut apps = vec![];
    for v in ["express4", "express5"] {
        let dir = installs.join(v);
        std::fs::copy(here().join("express_app.mjs"), dir.join("app.mjs")).unwrap();
        let mut child = Command::new(&node)
            .arg("app.mjs")
            .current_dir(&dir)
            .env("RATEWARDEN_URL", format!("http://{}", rw.admin))
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port: u16 = line
            .trim()
            .strip_prefix("port=")
            .unwrap_or_else(|| panic!("{v}: {line}"))
            .parse()
            .unwrap();
        apps.push(App(child, port));
    }
    let (a, b) = (apps[0].addr(), apps[1].addr());
    let mut tasks = vec![];
    for i in 0..100 {
        let to = if i % 2 == 0 { a } else { b };
        tasks.push(tokio::spawn(async move {
            send(to, "GET", "/hot", &[], "").await
        }));
    }
    let (mut ok, mut refused) = (0, 0);
    for t in tasks {
        let r = t.await.unwrap();
        match r.status.as_u16() {
            200 => {
                ok += 1;
                assert!(r.header("ratelimit").is_some(), "the gateway's headers");
            }
            429 => {
                refused += 1;
                assert!(r.header("retry-after").is_some());
                assert!(r.body.contains("hot"), "{}", r.body);
            }
            s => panic!("status {s}: {}", r.body),
        }
    }
    assert_eq!((ok, refused), (20, 80));
    let _ = rw.child.kill();
    let _ = rw.child.wait();
    for app in &apps {
        assert_eq!(
            send(app.addr(), "GET", "/hot", &[], "").await.status,
            200,
            "onError: allow"
        );
    }
}

/// The admin token: sent when set; a refused one is an error that says so
/// at startup (`ping()`), in both packages; the packages' versions are the
/// crate's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_admin_token_says_so_at_startup() {
    let dir = scratch_dir("rw-clients");
    let file = dir.join("rw.yaml");
    std::fs::write(
        &file,
        "admin: {listen: 127.0.0.1:0, token: right-token}\nrules:\n  - {name: hot, limit: 5, window: 1m}\n",
    )
    .unwrap();
    let rw = spawn_binary(&file, "echo", &[], Some(dir));
    let url = format!("http://{}", rw.admin);
    let script = r#"
import sys
from ratewarden import Client, RatewardenError, __version__
url = sys.argv[1]
try:
    Client(url, token="wrong").ping()
    print("wrong token accepted")
except RatewardenError as e:
    print("wrong:", e)
Client(url, token="right-token").ping()
print("right: allowed", Client(url, token="right-token").check("hot", "k").allowed)
print("version", __version__)
"#;
    let text = run(
        "the Python script",
        Command::new(python()).args(["-c", script, &url]),
    );
    assert!(
        text.contains("wrong: the gateway refused the admin token (401)"),
        "{text}"
    );
    assert!(text.contains("right: allowed True"), "{text}");
    assert!(
        text.contains(&format!("version {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let node = support::tool("node", "nodejs");
    let js = r#"
const { createClient, RatewardenError } = await import(process.argv[1] + '/index.js');
const url = process.argv[2];
try { await createClient({ url, token: 'wrong' }).ping(); console.log('wrong token accepted'); }
catch (e) { console.log('wrong:', e instanceof RatewardenError, e.message); }
await createClient({ url, token: 'right-token' }).ping();
console.log('right: allowed', (await createClient({ url, token: 'right-token' }).check('hot', 'k')).allowed);
// CommonJS gets the same client: its error class is the one thrown, and a
// bad option throws at once (an unhandled rejection would end the process).
const { createRequire } = await import('node:module');
const cjs = createRequire(import.meta.url)(process.argv[1] + '/index.cjs');
try { await cjs.createClient({ url, token: 'wrong' }).ping(); }
catch (e) { console.log('cjs wrong:', e instanceof cjs.RatewardenError, e instanceof RatewardenError); }
try { cjs.createClient({ url }); cjs.createClient({}); console.log('no url accepted'); }
catch (e) { console.log('cjs no url:', e instanceof cjs.RatewardenError, e.message); }
"#;
    let text = run(
        "the Node script",
        Command::new(node)
            .args(["--input-type=module", "-e", js])
            .arg(root().join("clients/node"))
            .arg(&url),
    );
    assert!(
        text.contains("wrong: true the gateway refused the admin token (401)"),
        "{text}"
    );
    assert!(text.contains("right: allowed true"), "{text}");
    assert!(text.contains("cjs wrong: true true"), "{text}");
    assert!(
        text.contains("cjs no url: true createClient needs the admin listener's url"),
        "{text}"
    );
    let pkg = std::fs::read_to_string(root().join("clients/node/package.json")).unwrap();
    assert!(
        pkg.contains(&format!("\"version\": \"{}\"", env!("CARGO_PKG_VERSION"))),
        "{pkg}"
    );
}
