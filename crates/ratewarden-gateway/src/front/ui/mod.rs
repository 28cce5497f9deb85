//! `/ui`: a live page on the admin listener. Rendered here with what does
//! not change while it is open (listeners, store, the rules as loaded);
//! its script (`/ui/app.js`) reads the admin API's JSON every 2 s for
//! what does: each rule's decisions/s, the top limited keys (with a
//! button that clears one through `DELETE /v1/keys/...`) and the bans.
//! No build step, nothing fetched from outside the admin listener.

use std::fmt::Write as _;

use crate::gateway::Live;

/// The script, served as `/ui/app.js`.
pub(crate) const SCRIPT: &str = include_str!("app.js");

/// The page's Content-Security-Policy: its own script and nothing else.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; connect-src 'self'; style-src 'unsafe-inline'; img-src 'self'";

/// `s` as HTML text.
fn esc(out: &mut String, s: &str) {
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
}

/// The page.
pub(crate) fn page(live: &Live) -> String {
    let c = &live.config;
    let banner = crate::gateway::banner(c);
    let mut h = String::with_capacity(8192);
    h.push_str(concat!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<title>ratewarden</title><meta name=\"viewport\" content=\"width=device-width\">",
        "<style>body{font:14px system-ui,sans-serif;margin:1.5em;color:#222}",
        "table{border-collapse:collapse;margin-bottom:1.5em}",
        "td,th{border-bottom:1px solid #ddd;padding:.3em .8em;text-align:left}",
        "th{background:#f4f4f4}h2{margin-top:1.5em}#status{color:#666}",
        "code{background:#f4f4f4;padding:0 .3em}</style></head><body>",
        "<h1>ratewarden</h1><p id=\"status\">loading…</p>",
    ));
    h.push_str("<h2>Decisions per second</h2><table><thead><tr><th>rule</th><th>admitted/s</th><th>rejected/s</th><th>admitted</th><th>rejected</th><th>last 5 minutes (<span style=\"color:#1f77b4\">admitted</span>, <span style=\"color:#d62728\">rejected</span>)</th></tr></thead><tbody id=\"rates\"></tbody></table>");
    h.push_str("<h2>Top limited keys</h2><table><thead><tr><th>rule</th><th>key</th><th>used</th><th>charged</th><th>remaining</th><th>limit</th><th>reset (s)</th><th>ban left (s)</th><th></th></tr></thead><tbody id=\"keys\"></tbody></table>");
    h.push_str("<h2>Active bans</h2><table><thead><tr><th>rule</th><th>key</th><th>time left (s)</th></tr></thead><tbody id=\"bans\"></tbody></table>");
    h.push_str("<h2>Overrides</h2><table><thead><tr><th>rule</th><th>key</th><th>limit</th><th>window (s)</th><th>expires in (s)</th><th>note</th><th></th></tr></thead><tbody id=\"overrides\"></tbody></table>");
    h.push_str("<h2>Loaded configuration</h2><table id=\"config\"><tbody>");
    let mut kv = |k: &str, v: &str| {
        h.push_str("<tr><th>");
        esc(&mut h, k);
        h.push_str("</th><td><code>");
        esc(&mut h, v);
        h.push_str("</code></td></tr>");
    };
    kv(
        "listen",
        &match c.listen {
            Some(l) => format!("{l}{}", if banner.tls { " (TLS)" } else { "" }),
            None => "off".to_owned(),
        },
    );
    kv("upstream", &banner.upstream);
    kv("store", &banner.store);
    if let Some((addr, _)) = &c.admin {
        kv("admin", &addr.to_string());
    }
    kv("workers", &c.workers.to_string());
    h.push_str("</tbody></table><table><thead><tr><th>rule</th><th>as loaded</th></tr></thead><tbody id=\"rules\">");
    for (r, line) in c.policy.rules.iter().zip(&banner.rules) {
        h.push_str("<tr data-rule=\"");
        esc(&mut h, r.rule.name());
        h.push_str("\"><td>");
        esc(&mut h, r.rule.name());
        h.push_str("</td><td><code>");
        esc(&mut h, line);
        h.push_str("</code></td></tr>");
    }
    for line in &banner.rls {
        h.push_str("<tr><td>rls</td><td><code>");
        esc(&mut h, line);
        h.push_str("</code></td></tr>");
    }
    let _ = write!(
        h,
        "</tbody></table><script src=\"/ui/app.js\"></script></body></html>"
    );
    h
}

/// The password of an `Authorization: Basic` value (standard base64 with
/// its padding, as browsers send it; the user name is not looked at):
/// browsers send it for a page that asks with `WWW-Authenticate: Basic`,
/// and again with the page's own requests.
pub(crate) fn basic_password(value: &str) -> Option<String> {
    use base64::Engine as _;
    let b64 = value.strip_prefix("Basic ")?.trim();
    if b64.len() > 4096 {
        return None;
    }
    let raw = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (_, password) = text.split_once(':')?;
    Some(password.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_read_as_browsers_send_them() {
        // "admin:s3cret", "x:a:b" (a colon in the password), ":p".
        assert_eq!(
            basic_password("Basic YWRtaW46czNjcmV0").as_deref(),
            Some("s3cret")
        );
        assert_eq!(basic_password("Basic eDphOmI=").as_deref(), Some("a:b"));
        assert_eq!(basic_password("Basic OnA=").as_deref(), Some("p"));
        for bad in [
            "Bearer YWRtaW46czNjcmV0",
            "Basic YWRtaW46czNjcmV0=",
            "Basic ***",
            "Basic bm9jb2xvbg==",
        ] {
            assert_eq!(basic_password(bad), None, "{bad}");
        }
    }

    #[test]
    fn text_is_escaped() {
        let mut out = String::new();
        esc(&mut out, "<script>\"a\"&'b'");
        assert_eq!(out, "&lt;script&gt;&quot;a&quot;&amp;&#39;b&#39;");
    }
}
