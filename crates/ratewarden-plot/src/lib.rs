//! `ratewarden simulate`'s pictures, each as PNG and SVG: admitted against
//! offered over time per rule; with `--compare`, one column per algorithm;
//! the distribution of Retry-After. The gateway's `simulate` replays the
//! traffic and hands each replay over as a [`Replay`].
//!
//! PNGs are drawn into an RGB buffer and encoded by `png`; text uses an
//! embedded DejaVu Sans Mono (no system fonts needed; its licence is
//! `assets/DejaVu-LICENSE`).
//!
//! A crate of its own for the build's time (issue 38): plotters' generic
//! drawing code is instantiated here, beside the rest of the build and at
//! `opt-level = 1` (the workspace's profile), not at the end of the
//! gateway crate's compile. A picture is drawn once per `simulate --out`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use plotters::coord::Shift;
use plotters::prelude::*;

/// One replay as the pictures draw it.
#[derive(Debug, Clone, Copy)]
pub struct Replay<'a> {
    /// The rules' names, in order.
    pub rules: &'a [String],
    /// Their algorithms' names.
    pub algorithms: &'a [String],
    /// The step of the series.
    pub step: Duration,
    /// Per rule, per step.
    pub series: &'a [Vec<Step>],
    /// The Retry-After (whole seconds) of each request a rule refused,
    /// per rule.
    pub retry_after: &'a [Vec<u32>],
}

/// One step of one rule's series: its requests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Step {
    /// Offered (the rule applied).
    pub offered: u64,
    /// Admitted.
    pub admitted: u64,
    /// Refused by the rule (its limit, a ban, its minimum interval).
    pub rejected: u64,
}

/// Width of one panel, in pixels.
pub const PANEL_W: u32 = 640;
/// Height of one panel.
pub const PANEL_H: u32 = 280;

const FONT: &str = "sans-serif";

fn font() -> Result<(), String> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        plotters::style::register_font(
            FONT,
            FontStyle::Normal,
            include_bytes!("../assets/DejaVuSansMono.ttf"),
        )
        .map_err(|_| "the embedded font does not load".to_owned())
    })
    .clone()
}

type Draw<'a> = dyn Fn(&DrawingArea<BitMapBackend<'_>, Shift>) -> Result<(), String> + 'a;
type DrawSvg<'a> = dyn Fn(&DrawingArea<SVGBackend<'_>, Shift>) -> Result<(), String> + 'a;

/// Draws one picture as `name.png` and `name.svg` in `dir`, `size` pixels.
fn both(
    dir: &Path,
    name: &str,
    size: (u32, u32),
    png: &Draw<'_>,
    svg: &DrawSvg<'_>,
) -> Result<Vec<PathBuf>, String> {
    font()?;
    let mut rgb = vec![0u8; (size.0 * size.1 * 3) as usize];
    {
        let area = BitMapBackend::with_buffer(&mut rgb, size).into_drawing_area();
        png(&area)?;
        area.present().map_err(|e| e.to_string())?;
    }
    let png_path = dir.join(format!("{name}.png"));
    write_png(&png_path, size, &rgb)?;
    let svg_path = dir.join(format!("{name}.svg"));
    let mut text = String::new();
    {
        let area = SVGBackend::with_string(&mut text, size).into_drawing_area();
        svg(&area)?;
        area.present().map_err(|e| e.to_string())?;
    }
    std::fs::write(&svg_path, tight_text(&text))
        .map_err(|e| format!("{}: {e}", svg_path.display()))?;
    Ok(vec![png_path, svg_path])
}

/// The SVG with each `<text>`'s content on its element's line: plotters
/// writes it between newlines, which viewers and text extractors read as
/// spaces ("per- api- key", "100. 0").
fn tight_text(svg: &str) -> String {
    let mut out = String::with_capacity(svg.len());
    let mut rest = svg;
    while let Some(at) = rest.find("<text") {
        let Some(open_end) = rest[at..].find('>').map(|i| at + i + 1) else {
            break;
        };
        let Some(close) = rest[open_end..].find("</text>").map(|i| open_end + i) else {
            break;
        };
        out.push_str(&rest[..open_end]);
        out.push_str(rest[open_end..close].trim());
        rest = &rest[close..];
        let end = "</text>".len();
        out.push_str(&rest[..end]);
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// An axis label: a whole number without a decimal point, else one
/// decimal.
fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{}", v as i64)
    } else {
        format!("{v:.1}")
    }
}

fn write_png(path: &Path, (w, h): (u32, u32), rgb: &[u8]) -> Result<(), String> {
    let file = std::fs::File::create(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut enc = png::Encoder::new(std::io::BufWriter::new(file), w, h);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| e.to_string())?;
    w.write_image_data(rgb).map_err(|e| e.to_string())
}

/// Per-second rates of one rule in one run: (t, offered, admitted,
/// rejected).
fn rates(run: &Replay<'_>, rule: usize) -> Vec<(f64, f64, f64, f64)> {
    let step = run.step.as_secs_f64();
    run.series[rule]
        .iter()
        .enumerate()
        .map(|(i, c)| {
            (
                i as f64 * step,
                c.offered as f64 / step,
                c.admitted as f64 / step,
                c.rejected as f64 / step,
            )
        })
        .collect()
}

/// One panel: a rule's offered, admitted and rejected requests/s.
fn panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    title: &str,
    points: &[(f64, f64, f64, f64)],
    x_max: f64,
    y_max: f64,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let mut chart = ChartBuilder::on(area)
        .caption(title, (FONT, 16))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max.max(1e-3), 0f64..(y_max * 1.1).max(1.0))
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("time (s)")
        .y_desc("requests/s")
        .x_label_formatter(&|v| number(*v))
        .y_label_formatter(&|v| number(*v))
        .label_style((FONT, 12))
        .draw()
        .map_err(err)?;
    let series = [
        ("offered", RGBColor(150, 150, 150), 1usize),
        ("admitted", RGBColor(31, 119, 180), 2),
        ("rejected", RGBColor(214, 39, 40), 3),
    ];
    for (label, colour, field) in series {
        chart
            .draw_series(LineSeries::new(
                points.iter().map(|p| {
                    let y = match field {
                        1 => p.1,
                        2 => p.2,
                        _ => p.3,
                    };
                    (p.0, y)
                }),
                colour.stroke_width(2),
            ))
            .map_err(err)?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 12))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()
        .map_err(err)?;
    Ok(())
}

/// The bounds shared by every panel of a picture, so they compare.
fn bounds(runs: &[&Replay<'_>]) -> (f64, f64) {
    let mut x: f64 = 0.0;
    let mut y: f64 = 0.0;
    for run in runs {
        for rule in 0..run.rules.len() {
            for p in rates(run, rule) {
                x = x.max(p.0 + run.step.as_secs_f64());
                y = y.max(p.1);
            }
        }
    }
    (x, y)
}

/// Panels: a row per rule, a column per run (the configured one alone,
/// or one per compared algorithm).
fn grid<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    runs: &[&Replay<'_>],
) -> Result<(), String> {
    area.fill(&WHITE).map_err(|e| e.to_string())?;
    let (x_max, y_max) = bounds(runs);
    let rows = drawn(runs);
    let cells = area.split_evenly((rows.len().max(1), runs.len().max(1)));
    for (c, run) in runs.iter().enumerate() {
        for (row, &rule) in rows.iter().enumerate() {
            let title = format!("{} ({})", run.rules[rule], run.algorithms[rule]);
            let cell = &cells[row * runs.len() + c];
            panel(cell, &title, &rates(run, rule), x_max, y_max)?;
        }
    }
    Ok(())
}

/// The rules drawn: those the traffic reached (a rule no request fell
/// under would be a panel of zeros).
pub fn drawn(runs: &[&Replay<'_>]) -> Vec<usize> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    (0..first.rules.len())
        .filter(|&r| first.series[r].iter().any(|c| c.offered > 0))
        .collect()
}

/// The size of a grid picture of `runs` runs of `rules` rules drawn.
pub fn grid_size(runs: usize, rules: usize) -> (u32, u32) {
    (PANEL_W * runs.max(1) as u32, PANEL_H * rules.max(1) as u32)
}

/// `admitted.{png,svg}`: the configured run.
pub fn admitted(dir: &Path, run: &Replay<'_>) -> Result<Vec<PathBuf>, String> {
    let size = grid_size(1, drawn(&[run]).len());
    both(dir, "admitted", size, &|a| grid(a, &[run]), &|a| {
        grid(a, &[run])
    })
}

/// `compare.{png,svg}`: the same traffic under each algorithm.
pub fn compare(dir: &Path, runs: &[&Replay<'_>]) -> Result<Vec<PathBuf>, String> {
    let size = grid_size(runs.len(), drawn(runs).len());
    both(dir, "compare", size, &|a| grid(a, runs), &|a| grid(a, runs))
}

/// Retry-After values (whole seconds) in buckets that reach the largest:
/// one per second up to 30 s; past that, one per second below 10 s, then
/// ranges doubling (10-19, 20-39, 40-79, ...) until the largest value is in
/// one. `(from, to, count)`, `to` inclusive; the counts add up to
/// `values.len()` (the old picture stopped at 60 s and piled every longer
/// wait into its last bar).
///
/// ```
/// use ratewarden_plot::retry_buckets;
/// let b = retry_buckets(&[0, 1, 1, 859, 4748]);
/// assert_eq!(b.iter().map(|x| x.2).sum::<u64>(), 5);
/// assert!(b.last().unwrap().1 >= 4748);
/// assert_eq!(b[1], (1, 1, 2));
/// ```
pub fn retry_buckets(values: &[u32]) -> Vec<(u32, u32, u64)> {
    let top = values.iter().copied().max().unwrap_or(0);
    let mut edges: Vec<(u32, u32)> = if top <= 30 {
        (0..=top).map(|s| (s, s)).collect()
    } else {
        let mut e: Vec<(u32, u32)> = (0..10).map(|s| (s, s)).collect();
        let mut from = 10u32;
        while from <= top {
            let to = from.saturating_mul(2).saturating_sub(1).max(from);
            e.push((from, to));
            if to == u32::MAX {
                break;
            }
            from = to + 1;
        }
        e
    };
    if edges.is_empty() {
        edges.push((0, 0));
    }
    let mut counts = vec![0u64; edges.len()];
    for v in values {
        let i = edges.partition_point(|(_, to)| to < v).min(edges.len() - 1);
        counts[i] += 1;
    }
    edges
        .into_iter()
        .zip(counts)
        .map(|((f, t), n)| (f, t, n))
        .collect()
}

/// The Retry-After histogram, in [`retry_buckets`].
fn retry_hist<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    run: &Replay<'_>,
) -> Result<(), String> {
    let err = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(|e| e.to_string())?;
    let all: Vec<u32> = run.retry_after.iter().flatten().copied().collect();
    let bins = retry_buckets(&all);
    let labels: Vec<String> = bins.iter().map(|(f, _, _)| f.to_string()).collect();
    let y_max = bins.iter().map(|b| b.2).max().unwrap_or(0).max(1);
    let n = bins.len() as u32;
    let mut chart = ChartBuilder::on(area)
        .caption("Retry-After of rejected requests", (FONT, 16))
        .margin(8)
        .x_label_area_size(32)
        .y_label_area_size(64)
        .build_cartesian_2d((0u32..n).into_segmented(), 0u64..y_max + y_max / 10 + 1)
        .map_err(err)?;
    let label = |v: &SegmentValue<u32>| match v {
        SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
            labels.get(*i as usize).cloned().unwrap_or_default()
        }
        SegmentValue::Last => String::new(),
    };
    chart
        .configure_mesh()
        .x_desc("Retry-After (s): each bar from its label to the next one's")
        .y_desc("requests")
        .x_labels(bins.len().min(16))
        .x_label_formatter(&label)
        .label_style((FONT, 12))
        .draw()
        .map_err(err)?;
    chart
        .draw_series(
            Histogram::vertical(&chart)
                .style(RGBColor(214, 39, 40).filled())
                .margin(2)
                .data(bins.iter().enumerate().map(|(i, b)| (i as u32, b.2))),
        )
        .map_err(err)?;
    Ok(())
}

/// The size of the Retry-After picture.
pub const RETRY_SIZE: (u32, u32) = (PANEL_W, PANEL_H + 40);

/// `retry_after.{png,svg}`.
pub fn retry_after(dir: &Path, run: &Replay<'_>) -> Result<Vec<PathBuf>, String> {
    both(
        dir,
        "retry_after",
        RETRY_SIZE,
        &|a| retry_hist(a, run),
        &|a| retry_hist(a, run),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_sits_on_its_elements_line_and_labels_drop_a_zero_fraction() {
        let svg = "<svg>\n<text x=\"1\">\nper-api-key (fixed_window)\n</text>\n<text y=\"2\">\n100\n</text>\n</svg>";
        let tight = tight_text(svg);
        assert!(
            tight.contains(">per-api-key (fixed_window)</text>"),
            "{tight}"
        );
        assert!(tight.contains(">100</text>"), "{tight}");
        assert_eq!(number(100.0), "100");
        assert_eq!(number(2.5), "2.5");
    }
}
