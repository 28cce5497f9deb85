//! Writing heads and the gateway's own answers.

use std::io;

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use ratewarden::FieldRef;
use tokio::io::{AsyncWrite, AsyncWriteExt};

use crate::gateway::Body;

/// The text of `Date:` for now, formatted once per second per thread.
pub(crate) fn http_date() -> [u8; 29] {
    use std::cell::Cell;
    use std::time::{SystemTime, UNIX_EPOCH};
    thread_local! {
        static CACHED: Cell<(u64, [u8; 29])> = const { Cell::new((0, [0; 29])) };
    }
    let now = SystemTime::now();
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    CACHED.with(|c| {
        let (at, text) = c.get();
        if at == secs {
            return text;
        }
        let mut text = [0; 29];
        let formatted = httpdate::fmt_http_date(now);
        text.copy_from_slice(&formatted.as_bytes()[..29]);
        c.set((secs, text));
        text
    })
}

/// Appends `name: value\r\n`. (Inlined: its constant parts are then
/// stores, not copies; once the exchange grew, the compiler stopped
/// inlining it by itself, for 185 instructions a forwarded request.)
#[inline(always)]
pub(crate) fn push_field(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// A decision's rate-limit header fields as header lines, and their names
/// (an upstream field of the same name gives way to ours). Kept per
/// connection: rendering allocates nothing once the buffers have grown.
#[derive(Default)]
pub(crate) struct RateFields {
    pub(crate) lines: Vec<u8>,
    pub(crate) names: Vec<&'static str>,
    pub(crate) scratch: String,
    /// A rejection's body.
    pub(crate) body: String,
}

impl RateFields {
    pub(crate) fn render(
        &mut self,
        d: Option<&ratewarden::Decision>,
        style: ratewarden::HeaderStyle,
    ) {
        self.lines.clear();
        self.names.clear();
        let Some(d) = d else { return };
        let (lines, names) = (&mut self.lines, &mut self.names);
        let mut digits = itoa::Buffer::new();
        d.visit_header_fields(style, &mut self.scratch, |name, value| {
            let text = match value {
                FieldRef::Number(n) => digits.format(n),
                // A valid value by construction (rule and tier names are
                // checked when a rule is made): not checked per request.
                FieldRef::Text(t) => {
                    debug_assert!(
                        t.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)),
                        "{t:?}"
                    );
                    t
                }
            };
            push_field(lines, name.as_bytes(), text.as_bytes());
            names.push(name);
        });
    }

    /// Whether one of the fields is named `name`.
    pub(crate) fn sets(&self, name: &[u8]) -> bool {
        self.names
            .iter()
            .any(|n| n.as_bytes().eq_ignore_ascii_case(name))
    }
}

/// Writes a complete answer of the gateway's own (rejection, 403, 502...).
pub(crate) async fn write_answer<S: AsyncWrite + Unpin>(
    io: &mut S,
    out: &mut Vec<u8>,
    answer: Response<Body>,
    close: bool,
) -> io::Result<()> {
    let (parts, body) = answer.into_parts();
    // Bodies of the gateway's own answers are whole `Full` buffers.
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    out.clear();
    status_line(out, parts.status, None);
    for (name, value) in &parts.headers {
        push_field(out, name.as_str().as_bytes(), value.as_bytes());
    }
    end_answer(out, &body, close);
    io.write_all(out).await?;
    // (TLS: the records may still wait in rustls; a no-op for TCP.)
    io.flush().await
}

/// Ends one of the gateway's own answers in `out`: its length, `Date`,
/// `Connection: close` when the connection closes after it, then `body`.
/// Returns where the value of `Date` starts in `out`.
pub(crate) fn end_answer(out: &mut Vec<u8>, body: &[u8], close: bool) -> usize {
    push_field(
        out,
        b"content-length",
        itoa::Buffer::new().format(body.len()).as_bytes(),
    );
    let date_at = out.len() + b"date: ".len();
    push_field(out, b"date", &http_date());
    if close {
        push_field(out, b"connection", b"close");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    date_at
}

/// Appends `HTTP/1.1 <code> <reason>\r\n`; the standard reason when `reason`
/// is `None` or empty.
pub(crate) fn status_line(out: &mut Vec<u8>, status: StatusCode, reason: Option<&[u8]>) {
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    match reason {
        Some(r) if !r.is_empty() => out.extend_from_slice(r),
        _ => out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes()),
    }
    out.extend_from_slice(b"\r\n");
}
