//! The listeners (`listen`, `admin`, their hosts and addresses), the
//! process log and the access log, and the rate-limit header families.

use std::net::SocketAddr;

use ratewarden::HeaderStyle;

use super::super::diag::Diag;
use super::super::schema::*;
use super::super::{LogFormat, LogSpec, Overrides};

/// A list of header families (`legacy`, `ietf`) at `key`: the style with
/// those on, the others off; `None` if one is not a family.
pub(super) fn header_style(d: &Diag<'_>, key: &str, list: &[Sp<String>]) -> Option<HeaderStyle> {
    let mut style = HeaderStyle {
        legacy: false,
        ietf: false,
    };
    let mut ok = true;
    for h in list {
        match d.choice(key, h, &[("legacy", 0), ("ietf", 1)]) {
            Some(0) => style.legacy = true,
            Some(_) => style.ietf = true,
            None => ok = false,
        }
    }
    ok.then_some(style)
}

pub(super) fn socket_addr(d: &Diag<'_>, key: &str, s: &Sp<String>) -> Option<SocketAddr> {
    d.check(
        key,
        Some(&s.referenced),
        s.value
            .parse()
            .map_err(|_| format!("`{}` is not an address like 127.0.0.1:8080", s.value)),
    )
}

pub(super) fn flag_addr(d: &Diag<'_>, flag: &str, key: &str, v: &str) -> Option<SocketAddr> {
    match v.parse() {
        Ok(a) => Some(a),
        Err(_) => {
            d.error_in(flag, key, format!("`{v}` is not an address"));
            None
        }
    }
}

/// Whether two listeners would want the same port: the same address, or
/// the same port with either on every interface (port 0 is never taken).
pub(super) fn clash(a: SocketAddr, b: SocketAddr) -> bool {
    a.port() != 0
        && a.port() == b.port()
        && (a.ip() == b.ip() || a.ip().is_unspecified() || b.ip().is_unspecified())
}

pub(super) fn log_spec(d: &Diag<'_>, f: Option<&Sp<LogFile>>) -> Option<LogSpec> {
    let Some(f) = f else {
        return Some(LogSpec::default());
    };
    let format = match &f.value.format {
        None => Some(LogFormat::Text),
        Some(v) => d.choice(
            "log.format",
            v,
            &[("text", LogFormat::Text), ("json", LogFormat::Json)],
        ),
    };
    let level = match &f.value.level {
        None => Some("info".to_owned()),
        Some(v) => d.check(
            "log.level",
            Some(&v.referenced),
            super::super::log_filter(&v.value)
                .map(|_| v.value.clone())
                .map_err(|e| {
                    format!(
                        "`{}` is not a level or filter (error, warn, info, debug, trace): {e}",
                        v.value
                    )
                }),
        ),
    };
    Some(LogSpec {
        format: format?,
        level: level?,
    })
}

pub(super) fn access_spec(d: &Diag<'_>, f: &Sp<AccessLogFile>) -> Option<super::super::AccessSpec> {
    use super::super::{AccessFormat as Format, AccessSink as Sink, AccessSpec as Spec};
    let sink = match f.value.path.value.as_str() {
        "stdout" | "-" => Sink::Stdout,
        "" => {
            d.error(
                "access_log.path",
                Some(&f.value.path.referenced),
                "a file, or `stdout`",
            );
            return None;
        }
        p => Sink::File(d.path(p)),
    };
    let format = match &f.value.format {
        None => Some(Format::Json),
        Some(v) => d.choice(
            "access_log.format",
            v,
            &[("json", Format::Json), ("combined", Format::Combined)],
        ),
    };
    Some(Spec {
        sink,
        format: format?,
    })
}

/// `admin.hosts`: host names, without a scheme or a port (an address
/// needs no entry: every address is answered).
pub(super) fn admin_hosts(d: &Diag<'_>, list: &[Sp<String>]) -> Option<Vec<String>> {
    let mut out = Some(vec![]);
    for h in list {
        let name = h.value.trim().trim_end_matches('.').to_ascii_lowercase();
        let valid = !name.is_empty()
            && name.len() <= 253
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_'));
        if valid {
            if let Some(o) = out.as_mut() {
                o.push(name);
            }
        } else {
            d.error(
                "admin.hosts",
                Some(&h.referenced),
                format!(
                    "`{}` is not a host name: write the name alone (`admin.example.com`), without a scheme or a port",
                    h.value
                ),
            );
            out = None;
        }
    }
    out
}

pub(super) fn admin(
    d: &Diag<'_>,
    a: &AdminFile,
    o: &Overrides,
    listen: Option<SocketAddr>,
) -> Option<(SocketAddr, Option<String>)> {
    let addr = match (&o.admin_listen, &a.listen) {
        (Some(l), _) => flag_addr(d, "--admin-listen", "admin.listen", l),
        (None, Some(l)) => socket_addr(d, "admin.listen", l),
        (None, None) => Some(SocketAddr::from(([127, 0, 0, 1], 9090))),
    };
    if let (Some(admin), Some(proxy)) = (addr, listen)
        && clash(admin, proxy)
    {
        let at = a.listen.as_ref().map(|l| &l.referenced);
        d.error(
            "admin.listen",
            at,
            format!(
                "{admin} is also the proxy's `listen` ({proxy}): give the admin API its own port"
            ),
        );
    }
    let token = match &a.token {
        None => Some(None),
        Some(t) if t.value.trim().is_empty() => {
            d.error(
                "admin.token",
                Some(&t.referenced),
                "an empty token could never be sent: remove `token` to leave the admin API open",
            );
            None
        }
        Some(t) if !t.value.bytes().all(|b| b.is_ascii_graphic()) => {
            d.error(
                "admin.token",
                Some(&t.referenced),
                "a token is visible ASCII without spaces (it travels in an Authorization header)",
            );
            None
        }
        Some(t) => Some(Some(t.value.clone())),
    };
    Some((addr?, token?))
}
