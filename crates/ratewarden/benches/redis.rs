//! Decisions per second through the Redis store at 64 concurrent callers, on
//! one key and over 100,000 keys, beside `redis-benchmark` calling the same
//! script on the same server in the same run, built by the store's own
//! `script::argv_one`: by EVALSHA unpipelined (issue 3's reference) and as the
//! store calls it, FCALL of the library with 16 in flight per connection
//! (issue 18's: the ceiling a client can reach on this machine).
//!
//! `cargo bench -p ratewarden --bench redis` (needs redis-server and
//! redis-benchmark from Debian's redis-server / redis-tools; loopback only,
//! bounded by the request counts below).

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ratewarden::algorithm::Kind;
use ratewarden::{Mode, Op, RedisConfig, RedisStore, Rule, Store};

/// The allocator the gateway runs the client with (its `main.rs`).
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

const CALLERS: usize = 64;
const DECISIONS: usize = 200_000;

struct Server(Child, u16);
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_redis() -> Server {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server");
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        std::thread::sleep(Duration::from_millis(10));
    }
    Server(child, port)
}

fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The bench's rule: gcra, 1000/s (never limiting a run's callers much).
fn rule() -> Rule {
    Rule::builder("bench")
        .algorithm(Kind::Gcra)
        .limit(1000, Duration::from_secs(1))
        .build()
        .unwrap()
}

/// `redis-benchmark` calling the store's script for one gcra op, as the
/// store would (`script::argv_one`), by `EVALSHA` of the script or `FCALL` of
/// the library's function, with `pipeline` calls in flight per connection;
/// returns requests/s.
fn reference(port: u16, call: &[&str], random_keys: bool, pipeline: usize) -> f64 {
    let key = if random_keys {
        "rw:{__rand_int__}:k"
    } else {
        "rw:{hot}:k"
    };
    let rule = rule();
    // The compact call (one op applied: one key for gcra), as the store
    // makes it.
    let argv = ratewarden::store::redis::script::argv_one(
        &Op::new(&rule, "k"),
        1,
        ratewarden::clock::Micros::ZERO,
        ratewarden::clock::Micros::ZERO,
    );
    let mut args: Vec<String> = [
        "-p",
        &port.to_string(),
        "-c",
        "64",
        "-n",
        &DECISIONS.to_string(),
        "-P",
        &pipeline.to_string(),
        "-q",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    if random_keys {
        args.extend(["-r".into(), "100000".into()]);
    }
    args.extend(call.iter().map(|s| s.to_string()));
    args.extend(["1".into(), key.into()]);
    args.extend(argv);
    let out = Command::new("redis-benchmark")
        .args(&args)
        .output()
        .expect("redis-benchmark");
    let text = String::from_utf8_lossy(&out.stdout);
    // "EVALSHA ...: 41152.26 requests per second, p50=1.2 msec"
    // The progress lines are separated by \r; the command itself has colons.
    let summary = text
        .split(['\r', '\n'])
        .rev()
        .find(|l| l.contains(" requests per second"));
    let before = summary
        .unwrap_or_else(|| panic!("{text}"))
        .split(" requests per second")
        .next()
        .unwrap();
    before.split_whitespace().last().unwrap().parse().unwrap()
}

/// Our store: `CALLERS` tasks sharing one store; returns (decisions/s, p50, p99).
fn ours(rt: &tokio::runtime::Runtime, port: u16, random_keys: bool) -> (f64, Duration, Duration) {
    rt.block_on(async {
        let store = RedisStore::new(RedisConfig {
            url: Some(format!("redis://127.0.0.1:{port}/0")),
            timeout: Duration::from_secs(2),
            ..RedisConfig::default()
        })
        .unwrap();
        let rule = rule();
        store
            .decide(&[Op::new(&rule, "warm")], 1, Mode::Apply)
            .await
            .unwrap();
        let (store, rule) = (Arc::new(store), Arc::new(rule));
        let start = Instant::now();
        let mut tasks = vec![];
        for t in 0..CALLERS {
            let (store, rule) = (store.clone(), rule.clone());
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::with_capacity(DECISIONS / CALLERS);
                let mut x = t as u64 + 1;
                for _ in 0..DECISIONS / CALLERS {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    let key = if random_keys {
                        ((x >> 33) % 100_000).to_string()
                    } else {
                        "hot".into()
                    };
                    let t0 = Instant::now();
                    store
                        .decide(&[Op::new(&rule, &key)], 1, Mode::Apply)
                        .await
                        .unwrap();
                    lat.push(t0.elapsed());
                }
                lat
            }));
        }
        let mut lat = vec![];
        for t in tasks {
            lat.extend(t.await.unwrap());
        }
        let elapsed = start.elapsed();
        lat.sort();
        let rate = lat.len() as f64 / elapsed.as_secs_f64();
        (rate, lat[lat.len() / 2], lat[lat.len() * 99 / 100])
    })
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let server = start_redis();
    let sha = cli(
        server.1,
        &["script", "load", ratewarden::store::redis::script::SCRIPT],
    );
    let (library, function) = ratewarden::store::redis::script::library();
    cli(server.1, &["function", "load", &library]);
    println!(
        "{CALLERS} concurrent callers, {DECISIONS} gcra decisions each run, one redis-server on loopback"
    );
    println!(
        "{:<12} {:>16} {:>16} {:>14} {:>10} {:>10} {:>10} {:>10}",
        "keys",
        "EVALSHA -P1 /s",
        "FCALL -P16 /s",
        "ratewarden /s",
        "vs -P1",
        "vs -P16",
        "p50",
        "p99"
    );
    for (name, random) in [("1 key", false), ("100k keys", true)] {
        cli(server.1, &["flushall"]);
        let unpipelined = reference(server.1, &["EVALSHA", &sha], random, 1);
        cli(server.1, &["flushall"]);
        let ceiling = reference(server.1, &["FCALL", &function], random, 16);
        cli(server.1, &["flushall"]);
        let (rate, p50, p99) = ours(&rt, server.1, random);
        println!(
            "{name:<12} {unpipelined:>16.0} {ceiling:>16.0} {rate:>14.0} {:>10.2} {:>10.2} {:>10.2?} {:>10.2?}",
            rate / unpipelined,
            rate / ceiling,
            p50,
            p99
        );
    }
}
