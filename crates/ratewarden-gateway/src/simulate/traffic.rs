//! `simulate --traffic SPEC`: a recorded trace (CSV or JSONL) or a mix of
//! generators, read into one time-ordered list of requests.
//!
//! A trace line is `t, identity, method, path[, status]`: `t` in seconds
//! from the trace's start (a fraction allowed), `status` the upstream's
//! answer (for `count: failures` rules). JSONL lines are objects with the
//! same names, and may also carry `host` and `headers` (an object of
//! names and values), for rules that match or key on them. A generator
//! spec is `NAME:key=value,...`, several joined by `+`; besides its own
//! keys each takes `host=NAME` and `header:NAME=VALUE`:
//!
//! | generator | what | its keys (besides `duration`, `start`, `path`, `method`, `status`, `seed`) |
//! |---|---|---|
//! | `steady` | evenly spaced | `rate` (req/s), `clients` |
//! | `poisson` | random arrivals at a mean rate | `rate`, `clients` |
//! | `burst` | `size` requests at once, every `every` | `size`, `every`, `clients` |
//! | `sawtooth` | the rate climbing from 0 to `peak` over each `period` | `peak`, `period`, `clients` |
//! | `attack` | many clients, each request from one drawn at random | `rate`, `clients` (default 1000) |
//!
//! Generated clients are addresses: component `c`'s client `i` is
//! `10.0.0.0 + c·2²⁰ + i`, so rules keyed by the client's address see
//! them as the proxy would.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;
use std::time::Duration;

use http::Method;

use crate::config::parse_duration;

/// One request of a trace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// Microseconds from the trace's start.
    pub t: u64,
    /// Index into [`Traffic::identities`].
    pub identity: u32,
    /// Index into [`Traffic::requests`] (method and path).
    pub request: u32,
    /// The upstream's status, 0 when not given.
    pub status: u16,
}

/// One distinct request of a trace: what rules can see of it besides the
/// client.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Request {
    /// The method.
    pub method: Method,
    /// The target as given (path and query).
    pub target: String,
    /// The host asked for, if given.
    pub host: Option<String>,
    /// Header fields, if given (names as written).
    pub headers: Vec<(String, String)>,
}

impl Request {
    fn new(method: Method, target: &str) -> Self {
        Self {
            method,
            target: target.to_owned(),
            host: None,
            headers: vec![],
        }
    }
}

/// Requests in time order, with the strings they refer to interned.
#[derive(Debug, Default)]
pub struct Traffic {
    /// The clients.
    pub identities: Vec<String>,
    /// The distinct requests.
    pub requests: Vec<Request>,
    /// The requests, by time.
    pub events: Vec<Event>,
}

impl Traffic {
    /// The time of the last request, in microseconds.
    pub fn span(&self) -> u64 {
        self.events.last().map_or(0, |e| e.t)
    }

    fn intern_request(&mut self, seen: &mut HashMap<Request, u32>, k: Request) -> u32 {
        if let Some(&i) = seen.get(&k) {
            return i;
        }
        let i = self.requests.len() as u32;
        self.requests.push(k.clone());
        seen.insert(k, i);
        i
    }
}

/// Reads SPEC: a file that exists is a trace, anything else a generator
/// spec.
pub fn load(spec: &str) -> Result<Traffic, String> {
    let path = Path::new(spec);
    if path.is_file() {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {spec}: {e}"))?;
        let jsonl = match path.extension().and_then(|e| e.to_str()) {
            Some("jsonl" | "ndjson") => true,
            Some("csv") => false,
            _ => text.trim_start().starts_with('{'),
        };
        return read_trace(&text, jsonl).map_err(|e| format!("{spec}: {e}"));
    }
    generate(spec)
}

/// A trace's text.
pub fn read_trace(text: &str, jsonl: bool) -> Result<Traffic, String> {
    let mut out = Traffic::default();
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut reqs = HashMap::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let at = |e: String| format!("line {}: {e}", n + 1);
        let (mut host, mut headers) = (None, vec![]);
        let (t, identity, method, path, status) = if jsonl {
            #[derive(serde::Deserialize)]
            #[serde(deny_unknown_fields)]
            struct Line {
                t: f64,
                identity: String,
                #[serde(default = "get")]
                method: String,
                path: String,
                #[serde(default)]
                status: Option<u16>,
                #[serde(default)]
                host: Option<String>,
                #[serde(default)]
                headers: std::collections::BTreeMap<String, String>,
            }
            fn get() -> String {
                "GET".into()
            }
            let l: Line = serde_json::from_str(line).map_err(|e| at(e.to_string()))?;
            (host, headers) = (l.host, l.headers.into_iter().collect());
            (l.t, l.identity, l.method, l.path, l.status)
        } else {
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if !(4..=5).contains(&f.len()) {
                // A header line names the columns.
                if n == 0 || f.first() == Some(&"t") {
                    continue;
                }
                return Err(at(format!(
                    "{} fields; a line is `t, identity, method, path[, status]`",
                    f.len()
                )));
            }
            let Ok(t) = f[0].parse::<f64>() else {
                if f[0] == "t" {
                    continue;
                }
                return Err(at(format!("`{}` is not a time in seconds", f[0])));
            };
            let status = match f.get(4) {
                Some(s) if !s.is_empty() => Some(
                    s.parse::<u16>()
                        .map_err(|_| at(format!("`{s}` is not a status")))?,
                ),
                _ => None,
            };
            (t, f[1].to_owned(), f[2].to_owned(), f[3].to_owned(), status)
        };
        if !t.is_finite() || t < 0.0 {
            return Err(at(format!("time {t} is not a time from the start")));
        }
        let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| at(format!("`{method}` is not a method")))?;
        if !path.starts_with('/') && path != "*" {
            return Err(at(format!("path `{path}` must start with /")));
        }
        if let Some(s) = status
            && !(100..=599).contains(&s)
        {
            return Err(at(format!("status {s} is not an HTTP status")));
        }
        let next = ids.len() as u32;
        let id = *ids.entry(identity).or_insert(next);
        let request = out.intern_request(
            &mut reqs,
            Request {
                host,
                headers,
                ..Request::new(method, &path)
            },
        );
        out.events.push(Event {
            t: (t * 1e6).round() as u64,
            identity: id,
            request,
            status: status.unwrap_or(0),
        });
    }
    out.identities = vec![String::new(); ids.len()];
    for (s, i) in ids {
        out.identities[i as usize] = s;
    }
    // Stable: lines with one time keep their order.
    out.events.sort_by_key(|e| e.t);
    Ok(out)
}

/// A small, fast, seeded generator (splitmix64): the same spec always
/// gives the same traffic.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [0, n).
    fn below(&mut self, n: u64) -> u64 {
        ((u128::from(self.next()) * u128::from(n)) >> 64) as u64
    }
}

/// Requests generated at most (a typo of a rate should not take the
/// machine's memory).
pub const MAX_EVENTS: usize = 200_000_000;

/// One generator's keys.
struct Params<'a> {
    name: &'a str,
    kv: HashMap<&'a str, &'a str>,
}

impl<'a> Params<'a> {
    fn parse(part: &'a str) -> Result<Self, String> {
        let (name, rest) = part.split_once(':').unwrap_or((part, ""));
        let mut kv = HashMap::new();
        for item in rest.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let (k, v) = item
                .split_once('=')
                .ok_or_else(|| format!("`{item}` in `{part}`: write key=value"))?;
            kv.insert(k.trim(), v.trim());
        }
        Ok(Self {
            name: name.trim(),
            kv,
        })
    }

    fn take(&mut self, key: &str) -> Option<&'a str> {
        self.kv.remove(key)
    }

    fn num(&mut self, key: &str, default: Option<f64>) -> Result<f64, String> {
        match self.take(key) {
            Some(v) => v
                .parse::<f64>()
                .ok()
                .filter(|x| x.is_finite() && *x >= 0.0)
                .ok_or_else(|| format!("{}: `{key}={v}` is not a number", self.name)),
            None => default.ok_or_else(|| format!("{}: `{key}` is required", self.name)),
        }
    }

    fn dur(&mut self, key: &str, default: Duration) -> Result<Duration, String> {
        match self.take(key) {
            Some(v) => parse_duration(v).map_err(|e| format!("{}: `{key}`: {e}", self.name)),
            None => Ok(default),
        }
    }

    /// Refuses keys the generator does not take (before any is read:
    /// a misspelt key is named, not reported as a missing one).
    fn only(&self) -> Result<(), String> {
        let own: &[&str] = match self.name {
            "steady" | "poisson" | "attack" => &["rate"],
            "burst" => &["size", "every"],
            "sawtooth" => &["peak", "period"],
            other => {
                return Err(format!(
                    "unknown traffic `{other}`: a file, or one of steady, poisson, burst, sawtooth, attack"
                ));
            }
        };
        let common = [
            "duration", "start", "method", "path", "status", "seed", "clients",
        ];
        match self.kv.keys().find(|k| {
            !own.contains(k) && !common.contains(k) && **k != "host" && !k.starts_with("header:")
        }) {
            Some(k) => Err(format!("{}: unknown key `{k}`", self.name)),
            None => Ok(()),
        }
    }
}

/// A generator spec (`steady:rate=50,duration=60s+attack:clients=500`).
pub fn generate(spec: &str) -> Result<Traffic, String> {
    let mut out = Traffic::default();
    let mut reqs = HashMap::new();
    for (c, part) in spec.split('+').enumerate() {
        let c = c as u32;
        let mut p = Params::parse(part)?;
        p.only()?;
        let duration = micros(p.dur("duration", Duration::from_secs(60))?);
        let start = micros(p.dur("start", Duration::ZERO)?);
        let method = p.take("method").unwrap_or("GET");
        let method = Method::from_bytes(method.to_ascii_uppercase().as_bytes())
            .map_err(|_| format!("{}: `{method}` is not a method", p.name))?;
        let path = p.take("path").unwrap_or("/");
        if !path.starts_with('/') {
            return Err(format!("{}: path `{path}` must start with /", p.name));
        }
        let status = p.num("status", Some(0.0))? as u16;
        let mut rng = Rng(p.num("seed", Some(1.0))? as u64 ^ u64::from(c) << 32);
        let name = p.name;
        let default_clients = if name == "attack" { 1000.0 } else { 1.0 };
        let clients = (p.num("clients", Some(default_clients))? as u64).clamp(1, 1 << 20);
        let host = p.take("host").map(str::to_owned);
        let mut headers: Vec<(String, String)> =
            p.kv.iter()
                .filter_map(|(k, v)| Some((k.strip_prefix("header:")?.to_owned(), (*v).to_owned())))
                .collect();
        headers.sort();
        p.kv.retain(|k, _| !k.starts_with("header:"));
        let request = out.intern_request(
            &mut reqs,
            Request {
                host,
                headers,
                ..Request::new(method, path)
            },
        );
        let first_id = out.identities.len() as u32;
        for i in 0..clients as u32 {
            out.identities
                .push(Ipv4Addr::from(0x0A00_0000 + (c << 20) + i).to_string());
        }
        // Arrival times, then a client for each.
        let mut times: Vec<u64> = Vec::new();
        let push = |times: &mut Vec<u64>, t: u64| -> Result<(), String> {
            if times.len() + out.events.len() >= MAX_EVENTS {
                return Err(format!(
                    "`{part}` makes more than {MAX_EVENTS} requests: lower the rate or the duration"
                ));
            }
            times.push(start + t);
            Ok(())
        };
        let per_request = |rate: f64| 1e6 / rate;
        // Refused before a byte is spent when the count is known ahead
        // (steady, attack: rate × duration); the others are stopped by
        // `push` as they grow.
        if matches!(name, "steady" | "attack")
            && let Some(rate) = p.kv.get("rate").and_then(|r| r.parse::<f64>().ok())
            && rate * duration as f64 / 1e6 > MAX_EVENTS as f64
        {
            return Err(format!(
                "`{part}` makes more than {MAX_EVENTS} requests: lower the rate or the duration"
            ));
        }
        match name {
            "steady" | "attack" => {
                let rate = p.num("rate", None)?;
                if rate > 0.0 {
                    let gap = per_request(rate);
                    let mut t = 0.0;
                    while (t as u64) < duration {
                        push(&mut times, t as u64)?;
                        t += gap;
                    }
                }
            }
            "poisson" => {
                let rate = p.num("rate", None)?;
                if rate > 0.0 {
                    let mean = per_request(rate);
                    let mut t = -mean * (1.0 - rng.unit()).ln();
                    while (t as u64) < duration {
                        push(&mut times, t as u64)?;
                        t += -mean * (1.0 - rng.unit()).ln();
                    }
                }
            }
            "burst" => {
                let size = p.num("size", None)? as u64;
                let every = micros(p.dur("every", Duration::from_secs(10))?).max(1);
                let mut t = 0;
                while t < duration {
                    for _ in 0..size {
                        push(&mut times, t)?;
                    }
                    t += every;
                }
            }
            "sawtooth" => {
                let peak = p.num("peak", None)?;
                let period = micros(p.dur("period", Duration::from_secs(10))?).max(1) as f64;
                // Within a period the rate is peak·x/period at x; the n-th
                // arrival is where the integral, peak·x²/(2·period), is n.
                let per_period = peak * period / 2e6;
                let mut base = 0.0;
                while (base as u64) < duration {
                    let mut n = 0.0;
                    loop {
                        let x = (2.0 * n * period * 1e6 / peak).sqrt();
                        if x >= period || (base + x) as u64 >= duration || peak == 0.0 {
                            break;
                        }
                        push(&mut times, (base + x) as u64)?;
                        n += 1.0;
                        if n > per_period + 1.0 {
                            break;
                        }
                    }
                    base += period;
                }
            }
            _ => unreachable!("refused by `only`"),
        }
        let random = name == "attack";
        out.events
            .extend(times.into_iter().enumerate().map(|(n, t)| Event {
                t,
                identity: first_id
                    + if random {
                        rng.below(clients) as u32
                    } else {
                        (n as u64 % clients) as u32
                    },
                request,
                status,
            }));
    }
    out.events.sort_by_key(|e| e.t);
    Ok(out)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steady_spaces_requests_evenly_over_its_clients() {
        let t = generate("steady:rate=10,duration=2s,clients=2,path=/a").unwrap();
        assert_eq!(t.events.len(), 20);
        assert_eq!(t.events[1].t - t.events[0].t, 100_000);
        assert_eq!(t.identities, ["10.0.0.0", "10.0.0.1"]);
        assert_eq!(t.requests, [Request::new(Method::GET, "/a")]);
        assert_eq!(t.events[3].identity, 1);
    }

    #[test]
    fn burst_sawtooth_poisson_and_attack_give_their_shapes() {
        let b = generate("burst:size=5,every=1s,duration=3s").unwrap();
        assert_eq!(
            b.events.iter().map(|e| e.t).collect::<Vec<_>>(),
            [
                0, 0, 0, 0, 0, 1_000_000, 1_000_000, 1_000_000, 1_000_000, 1_000_000, 2_000_000,
                2_000_000, 2_000_000, 2_000_000, 2_000_000
            ]
        );
        // 0 -> 100/s over 10 s: 500 requests a period, more late than early.
        // The second half of a ramp holds three quarters of it.
        let s = generate("sawtooth:peak=100,period=10s,duration=10s").unwrap();
        assert_eq!(s.events.len(), 500);
        let late = s.events.iter().filter(|e| e.t >= 5_000_000).count();
        assert_eq!(late, 375);
        let p = generate("poisson:rate=1000,duration=10s,seed=7").unwrap();
        assert!(
            (9_500..=10_500).contains(&p.events.len()),
            "{}",
            p.events.len()
        );
        assert_eq!(
            p.events,
            generate("poisson:rate=1000,duration=10s,seed=7")
                .unwrap()
                .events
        );
        let a = generate("attack:rate=10000,duration=1s,clients=50").unwrap();
        let mut seen = vec![0; 50];
        for e in &a.events {
            seen[e.identity as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 100), "{seen:?}");
    }

    #[test]
    fn a_mix_is_merged_in_time_order_with_clients_apart() {
        let t = generate("steady:rate=1,duration=3s+burst:size=2,every=1s,duration=2s,start=500ms")
            .unwrap();
        assert_eq!(t.events.len(), 7);
        assert!(t.events.windows(2).all(|w| w[0].t <= w[1].t));
        assert_eq!(t.identities, ["10.0.0.0", "10.16.0.0"]);
        assert_eq!(t.events[1].t, 500_000);
    }

    #[test]
    fn traces_read_as_csv_and_jsonl() {
        let csv = "t,identity,method,path,status\n0.5, alice, get, /x, 503\n0,bob,POST,/y\n";
        let t = read_trace(csv, false).unwrap();
        assert_eq!(t.events.len(), 2);
        assert_eq!(t.events[0].t, 0);
        assert_eq!(t.identities[t.events[0].identity as usize], "bob");
        assert_eq!(t.events[1].status, 503);
        assert_eq!(t.requests[0], Request::new(Method::GET, "/x"));
        let jsonl = "{\"t\":1.25,\"identity\":\"a\",\"path\":\"/z\"}\n";
        let j = read_trace(jsonl, true).unwrap();
        assert_eq!(j.events[0].t, 1_250_000);
        assert_eq!(j.requests[0].method, Method::GET);
    }

    #[test]
    fn bad_specs_and_lines_say_what_is_wrong() {
        for (spec, says) in [
            ("steady:duration=1s", "`rate` is required"),
            ("steady:rate=x", "not a number"),
            ("steady:rate=1,colour=red", "unknown key `colour`"),
            ("flood:rate=1", "unknown traffic `flood`"),
            ("steady:rate=1,duration=5", "no unit"),
            ("steady:rate=1e12,duration=1d", "more than"),
        ] {
            let e = generate(spec).unwrap_err();
            assert!(e.contains(says), "{spec}: {e}");
        }
        let e = read_trace("0,a,GET,/x\nx,a,GET,/y\n", false).unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        let e = read_trace("0,a,GET,/x,999\n", false).unwrap_err();
        assert!(e.contains("not an HTTP status"), "{e}");
    }
}
