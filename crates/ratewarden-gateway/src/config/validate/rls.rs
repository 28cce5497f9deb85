//! `rls:`: Envoy's rate limit service listener and its domains.

use super::super::diag::Diag;
use super::super::schema::*;
use super::listeners::{header_style, socket_addr};

/// `rls:`: the listener, the headers, and the domains of `rls.config`
/// (a file or a directory of them, in envoyproxy/ratelimit's format) and
/// of `rls.domains`.
pub(super) fn rls_spec(
    d: &Diag<'_>,
    r: Sp<super::super::schema::RlsFile>,
) -> Option<crate::config::rls::RlsSpec> {
    let r = r.value;
    let listen = socket_addr(d, "rls.listen", &r.listen);
    // Envoy's own service sends none unless asked.
    let listed = r.headers.as_deref().unwrap_or_default();
    let envoy = listed.iter().any(|h| h.value == "envoy");
    let others: Vec<Sp<String>> = listed
        .iter()
        .filter(|h| h.value != "envoy")
        .cloned()
        .collect();
    let headers = header_style(d, "rls.headers", &others);
    let names = r.header_names.as_ref().map(|n| &n.value);
    let name = |given: Option<&Sp<String>>, default: &str, key: &str| -> Option<String> {
        match given {
            None => Some(default.to_owned()),
            Some(v) if http::HeaderName::from_bytes(v.value.as_bytes()).is_ok() => {
                Some(v.value.clone())
            }
            Some(v) => {
                d.error(
                    key,
                    Some(&v.referenced),
                    format!("`{}` is not a header name", v.value),
                );
                None
            }
        }
    };
    let envoy_headers = match (envoy, names) {
        (false, Some(_)) => {
            d.error(
                "rls.header_names",
                r.header_names.as_ref().map(|n| &n.referenced),
                "`header_names` names the `envoy` headers: add `envoy` to `rls.headers`",
            );
            None
        }
        (false, None) => Some(None),
        (true, n) => {
            let limit = name(
                n.and_then(|n| n.limit.as_ref()),
                "RateLimit-Limit",
                "rls.header_names.limit",
            );
            let remaining = name(
                n.and_then(|n| n.remaining.as_ref()),
                "RateLimit-Remaining",
                "rls.header_names.remaining",
            );
            let reset = name(
                n.and_then(|n| n.reset.as_ref()),
                "RateLimit-Reset",
                "rls.header_names.reset",
            );
            match (limit, remaining, reset) {
                (Some(a), Some(b), Some(c)) => Some(Some([a, b, c])),
                _ => None,
            }
        }
    };
    let mut files: Vec<(String, crate::config::rls::DomainFile)> = vec![];
    let mut ok = true;
    if let Some(path) = &r.config {
        match crate::config::rls::read_files(d, path) {
            Some(read) => files.extend(read),
            None => ok = false,
        }
    }
    for (i, dom) in r.domains.into_iter().enumerate() {
        files.push((format!("rls.domains[{i}]"), dom));
    }
    let domains = match crate::config::rls::build(&files) {
        Ok(domains) => Some(domains),
        Err(errors) => {
            for (file, key, message) in errors {
                d.error_in(&file, &key, message);
            }
            None
        }
    };
    if !ok {
        return None;
    }
    Some(crate::config::rls::RlsSpec {
        listen: listen?,
        headers: headers?,
        envoy_headers: envoy_headers?,
        domains: std::sync::Arc::new(domains?),
        source: r.config.map(|p| std::path::PathBuf::from(p.value)),
    })
}
