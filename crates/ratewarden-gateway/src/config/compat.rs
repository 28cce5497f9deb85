//! The Go gateway's format (seed 002): `rateLimiter:` with `strategy`,
//! `identity`, `client`, `apis`, `target`. Translated as that post
//! describes: one `client` rule on every request, one rule per API (per
//! client), the chosen strategy for all, legacy `X-RateLimit-*` headers.
//! `windowSeconds` is the window; for the bucket strategies
//! `refillSeconds` is the time in which `limit` tokens are refilled.
//! `expireSeconds` is accepted and not needed: every state expires
//! exactly when it no longer matters.

use std::str::FromStr;

use ratewarden::algorithm::Kind;
use ratewarden_schema::compat::CompatFile;

use super::diag::Diag;
use super::model::{Config, Overrides};
use super::schema::*;
use super::validate::validate;

fn strategy(d: &Diag<'_>, s: &Option<Sp<String>>) -> Option<Kind> {
    let Some(s) = s else {
        return Some(Kind::default());
    };
    let norm = s.value.trim().replace([' ', '-'], "_");
    let norm = if norm == "fixed_window_counter" {
        "fixed_window".to_owned()
    } else {
        norm
    };
    match Kind::from_str(&norm) {
        Ok(k) if k != Kind::Gcra => Some(k),
        _ => {
            d.error(
                "strategy",
                Some(&s.referenced),
                format!("unknown strategy `{}` (token_bucket, leaky_bucket, fixed_window_counter, sliding_window_log, sliding_window_counter)", s.value),
            );
            None
        }
    }
}

/// The window of a translated rule: `windowSeconds`, or `refillSeconds` for
/// the bucket strategies.
fn window(
    d: &Diag<'_>,
    kind: Kind,
    w: &Option<Sp<i64>>,
    r: &Option<Sp<i64>>,
    at: &serde_saphyr::Location,
) -> Option<Sp<String>> {
    let bucket = matches!(kind, Kind::TokenBucket | Kind::LeakyBucket);
    let (key, v) = match (bucket, r, w) {
        (true, Some(r), _) => ("refillSeconds", r),
        (_, _, Some(w)) => ("windowSeconds", w),
        (false, Some(r), None) => ("refillSeconds", r),
        (_, None, None) => {
            d.error(
                "windowSeconds",
                Some(at),
                "`windowSeconds` (or `refillSeconds` for bucket strategies) is required",
            );
            return None;
        }
    };
    if v.value < 1 {
        d.error(
            key,
            Some(&v.referenced),
            format!("must be a whole number >= 1, not {}", v.value),
        );
        return None;
    }
    Some(Sp::new(format!("{}s", v.value), v.referenced, v.defined))
}

/// A rule of the Go format: only a name, a match, a limit and a window;
/// every modifier at its default.
fn compat_rule(
    name: Sp<String>,
    matcher: Option<MatchFile>,
    limit: Sp<i64>,
    window: Sp<String>,
    kind: Kind,
) -> RuleFile {
    RuleFile {
        name,
        matcher: matcher.map(nowhere),
        key: None,
        missing: None,
        algorithm: Some(nowhere(kind.name().into())),
        limit: Some(Sp {
            value: LimitFile::Whole(limit.value),
            referenced: limit.referenced,
            defined: limit.defined,
        }),
        window: Some(window),
        burst: None,
        mode: None,
        max_delay: None,
        min_interval: None,
        penalty: None,
        count: None,
        reset_on_success: None,
        failure_status: None,
        failure_grpc_status: None,
        count_rejected: None,
        cost: None,
        refusal: None,
        jwt_required: None,
        shadow: None,
        max_hold: None,
        distribution: None,
        calendar: None,
        tiers: None,
        status: None,
        problem_type: None,
    }
}

pub(super) fn translate(f: CompatFile, d: &Diag<'_>, o: &Overrides) -> Option<Config> {
    let root = f.rate_limiter;
    let kind = strategy(d, &root.strategy)?;
    let mut rules = vec![];
    let mut ok = true;
    if let Some(c) = root.client {
        let _ = &c.expire_seconds;
        match window(
            d,
            kind,
            &c.window_seconds,
            &c.refill_seconds,
            &c.limit.referenced,
        ) {
            Some(w) => rules.push(compat_rule(
                nowhere("client".into()),
                None,
                c.limit.clone(),
                w,
                kind,
            )),
            None => ok = false,
        }
    }
    for api in root.apis {
        let _ = &api.expire_seconds;
        let (path, regex) = match api.path.expression.value.as_str() {
            "plain" => (Some(api.path.value.clone()), None),
            "regex" => (None, Some(api.path.value.clone())),
            other => {
                d.error(
                    "expression",
                    Some(&api.path.expression.referenced),
                    format!("`{other}`: expected plain or regex"),
                );
                ok = false;
                continue;
            }
        };
        let matcher = MatchFile {
            methods: api.method.clone().map(|m| vec![m]),
            path,
            path_prefix: None,
            path_regex: regex,
            case_insensitive: None,
            route: None,
            hosts: None,
            headers: None,
            query: None,
            json: None,
        };
        match window(
            d,
            kind,
            &api.window_seconds,
            &api.refill_seconds,
            &api.identifier.referenced,
        ) {
            Some(w) => rules.push(compat_rule(
                api.identifier.clone(),
                Some(matcher),
                api.limit.clone(),
                w,
                kind,
            )),
            None => ok = false,
        }
    }
    // identity.key: ipv4 with header X-Forwarded-For: the post reads the
    // client address from that header, as its proxy in front sets it.
    let identity = match root.identity {
        None => None,
        Some(i) => {
            let _ = &i.key;
            match i.header {
                Some(h)
                    if h.value.eq_ignore_ascii_case("x-forwarded-for")
                        || h.value.eq_ignore_ascii_case("forwarded") =>
                {
                    Some(IdentityFile {
                        from: Some(nowhere("forwarded".into())),
                        header: Some(h),
                        claim: None,
                        missing: None,
                        trusted_proxies: vec![nowhere("0.0.0.0/0".into()), nowhere("::/0".into())],
                        ipv6_prefix: None,
                    })
                }
                Some(h) => Some(IdentityFile {
                    from: Some(nowhere("header".into())),
                    header: Some(h),
                    claim: None,
                    missing: None,
                    trusted_proxies: vec![],
                    ipv6_prefix: None,
                }),
                None => None,
            }
        }
    };
    let file = File {
        listen: None,
        workers: None,
        upstream: root.target,
        rls: None,
        key_secret: None,
        consumers: None,
        jwt: None,
        overrides: None,
        state_dir: None,
        authz: None,
        upstream_timeout: None,
        upstream_path: None,
        client_idle_timeout: None,
        client_header_timeout: None,
        client_body_timeout: None,
        underscores_in_headers: None,
        preserve_host: None,
        forwarded: None,
        x_forwarded_for: None,
        client_max_body_size: None,
        request_headers: None,
        tls: None,
        upstream_tls: None,
        log: None,
        access_log: None,
        tracing: None,
        admin: default_admin(),
        store: None,
        identity,
        allow: vec![],
        deny: vec![],
        headers: Some(vec![nowhere("legacy".into())]),
        status: None,
        rules,
        routes: vec![],
    };
    let config = validate(file, d, o);
    if ok { config } else { None }
}
