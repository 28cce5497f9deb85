//! `store:`: memory or Redis (standalone, Cluster or Sentinel), its
//! timeouts, TLS and `on_error`.

use ratewarden::OnError;

use super::super::StoreSpec;
use super::super::diag::Diag;
use super::super::schema::*;

pub(super) fn store_spec(
    d: &Diag<'_>,
    s: StoreFile,
    files: &mut Vec<std::path::PathBuf>,
) -> Option<StoreSpec> {
    let kind = d.choice("type", &s.kind, &[("memory", true), ("redis", false)])?;
    if kind {
        let mut ok = true;
        for (k, present) in [
            ("url", s.url.is_some()),
            ("cluster", s.cluster.is_some()),
            ("key_prefix", s.key_prefix.is_some()),
            ("timeout", s.timeout.is_some()),
            ("on_error", s.on_error.is_some()),
            ("tls", s.tls.is_some()),
            ("sentinel", s.sentinel.is_some()),
        ] {
            if present {
                d.error(
                    k,
                    Some(&s.kind.referenced),
                    format!("`{k}` is only valid with `type: redis`"),
                );
                ok = false;
            }
        }
        let max_keys = match &s.max_keys {
            Some(m) => d.positive("max_keys", m).map(|n| n as usize),
            None => Some(1_000_000),
        };
        return ok.then_some(StoreSpec::Memory {
            max_keys: max_keys?,
        });
    }
    let mut ok = true;
    if let Some(m) = &s.max_keys {
        d.error(
            "max_keys",
            Some(&m.referenced),
            "`max_keys` is only valid with `type: memory`",
        );
        ok = false;
    }
    let cluster = s.cluster.unwrap_or_default();
    let sentinel = match &s.sentinel {
        None => Some(None),
        Some(sf) => {
            let mut good = true;
            if let Some(other) = s.url.as_ref().or(cluster.first()) {
                d.error(
                    "sentinel",
                    Some(&other.referenced),
                    "`sentinel` finds the master itself: give it without `url` or `cluster`",
                );
                good = false;
            }
            if sf.value.master.value.trim().is_empty() {
                d.error(
                    "master",
                    Some(&sf.value.master.referenced),
                    "the master's name the sentinels monitor (`mymaster`) must not be empty",
                );
                good = false;
            }
            if sf.value.nodes.is_empty() {
                d.error(
                    "nodes",
                    Some(&sf.referenced),
                    "`sentinel` needs `nodes`: the sentinels' URLs, like redis://127.0.0.1:26379",
                );
                good = false;
            }
            for n in &sf.value.nodes {
                good &= d
                    .check(
                        "nodes",
                        Some(&n.referenced),
                        ratewarden::store::redis::check_url(&n.value),
                    )
                    .is_some();
            }
            for pw in [&sf.value.password, &sf.value.sentinel_password]
                .into_iter()
                .flatten()
            {
                if pw.value.is_empty() {
                    d.error(
                        "password",
                        Some(&pw.referenced),
                        "an empty password: leave the key out instead",
                    );
                    good = false;
                }
            }
            good.then(|| {
                Some(ratewarden::store::redis::SentinelConfig {
                    master: sf.value.master.value.trim().to_owned(),
                    nodes: sf.value.nodes.iter().map(|n| n.value.clone()).collect(),
                    password: sf.value.password.as_ref().map(|p| p.value.clone()),
                    sentinel_password: sf.value.sentinel_password.as_ref().map(|p| p.value.clone()),
                })
            })
        }
    };
    if s.url.is_none() && cluster.is_empty() && s.sentinel.is_none() {
        d.error(
            "store",
            Some(&s.kind.referenced),
            "a redis store needs `url`, `cluster` or `sentinel`",
        );
        ok = false;
    }
    for u in s.url.iter().chain(&cluster) {
        let key = if s.url.as_ref().is_some_and(|x| std::ptr::eq(x, u)) {
            "url"
        } else {
            "cluster"
        };
        ok &= d
            .check(
                key,
                Some(&u.referenced),
                ratewarden::store::redis::check_url(&u.value),
            )
            .is_some();
    }
    let timeout = d.positive_duration(
        "timeout",
        &s.timeout,
        ratewarden::store::redis::DEFAULT_TIMEOUT,
    );
    let on_error = match &s.on_error {
        None => Some(OnError::Local),
        Some(v) => d.choice(
            "on_error",
            v,
            &[
                ("local", OnError::Local),
                ("allow", OnError::Allow),
                ("deny", OnError::Deny),
            ],
        ),
    };
    let key_prefix = match s.key_prefix {
        None => Some("rw:".to_owned()),
        Some(p) if p.value.contains(['{', '}']) => {
            d.error(
                "key_prefix",
                Some(&p.referenced),
                "must not contain `{` or `}` (they are the hash tag's)",
            );
            None
        }
        Some(p) => Some(p.value),
    };
    let tls = match &s.tls {
        None => Some(None),
        Some(t) => {
            let tls_url = s
                .url
                .iter()
                .chain(&cluster)
                .chain(s.sentinel.iter().flat_map(|x| &x.value.nodes))
                .any(|u| u.value.starts_with("rediss://"));
            if !tls_url {
                d.error(
                    "store.tls",
                    Some(&t.referenced),
                    "`store.tls` is for `rediss://` URLs (TLS); these are `redis://`",
                );
                None
            } else {
                super::super::tls::store(d, t).map(|(tls, read)| {
                    files.extend(read);
                    Some(tls)
                })
            }
        }
    };
    ok.then_some(())?;
    Some(StoreSpec::Redis {
        url: s.url.map(|u| u.value),
        cluster: cluster.into_iter().map(|c| c.value).collect(),
        sentinel: sentinel?,
        key_prefix: key_prefix?,
        timeout: timeout?,
        on_error: on_error?,
        tls: tls?,
    })
}
