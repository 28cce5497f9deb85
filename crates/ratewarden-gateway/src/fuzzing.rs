//! Checks run by the fuzz targets (`fuzz/`) and, on their saved corpora,
//! by the ordinary tests (`tests/fuzz_corpus.rs`). Each takes any bytes,
//! must not panic on its own, and panics when a property fails. Not a
//! stable API.
//!
//! The own parsers are guilty until fuzzed: the HTTP/1.1 path reads
//! requests and answers with code of ours where hyper would have, so
//! [`differential`] runs hyper on the same bytes and asserts they agree;
//! the RLS listener reads `RateLimitRequest` with code of ours where prost
//! would have, so [`rls_request`] runs prost on the same bytes.

use std::net::IpAddr;
use std::ops::Range;

use http::{HeaderMap, HeaderName, HeaderValue, Method};
use ratewarden_tower::identity::ClientIp;
use ratewarden_tower::path;
use ratewarden_tower::view::{Fields, RequestView};

use crate::proxy::forward::{self, Edge};
use crate::proxy::h1::chunked::{Chunks, valid_trailers};
use crate::proxy::h1::request::{BodyLen, MAX_BODY, MAX_HEAD, Parsed, parse_request};
use crate::proxy::h1::response::parse_response;

/// What the HTTP/1.1 path does with the first request in some bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Own {
    /// A whole request: method, target, body.
    Accept(Method, String, Vec<u8>),
    /// Refused at the edge.
    Refuse(Edge),
    /// Handed to hyper.
    Hyper,
    /// More bytes needed.
    Partial,
}

/// How the HTTP/1.1 path reads the first request in `data` (head, body,
/// and the path a rule would see).
pub fn own_request(data: &[u8]) -> Own {
    let mut fields = vec![];
    let head = match parse_request(data, &mut fields) {
        Parsed::Complete(h) => h,
        Parsed::Partial if data.len() < MAX_HEAD => return Own::Partial,
        Parsed::Partial | Parsed::Elsewhere => return Own::Hyper,
        Parsed::Refused(e) => return Own::Refuse(e),
    };
    for (name, value) in &fields {
        assert!(name.end <= head.len && value.end <= head.len);
    }
    let body = match head.body {
        BodyLen::Length(n) => match data.get(head.len..head.len + n) {
            Some(b) => b.to_vec(),
            None => return Own::Partial,
        },
        BodyLen::Chunked => {
            let rest = &data[head.len..];
            let (mut spans, mut trailer) = (vec![], vec![]);
            let end = Chunks::default().decode(rest, &mut spans, &mut trailer);
            let data_len: usize = spans.iter().map(Range::len).sum();
            match end {
                Err(_) => return Own::Refuse(Edge::BadBody),
                Ok(_) if data_len > MAX_BODY || rest.len() > MAX_BODY + MAX_HEAD => {
                    return Own::Hyper;
                }
                Ok(None) => return Own::Partial,
                Ok(Some(n)) => {
                    assert!(n <= rest.len());
                    let section: Vec<u8> = trailer
                        .iter()
                        .flat_map(|r| rest[r.clone()].to_vec())
                        .collect();
                    if !valid_trailers(&section) {
                        return Own::Refuse(Edge::BadBody);
                    }
                    spans
                        .iter()
                        .flat_map(|r| rest[r.clone()].to_vec())
                        .collect()
                }
            }
        }
    };
    let target = std::str::from_utf8(&data[head.target.clone()]).expect("checked ASCII");
    if let Err(e) = forward::rule_path(&head.method, target) {
        return Own::Refuse(e);
    }
    Own::Accept(head.method, target.to_owned(), body)
}

/// Request heads and body framing of the HTTP/1.1 path: never panics, and
/// what it reads lies within what it was given.
pub fn h1_request(data: &[u8]) {
    let _ = own_request(data);
    // Chunked framing fed in pieces finds the same end as fed whole.
    let whole = Chunks::default().feed(data);
    let split = data.len() / 2;
    let mut c = Chunks::default();
    let pieces = match c.feed(&data[..split]) {
        Ok(Some(n)) => Ok(Some(n)),
        Ok(None) => c.feed(&data[split..]).map(|r| r.map(|n| n + split)),
        Err(e) => Err(e),
    };
    assert_eq!(whole, pieces);
}

/// The one request view over a request head: the HTTP/1.1 path's view (the
/// bytes it read) and hyper's (a `HeaderMap` of the same fields) answer
/// every header alike; the host, query and cookie readers never panic,
/// and the host is lower case, without a port or a trailing dot.
pub fn request_view(data: &[u8]) {
    let mut spans = vec![];
    let head = match parse_request(data, &mut spans) {
        Parsed::Complete(h) => h,
        _ => return,
    };
    let target = std::str::from_utf8(&data[head.target.clone()]).expect("checked ASCII");
    let mut map = HeaderMap::new();
    for (n, v) in &spans {
        let name = HeaderName::from_bytes(&data[n.clone()]).expect("httparse checked the name");
        let value = HeaderValue::from_bytes(&data[v.clone()]).expect("httparse checked the value");
        map.append(name, value);
    }
    let raw = RequestView {
        target,
        fields: Fields::Raw {
            head: &data[..head.len],
            spans: &spans,
            underscores: true,
        },
        ..RequestView::bare(&head.method, "/")
    };
    let mapped = RequestView {
        fields: Fields::Map(&map),
        ..raw
    };
    let names: Vec<String> = spans
        .iter()
        .map(|(n, _)| String::from_utf8_lossy(&data[n.clone()]).to_ascii_uppercase())
        .chain(["host", "cookie", "x-absent"].map(String::from))
        .collect();
    for name in &names {
        let a: Vec<&[u8]> = raw.headers(name).collect();
        let b: Vec<&[u8]> = mapped.headers(name).collect();
        assert_eq!(a, b, "{name}");
    }
    let host = raw.host();
    assert_eq!(host, mapped.host());
    if let Some(h) = host {
        assert!(!h.is_empty() && !h.ends_with('.'), "{h:?}");
        assert!(!h.bytes().any(|b| b.is_ascii_uppercase()), "{h:?}");
        assert!(h.starts_with('[') || !h.contains(':'), "{h:?}");
    }
    for pair in raw.query().unwrap_or("").split('&') {
        let name = pair.split('=').next().unwrap_or("");
        // Each name given as sent finds at least its own occurrence when
        // it has no escapes.
        let found = raw.query_values(name).count();
        if !name.contains('%') && !pair.is_empty() {
            assert!(found >= 1, "{pair:?}");
        }
    }
    for name in ["sid", "session", ""] {
        let _ = (raw.cookie(name), mapped.cookie(name));
        assert_eq!(raw.cookie(name), mapped.cookie(name));
    }
}

/// The JWT verifier on any token: never panics, and never trusts one (no
/// input can carry a valid signature for this verifier's keys, or its
/// HMAC secret).
pub fn jwt(data: &[u8]) {
    use std::sync::OnceLock;
    static V: OnceLock<crate::jwt::Verifier> = OnceLock::new();
    let v = V.get_or_init(|| {
        let jwks = r#"{"keys": [
            {"kty": "RSA", "kid": "r", "n": "wWd3jQ", "e": "AQAB"},
            {"kty": "EC", "kid": "e", "crv": "P-256", "x": "AQID", "y": "BAUG"},
            {"kty": "OKP", "kid": "o", "crv": "Ed25519", "x": "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA"}
        ]}"#;
        crate::jwt::Verifier::new(
            crate::jwt::From::Header("authorization".into()),
            Some(jwks),
            Some(b"fuzzing secret, 32 bytes long..."),
            Some("iss".into()),
            vec!["aud".into()],
            30,
        )
        .expect("a valid verifier")
    });
    let token = String::from_utf8_lossy(data);
    assert!(v.verify(&token, 1_800_000_000).is_err(), "trusted: {token}");
}

/// Upstream response heads and the chunk scanner of the relay.
pub fn h1_response(data: &[u8]) {
    let mut fields = vec![];
    for head_request in [false, true] {
        if let Ok(Some(h)) = parse_response(data, head_request, &mut fields) {
            assert!(h.len <= data.len());
            for (n, v) in &fields {
                assert!(n.end <= h.len && v.end <= h.len);
            }
            let body = &data[h.len..];
            let _ = Chunks::default().feed(body);
        }
    }
}

/// The path normaliser: idempotent, never above the root, and the same for
/// paths that differ only in ways a server reads alike.
pub fn path_normalizer(data: &[u8]) {
    let Ok(raw) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(n) = path::normalize(raw) else {
        return;
    };
    assert_eq!(
        path::normalize(&n).as_deref(),
        Ok(&*n),
        "idempotent: {raw:?}"
    );
    assert!(n.starts_with('/'), "{raw:?} -> {n:?}");
    assert!(!n.contains("//"), "{raw:?} -> {n:?}");
    assert!(
        !n.split('/').any(|s| s == "." || s == ".."),
        "dot segments left: {raw:?} -> {n:?}"
    );
    // Equivalent spellings: an encoded letter, a `./`, an `x/../`, a
    // doubled slash, inserted at each slash of the raw path.
    for (i, _) in raw.match_indices('/') {
        let (a, b) = raw.split_at(i + 1);
        for insert in ["./", "x/../", "/", "%2e/", ";p=1/"] {
            let variant = format!("{a}{insert}{b}");
            assert_eq!(
                path::normalize(&variant).as_deref(),
                Ok(&*n),
                "{raw:?} vs {variant:?}"
            );
        }
        if let Some(c) = b.chars().next().filter(char::is_ascii_alphanumeric) {
            let variant = format!("{a}%{:02x}{}", c as u32, &b[1..]);
            assert_eq!(
                path::normalize(&variant).as_deref(),
                Ok(&*n),
                "{raw:?} vs {variant:?}"
            );
        }
    }
    let _ = path::normalize_for_upstream(raw);
}

/// `Forwarded` / `X-Forwarded-For`: the client found is the peer or an
/// address written in the headers, and its key is well formed.
pub fn forwarded(data: &[u8]) {
    let mut headers = HeaderMap::new();
    for line in data.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(&line[..colon]),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        headers.append(n, v);
    }
    let peer: IpAddr = "10.1.2.3".parse().expect("literal");
    let c = ClientIp {
        forwarded: true,
        header: ratewarden_tower::identity::ForwardHeader::Forwarded,
        trusted_proxies: vec![
            "10.0.0.0/8".parse().expect("literal"),
            "::/0".parse().expect("literal"),
        ],
        ipv6_prefix: 48,
    };
    let ip = c.resolve(peer, ratewarden_tower::view::Fields::Map(&headers));
    if ip != peer {
        let text: String = headers
            .values()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase())
            .collect();
        let written = match ip {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => v6.to_string(),
        };
        // IPv6 may be written in another (equivalent) form; IPv4 as is.
        assert!(
            ip.is_ipv6() || text.contains(&written),
            "{ip} not in {text:?}"
        );
    }
    let key = c.key(ip);
    assert!(
        key.parse::<IpAddr>().is_ok() || key.ends_with("/48"),
        "{key}"
    );
}

/// The config loader: any text loads or is refused with located errors.
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let overrides = crate::config::Overrides {
        upstream: Some("echo".into()),
        ..Default::default()
    };
    if let Err(errors) = crate::config::load(text, "fuzz.yaml", &overrides) {
        for e in errors.all() {
            assert!(!e.key.is_empty() && !e.message.is_empty(), "{e}");
        }
    }
}

/// What hyper (as the gateway runs it, with the edge checks of hyper's
/// path after its parse) does with the first request in some bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hyper {
    /// A whole request: method, target, body.
    Accept(Method, String, Vec<u8>),
    /// Refused: by hyper's parser, by a broken body, or by the edge.
    Refuse,
}

/// Runs hyper's HTTP/1 server on `data` followed by end of input.
pub fn hyper_request(data: &[u8]) -> Hyper {
    use std::sync::{Arc, Mutex};
    thread_local! {
        static RT: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
    }
    let got: Arc<Mutex<Option<Hyper>>> = Arc::default();
    let slot = got.clone();
    let data = data.to_vec();
    RT.with(|rt| {
        rt.block_on(async move {
            use http_body_util::BodyExt;
            use tokio::io::AsyncWriteExt;
            let (mut client, server) = tokio::io::duplex(data.len() + 1024);
            let svc =
                hyper::service::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                    let slot = slot.clone();
                    async move {
                        let (parts, body) = req.into_parts();
                        let target = parts
                            .uri
                            .path_and_query()
                            .map_or("/", |p| p.as_str())
                            .to_owned();
                        let seen = match body.collect().await {
                            Err(_) => Hyper::Refuse,
                            Ok(b) => match crate::proxy::hyper::edge_check(&parts)
                                .and_then(|()| forward::rule_path(&parts.method, &target).map(drop))
                            {
                                Ok(()) => {
                                    Hyper::Accept(parts.method, target, b.to_bytes().to_vec())
                                }
                                Err(_) => Hyper::Refuse,
                            },
                        };
                        let mut slot = slot.lock().expect("not poisoned");
                        if slot.is_none() {
                            *slot = Some(seen);
                        }
                        Ok::<_, std::convert::Infallible>(http::Response::new(
                            http_body_util::Empty::<bytes::Bytes>::new(),
                        ))
                    }
                });
            // half_close: the end of input must not drop a request hyper
            // has read but not yet handed over.
            let conn = hyper::server::conn::http1::Builder::new()
                .half_close(true)
                .serve_connection(hyper_util::rt::TokioIo::new(server), svc);
            let write = async move {
                let _ = client.write_all(&data).await;
                let _ = client.shutdown().await;
                // Keep reading so hyper's answers never fill the pipe.
                let mut sink = vec![];
                let _ = tokio::io::AsyncReadExt::read_to_end(&mut client, &mut sink).await;
            };
            let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                tokio::join!(conn, write)
            })
            .await;
        })
    });
    let seen = got.lock().expect("not poisoned").take();
    seen.unwrap_or(Hyper::Refuse)
}

/// The HTTP/1.1 path and hyper agree on the first request in `data`: both
/// accept it with the same method, target and body, or both refuse it, or
/// the HTTP/1.1 path hands the connection to hyper.
pub fn differential(data: &[u8]) {
    let own = own_request(data);
    if matches!(own, Own::Hyper | Own::Partial) {
        return;
    }
    let hyper = hyper_request(data);
    match (&own, &hyper) {
        (Own::Accept(m, t, b), Hyper::Accept(hm, ht, hb)) => {
            assert_eq!(
                (m, t, b),
                (hm, ht, hb),
                "{:?}",
                String::from_utf8_lossy(data)
            );
        }
        (Own::Refuse(_), Hyper::Refuse) => {}
        _ => panic!(
            "the HTTP/1.1 path says {own:?}, hyper {hyper:?}: {:?}",
            String::from_utf8_lossy(data)
        ),
    }
}

/// `RateLimitRequest` read by the RLS listener's own decoder and by prost
/// with envoy-types' messages: both refuse `data`, or both read the same
/// fields. (envoy-types comes with the `fuzzing` feature, which the fuzz
/// targets and this crate's tests turn on.)
pub fn rls_request(data: &[u8]) {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
        Entry, RateLimitOverride,
    };
    use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
    use prost::Message as _;
    let ours = crate::front::rls::wire::decode(data);
    let theirs = RateLimitRequest::decode(data);
    match (&ours, &theirs) {
        (Ok(r), Ok(b)) => {
            let a = RateLimitRequest {
                domain: r.domain.to_owned(),
                descriptors: r
                    .descriptors
                    .iter()
                    .map(|d| RateLimitDescriptor {
                        entries: r
                            .entries_of(d)
                            .iter()
                            .map(|(k, v)| Entry {
                                key: (*k).to_owned(),
                                value: (*v).to_owned(),
                            })
                            .collect(),
                        limit: d.limit.map(|(rpu, unit)| RateLimitOverride {
                            requests_per_unit: rpu,
                            unit,
                        }),
                        hits_addend: d
                            .hits_addend
                            .map(|value| envoy_types::pb::google::protobuf::UInt64Value { value }),
                        is_negative_hits: d.is_negative_hits,
                    })
                    .collect(),
                hits_addend: r.hits_addend,
            };
            assert_eq!(&a, b, "{data:02x?}");
        }
        (Err(_), Err(_)) => {}
        _ => panic!("{data:02x?}: ours {ours:?}, prost {theirs:?}"),
    }
}

/// The one walker of forwarding chains ([`ClientIp::behind`]) against a
/// model written plainly (every hop of the named header gathered, then
/// walked from the right), for each header an operator can name and a
/// trust set the first byte chooses: the same client, whatever the other
/// two headers say (a header not named is never read), and always the peer
/// or an address written in the named header. Input: a choice byte, then
/// `name: value` lines.
pub fn forwarded_walk(data: &[u8]) {
    use ratewarden_tower::identity::{ForwardHeader, MAX_HEADER_BYTES, MAX_HOPS};
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let header = [
        ForwardHeader::XForwardedFor,
        ForwardHeader::Forwarded,
        ForwardHeader::XRealIp,
    ][usize::from(choice % 3)];
    let trusted_proxies: Vec<ipnet::IpNet> = match (choice >> 2) & 3 {
        0 => vec!["10.0.0.0/8".parse().expect("literal")],
        1 => vec![
            "0.0.0.0/0".parse().expect("literal"),
            "::/0".parse().expect("literal"),
        ],
        2 => vec![
            "10.0.0.0/8".parse().expect("literal"),
            "2001:db8::/32".parse().expect("literal"),
        ],
        _ => vec![],
    };
    let c = ClientIp {
        forwarded: true,
        header,
        trusted_proxies,
        ipv6_prefix: 64,
    };
    let mut headers = HeaderMap::new();
    for line in rest.split(|b| *b == b'\n') {
        let Some(colon) = line.iter().position(|b| *b == b':') else {
            continue;
        };
        let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(line[..colon].trim_ascii()),
            HeaderValue::from_bytes(line[colon + 1..].trim_ascii()),
        ) else {
            continue;
        };
        headers.append(n, v);
    }
    let peer: IpAddr = "10.1.2.3".parse().expect("literal");
    let got = c.resolve(peer, ratewarden_tower::view::Fields::Map(&headers));
    // The model.
    let node = |s: &str| -> Option<IpAddr> {
        let s = s.trim().trim_matches('"');
        if let Ok(ip) = s.parse() {
            return Some(ip);
        }
        if let Some(rest) = s.strip_prefix('[') {
            return rest.split_once(']')?.0.parse().ok();
        }
        let (host, port) = s.rsplit_once(':')?;
        port.parse::<u16>().ok()?;
        host.parse().ok()
    };
    let want = {
        let fields: Vec<&[u8]> = headers
            .get_all(header.name())
            .iter()
            .map(HeaderValue::as_bytes)
            .collect();
        let mut hops: Vec<Option<IpAddr>> = vec![];
        for f in &fields {
            match ratewarden_tower::view::text(f) {
                None => hops.push(None),
                Some(t) => {
                    for hop in t.split(',') {
                        hops.push(match header {
                            ForwardHeader::Forwarded => hop
                                .split(';')
                                .filter_map(|p| p.trim().split_once('='))
                                .find(|(k, _)| k.trim().eq_ignore_ascii_case("for"))
                                .and_then(|(_, v)| node(v)),
                            _ => node(hop),
                        });
                    }
                }
            }
        }
        let mut client = peer;
        if fields.iter().map(|f| f.len()).sum::<usize>() <= MAX_HEADER_BYTES {
            for hop in hops.into_iter().rev().take(MAX_HOPS) {
                match hop {
                    Some(ip) => {
                        client = ip;
                        if !c.trusted(ip) {
                            break;
                        }
                    }
                    None => break,
                }
            }
        }
        if c.trusted(peer) { client } else { peer }
    };
    assert_eq!(got, want, "{header:?}");
    // The headers not named, however spoofed, change nothing.
    let mut spoofed = headers.clone();
    for other in ["forwarded", "x-forwarded-for", "x-real-ip"] {
        if other != header.name() {
            spoofed.append(
                HeaderName::from_static(other),
                HeaderValue::from_static("for=203.0.113.66, 203.0.113.66"),
            );
        }
    }
    assert_eq!(
        c.resolve(peer, ratewarden_tower::view::Fields::Map(&spoofed)),
        got,
        "a header not named was read"
    );
    if got != peer {
        let text: String = headers
            .get_all(header.name())
            .iter()
            .map(|v| String::from_utf8_lossy(v.as_bytes()).to_ascii_lowercase())
            .collect();
        assert!(
            got.is_ipv6() || text.contains(&got.to_string()),
            "{got} not in {text:?}"
        );
    }
}

/// The authorisation listener's dialects (`front::authz`): any hook
/// request, from a trusted proxy or not, is described or refused, never
/// panics; what is described is a path a rule can see, carries none of the
/// hook's own fields, and names a client other than the proxy only when
/// the proxy is trusted. Input: a byte choosing the dialect and whether
/// the proxy is trusted, then `METHOD TARGET` and header lines; or, for
/// Envoy's gRPC `Check`, a `CheckRequest` message.
pub fn authz_dialect(data: &[u8]) {
    use crate::front::authz::{Dialect, describe, describe_check};
    use prost::Message;
    let Some((&choice, rest)) = data.split_first() else {
        return;
    };
    let proxy: std::net::IpAddr = [127, 0, 0, 1].into();
    let trusted_proxy = choice & 0x10 != 0;
    let trusted = ClientIp {
        trusted_proxies: if trusted_proxy {
            vec!["127.0.0.1/32".parse().expect("literal")]
        } else {
            vec![]
        },
        ..ClientIp::default()
    };
    let asked = if choice & 0x3 == 3 {
        let Ok(check) = crate::front::envoy_auth::CheckRequest::decode(rest) else {
            return;
        };
        describe_check(&check, proxy, &trusted)
    } else {
        let dialect = [Dialect::Nginx, Dialect::Forward, Dialect::Envoy][usize::from(choice & 0x3)];
        let text = String::from_utf8_lossy(rest);
        let mut lines = text.split('\n');
        let first = lines.next().unwrap_or("");
        let (method, target) = first.split_once(' ').unwrap_or((first, "/"));
        let Ok(method) = Method::from_bytes(method.as_bytes()) else {
            return;
        };
        let mut headers = http::HeaderMap::new();
        for line in lines {
            if let Some((k, v)) = line.split_once(':')
                && let (Ok(k), Ok(v)) = (
                    http::HeaderName::from_bytes(k.trim().as_bytes()),
                    http::HeaderValue::from_str(v.trim()),
                )
            {
                headers.append(k, v);
            }
        }
        describe(dialect, &method, target, &headers, proxy, &trusted)
    };
    if let Ok(a) = asked {
        assert!(a.path.starts_with('/') || a.path == "*", "{a:?}");
        assert!(a.target.starts_with('/'), "{a:?}");
        for hook in [
            "x-original-uri",
            "x-forwarded-uri",
            "x-forwarded-for",
            "x-real-ip",
        ] {
            assert!(!a.headers.contains_key(hook), "{a:?}");
        }
        if !trusted_proxy {
            assert_eq!(a.client, proxy, "an untrusted proxy's client believed");
        }
        // The view answers without panicking.
        let v = a.view();
        let _ = (
            v.host(),
            v.query(),
            v.query_values("q").count(),
            v.cookie("c"),
        );
    }
}

/// The LLM readers (`cost: {from: llm}`): an answer's usage, JSON or
/// streamed, read the same whatever pieces it arrives in (the first byte
/// chooses the pieces); a request body's reservation always at least one
/// unit and never below its input bound at weight 1.
pub fn llm_usage(data: &[u8]) {
    use crate::config::cost::{CostSource, CostSpec, Count, Dialect, LlmCost};
    use crate::proxy::flow::llm;
    use crate::proxy::flow::tap::{Meter, Read};
    let Some((&step, body)) = data.split_first() else {
        return;
    };
    let cost = LlmCost {
        dialect: Dialect::Auto,
        count: Count::Weights {
            input: 1.0,
            cached_input: 1.0,
            output: 1.0,
        },
        reserve: true,
        default_max_output: 1024,
        cap_max_output: true,
        include_usage: true,
    };
    let spec = std::sync::Arc::new(CostSpec {
        rule: "f".into(),
        source: CostSource::Llm(cost.clone()),
    });
    for ctype in ["text/event-stream", "application/json"] {
        let read = |pieces: usize| -> Read {
            let mut m = llm::LlmMeter::new(spec.clone(), None).expect("an llm spec");
            m.field("content-type", ctype.as_bytes());
            for p in body.chunks(pieces.max(1)) {
                m.data(p);
            }
            m.read()
        };
        let whole = read(body.len());
        assert_eq!(
            read(usize::from(step)),
            whole,
            "{ctype}: pieces changed the read"
        );
        assert_eq!(read(1), whole, "{ctype}: byte by byte changed the read");
    }
    if let Some(v) = llm::body_json(body) {
        for dialect in [None, Some(Dialect::OpenAi), Some(Dialect::Gemini)] {
            let a = llm::asked(dialect, &v, body.len());
            let r = llm::reservation(&cost, Some(&a));
            assert!(r >= 1 && r >= a.input_bound, "reserved {r} of {a:?}");
            // `cap_max_output`: what is lowered fits what was left, and the
            // body edited says it.
            let left = u64::from(step) * 16;
            if let Some(per) = llm::capped(&cost, &a, left, dialect, &v) {
                let mut lowered = a.clone();
                lowered.capped_to(Some(per));
                let fits = llm::reservation(&cost, Some(&lowered));
                assert!(fits <= left, "capped to {per}, reserved {fits} of {left}");
                let mut edited = v.clone();
                llm::edit(&mut edited, dialect, Some(per), true);
                let again = llm::asked(dialect, &edited, body.len());
                assert!(
                    again.max_output.is_some_and(|m| m <= per * a.choices),
                    "edited {edited}: {again:?}"
                );
            }
        }
    }
}

/// The trace context (`traceparent`, `tracestate`): a value read is
/// written back to the same trace and span with the same flag, a value
/// that is not read leaves no parent, and nothing panics.
pub fn traceparent(data: &[u8]) {
    use crate::observe::trace::{parse_traceparent, traceparent, valid_tracestate};
    if let Some(p) = parse_traceparent(data) {
        assert_ne!(p.trace_id, [0; 16]);
        assert_ne!(p.span_id, [0; 8]);
        let again = traceparent(&p.trace_id, &p.span_id, p.sampled);
        assert_eq!(parse_traceparent(&again), Some(p));
        if data.starts_with(b"00") {
            assert_eq!(
                &again[..53],
                &data[..53],
                "version 00's ids are read as written"
            );
        }
    }
    if valid_tracestate(data) {
        assert!(data.len() <= 512 && data.iter().all(u8::is_ascii_graphic_or_space));
    }
}

trait GraphicOrSpace {
    fn is_ascii_graphic_or_space(&self) -> bool;
}

impl GraphicOrSpace for u8 {
    fn is_ascii_graphic_or_space(&self) -> bool {
        self.is_ascii_graphic() || *self == b' '
    }
}
