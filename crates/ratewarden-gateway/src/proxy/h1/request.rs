//! Request heads on the HTTP/1.1 path.

use std::mem::MaybeUninit;
use std::ops::Range;

use http::Method;

use crate::proxy::forward::{Edge, check_host};

/// Longest request head this path reads; longer ones go to hyper (which
/// answers 431 past its own limit).
pub(crate) const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in a request or response head this path parses
/// (hyper's limit too).
pub(crate) const MAX_HEADERS: usize = 100;
/// Largest request body this path buffers before forwarding (nginx buffers
/// request bodies too); larger ones are streamed by hyper.
pub(crate) const MAX_BODY: usize = 64 * 1024;

/// How the request body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum BodyLen {
    /// `Content-Length` bytes (0 when absent).
    Length(usize),
    /// `Transfer-Encoding: chunked`: decoded here, forwarded with a length.
    Chunked,
}

/// A parsed request head: where its parts are in the connection's buffer.
pub(crate) struct Head {
    /// Bytes of the head, blank line included.
    pub(crate) len: usize,
    pub(crate) method: Method,
    pub(crate) target: Range<usize>,
    pub(crate) body: BodyLen,
    /// The client asked to close after this exchange.
    pub(crate) close: bool,
}

pub(crate) enum Parsed {
    Complete(Head),
    Partial,
    /// Valid or not, not for this path: hyper takes the connection.
    Elsewhere,
    /// Refused at the edge, answered here (and the connection closed).
    Refused(Edge),
}

/// Offsets of `part` inside `buf` (`part` is a slice of `buf`). An empty
/// part is `0..0`: httparse may hand an empty reason phrase or field value
/// as a string of its own, not a slice of `buf` (a fuzzed answer found it).
pub(crate) fn span(buf: &[u8], part: &[u8]) -> Range<usize> {
    if part.is_empty() {
        return 0..0;
    }
    let start = (part.as_ptr() as usize)
        .checked_sub(buf.as_ptr() as usize)
        .filter(|s| s + part.len() <= buf.len())
        .expect("a slice of the buffer");
    start..start + part.len()
}

/// Parses the request head at the start of `buf`, recording its header
/// fields as (name, value) offsets in `fields`.
///
/// What hyper would do with the same bytes, where this path does otherwise:
/// hyper accepts a missing or repeated `Host` and `CONNECT` (the gateway
/// refuses both on hyper's path too, after parsing); it accepts
/// `Content-Length` with `Transfer-Encoding` (the latter wins) and codings
/// before `chunked`, which go to hyper; it streams chunked bodies, which
/// this path reads whole (up to [`MAX_BODY`]) and forwards with a length.
pub(crate) fn parse_request(buf: &[u8], fields: &mut Vec<(Range<usize>, Range<usize>)>) -> Parsed {
    // Left uninitialised: parsing writes the fields it returns (zeroing 100
    // of them per parse would cost more than the parse of a small head).
    let mut raw = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut req = httparse::Request::new(&mut []);
    let len = match req.parse_with_uninit_headers(buf, &mut raw) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Parsed::Partial,
        Err(_) => return Parsed::Elsewhere,
    };
    let (Some(1), Some(method), Some(target)) = (req.version, req.method, req.path) else {
        return Parsed::Elsewhere;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return Parsed::Elsewhere;
    };
    if method == Method::CONNECT {
        return Parsed::Refused(Edge::Connect);
    }
    // Origin form, or `*`, in the characters `http::Uri` accepts; no
    // fragment. Absolute form goes to hyper.
    let plain = |b: &u8| (0x21..=0x7e).contains(b) && !b"#\"<>\\^`{|}".contains(b);
    if !(target.starts_with('/') || target == "*") || !target.as_bytes().iter().all(plain) {
        return Parsed::Elsewhere;
    }
    fields.clear();
    let mut length = None;
    let mut chunked = None;
    let mut close = false;
    let mut hosts = (None, 0);
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            match (length, decimal(h.value)) {
                (None, Some(n)) => length = Some(n),
                _ => return Parsed::Elsewhere,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Exactly one field saying exactly `chunked`; anything else
            // (other codings, several fields) is hyper's to judge.
            match chunked {
                None if h.value.trim_ascii().eq_ignore_ascii_case(b"chunked") => chunked = Some(()),
                _ => return Parsed::Elsewhere,
            }
        } else if name.eq_ignore_ascii_case(b"expect") || name.eq_ignore_ascii_case(b"upgrade") {
            return Parsed::Elsewhere;
        } else if name.eq_ignore_ascii_case(b"host") {
            hosts = (Some(h.value), hosts.1 + 1);
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if !token.is_empty() && !token.eq_ignore_ascii_case(b"keep-alive") {
                    // Names more hop-by-hop headers: rare; hyper's path drops them.
                    return Parsed::Elsewhere;
                }
            }
        }
        fields.push((span(buf, name), span(buf, h.value)));
    }
    let host = match hosts {
        (v, 1) => v,
        (_, 0) => None,
        _ => return Parsed::Refused(Edge::TwoHosts),
    };
    if let Err(e) = check_host(host.into_iter()) {
        return Parsed::Refused(e);
    }
    let body = match (chunked, length) {
        (Some(()), Some(_)) => return Parsed::Elsewhere,
        (Some(()), None) => BodyLen::Chunked,
        (None, Some(n)) if n > MAX_BODY as u64 => return Parsed::Elsewhere,
        (None, n) => BodyLen::Length(n.unwrap_or(0) as usize),
    };
    Parsed::Complete(Head {
        len,
        method,
        target: span(buf, target.as_bytes()),
        body,
        close,
    })
}

/// A `Content-Length` value: decimal digits only.
pub(crate) fn decimal(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str) -> Parsed {
        parse_request(text.as_bytes(), &mut vec![])
    }

    fn refused(text: &str) -> Option<Edge> {
        match request(text) {
            Parsed::Refused(e) => Some(e),
            _ => None,
        }
    }

    #[test]
    fn plain_requests_stay_and_everything_else_goes_to_hyper() {
        let Parsed::Complete(h) =
            request("POST /a?b=1 HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
        else {
            panic!("a plain POST is this path's");
        };
        assert_eq!(
            (h.method, h.body, h.close),
            (Method::POST, BodyLen::Length(3), false)
        );
        assert!(matches!(
            request("GET / HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n"),
            Parsed::Complete(Head { close: true, .. })
        ));
        assert!(matches!(
            request("POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: Chunked\r\n\r\n"),
            Parsed::Complete(Head {
                body: BodyLen::Chunked,
                ..
            })
        ));
        assert!(matches!(
            request("OPTIONS * HTTP/1.1\r\nhost: x\r\n\r\n"),
            Parsed::Complete(_)
        ));
        assert!(matches!(request("GET / HTTP/1.1\r\nhost"), Parsed::Partial));
        for elsewhere in [
            "GET / HTTP/1.0\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\nhost: x\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: gzip, chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ntransfer-encoding: chunked\r\ncontent-length: 3\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nhost: x\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\nhost: x\r\ncontent-length: 9999999\r\n\r\n",
            "GET /a|b HTTP/1.1\r\nhost: x\r\n\r\n",
            "\u{0}garbage\r\n\r\n",
        ] {
            assert!(
                matches!(request(elsewhere), Parsed::Elsewhere),
                "{elsewhere:?}"
            );
        }
    }

    #[test]
    fn the_edge_refuses_bad_hosts_and_connect() {
        assert_eq!(refused("GET / HTTP/1.1\r\n\r\n"), Some(Edge::NoHost));
        assert_eq!(
            refused("GET / HTTP/1.1\r\nhost: a\r\nHost: a\r\n\r\n"),
            Some(Edge::TwoHosts)
        );
        assert_eq!(
            refused("GET / HTTP/1.1\r\nhost: a b\r\n\r\n"),
            Some(Edge::BadHost)
        );
        assert_eq!(
            refused("CONNECT example.com:443 HTTP/1.1\r\nhost: example.com:443\r\n\r\n"),
            Some(Edge::Connect)
        );
    }

    #[test]
    fn fields_with_underscores_are_left_out_unless_kept() {
        let text = b"GET / HTTP/1.1\r\nhost: x\r\nx_user_id: 7\r\nx-user-id: 8\r\n\r\n";
        let mut fields = vec![];
        assert!(matches!(
            parse_request(text, &mut fields),
            Parsed::Complete(_)
        ));
        let seen = |underscores| ratewarden_tower::view::Fields::Raw {
            head: text,
            spans: &fields,
            underscores,
        };
        assert_eq!(seen(false).get("x-user-id"), Some(&b"8"[..]));
        assert_eq!(seen(false).get("x_user_id"), None);
        assert_eq!(seen(true).get("x_user_id"), Some(&b"7"[..]));
    }
}
