//! Every class of configuration error is reported with file, line, column and
//! key, and `ratewarden validate` / `serve` exit 2 on them.

mod cli;
mod sections;

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
    assert_eq!(
        c.listen.map(|l| l.to_string()).as_deref(),
        Some("127.0.0.1:8080")
    );
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
        &format!(
            "upstream: echo\n{by_header}deny: [user-42, 10.0.0.0/8]\nallow: [2001:db8::/32]\n"
        ),
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

/// A misspelt key and a missing one in the same rule are both reported,
/// in block style and in flow style (`{...}` on one line, where the mend of
/// the misspelt key once hid the missing one).
#[test]
fn a_misspelt_key_and_a_missing_one_are_both_reported_in_either_style() {
    for rule in [
        "  - limitt: 5\n    window: 60s\n",
        "  - {limitt: 5, window: 60s}\n",
    ] {
        let got: Vec<String> = errors(&format!("{HEAD}{rule}"))
            .iter()
            .map(|e| format!("{} {}", e.key, e.message))
            .collect();
        assert_eq!(
            got,
            [
                "limitt unknown key `limitt`; did you mean `limit`?",
                "name `name` is required here"
            ],
            "{rule}"
        );
    }
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
        "rules: [{name: r, limit: 1, window: 1s, cost: {from: header, header: x, zzzzqq: 1}}]",
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
