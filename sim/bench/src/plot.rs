//! PNG line charts drawn by the benchmarks themselves (plotters, bitmap backend).
//!
//! Text is drawn by `ab_glyph` from a font embedded in the binary (`fonts/`, a 21 KB subset of
//! DejaVu Sans), so that a fresh machine with only the Rust toolchain draws the same pictures: no
//! fontconfig, no freetype. Log axes are drawn as linear axes over `log10` of the values, with the
//! tick labels turned back into values; that keeps one coordinate type for every chart.
//!
//! - [`line_chart`] / [`panels`]: one chart, or several stacked in one PNG.
//! - [`latency_curve`], [`latency_plots`]: latency against percentile from the HDR histograms of
//!   `alloc-bench`, echo next to the AllocSvr.
//!
//! Deliberately left out: SVG, interactive output, colour schemes beyond one fixed palette.

use std::path::{Path, PathBuf};
use std::sync::Once;

use hdrhistogram::Histogram;
use plotters::coord::types::RangedCoordf64;
use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::{FontStyle, register_font};

use crate::report::Case;

/// The embedded font (see `fonts/README.md`); registered as "sans-serif" on first use.
static FONT: &[u8] = include_bytes!("../fonts/DejaVuSans-subset.ttf");
/// Family name the charts ask for.
const FAMILY: &str = "sans-serif";
/// One panel's size in pixels; small enough that a PNG stays well under 200 KB.
const PANEL: (u32, u32) = (900, 480);
/// Distinct, print-safe colours (Okabe–Ito), cycled by [`Series::color`].
const PALETTE: [RGBColor; 8] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(0, 0, 0),
];

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    Linear,
    /// Decades; values <= 0 are not drawn.
    Log10,
    /// Doublings (1, 2, 4, …); values <= 0 are not drawn.
    Log2,
    /// Quantiles `q` in [0, 1) placed at `-log10(1 - q)`: p0, p90, p99, p99.9 equally spaced.
    Percentile,
}

impl Scale {
    fn to_axis(self, v: f64) -> Option<f64> {
        let a = match self {
            Scale::Linear => v,
            Scale::Log10 if v > 0.0 => v.log10(),
            Scale::Log2 if v > 0.0 => v.log2(),
            Scale::Percentile if (0.0..1.0).contains(&v) => -(1.0 - v).log10(),
            _ => return None,
        };
        a.is_finite().then_some(a)
    }

    /// A tick label for axis position `a`.
    fn label(self, a: f64) -> String {
        match self {
            Scale::Linear => short(a),
            Scale::Log10 if (a - a.round()).abs() < 1e-9 => pow10(a.round() as i32),
            Scale::Log10 => short(10f64.powf(a)),
            Scale::Log2 => short(2f64.powf(a)),
            Scale::Percentile => {
                let p = 100.0 * (1.0 - 10f64.powf(-a));
                format!("p{}", trim(&format!("{p:.4}")))
            }
        }
    }
}

/// Where a chart's legend goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Corner {
    UpperLeft,
    UpperRight,
    LowerLeft,
    LowerRight,
}

/// Titles and axes of one chart.
#[derive(Debug, Clone)]
pub struct Chart {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x: Scale,
    pub y: Scale,
    pub legend: Corner,
}

/// One named line.
#[derive(Debug, Clone)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
    /// Index into the palette (cycled).
    pub color: usize,
    pub dashed: bool,
}

impl Series {
    pub fn new(name: impl Into<String>, color: usize, points: Vec<(f64, f64)>) -> Self {
        Self {
            name: name.into(),
            points,
            color,
            dashed: false,
        }
    }

    pub fn dashed(mut self) -> Self {
        self.dashed = true;
        self
    }
}

/// Writes one chart to the PNG at `path`.
pub fn line_chart(path: &Path, chart: &Chart, series: &[Series]) -> Result<(), String> {
    panels(path, &[(chart.clone(), series.to_vec())])
}

/// Writes the charts stacked top to bottom into one PNG at `path`.
pub fn panels(path: &Path, charts: &[(Chart, Vec<Series>)]) -> Result<(), String> {
    if charts.is_empty() {
        return Err("no chart to draw".into());
    }
    register();
    let size = (PANEL.0, PANEL.1 * charts.len() as u32);
    let root = BitMapBackend::new(path, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    for (area, (chart, series)) in root.split_evenly((charts.len(), 1)).iter().zip(charts) {
        draw(area, chart, series).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    root.present().map_err(|e| format!("{}: {e}", path.display()))
}

fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // The bytes are a valid TrueType file checked in with the crate; a failure is a build bug.
        if register_font(FAMILY, FontStyle::Normal, FONT).is_err() {
            panic!("the embedded font does not parse");
        }
    });
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

/// Draws one chart into `area`: mesh, lines with points, legend.
fn draw(area: &Area<'_>, chart: &Chart, series: &[Series]) -> Result<(), String> {
    let lines: Vec<(&Series, Vec<(f64, f64)>)> = series
        .iter()
        .map(|s| {
            let pts = s
                .points
                .iter()
                .filter_map(|(x, y)| Some((chart.x.to_axis(*x)?, chart.y.to_axis(*y)?)))
                .collect();
            (s, pts)
        })
        .collect();
    let all: Vec<(f64, f64)> = lines.iter().flat_map(|(_, p)| p.iter().copied()).collect();
    let (xr, yr) = (
        bounds(chart.x, all.iter().map(|p| p.0)),
        bounds(chart.y, all.iter().map(|p| p.1)),
    );
    let mut ctx = ChartBuilder::on(area)
        .caption(&chart.title, (FAMILY, 20))
        .margin(10)
        // Room for the last x tick label, which is centred on the right edge.
        .margin_right(30)
        .x_label_area_size(45)
        .y_label_area_size(75)
        .build_cartesian_2d(xr.0..xr.1, yr.0..yr.1)
        .map_err(|e| e.to_string())?;
    let (xs, ys) = (chart.x, chart.y);
    ctx.configure_mesh()
        .x_desc(chart.x_label.as_str())
        .y_desc(chart.y_label.as_str())
        .x_labels(ticks(xs, xr))
        .y_labels(ticks(ys, yr))
        .x_label_formatter(&|v| xs.label(*v))
        .y_label_formatter(&|v| ys.label(*v))
        .label_style((FAMILY, 13))
        .axis_desc_style((FAMILY, 15))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| e.to_string())?;
    for (s, pts) in &lines {
        line(&mut ctx, s, pts)?;
    }
    // One line needs no legend (the axis says what it is), and a legend box hides data.
    if series.len() < 2 {
        return Ok(());
    }
    let corner = match chart.legend {
        Corner::UpperLeft => SeriesLabelPosition::UpperLeft,
        Corner::UpperRight => SeriesLabelPosition::UpperRight,
        Corner::LowerLeft => SeriesLabelPosition::LowerLeft,
        Corner::LowerRight => SeriesLabelPosition::LowerRight,
    };
    ctx.configure_series_labels()
        .position(corner)
        .label_font((FAMILY, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK.mix(0.4))
        .draw()
        .map_err(|e| e.to_string())
}

type Ctx<'a, 'b> = ChartContext<'a, BitMapBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// Most points a line has and still gets a marker on each (denser lines read better bare).
const MARKERS_UP_TO: usize = 20;

/// One series: its line (dashed or solid, and so its legend entry), and markers if few points.
fn line(ctx: &mut Ctx<'_, '_>, s: &Series, pts: &[(f64, f64)]) -> Result<(), String> {
    let color = PALETTE[s.color % PALETTE.len()];
    let style = ShapeStyle::from(&color).stroke_width(2);
    let err = |e: DrawingAreaErrorKind<_>| e.to_string();
    if s.dashed {
        ctx.draw_series(DashedLineSeries::new(pts.iter().copied(), 6, 4, style))
            .map_err(err)?
            .label(s.name.as_str())
            .legend(move |(x, y)| DashedPathElement::new(vec![(x, y), (x + 24, y)], 6, 4, style));
    } else {
        ctx.draw_series(LineSeries::new(pts.iter().copied(), style))
            .map_err(err)?
            .label(s.name.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], style));
    }
    if pts.len() <= MARKERS_UP_TO {
        ctx.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))
            .map_err(err)?;
    }
    Ok(())
}

/// The axis range: from 0 on a linear axis of positive values (so that bars of throughput are not
/// exaggerated), whole decades on a log axis, a little air around the data otherwise.
fn bounds(scale: Scale, values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(l, h), v| (l.min(v), h.max(v)));
    if !lo.is_finite() {
        return (0.0, 1.0);
    }
    match scale {
        Scale::Linear => {
            let lo = lo.min(0.0);
            let hi = if hi > lo { hi } else { lo + 1.0 };
            (lo, hi + (hi - lo) * 0.08)
        }
        Scale::Log10 | Scale::Log2 => (
            lo.floor(),
            if hi.ceil() > lo.floor() {
                hi.ceil()
            } else {
                lo.floor() + 1.0
            },
        ),
        // -log10(1 - 0.9999) is 4 give or take a rounding error: no extra decade for it.
        Scale::Percentile => (0.0, (hi - 1e-6).ceil().max(1.0)),
    }
}

/// How many tick labels: one per decade (or percentile decade) on those axes, so that they land
/// on whole powers; about ten on a linear axis.
fn ticks(scale: Scale, (lo, hi): (f64, f64)) -> usize {
    match scale {
        Scale::Linear => 10,
        Scale::Log10 | Scale::Log2 | Scale::Percentile => ((hi - lo).round() as usize + 1).clamp(2, 12),
    }
}

/// `10` with a superscript exponent: 10³, 10⁻².
fn pow10(k: i32) -> String {
    const SUP: [char; 10] = ['⁰', '¹', '²', '³', '⁴', '⁵', '⁶', '⁷', '⁸', '⁹'];
    let digits: String = k
        .unsigned_abs()
        .to_string()
        .chars()
        .map(|c| SUP[c.to_digit(10).unwrap_or(0) as usize])
        .collect();
    format!("10{}{digits}", if k < 0 { "⁻" } else { "" })
}

/// A short label: 1.2M, 350k, 42, 0.5.
fn short(v: f64) -> String {
    let a = v.abs();
    let (x, suffix) = if a >= 1e9 {
        (v / 1e9, "G")
    } else if a >= 1e6 {
        (v / 1e6, "M")
    } else if a >= 1e3 {
        (v / 1e3, "k")
    } else {
        (v, "")
    };
    format!("{}{suffix}", trim(&format!("{x:.2}")))
}

/// `12.50` → `12.5`, `3.00` → `3`.
fn trim(s: &str) -> String {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s.to_string()
    }
}

/// Latency (µs) at quantiles p0 … p99.99, ten points per decade of `1 - q`, from a histogram of
/// nanoseconds; empty for an empty histogram.
pub fn latency_curve(hist: &Histogram<u64>) -> Vec<(f64, f64)> {
    if hist.is_empty() {
        return Vec::new();
    }
    (0..=40)
        .map(|k| {
            let q = 1.0 - 10f64.powf(-(k as f64) / 10.0);
            (q, hist.value_at_quantile(q) as f64 / 1e3)
        })
        .collect()
}

/// One PNG per case name (`latency-unary.png`, …) in `dir`: latency against percentile of the
/// echo (dashed) and the AllocSvr (solid) at each concurrency, every run's calls pooled. Returns
/// the files written.
pub fn latency_plots(dir: &Path, cases: &[Case]) -> Result<Vec<PathBuf>, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut names: Vec<&str> = cases.iter().map(|c| c.name.as_str()).collect();
    names.dedup();
    let mut written = Vec::new();
    for name in names {
        let mut series = Vec::new();
        for (i, c) in cases.iter().filter(|c| c.name == name).enumerate() {
            let (echo, alloc) = pooled(c)?;
            let conc = c.concurrency;
            series.push(Series::new(format!("echo @{conc}"), i, latency_curve(&echo)).dashed());
            series.push(Series::new(format!("AllocSvr @{conc}"), i, latency_curve(&alloc)));
        }
        let chart = Chart {
            title: format!("{name}: latency by percentile, echo (dashed) vs AllocSvr (solid)"),
            x_label: "percentile".into(),
            y_label: "latency (µs)".into(),
            x: Scale::Percentile,
            y: Scale::Log10,
            legend: Corner::LowerRight,
        };
        let path = dir.join(format!("latency-{name}.png"));
        line_chart(&path, &chart, &series)?;
        written.push(path);
    }
    Ok(written)
}

/// The echo's and the AllocSvr's histograms of every run of `c`, added up.
fn pooled(c: &Case) -> Result<(Histogram<u64>, Histogram<u64>), String> {
    let empty = || Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3).map_err(|e| e.to_string());
    let (mut echo, mut alloc) = (empty()?, empty()?);
    for (e, a) in &c.runs {
        echo.add(&e.hist).map_err(|e| e.to_string())?;
        alloc.add(&a.hist).map_err(|e| e.to_string())?;
    }
    Ok((echo, alloc))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chart(x: Scale, y: Scale) -> Chart {
        Chart {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x,
            y,
            legend: Corner::UpperRight,
        }
    }

    #[test]
    fn writes_a_png() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.png");
        let s = vec![
            Series::new("one", 0, vec![(1e3, 5.0), (1e5, 7.5), (1e8, 8.0)]),
            Series::new("two", 1, vec![(1e3, 2.0), (1e8, 3.0)]).dashed(),
        ];
        line_chart(&path, &chart(Scale::Log10, Scale::Linear), &s).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.len() > 1_000, "{} bytes", bytes.len());
        assert_eq!(&bytes[1..4], b"PNG");
    }

    #[test]
    fn writes_stacked_panels_and_percentiles() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("b.png");
        let mut h = Histogram::<u64>::new_with_bounds(1_000, 60_000_000_000, 3).unwrap();
        for v in 1..10_000u64 {
            h.record(v * 1_000).unwrap();
        }
        let curve = latency_curve(&h);
        assert_eq!(curve.len(), 41);
        assert!(
            curve.windows(2).all(|w| w[0].1 <= w[1].1),
            "latency grows with the percentile"
        );
        let p = vec![
            (chart(Scale::Percentile, Scale::Log10), vec![Series::new("h", 0, curve)]),
            (
                chart(Scale::Linear, Scale::Linear),
                vec![Series::new("l", 2, vec![(0.0, 1.0)])],
            ),
        ];
        panels(&path, &p).unwrap();
        assert!(std::fs::metadata(&path).unwrap().len() > 1_000);
    }

    #[test]
    fn labels() {
        assert_eq!(Scale::Log10.label(8.0), "10⁸");
        assert_eq!(Scale::Log10.label(-2.0), "10⁻²");
        assert_eq!(Scale::Percentile.label(2.0), "p99");
        assert_eq!(Scale::Percentile.label(0.0), "p0");
        assert_eq!(Scale::Percentile.label(4.0), "p99.99");
        assert_eq!(Scale::Linear.label(1_250_000.0), "1.25M");
        assert_eq!(Scale::Log10.to_axis(0.0), None);
        assert_eq!(Scale::Log2.label(4.0), "16");
        assert_eq!(bounds(Scale::Log2, [0.0, 6.64].into_iter()), (0.0, 7.0));
        assert_eq!(bounds(Scale::Log10, [3.2, 7.9].into_iter()), (3.0, 8.0));
    }
}
