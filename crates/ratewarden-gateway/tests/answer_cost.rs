//! A rule charged by what its answers cost (issue 47's "charge N at the
//! end", issue 48's `cost: {from: header | json}`): admission reserves,
//! the end phase replaces the reservation by the cost the answer names,
//! charging or refunding the difference, on both HTTP paths.

mod support;

use std::net::SocketAddr;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use support::{left, send, wait_left};

/// An upstream that answers `/cost/N` with `x-cost: N` (in the head),
/// `/trailer/N` with it in a chunked answer's trailer, `/json/N` with
/// `{"usage": {"total_tokens": N}}`, and `/fail` with a bodiless 503.
async fn costly() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = Vec::new();
                loop {
                    let end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        let mut chunk = [0u8; 4096];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..end]).into_owned();
                    buf.drain(..end);
                    let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
                    let n = path.rsplit('/').next().unwrap_or("0").to_owned();
                    let out = if path.starts_with("/cost/") {
                        format!("HTTP/1.1 200 OK\r\nx-cost: {n}\r\ncontent-length: 2\r\n\r\nok")
                    } else if path.starts_with("/trailer/") {
                        format!(
                            "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-cost\r\n\r\n2\r\nok\r\n0\r\nx-cost: {n}\r\n\r\n"
                        )
                    } else if path.starts_with("/json/") {
                        let body = format!("{{\"usage\": {{\"total_tokens\": {n}}}}}");
                        format!(
                            "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                            body.len()
                        )
                    } else if path == "/fail" {
                        "HTTP/1.1 503 Busy\r\ncontent-length: 0\r\n\r\n".to_owned()
                    } else {
                        "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok".to_owned()
                    };
                    if s.write_all(out.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// Sends `path` (on HTTP/1.0 too: hyper's path) and waits until the end
/// phase has settled (what is left moved, or stayed at `want`).
async fn costs(gw: &ratewarden_gateway::server::Running, path: &str, http10: bool) -> u16 {
    if http10 {
        let out = support::binary_free_http10(gw.listen(), path).await;
        out.split(' ').nth(1).unwrap().parse().unwrap()
    } else {
        send(gw.listen(), "GET", path, &[], "")
            .await
            .status
            .as_u16()
    }
}

async fn charged_by_the_header(http10: bool) {
    let up = costly().await;
    let yaml = "rules:\n  - name: units\n    limit: 20\n    window: 1h\n    cost: {from: header, header: X-Cost, reserve: 5}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let admin = gw.admin.unwrap();
    assert_eq!(left(admin, "units").await, 19);
    // Reserved 5, cost 12: 7 more charged (12 used).
    assert_eq!(costs(&gw, "/cost/12", http10).await, 200);
    wait_left(admin, "units", 7).await;
    // Its trailer names the cost: 1 (13 used; 4 given back).
    assert_eq!(costs(&gw, "/trailer/1", http10).await, 200);
    wait_left(admin, "units", 6).await;
    // Reserved 5, cost 3: 2 given back (16 used).
    assert_eq!(costs(&gw, "/cost/3", http10).await, 200);
    wait_left(admin, "units", 3).await;
    // 4 left, 5 to reserve: refused before the upstream.
    assert_eq!(costs(&gw, "/cost/1", http10).await, 429);
    wait_left(admin, "units", 3).await;
    gw.shutdown().await;
}

#[tokio::test]
async fn the_cost_an_answer_names_replaces_its_reservation_on_http1() {
    charged_by_the_header(false).await;
}

#[tokio::test]
async fn the_cost_an_answer_names_replaces_its_reservation_on_hypers_path() {
    charged_by_the_header(true).await;
}

/// `from: json`: a number in the answer; an upstream failing before any
/// output gives the reservation back.
#[tokio::test]
async fn a_json_answers_cost_and_a_failure_before_output() {
    let up = costly().await;
    let yaml = "rules:\n  - name: tokens\n    limit: 100\n    window: 1h\n    cost: {from: json, pointer: /usage/total_tokens, reserve: 10}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let admin = gw.admin.unwrap();
    assert_eq!(costs(&gw, "/json/42", false).await, 200);
    wait_left(admin, "tokens", 57).await;
    assert_eq!(costs(&gw, "/fail", false).await, 503);
    // Refunded: the reservation of 10 is not kept.
    wait_left(admin, "tokens", 57).await;
    // An answer that is not JSON names no cost: the reservation stays.
    assert_eq!(costs(&gw, "/", false).await, 200);
    wait_left(admin, "tokens", 47).await;
    gw.shutdown().await;
}

/// The bound on what a rule charged by its answers lets through: each
/// request in flight may cost more than it reserved, and admission sees
/// only the reservations. Limit 10, reserve 2, answers that cost 5: five
/// requests in flight are admitted (10 reserved), a sixth is refused, and
/// when the five end, 25 units were served, 15 over, which is the five in
/// flight times (cost - reserve); the rule's state saturates at its limit,
/// so nothing more is admitted in the window.
#[tokio::test]
async fn over_admission_is_the_requests_in_flight_times_cost_over_reserve() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let up = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let (release, held) = tokio::sync::watch::channel(false);
    {
        let seen = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut s, _)) = listener.accept().await else {
                    return;
                };
                let seen = seen.clone();
                let mut held = held.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        let mut chunk = [0u8; 1024];
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    seen.fetch_add(1, Ordering::SeqCst);
                    let _ = held.wait_for(|go| *go).await;
                    let out = "HTTP/1.1 200 OK\r\nx-cost: 5\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok";
                    let _ = s.write_all(out.as_bytes()).await;
                });
            }
        });
    }
    let yaml = "rules:\n  - name: units\n    limit: 10\n    window: 1h\n    cost: {from: header, header: X-Cost, reserve: 2}\n";
    let gw = support::gateway(yaml, &format!("http://{up}"), None).await;
    let admin = gw.admin.unwrap();
    let listen = gw.listen();
    let in_flight: Vec<_> = (0..5)
        .map(|_| tokio::spawn(async move { send(listen, "GET", "/a", &[], "").await.status }))
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while seen.load(Ordering::SeqCst) < 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "the five never reached the upstream"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    // 10 reserved: the sixth is refused before the upstream.
    assert_eq!(
        send(listen, "GET", "/a", &[], "").await.status.as_u16(),
        429
    );
    release.send(true).unwrap();
    for r in in_flight {
        assert_eq!(r.await.unwrap().as_u16(), 200);
    }
    assert_eq!(seen.load(Ordering::SeqCst), 5, "served: 5 x 5 = 25 units");
    // Charged up to the limit, not past it: the window is spent.
    wait_left(admin, "units", 0).await;
    assert_eq!(
        send(listen, "GET", "/a", &[], "").await.status.as_u16(),
        429
    );
    assert_eq!(seen.load(Ordering::SeqCst), 5);
    gw.shutdown().await;
}

/// An app that decides with `/v1/check` and learns the cost after:
/// `/v1/report` with what it reserved and what the answer used corrects
/// the charge, up or down, in one store call.
#[tokio::test]
async fn v1_report_corrects_a_checked_reservation_to_what_was_used() {
    let yaml = "rules:\n  - name: tokens\n    limit: 1000\n    window: 1h\n";
    let gw = support::gateway(yaml, "echo", None).await;
    let admin = gw.admin.unwrap();
    let json = [("content-type", "application/json")];
    let check = send(
        admin,
        "POST",
        "/v1/check",
        &json,
        r#"{"rule":"tokens","key":"127.0.0.1","cost":300}"#,
    )
    .await;
    assert_eq!(check.status.as_u16(), 200, "{}", check.body);
    assert_eq!(left(admin, "tokens").await, 1000 - 300 - 1);
    let r = send(
        admin,
        "POST",
        "/v1/report",
        &json,
        r#"{"rule":"tokens","key":"127.0.0.1","reserved":300,"used":120}"#,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.body);
    let v: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(
        (v["charged"].as_u64(), v["refunded"].as_u64()),
        (Some(0), Some(180))
    );
    assert_eq!(left(admin, "tokens").await, 1000 - 120 - 1);
    let r = send(
        admin,
        "POST",
        "/v1/report",
        &json,
        r#"{"rule":"tokens","key":"127.0.0.1","reserved":10,"used":60}"#,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.body);
    assert_eq!(left(admin, "tokens").await, 1000 - 170 - 1);
    gw.shutdown().await;
}
