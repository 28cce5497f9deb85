//! One read-only view of a request, built once per request by whichever
//! front end has it (the gateway's HTTP/1.1 path over the bytes it read,
//! hyper's path and the tower layer over an `http::request::Parts`, the
//! admin API over what a caller describes) and asked lazily: nothing is
//! copied or decoded until a rule reads it. Every request fact a rule can
//! match or key on is answered here, so a new one is added in one place.

use std::borrow::Cow;
use std::net::IpAddr;
use std::ops::Range;

use http::{HeaderMap, Method};

/// Where a request's header fields are.
#[derive(Debug, Clone, Copy)]
pub enum Fields<'a> {
    /// A header map (hyper's, the tower layer's, an admin caller's).
    Map(&'a HeaderMap),
    /// An HTTP/1.1 head as read: its bytes and each field's name and value
    /// spans in them. Names with `_` are not seen unless `underscores`
    /// (the gateway's `underscores_in_headers`; hyper's path strips them
    /// from its map the same way).
    Raw {
        /// The head's bytes.
        head: &'a [u8],
        /// (name, value) spans, in the order sent.
        spans: &'a [(Range<usize>, Range<usize>)],
        /// Whether names with `_` are seen.
        underscores: bool,
    },
    /// None (a request described without headers).
    None,
}

impl<'a> Fields<'a> {
    /// Every value of the fields named `name` (ASCII case-insensitive), in
    /// the order sent.
    pub fn get_all(self, name: &str) -> impl Iterator<Item = &'a [u8]> {
        let (map, raw) = match self {
            Fields::Map(m) => (Some(m.get_all(name).iter()), None),
            Fields::Raw {
                head,
                spans,
                underscores,
            } => (
                None,
                Some(spans.iter().filter_map(move |(n, v)| {
                    let n = &head[n.clone()];
                    let seen = underscores || !n.contains(&b'_');
                    (seen && n.eq_ignore_ascii_case(name.as_bytes())).then(|| &head[v.clone()])
                })),
            ),
            Fields::None => (None, None),
        };
        map.into_iter()
            .flatten()
            .map(http::HeaderValue::as_bytes)
            .chain(raw.into_iter().flatten())
    }

    /// The first value of the field named `name`.
    pub fn get(self, name: &str) -> Option<&'a [u8]> {
        self.get_all(name).next()
    }
}

/// `v` as text when it is what `HeaderValue::to_str` accepts (visible
/// ASCII, spaces and tabs); `None` for anything else, which no rule reads
/// as text.
pub fn text(v: &[u8]) -> Option<&str> {
    v.iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
        .then(|| std::str::from_utf8(v).ok())
        .flatten()
}

/// A verified token's claims, as a front end that verifies tokens gives
/// them (the gateway's `jwt:`); this crate verifies nothing.
pub trait Claims: std::fmt::Debug + Sync {
    /// The claim at `path` (`sub`, `org.id`) as text, when it is a string
    /// or a number.
    fn claim(&self, path: &str) -> Option<Cow<'_, str>>;
}

/// What a front end knows of one request.
#[derive(Debug, Clone, Copy)]
pub struct RequestView<'a> {
    /// The method.
    pub method: &'a Method,
    /// The path as a rule sees it: normalised (see [`crate::path`]).
    pub path: &'a str,
    /// The target as the client sent it (origin form: path and query).
    pub target: &'a str,
    /// HTTP/2's `:authority` (or an absolute-form target's), when the
    /// request has one.
    pub authority: Option<&'a str>,
    /// The header fields.
    pub fields: Fields<'a>,
    /// The peer's address, when known.
    pub peer: Option<IpAddr>,
    /// The server name the client asked for in its TLS handshake.
    pub sni: Option<&'a str>,
    /// The claims of the request's verified token, when the front end
    /// verified one.
    pub claims: Option<&'a dyn Claims>,
    /// The fields of the request's JSON body (`json:FIELD` key parts), when
    /// the front end read one: a body that is not a JSON object has none.
    pub body: Option<&'a dyn Claims>,
    /// The consumer the request's API key names, when the front end has
    /// consumers ([`crate::consumers`]) and the key names one.
    pub consumer: Option<&'a crate::consumers::Consumer>,
}

impl<'a> RequestView<'a> {
    /// A request with only a method and a (normalised) path.
    pub fn bare(method: &'a Method, path: &'a str) -> Self {
        Self {
            method,
            path,
            target: path,
            authority: None,
            fields: Fields::None,
            peer: None,
            sni: None,
            claims: None,
            body: None,
            consumer: None,
        }
    }

    /// The same request with a verified token's claims (or none).
    pub fn with_claims(self, claims: Option<&'a dyn Claims>) -> Self {
        Self { claims, ..self }
    }

    /// The same request with the consumer its key names (or none).
    pub fn with_consumer(self, consumer: Option<&'a crate::consumers::Consumer>) -> Self {
        Self { consumer, ..self }
    }

    /// The request with its JSON body's fields.
    pub fn with_body(self, body: Option<&'a dyn Claims>) -> Self {
        Self { body, ..self }
    }

    /// The first value of header `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.fields.get(name)
    }

    /// The first value of header `name` as text, trimmed, when it is text
    /// and not empty: what an identity or a key part reads of a header.
    pub fn header_text(&self, name: &str) -> Option<&'a str> {
        let v = text(self.header(name)?)?.trim();
        (!v.is_empty()).then_some(v)
    }

    /// Every value of header `name`.
    pub fn headers(&self, name: &str) -> impl Iterator<Item = &'a [u8]> {
        self.fields.get_all(name)
    }

    /// The query string (after `?`, without it), when the target has one.
    pub fn query(&self) -> Option<&'a str> {
        self.target.split_once('?').map(|(_, q)| q)
    }

    /// Every value of query parameter `name`, names and values compared
    /// and given percent-decoded (`+` is left as it is: RFC 3986, not
    /// HTML forms). A parameter without `=` has the empty value.
    pub fn query_values(&self, name: &str) -> impl Iterator<Item = Cow<'a, str>> {
        self.query()
            .into_iter()
            .flat_map(|q| q.split('&'))
            .filter(|pair| !pair.is_empty())
            .filter_map(move |pair| {
                let (n, v) = pair.split_once('=').unwrap_or((pair, ""));
                (decoded(n) == name).then(|| decoded(v))
            })
    }

    /// The value of cookie `name` (the first one sent; names are case
    /// sensitive, as browsers send them).
    pub fn cookie(&self, name: &str) -> Option<&'a str> {
        self.headers("cookie")
            .filter_map(text)
            .flat_map(|v| v.split(';'))
            .find_map(|pair| {
                let (n, v) = pair.trim().split_once('=')?;
                (n.trim() == name).then(|| v.trim().trim_matches('"'))
            })
    }

    /// The host the request is for: `:authority`, else `Host`; lower-cased,
    /// without its port or trailing dots (`API.Example.com.:8443` is
    /// `api.example.com`; `[::1]:80` is `[::1]`; `a.example..` is
    /// `a.example`: for a limiter, reading two names as one is the safe
    /// side). `None` without one.
    pub fn host(&self) -> Option<Cow<'a, str>> {
        let raw = match self.authority {
            Some(a) => a,
            None => text(self.header("host")?)?.trim(),
        };
        // Userinfo is not part of a host (an absolute-form authority).
        let raw = raw.rsplit_once('@').map_or(raw, |(_, h)| h);
        let name = match raw.strip_prefix('[') {
            Some(rest) => &raw[..rest.find(']').map_or(raw.len(), |i| i + 2)],
            None => raw.split_once(':').map_or(raw, |(h, _)| h),
        };
        let name = name.trim_end_matches('.');
        if name.is_empty() {
            return None;
        }
        Some(if name.bytes().any(|b| b.is_ascii_uppercase()) {
            Cow::Owned(name.to_ascii_lowercase())
        } else {
            Cow::Borrowed(name)
        })
    }
}

/// `s` percent-decoded (invalid escapes kept as they are, bytes that are
/// not UTF-8 replaced).
fn decoded(s: &str) -> Cow<'_, str> {
    if !s.contains('%') {
        return Cow::Borrowed(s);
    }
    percent_encoding::percent_decode_str(s).decode_utf8_lossy()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw_view<'a>(
        head: &'a [u8],
        spans: &'a [(Range<usize>, Range<usize>)],
        target: &'a str,
    ) -> RequestView<'a> {
        RequestView {
            target,
            fields: Fields::Raw {
                head,
                spans,
                underscores: false,
            },
            ..RequestView::bare(&Method::GET, "/")
        }
    }

    /// (name, value) spans of `head`'s `name: value` lines.
    fn spans(head: &str) -> Vec<(Range<usize>, Range<usize>)> {
        let mut out = vec![];
        let mut at = 0;
        for line in head.split_inclusive('\n') {
            if let Some((n, v)) = line.trim_end().split_once(':') {
                let v0 = at + n.len() + 1 + (v.len() - v.trim_start().len());
                out.push((at..at + n.len(), v0..v0 + v.trim().len()));
            }
            at += line.len();
        }
        out
    }

    #[test]
    fn raw_and_mapped_fields_answer_alike() {
        let head = "Host: API.example.com.:8443\nX-Plan: pro\nx-plan: free\nX_Hidden: 1\nCookie: a=1; sid=\"s3\"\n";
        let s = spans(head);
        let raw = raw_view(head.as_bytes(), &s, "/x?q=1");
        let mut map = HeaderMap::new();
        for (n, v) in &s {
            map.append(
                http::HeaderName::from_bytes(&head.as_bytes()[n.clone()]).unwrap(),
                http::HeaderValue::from_bytes(&head.as_bytes()[v.clone()]).unwrap(),
            );
        }
        map.remove("x_hidden");
        let mapped = RequestView {
            fields: Fields::Map(&map),
            ..raw
        };
        for v in [raw, mapped] {
            let plans: Vec<&[u8]> = v.headers("x-plan").collect();
            assert_eq!(plans, vec![&b"pro"[..], b"free"]);
            assert_eq!(v.header("X-PLAN"), Some(&b"pro"[..]));
            assert_eq!(v.header("x_hidden"), None, "underscores not seen");
            assert_eq!(v.host().as_deref(), Some("api.example.com"));
            assert_eq!(v.cookie("sid"), Some("s3"));
            assert_eq!(v.cookie("SID"), None);
            assert_eq!(v.query(), Some("q=1"));
        }
    }

    #[test]
    fn the_host_is_lower_cased_without_port_or_dot() {
        let at = |authority: &'static str| {
            RequestView {
                authority: Some(authority),
                ..RequestView::bare(&Method::GET, "/")
            }
            .host()
            .map(Cow::into_owned)
        };
        assert_eq!(at("Example.COM:80").as_deref(), Some("example.com"));
        assert_eq!(at("[::1]:8080").as_deref(), Some("[::1]"));
        assert_eq!(at("[::1]").as_deref(), Some("[::1]"));
        assert_eq!(at("user@host.example:1").as_deref(), Some("host.example"));
        assert_eq!(at("a.example..:80").as_deref(), Some("a.example"));
        assert_eq!(at(":80"), None);
        assert_eq!(at("."), None);
        assert_eq!(RequestView::bare(&Method::GET, "/").host(), None);
    }

    #[test]
    fn query_values_are_percent_decoded_and_repeatable() {
        let v = RequestView {
            target: "/p?api%5Fkey=a%20b&x&api_key=c&api_key&bad=%zz&plus=a+b",
            ..RequestView::bare(&Method::GET, "/p")
        };
        let keys: Vec<_> = v.query_values("api_key").collect();
        assert_eq!(keys, vec!["a b", "c", ""]);
        assert_eq!(v.query_values("x").collect::<Vec<_>>(), vec![""]);
        assert_eq!(v.query_values("bad").collect::<Vec<_>>(), vec!["%zz"]);
        assert_eq!(v.query_values("plus").collect::<Vec<_>>(), vec!["a+b"]);
        assert_eq!(v.query_values("none").count(), 0);
        let no_query = RequestView::bare(&Method::GET, "/p");
        assert_eq!(no_query.query_values("api_key").count(), 0);
    }

    #[test]
    fn text_is_what_header_value_to_str_accepts() {
        for v in [
            &b"plain"[..],
            b"with\ttab",
            b"",
            b"caf\xc3\xa9",
            b"nul\0",
            b"del\x7f",
        ] {
            let ours = text(v).is_some();
            let http = http::HeaderValue::from_bytes(v).is_ok_and(|h| h.to_str().is_ok());
            assert_eq!(ours, http, "{v:?}");
        }
    }
}
