//! `idem bench --plot FILE.svg`: p50 and p99 against live records, one panel for first
//! executions and one for replays, both axes logarithmic; idem solid, the bare engine operations
//! dashed.

use std::path::Path;

use plotters::prelude::*;

use super::saturation::{Level, Pair};
use super::{BenchReport, Comparison, Point, SaturationReport};

/// Draws `reports` (one store and concurrency each) into the SVG file `path`.
pub fn plot(path: &Path, reports: &[BenchReport]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (1200, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let panels = root.split_evenly((1, 2));
    type Pick = fn(&Point) -> Comparison;
    let kinds: [(&str, Pick); 2] = [
        ("first execution (claim + complete)", |p| p.first),
        ("replay (claim of a completed key)", |p| p.replay),
    ];
    let records = |p: &Point| p.records.max(1) as f64;
    let all_records = || reports.iter().flat_map(|r| r.points.iter().map(records));
    let x_max = all_records().fold(10.0, f64::max) * 2.0;
    let x_min = all_records().fold(x_max, f64::min) / 2.0;
    for (panel, (title, pick)) in panels.iter().zip(kinds) {
        // Logarithmic latency: p50 and p99 differ by an order of magnitude or more, and a linear
        // axis squashes the p50 lines.
        let values = || {
            reports
                .iter()
                .flat_map(|r| r.points.iter().map(pick))
                .flat_map(|c| [c.idem.p50, c.raw.p50, c.idem.p99, c.raw.p99])
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        let y_max = values().fold(1.0, f64::max) * 1.5;
        let y_min = values().fold(y_max, f64::min) / 1.5;
        let axes = ("live records", "latency µs");
        let mut chart =
            log_log(panel, title, (x_min..x_max, y_min..y_max), axes, 56).map_err(|e| err(&e))?;
        for (i, r) in reports.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            let name = format!("{} ×{}", r.engine, r.concurrency);
            type Get = fn(&Comparison) -> f64;
            let lines: [(&str, Get, bool, u32); 4] = [
                ("idem p50", |c| c.idem.p50, true, 2),
                ("idem p99", |c| c.idem.p99, true, 1),
                ("raw p50", |c| c.raw.p50, false, 2),
                ("raw p99", |c| c.raw.p99, false, 1),
            ];
            for (label, get, solid, width) in lines {
                let data: Vec<(f64, f64)> = r
                    .points
                    .iter()
                    .map(|p| (records(p), get(&pick(p))))
                    .filter(|(_, y)| y.is_finite())
                    .collect();
                let style = color.stroke_width(width);
                let legend = format!("{name} {label}");
                line(&mut chart, &data, style, legend, solid).map_err(|e| err(&e))?;
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperLeft).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// `idem bench --saturation … --plot FILE.svg`: operations per second against callers, one panel
/// for first executions and one for replays, both axes logarithmic; idem solid, the bare engine
/// statements dashed, one colour per report (engine).
pub fn plot_saturation(path: &Path, reports: &[SaturationReport]) -> Result<(), String> {
    let err = |e: &dyn std::fmt::Display| format!("plot {}: {e}", path.display());
    let root = SVGBackend::new(path, (1200, 560)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let panels = root.split_evenly((1, 2));
    type Pick = fn(&Level) -> Pair;
    let kinds: [(&str, Pick); 2] = [
        ("first executions per second", |l| l.first_execution),
        ("replays per second", |l| l.replay),
    ];
    let callers = || {
        reports
            .iter()
            .flat_map(|r| r.levels.iter().map(|l| l.callers as f64))
    };
    let x_max = callers().fold(1.0, f64::max) * 1.5;
    let x_min = callers().fold(x_max, f64::min) / 1.5;
    for (panel, (title, pick)) in panels.iter().zip(kinds) {
        let values = || {
            reports
                .iter()
                .flat_map(|r| r.levels.iter().map(pick))
                .flat_map(|p| [p.idem.ops_per_s, p.raw.ops_per_s])
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        let y_max = values().fold(1.0, f64::max) * 2.0;
        let y_min = values().fold(y_max, f64::min) / 2.0;
        let axes = ("concurrent callers", "operations / s");
        let mut chart =
            log_log(panel, title, (x_min..x_max, y_min..y_max), axes, 64).map_err(|e| err(&e))?;
        for (i, r) in reports.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            type Get = fn(&Pair) -> f64;
            let lines: [(&str, Get, bool); 2] = [
                ("idem", |p| p.idem.ops_per_s, true),
                ("raw", |p| p.raw.ops_per_s, false),
            ];
            for (label, get, solid) in lines {
                let data: Vec<(f64, f64)> = r
                    .levels
                    .iter()
                    .map(|l| (l.callers as f64, get(&pick(l))))
                    .filter(|(_, y)| y.is_finite() && *y > 0.0)
                    .collect();
                let style = color.stroke_width(2);
                let legend = format!("{} {label}", r.engine);
                line(&mut chart, &data, style, legend, solid).map_err(|e| err(&e))?;
            }
        }
        legend(&mut chart, SeriesLabelPosition::LowerRight).map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))
}

/// One line of a log-log chart, solid or dashed, with its points and its legend entry.
fn line<DB: DrawingBackend>(
    chart: &mut LogLog<'_, DB>,
    data: &[(f64, f64)],
    style: ShapeStyle,
    legend: String,
    solid: bool,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let drawn = if solid {
        chart.draw_series(LineSeries::new(data.to_vec(), style))?
    } else {
        chart.draw_series(DashedLineSeries::new(data.to_vec(), 6, 4, style))?
    };
    let sample = if solid { 16 } else { 6 };
    drawn
        .label(legend)
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + sample, y)], style));
    chart.draw_series(
        data.iter()
            .map(|&(x, y)| Circle::new((x, y), 2, style.filled())),
    )?;
    Ok(())
}

/// A panel with logarithmic axes over `x` and `y`, captioned and labelled, its mesh drawn.
fn log_log<'a, DB: DrawingBackend>(
    panel: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    (x, y): (std::ops::Range<f64>, std::ops::Range<f64>),
    (x_desc, y_desc): (&str, &str),
    y_label_width: u32,
) -> Result<LogLog<'a, DB>, DrawingAreaErrorKind<DB::ErrorType>> {
    let mut chart = ChartBuilder::on(panel)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(y_label_width)
        .build_cartesian_2d(x.log_scale(), y.log_scale())?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_label_formatter(&|x| format!("{x:.0}"))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .draw()?;
    Ok(chart)
}

/// A chart whose axes are both logarithmic.
type LogLog<'a, DB> = ChartContext<'a, DB, Cartesian2d<LogCoord<f64>, LogCoord<f64>>>;

/// The chart's legend box at `position`.
fn legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut LogLog<'a, DB>,
    position: SeriesLabelPosition,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 11))
        .position(position)
        .draw()
}
