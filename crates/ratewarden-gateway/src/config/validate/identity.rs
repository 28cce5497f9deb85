//! `identity:`: who a client is (its address, a forwarding header behind
//! trusted proxies, an API key, a JWT claim), and the address lists
//! (`allow`, `deny`, `trusted_proxies`).

use std::net::IpAddr;

use http::HeaderName;
use ipnet::IpNet;

use super::super::diag::Diag;
use super::super::model::*;
use super::super::schema::*;
use super::opt;

pub(super) fn identity(
    d: &Diag<'_>,
    f: Option<IdentityFile>,
    has: super::Sections,
) -> Option<IdentitySource> {
    let Some(f) = f else {
        return Some(IdentitySource::Address(ClientIp::default()));
    };
    let mut trusted = Some(vec![]);
    for t in &f.trusted_proxies {
        match parse_net(&t.value) {
            Ok(n) => {
                if let Some(v) = trusted.as_mut() {
                    v.push(n);
                }
            }
            Err(m) => {
                d.error("trusted_proxies", Some(&t.referenced), m);
                trusted = None;
            }
        }
    }
    let ipv6_prefix = match &f.ipv6_prefix {
        Some(p) if (1..=128).contains(&p.value) => Some(p.value as u8),
        Some(p) => {
            d.error(
                "ipv6_prefix",
                Some(&p.referenced),
                "must be between 1 and 128",
            );
            None
        }
        None => Some(64),
    };
    #[derive(Clone, Copy, PartialEq)]
    enum From {
        Ip,
        Forwarded,
        Header,
        Jwt,
        Consumer,
    }
    let from = match &f.from {
        None => Some(From::Ip),
        Some(v) => d.choice(
            "from",
            v,
            &[
                ("ip", From::Ip),
                ("forwarded", From::Forwarded),
                ("header", From::Header),
                ("jwt", From::Jwt),
                ("consumer", From::Consumer),
            ],
        ),
    };
    // With `from: forwarded`, `header` names the forwarding header the
    // operator's proxy sets (the only one read); else the identity's own.
    let forward_header = match (from, &f.header) {
        (Some(From::Forwarded), Some(h)) => match ForwardHeader::from_name(h.value.trim()) {
            Some(fh) => Some(fh),
            None => {
                d.error(
                    "header",
                    Some(&h.referenced),
                    format!(
                        "with `from: forwarded`, `header` is the forwarding header your proxy sets: x-forwarded-for (the default: nginx, HAProxy, Caddy, Traefik), forwarded (RFC 7239) or x-real-ip, not `{}`",
                        h.value
                    ),
                );
                None
            }
        },
        _ => Some(ForwardHeader::default()),
    };
    let header = match from {
        Some(From::Forwarded) => Some(None),
        _ => opt(&f.header, |h| {
            d.check(
                "header",
                Some(&h.referenced),
                HeaderName::from_bytes(h.value.as_bytes())
                    .map_err(|_| format!("`{}` is not a header name", h.value)),
            )
        }),
    };
    let missing = match &f.missing {
        None => Some(Missing::Ip),
        Some(v) => d.choice(
            "missing",
            v,
            &[
                ("ip", Missing::Ip),
                ("reject", Missing::Reject),
                ("anonymous", Missing::Anonymous),
                ("skip", Missing::Skip),
            ],
        ),
    };
    let client_ip = |forwarded| {
        Some(ClientIp {
            forwarded,
            header: forward_header?,
            trusted_proxies: trusted.clone()?,
            ipv6_prefix: ipv6_prefix?,
        })
    };
    match (from?, header?) {
        (From::Ip, _) => Some(IdentitySource::Address(client_ip(false)?)),
        (From::Forwarded, _) => Some(IdentitySource::Address(client_ip(true)?)),
        (From::Header, Some(name)) => Some(IdentitySource::Header {
            name,
            client_ip: client_ip(false)?,
            missing: missing?,
        }),
        (From::Header, None) => {
            d.error(
                "header",
                f.from.as_ref().map(|v| &v.referenced),
                "`from: header` needs `header: NAME`",
            );
            None
        }
        (From::Consumer, _) if !has.consumers => {
            d.error(
                "from",
                f.from.as_ref().map(|v| &v.referenced),
                "`from: consumer` needs a top-level `consumers:` section (where the API key is)",
            );
            None
        }
        (From::Consumer, _) => Some(IdentitySource::Consumer {
            client_ip: client_ip(false)?,
            missing: missing?,
        }),
        (From::Jwt, _) if !has.jwt => {
            d.error(
                "from",
                f.from.as_ref().map(|v| &v.referenced),
                "`from: jwt` needs a top-level `jwt:` section (where the token is, its keys)",
            );
            None
        }
        (From::Jwt, _) => Some(IdentitySource::Claim {
            claim: f
                .claim
                .as_ref()
                .map_or("sub", |c| c.value.as_str())
                .to_owned(),
            client_ip: client_ip(false)?,
            missing: missing?,
        }),
    }
}

/// A CIDR or a single address.
pub(super) fn parse_net(v: &str) -> Result<IpNet, String> {
    let v = v.trim();
    v.parse::<IpNet>()
        .or_else(|_| v.parse::<IpAddr>().map(IpNet::from))
        .map_err(|_| format!("`{v}` is not an address or a CIDR like 10.0.0.0/8"))
}

/// Whether `v` is written like an address or a CIDR (digits and dots, or
/// hex and colons, maybe a `/prefix`), so that a typo in one (`/33`,
/// `10.0.0.256`) is an error rather than an identity nobody has.
pub(super) fn looks_like_address(v: &str) -> bool {
    let v = v.trim();
    v.chars().any(|c| c.is_ascii_digit())
        && v.contains(['.', ':'])
        && v.chars()
            .all(|c| c.is_ascii_hexdigit() || matches!(c, '.' | ':' | '/'))
}

/// `allow:` / `deny:` entries. With the identity taken from the client's
/// address, each must be an address or a CIDR; with `from: header` an
/// entry may also be an identity, unless it is written like an address.
pub(super) fn patterns(
    d: &Diag<'_>,
    key: &str,
    list: &[Sp<String>],
    by_header: bool,
) -> Option<Vec<Pattern>> {
    let mut out = Some(vec![]);
    for s in list {
        let v = s.value.trim();
        let p = match parse_net(v) {
            Ok(n) => Ok(Pattern::Net(n)),
            Err(m) if !by_header || looks_like_address(v) => Err(m),
            Err(_) if v.is_empty() => Err("an empty entry matches nobody".to_owned()),
            // Written as the client sends it; compared as identities are
            // kept (a `%` escaped: see `admission::STAND_IN`).
            Err(_) => Ok(Pattern::Identity(
                ratewarden_tower::admission::client_identity(v),
            )),
        };
        match p {
            Ok(p) => {
                if let Some(o) = out.as_mut() {
                    o.push(p);
                }
            }
            Err(m) => {
                let hint = if by_header {
                    ""
                } else {
                    " (identities are taken from client addresses here: entries are addresses or CIDRs)"
                };
                d.error(key, Some(&s.referenced), format!("{m}{hint}"));
                out = None;
            }
        }
    }
    out
}
