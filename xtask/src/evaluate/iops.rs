//! Section 2 (and 3): IOPS of random reads and writes, 512 B … 64 KiB, at one command
//! outstanding and 32, riser TCP against riser iSER; latency percentiles at QD 1 from the
//! initiator's HdrHistogram, and the whole distribution of 4 KiB commands at QD 1.

use super::{Eval, Table, load, median, num, plot, prefill, size_name, target_with};
use plotters::style::RGBColor;
use std::fmt::Write as _;
use std::path::Path;

/// Commands outstanding: latency's one and a deep queue.
const QUEUE_DEPTHS: [u32; 2] = [1, 32];

/// The size whose whole latency distribution is kept.
const CDF_SIZE: u64 = 4096;

pub(super) fn run(ev: &Eval) -> Result<(), String> {
    let sizes: &[u64] = if ev.quick { &[512, 4096, 65536] } else { &[512, 4096, 16384, 65536] };
    let (target, urls) = target_with("iqn.2026-11.io.riser:evaluate-iops", "1GiB", &[], &[])?;
    prefill(&target, &urls[0], &[])?;
    let bar = ev.bar(2 * sizes.len() * QUEUE_DEPTHS.len() * ev.reps * 2, "iops")?;
    let mut csv = format!(
        "{},transport,rw,io_bytes,queue_depth,rep,seconds,iops,mib_s,p50_us,p99_us,p999_us,target_cpu_s,initiator_cpu_s\n",
        super::COMMON
    );
    let mut cdf = format!("{},transport,rw,io_bytes,percentile,latency_us\n", super::COMMON);
    let cdf_file = std::env::temp_dir().join(format!("riser-evaluate-cdf-{}.csv", std::process::id()));
    for rw in ["randread", "randwrite"] {
        for &bs in sizes {
            for &qd in &QUEUE_DEPTHS {
                for rep in 0..ev.reps {
                    for (url, transport) in urls.iter().zip(["tcp", "iser"]) {
                        bar.set_message(format!("{transport} {rw} {} QD {qd}", size_name(bs)));
                        let keep_cdf = qd == 1 && bs == CDF_SIZE && rep == 0;
                        let extra = if keep_cdf { vec!["--latency-cdf".into(), cdf_file.display().to_string()] } else { vec![] };
                        let r = load(target.child.id(), url, rw, bs, qd, ev.seconds(), &extra)?;
                        let _ = writeln!(
                            csv,
                            "{}{transport},{rw},{bs},{qd},{rep},{:.3},{:.0},{:.1},{:.1},{:.1},{:.1},{:.3},{:.3}",
                            ev.row(),
                            r.m.wall_s,
                            r.iops,
                            r.mib_s,
                            r.p50_us,
                            r.p99_us,
                            r.p999_us,
                            r.m.target_cpu_s,
                            r.m.client_cpu_s
                        );
                        if keep_cdf {
                            let text = std::fs::read_to_string(&cdf_file).map_err(|e| format!("{}: {e}", cdf_file.display()))?;
                            for line in text.lines().skip(1) {
                                let _ = writeln!(cdf, "{}{transport},{rw},{bs},{line}", ev.row());
                            }
                        }
                        bar.inc(1);
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_file(&cdf_file);
    bar.finish_and_clear();
    ev.write("iops.csv", &csv)?;
    ev.write("latency-cdf.csv", &cdf)
}

/// `iops-{randread,randwrite}.{png,svg}` and `latency-cdf-4k.{png,svg}`.
pub(super) fn figures(dir: &Path) -> Result<(), String> {
    let Some(t) = Table::read(dir, "iops.csv")? else { return Ok(()) };
    let mut sizes: Vec<u64> = t.distinct("io_bytes").iter().filter_map(|s| s.parse().ok()).collect();
    sizes.sort_unstable();
    let groups: Vec<String> = sizes.iter().map(|&s| size_name(s)).collect();
    for rw in t.distinct("rw") {
        let mut bars = Vec::new();
        for (transport, name, colors) in [
            ("tcp", "TCP", [RGBColor(120, 180, 230), RGBColor(31, 90, 160)]),
            ("iser", "iSER", [RGBColor(240, 140, 60), RGBColor(200, 30, 40)]),
        ] {
            for (qd, color) in QUEUE_DEPTHS.iter().zip(colors) {
                let values = sizes
                    .iter()
                    .map(|s| {
                        let rows = t.select(&[
                            ("rw", &rw),
                            ("transport", transport),
                            ("queue_depth", &qd.to_string()),
                            ("io_bytes", &s.to_string()),
                        ]);
                        median(rows.iter().map(|r| num(r, "iops")).collect())
                    })
                    .collect();
                bars.push(plot::Bars { label: format!("{name}, QD {qd}"), color, values });
            }
        }
        let what = if rw == "randread" { "Random reads" } else { "Random writes" };
        plot::bars(
            &dir.join(format!("iops-{rw}")),
            &format!("{what}: commands per second, riser iSER vs iSCSI/TCP over loopback"),
            "transfer size (bytes)",
            "IOPS",
            &groups,
            &bars,
        )?;
    }
    let Some(c) = Table::read(dir, "latency-cdf.csv")? else { return Ok(()) };
    let mut series = Vec::new();
    for (transport, name) in [("tcp", "TCP"), ("iser", "iSER")] {
        for (rw, op) in [("randread", "reads"), ("randwrite", "writes")] {
            let points: Vec<(f64, f64)> = c
                .select(&[("transport", transport), ("rw", rw), ("io_bytes", &CDF_SIZE.to_string())])
                .iter()
                .map(|r| (num(r, "latency_us"), num(r, "percentile")))
                .collect();
            let color = match (transport, rw) {
                ("tcp", "randread") => RGBColor(31, 90, 160),
                ("tcp", _) => RGBColor(120, 180, 230),
                (_, "randread") => RGBColor(200, 30, 40),
                _ => RGBColor(240, 140, 60),
            };
            series.push(plot::Series { label: format!("{name} 4 KiB random {op}"), color, points });
        }
    }
    plot::cdf(&dir.join("latency-cdf-4k"), "Latency of 4 KiB random commands, one outstanding: riser iSER vs iSCSI/TCP", &series)
}
