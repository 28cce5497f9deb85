//! Every class of configuration error is reported with file, line, column and
//! key, and `ratewarden validate` / `serve` exit 2 on them.

use ratewarden_gateway::config::{self, ConfigError, Overrides};

fn error(yaml: &str) -> ConfigError {
    config::load(yaml, "bad.yaml", &Overrides::default())
        .expect_err("must be rejected")
        .first()
        .clone()
}

const HEAD: &str = "upstream: http://127.0.0.1:9000\nrules:\n";

#[test]
fn a_typo_is_caught_with_the_closest_key_suggested() {
    let e = error(&format!(
        "{HEAD}  - name: r\n    limt: 5\n    window: 60s\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (4, "limt"), "{e}");
    assert!(e.message.contains("did you mean `limit`?"), "{e}");
    assert!(e.to_string().starts_with("bad.yaml:4:"), "{e}");
    let e = error("upstrem: http://127.0.0.1:9000\n");
    assert!(e.message.contains("did you mean `upstream`?"), "{e}");
    assert_eq!(e.line, 1);
}

#[test]
fn an_unknown_algorithm_is_named_with_a_suggestion() {
    let e = error(&format!(
        "{HEAD}  - name: r\n    algorithm: token_buckit\n    limit: 5\n    window: 60s\n"
    ));
    assert_eq!(
        (e.line, e.column, e.key.as_str()),
        (4, 16, "algorithm"),
        "{e}"
    );
    assert!(e.message.contains("did you mean `token_bucket`?"), "{e}");
}

#[test]
fn a_negative_limit_is_refused_at_its_line() {
    let e = error(&format!(
        "{HEAD}  - name: r\n    window: 60s\n    limit: -5\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (5, "limit"), "{e}");
    assert!(e.message.contains(">= 1"), "{e}");
}

#[test]
fn a_bad_regex_is_refused_at_its_line() {
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 5\n    window: 60s\n    match:\n      path_regex: '^/api/(item\\d+$'\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (7, "path_regex"), "{e}");
    assert!(e.message.contains("invalid regex"), "{e}");
}

#[test]
fn a_bad_duration_is_refused_with_the_units() {
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 5\n    window: 60\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (5, "window"), "{e}");
    assert!(e.message.contains("ms, s, m, h, d"), "{e}");
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 5\n    window: 5 minutes\n"
    ));
    assert_eq!(e.line, 5, "{e}");
    let e = error("client_idle_timeout: 0s\nrules: []\n");
    assert_eq!((e.line, e.key.as_str()), (1, "client_idle_timeout"), "{e}");
    assert!(e.message.contains("longer than 0"), "{e}");
}

#[test]
fn a_duplicate_rule_name_is_refused_at_the_second() {
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 5\n    window: 1s\n  - name: r\n    limit: 6\n    window: 1s\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (6, "name"), "{e}");
    assert!(e.message.contains("duplicate rule name `r`"), "{e}");
}

#[test]
fn defaults_fill_what_is_not_written() {
    let c = config::load(
        "upstream: http://127.0.0.1:9000\n",
        "ok.yaml",
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(c.admin.as_ref().unwrap().0.to_string(), "127.0.0.1:9090");
    assert_eq!(c.status.as_u16(), 429);
    assert!(c.headers.legacy && c.headers.ietf);
    assert_eq!(c.client_idle_timeout, std::time::Duration::from_secs(60));
    let c = config::load(
        "upstream: http://127.0.0.1:9000\nadmin: null\n",
        "ok.yaml",
        &Overrides::default(),
    )
    .unwrap();
    assert!(c.admin.is_none(), "`admin: null` turns it off");
    let c = config::load(config::EMBEDDED, "<built-in>", &Overrides::default()).unwrap();
    assert_eq!(c.policy.rules[0].rule.limit(), 100);
}

#[test]
fn the_seed_002_file_loads_unchanged() {
    let yaml = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/seed-002-go-gateway.yaml"
    ))
    .unwrap();
    let c = config::load(&yaml, "seed.yaml", &Overrides::default()).unwrap();
    let names: Vec<&str> = c.policy.rules.iter().map(|r| r.rule.name()).collect();
    assert_eq!(names, ["client", "comment_write"]);
    assert_eq!(c.policy.rules[0].rule.limit(), 50);
    assert_eq!(c.policy.rules[1].rule.limit(), 5);
    let bare = ratewarden_tower::view::RequestView::bare;
    assert!(
        c.policy.rules[1]
            .matcher
            .matches(&bare(&http::Method::POST, "/api/item/42/comment"), None)
    );
    assert!(
        !c.policy.rules[1]
            .matcher
            .matches(&bare(&http::Method::GET, "/api/item/42/comment"), None)
    );
    assert!(
        !c.policy.rules[1]
            .matcher
            .matches(&bare(&http::Method::POST, "/api/item/x/comment"), None)
    );
    assert!(c.headers.legacy && !c.headers.ietf);
}

#[test]
fn validate_and_serve_exit_2_naming_file_line_and_key() {
    let dir = std::env::temp_dir().join(format!("rw-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        format!("{HEAD}  - name: r\n    limit: 5\n    window: 5x\n"),
    )
    .unwrap();
    let good = dir.join("good.yaml");
    std::fs::write(
        &good,
        format!("{HEAD}  - name: r\n    limit: 5\n    window: 5s\n"),
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_ratewarden");
    let out = std::process::Command::new(bin)
        .arg("validate")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.yaml:5:13: `window`: `5x`: unknown unit `x`"),
        "{err}"
    );
    let out = std::process::Command::new(bin)
        .args(["serve", "-c"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "an invalid config never starts");
    let out = std::process::Command::new(bin)
        .arg("validate")
        .arg(&good)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("valid (1 rule, upstream"),
        "one rule, not `1 rules`: {said}"
    );
    // A file with no rules is valid, and says it limits nothing.
    let empty = dir.join("empty.yaml");
    std::fs::write(&empty, "upstream: http://127.0.0.1:9000\n").unwrap();
    let out = std::process::Command::new(bin)
        .arg("validate")
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("valid (0 rules,"));
    let warned = String::from_utf8_lossy(&out.stderr);
    assert!(
        warned.contains("warning:") && warned.contains("no `rules:`"),
        "{warned}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn every_example_config_validates() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples");
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).unwrap();
            config::load(&text, &path.display().to_string(), &Overrides::default())
                .unwrap_or_else(|e| panic!("{e}"));
            n += 1;
        }
    }
    assert!(n >= 6, "{n} examples");
}

fn errors(yaml: &str) -> Vec<ConfigError> {
    config::load(yaml, "bad.yaml", &Overrides::default())
        .expect_err("must be rejected")
        .all()
        .to_vec()
}

/// Configs that used to validate and then do nothing: each is an error at
/// its key's line, and one run reports them all.
#[test]
fn configs_that_would_do_nothing_are_refused_all_at_once() {
    let yaml = "\
listen: 127.0.0.1:8080
upstream: http://127.0.0.1:9000
upstream_timeout: 0s
admin:
  listen: 127.0.0.1:8080
  token: \"\"
deny: [127.0.0.1/33]
store:
  type: redis
  url: redis://127.0.0.1:notaport
rules:
  - name: a
    limit: 5
    window: 1m
    match: {methods: [\"GE T\"], path: api/x}
  - name: b
    limit: 5
    window: 1m
    match: {path_prefix: /api//x/}
";
    let got: Vec<(u64, String)> = errors(yaml).into_iter().map(|e| (e.line, e.key)).collect();
    let want: Vec<(u64, String)> = [
        (3, "upstream_timeout"),
        (5, "admin.listen"),
        (6, "admin.token"),
        (7, "deny"),
        (10, "url"),
        (15, "methods"),
        (15, "path"),
        (19, "path_prefix"),
    ]
    .into_iter()
    .map(|(l, k)| (l, k.to_owned()))
    .collect();
    assert_eq!(got, want);
}

#[test]
fn allow_and_deny_entries_are_addresses_unless_identities_come_from_a_header() {
    let e = error("deny: [user-42]\n");
    assert_eq!((e.line, e.key.as_str()), (1, "deny"), "{e}");
    assert!(e.message.contains("addresses or CIDRs"), "{e}");
    let by_header = "identity: {from: header, header: X-User}\n";
    let c = config::load(
        &format!("{by_header}deny: [user-42, 10.0.0.0/8]\nallow: [2001:db8::/32]\n"),
        "ok.yaml",
        &Overrides::default(),
    )
    .unwrap();
    assert_eq!(c.policy.deny.len(), 2);
    // Even then, what is written like an address must be one.
    let e = error(&format!("{by_header}allow: [10.0.0.256]\n"));
    assert_eq!((e.line, e.key.as_str()), (2, "allow"), "{e}");
}

#[test]
fn type_errors_and_rule_errors_name_the_key_at_fault() {
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: abc\n    window: 1m\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (4, "limit"), "{e}");
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 5\n    window: 1m\n    algorithm: fixed_window\n    burst: 3\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (7, "burst"), "{e}");
    let e = error(&format!(
        "{HEAD}  - name: r\n    algorithm: gcra\n    limit: 5000\n    window: 1ms\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (5, "limit"), "{e}");
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 5\n    window: 1m\n    match: {{case_insensitive: true}}\n"
    ));
    assert_eq!(e.key, "case_insensitive", "{e}");
}

#[test]
fn validate_prints_every_error() {
    let dir = std::env::temp_dir().join(format!("rw-cfg-all-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.yaml");
    std::fs::write(
        &bad,
        "upstream_timeout: 0s\nclient_header_timeout: 0s\nrules: []\n",
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
        .arg("validate")
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.yaml:1:19: `upstream_timeout`"), "{err}");
    assert!(
        err.contains("bad.yaml:2:24: `client_header_timeout`"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

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
        &format!("tls: {{cert: {c}, key: {k}}}\nrules: []\n"),
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
        "tls: {cert: c.pem, key: c.key}\n",
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
        "store:\n  type: redis\n  sentinel:\n    master: mymaster\n    nodes: [redis://127.0.0.1:26379]\n    password: p\n",
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

#[test]
fn a_misspelt_key_part_gets_a_did_you_mean() {
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 5\n    window: 60s\n    key: [method, idenity]\n"
    ));
    assert_eq!((e.line, e.key.as_str()), (6, "key"), "{e}");
    assert!(e.message.contains("did you mean `identity`?"), "{e}");
    let e = error(&format!(
        "{HEAD}  - name: r\n    limit: 5\n    window: 60s\n    key: ['headr:X-Api-Key']\n"
    ));
    assert!(
        e.message.contains("did you mean `header:X-Api-Key`?"),
        "{e}"
    );
}

/// The startup line of a rule says what changes how it counts or refuses.
#[test]
fn the_banner_names_failures_min_interval_and_penalty() {
    let cfg = config::load(
        &format!(
            "{HEAD}  - name: coupon\n    algorithm: fixed_window\n    limit: 10\n    window: 5m\n    count: failures\n    penalty: 10m\n  - name: gap\n    algorithm: sliding_window_log\n    limit: 3\n    window: 1m\n    min_interval: 2s\n"
        ),
        "t.yaml",
        &Overrides::default(),
    )
    .unwrap();
    let b = ratewarden_gateway::gateway::banner(&cfg);
    assert!(
        b.rules[0].contains("count: failures") && b.rules[0].contains("penalty 600s"),
        "{:?}",
        b.rules
    );
    assert!(b.rules[1].contains("min_interval 2s"), "{:?}", b.rules);
}

/// `serve --help` says how a config is reloaded and how the gateway stops;
/// `simulate --help` lists every generator with its keys.
#[test]
fn the_help_says_reload_and_the_generators_keys() {
    let help = |cmd: &str| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
            .args([cmd, "--help"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let serve = help("serve");
    for want in ["SIGHUP", "checked twice a second", "SIGTERM"] {
        assert!(serve.contains(want), "{want} in {serve}");
    }
    let simulate = help("simulate");
    for want in [
        "steady:rate=N",
        "poisson:rate=N",
        "burst:size=N,every=D",
        "sawtooth:peak=N,period=D",
        "attack:rate=N",
        "clients=N",
        "seed=N",
    ] {
        assert!(simulate.contains(want), "{want} in {simulate}");
    }
}

/// A file of 21 mixed mistakes (unknown keys at every level, values of the
/// wrong type, bad durations, addresses, statuses, names) reports all 21
/// in one run, each at its line with its key, in words (no serde types),
/// with "did you mean" wherever a name was misspelt.
#[test]
fn every_mistake_in_a_file_is_reported_at_once() {
    let text = r#"upstrem: http://127.0.0.1:9000
workers: many
allow: [10.0.0.0/33]
deny: [192.168.1.300]
store:
  type: memory
  max_key: 10
identity:
  from: ip
  trusted_proxies: [not-a-net]
status: 999
headers: [legacy, ietf, mine]
rules:
  - name: a
    limt: 5
    window: 5 minutes
    penalty: 10min
  - name: b
    limit: lots
    window: 1m
  - name: c
    limit: 5
    window: 1m
    penalty: {duration: 1m, multiplyer: 2}
  - name: d
    limit: 5
    window: 1m
    penalty: 600
  - nme: e
    limit: 5
    window: 1m
  - name: f
    algorithm: token_buckit
    limit: 5
    window: 1m
  - name: g
    limit: 5
    window: 1m
    key: [method, idenity]
  - name: h
    limit: 5
    window: 1m
    shadow: maybe
  - name: a
    limit: 5
    window: 1m
  - name: i
    limit: 5
    window: 1m
    match: {path: api/x, methods: [G ET]}
"#;
    let errs = config::load(text, "bad.yaml", &Overrides::default())
        .expect_err("must be rejected")
        .all()
        .to_vec();
    let got: Vec<(u64, &str)> = errs.iter().map(|e| (e.line, e.key.as_str())).collect();
    let want: Vec<(u64, &str)> = vec![
        (1, "upstrem"),
        (2, "workers"),
        (3, "allow"),
        (4, "deny"),
        (7, "max_key"),
        (10, "trusted_proxies"),
        (11, "status"),
        (12, "headers"),
        (15, "limt"),
        (16, "window"),
        (17, "penalty"),
        (19, "limit"),
        (24, "penalty"),
        (28, "penalty"),
        (29, "nme"),
        (33, "algorithm"),
        (39, "key"),
        (43, "shadow"),
        (44, "name"),
        (50, "path"),
        (50, "methods"),
    ];
    let text: Vec<String> = errs.iter().map(ToString::to_string).collect();
    assert_eq!(got, want, "{text:#?}");
    let said = |line: u64| {
        errs.iter()
            .find(|e| e.line == line)
            .unwrap()
            .message
            .clone()
    };
    assert!(said(1).contains("did you mean `upstream`?"));
    assert_eq!(said(2), "expected a whole number, got `many`");
    assert!(said(7).contains("did you mean `max_keys`?"));
    assert_eq!(said(19), "expected a whole number, got `lots`");
    assert!(
        said(24).contains("unknown key `multiplyer`, did you mean `multiplier`?"),
        "{}",
        said(24)
    );
    assert!(
        said(28).contains("a duration needs a unit: `600s`?"),
        "{}",
        said(28)
    );
    assert!(said(29).contains("did you mean `name`?"));
    assert_eq!(said(43), "expected `true` or `false`, got `maybe`");
    for e in &errs {
        assert!(
            !e.message.contains("untagged enum") && !e.message.contains("invalid i64"),
            "serde's words: {e}"
        );
    }
}

/// `examples/gateway-reference.yaml` loads, and shows every key the
/// configuration accepts, at every level: the keys of each section are
/// read from the loader itself (an unknown key there is answered with the
/// valid ones); the untagged forms (a penalty's map, a route's group and
/// its checks) are listed by hand.
#[test]
fn the_reference_config_shows_every_key() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/gateway-reference.yaml"
    );
    let reference = std::fs::read_to_string(path).unwrap();
    config::load(&reference, "gateway-reference.yaml", &Overrides::default()).unwrap();
    let probes = [
        "zzzzqq: 1",
        "admin: {zzzzqq: 1}",
        "store: {type: redis, url: 'redis://x:1', zzzzqq: 1}",
        "store: {type: redis, url: 'rediss://x:1', tls: {zzzzqq: 1}}",
        "store: {type: redis, sentinel: {master: m, zzzzqq: 1}}",
        "identity: {zzzzqq: 1}",
        "tls: {zzzzqq: 1}",
        "upstream_tls: {zzzzqq: 1}",
        "log: {zzzzqq: 1}",
        "access_log: {zzzzqq: 1}",
        "rules: [{name: r, limit: 1, window: 1s, zzzzqq: 1}]",
        "rules: [{name: r, limit: 1, window: 1s, match: {zzzzqq: 1}}]",
        "rules: [{name: r, limit: 1, window: 1s, match: {headers: [{name: a, zzzzqq: 1}]}}]",
        "jwt: {zzzzqq: 1}",
        "jwt: {from: {zzzzqq: 1}}",
        "rules: [{name: r, limit: 1, window: 1s, distribution: {zzzzqq: 1}}]",
        "rules: [{name: r, limit: 1, algorithm: fixed_window, calendar: {period: day, zzzzqq: 1}}]",
        "rules: [{name: r, window: 1s, tiers: {from: 'header:X', default: a, zzzzqq: 1, values: {a: {limit: 1}}}}]",
        "rules: [{name: r, window: 1s, tiers: {from: 'header:X', default: a, values: {a: {limit: 1, zzzzqq: 1}}}}]",
        "overrides: {zzzzqq: 1}",
        "routes: [{name: a, upstream: 'http://x:1', zzzzqq: 1}]",
        "rls: {listen: '127.0.0.1:1', zzzzqq: 1}",
        "rls: {listen: '127.0.0.1:1', headers: [envoy], header_names: {zzzzqq: 1}}",
        "authz: {listen: '127.0.0.1:1', zzzzqq: 1}",
        "request_headers: {zzzzqq: 1}",
    ];
    let mut keys: Vec<String> = [
        "duration",
        "multiplier",
        "max",
        "memory", // penalty: {...}
        "servers",
        "balance",
        "health",
        "passive",
        "active", // a route's group
        "failures",
        "eject_for",
        "interval",
        "timeout",
    ]
    .map(str::to_owned)
    .to_vec();
    for probe in probes {
        let errs = config::load(probe, "p.yaml", &Overrides::default()).expect_err(probe);
        let e = errs
            .all()
            .iter()
            .find(|e| e.key == "zzzzqq")
            .unwrap_or_else(|| panic!("{probe}: {errs}"));
        let listed = e
            .message
            .split("valid keys here: ")
            .nth(1)
            .unwrap_or_else(|| panic!("{probe}: {e}"));
        keys.extend(listed.split(", ").map(str::to_owned));
    }
    let shown = |k: &str| {
        reference.lines().any(|l| {
            let l = l.trim_start_matches([' ', '#', '-']);
            l.starts_with(&format!("{k}:"))
                || l.contains(&format!("{{{k}:"))
                || l.contains(&format!(", {k}:"))
                || l.contains(&format!(" {k}:"))
        })
    };
    let missing: Vec<&String> = keys.iter().filter(|k| !shown(k)).collect();
    assert!(missing.is_empty(), "not in the reference: {missing:?}");
}

/// A key indented one space short is reported at its own line as an
/// indentation error, not as its key missing from the block above it; a
/// key really missing is still reported as missing (the reference file, a
/// rule's `limit` left out, has no line out of place).
#[test]
fn a_line_indented_one_space_short_is_named_at_its_line() {
    let e = error(&format!("{HEAD}  - name: r\n    window: 1m\n   limit: 5\n"));
    assert_eq!((e.line, e.key.as_str()), (5, "limit"), "{e}");
    assert!(
        e.message
            .contains("indented 3 spaces, but the keys of its block are at 4"),
        "{e}"
    );
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/gateway-reference.yaml"
    );
    let reference = std::fs::read_to_string(path).unwrap();
    let without = reference.replacen("    limit: 50                     # required\n", "", 1);
    assert_ne!(without, reference);
    let e = error(&without);
    assert_eq!(e.message, "`limit` is required here", "{e}");
}

/// `validate` prints what the gateway will do with a file: each rule as
/// read, and for the seed-002 gateway's format, that it was translated.
#[test]
fn validate_prints_the_rules_as_read_and_the_seed_002_translation() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/seed-002-go-gateway.yaml"
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ratewarden"))
        .args(["validate", path])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("read as the seed-002 gateway's format, translated to:"),
        "{said}"
    );
    assert!(
        said.contains("rule client: sliding_window_counter 50 per 60s per [identity], every path"),
        "{said}"
    );
    assert!(said.contains("rule comment_write:"), "{said}");
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
