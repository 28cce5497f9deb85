//! The TLS sections: `tls` (the proxy listener), `admin.tls`,
//! `upstream_tls` and `store.tls`. Files are read and checked here, at
//! load: a certificate that does not parse or a key that is not its
//! certificate's is an error at the key that names the file.
//!
//! Relative paths are relative to the config file's directory (the
//! working directory for the built-in config), so a config and its
//! certificates can move together.

use std::path::{Path, PathBuf};

use rustls::pki_types::ServerName;

use super::diag::Diag;
use super::model::Upstream;
use super::schema::{Sp, StoreTlsFile, TlsFile, UpstreamTlsFile};
use crate::tls::{self, ClientTls, MaterialError, Pair, ServerTls};

impl Diag<'_> {
    /// `p` as written, relative to the config file's directory.
    pub(crate) fn path(&self, p: &str) -> PathBuf {
        let p = Path::new(p);
        if p.is_absolute() {
            return p.to_owned();
        }
        match Path::new(self.file).parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir.join(p),
            _ => p.to_owned(),
        }
    }

    fn material<T>(&self, key: &str, at: &Sp<String>, r: Result<T, MaterialError>) -> Option<T> {
        self.check(key, Some(&at.referenced), r.map_err(|e| e.to_string()))
    }
}

/// A listener's `tls:` (`prefix` is `tls` or `admin.tls`); `client_ca`
/// only where `mtls` allows it.
pub(crate) fn listener(
    d: &Diag<'_>,
    prefix: &str,
    f: &Sp<TlsFile>,
    mtls: bool,
) -> Option<ServerTls> {
    let t = &f.value;
    let at = Some(&f.referenced);
    let mut pairs: Vec<(&Sp<String>, &Sp<String>)> = vec![];
    match (&t.cert, &t.key, &t.certificates) {
        (Some(c), Some(k), None) => pairs.push((c, k)),
        (None, None, Some(list)) if !list.is_empty() => {
            pairs.extend(list.iter().map(|p| (&p.value.cert, &p.value.key)));
        }
        (Some(_), None, _) | (None, Some(_), _) => {
            d.error(
                &format!("{prefix}.cert"),
                at,
                "`cert` and `key` go together: give both",
            );
            return None;
        }
        (Some(_), Some(_), Some(_)) => {
            d.error(
                &format!("{prefix}.certificates"),
                at,
                "give `cert` and `key`, or `certificates`, not both",
            );
            return None;
        }
        _ => {
            d.error(
                &format!("{prefix}.cert"),
                at,
                "needs `cert` and `key` (PEM files), or `certificates: [{cert, key}, ...]`",
            );
            return None;
        }
    }
    let client_ca = match &t.client_ca {
        Some(ca) if !mtls => {
            d.error(
                &format!("{prefix}.client_ca"),
                Some(&ca.referenced),
                "client certificates are only asked for on the admin listener (`admin.tls.client_ca`)",
            );
            return None;
        }
        Some(ca) => Some((ca, d.path(&ca.value))),
        None => None,
    };
    // Each pair on its own first, so that every bad file is reported.
    let mut ok = true;
    let paths: Vec<(PathBuf, PathBuf)> = pairs
        .iter()
        .map(|(c, k)| (d.path(&c.value), d.path(&k.value)))
        .collect();
    for ((c, k), (cp, kp)) in pairs.iter().zip(&paths) {
        let r = tls::certified_key(&Pair { cert: cp, key: kp });
        // A fault in the key file is reported at `key`, else at `cert`.
        let (key, at) = match &r {
            Err(e) if e.path == *kp => (format!("{prefix}.key"), *k),
            _ => (format!("{prefix}.cert"), *c),
        };
        ok &= d.material(&key, at, r).is_some();
    }
    if let Some((at, p)) = &client_ca {
        ok &= d
            .material(&format!("{prefix}.client_ca"), at, tls::roots(p))
            .is_some();
    }
    if !ok {
        return None;
    }
    let pairs: Vec<Pair<'_>> = paths
        .iter()
        .map(|(c, k)| Pair { cert: c, key: k })
        .collect();
    let r = tls::server(&pairs, client_ca.as_ref().map(|(_, p)| p.as_path()));
    d.check(&format!("{prefix}.cert"), at, r.map_err(|e| e.to_string()))
}

/// `upstream_tls:` for an https `upstream`: the name to verify (the URL's
/// host unless `server_name`), the CA (else the system's roots) and a
/// client certificate. `routes_https`: some route has an https server, so
/// `upstream_tls` applies even with an http default upstream.
pub(crate) fn upstream(
    d: &Diag<'_>,
    upstream: Option<&Upstream>,
    f: Option<&Sp<UpstreamTlsFile>>,
    routes_https: bool,
) -> Option<Option<ClientTls>> {
    let url = match upstream {
        Some(Upstream::Url(u)) if u.scheme_str() == Some("https") => u,
        Some(_) => {
            if let Some(f) = f
                && !routes_https
            {
                d.error(
                    "upstream_tls",
                    Some(&f.referenced),
                    "`upstream_tls` applies to https upstreams only, and none is",
                );
                return None;
            }
            return Some(None);
        }
        // The upstream is wrong already (reported): nothing more to say.
        None => return None,
    };
    client_for(d, url, f).map(Some)
}

/// The TLS client of the https server `url`, per `upstream_tls`.
pub(crate) fn client_for(
    d: &Diag<'_>,
    url: &http::Uri,
    f: Option<&Sp<UpstreamTlsFile>>,
) -> Option<ClientTls> {
    let t = f.map(|f| &f.value);
    let name = match t.and_then(|t| t.server_name.as_ref()) {
        Some(n) => d.check(
            "upstream_tls.server_name",
            Some(&n.referenced),
            ServerName::try_from(n.value.clone())
                .map_err(|_| format!("`{}` is not a DNS name or IP address", n.value)),
        )?,
        None => {
            // A bracketed IPv6 literal is the address inside the brackets.
            let host = url.host().unwrap_or_default();
            let host = host.trim_start_matches('[').trim_end_matches(']');
            d.check(
                "upstream",
                None,
                ServerName::try_from(host.to_owned())
                    .map_err(|_| format!("`{host}` cannot be checked against a certificate; set `upstream_tls.server_name`")),
            )?
        }
    };
    let ca = t.and_then(|t| t.ca.as_ref());
    let pair = match t.map(|t| (&t.client_cert, &t.client_key)) {
        Some((Some(c), Some(k))) => Some((c, k)),
        Some((None, None)) | None => None,
        Some((c, k)) => {
            let at = c.as_ref().or(k.as_ref()).map(|v| &v.referenced);
            d.error(
                "upstream_tls.client_cert",
                at,
                "`client_cert` and `client_key` go together: give both",
            );
            return None;
        }
    };
    let ca_path = ca.map(|c| d.path(&c.value));
    let pair_paths = pair.map(|(c, k)| (d.path(&c.value), d.path(&k.value)));
    let pair_ref = pair_paths.as_ref().map(|(c, k)| Pair { cert: c, key: k });
    let r = tls::client(name, ca_path.as_deref(), pair_ref.as_ref());
    let at = match &r {
        Err(e) if Some(&e.path) == ca_path.as_ref() => ca.map(|c| ("upstream_tls.ca", c)),
        Err(e) if pair_paths.as_ref().is_some_and(|(_, k)| *k == e.path) => {
            pair.map(|(_, k)| ("upstream_tls.client_key", k))
        }
        _ => pair.map(|(c, _)| ("upstream_tls.client_cert", c)),
    };
    match (r, at) {
        (Ok(c), _) => Some(c),
        (Err(e), Some((key, v))) => {
            d.error(key, Some(&v.referenced), e.to_string());
            None
        }
        (Err(e), None) => {
            d.error("upstream_tls", None, e.to_string());
            None
        }
    }
}

/// `store.tls:` read into the Redis client's PEM bytes, the files
/// checked as a listener's would be; `rediss://` URLs need none.
pub(crate) fn store(
    d: &Diag<'_>,
    f: &Sp<StoreTlsFile>,
) -> Option<(ratewarden::RedisTls, Vec<PathBuf>)> {
    let t = &f.value;
    let mut files = vec![];
    let mut ok = true;
    let ca = match &t.ca {
        Some(ca) => {
            let p = d.path(&ca.value);
            ok &= d.material("store.tls.ca", ca, tls::roots(&p)).is_some();
            let bytes = std::fs::read(&p).ok();
            files.push(p);
            bytes
        }
        None => None,
    };
    let client = match (&t.client_cert, &t.client_key) {
        (Some(c), Some(k)) => {
            let (cp, kp) = (d.path(&c.value), d.path(&k.value));
            let r = tls::certified_key(&Pair {
                cert: &cp,
                key: &kp,
            });
            let (key, at) = match &r {
                Err(e) if e.path == kp => ("store.tls.client_key", k),
                _ => ("store.tls.client_cert", c),
            };
            ok &= d.material(key, at, r).is_some();
            let pem = std::fs::read(&cp).ok().zip(std::fs::read(&kp).ok());
            files.extend([cp, kp]);
            pem
        }
        (None, None) => None,
        _ => {
            d.error(
                "store.tls.client_cert",
                Some(&f.referenced),
                "`client_cert` and `client_key` go together: give both",
            );
            return None;
        }
    };
    ok.then_some((ratewarden::RedisTls { ca, client }, files))
}
