//! An upstream to proxy to, a gateway started in-process, and a client.

#![allow(dead_code, missing_docs)]

use std::convert::Infallible;
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
    let method = req.method().clone();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let (status, text) = if let Some(code) = path.strip_prefix("/status/") {
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
                "xff={xff};host={host};hop={hop};body={}",
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
