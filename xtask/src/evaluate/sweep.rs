//! Section 6: a parameter sweep the paper did not do. One setting changed at a time from riser's
//! defaults, offered by both the target and the initiator (so it is what they negotiate): on TCP
//! MaxRecvDataSegmentLength, MaxBurstLength, FirstBurstLength, ImmediateData and InitialR2T; on
//! iSER the signalling interval and the send queue depth. Each is measured on 1 MiB sequential
//! writes (QD 8, MiB/s) and 4 KiB random reads (QD 32, IOPS), a fresh target per setting.

use super::{Eval, Table, load, median, num, plot, prefill, target_with};
use plotters::style::RGBColor;
use std::fmt::Write as _;
use std::path::Path;

/// (transport, `--param` or `--iser-param` setting (`defaults`: none), whether --quick runs it).
const VARIANTS: [(&str, &str, bool); 16] = [
    ("tcp", "defaults", true),
    ("tcp", "MaxRecvDataSegmentLength=8KiB", true),
    ("tcp", "MaxRecvDataSegmentLength=64KiB", false),
    ("tcp", "MaxRecvDataSegmentLength=1MiB", false),
    ("tcp", "MaxBurstLength=256KiB", true),
    ("tcp", "MaxBurstLength=4MiB", false),
    ("tcp", "FirstBurstLength=64KiB", false),
    ("tcp", "FirstBurstLength=1MiB", false),
    ("tcp", "ImmediateData=No", true),
    ("tcp", "InitialR2T=Yes", false),
    ("iser", "defaults", true),
    ("iser", "signal_every=1", true),
    ("iser", "signal_every=4", false),
    ("iser", "signal_every=64", false),
    ("iser", "send_depth=272", false),
    ("iser", "send_depth=2064", false),
];

/// The two workloads: (name, rw, size, queue depth, unit).
pub(super) const WORKLOADS: [(&str, &str, u64, u32, &str); 2] =
    [("write 1M QD 8", "write", 1 << 20, 8, "MiB/s"), ("randread 4K QD 32", "randread", 4096, 32, "IOPS")];

pub(super) fn run(ev: &Eval) -> Result<(), String> {
    let variants: Vec<_> = VARIANTS.iter().filter(|v| v.2 || !ev.quick).collect();
    // Every setting's target up at once (256 MiB LUNs), so the repetitions can go round all of
    // them in turn: the machine's drift then spreads over every setting alike, and each setting
    // is compared with the defaults' run of the same round.
    let mut setups = Vec::new();
    for &&(transport, setting, _) in &variants {
        let iser_setting = setting.starts_with("signal_every") || setting.starts_with("send_depth");
        let one = if setting == "defaults" { vec![] } else { vec![setting.to_string()] };
        let (params, iser) = if iser_setting { (vec![], one) } else { (one, vec![]) };
        let (target, urls) = target_with(&format!("iqn.2026-11.io.riser:evaluate-sweep-{}", setups.len()), "256MiB", &params, &iser)?;
        prefill(&target, &urls[0], &params.iter().flat_map(|p| ["--param", p.as_str()]).collect::<Vec<_>>())?;
        let extra: Vec<String> = params
            .iter()
            .flat_map(|p| ["--param".to_string(), p.clone()])
            .chain(iser.iter().flat_map(|p| ["--iser-param".to_string(), p.clone()]))
            .collect();
        let url = if transport == "tcp" { urls[0].clone() } else { urls[1].clone() };
        setups.push((transport, setting, target, url, extra));
    }
    let bar = ev.bar(variants.len() * WORKLOADS.len() * ev.reps, "sweep")?;
    let mut csv = format!("{},transport,setting,workload,rep,value,unit,target_cpu_s,initiator_cpu_s\n", super::COMMON);
    for rep in 0..ev.reps {
        for (transport, setting, target, url, extra) in &setups {
            for (name, rw, bs, qd, unit) in WORKLOADS {
                bar.set_message(format!("{transport} {setting}: {name}"));
                let r = load(target.child.id(), url, rw, bs, qd, ev.seconds(), extra)?;
                let value = if unit == "IOPS" { r.iops } else { r.mib_s };
                let _ = writeln!(
                    csv,
                    "{}{transport},{setting},{name},{rep},{value:.1},{unit},{:.3},{:.3}",
                    ev.row(),
                    r.m.target_cpu_s,
                    r.m.client_cpu_s
                );
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    drop(setups);
    ev.write("sweep.csv", &csv)
}

/// The runs of a (transport, setting, workload), in repetition order.
pub(super) fn runs(t: &Table, transport: &str, setting: &str, workload: &str) -> Vec<f64> {
    t.runs(&[("transport", transport), ("setting", setting), ("workload", workload)], "value")
}

/// The median of a (transport, setting, workload) over its runs.
pub(super) fn value(t: &Table, transport: &str, setting: &str, workload: &str) -> f64 {
    median(t.select(&[("transport", transport), ("setting", setting), ("workload", workload)]).iter().map(|r| num(r, "value")).collect())
}

/// `sweep-write-1m.{png,svg}` and `sweep-randread-4k.{png,svg}`: one bar per setting.
pub(super) fn figures(dir: &Path) -> Result<(), String> {
    let Some(t) = Table::read(dir, "sweep.csv")? else { return Ok(()) };
    for (name, _, _, _, unit) in WORKLOADS {
        let mut rows = Vec::new();
        for (transport, setting, _) in VARIANTS {
            let v = value(&t, transport, setting, name);
            if v.is_finite() {
                let color = match (transport, setting == "defaults") {
                    ("tcp", true) => RGBColor(31, 90, 160),
                    ("tcp", false) => RGBColor(120, 180, 230),
                    (_, true) => RGBColor(200, 30, 40),
                    _ => RGBColor(240, 140, 60),
                };
                let t = if transport == "tcp" { "TCP" } else { "iSER" };
                rows.push((format!("{t} {}", if setting == "defaults" { "riser defaults" } else { setting }), v, color));
            }
        }
        let stem = if name.starts_with("write") { "sweep-write-1m" } else { "sweep-randread-4k" };
        plot::hbars(&dir.join(stem), &format!("Parameter sweep, {name}: one setting changed from riser's defaults"), unit, &rows)?;
    }
    Ok(())
}
