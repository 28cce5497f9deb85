//! Who is asking: the client address behind trusted proxies, and the keys
//! made from it. Shared by the tower layer and the gateway, so both read
//! `X-Forwarded-For` and `Forwarded` the same way.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::view::{Fields, text};
use ipnet::IpNet;

/// At most this many hops are read from forwarding headers: a client can send
/// any number, and walking them must stay cheap.
const MAX_HOPS: usize = 32;
/// Forwarding headers longer than this are ignored (the peer is the client).
const MAX_HEADER_BYTES: usize = 4096;

/// How to find the client's address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientIp {
    /// Read `Forwarded` / `X-Forwarded-For` (only from trusted peers).
    pub forwarded: bool,
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
            trusted_proxies: vec![],
            ipv6_prefix: 64,
        }
    }
}

impl ClientIp {
    fn trusted(&self, ip: IpAddr) -> bool {
        self.trusted_proxies.iter().any(|net| net.contains(&ip))
    }

    /// The client's address: `peer`, unless `peer` is a trusted proxy and
    /// forwarding is on; then the right-most address in the forwarding chain
    /// that is not itself a trusted proxy. A chain that is too long or holds
    /// garbage stops the walk at the last address that could be read, so a
    /// client cannot make itself anyone but itself.
    ///
    /// ```
    /// use http::HeaderMap;
    /// use ratewarden_tower::identity::ClientIp;
    /// use ratewarden_tower::view::Fields;
    /// let c = ClientIp { forwarded: true, trusted_proxies: vec!["10.0.0.0/8".parse().unwrap()], ipv6_prefix: 64 };
    /// let mut h = HeaderMap::new();
    /// h.insert("x-forwarded-for", "6.6.6.6, 203.0.113.9, 10.1.1.1".parse().unwrap());
    /// assert_eq!(c.resolve("10.0.0.2".parse().unwrap(), Fields::Map(&h)).to_string(), "203.0.113.9");
    /// // The same header from an untrusted peer is ignored.
    /// assert_eq!(c.resolve("198.51.100.7".parse().unwrap(), Fields::Map(&h)).to_string(), "198.51.100.7");
    /// ```
    pub fn resolve(&self, peer: IpAddr, headers: Fields<'_>) -> IpAddr {
        if !self.forwarded || !self.trusted(peer) {
            return peer;
        }
        let hops = forwarded_hops(headers);
        let mut client = peer;
        for hop in hops.into_iter().rev().take(MAX_HOPS) {
            match hop {
                Some(ip) => {
                    client = ip;
                    if !self.trusted(ip) {
                        break;
                    }
                }
                None => break,
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

/// The hops of `Forwarded` (RFC 7239 `for=`), or else of `X-Forwarded-For`,
/// left to right; `None` for a hop that is not an address (`unknown`, an
/// obfuscated identifier, garbage). Empty when the headers are absent,
/// too long, or not text.
fn forwarded_hops(headers: Fields<'_>) -> Vec<Option<IpAddr>> {
    let joined = |name: &'static str| -> Option<String> {
        let mut out = String::new();
        for v in headers.get_all(name) {
            let v = text(v)?;
            if !out.is_empty() {
                out.push(',');
            }
            out.push_str(v);
            if out.len() > MAX_HEADER_BYTES {
                return None;
            }
        }
        (!out.is_empty()).then_some(out)
    };
    if let Some(fwd) = joined("forwarded") {
        return fwd
            .split(',')
            .map(|element| {
                element
                    .split(';')
                    .find_map(|pair| {
                        let (k, v) = pair.trim().split_once('=')?;
                        k.trim().eq_ignore_ascii_case("for").then(|| v.trim())
                    })
                    .and_then(parse_node)
            })
            .collect();
    }
    match joined("x-forwarded-for") {
        Some(xff) => xff.split(',').map(|h| parse_node(h.trim())).collect(),
        None => vec![],
    }
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
            ipv6_prefix: 64,
        }
    }

    #[test]
    fn rfc7239_forwarded_is_read_right_to_left() {
        let h = headers(&[(
            "forwarded",
            r#"for=192.0.2.60;proto=http, for="[2001:db8:cafe::17]:4711", for=10.0.0.5"#,
        )]);
        let ip = behind_proxy().resolve("127.0.0.1".parse().unwrap(), Fields::Map(&h));
        assert_eq!(ip, "2001:db8:cafe::17".parse::<IpAddr>().unwrap());
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
