//! The files operators deploy with: the systemd unit verifies, the alert
//! rules check and pass their unit tests, every metric the Grafana
//! dashboard and the alerts name is exported by a live gateway, the
//! container's config loads, and the container's healthcheck works.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e} (apt-get install systemd prometheus)"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn the_systemd_unit_verifies_without_a_warning() {
    // The unit as shipped, pointing at this build's binary (verify checks
    // that ExecStart exists).
    let unit = std::fs::read_to_string(root().join("deploy/ratewarden.service")).unwrap();
    let unit = unit.replace(
        "/usr/local/bin/ratewarden",
        env!("CARGO_BIN_EXE_ratewarden"),
    );
    let dir = support::scratch_dir("rw-unit");
    let path = dir.join("ratewarden.service");
    std::fs::write(&path, &unit).unwrap();
    let (ok, text) = run(Command::new("systemd-analyze").arg("verify").arg(&path));
    assert!(ok && text.trim().is_empty(), "{text}");
    // A misspelt directive is only a warning to systemd: it must show here.
    std::fs::write(&path, unit.replace("NoNewPrivileges=", "NoNewPrivilegez=")).unwrap();
    let (_, text) = run(Command::new("systemd-analyze").arg("verify").arg(&path));
    assert!(text.contains("Unknown key"), "{text}");
    // Hardened: systemd's own exposure score stays low.
    std::fs::write(&path, &unit).unwrap();
    let (_, text) = run(Command::new("systemd-analyze")
        .args(["security", "--offline=yes"])
        .arg(&path));
    let score: f64 = text
        .split("Overall exposure level for ratewarden.service: ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no score in {text}"));
    assert!(score <= 2.0, "exposure {score}: {text}");
}

#[test]
fn the_alert_rules_check_and_pass_their_unit_tests() {
    let deploy = root().join("deploy");
    let (ok, text) = run(Command::new("promtool")
        .args(["check", "rules", "prometheus-alerts.yaml"])
        .current_dir(&deploy));
    assert!(ok, "{text}");
    let (ok, text) = run(Command::new("promtool")
        .args(["test", "rules", "prometheus-alerts.test.yaml"])
        .current_dir(&deploy));
    assert!(ok, "{text}");
}

/// Every `ratewarden_...` name in `text`.
fn metric_names(text: &str) -> Vec<String> {
    let mut names = vec![];
    let mut rest = text;
    while let Some(at) = rest.find("ratewarden_") {
        let tail = &rest[at..];
        let end = tail
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(tail.len());
        names.push(tail[..end].to_owned());
        rest = &tail[end..];
    }
    names.sort();
    names.dedup();
    names
}

#[tokio::test]
async fn every_metric_the_dashboard_and_the_alerts_name_is_exported() {
    let dashboard = std::fs::read_to_string(root().join("deploy/grafana-dashboard.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
    let mut exprs = String::new();
    for p in dash["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().unwrap() {
            exprs.push_str(t["expr"].as_str().unwrap());
            exprs.push('\n');
        }
    }
    exprs.push_str(&std::fs::read_to_string(root().join("deploy/prometheus-alerts.yaml")).unwrap());
    let wanted = metric_names(&exprs);
    assert!(wanted.len() >= 8, "{wanted:?}");
    // A live gateway that allowed and rejected, with a token (the metrics
    // need none by default).
    let gw = support::gateway(
        "admin: {token: secret}\nrules:\n  - {name: one, limit: 1, window: 1h}\n",
        "echo",
        None,
    )
    .await;
    support::send(gw.listen(), "GET", "/", &[], "").await;
    support::send(gw.listen(), "GET", "/", &[], "").await;
    let scrape = support::send(gw.admin.unwrap(), "GET", "/metrics", &[], "").await;
    assert_eq!(scrape.status, 200);
    for name in wanted {
        assert!(
            scrape.body.contains(&format!("\n{name}"))
                || scrape.body.contains(&format!("\n{name}{{")),
            "`{name}` is not exported:\n{}",
            scrape.body
        );
    }
    gw.shutdown().await;
}

#[test]
fn the_containers_config_loads_and_its_healthcheck_works() {
    let text = std::fs::read_to_string(root().join("deploy/docker.yaml")).unwrap();
    let cfg = ratewarden_gateway::config::load(&text, "docker.yaml", &Default::default()).unwrap();
    assert_eq!(
        cfg.listen.map(|l| l.to_string()).as_deref(),
        Some("0.0.0.0:8080")
    );
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile")).unwrap();
    for needed in [
        "USER 10001",
        "HEALTHCHECK",
        "ratewarden\", \"healthcheck",
        "COPY deploy/docker.yaml",
    ] {
        assert!(dockerfile.contains(needed), "Dockerfile: {needed}");
    }
    // `ratewarden healthcheck ADDR`: 0 when /healthz answers 200, 1 when not.
    let bin = support::binary("rules: []\n", "echo");
    let check = |addr: String| {
        let out = Command::new(env!("CARGO_BIN_EXE_ratewarden"))
            .args(["healthcheck", &addr])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    assert_eq!(check(bin.admin.to_string()), (Some(0), String::new()));
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = closed.local_addr().unwrap().to_string();
    drop(closed);
    let (code, why) = check(addr.clone());
    assert_eq!(code, Some(1));
    // It says why, on stderr.
    assert!(
        why.contains("unhealthy: cannot connect to") && why.contains(&addr),
        "{why}"
    );
}
