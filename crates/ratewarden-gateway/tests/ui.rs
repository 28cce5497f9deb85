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
  - name: tokens
    match: {path_prefix: /v1/}
    limit: 1000
    window: 1m
    cost: {from: llm}
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
    panic!("no chromium: `apt-get install chromium` (./test installs it)");
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
            send(gw.listen(), "GET", "/", &[("x-user-id", user)], "").await;
        }
    }
    for _ in 0..2 {
        send(
            gw.listen(),
            "GET",
            "/search?q=1",
            &[("x-user-id", "carol")],
            "",
        )
        .await;
    }
    // dave's LLM calls: the test upstream's answers carry no usage, so the
    // first call's reservation (the body's length plus 800) stays charged,
    // and the rest are refused near the limit.
    let llm = r#"{"model":"m","max_tokens":800}"#;
    for _ in 0..24 {
        send(
            gw.listen(),
            "POST",
            "/v1/chat/completions",
            &[("x-user-id", "dave"), ("content-type", "application/json")],
            llm,
        )
        .await;
    }
    let rules = json(admin, "/v1/rules").await;
    let keys = json(admin, "/v1/keys?rule=per-client&limit=10").await;
    let tokens = json(admin, "/v1/keys?rule=tokens&limit=10").await;
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
    // dave's calls refused by `tokens` charged `per-client` nothing (the
    // decision is all-or-nothing): its yeses in them are not admissions.
    assert_eq!(per_client["allowed"], 3 + 2 + 3 + 2 + 1);
    assert_eq!(per_client["not_charged"], 23);
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
        assert_eq!(row[3], format!("{} requests", k["charged"]), "{row:?}");
        assert_eq!(row[4], k["remaining"].to_string());
        assert_eq!(row[5], k["limit"].to_string());
        assert!(row[8].contains("<button>clear</button>"), "{row:?}");
    }
    // A rule charged by an LLM's usage: the tokens charged per key.
    let dave = &tokens["keys"][0];
    assert_eq!(dave["key"], "dave", "{tokens}");
    assert_eq!(dave["charged"], llm.len() + 800, "{tokens}");
    let row = cells(&dom, "keys", "data-rule=\"tokens\" data-key=\"dave\"");
    assert_eq!(row[3], format!("{} tokens", llm.len() + 800), "{row:?}");

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
    // A browser holding the Basic credentials sends them with any request
    // to this listener: a change asked from another site (or another port
    // of this host: same-site) is refused; from the page itself, or from a
    // client that is not a browser, it goes through.
    let check = r#"{"rule":"per-client","key":"victim"}"#;
    let own = format!("http://{admin}");
    for (extra, want) in [
        (vec![("sec-fetch-site", "cross-site")], 403),
        (vec![("sec-fetch-site", "same-site")], 403),
        (vec![("origin", "http://evil.example")], 403),
        (
            vec![("origin", own.as_str()), ("sec-fetch-site", "same-origin")],
            200,
        ),
        (vec![], 200),
    ] {
        let mut headers = vec![
            ("authorization", "Basic YW55OnMzY3JldA=="),
            ("content-type", "application/json"),
        ];
        headers.extend(extra.iter().copied());
        let r = send(admin, "POST", "/v1/check", &headers, check).await;
        assert_eq!(r.status, want, "{extra:?}: {}", r.body);
    }
    // Reading is not guarded.
    let r = send(
        admin,
        "GET",
        "/v1/rules",
        &[
            ("authorization", "Basic YW55OnMzY3JldA=="),
            ("sec-fetch-site", "cross-site"),
        ],
        "",
    )
    .await;
    assert_eq!(r.status, 200);
    gw.shutdown().await;
}

/// Just enough of the Chrome DevTools protocol to click a button: a
/// WebSocket client (RFC 6455: masked text frames out, unmasked in) on a
/// page target of a headless Chromium started with a debugging port.
struct Devtools {
    browser: tokio::process::Child,
    ws: tokio::net::TcpStream,
    next: u64,
    /// The browser's profile directory, removed when done.
    _profile: support::Scratch,
}

impl Devtools {
    async fn start() -> Self {
        use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
        let profile = support::scratch_dir("rw-ui-cdp");
        let mut browser = tokio::process::Command::new(chromium())
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--remote-debugging-port=0",
                &format!("--user-data-dir={}", profile.display()),
                "about:blank",
            ])
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        // "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID"
        let mut lines = BufReader::new(browser.stderr.take().unwrap()).lines();
        let port: u16 = loop {
            let line = tokio::time::timeout(std::time::Duration::from_secs(30), lines.next_line())
                .await
                .expect("chromium's debugging port within 30 s")
                .unwrap()
                .expect("chromium ended before its debugging port");
            if let Some(rest) = line.split("ws://127.0.0.1:").nth(1) {
                break rest.split('/').next().unwrap().parse().unwrap();
            }
        };
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        // The page target's socket.
        let list = send(
            SocketAddr::from(([127, 0, 0, 1], port)),
            "GET",
            "/json/list",
            &[],
            "",
        )
        .await
        .body;
        let targets: serde_json::Value = serde_json::from_str(&list).unwrap();
        let url = targets
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .expect("a page target")["webSocketDebuggerUrl"]
            .as_str()
            .unwrap()
            .to_owned();
        let path = &url[url.find("/devtools/").unwrap()..];
        let mut ws = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .unwrap();
        ws.write_all(
            format!(
                "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n\
                 Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
                 Sec-WebSocket-Version: 13\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(ws.read_u8().await.unwrap());
        }
        assert!(
            head.starts_with(b"HTTP/1.1 101"),
            "{}",
            String::from_utf8_lossy(&head)
        );
        Self {
            browser,
            ws,
            next: 0,
            _profile: profile,
        }
    }

    /// Sends one command and returns its result (events are skipped).
    async fn call(&mut self, method: &str, params: serde_json::Value) -> serde_json::Value {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        self.next += 1;
        let id = self.next;
        let text = serde_json::json!({"id": id, "method": method, "params": params}).to_string();
        let mut frame = vec![0x81u8];
        match text.len() {
            n if n < 126 => frame.push(0x80 | n as u8),
            n if n < 65_536 => {
                frame.push(0x80 | 126);
                frame.extend_from_slice(&(n as u16).to_be_bytes());
            }
            n => {
                frame.push(0x80 | 127);
                frame.extend_from_slice(&(n as u64).to_be_bytes());
            }
        }
        let mask = [0x12, 0x34, 0x56, 0x78];
        frame.extend_from_slice(&mask);
        frame.extend(text.bytes().enumerate().map(|(i, b)| b ^ mask[i % 4]));
        self.ws.write_all(&frame).await.unwrap();
        loop {
            let (b0, b1) = (
                self.ws.read_u8().await.unwrap(),
                self.ws.read_u8().await.unwrap(),
            );
            let len = match b1 & 0x7f {
                126 => u64::from(self.ws.read_u16().await.unwrap()),
                127 => self.ws.read_u64().await.unwrap(),
                n => u64::from(n),
            };
            let mut payload = vec![0; len as usize];
            self.ws.read_exact(&mut payload).await.unwrap();
            if b0 & 0x0f != 1 {
                continue;
            }
            let v: serde_json::Value = serde_json::from_slice(&payload).unwrap();
            if v["id"] == id {
                assert!(v.get("error").is_none(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// Evaluates `js` in the page; its value.
    async fn eval(&mut self, js: &str) -> serde_json::Value {
        let r = self
            .call(
                "Runtime.evaluate",
                serde_json::json!({"expression": js, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        r["result"]["value"].clone()
    }

    /// Waits (up to 10 s) until `js` is true in the page.
    async fn until(&mut self, js: &str) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while self.eval(js).await != serde_json::Value::Bool(true) {
            assert!(std::time::Instant::now() < deadline, "never true: {js}");
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Devtools {
    fn drop(&mut self) {
        let _ = self.browser.start_kill();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pages_clear_button_clears_the_key_and_its_ban() {
    let clock = ratewarden::clock::ManualClock::new(support::now());
    let gw = gateway(YAML, "echo", Some(clock)).await;
    let admin = gw.admin.unwrap();
    for _ in 0..40 {
        send(gw.listen(), "GET", "/", &[("x-user-id", "alice")], "").await;
    }
    let banned = |b: &serde_json::Value| {
        b["bans"]
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["key"] == "alice")
    };
    assert!(banned(&json(admin, "/v1/bans").await));
    let mut page = Devtools::start().await;
    page.call(
        "Page.navigate",
        serde_json::json!({"url": format!("http://{admin}/ui")}),
    )
    .await;
    let row = "#keys tr[data-rule=\"per-client\"][data-key=\"alice\"]";
    page.until(&format!("document.querySelector('{row} button') !== null"))
        .await;
    page.eval(&format!("document.querySelector('{row} button').click()"))
        .await;
    // Cleared in the store, the ban gone, and the page shows it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let state = json(admin, "/v1/keys/per-client/alice").await;
        if state["exists"] == false {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never cleared: {state}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!banned(&json(admin, "/v1/bans").await));
    assert_eq!(
        send(gw.listen(), "GET", "/", &[("x-user-id", "alice")], "")
            .await
            .status,
        200,
        "alice is let in again"
    );
    page.until("document.querySelector('#bans tr[data-key=\"alice\"]') === null")
        .await;
    gw.shutdown().await;
}

/// The page opened with the token in its URL (`http://any:TOKEN@host/ui`,
/// as a bookmark would hold it) loads its data: its API calls go to the
/// page's origin, not to its URL (which holds credentials, and a fetch
/// relative to it is refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_opened_with_the_token_in_its_url_loads_its_data() {
    let yaml = format!("admin: {{token: s3cret}}\n{YAML}");
    let gw = gateway(&yaml, "echo", None).await;
    let admin = gw.admin.unwrap();
    send(gw.listen(), "GET", "/", &[("x-user-id", "alice")], "").await;
    let dom = browse(&format!("http://any:s3cret@{admin}/ui"), &["--dump-dom"]).await;
    assert!(
        dom.contains("data-loaded=\""),
        "the script never finished a refresh: {dom}"
    );
    let row = cells(&dom, "rates", "data-rule=\"per-client\"");
    assert_eq!(row[3], "1", "{row:?}");
    gw.shutdown().await;
}

/// The page lists the overrides set, and its remove button removes one
/// (a same-origin DELETE, which the cross-site check lets through).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_lists_overrides_and_removes_one() {
    let gw = gateway(YAML, "echo", None).await;
    let admin = gw.admin.unwrap();
    let put = send(
        admin,
        "PUT",
        "/v1/overrides/per-client/alice",
        &[("content-type", "application/json")],
        r#"{"limit": 500, "note": "partner"}"#,
    )
    .await;
    assert_eq!(put.status, 200, "{}", put.body);
    let mut page = Devtools::start().await;
    page.call(
        "Page.navigate",
        serde_json::json!({"url": format!("http://{admin}/ui")}),
    )
    .await;
    let row = "#overrides tr[data-rule=\"per-client\"][data-key=\"alice\"]";
    page.until(&format!(
        "document.querySelector('{row}') !== null && document.querySelector('{row}').textContent.includes('partner')"
    ))
    .await;
    page.eval(&format!("document.querySelector('{row} button').click()"))
        .await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while json(admin, "/v1/overrides").await["count"] != 0 {
        assert!(std::time::Instant::now() < deadline, "never removed");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    page.until(&format!("document.querySelector('{row}') === null"))
        .await;
    gw.shutdown().await;
}
