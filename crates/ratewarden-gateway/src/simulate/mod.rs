//! `ratewarden simulate`: what the configured rules (or other algorithms,
//! with `--compare`) do to a traffic pattern, replayed through the real
//! admission path on a manual clock. Writes a time series per rule as CSV,
//! pictures as PNG and SVG, and prints a summary table.

pub mod plot;
pub mod run;
pub mod traffic;

use std::fmt::Write as _;
use std::io::IsTerminal as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use ratewarden::Rule;
use ratewarden::algorithm::Kind;
use ratewarden_tower::policy::Policy;

pub use run::{Counts, Run};
pub use traffic::Traffic;

use crate::config::Config;

/// Steps a series may have, at most (each is a row per rule in memory and
/// in `series.csv`).
pub const MAX_STEPS: u64 = 1_000_000;

/// What to simulate.
#[derive(Debug, Clone)]
pub struct Options {
    /// `--traffic`: a trace file or a generator spec.
    pub traffic: String,
    /// `--compare`: algorithms to replay the traffic under as well, each
    /// replacing every rule's.
    pub compare: Vec<String>,
    /// `--out`: where files go; none written without it.
    pub out: Option<PathBuf>,
    /// `--step`: the series' resolution (default: about 120 steps).
    pub step: Option<Duration>,
    /// Draw a progress bar (on a terminal).
    pub progress: bool,
}

/// What a simulation made.
#[derive(Debug)]
pub struct Report {
    /// The configured rules' run, then one per compared algorithm.
    pub runs: Vec<(String, Run)>,
    /// The files written.
    pub files: Vec<PathBuf>,
    /// Replay time (all runs), without reading the traffic or drawing.
    pub replay_time: Duration,
    /// The table printed at the end.
    pub summary: String,
}

/// Runs a simulation of `config`'s rules.
pub fn simulate(config: &Config, opts: &Options) -> Result<Report, String> {
    let traffic = traffic::load(&opts.traffic)?;
    if traffic.events.is_empty() {
        return Err("the traffic has no requests".into());
    }
    let step = opts.step.unwrap_or_else(|| nice_step(traffic.span()));
    let steps = traffic.span() / u64::try_from(step.as_micros()).unwrap_or(u64::MAX).max(1);
    if steps > MAX_STEPS {
        return Err(format!(
            "--step {step:?} makes {steps} steps of a {:?} traffic: at most {MAX_STEPS}",
            Duration::from_micros(traffic.span())
        ));
    }
    let mut policies = vec![("as configured".to_owned(), config.policy.clone())];
    for name in &opts.compare {
        let kind: Kind = name.parse()?;
        policies.push((name.clone(), with_algorithm(&config.policy, kind)?));
    }
    let total = traffic.events.len() as u64 * policies.len() as u64;
    let mut bar = Progress::new(total, opts.progress && std::io::stderr().is_terminal());
    let started = Instant::now();
    let mut runs = Vec::new();
    for (name, policy) in &policies {
        let base = bar.done;
        let run = run::replay(policy, &config.routes, &traffic, step, &mut |n| {
            bar.show(base + n)
        })?;
        bar.done = base + run.requests;
        let mut run = run;
        let default = config.status.as_u16();
        run.statuses = policy
            .rules
            .iter()
            .map(|r| r.rule.spec().status.unwrap_or(default))
            .collect();
        runs.push((name.clone(), run));
    }
    let replay_time = started.elapsed();
    bar.finish();
    let mut files = Vec::new();
    if let Some(dir) = &opts.out {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        files.push(write_csv(dir, &runs)?);
        files.extend(plot::admitted(dir, &runs[0].1)?);
        files.extend(plot::retry_after(dir, &runs[0].1)?);
        if runs.len() > 1 {
            let compared: Vec<&Run> = runs[1..].iter().map(|(_, r)| r).collect();
            files.extend(plot::compare(dir, &compared)?);
        }
    }
    let summary = summary(&runs, replay_time);
    Ok(Report {
        runs,
        files,
        replay_time,
        summary,
    })
}

/// `policy` with every rule under `kind`, keeping its limit, window and
/// modifiers; an option `kind` does not take (a `burst` for a window
/// algorithm, `mode: delay` outside `leaky_bucket`) is dropped.
pub fn with_algorithm(policy: &Policy, kind: Kind) -> Result<Policy, String> {
    let mut out = policy.clone();
    for r in &mut out.rules {
        let mut spec = r.rule.spec().clone();
        spec.algorithm = kind;
        let mut tries = 0;
        r.rule = loop {
            match Rule::new(spec.clone()) {
                Ok(rule) => break rule,
                Err(ratewarden::RuleError::NotApplicable { key, .. }) if tries < 8 => {
                    tries += 1;
                    match key {
                        "burst" => spec.burst = None,
                        "mode" | "max_delay" => spec.max_delay = None,
                        "max_hold" => spec.max_hold = None,
                        "min_interval" => spec.min_interval = None,
                        "penalty" => spec.penalty = None,
                        _ => {
                            return Err(format!(
                                "rule `{}` cannot run under {}: `{key}` does not apply",
                                spec.name,
                                kind.name()
                            ));
                        }
                    }
                }
                Err(e) => {
                    return Err(format!(
                        "rule `{}` cannot run under {}: {e}",
                        spec.name,
                        kind.name()
                    ));
                }
            }
        };
    }
    Ok(out)
}

/// About 120 steps over `span` µs, rounded to 1, 2 or 5 times a power of
/// ten milliseconds.
fn nice_step(span: u64) -> Duration {
    let want = (span / 120).max(1000);
    let mut unit = 1000u64;
    loop {
        for m in [1, 2, 5] {
            if unit * m >= want {
                return Duration::from_micros(unit * m);
            }
        }
        unit *= 10;
    }
}

/// `series.csv`: a line per run, rule and step.
fn write_csv(dir: &Path, runs: &[(String, Run)]) -> Result<PathBuf, String> {
    let mut s = String::from(
        "run,rule,algorithm,t,offered,admitted,rejected_limit,rejected_banned,rejected_min_interval,refused_by_other\n",
    );
    for (name, run) in runs {
        let step = run.step.as_secs_f64();
        for (r, series) in run.series.iter().enumerate() {
            for (i, c) in series.iter().enumerate() {
                let _ = writeln!(
                    s,
                    "{name},{},{},{},{},{},{},{},{},{}",
                    run.rules[r],
                    run.algorithms[r],
                    i as f64 * step,
                    c.offered,
                    c.admitted,
                    c.limit,
                    c.banned,
                    c.min_interval,
                    c.other
                );
            }
        }
    }
    let path = dir.join("series.csv");
    std::fs::write(&path, s).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// The `q`-quantile of `v` (sorted in place).
fn quantile(v: &mut [u32], q: f64) -> Option<u32> {
    if v.is_empty() {
        return None;
    }
    v.sort_unstable();
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    Some(v[i])
}

/// The summary table.
pub fn summary(runs: &[(String, Run)], took: Duration) -> String {
    let requests: u64 = runs.iter().map(|(_, r)| r.requests).sum();
    let mut s = String::new();
    if let Some((_, first)) = runs.first() {
        let rate = requests as f64 / took.as_secs_f64().max(1e-9);
        let _ = writeln!(
            s,
            "simulated {} requests over {:.2} s{} in {:.2} s ({})",
            first.requests,
            first.span.as_secs_f64(),
            if runs.len() > 1 {
                format!(", under {} rule sets", runs.len())
            } else {
                String::new()
            },
            took.as_secs_f64(),
            if rate >= 1e6 {
                format!("{:.2}M requests/s", rate / 1e6)
            } else {
                format!("{rate:.0} requests/s")
            },
        );
    }
    // Each text column as wide as its longest entry (a run named
    // `sliding_window_log`, a long rule name), at least its heading's.
    let widest = |min: usize, items: &mut dyn Iterator<Item = usize>| items.fold(min, usize::max);
    let w_run = widest(16, &mut runs.iter().map(|(name, _)| name.len()));
    let w_rule = widest(
        20,
        &mut runs
            .iter()
            .flat_map(|(_, r)| r.rules.iter().map(|n| n.len())),
    );
    let w_alg = widest(
        24,
        &mut runs
            .iter()
            .flat_map(|(_, r)| r.algorithms.iter().map(|n| n.len())),
    );
    let _ = writeln!(
        s,
        "{:<w_run$} {:<w_rule$} {:<w_alg$} {:>6} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>9} {:>11}",
        "run",
        "rule",
        "algorithm",
        "status",
        "offered",
        "admitted",
        "limit",
        "banned",
        "min_gap",
        "other",
        "admitted%",
        "retry p50/99"
    );
    for (name, run) in runs {
        for r in 0..run.rules.len() {
            let c = run.total(r);
            let mut retry = run.retry_after[r].clone();
            let p50 = quantile(&mut retry, 0.5);
            let p99 = quantile(&mut retry, 0.99);
            let pct = if c.offered == 0 {
                0.0
            } else {
                100.0 * c.admitted as f64 / c.offered as f64
            };
            let _ = writeln!(
                s,
                "{:<w_run$} {:<w_rule$} {:<w_alg$} {:>6} {:>10} {:>10} {:>10} {:>8} {:>8} {:>8} {:>8.1}% {:>11}",
                name,
                run.rules[r],
                run.algorithms[r],
                run.statuses.get(r).copied().unwrap_or(429),
                c.offered,
                c.admitted,
                c.limit,
                c.banned,
                c.min_interval,
                c.other,
                pct,
                match (p50, p99) {
                    (Some(a), Some(b)) => format!("{a}s/{b}s"),
                    _ => "-".into(),
                }
            );
        }
        if run.refused_otherwise > 0 {
            let _ = writeln!(
                s,
                "{name:<w_run$} (refused before any rule: denied or without an identity: {})",
                run.refused_otherwise
            );
        }
    }
    s
}

/// A progress bar on standard error, drawn at most ten times a second
/// and only once a run has taken half a second.
struct Progress {
    total: u64,
    done: u64,
    on: bool,
    started: Instant,
    drawn: Option<Instant>,
}

impl Progress {
    fn new(total: u64, on: bool) -> Self {
        Self {
            total,
            done: 0,
            on,
            started: Instant::now(),
            drawn: None,
        }
    }

    fn show(&mut self, done: u64) {
        if !self.on || self.started.elapsed() < Duration::from_millis(500) {
            return;
        }
        if self
            .drawn
            .is_some_and(|d| d.elapsed() < Duration::from_millis(100))
        {
            return;
        }
        self.drawn = Some(Instant::now());
        let frac = done as f64 / self.total.max(1) as f64;
        let filled = (frac * 40.0) as usize;
        eprint!(
            "\r[{}{}] {:>5.1}% {}/{} requests",
            "#".repeat(filled),
            " ".repeat(40 - filled.min(40)),
            frac * 100.0,
            done,
            self.total
        );
    }

    fn finish(&self) {
        if self.drawn.is_some() {
            eprintln!();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_round_and_about_120_to_a_run() {
        assert_eq!(nice_step(60_000_000), Duration::from_millis(500));
        assert_eq!(nice_step(10_000), Duration::from_millis(1));
        assert_eq!(nice_step(3_600_000_000), Duration::from_secs(50));
    }
}
