//! `ratewarden validate` and `serve` on bad files: exit 2, every error printed,
//! the rules as read, and what `--help` says.

use super::*;

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
