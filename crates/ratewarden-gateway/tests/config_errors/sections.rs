//! Errors of one section each, at their lines: TLS files, distribution,
//! Sentinel, request headers, match fields and key parts, JWT, tiers and
//! calendars.

use super::*;

/// A certificate for `localhost` and its key, PEM, and a stranger's key.
fn pem_pair() -> (String, String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    let stranger = rcgen::KeyPair::generate().unwrap();
    (cert.pem(), key.serialize_pem(), stranger.serialize_pem())
}

#[test]
fn tls_files_must_exist_parse_and_belong_together_each_error_at_its_key() {
    let dir = std::env::temp_dir().join(format!("rw-tls-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (cert, key, stranger) = pem_pair();
    let put = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let (c, k, s) = (
        put("c.pem", &cert),
        put("c.key", &key),
        put("s.key", &stranger),
    );
    let junk = put("junk.pem", "not a certificate\n");
    let missing = dir.join("missing.pem").display().to_string();
    // A good pair loads; the files are watched.
    let ok = config::load(
        &format!("upstream: echo\ntls: {{cert: {c}, key: {k}}}\nrules: []\n"),
        "ok.yaml",
        &Overrides::default(),
    )
    .unwrap();
    assert!(ok.tls.is_some());
    assert_eq!(ok.tls_files.len(), 2);
    // Each fault, at its key and line, naming the file.
    let e = error(&format!("rules: []\ntls: {{cert: {missing}, key: {k}}}\n"));
    assert_eq!((e.line, e.key.as_str()), (2, "tls.cert"), "{e}");
    assert!(e.message.contains("missing.pem: cannot be read"), "{e}");
    let e = error(&format!("tls: {{cert: {junk}, key: {k}}}\n"));
    assert!(e.message.contains("junk.pem: holds no certificate"), "{e}");
    let e = error(&format!("tls: {{cert: {c}, key: {s}}}\n"));
    assert_eq!(e.key, "tls.key", "{e}");
    assert!(
        e.message
            .contains("s.key: is not the key of the certificate in"),
        "{e}"
    );
    let e = error(&format!("tls: {{cert: {c}, key: {junk}}}\n"));
    assert!(e.message.contains("junk.pem: holds no private key"), "{e}");
    let e = error(&format!("tls: {{cert: {c}}}\n"));
    assert!(e.message.contains("`cert` and `key` go together"), "{e}");
    // Relative paths are the config file's directory's.
    let rel = config::load(
        "upstream: echo\ntls: {cert: c.pem, key: c.key}\n",
        &dir.join("gw.yaml").display().to_string(),
        &Overrides::default(),
    );
    assert!(rel.is_ok(), "{:?}", rel.err());
    // Options where they do not apply.
    let e = error(&format!("tls: {{cert: {c}, key: {k}, client_ca: {c}}}\n"));
    assert_eq!(e.key, "tls.client_ca", "{e}");
    let e = error(&format!(
        "upstream: http://a:1\nupstream_tls: {{ca: {c}}}\n"
    ));
    assert_eq!(e.key, "upstream_tls", "{e}");
    let e = error(&format!(
        "upstream: https://a:1\nupstream_tls: {{ca: {junk}}}\n"
    ));
    assert_eq!(e.key, "upstream_tls.ca", "{e}");
    let e = error(&format!(
        "store: {{type: redis, url: 'redis://127.0.0.1:6379', tls: {{ca: {c}}}}}\n"
    ));
    assert!(
        e.message.contains("`store.tls` is for `rediss://` URLs"),
        "{e}"
    );
    // validate exits 2 and names the file.
    let file = put(
        "bad.yaml",
        &format!("tls: {{cert: {c}, key: {s}}}\nrules: []\n"),
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
        .args(["validate", &file])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml:1:") && err.contains("`tls.key`"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_distribution_that_cannot_work_is_refused_at_its_line() {
    // An unknown mode.
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 1000\n    window: 60s\n    distribution: {{mode: share}}\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (6, "distribution"), "{e}");
    assert!(e.message.contains("the one mode is `lease`"), "{e}");
    // A share out of range.
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 1000\n    window: 60s\n    distribution: {{mode: lease, epsilon: 2}}\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (6, "distribution"), "{e}");
    // A rule that cannot be leased (a ban decides per request).
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 1000\n    window: 60s\n    penalty: 1m\n    distribution: {{mode: lease}}\n"
    ));
    assert_eq!(e.key.as_str(), "distribution", "{e}");
    assert!(e.message.contains("a plain limit"), "{e}");
    // A lease room under one request: epsilon x limit < 1.
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 50\n    window: 60s\n    distribution: {{mode: lease}}\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (6, "distribution"), "{e}");
    assert!(e.message.contains("raise epsilon"), "{e}");
    // And one that can loads.
    config::load(
        &format!("{HEAD}  - name: r\n    key: [global]\n    limit: 1000\n    window: 60s\n    distribution: {{mode: lease, epsilon: 0.05, max_share: 0.5}}\n"),
        "ok.yaml",
        &Overrides::default(),
    )
    .unwrap();
}

#[test]
fn a_sentinel_section_is_checked_at_its_lines() {
    let all = |yaml: &str| {
        config::load(yaml, "bad.yaml", &Overrides::default())
            .expect_err("must be rejected")
            .all()
            .to_vec()
    };
    // An empty master, a node that is not a Redis URL, and a URL beside it:
    // every error at once, each at its line.
    let errs = all(
        "upstream: http://127.0.0.1:9000\nstore:\n  type: redis\n  url: redis://127.0.0.1:6379\n  sentinel:\n    master: ''\n    nodes: [redis://127.0.0.1:26379, 'http://x:1']\n",
    );
    let at = |key: &str| errs.iter().find(|e| e.key == key).map(|e| e.line);
    assert_eq!(at("master"), Some(6), "{errs:?}");
    assert_eq!(at("nodes"), Some(7), "{errs:?}");
    assert_eq!(at("sentinel"), Some(4), "at the `url` beside it: {errs:?}");
    // A typo inside it is named with the closest key.
    let e = error(
        "store:\n  type: redis\n  sentinel:\n    mastr: m\n    nodes: [redis://127.0.0.1:26379]\n",
    );
    assert!(e.message.contains("did you mean `master`?"), "{e}");
    assert_eq!(e.line, 4);
    // A good one loads.
    config::load(
        "upstream: echo\nstore:\n  type: redis\n  sentinel:\n    master: mymaster\n    nodes: [redis://127.0.0.1:26379]\n    password: p\n",
        "good.yaml",
        &Overrides::default(),
    )
    .unwrap();
}

#[test]
fn request_headers_refuse_what_the_gateway_owns_each_at_its_line() {
    let errs = config::load(
        "upstream: http://127.0.0.1:9000\nrequest_headers:\n  set:\n    X-Forwarded-For: 1.2.3.4\n    X-RateLimit-Remaining: '5'\n    X-Ok: fine\n  remove: [Connection, 'bad name', Host]\n",
        "bad.yaml",
        &Overrides::default(),
    )
    .expect_err("must be rejected")
    .all()
    .to_vec();
    let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(errs.len(), 5, "{text:#?}");
    assert!(
        text.iter()
            .any(|e| e.contains(":4:") && e.contains("X-Forwarded-For")),
        "{text:#?}"
    );
    assert!(
        text.iter()
            .any(|e| e.contains(":5:") && e.contains("rate-limit header")),
        "{text:#?}"
    );
    assert!(
        text.iter()
            .any(|e| e.contains("Connection") && e.contains("one hop")),
        "{text:#?}"
    );
    assert!(
        text.iter()
            .any(|e| e.contains("`bad name` is not a header name")),
        "{text:#?}"
    );
    assert!(
        text.iter().any(|e| e.contains("`Host` cannot be removed")),
        "{text:#?}"
    );
}

/// Issue 34's match fields and key parts: each mistake at its line and
/// column, all of them in one run.
#[test]
fn new_match_fields_and_key_parts_are_checked_at_their_lines() {
    let yaml = format!(
        "{HEAD}  - name: a\n    limit: 5\n    window: 60s\n    match:\n      headers:\n        - {{name: X-Plan, exakt: pro}}\n      hosts: [\"\", \"*.\", \"api.example.com:443\", \"bad host\"]\n      query:\n        - {{name: format, exact: json, prefix: j}}\n        - {{name: debug}}\n    key: ['jwt:sub', 'cookie:']\n    missing: ignore\n  - name: b\n    limit: 5\n    window: 60s\n    match: {{path_regex: '^/orders/(?P<order>[^/]+)$'}}\n    key: ['path:id']\n  - name: c\n    limit: 5\n    window: 60s\n    match: {{path: /x}}\n    key: ['path:id']\n"
    );
    let got: Vec<(u64, u64, String, String)> = errors(&yaml)
        .into_iter()
        .map(|e| (e.line, e.column, e.key, e.message))
        .collect();
    let has = |line: u64, key: &str, words: &str| {
        assert!(
            got.iter()
                .any(|(l, c, k, m)| *l == line && *c > 0 && k == key && m.contains(words)),
            "line {line} `{key}` saying `{words}` in {got:#?}"
        )
    };
    // An unknown word in a header condition (the loader names the field).
    has(8, "exakt", "did you mean `exact`?");
    has(9, "hosts", "an empty host matches nothing");
    has(9, "hosts", "`*.` alone names no domain");
    has(9, "hosts", "without their port");
    has(9, "hosts", "is not a host name");
    has(11, "query", "takes only one of");
    has(12, "query", "needs one of");
    has(24, "key", "the rule has none");
    has(13, "key", "needs a top-level `jwt:` section");
    has(13, "key", "names nothing after `cookie:`");
    has(14, "missing", "identity, anonymous, skip or reject");
    has(19, "key", "captures `path:order`");
}

/// A `jwt:` whose keys cannot be used never starts: the JWKS file that
/// cannot be read, or holds a key of no supported type, at its line.
#[test]
fn a_jwt_section_with_unusable_keys_is_refused_at_its_line() {
    let e = error("jwt:\n  jwks: /nonexistent/jwks.json\nrules: []\n");
    assert_eq!((e.line, e.key.as_str()), (2, "jwks"), "{e}");
    assert!(e.message.contains("cannot read"), "{e}");
    let dir = std::env::temp_dir().join(format!("rw-jwks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("jwks.json");
    std::fs::write(&file, r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0"}]}"#).unwrap();
    let e = error(&format!("jwt:\n  jwks: {}\nrules: []\n", file.display()));
    assert_eq!((e.line, e.key.as_str()), (2, "jwks"), "{e}");
    assert!(e.message.contains("not supported"), "{e}");
    let e = error("jwt: {issuer: x}\nrules: []\n");
    assert!(e.message.contains("give `jwks`"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Tiers, calendars, per-rule status and the overrides bound: each
/// mistake at its own line and column, all reported at once; a tier is
/// checked as a rule.
#[test]
fn tiers_and_calendars_are_checked_as_rules_every_error_at_its_place() {
    let yaml = concat!(
        "upstream: http://127.0.0.1:9000\n",                    // 1
        "overrides: {max: -1}\n",                               // 2
        "rules:\n",                                             // 3
        "  - name: api\n",                                      // 4
        "    window: 1m\n",                                     // 5
        "    tiers:\n",                                         // 6
        "      from: header:X-Plan\n",                          // 7
        "      default: gold\n",                                // 8
        "      values:\n",                                      // 9
        "        free: {limit: 0}\n",                           // 10
        "        pro: {limit: 5, burst: 9}\n",                  // 11
        "        vip: forever\n",                               // 12
        "  - name: monthly\n",                                  // 13
        "    algorithm: fixed_window\n",                        // 14
        "    limit: 5\n",                                       // 15
        "    calendar: {period: month, timezone: Mars/Base}\n", // 16
        "    status: 200\n",                                    // 17
        "  - name: daily\n",                                    // 18
        "    algorithm: gcra\n",                                // 19
        "    limit: 5\n",                                       // 20
        "    window: 1d\n",                                     // 21
        "    calendar: {period: fortnight}\n",                  // 22
    );
    let all = errors(yaml);
    let at = |line: u64, key: &str| {
        all.iter()
            .find(|e| e.line == line && e.key == key)
            .unwrap_or_else(|| panic!("no `{key}` error at line {line}: {all:#?}"))
    };
    assert!(at(12, "vip").message.contains("unlimited"), "{all:#?}");
    let all = errors(&yaml.replace("vip: forever", "vip: unlimited"));
    let at = |line: u64, key: &str| {
        all.iter()
            .find(|e| e.line == line && e.key == key)
            .unwrap_or_else(|| panic!("no `{key}` error at line {line}: {all:#?}"))
            .clone()
    };
    assert!(at(2, "overrides.max").message.contains("1000000"));
    assert!(at(8, "tiers.default").message.contains("free, pro, vip"));
    assert_eq!(at(10, "limit").column, 23);
    let burst = at(11, "burst");
    assert!(burst.message.contains("rule `api` tier `pro`"), "{burst}");
    assert!(
        at(16, "calendar.timezone")
            .message
            .contains("unknown time zone")
    );
    assert!(
        at(17, "status")
            .message
            .contains("not an HTTP error status")
    );
    assert!(
        at(22, "calendar.period")
            .message
            .contains("day, week, month or year")
    );
    assert!(all.len() >= 7, "{all:#?}");
    // A calendar takes no window, and only fixed_window.
    let e = errors(&format!(
        "{HEAD}  - {{name: d, algorithm: fixed_window, limit: 1, window: 1d, calendar: {{period: day}}}}\n"
    ));
    assert!(e[0].message.contains("leave `window` out"), "{e:#?}");
    let e = errors(&format!(
        "{HEAD}  - {{name: d, algorithm: gcra, limit: 1, calendar: {{period: day}}}}\n"
    ));
    assert!(e[0].message.contains("fixed_window"), "{e:#?}");
}

/// A tier's name goes into `RateLimit-Policy` as it is (`tier="pro"`), as a
/// rule's name does: one that could not be a header value (a quote) is
/// refused when the config loads, so that no header is checked per request.
#[test]
fn a_tier_name_that_is_no_header_text_is_refused() {
    let e = error(&format!(
        "{HEAD}  - name: r\n    window: 1m\n    tiers: {{from: 'header:X-Plan', default: free, values: {{free: {{limit: 1}}, 'pro\"x': {{limit: 5}}}}}}\n"
    ));
    assert!(e.message.contains("tier name"), "{e}");
    assert!(e.message.contains("pro\\\"x"), "{e}");
}
