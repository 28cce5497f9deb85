//! `simulate`'s pictures: each replay handed to the `ratewarden-plot`
//! crate, which draws them (a crate of its own for the build's time; see
//! there).

use std::path::{Path, PathBuf};

pub use ratewarden_plot::{PANEL_H, PANEL_W, RETRY_SIZE, grid_size, retry_buckets};
use ratewarden_plot::{Replay, Step};

use super::run::Run;

/// `run`'s series as the pictures take them.
fn steps(run: &Run) -> Vec<Vec<Step>> {
    run.series
        .iter()
        .map(|rule| {
            rule.iter()
                .map(|c| Step {
                    offered: c.offered,
                    admitted: c.admitted,
                    rejected: c.rejected(),
                })
                .collect()
        })
        .collect()
}

fn replay<'a>(run: &'a Run, series: &'a [Vec<Step>]) -> Replay<'a> {
    Replay {
        rules: &run.rules,
        algorithms: &run.algorithms,
        step: run.step,
        series,
        retry_after: &run.retry_after,
    }
}

/// `admitted.{png,svg}`: the configured run.
pub fn admitted(dir: &Path, run: &Run) -> Result<Vec<PathBuf>, String> {
    let series = steps(run);
    ratewarden_plot::admitted(dir, &replay(run, &series))
}

/// `compare.{png,svg}`: the same traffic under each algorithm.
pub fn compare(dir: &Path, runs: &[&Run]) -> Result<Vec<PathBuf>, String> {
    let series: Vec<Vec<Vec<Step>>> = runs.iter().map(|r| steps(r)).collect();
    let replays: Vec<Replay<'_>> = runs
        .iter()
        .zip(&series)
        .map(|(r, s)| replay(r, s))
        .collect();
    let refs: Vec<&Replay<'_>> = replays.iter().collect();
    ratewarden_plot::compare(dir, &refs)
}

/// `retry_after.{png,svg}`.
pub fn retry_after(dir: &Path, run: &Run) -> Result<Vec<PathBuf>, String> {
    ratewarden_plot::retry_after(dir, &replay(run, &[]))
}
