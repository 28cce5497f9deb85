//! `ratewarden simulate`: its counts against a direct fold of the core over
//! the same trace, its files, and the command itself.

mod support;

use std::time::Duration;

use futures_util::FutureExt as _;
use ratewarden::algorithm::Kind;
use ratewarden::clock::{ManualClock, Micros};
use ratewarden::{Limiter, MemoryStore, Reason};
use ratewarden_gateway::config::{self, Config, Overrides};
use ratewarden_gateway::simulate::run::EPOCH;
use ratewarden_gateway::simulate::{self, Counts, Options, plot, traffic};

/// A config as `ratewarden simulate` loads it (nothing is proxied: no
/// upstream is asked for).
fn config(rule: &str) -> Config {
    let replay = Overrides {
        upstream: Some("echo".into()),
        ..Overrides::default()
    };
    config::load(&format!("rules:\n{rule}"), "test", &replay).unwrap()
}

fn options(traffic: &str, out: Option<std::path::PathBuf>) -> Options {
    Options {
        traffic: traffic.into(),
        compare: Vec::new(),
        out,
        step: Some(Duration::from_secs(1)),
        progress: false,
    }
}

/// The core alone, without the admission path: each request of the trace
/// as `Limiter::check` on the rule and the client's address, on a clock
/// set to the request's time; counted per second.
fn fold(config: &Config, spec: &str) -> Vec<Counts> {
    let rule = &config.policy.rules[0].rule;
    let t = traffic::load(spec).unwrap();
    let clock = ManualClock::new(EPOCH);
    let limiter = Limiter::new(
        MemoryStore::builder()
            .max_keys(1 << 20)
            .clock(clock.clone())
            .build(),
    );
    let mut series = vec![Counts::default(); (t.span() / 1_000_000 + 1) as usize];
    for e in &t.events {
        clock.set(Micros::new(EPOCH + e.t));
        let d = limiter
            .check(rule, &t.identities[e.identity as usize])
            .now_or_never()
            .unwrap()
            .unwrap();
        let c = &mut series[(e.t / 1_000_000) as usize];
        c.offered += 1;
        match d.rules[0].reason {
            _ if d.allowed => c.admitted += 1,
            Some(Reason::Limit | Reason::Full) => c.limit += 1,
            Some(Reason::Banned) => c.banned += 1,
            Some(Reason::MinInterval) => c.min_interval += 1,
            None => c.other += 1,
        }
    }
    series
}

/// Bursts, random arrivals and many clients, so that every algorithm
/// both admits and refuses.
const MIX: &str = "burst:size=40,every=7s,duration=60s,clients=3\
    +poisson:rate=30,duration=60s,clients=2,seed=3\
    +attack:rate=400,clients=50,duration=20s,start=30s";

#[test]
fn counts_equal_a_direct_fold_of_the_core_for_every_algorithm() {
    for kind in Kind::ALL {
        if kind.holds_leases() {
            // `concurrency`: a simulated request ends at once; `check`
            // would hold its slot. Not the same question.
            continue;
        }
        let extra = match kind.name() {
            "leaky_bucket" | "token_bucket" | "gcra" => "    burst: 8\n",
            _ => "",
        };
        let cfg = config(&format!(
            "  - name: r\n    algorithm: {}\n    limit: 10\n    window: 2s\n    min_interval: 50ms\n    penalty: 3s\n{extra}",
            kind.name()
        ));
        let report = simulate::simulate(&cfg, &options(MIX, None)).unwrap();
        let run = &report.runs[0].1;
        let want = fold(&cfg, MIX);
        assert_eq!(run.series[0], want, "{}", kind.name());
        let total = run.total(0);
        assert!(
            total.admitted > 0 && total.limit > 0 && total.banned > 0 && total.min_interval > 0,
            "{}: {total:?}",
            kind.name()
        );
    }
}

#[test]
fn a_replay_split_between_threads_counts_what_one_thread_does() {
    // 2^18 requests and more, every rule keyed by the client: split.
    let spec =
        "attack:rate=20000,clients=300,duration=15s+burst:size=500,every=2s,duration=15s,clients=4";
    let cfg = config(
        "  - name: r\n    algorithm: sliding_window_counter\n    limit: 60\n    window: 1s\n",
    );
    let report = simulate::simulate(&cfg, &options(spec, None)).unwrap();
    assert_eq!(report.runs[0].1.requests, 300_000 + 8 * 500);
    assert_eq!(report.runs[0].1.series[0], fold(&cfg, spec));
}

/// A tiered rule's decisions count under the rule (whichever tier), and
/// the table gives each rule's refusal status.
#[test]
fn tiers_count_under_their_rule_and_each_rule_has_its_status() {
    let cfg = config(concat!(
        "  - {name: other, match: {path: /nothing}, limit: 1, window: 1s}
",
        "  - name: plans
    algorithm: fixed_window
    window: 1s
    status: 403
",
        "    tiers: {from: 'query:plan', default: free, values: {free: {limit: 2}, pro: {limit: 5}}}
",
    ));
    let spec =
        "steady:rate=10,duration=3s,path=/x?plan=pro+steady:rate=10,duration=3s,path=/y,clients=1";
    let report = simulate::simulate(&cfg, &options(spec, None)).unwrap();
    let run = &report.runs[0].1;
    assert_eq!(run.total(0).offered, 0);
    let plans = run.total(1);
    assert_eq!(plans.offered, 60);
    // 5 a second for pro, 2 for the default tier, over 3 seconds.
    assert_eq!(plans.admitted, 21, "{plans:?}");
    assert_eq!(run.statuses, vec![429, 403]);
    assert!(report.summary.contains(" 403 "), "{}", report.summary);
}

#[test]
fn rules_that_do_not_match_and_shared_keys_are_counted_apart() {
    let cfg = config(
        "  - name: api\n    match: {path_prefix: /api}\n    algorithm: fixed_window\n    limit: 5\n    window: 1s\n\
         \x20 - name: all\n    key: [global]\n    algorithm: fixed_window\n    limit: 12\n    window: 1s\n",
    );
    let spec = "steady:rate=10,duration=3s,path=/api/x+steady:rate=10,duration=3s,path=/static";
    let report = simulate::simulate(&cfg, &options(spec, None)).unwrap();
    let run = &report.runs[0].1;
    let (api, all) = (run.total(0), run.total(1));
    // /api: 10/s offered, 5 admitted each second. Everyone: 20/s offered,
    // 12 a second; /api's refused ones never reach it (all-or-nothing).
    assert_eq!((api.offered, api.admitted, api.limit), (30, 15, 15));
    assert_eq!(all.offered, 60);
    assert_eq!(all.admitted + all.limit + all.other, 60);
    assert_eq!(all.admitted, 36);
    assert_eq!(run.offered.iter().sum::<u64>(), 60);
}

#[test]
fn a_failures_rule_is_charged_by_the_traces_status() {
    let cfg = config(
        "  - name: coupon\n    algorithm: fixed_window\n    limit: 3\n    window: 1m\n    count: failures\n",
    );
    let dir = support::scratch_dir("rw-sim-trace");
    let trace = dir.join("t.csv");
    // Three wrong codes, then a right one and more: only the wrong ones
    // count, and a success resets.
    std::fs::write(
        &trace,
        "t,identity,method,path,status\n0,u,POST,/c,400\n1,u,POST,/c,400\n2,u,POST,/c,400\n3,u,POST,/c,200\n4,u,POST,/c,400\n5,u,POST,/c,400\n6,u,POST,/c,400\n7,u,POST,/c,400\n",
    )
    .unwrap();
    let report = simulate::simulate(&cfg, &options(trace.to_str().unwrap(), None)).unwrap();
    let c = report.runs[0].1.total(0);
    // Three failures fill the limit: the 4th is refused before its
    // (right) code is tried, so nothing resets it, and so are the rest.
    assert_eq!((c.offered, c.admitted, c.limit), (8, 3, 5), "{c:?}");
    std::fs::remove_dir_all(dir).unwrap();
}

fn png_size(bytes: &[u8]) -> (u32, u32) {
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().unwrap();
    let mut buf = vec![
        0;
        reader
            .output_buffer_size()
            .expect("a size that fits in memory")
    ];
    let info = reader.next_frame(&mut buf).unwrap();
    assert!(buf.iter().any(|&b| b != 255), "an all-white picture");
    (info.width, info.height)
}

fn svg_size(text: &str) -> (u32, u32) {
    assert!(
        text.trim_start().starts_with("<svg"),
        "{}",
        &text[..80.min(text.len())]
    );
    assert!(text.trim_end().ends_with("</svg>"));
    let attr = |name: &str| -> u32 {
        let at = text.find(&format!("{name}=\"")).unwrap() + name.len() + 2;
        text[at..].split('"').next().unwrap().parse().unwrap()
    };
    (attr("width"), attr("height"))
}

#[test]
fn the_files_are_written_valid_and_of_the_expected_size() {
    let dir = support::scratch_dir("rw-sim-out");
    let cfg = config(
        "  - name: per-client\n    algorithm: gcra\n    limit: 5\n    window: 1s\n\
         \x20 - name: login\n    match: {path: /login}\n    algorithm: fixed_window\n    limit: 2\n    window: 10s\n",
    );
    let mut opts = options(
        "steady:rate=20,duration=20s+steady:rate=1,duration=20s,path=/login",
        Some(dir.to_path_buf()),
    );
    opts.compare = vec!["fixed_window".into(), "sliding_window_log".into()];
    let report = simulate::simulate(&cfg, &opts).unwrap();
    assert_eq!(report.runs.len(), 3);
    let names: Vec<String> = report
        .files
        .iter()
        .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for want in [
        "series.csv",
        "admitted.png",
        "admitted.svg",
        "retry_after.png",
        "retry_after.svg",
        "compare.png",
        "compare.svg",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    let read = |n: &str| std::fs::read(dir.join(n)).unwrap();
    assert_eq!(png_size(&read("admitted.png")), plot::grid_size(1, 2));
    assert_eq!(png_size(&read("compare.png")), plot::grid_size(2, 2));
    assert_eq!(png_size(&read("retry_after.png")), plot::RETRY_SIZE);
    let svg = |n: &str| String::from_utf8(read(n)).unwrap();
    assert_eq!(svg_size(&svg("admitted.svg")), plot::grid_size(1, 2));
    assert_eq!(svg_size(&svg("compare.svg")), plot::grid_size(2, 2));
    assert_eq!(svg_size(&svg("retry_after.svg")), plot::RETRY_SIZE);
    // The pictures name each rule and algorithm.
    let compare = svg("compare.svg");
    assert!(
        compare.contains("per-client (fixed_window)")
            && compare.contains("login (sliding_window_log)")
    );
    // Each label on its element's line, as viewers read it (no stray
    // spaces), and whole numbers without a fraction.
    assert!(
        compare.contains(">per-client (fixed_window)</text>") && compare.contains(">10</text>"),
        "text split over lines"
    );
    assert!(!compare.contains("\n</text>"), "text split over lines");
    // The table's columns line up whatever the run's name.
    let table = simulate::summary(&report.runs, std::time::Duration::from_secs(1));
    let at = |line: &str, word: &str| line.find(word).unwrap();
    let mut lines = table.lines().skip(1);
    let head = lines.next().unwrap();
    for row in lines {
        let rule = row.find(" per-client ").or(row.find(" login ")).unwrap() + 1;
        assert_eq!(rule, at(head, "rule"), "{table}");
    }
    // The series: a header and a line per run, rule and second, adding up
    // to the runs' totals.
    let csv = String::from_utf8(read("series.csv")).unwrap();
    let mut lines = csv.lines();
    assert!(
        lines
            .next()
            .unwrap()
            .starts_with("run,rule,algorithm,t,offered,admitted")
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert_eq!(rows.len(), 3 * 2 * 20);
    for (name, run) in &report.runs {
        for (r, rule) in run.rules.iter().enumerate() {
            let admitted: u64 = rows
                .iter()
                .filter(|row| row[0] == name && row[1] == rule)
                .map(|row| row[5].parse::<u64>().unwrap())
                .sum();
            assert_eq!(admitted, run.total(r).admitted, "{name} {rule}");
        }
    }
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn the_command_prints_the_table_and_refuses_a_bad_spec() {
    let dir = support::scratch_dir("rw-sim-cli");
    let conf = dir.join("c.yaml");
    std::fs::write(
        &conf,
        "rules:\n  - name: r\n    algorithm: gcra\n    limit: 2\n    window: 1s\n",
    )
    .unwrap();
    let bin = env!("CARGO_BIN_EXE_ratewarden");
    let out = std::process::Command::new(bin)
        .args([
            "simulate",
            "-c",
            conf.to_str().unwrap(),
            "--traffic",
            "steady:rate=4,duration=5s",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with("simulated 20 requests over 4.75 s"),
        "{text}"
    );
    let row = text
        .lines()
        .find(|l| l.starts_with("as configured"))
        .unwrap();
    let cols: Vec<&str> = row.split_whitespace().collect();
    // as configured | r | gcra | status | offered | admitted | limit ...
    assert_eq!(&cols[2..6], ["r", "gcra", "429", "20"], "{row}");
    let (admitted, limited): (u64, u64) = (cols[6].parse().unwrap(), cols[7].parse().unwrap());
    assert!(
        admitted > 0 && limited > 0 && admitted + limited == 20,
        "{row}"
    );
    let bad = std::process::Command::new(bin)
        .args([
            "simulate",
            "-c",
            conf.to_str().unwrap(),
            "--traffic",
            "steady:rat=4",
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown key `rat`"));
    // A step so small the series would not fit is refused, not allocated.
    let tiny = std::process::Command::new(bin)
        .args([
            "simulate",
            "-c",
            conf.to_str().unwrap(),
            "--traffic",
            "steady:rate=1,duration=1d",
            "--step",
            "1ms",
        ])
        .output()
        .unwrap();
    assert_eq!(tiny.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&tiny.stderr).contains("at most 1000000"),
        "{}",
        String::from_utf8_lossy(&tiny.stderr)
    );
    std::fs::remove_dir_all(dir).unwrap();
}

/// The Retry-After picture's buckets reach the longest wait and add up to
/// the rejections the table counts (the old picture stopped at 60 s and
/// piled every ban of minutes or hours into its last bar).
#[test]
fn the_retry_after_buckets_reach_the_longest_wait_and_add_up() {
    let cfg = config(
        "  - name: login\n    algorithm: fixed_window\n    limit: 2\n    window: 10s\n    penalty: {duration: 10m, multiplier: 4, max: 2h}\n",
    );
    let report = simulate::simulate(&cfg, &options("steady:rate=5,duration=120s", None)).unwrap();
    let run = &report.runs[0].1;
    let all: Vec<u32> = run.retry_after.iter().flatten().copied().collect();
    let longest = *all.iter().max().unwrap();
    assert!(longest > 60, "bans of minutes: {longest}");
    let buckets = plot::retry_buckets(&all);
    let rejected: u64 = run.series[0].iter().map(|c| c.rejected()).sum();
    assert_eq!(buckets.iter().map(|b| b.2).sum::<u64>(), rejected);
    assert_eq!(rejected as usize, all.len());
    let last = buckets.last().unwrap();
    assert!(
        last.0 <= longest && longest <= last.1,
        "{last:?} holds {longest}"
    );
}

/// Traffic can carry a host and headers (generator keys `host=` and
/// `header:NAME=`, JSONL fields `host` and `headers`), so rules that match
/// or key on them are simulated as the proxy would run them.
#[test]
fn hosts_and_headers_in_the_traffic_reach_the_rules() {
    let cfg = config(concat!(
        "  - name: pro\n    key: ['header:X-Api-Key']\n    algorithm: fixed_window\n    limit: 5\n    window: 1m\n",
        "    match: {hosts: [api.example.com], headers: [{name: X-Plan, exact: pro}]}\n",
    ));
    // 10 pro requests for the host over one key: 5 admitted, 5 refused;
    // the same without the header, or for another host: the rule is not theirs.
    let spec = "steady:rate=1,duration=10s,host=API.example.com,header:X-Plan=pro,header:X-Api-Key=k1\
                +steady:rate=1,duration=10s,host=api.example.com\
                +steady:rate=1,duration=10s,host=www.example.com,header:X-Plan=pro";
    let report = simulate::simulate(&cfg, &options(spec, None)).unwrap();
    let run = &report.runs[0].1;
    let offered: u64 = run.series[0].iter().map(|c| c.offered).sum();
    let admitted: u64 = run.series[0].iter().map(|c| c.admitted).sum();
    assert_eq!((offered, admitted), (10, 5), "{:?}", run.series[0]);
    // JSONL: two keys, each with its own 5.
    let dir = support::scratch_dir("rw-sim-hosts");
    let file = dir.join("t.jsonl");
    let mut lines = String::new();
    for i in 0..12 {
        let key = if i % 2 == 0 { "a" } else { "b" };
        lines.push_str(&format!(
            "{{\"t\": {i}, \"identity\": \"10.0.0.1\", \"path\": \"/\", \"host\": \"api.example.com\", \"headers\": {{\"X-Plan\": \"pro\", \"X-Api-Key\": \"{key}\"}}}}\n"
        ));
    }
    std::fs::write(&file, lines).unwrap();
    let report = simulate::simulate(&cfg, &options(file.to_str().unwrap(), None)).unwrap();
    let admitted: u64 = report.runs[0].1.series[0].iter().map(|c| c.admitted).sum();
    assert_eq!(admitted, 10);
}
