//! Section 1 (and 3): the paper's figures. Payload throughput against transfer size (1 KiB …
//! 16 MiB, powers of two), reads and writes, one command outstanding (as the paper) and eight,
//! riser TCP against riser iSER on the software iWARP RNIC, riser's parameters and the paper's,
//! each point also as a share of the single-stream loopback TCP ceiling measured in the same run
//! (the paper states its results as a share of the 10GigE payload maximum). Every run records
//! the CPU seconds of the target and of the initiator.

use super::{Eval, Table, free_port, median, num, plot, prefill, size_name, target_with};
use plotters::style::RGBColor;
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// Transfer sizes of the paper's figures: 1 KiB to 16 MiB.
const SIZES: [u64; 15] = [
    1 << 10,
    2 << 10,
    4 << 10,
    8 << 10,
    16 << 10,
    32 << 10,
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
    8 << 20,
    16 << 20,
];

/// Commands outstanding: the paper's one, and a small queue.
const QUEUE_DEPTHS: [u32; 2] = [1, 8];

/// The transports compared, in the order of each target's URLs.
const TRANSPORTS: [&str; 2] = ["tcp", "iser"];

/// The negotiated parameters measured: riser's defaults, and the founding paper's
/// (MaxRecvDataSegmentLength = MaxBurstLength = 512 KiB), offered by both sides.
const PARAMETER_SETS: [(&str, &[&str]); 2] = [("defaults", &[]), ("paper", &["MaxRecvDataSegmentLength=512KiB", "MaxBurstLength=512KiB"])];

/// Single-stream TCP over loopback with 1 MiB writes (iperf3), MiB/s: the ceiling a one-connection
/// transport on this host cannot pass.
fn loopback_ceiling(secs: u32) -> Result<f64, String> {
    let port = free_port()?.to_string();
    let mut server = Command::new("iperf3")
        .args(["-s", "-1", "-B", "127.0.0.1", "-p", &port])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .map_err(|e| format!("iperf3: {e}"))?;
    std::thread::sleep(Duration::from_millis(500));
    let out = Command::new("timeout")
        .args([&(secs + 15).to_string(), "iperf3", "-c", "127.0.0.1", "-p", &port, "-t", &secs.to_string(), "-l", "1M", "-J"])
        .output()
        .map_err(|e| format!("iperf3: {e}"))?;
    let _ = server.wait();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).map_err(|e| format!("iperf3 -J: {e}"))?;
    let bps = json["end"]["sum_received"]["bits_per_second"].as_f64().ok_or("iperf3 gave no result")?;
    Ok(bps / 8.0 / 1_048_576.0)
}

pub(super) fn run(ev: &Eval) -> Result<(), String> {
    let iqn = "iqn.2026-11.io.riser:evaluate";
    // One target process per parameter set, each with a TCP and an iSER portal; the initiator
    // offers the same keys, so the set is what both sides negotiate.
    let mut setups = Vec::new();
    for (name, params) in PARAMETER_SETS {
        let params: Vec<String> = params.iter().map(|p| (*p).to_string()).collect();
        let (target, urls) = target_with(iqn, "1GiB", &params, &[])?;
        let extra: Vec<String> = params.iter().flat_map(|p| ["--param".to_string(), p.clone()]).collect();
        setups.push((name, extra, target, urls));
    }
    for (_, extra, target, urls) in &setups {
        prefill(target, &urls[0], &extra.iter().map(String::as_str).collect::<Vec<_>>())?;
    }
    let ceiling = median((0..ev.reps).map(|_| loopback_ceiling(if ev.quick { 2 } else { 5 })).collect::<Result<Vec<_>, _>>()?);
    // Bytes per run: enough commands that the per-run noise averages out, few enough that
    // --quick stays within minutes (process start and login are outside the initiator's timing).
    let volume = |bs: u64| if ev.quick { (bs * 32).clamp(2 << 20, 128 << 20) } else { (bs * 256).clamp(32 << 20, 512 << 20) };

    let bar = ev.bar(SIZES.len() * QUEUE_DEPTHS.len() * 2 * ev.reps * TRANSPORTS.len() * setups.len(), "throughput")?;
    let mut csv = format!(
        "{},params,transport,op,io_bytes,queue_depth,rep,bytes,mib_s,ceiling_mib_s,share_of_ceiling,target_cpu_s,initiator_cpu_s\n",
        super::COMMON
    );
    for &qd in &QUEUE_DEPTHS {
        for op in ["read", "write"] {
            for (set, extra, target, urls) in &setups {
                let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
                for &bs in &SIZES {
                    let size = volume(bs);
                    for rep in 0..ev.reps {
                        // TCP and iSER interleaved, so the machine's noise spreads over both.
                        for (url, transport) in urls.iter().zip(TRANSPORTS) {
                            bar.set_message(format!("{set} {transport} {op} {} QD {qd}", size_name(bs)));
                            let s = super::super::initiator_run(target.child.id(), op, url, size, bs, qd, &extra)?;
                            let _ = writeln!(
                                csv,
                                "{}{set},{transport},{op},{bs},{qd},{rep},{size},{:.1},{ceiling:.1},{:.4},{:.3},{:.3}",
                                ev.row(),
                                s.mib_s,
                                s.mib_s / ceiling,
                                s.target_cpu_s,
                                s.initiator_cpu_s
                            );
                            bar.inc(1);
                        }
                    }
                }
            }
        }
    }
    bar.finish_and_clear();
    ev.write("throughput.csv", &csv)
}

/// The line colour of a (parameter set, transport).
fn color(paper: bool, tcp: bool) -> RGBColor {
    match (tcp, paper) {
        (true, false) => RGBColor(31, 90, 160),
        (true, true) => RGBColor(120, 180, 230),
        (false, false) => RGBColor(200, 30, 40),
        (false, true) => RGBColor(240, 140, 60),
    }
}

/// `throughput-{read,write}-qd{1,8}.{png,svg}` (medians of the runs) and
/// `cpu-per-gib-{read,write}.{png,svg}` (riser's parameters, QD 8).
pub(super) fn figures(dir: &Path) -> Result<(), String> {
    let Some(t) = Table::read(dir, "throughput.csv")? else { return Ok(()) };
    let ceiling = median(t.rows.iter().map(|r| num(r, "ceiling_mib_s")).collect());
    for op in t.distinct("op") {
        for qd in t.distinct("queue_depth") {
            let mut series = Vec::new();
            for set in t.distinct("params") {
                for transport in t.distinct("transport") {
                    let rows = t.select(&[("op", &op), ("queue_depth", &qd), ("params", &set), ("transport", &transport)]);
                    let points = by_size(&rows, |r| num(r, "mib_s"));
                    let (paper, tcp) = (set == "paper", transport == "tcp");
                    let how = if paper { "512 KiB bursts (paper)" } else { "riser defaults" };
                    let what = if tcp { "iSCSI/TCP" } else { "iSER (software RNIC)" };
                    series.push(plot::Series { label: format!("{what}, {how}"), color: color(paper, tcp), points });
                }
            }
            // TCP first, then iSER; defaults before the paper's.
            series.sort_by_key(|s| (!s.label.starts_with("iSCSI"), s.label.contains("paper")));
            let what = if op == "read" { "Reads" } else { "Writes" };
            let title =
                format!("{what}, {qd} command{} outstanding: riser iSER vs iSCSI/TCP over loopback", if qd == "1" { "" } else { "s" });
            plot::throughput(&dir.join(format!("throughput-{op}-qd{qd}")), &title, &series, ceiling)?;
        }
        // CPU seconds per GiB moved, at QD 8 with riser's parameters, for a few sizes.
        let sizes: Vec<u64> = [4u64 << 10, 64 << 10, 512 << 10, 1 << 20, 16 << 20].into_iter().collect();
        let mut bars = Vec::new();
        for (transport, name) in [("tcp", "TCP"), ("iser", "iSER")] {
            for (who, col) in [("target", "target_cpu_s"), ("initiator", "initiator_cpu_s")] {
                let rows = t.select(&[("op", &op), ("queue_depth", "8"), ("params", "defaults"), ("transport", transport)]);
                let v = sizes.iter().map(|&s| cpu_per_gib(&rows, s, col)).collect();
                let tcp = transport == "tcp";
                let c = color(who == "initiator", tcp);
                bars.push(plot::Bars { label: format!("{name} {who}"), color: c, values: v });
            }
        }
        let groups: Vec<String> = sizes.iter().map(|&s| size_name(s)).collect();
        let what = if op == "read" { "reads" } else { "writes" };
        plot::bars(
            &dir.join(format!("cpu-per-gib-{op}")),
            &format!("CPU cost of {what} (QD 8, riser defaults): seconds of CPU per GiB moved"),
            "transfer size",
            "CPU seconds per GiB",
            &groups,
            &bars,
        )?;
    }
    Ok(())
}

/// (size, median of `f` over the rows of that size), by size.
fn by_size(
    rows: &[&std::collections::BTreeMap<String, String>],
    f: impl Fn(&std::collections::BTreeMap<String, String>) -> f64,
) -> Vec<(f64, f64)> {
    let mut m: std::collections::BTreeMap<u64, Vec<f64>> = Default::default();
    for r in rows {
        m.entry(num(r, "io_bytes") as u64).or_default().push(f(r));
    }
    m.into_iter().map(|(s, v)| (s as f64, median(v))).collect()
}

/// CPU seconds per GiB of `col` over the runs of transfer size `size` (total CPU / total bytes).
pub(super) fn cpu_per_gib(rows: &[&std::collections::BTreeMap<String, String>], size: u64, col: &str) -> f64 {
    let rows: Vec<_> = rows.iter().filter(|r| num(r, "io_bytes") as u64 == size).collect();
    let cpu: f64 = rows.iter().map(|r| num(r, col)).sum();
    let gib: f64 = rows.iter().map(|r| num(r, "bytes")).sum::<f64>() / (1u64 << 30) as f64;
    if gib > 0.0 { cpu / gib } else { f64::NAN }
}
