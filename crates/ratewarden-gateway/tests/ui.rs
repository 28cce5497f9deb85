//! `/ui`, the live page, in a real browser: headless Chromium (Debian's
//! `chromium`; `.ci/run` installs it) loads the page from a running
//! gateway, its script reads the admin API, and the DOM it leaves must
//! show the numbers the JSON API returns. A screenshot is saved as
//! `ui.png` in Cargo's target tmp dir.

mod support;

use std::net::SocketAddr;
use std::path::Path;

use support::{Upstream, gateway, send};

const YAML: &str = "
identity: {from: header, header: X-User-Id}
rules:
  - name: per-client
    algorithm: fixed_window
    limit: 3
    window: 1m
    penalty: 10m
  - name: search
    match: {path_prefix: /search}
    algorithm: gcra
    limit: 100
    window: 1m
";

/// The browser. Missing, the test fails and says how to get it: a test
/// that passes without its browser would show nothing.
fn chromium() -> &'static str {
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        if std::process::Command::new(name)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return name;
        }
    }
    panic!("no chromium: `apt-get install chromium` (bash .ci/run installs it)");
}

/// Runs headless Chromium on `url` with `args`, giving the page's script
/// up to 5 s of (virtual) time; its standard output.
async fn browse(url: &str, args: &[&str]) -> String {
    let out = tokio::process::Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--hide-scrollbars",
            "--virtual-time-budget=5000",
        ])
        .args(args)
        .arg(url)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(std::time::Duration::from_secs(60), out)
        .await
        .expect("chromium within 60 s")
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The cells' texts of the row of `tbody#id` whose attributes include
/// `attrs` (as the page writes them).
fn cells(dom: &str, id: &str, attrs: &str) -> Vec<String> {
    let body = dom
        .split(&format!("<tbody id=\"{id}\">"))
        .nth(1)
        .unwrap_or_else(|| panic!("no tbody#{id} in {dom}"));
    let body = &body[..body.find("</tbody>").unwrap()];
    let row = body
        .split("<tr ")
        .find(|r| r.starts_with(attrs))
        .unwrap_or_else(|| panic!("no row {attrs} in #{id}: {body}"));
    let row = &row[..row.find("</tr>").unwrap_or(row.len())];
    row.split("<td>")
        .skip(1)
        .map(|c| c[..c.find("</td>").unwrap_or(c.len())].to_owned())
        .collect()
}

async fn json(admin: SocketAddr, path: &str) -> serde_json::Value {
    serde_json::from_str(&send(admin, "GET", path, &[], "").await.body).unwrap()
}

fn png_size(path: &Path) -> (u32, u32) {
    let file = std::fs::File::open(path).unwrap();
    let info = png::Decoder::new(std::io::BufReader::new(file))
        .read_info()
        .unwrap();
    let i = info.info();
    (i.width, i.height)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_shows_what_the_json_api_returns_in_a_real_browser() {
    let up = Upstream::start().await;
    // A clock that stands still: the window cannot roll over between the
    // API's answers and the page's.
    let clock = ratewarden::clock::ManualClock::new(support::now());
    let gw = gateway(YAML, &up.url(), Some(clock)).await;
    let admin = gw.admin.unwrap();
    // alice goes over (and is banned), bob stays under, mallory's id is
    // markup; some searches.
    for (user, n) in [("alice", 40), ("bob", 2), ("<b>mallory</b>", 40)] {
        for _ in 0..n {
            send(gw.listen, "GET", "/", &[("x-user-id", user)], "").await;
        }
    }
    for _ in 0..2 {
        send(
            gw.listen,
            "GET",
            "/search?q=1",
            &[("x-user-id", "carol")],
            "",
        )
        .await;
    }
    let rules = json(admin, "/v1/rules").await;
    let keys = json(admin, "/v1/keys?rule=per-client&limit=10").await;
    let bans = json(admin, "/v1/bans?limit=50").await;

    let dom = browse(&format!("http://{admin}/ui"), &["--dump-dom"]).await;
    assert!(
        dom.contains("data-loaded=\""),
        "the script never finished a refresh: {dom}"
    );

    // Decisions per rule: the totals are /v1/rules's.
    for rule in rules["rules"].as_array().unwrap() {
        let name = rule["name"].as_str().unwrap();
        let row = cells(&dom, "rates", &format!("data-rule=\"{name}\""));
        assert_eq!(row[0], name);
        assert_eq!(
            row[3],
            rule["decisions"]["allowed"].to_string(),
            "{name}: {row:?}"
        );
        assert_eq!(
            row[4],
            rule["decisions"]["rejected"].to_string(),
            "{name}: {row:?}"
        );
    }
    let per_client = &rules["rules"][0]["decisions"];
    assert_eq!(per_client["allowed"], 3 + 2 + 3 + 2);
    assert_eq!(per_client["rejected"], 37 + 37);

    // The top keys: each one the API lists, with its share and limit.
    let listed = keys["keys"].as_array().unwrap();
    assert!(listed.iter().any(|k| k["key"] == "alice"), "{keys}");
    for k in listed {
        let key = k["key"].as_str().unwrap();
        // Attribute values are escaped by the browser's serialiser.
        let attr = key
            .replace('&', "&amp;")
            .replace('"', "&quot;")
            .replace('<', "&lt;")
            .replace('>', "&gt;");
        let row = cells(
            &dom,
            "keys",
            &format!("data-rule=\"per-client\" data-key=\"{attr}\""),
        );
        let used = (k["used"].as_f64().unwrap() * 100.0).round();
        assert_eq!(row[2], format!("{used}%"), "{row:?}");
        assert_eq!(row[3], k["remaining"].to_string());
        assert_eq!(row[4], k["limit"].to_string());
        assert!(row[7].contains("<button>clear</button>"), "{row:?}");
    }

    // The bans: alice's and mallory's, with the time left the API gave
    // (counting down: the page's value, to a tenth, is at most the API's,
    // read before).
    let listed = bans["bans"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{bans}");
    let row = cells(&dom, "bans", "data-rule=\"per-client\" data-key=\"alice\"");
    let (page_left, api_left): (f64, f64) = (
        row[2].parse().unwrap(),
        listed.iter().find(|b| b["key"] == "alice").unwrap()["ban_left"]
            .as_f64()
            .unwrap(),
    );
    assert!(
        page_left <= api_left + 0.05 && page_left > api_left - 30.0,
        "{page_left} vs {api_left}"
    );

    // Markup in a key stays text.
    assert!(dom.contains("&lt;b&gt;mallory&lt;/b&gt;"), "{dom}");
    assert!(
        !dom.contains("<b>mallory</b>"),
        "a key was rendered as HTML"
    );

    // The loaded configuration, rendered by the server.
    let row = cells(&dom, "rules", "data-rule=\"search\"");
    assert!(row[1].contains("search: gcra 100 per 60s"), "{row:?}");

    // And a screenshot, kept for whoever wants to look.
    let shot = Path::new(env!("CARGO_TARGET_TMPDIR")).join("ui.png");
    let _ = std::fs::remove_file(&shot);
    browse(
        &format!("http://{admin}/ui"),
        &[
            "--window-size=1280,1000",
            &format!("--screenshot={}", shot.display()),
        ],
    )
    .await;
    assert_eq!(png_size(&shot), (1280, 1000));
    gw.shutdown().await;
}

#[tokio::test]
async fn the_page_and_its_api_calls_take_the_token_as_a_basic_password() {
    let yaml = format!("admin: {{token: s3cret}}\n{YAML}");
    let gw = gateway(&yaml, "echo", None).await;
    let admin = gw.admin.unwrap();
    // Without it: a browser is asked for Basic credentials on the page...
    let r = send(admin, "GET", "/ui", &[], "").await;
    assert_eq!(r.status, 401);
    assert!(
        r.header("www-authenticate")
            .unwrap()
            .starts_with("Basic realm=")
    );
    // ...an API client for a bearer token.
    let r = send(admin, "GET", "/v1/rules", &[], "").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.header("www-authenticate"), Some("Bearer"));
    // "any:s3cret", "any:wrong".
    let good = [("authorization", "Basic YW55OnMzY3JldA==")];
    let bad = [("authorization", "Basic YW55Ondyb25n")];
    assert_eq!(send(admin, "GET", "/ui", &bad, "").await.status, 401);
    let r = send(admin, "GET", "/ui", &good, "").await;
    assert_eq!(r.status, 200);
    assert!(r.body.contains("Loaded configuration"));
    assert!(
        r.header("content-security-policy")
            .unwrap()
            .contains("script-src 'self'")
    );
    assert_eq!(r.header("x-frame-options"), Some("DENY"));
    let r = send(admin, "GET", "/ui/app.js", &good, "").await;
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .unwrap()
            .starts_with("text/javascript")
    );
    assert_eq!(send(admin, "GET", "/v1/rules", &good, "").await.status, 200);
    assert_eq!(
        send(
            admin,
            "GET",
            "/v1/rules",
            &[("authorization", "Bearer s3cret")],
            ""
        )
        .await
        .status,
        200
    );
    gw.shutdown().await;
}
