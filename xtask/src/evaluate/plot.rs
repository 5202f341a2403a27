//! The evaluation's figures, drawn with plotters as PNG and SVG.

use plotters::coord::Shift;
use plotters::prelude::*;
use std::path::Path;

/// The font every label is set in (DejaVu Sans, Debian's `fonts-dejavu-core`).
const FONT_FILE: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

/// Register the font plotters draws text with (the bitmap backend has none of its own).
pub(crate) fn register_font() -> Result<(), String> {
    if !Path::new(FONT_FILE).exists() {
        println!("installing fonts-dejavu-core (the figures' font)");
        let ok = std::process::Command::new("apt-get")
            .args(["install", "-y", "-qq", "fonts-dejavu-core"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            return Err(format!("{FONT_FILE} missing and fonts-dejavu-core could not be installed"));
        }
    }
    let bytes = std::fs::read(FONT_FILE).map_err(|e| format!("{FONT_FILE}: {e}"))?;
    // plotters keeps registered fonts for the life of the process.
    plotters::style::register_font("sans-serif", FontStyle::Normal, Box::leak(bytes.into_boxed_slice()))
        .map_err(|_| format!("{FONT_FILE}: not a font plotters can use"))
}

/// One line of a figure.
pub(crate) struct Series {
    pub(crate) label: String,
    pub(crate) color: RGBColor,
    /// (transfer size in bytes, MiB/s)
    pub(crate) points: Vec<(f64, f64)>,
}

/// A size on the log axis: 1K, 512K, 16M.
fn size_label(bytes: &f64) -> String {
    let b = bytes.round() as u64;
    if b >= 1 << 20 { format!("{}M", b >> 20) } else { format!("{}K", b >> 10) }
}

/// Throughput against transfer size (log scale), one line per series, and the ceiling as a
/// dashed line: `stem.png` and `stem.svg`.
pub(crate) fn throughput(stem: &Path, title: &str, series: &[Series], ceiling: f64) -> Result<(), String> {
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    draw(BitMapBackend::new(&png, (960, 600)).into_drawing_area(), title, series, ceiling)?;
    draw(SVGBackend::new(&svg, (960, 600)).into_drawing_area(), title, series, ceiling)
}

fn draw<DB: DrawingBackend>(area: DrawingArea<DB, Shift>, title: &str, series: &[Series], ceiling: f64) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0));
    let (lo, hi) = xs.fold((f64::MAX, 0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let top = series.iter().flat_map(|s| s.points.iter().map(|p| p.1)).fold(ceiling, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d((lo..hi).log_scale().base(2.0), 0f64..top)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("transfer size (bytes, log scale)")
        .y_desc("payload throughput (MiB/s)")
        .x_label_formatter(&size_label)
        .x_labels(series.first().map_or(8, |s| s.points.len()))
        .y_label_formatter(&|y| format!("{y:.0}"))
        .axis_desc_style(("sans-serif", 17))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for s in series {
        let style = ShapeStyle::from(&s.color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), style))
            .map_err(e)?
            .label(&s.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], style));
        chart.draw_series(s.points.iter().map(|&p| Circle::new(p, 3, s.color.filled()))).map_err(e)?;
    }
    // The ceiling: dashes along the whole axis.
    let grey = RGBColor(110, 110, 110);
    let steps = 48;
    let at = |i: usize| lo * (hi / lo).powf(i as f64 / steps as f64);
    chart
        .draw_series((0..steps).step_by(2).map(|i| PathElement::new([(at(i), ceiling), (at(i + 1), ceiling)], grey.stroke_width(1))))
        .map_err(e)?
        .label(format!("loopback TCP ceiling, 1 stream ({ceiling:.0} MiB/s)"))
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], grey.stroke_width(1)));
    legend_and_present(&mut chart, &area, SeriesLabelPosition::UpperLeft)
}

/// The legend, boxed, at `pos`; then the figure is written out.
fn legend_and_present<'a, DB: DrawingBackend + 'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, DB, CT>,
    area: &DrawingArea<DB, Shift>,
    pos: SeriesLabelPosition,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    chart
        .configure_series_labels()
        .position(pos)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    area.present().map_err(e)
}

/// One series of a bar chart: a value per group (NaN: no bar).
pub(crate) struct Bars {
    pub(crate) label: String,
    pub(crate) color: RGBColor,
    pub(crate) values: Vec<f64>,
}

/// The group of an x position when it is a whole number within `groups`.
fn group_at(groups: &[String], x: f64) -> String {
    if (x - x.round()).abs() < 1e-6 && x >= -0.01 { groups.get(x.round() as usize).cloned().unwrap_or_default() } else { String::new() }
}

/// Grouped vertical bars: one group per entry of `groups`, one bar per series in each:
/// `stem.png` and `stem.svg`.
pub(crate) fn bars(stem: &Path, title: &str, x_desc: &str, y_desc: &str, groups: &[String], series: &[Bars]) -> Result<(), String> {
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    draw_bars(BitMapBackend::new(&png, (960, 560)).into_drawing_area(), title, x_desc, y_desc, groups, series)?;
    draw_bars(SVGBackend::new(&svg, (960, 560)).into_drawing_area(), title, x_desc, y_desc, groups, series)
}

fn draw_bars<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    groups: &[String],
    series: &[Bars],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let top = series.iter().flat_map(|s| s.values.iter().copied()).filter(|v| v.is_finite()).fold(0f64, f64::max).max(1e-9) * 1.25;
    let n = groups.len();
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), 0f64..top)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .x_labels(n + 1)
        .x_label_formatter(&|x| group_at(groups, *x))
        .y_label_formatter(&|y| if top < 10.0 { format!("{y:.2}") } else { format!("{y:.0}") })
        .axis_desc_style(("sans-serif", 17))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    let width = 0.8 / series.len().max(1) as f64;
    for (k, s) in series.iter().enumerate() {
        let color = s.color;
        let rects = s.values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(move |(g, &v)| {
            let x0 = g as f64 - 0.4 + k as f64 * width;
            Rectangle::new([(x0, 0.0), (x0 + width * 0.92, v)], color.filled())
        });
        chart
            .draw_series(rects)
            .map_err(e)?
            .label(&s.label)
            .legend(move |(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], color.filled()));
    }
    legend_and_present(&mut chart, &area, SeriesLabelPosition::UpperLeft)
}

/// Horizontal bars, one per label (top to bottom), each with its colour: `stem.png` and
/// `stem.svg`. For long category names (a parameter sweep's settings).
pub(crate) fn hbars(stem: &Path, title: &str, x_desc: &str, rows: &[(String, f64, RGBColor)]) -> Result<(), String> {
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    let h = 120 + 30 * rows.len() as u32;
    draw_hbars(BitMapBackend::new(&png, (960, h)).into_drawing_area(), title, x_desc, rows)?;
    draw_hbars(SVGBackend::new(&svg, (960, h)).into_drawing_area(), title, x_desc, rows)
}

fn draw_hbars<DB: DrawingBackend>(
    area: DrawingArea<DB, Shift>,
    title: &str,
    x_desc: &str,
    rows: &[(String, f64, RGBColor)],
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let right = rows.iter().map(|r| r.1).filter(|v| v.is_finite()).fold(0f64, f64::max).max(1e-9) * 1.15;
    let n = rows.len();
    // Row 0 at the top: y runs from n - 0.5 down to -0.5, row i drawn at y = n - 1 - i.
    let names: Vec<String> = rows.iter().rev().map(|r| r.0.clone()).collect();
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(300)
        .build_cartesian_2d(0f64..right, -0.5f64..(n as f64 - 0.5))
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc(x_desc)
        .y_labels(n + 1)
        .y_label_formatter(&|y| group_at(&names, *y))
        .x_label_formatter(&|x| format!("{x:.0}"))
        .axis_desc_style(("sans-serif", 17))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    chart
        .draw_series(rows.iter().enumerate().filter(|(_, r)| r.1.is_finite()).map(|(i, r)| {
            let y = (n - 1 - i) as f64;
            Rectangle::new([(0.0, y - 0.35), (r.1, y + 0.35)], r.2.filled())
        }))
        .map_err(e)?;
    chart
        .draw_series(rows.iter().enumerate().filter(|(_, r)| r.1.is_finite()).map(|(i, r)| {
            let y = (n - 1 - i) as f64;
            Text::new(format!("{:.0}", r.1), (r.1, y + 0.15), ("sans-serif", 13))
        }))
        .map_err(e)?;
    area.present().map_err(e)
}

/// Latency distributions: percentile (0–100) against latency (µs, log scale), one line per
/// series of (µs, percentile): `stem.png` and `stem.svg`.
pub(crate) fn cdf(stem: &Path, title: &str, series: &[Series]) -> Result<(), String> {
    let png = stem.with_extension("png");
    let svg = stem.with_extension("svg");
    draw_cdf(BitMapBackend::new(&png, (960, 600)).into_drawing_area(), title, series)?;
    draw_cdf(SVGBackend::new(&svg, (960, 600)).into_drawing_area(), title, series)
}

fn draw_cdf<DB: DrawingBackend>(area: DrawingArea<DB, Shift>, title: &str, series: &[Series]) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    area.fill(&WHITE).map_err(e)?;
    let xs = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).filter(|x| *x > 0.0);
    let (lo, hi) = xs.fold((f64::MAX, 0f64), |(lo, hi), x| (lo.min(x), hi.max(x)));
    let (lo, hi) = if lo < hi { (lo * 0.9, hi * 1.1) } else { (1.0, 1000.0) };
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(64)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..100.0)
        .map_err(e)?;
    chart
        .configure_mesh()
        .x_desc("latency, issue to status (µs, log scale)")
        .y_desc("share of commands completed (%)")
        .x_label_formatter(&|x| format!("{x:.0}"))
        .axis_desc_style(("sans-serif", 17))
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    for s in series {
        let style = ShapeStyle::from(&s.color).stroke_width(2);
        chart
            .draw_series(LineSeries::new(s.points.iter().copied().filter(|p| p.0 > 0.0), style))
            .map_err(e)?
            .label(&s.label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 24, y)], style));
    }
    legend_and_present(&mut chart, &area, SeriesLabelPosition::LowerRight)
}
