//! Who is asking: the client address behind trusted proxies, and the keys
//! made from it. Shared by the tower layer and the gateway, so both read
//! `X-Forwarded-For` and `Forwarded` the same way.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::view::{Fields, text};
use ipnet::IpNet;
use smallvec::SmallVec;

/// At most this many hops are read from forwarding headers: a client can send
/// any number, and walking them must stay cheap.
pub const MAX_HOPS: usize = 32;
/// Forwarding headers longer than this are ignored (the peer is the client).
pub const MAX_HEADER_BYTES: usize = 4096;

/// The forwarding header the operator's proxy sets: the only one read for
/// the client's address. A proxy sets one and passes the others through as
/// the client sent them (nginx's usual `proxy_set_header X-Forwarded-For
/// $proxy_add_x_forwarded_for` leaves a client's `Forwarded` untouched), so
/// reading any header the operator did not name lets a client choose its
/// own identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ForwardHeader {
    /// `X-Forwarded-For` (nginx, HAProxy, Caddy, Traefik, Envoy): a chain
    /// of addresses, the nearest last.
    #[default]
    XForwardedFor,
    /// RFC 7239 `Forwarded`: elements whose `for=` is the address.
    Forwarded,
    /// `X-Real-IP` (nginx's `$remote_addr`): one address.
    XRealIp,
}

impl ForwardHeader {
    /// The header's name, in lower case.
    pub fn name(self) -> &'static str {
        match self {
            ForwardHeader::XForwardedFor => "x-forwarded-for",
            ForwardHeader::Forwarded => "forwarded",
            ForwardHeader::XRealIp => "x-real-ip",
        }
    }

    /// The header named `name` (any case), when it is one of these.
    pub fn from_name(name: &str) -> Option<Self> {
        [Self::XForwardedFor, Self::Forwarded, Self::XRealIp]
            .into_iter()
            .find(|h| h.name().eq_ignore_ascii_case(name))
    }

    /// The address of one hop as this header writes it (`None`: not an
    /// address: `unknown`, an obfuscated identifier, garbage).
    fn hop(self, hop: &str) -> Option<IpAddr> {
        match self {
            ForwardHeader::Forwarded => hop
                .split(';')
                .find_map(|pair| {
                    let (k, v) = pair.trim().split_once('=')?;
                    k.trim().eq_ignore_ascii_case("for").then(|| v.trim())
                })
                .and_then(parse_node),
            ForwardHeader::XForwardedFor | ForwardHeader::XRealIp => parse_node(hop.trim()),
        }
    }
}

/// How to find the client's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIp {
    /// Read the forwarding header (only from trusted peers).
    pub forwarded: bool,
    /// The forwarding header read: the one the operator's proxy sets.
    pub header: ForwardHeader,
    /// Proxies whose forwarding headers are believed.
    pub trusted_proxies: Vec<IpNet>,
    /// IPv6 clients are grouped by this prefix length (one /64 is one
    /// subscriber, who can pick any of 2^64 addresses).
    pub ipv6_prefix: u8,
}

impl Default for ClientIp {
    fn default() -> Self {
        Self {
            forwarded: false,
            header: ForwardHeader::default(),
            trusted_proxies: vec![],
            ipv6_prefix: 64,
        }
    }
}

impl ClientIp {
    /// Whether `ip` is one of the trusted proxies.
    pub fn trusted(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }

    /// The client's address: `peer`, unless `peer` is a trusted proxy and
    /// forwarding is on; then [`ClientIp::behind`].
    ///
    /// ```
    /// use http::HeaderMap;
    /// use ratewarden_tower::identity::{ClientIp, ForwardHeader};
    /// use ratewarden_tower::view::Fields;
    /// let c = ClientIp { forwarded: true, trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()], ..ClientIp::default() };
    /// let mut h = HeaderMap::new();
    /// h.insert("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.1.1.1".parse().unwrap());
    /// h.insert("forwarded", "for=192.0.2.1".parse().unwrap());
    /// // The header named (X-Forwarded-For by default); `Forwarded` is not read.
    /// assert_eq!(c.resolve("10.0.0.2".parse().unwrap(), Fields::Map(&h)).to_string(), "203.0.113.9");
    /// // The same header from an untrusted peer is ignored.
    /// assert_eq!(c.resolve("198.51.100.7".parse().unwrap(), Fields::Map(&h)).to_string(), "198.51.100.7");
    /// // Naming `Forwarded` reads it, and only it.
    /// let f = ClientIp { header: ForwardHeader::Forwarded, ..c };
    /// assert_eq!(f.resolve("10.0.0.2".parse().unwrap(), Fields::Map(&h)).to_string(), "192.0.2.1");
    /// ```
    pub fn resolve(&self, peer: IpAddr, headers: Fields<'_>) -> IpAddr {
        if !self.forwarded || !self.trusted(peer) {
            return peer;
        }
        self.behind(peer, headers)
    }

    /// The one walker of forwarding chains, for every front end (the
    /// proxy, `/v1/check`, `/v1/explain`, the authorisation listener): the
    /// right-most address of [`ClientIp::header`] that is not itself a
    /// trusted proxy, `peer` when the header is absent. Only that header
    /// is read. A chain too long (over [`MAX_HEADER_BYTES`] or
    /// [`MAX_HOPS`] hops) or holding garbage stops the walk at the last
    /// address that could be read, so a client cannot make itself anyone
    /// but itself. The caller has checked that `peer` is trusted; no
    /// allocation for a chain sent in up to two fields.
    pub fn behind(&self, peer: IpAddr, headers: Fields<'_>) -> IpAddr {
        let fields: SmallVec<[&[u8]; 2]> = headers.get_all(self.header.name()).collect();
        if fields.iter().map(|v| v.len()).sum::<usize>() > MAX_HEADER_BYTES {
            return peer;
        }
        let mut client = peer;
        let mut hops = 0;
        for field in fields.iter().rev() {
            let Some(field) = text(field) else {
                return client;
            };
            for hop in field.rsplit(',') {
                if hops == MAX_HOPS {
                    return client;
                }
                hops += 1;
                match self.header.hop(hop) {
                    Some(ip) => {
                        client = ip;
                        if !self.trusted(ip) {
                            return client;
                        }
                    }
                    None => return client,
                }
            }
        }
        client
    }

    /// The identity key for an address: IPv4 as is, IPv6 masked to
    /// `ipv6_prefix` and written as a network (`2001:db8:1:2::/64`).
    ///
    /// ```
    /// use ratewarden_tower::identity::ClientIp;
    /// let c = ClientIp::default();
    /// assert_eq!(c.key("2001:db8:1:2:aaaa::1".parse().unwrap()), "2001:db8:1:2::/64");
    /// assert_eq!(c.key("192.0.2.1".parse().unwrap()), "192.0.2.1");
    /// ```
    pub fn key(&self, ip: IpAddr) -> String {
        match ip {
            IpAddr::V4(v4) => v4_key(v4),
            IpAddr::V6(v6) => {
                if let Some(v4) = v6.to_ipv4_mapped() {
                    return v4_key(v4);
                }
                let prefix = self.ipv6_prefix.min(128);
                if prefix == 128 {
                    return v6.to_string();
                }
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                let net = Ipv6Addr::from(u128::from(v6) & mask);
                format!("{net}/{prefix}")
            }
        }
    }
}

/// `ip` as text (`192.0.2.1`, `2001:db8::1`); IPv4 written without the
/// formatting machinery (see [`ClientIp::key`]).
///
/// ```
/// use ratewarden_tower::identity::ip_text;
/// assert_eq!(ip_text("192.0.2.10".parse().unwrap()), "192.0.2.10");
/// assert_eq!(ip_text("2001:db8::1".parse().unwrap()), "2001:db8::1");
/// ```
pub fn ip_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4_key(v4),
        IpAddr::V6(v6) => v6.to_string(),
    }
}

/// Appends `ip` as text (`192.0.2.1`, `2001:db8::1`) to `out`, allocating
/// nothing of its own (the access log's lines, `X-Forwarded-For`).
///
/// ```
/// let mut out = b"for=".to_vec();
/// ratewarden_tower::identity::push_ip(&mut out, "192.0.2.10".parse().unwrap());
/// assert_eq!(out, b"for=192.0.2.10");
/// ```
pub fn push_ip(out: &mut Vec<u8>, ip: IpAddr) {
    match ip {
        IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                if octet >= 100 {
                    out.push(b'0' + octet / 100);
                }
                if octet >= 10 {
                    out.push(b'0' + octet / 10 % 10);
                }
                out.push(b'0' + octet % 10);
            }
        }
        IpAddr::V6(v6) => {
            use std::io::Write as _;
            let _ = write!(out, "{v6}");
        }
    }
}

/// Dotted decimal, written directly: the formatting machinery behind
/// `to_string` cost more than the rate-limit decision on the gateway's path.
fn v4_key(ip: Ipv4Addr) -> String {
    let mut out = String::with_capacity(15);
    for (i, octet) in ip.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
    out
}

/// An address as forwarding headers write it: `1.2.3.4`, `1.2.3.4:80`,
/// `"[2001:db8::1]:443"`, `2001:db8::1`.
fn parse_node(s: &str) -> Option<IpAddr> {
    let s = s.trim_matches('"');
    if let Ok(ip) = s.parse() {
        return Some(ip);
    }
    if let Some(rest) = s.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    let (host, port) = s.rsplit_once(':')?;
    port.parse::<u16>().ok()?;
    host.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    #[test]
    fn ipv4_keys_match_the_standard_formatting() {
        for ip in [
            "0.0.0.0",
            "1.2.3.4",
            "10.20.30.40",
            "100.99.255.9",
            "255.255.255.255",
        ] {
            let v4: Ipv4Addr = ip.parse().unwrap();
            assert_eq!(v4_key(v4), ip);
            assert_eq!(ClientIp::default().key(IpAddr::V4(v4)), ip);
        }
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    fn behind_proxy() -> ClientIp {
        ClientIp {
            forwarded: true,
            trusted_proxies: vec![
                "127.0.0.1/32".parse().unwrap(),
                "10.0.0.0/8".parse().unwrap(),
            ],
            ..ClientIp::default()
        }
    }

    #[test]
    fn rfc7239_forwarded_is_read_right_to_left() {
        let h = headers(&[(
            "forwarded",
            r#"for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711", for=10.0.0.5"#,
        )]);
        let rfc7239 = ClientIp {
            header: ForwardHeader::Forwarded,
            ..behind_proxy()
        };
        let ip = rfc7239.resolve("127.0.0.1".parse().unwrap(), Fields::Map(&h));
        assert_eq!(ip, "2001:db8:cafe::17".parse::<IpAddr>().unwrap());
        // Not named, not read: the peer is the client.
        let peer = "127.0.0.1".parse().unwrap();
        assert_eq!(behind_proxy().resolve(peer, Fields::Map(&h)), peer);
    }

    #[test]
    fn only_the_named_header_is_read() {
        let h = headers(&[
            ("forwarded", "for=203.0.113.1"),
            ("x-real-ip", "203.0.113.2"),
            ("x-forwarded-for", "203.0.113.3"),
        ]);
        let peer: IpAddr = "10.9.9.9".parse().unwrap();
        for (header, want) in [
            (ForwardHeader::Forwarded, "203.0.113.1"),
            (ForwardHeader::XRealIp, "203.0.113.2"),
            (ForwardHeader::XForwardedFor, "203.0.113.3"),
        ] {
            let c = ClientIp {
                header,
                ..behind_proxy()
            };
            assert_eq!(c.resolve(peer, Fields::Map(&h)).to_string(), want);
            assert_eq!(
                ForwardHeader::from_name(&header.name().to_uppercase()),
                Some(header)
            );
        }
        assert_eq!(ForwardHeader::from_name("x-client-ip"), None);
    }

    #[test]
    fn garbage_and_huge_headers_never_spoof_or_panic() {
        let c = behind_proxy();
        let peer: IpAddr = "127.0.0.1".parse().unwrap();
        // Garbage right behind the proxy: the proxy itself is the answer.
        let h = headers(&[("x-forwarded-for", "1.2.3.4, not-an-ip")]);
        assert_eq!(c.resolve(peer, Fields::Map(&h)), peer);
        let huge = "9.9.9.9,".repeat(2_000);
        let h = headers(&[("x-forwarded-for", huge.as_str())]);
        assert_eq!(c.resolve(peer, Fields::Map(&h)), peer);
        // Many trusted hops: at most MAX_HOPS are walked.
        let chain = vec!["10.0.0.1"; 100].join(",");
        let h = headers(&[("x-forwarded-for", &format!("5.5.5.5,{chain}"))]);
        assert_eq!(
            c.resolve(peer, Fields::Map(&h)),
            "10.0.0.1".parse::<IpAddr>().unwrap()
        );
    }

    #[test]
    fn multiple_xff_headers_are_one_list() {
        let h = headers(&[
            ("x-forwarded-for", "203.0.113.1"),
            ("x-forwarded-for", "203.0.113.2:8080"),
        ]);
        assert_eq!(
            behind_proxy().resolve("10.2.2.2".parse().unwrap(), Fields::Map(&h)),
            "203.0.113.2".parse::<IpAddr>().unwrap()
        );
    }
}
