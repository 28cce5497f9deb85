//! Request heads on the HTTP/1.1 path.

use std::mem::MaybeUninit;
use std::ops::Range;

use http::Method;
use http::header::{HeaderMap, HeaderName, HeaderValue};

/// Longest request head this path reads; longer ones go to hyper (which
/// answers 431 past its own limit).
pub const MAX_HEAD: usize = 16 * 1024;
/// Most header fields in a request or response head this path parses
/// (hyper's limit too).
pub(crate) const MAX_HEADERS: usize = 100;
/// Largest request body this path buffers before forwarding (nginx buffers
/// request bodies too); larger and chunked ones are streamed by hyper.
pub const MAX_BODY: usize = 64 * 1024;
/// A parsed request head: where its parts are in the connection's buffer.
pub(crate) struct Head {
    /// Bytes of the head, blank line included.
    pub(crate) len: usize,
    pub(crate) method: Method,
    pub(crate) target: Range<usize>,
    /// `Content-Length` (0 when absent).
    pub(crate) body: usize,
    /// The client asked to close after this exchange.
    pub(crate) close: bool,
}

pub(crate) enum Parsed {
    Complete(Head),
    Partial,
    /// Valid or not, not for this path: hyper takes the connection.
    Elsewhere,
}

/// Offsets of `part` inside `buf` (`part` is a slice of `buf`).
pub(crate) fn span(buf: &[u8], part: &[u8]) -> Range<usize> {
    let start = part.as_ptr() as usize - buf.as_ptr() as usize;
    start..start + part.len()
}

/// Parses the request head at the start of `buf`, recording its header
/// fields as (name, value) offsets in `fields`.
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
    // Origin form only, in the characters `http::Uri` accepts; no fragment.
    let plain = |b: &u8| (0x21..=0x7e).contains(b) && !b"#\"<>\\^`{|}".contains(b);
    if !target.starts_with('/') || !target.as_bytes().iter().all(plain) {
        return Parsed::Elsewhere;
    }
    fields.clear();
    let mut body = None;
    let mut close = false;
    for h in req.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            match (body, decimal(h.value)) {
                (None, Some(n)) => body = Some(n),
                _ => return Parsed::Elsewhere,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding")
            || name.eq_ignore_ascii_case(b"expect")
            || name.eq_ignore_ascii_case(b"upgrade")
        {
            return Parsed::Elsewhere;
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
    let body = body.unwrap_or(0);
    if body > MAX_BODY as u64 {
        return Parsed::Elsewhere;
    }
    Parsed::Complete(Head {
        len,
        method,
        target: span(buf, target.as_bytes()),
        body: body as usize,
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

/// The request's header fields as a `HeaderMap`, for configs whose identity,
/// forwarding or keys read headers. Fields that are not valid header names
/// or values are left out, as hyper would refuse the request.
pub(crate) fn header_map(buf: &[u8], fields: &[(Range<usize>, Range<usize>)]) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(fields.len());
    for (name, value) in fields {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(&buf[name.clone()]),
            HeaderValue::from_bytes(&buf[value.clone()]),
        ) {
            map.append(n, v);
        }
    }
    map
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(text: &str) -> Parsed {
        parse_request(text.as_bytes(), &mut vec![])
    }

    #[test]
    fn plain_requests_stay_and_everything_else_goes_to_hyper() {
        let Parsed::Complete(h) =
            request("POST /a?b=1 HTTP/1.1\r\nhost: x\r\ncontent-length: 3\r\n\r\nabc")
        else {
            panic!("a plain POST is this path's");
        };
        assert_eq!((h.method, h.body, h.close), (Method::POST, 3, false));
        assert!(matches!(
            request("GET / HTTP/1.1\r\nconnection: close\r\n\r\n"),
            Parsed::Complete(Head { close: true, .. })
        ));
        assert!(matches!(request("GET / HTTP/1.1\r\nhost"), Parsed::Partial));
        for elsewhere in [
            "GET / HTTP/1.0\r\n\r\n",
            "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            "GET http://x/ HTTP/1.1\r\n\r\n",
            "POST / HTTP/1.1\r\ntransfer-encoding: chunked\r\n\r\n",
            "POST / HTTP/1.1\r\nexpect: 100-continue\r\ncontent-length: 1\r\n\r\n",
            "GET / HTTP/1.1\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 1\r\ncontent-length: 1\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: -1\r\n\r\n",
            "POST / HTTP/1.1\r\ncontent-length: 9999999\r\n\r\n",
            "GET /a|b HTTP/1.1\r\n\r\n",
            "\u{0}garbage\r\n\r\n",
        ] {
            assert!(
                matches!(request(elsewhere), Parsed::Elsewhere),
                "{elsewhere:?}"
            );
        }
    }
}
