//! Upstream response heads on the HTTP/1.1 path.

use std::mem::MaybeUninit;
use std::ops::Range;

use super::request::{MAX_HEADERS, decimal, span};

/// Longest upstream response head accepted (beyond: 502).
pub(crate) const MAX_UPSTREAM_HEAD: usize = 64 * 1024;
/// How an upstream response's body ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Framing {
    /// No body (HEAD, 1xx, 204, 304).
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked: relayed as it comes, its end found by [`Chunks`].
    Chunked,
    /// Until the upstream closes the connection.
    Close,
}

/// A parsed upstream response head.
pub(crate) struct UpHead {
    pub(crate) len: usize,
    pub(crate) status: u16,
    pub(crate) reason: Range<usize>,
    pub(crate) framing: Framing,
    /// The connection can carry another request after this body.
    pub(crate) reusable: bool,
    /// Names the upstream's `Connection` header lists (not forwarded).
    pub(crate) listed: Vec<Range<usize>>,
    /// The upstream sent a `Date`.
    pub(crate) dated: bool,
    /// The upstream sent a `Transfer-Encoding` (its `Content-Length`, if
    /// any, is then not forwarded).
    pub(crate) transfer_encoding: bool,
}

/// Parses a response head at the start of `buf`: `Ok(None)` when more bytes
/// are needed, `Err` when it is not a valid HTTP/1.x head.
pub(crate) fn parse_response(
    buf: &[u8],
    head_request: bool,
    fields: &mut Vec<(Range<usize>, Range<usize>)>,
) -> Result<Option<UpHead>, ()> {
    let mut raw = [const { MaybeUninit::uninit() }; MAX_HEADERS];
    let mut resp = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut resp, buf, &mut raw);
    let len = match parsed {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(_) => return Err(()),
    };
    let (Some(version), Some(status)) = (resp.version, resp.code) else {
        return Err(());
    };
    let reason = span(buf, resp.reason.unwrap_or("").as_bytes());
    fields.clear();
    let mut length = None;
    let mut chunked = None;
    let mut close = version == 0;
    let mut listed = vec![];
    let mut dated = false;
    for h in resp.headers.iter() {
        let name = h.name.as_bytes();
        if name.eq_ignore_ascii_case(b"content-length") {
            match (length, decimal(h.value)) {
                (None, Some(n)) => length = Some(n),
                (Some(a), Some(b)) if a == b => {}
                _ => return Err(()),
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // The last coding decides; anything but chunked runs to close.
            let last = h.value.rsplit(|b| *b == b',').next().unwrap_or(b"");
            chunked = Some(last.trim_ascii().eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in h.value.split(|b| *b == b',').map(<[u8]>::trim_ascii) {
                if token.eq_ignore_ascii_case(b"close") {
                    close = true;
                } else if token.eq_ignore_ascii_case(b"keep-alive") {
                    close &= version != 0;
                } else if !token.is_empty() {
                    listed.push(span(buf, token));
                }
            }
        } else if name.eq_ignore_ascii_case(b"date") {
            dated = true;
        }
        fields.push((span(buf, name), span(buf, h.value)));
    }
    let framing = if head_request || status < 200 || status == 204 || status == 304 {
        Framing::Empty
    } else {
        match (chunked, length) {
            (Some(true), _) => Framing::Chunked,
            (Some(false), _) => Framing::Close,
            (None, Some(n)) => Framing::Length(n),
            (None, None) => Framing::Close,
        }
    };
    Ok(Some(UpHead {
        len,
        status,
        reason,
        reusable: !close && framing != Framing::Close,
        framing,
        listed,
        dated,
        transfer_encoding: chunked.is_some(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn response(text: &str, head_request: bool) -> UpHead {
        parse_response(text.as_bytes(), head_request, &mut vec![])
            .expect("valid")
            .expect("complete")
    }

    #[test]
    fn a_status_line_without_a_reason_phrase_parses() {
        for text in [
            "HTTP/1.0 200\nconnection: close\r\n\r\nb",
            "HTTP/1.1 204\r\n\r\n",
        ] {
            let h = response(text, false);
            assert!(h.reason.is_empty(), "{text:?}");
        }
    }

    #[test]
    fn response_framing_follows_rfc_9112() {
        let r = |t: &str| response(t, false).framing;
        assert_eq!(
            r("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n"),
            Framing::Length(5)
        );
        assert_eq!(
            r("HTTP/1.1 200 OK\r\ncontent-length: 5\r\ntransfer-encoding: chunked\r\n\r\n"),
            Framing::Chunked
        );
        assert_eq!(
            r("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n"),
            Framing::Close
        );
        assert_eq!(r("HTTP/1.1 200 OK\r\n\r\n"), Framing::Close);
        assert_eq!(
            r("HTTP/1.1 304 Not Modified\r\ncontent-length: 5\r\n\r\n"),
            Framing::Empty
        );
        assert_eq!(
            response("HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\n", true).framing,
            Framing::Empty
        );
        assert!(
            !response(
                "HTTP/1.1 200 OK\r\nconnection: close\r\ncontent-length: 0\r\n\r\n",
                false
            )
            .reusable
        );
        assert!(!response("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n", false).reusable);
        assert!(response("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n", false).reusable);
        assert!(
            parse_response(
                b"HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n",
                false,
                &mut vec![]
            )
            .is_err()
        );
    }
}
