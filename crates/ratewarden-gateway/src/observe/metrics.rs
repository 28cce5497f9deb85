//! Prometheus metrics, kept by hand: a few counters and two histograms do not
//! need an exporter framework on the request path.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Upper bounds (seconds) of the histogram buckets.
const BUCKETS: [f64; 12] = [
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0,
];

/// The `decision` label values of `ratewarden_requests_total`.
///
/// `not_charged`: the rule said yes, but another rule refused the request,
/// so nothing was charged to this one (decisions are all-or-nothing).
const DECISIONS: [&str; 4] = ["allowed", "rejected", "shadow_rejected", "not_charged"];

/// Bound on distinct banned keys tracked for the gauge.
const MAX_BANS_TRACKED: usize = 100_000;

/// Bound on the keys remembered per rule as candidates for `/v1/keys`.
const MAX_HOT_PER_RULE: usize = 4096;

#[derive(Default)]
struct Histogram {
    /// Observations per bucket, not cumulative: one atomic add per
    /// observation; the cumulative `le` counts are summed when rendered.
    counts: [AtomicU64; BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        if let Some(i) = BUCKETS.iter().position(|b| s <= *b) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Ordering::Relaxed);
    }

    /// The series of `name` with one label, for a family of histograms
    /// (its `# TYPE` written once by the caller).
    fn render_labelled(&self, name: &str, label: &str, value: &str, out: &mut String) {
        let count = self.count.load(Ordering::Relaxed);
        if count == 0 {
            return;
        }
        let mut cumulative = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(
                out,
                "{name}_bucket{{{label}=\"{value}\",le=\"{b}\"}} {cumulative}"
            );
        }
        let _ = writeln!(
            out,
            "{name}_bucket{{{label}=\"{value}\",le=\"+Inf\"}} {count}"
        );
        let _ = writeln!(
            out,
            "{name}_sum{{{label}=\"{value}\"}} {}",
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count{{{label}=\"{value}\"}} {count}");
    }

    fn render(&self, name: &str, out: &mut String) {
        let _ = writeln!(out, "# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, b) in BUCKETS.iter().enumerate() {
            cumulative += self.counts[i].load(Ordering::Relaxed);
            let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {cumulative}");
        }
        let count = self.count.load(Ordering::Relaxed);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(
            out,
            "{name}_sum {}",
            self.sum_ns.load(Ordering::Relaxed) as f64 / 1e9
        );
        let _ = writeln!(out, "{name}_count {count}");
    }
}

/// A sampled trace's observation, shown beside its series (OpenMetrics'
/// exemplar): a spike of refusals in a dashboard leads to a trace.
#[derive(Debug, Clone, Copy)]
struct Exemplar {
    trace_id: [u8; 16],
    value: f64,
    /// Unix seconds.
    at: f64,
}

/// One rule's decisions: allowed, rejected, shadow_rejected, not_charged.
#[derive(Default, Debug)]
pub struct RuleCounts([AtomicU64; 4]);

impl RuleCounts {
    /// allowed, rejected, shadow_rejected, not_charged so far.
    pub fn get(&self) -> [u64; 4] {
        [0, 1, 2, 3].map(|i| self.0[i].load(Ordering::Relaxed))
    }

    /// Counts one `allowed`, `rejected` or `shadow_rejected` decision.
    pub fn add(&self, decision: &'static str) {
        let i = DECISIONS.iter().position(|d| *d == decision).unwrap_or(1);
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// One upstream server's attempts: answered, failed, timed out.
#[derive(Default, Debug)]
pub struct ServerCounts([AtomicU64; 3]);

/// How an attempt on a server went (what [`ServerCounts`] counts; routes
/// record it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// An answer came.
    Answered,
    /// Could not connect, or the exchange broke.
    Failed,
    /// No answer within `upstream_timeout`.
    TimedOut,
}

impl ServerCounts {
    /// Counts one attempt.
    pub fn add(&self, o: Outcome) {
        let i = match o {
            Outcome::Answered => 0,
            Outcome::Failed => 1,
            Outcome::TimedOut => 2,
        };
        self.0[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// One route's answers, by who made them (the gateway itself, or the
/// upstream relayed) and status class, and its upstream's time to answer.
#[derive(Default)]
pub struct RouteCounts {
    /// [gateway, upstream] x [1xx, 2xx, 3xx, 4xx, 5xx].
    responses: [[AtomicU64; 5]; 2],
    upstream: Histogram,
}

impl std::fmt::Debug for RouteCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouteCounts").finish_non_exhaustive()
    }
}

impl RouteCounts {
    /// Counts one answer of `status`, made by the upstream or the gateway.
    pub fn response(&self, status: u16, from_upstream: bool) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        self.responses[usize::from(from_upstream)][class].fetch_add(1, Ordering::Relaxed);
    }

    /// The upstream took `d` to answer (its response head).
    pub fn upstream_time(&self, d: Duration) {
        self.upstream.observe(d);
    }
}

/// Marks a response as the upstream's (relayed, or the built-in echo's),
/// not one the gateway made itself: `ratewarden_responses_total`'s
/// `source` on hyper's path.
#[derive(Debug, Clone, Copy)]
pub(crate) struct FromUpstream;

/// The route label of answers given before a route was chosen (a path
/// that cannot be normalised, say).
pub(crate) const NO_ROUTE: &str = "none";

/// The gateway's metrics.
#[derive(Default)]
pub struct Metrics {
    /// Per route, kept across reloads: resolved into each group when the
    /// config is loaded, so that counting takes no lock.
    routes: Mutex<HashMap<String, Arc<RouteCounts>>>,
    /// Per (route, server), kept across reloads like the rule counts.
    servers: Mutex<HashMap<(String, String), Arc<ServerCounts>>>,
    /// Per rule name, kept across reloads. The request path counts on the
    /// `Arc`s it resolved when the config was loaded (see [`Self::counts`]):
    /// no lock and no lookup per decision.
    requests: Mutex<HashMap<String, Arc<RuleCounts>>>,
    decision: Histogram,
    upstream: Histogram,
    reloads_ok: AtomicU64,
    reloads_failed: AtomicU64,
    /// Spans dropped: the queue full, or a batch the collector did not
    /// take. Kept across reloads (each configuration's tracer adds to it).
    pub(crate) trace_dropped: Arc<AtomicU64>,
    /// The last sampled trace per series that keeps one (the decision
    /// histogram's buckets, each rule's refusals), by the series as
    /// written: OpenMetrics exemplars.
    exemplars: Mutex<HashMap<String, Exemplar>>,
    /// TLS handshakes with clients that failed or timed out.
    tls_failures: AtomicU64,
    /// API keys that named no consumer (unknown, revoked, expired).
    unknown_keys: AtomicU64,
    /// Tokens not trusted, by reason (`jwt:`).
    jwt_rejected: Mutex<Vec<(&'static str, u64)>>,
    /// Answers to a rule charged by them whose cost could not be read: by
    /// rule and reason.
    cost_missing: Mutex<Vec<(String, &'static str, u64)>>,
    /// LLM tokens charged: by rule, dialect and kind (input, cached_input,
    /// output).
    llm_tokens: Mutex<Vec<(String, &'static str, [u64; 3])>>,
    bans: Mutex<HashMap<(String, String), Instant>>,
    /// Per rule, keys seen near or over their limit lately (sampled), as
    /// the candidates `/v1/keys` inspects.
    hot: Mutex<HashMap<String, HashMap<String, Instant>>>,
    /// Envoy descriptor decisions: (domain, descriptor, code) -> count.
    rls: Mutex<foldhash::HashMap<String, foldhash::HashMap<String, [u64; RLS_CODES.len()]>>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Metrics {
    /// The answer counts of `route`, created on first use.
    pub fn route(&self, route: &str) -> Arc<RouteCounts> {
        let mut m = self.routes.lock();
        match m.get(route) {
            Some(c) => c.clone(),
            None => m.entry(route.to_owned()).or_default().clone(),
        }
    }

    /// The decision counts of `rule`, created on first use.
    pub fn counts(&self, rule: &str) -> Arc<RuleCounts> {
        let mut m = self.requests.lock();
        match m.get(rule) {
            Some(c) => c.clone(),
            None => m.entry(rule.to_owned()).or_default().clone(),
        }
    }

    /// `rule`'s decisions so far as JSON (`/v1/rules`, and the live page's
    /// rates): `{"allowed": n, "rejected": n, "shadow_rejected": n,
    /// "not_charged": n}`.
    pub fn decisions(&self, rule: &str) -> serde_json::Value {
        let counts = self
            .requests
            .lock()
            .get(rule)
            .map(|c| c.get())
            .unwrap_or_default();
        DECISIONS
            .iter()
            .zip(counts)
            .map(|(name, n)| ((*name).to_owned(), serde_json::Value::from(n)))
            .collect::<serde_json::Map<_, _>>()
            .into()
    }

    /// The attempt counts of `server` on `route`, created on first use.
    pub fn server_counts(&self, route: &str, server: &str) -> Arc<ServerCounts> {
        self.servers
            .lock()
            .entry((route.to_owned(), server.to_owned()))
            .or_default()
            .clone()
    }

    /// Time spent deciding.
    pub fn decision_time(&self, d: Duration) {
        self.decision.observe(d);
    }

    /// A sampled request's decision took `d`: its trace is the exemplar
    /// of the bucket `d` falls in.
    pub(crate) fn decision_exemplar(&self, d: Duration, trace_id: [u8; 16]) {
        let s = d.as_secs_f64();
        let series = match BUCKETS.iter().find(|b| s <= **b) {
            Some(b) => format!("ratewarden_decision_duration_seconds_bucket{{le=\"{b}\"}}"),
            None => "ratewarden_decision_duration_seconds_bucket{le=\"+Inf\"}".to_owned(),
        };
        self.exemplar(series, trace_id, s);
    }

    /// A sampled request was refused by `rule`: its trace is the exemplar
    /// of the rule's refusals.
    pub(crate) fn refusal_exemplar(&self, rule: &str, trace_id: [u8; 16]) {
        self.exemplar(
            format!("ratewarden_requests_total{{rule=\"{rule}\",decision=\"rejected\"}}"),
            trace_id,
            1.0,
        );
    }

    fn exemplar(&self, series: String, trace_id: [u8; 16], value: f64) {
        let at = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        // Never waited for: a sample lost to a scrape under way is no loss.
        if let Some(mut e) = self.exemplars.try_lock() {
            e.insert(
                series,
                Exemplar {
                    trace_id,
                    value,
                    at,
                },
            );
        }
    }

    /// `text` (the Prometheus text format, as [`Self::render`] and the
    /// admin API write it) as OpenMetrics 1.0: counters named without
    /// their `_total` (a counter without one is `unknown`), the exemplars
    /// beside their series, and `# EOF`.
    pub(crate) fn openmetrics(&self, text: &str) -> String {
        let counters: std::collections::HashSet<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|l| l.strip_suffix(" counter"))
            .collect();
        let exemplars = self.exemplars.lock().clone();
        let mut out = String::with_capacity(text.len() + 64 * exemplars.len() + 8);
        let mut seen = std::collections::HashSet::new();
        for line in text.lines() {
            if let Some(rest) = line
                .strip_prefix("# TYPE ")
                .or_else(|| line.strip_prefix("# HELP "))
            {
                let kind = &line[..7];
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                let family = match name.strip_suffix("_total") {
                    Some(base) if counters.contains(name) => base,
                    _ => name,
                };
                // A family's metadata once (OpenMetrics refuses a second).
                if !seen.insert((kind.to_owned(), family.to_owned())) {
                    continue;
                }
                let tail = if kind == "# TYPE " && tail == "counter" && family == name {
                    "unknown"
                } else {
                    tail
                };
                let _ = writeln!(out, "{kind}{family} {tail}");
                continue;
            }
            out.push_str(line);
            if let Some((series, _)) = line.rsplit_once(' ')
                && let Some(e) = exemplars.get(series)
            {
                out.push_str(" # {trace_id=\"");
                for b in e.trace_id {
                    let _ = write!(out, "{b:02x}");
                }
                let _ = write!(out, "\"}} {} {:.3}", e.value, e.at);
            }
            out.push('\n');
        }
        out.push_str("# EOF\n");
        out
    }

    /// Time the upstream took to answer (headers).
    pub fn upstream_time(&self, d: Duration) {
        self.upstream.observe(d);
    }

    /// A reload, good or bad.
    pub fn reload(&self, ok: bool) {
        if ok {
            self.reloads_ok.fetch_add(1, Ordering::Relaxed);
        } else {
            self.reloads_failed.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A request's API key named no consumer. One counter, no label: a
    /// consumer's name is never a metric label.
    pub fn unknown_key(&self) {
        self.unknown_keys.fetch_add(1, Ordering::Relaxed);
    }

    /// A request's token was not trusted, for `reason`.
    pub fn jwt_rejected(&self, reason: &'static str) {
        let mut r = self.jwt_rejected.lock();
        match r.iter_mut().find(|(k, _)| *k == reason) {
            Some((_, n)) => *n += 1,
            None => r.push((reason, 1)),
        }
    }

    /// An answer to `rule` (charged by its answers) named no cost it could
    /// read: its reservation stays charged. Returns how many so far.
    pub fn cost_missing(&self, rule: &str, reason: &'static str) -> u64 {
        let mut m = self.cost_missing.lock();
        match m.iter_mut().find(|(r, k, _)| r == rule && *k == reason) {
            Some((_, _, n)) => {
                *n += 1;
                *n
            }
            None => {
                m.push((rule.to_owned(), reason, 1));
                1
            }
        }
    }

    /// An LLM answer to `rule` used these tokens (uncached input, cached
    /// input, output), in `dialect`'s shape.
    pub fn llm_tokens(&self, rule: &str, dialect: &'static str, tokens: [u64; 3]) {
        let mut m = self.llm_tokens.lock();
        match m.iter_mut().find(|(r, d, _)| r == rule && *d == dialect) {
            Some((_, _, n)) => {
                for (a, b) in n.iter_mut().zip(tokens) {
                    *a += b;
                }
            }
            None => m.push((rule.to_owned(), dialect, tokens)),
        }
    }

    /// A client's TLS handshake failed or timed out.
    pub fn tls_failure(&self) {
        self.tls_failures.fetch_add(1, Ordering::Relaxed);
    }

    /// A key is banned until `until`.
    pub fn banned(&self, rule: &str, key: &str, until: Instant) {
        let mut b = self.bans.lock();
        if b.len() >= MAX_BANS_TRACKED {
            let now = Instant::now();
            b.retain(|_, t| *t > now);
            if b.len() >= MAX_BANS_TRACKED {
                return;
            }
        }
        b.insert((rule.to_owned(), key.to_owned()), until);
    }

    /// Forgets a ban the store no longer holds.
    pub fn unban(&self, rule: &str, key: &str) {
        self.bans.lock().remove(&(rule.to_owned(), key.to_owned()));
    }

    /// Active bans, the longest first, at most `max`: (rule, key, time left).
    pub fn bans(&self, max: usize) -> Vec<(String, String, Duration)> {
        let now = Instant::now();
        let mut v: Vec<_> = self
            .bans
            .lock()
            .iter()
            .filter(|(_, until)| **until > now)
            .map(|((r, k), until)| (r.clone(), k.clone(), *until - now))
            .collect();
        v.sort_by_key(|b| std::cmp::Reverse(b.2));
        v.truncate(max);
        v
    }

    /// `key` of `rule` was seen near or over its limit (the caller samples).
    pub fn hot(&self, rule: &str, key: &str) {
        let mut hot = self.hot.lock();
        let keys = match hot.get_mut(rule) {
            Some(k) => k,
            None => hot.entry(rule.to_owned()).or_default(),
        };
        if let Some(t) = keys.get_mut(key) {
            *t = Instant::now();
            return;
        }
        if keys.len() >= MAX_HOT_PER_RULE {
            // Forget the oldest half: the hot keys are the recent ones.
            let mut ages: Vec<Instant> = keys.values().copied().collect();
            ages.sort();
            let cut = ages[ages.len() / 2];
            keys.retain(|_, t| *t > cut);
        }
        keys.insert(key.to_owned(), Instant::now());
    }

    /// The candidates remembered for `rule`, most recent first.
    pub fn hot_keys(&self, rule: &str) -> Vec<String> {
        let hot = self.hot.lock();
        let Some(keys) = hot.get(rule) else {
            return vec![];
        };
        let mut v: Vec<(&String, &Instant)> = keys.iter().collect();
        v.sort_by(|a, b| b.1.cmp(a.1));
        v.into_iter().map(|(k, _)| k.clone()).collect()
    }

    /// Counts one Envoy descriptor's status (`code`, one of
    /// [`RLS_CODES`]). The descriptor is its place in the config
    /// (`domain.key_value...`), or with `detailed_metric` the request's own
    /// values: `domain.` and `key`, the descriptor's counter key. No
    /// allocation once a descriptor has been counted (plain ones).
    pub fn rls(&self, domain: &str, limit: Option<(&str, bool)>, key: &str, code: &'static str) {
        let at = RLS_CODES.iter().position(|c| *c == code).unwrap_or(0);
        let detailed;
        let descriptor = match limit {
            None => "",
            Some((full_key, false)) => full_key,
            Some(_) => {
                detailed = format!("{domain}.{key}");
                detailed.as_str()
            }
        };
        let mut rls = self.rls.lock();
        let by_descriptor = match rls.get_mut(domain) {
            Some(m) => m,
            None => rls.entry(domain.to_owned()).or_default(),
        };
        let counts = match by_descriptor.get_mut(descriptor) {
            Some(c) => c,
            None => by_descriptor.entry(descriptor.to_owned()).or_default(),
        };
        counts[at] += 1;
    }

    /// Renders the Prometheus text format; `store_errors` is the store's
    /// own count by kind, `access_dropped` the access log's dropped lines.
    pub fn render(&self, store_errors: &[(&str, u64)], access_dropped: u64) -> String {
        let mut out = String::new();
        out.push_str("# HELP ratewarden_requests_total Decisions per rule: allowed (charged), rejected, shadow_rejected, not_charged (the rule said yes, another refused the request: nothing charged).\n# TYPE ratewarden_requests_total counter\n");
        let mut rows: Vec<_> = self
            .requests
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.0.each_ref().map(|n| n.load(Ordering::Relaxed))))
            .collect();
        rows.sort();
        for (rule, counts) in rows {
            for (decision, n) in DECISIONS.iter().zip(counts) {
                let _ = writeln!(
                    out,
                    "ratewarden_requests_total{{rule=\"{rule}\",decision=\"{decision}\"}} {n}"
                );
            }
        }
        out.push_str("# HELP ratewarden_decision_duration_seconds Time to decide a request.\n");
        self.decision
            .render("ratewarden_decision_duration_seconds", &mut out);
        out.push_str("# HELP ratewarden_upstream_duration_seconds Time until the upstream's response headers.\n");
        self.upstream
            .render("ratewarden_upstream_duration_seconds", &mut out);
        out.push_str("# HELP ratewarden_store_errors_total Store calls that failed, by kind: unavailable (nothing applied: an outage), late (sent, no answer in time), server (an error a retry will not mend), protocol, config.\n# TYPE ratewarden_store_errors_total counter\n");
        for (kind, n) in store_errors {
            let _ = writeln!(out, "ratewarden_store_errors_total{{kind=\"{kind}\"}} {n}");
        }
        let mut routes: Vec<(String, Arc<RouteCounts>)> = self
            .routes
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        routes.sort_by(|a, b| a.0.cmp(&b.0));
        out.push_str("# HELP ratewarden_responses_total Answers sent, by route, by who made them (source: gateway for its own refusals and errors, upstream for the upstream's answers relayed) and by status class.\n# TYPE ratewarden_responses_total counter\n");
        for (route, c) in &routes {
            for (source, by_class) in ["gateway", "upstream"].iter().zip(&c.responses) {
                for (class, n) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().zip(by_class) {
                    let n = n.load(Ordering::Relaxed);
                    if n > 0 {
                        let _ = writeln!(
                            out,
                            "ratewarden_responses_total{{route=\"{route}\",source=\"{source}\",code=\"{class}\"}} {n}"
                        );
                    }
                }
            }
        }
        out.push_str("# HELP ratewarden_route_upstream_duration_seconds Time until the upstream's response headers, per route.\n# TYPE ratewarden_route_upstream_duration_seconds histogram\n");
        for (route, c) in &routes {
            c.upstream.render_labelled(
                "ratewarden_route_upstream_duration_seconds",
                "route",
                route,
                &mut out,
            );
        }
        let mut servers: Vec<_> = self
            .servers
            .lock()
            .iter()
            .map(|(k, v)| (k.clone(), v.0.each_ref().map(|n| n.load(Ordering::Relaxed))))
            .collect();
        servers.sort();
        out.push_str("# HELP ratewarden_upstream_requests_total Attempts on each upstream server, by route and result.\n# TYPE ratewarden_upstream_requests_total counter\n");
        for ((route, server), c) in servers {
            for (result, n) in ["answered", "failed", "timed_out"].iter().zip(c) {
                let _ = writeln!(
                    out,
                    "ratewarden_upstream_requests_total{{route=\"{route}\",server=\"{server}\",result=\"{result}\"}} {n}"
                );
            }
        }
        let _ = writeln!(
            out,
            "# HELP ratewarden_access_log_dropped_total Access log lines dropped because the writer fell behind.\n# TYPE ratewarden_access_log_dropped_total counter\nratewarden_access_log_dropped_total {access_dropped}"
        );
        let _ = writeln!(
            out,
            "# HELP ratewarden_tls_handshake_failures_total Client TLS handshakes that failed or timed out.\n# TYPE ratewarden_tls_handshake_failures_total counter\nratewarden_tls_handshake_failures_total {}",
            self.tls_failures.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ratewarden_consumer_unknown_keys_total API keys that named no consumer (unknown, revoked or expired).\n# TYPE ratewarden_consumer_unknown_keys_total counter\nratewarden_consumer_unknown_keys_total {}",
            self.unknown_keys.load(Ordering::Relaxed)
        );
        let jwt = self.jwt_rejected.lock().clone();
        if !jwt.is_empty() {
            let _ = writeln!(
                out,
                "# HELP ratewarden_jwt_rejected_total Tokens not trusted (the key part is missing), by reason.\n# TYPE ratewarden_jwt_rejected_total counter"
            );
            for (reason, n) in jwt {
                let _ = writeln!(
                    out,
                    "ratewarden_jwt_rejected_total{{reason=\"{reason}\"}} {n}"
                );
            }
        }
        let missing = self.cost_missing.lock().clone();
        if !missing.is_empty() {
            let _ = writeln!(
                out,
                "# HELP ratewarden_llm_usage_missing_total Answers to a rule charged by them whose cost (an LLM's usage, a header, a JSON field) could not be read: the reservation stays charged.\n# TYPE ratewarden_llm_usage_missing_total counter"
            );
            for (rule, reason, n) in missing {
                let _ = writeln!(
                    out,
                    "ratewarden_llm_usage_missing_total{{rule=\"{rule}\",reason=\"{reason}\"}} {n}"
                );
            }
        }
        let tokens = self.llm_tokens.lock().clone();
        if !tokens.is_empty() {
            let _ = writeln!(
                out,
                "# HELP ratewarden_llm_tokens_total Tokens LLM answers reported, by rule, dialect and kind.\n# TYPE ratewarden_llm_tokens_total counter"
            );
            for (rule, dialect, t) in tokens {
                for (kind, n) in ["input", "cached_input", "output"].into_iter().zip(t) {
                    let _ = writeln!(
                        out,
                        "ratewarden_llm_tokens_total{{rule=\"{rule}\",dialect=\"{dialect}\",kind=\"{kind}\"}} {n}"
                    );
                }
            }
        }
        let _ = writeln!(
            out,
            "# HELP ratewarden_config_reloads_total Config reloads.\n# TYPE ratewarden_config_reloads_total counter\nratewarden_config_reloads_total{{result=\"success\"}} {}\nratewarden_config_reloads_total{{result=\"failure\"}} {}",
            self.reloads_ok.load(Ordering::Relaxed),
            self.reloads_failed.load(Ordering::Relaxed)
        );
        let _ = writeln!(
            out,
            "# HELP ratewarden_trace_spans_dropped_total Spans not sent: the queue to the exporter full, or a batch the collector did not take.\n# TYPE ratewarden_trace_spans_dropped_total counter\nratewarden_trace_spans_dropped_total {}",
            self.trace_dropped.load(Ordering::Relaxed)
        );
        let mut rls: Vec<_> = self
            .rls
            .lock()
            .iter()
            .flat_map(|(domain, m)| {
                m.iter().flat_map(move |(descriptor, counts)| {
                    RLS_CODES
                        .iter()
                        .zip(counts)
                        .filter(|(_, n)| **n > 0)
                        .map(move |(code, n)| ((domain.clone(), descriptor.clone(), *code), *n))
                })
            })
            .collect();
        rls.sort();
        out.push_str("# HELP ratewarden_rls_decisions_total Envoy rate limit service: descriptor statuses by domain, descriptor and code (shadow_over_limit: over, answered OK).\n# TYPE ratewarden_rls_decisions_total counter\n");
        for ((domain, descriptor, code), n) in rls {
            let _ = writeln!(
                out,
                "ratewarden_rls_decisions_total{{domain=\"{}\",descriptor=\"{}\",code=\"{code}\"}} {n}",
                label(&domain),
                label(&descriptor)
            );
        }
        let now = Instant::now();
        let banned = {
            let mut b = self.bans.lock();
            b.retain(|_, t| *t > now);
            b.len()
        };
        let _ = writeln!(
            out,
            "# HELP ratewarden_banned_keys Keys under an active ban seen by this instance.\n# TYPE ratewarden_banned_keys gauge\nratewarden_banned_keys {banned}"
        );
        out
    }
}

/// The codes of `ratewarden_rls_decisions_total`.
pub(crate) const RLS_CODES: [&str; 6] = [
    "ok",
    "over_limit",
    "shadow_over_limit",
    "unlimited",
    "no_limit",
    "refunded",
];

/// `v` as a Prometheus label value: `\\`, `"` and newlines escaped (Envoy
/// descriptor values come from requests).
fn label(v: &str) -> std::borrow::Cow<'_, str> {
    if !v.contains(['\\', '"', '\n']) {
        return v.into();
    }
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
        .into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_render_cumulative() {
        let h = Histogram::default();
        for us in [30, 200, 2_000_000] {
            h.observe(Duration::from_micros(us));
        }
        let mut out = String::new();
        h.render("t", &mut out);
        for line in [
            "t_bucket{le=\"0.00005\"} 1\n",
            "t_bucket{le=\"0.0001\"} 1\n",
            "t_bucket{le=\"0.00025\"} 2\n",
            "t_bucket{le=\"1\"} 2\n",
            "t_bucket{le=\"+Inf\"} 3\n",
            "t_count 3\n",
        ] {
            assert!(out.contains(line), "{line:?} missing from\n{out}");
        }
    }
}
