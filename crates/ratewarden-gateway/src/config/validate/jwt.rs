//! `identity.jwt:`: the verifier of a JWT identity.

use http::HeaderName;

use super::super::diag::Diag;
use super::super::schema::*;

/// `jwt:`: the verifier, its JWKS file read and checked now (a bad one
/// never starts). A `jwks_url` is named, not fetched: loading a config
/// does no network I/O (the gateway fetches it before it serves with it,
/// and `ratewarden validate` to check it).
pub(super) fn jwt_verifier(d: &Diag<'_>, j: &Sp<JwtFile>) -> Option<crate::jwt::Verifier> {
    let at = Some(&j.referenced);
    let j = &j.value;
    let from = match j.from.as_ref().map(|f| (&f.value, &f.referenced)) {
        None => crate::jwt::From::Header("authorization".into()),
        Some((f, at)) => match (&f.header, &f.cookie, &f.query) {
            (Some(h), None, None) => match HeaderName::from_bytes(h.as_bytes()) {
                Ok(n) => crate::jwt::From::Header(n.as_str().to_owned()),
                Err(_) => {
                    d.error("from", Some(at), format!("`{h}` is not a header name"));
                    return None;
                }
            },
            (None, Some(c), None) => crate::jwt::From::Cookie(c.clone()),
            (None, None, Some(q)) => crate::jwt::From::Query(q.clone()),
            _ => {
                d.error("from", Some(at), "one of `header`, `cookie`, `query`");
                return None;
            }
        },
    };
    let jwks = match &j.jwks {
        None => None,
        Some(p) => match std::fs::read_to_string(&p.value) {
            Ok(t) => Some(t),
            Err(e) => {
                d.error(
                    "jwks",
                    Some(&p.referenced),
                    format!("cannot read `{}`: {e}", p.value),
                );
                return None;
            }
        },
    };
    let leeway = match &j.leeway {
        None => Some(0),
        Some(l) => d.duration("leeway", l).map(|l| l.as_secs()),
    }?;
    let made = crate::jwt::Verifier::new(
        from,
        jwks.as_deref(),
        j.secret.as_ref().map(|s| s.value.as_bytes()),
        j.issuer.as_ref().map(|i| i.value.clone()),
        j.audiences
            .iter()
            .flatten()
            .map(|a| a.value.clone())
            .collect(),
        leeway,
    );
    if j.jwks.is_none() && j.jwks_url.is_none() && j.secret.is_none() {
        d.error(
            "jwt",
            at,
            "give `jwks` or `jwks_url` (public keys) or `secret` (HS256/384/512)",
        );
        return None;
    }
    let made = match (made, &j.jwks_url) {
        (Ok(v), Some(url)) => v.with_url_unfetched(&url.value).map_err(|e| {
            d.error("jwks_url", Some(&url.referenced), e);
        }),
        (Ok(v), None) => Ok(v),
        (Err(e), _) => {
            let key = if j.jwks.is_some() { "jwks" } else { "jwt" };
            let at = j.jwks.as_ref().map(|p| &p.referenced).or(at);
            d.error(key, at, e);
            Err(())
        }
    };
    match made {
        Ok(mut v) => {
            v.required = j.required.as_ref().is_some_and(|r| r.value);
            Some(v)
        }
        Err(()) => None,
    }
}
