//! A load generator for rate-limit decisions (bench/rls.sh): keeps N calls
//! in flight for a fixed time and reports calls/s and latency percentiles.
//! (ghz is not available here; h2load cannot vary the descriptor.)
//!
//!     rls_load grpc http://127.0.0.1:8081 [options]     Envoy RLS ShouldRateLimit
//!     rls_load http http://127.0.0.1:9090/v1/check [options]   a JSON POST
//!
//! Options: `--inflight N` (64), `--seconds S` (5), `--keys M` (10000:
//! values `v0`..`v{M-1}`, in turn), `--domain D` (`ns`), `--key K` (`k`),
//! `--channels C` (4 HTTP/2 connections for grpc), `--body T` (for http:
//! the body, `{v}` replaced by the value; default `{"rule":"r","key":"{v}"}`),
//! `--header H` (for http: a plain `GET URL` through the proxy instead,
//! the value in header `H`).
//!
//! Prints one line: `calls=… ok=… over=… errors=… rate=…/s p50_us=… p99_us=…`.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

struct Args {
    grpc: bool,
    url: String,
    inflight: usize,
    seconds: u64,
    keys: usize,
    domain: String,
    key: String,
    channels: usize,
    body: String,
    header: Option<String>,
}

fn args() -> Args {
    let mut a = std::env::args().skip(1);
    let usage = || -> ! {
        eprintln!(
            "usage: rls_load grpc|http URL [--inflight N] [--seconds S] [--keys M] [--domain D] [--key K] [--channels C] [--body T] [--header H]"
        );
        std::process::exit(2)
    };
    let grpc = match a.next().as_deref() {
        Some("grpc") => true,
        Some("http") => false,
        _ => usage(),
    };
    let url = a.next().unwrap_or_else(|| usage());
    let mut out = Args {
        grpc,
        url,
        inflight: 64,
        seconds: 5,
        keys: 10_000,
        domain: "ns".into(),
        key: "k".into(),
        channels: 4,
        body: r#"{"rule":"r","key":"{v}"}"#.into(),
        header: None,
    };
    while let Some(flag) = a.next() {
        let v = a.next().unwrap_or_else(|| usage());
        let n = || v.parse::<usize>().unwrap_or_else(|_| usage());
        match flag.as_str() {
            "--inflight" => out.inflight = n().max(1),
            "--seconds" => out.seconds = n() as u64,
            "--keys" => out.keys = n().max(1),
            "--channels" => out.channels = n().max(1),
            "--domain" => out.domain = v,
            "--key" => out.key = v,
            "--body" => out.body = v,
            "--header" => out.header = Some(v),
            _ => usage(),
        }
    }
    out
}

/// What one task saw.
#[derive(Default)]
struct Tally {
    ok: u64,
    over: u64,
    errors: u64,
    micros: Vec<u32>,
}

#[tokio::main]
async fn main() {
    let a = args();
    let deadline = Instant::now() + Duration::from_secs(a.seconds);
    let started = Instant::now();
    let mut tasks = vec![];
    if a.grpc {
        let mut channels = vec![];
        for _ in 0..a.channels {
            let ch = tonic::transport::Endpoint::from_shared(a.url.clone())
                .expect("a URL")
                .connect()
                .await
                .expect("cannot connect");
            channels.push(RateLimitServiceClient::new(ch));
        }
        for t in 0..a.inflight {
            let mut client = channels[t % channels.len()].clone();
            let (domain, key, keys) = (a.domain.clone(), a.key.clone(), a.keys);
            tasks.push(tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut i = t;
                while Instant::now() < deadline {
                    let req = RateLimitRequest {
                        domain: domain.clone(),
                        descriptors: vec![RateLimitDescriptor {
                            entries: vec![Entry {
                                key: key.clone(),
                                value: format!("v{}", i % keys),
                            }],
                            ..Default::default()
                        }],
                        hits_addend: 0,
                    };
                    i += 1;
                    let at = Instant::now();
                    match client.should_rate_limit(req).await {
                        Ok(r) if r.get_ref().overall_code == 1 => tally.ok += 1,
                        Ok(_) => tally.over += 1,
                        Err(_) => tally.errors += 1,
                    }
                    tally.micros.push(at.elapsed().as_micros() as u32);
                }
                tally
            }));
        }
    } else {
        let client: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new())
            .pool_max_idle_per_host(a.inflight)
            .build_http();
        for t in 0..a.inflight {
            let client = client.clone();
            let (url, body, keys) = (a.url.clone(), a.body.clone(), a.keys);
            let header = a.header.clone();
            tasks.push(tokio::spawn(async move {
                let mut tally = Tally::default();
                let mut i = t;
                while Instant::now() < deadline {
                    let value = format!("v{}", i % keys);
                    let req = match &header {
                        Some(h) => http::Request::get(&url)
                            .header(h.as_str(), value)
                            .body(Full::default()),
                        None => http::Request::post(&url)
                            .header("content-type", "application/json")
                            .body(Full::from(body.replace("{v}", &value))),
                    }
                    .expect("a request");
                    i += 1;
                    let at = Instant::now();
                    match client.request(req).await {
                        Ok(r) => {
                            let status = r.status().as_u16();
                            let _ = r.into_body().collect().await;
                            match status {
                                200 => tally.ok += 1,
                                429 => tally.over += 1,
                                _ => tally.errors += 1,
                            }
                        }
                        Err(_) => tally.errors += 1,
                    }
                    tally.micros.push(at.elapsed().as_micros() as u32);
                }
                tally
            }));
        }
    }
    let mut all = Tally::default();
    for t in tasks {
        let t = t.await.expect("a load task");
        all.ok += t.ok;
        all.over += t.over;
        all.errors += t.errors;
        all.micros.extend(t.micros);
    }
    let took = started.elapsed().as_secs_f64();
    all.micros.sort_unstable();
    let pct = |p: f64| {
        all.micros
            .get(((all.micros.len() as f64 * p) as usize).min(all.micros.len().saturating_sub(1)))
            .copied()
            .unwrap_or(0)
    };
    let calls = all.ok + all.over + all.errors;
    println!(
        "calls={calls} ok={} over={} errors={} rate={:.0}/s p50_us={} p99_us={}",
        all.ok,
        all.over,
        all.errors,
        calls as f64 / took,
        pct(0.50),
        pct(0.99)
    );
}
