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
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(e)?;
    area.present().map_err(e)
}
