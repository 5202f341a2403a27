//! Section 5 (`--lab`): in the lab VM, iSER against TCP over soft-RoCE (rxe) and soft-iWARP
//! (siw), with riser's initiator and with the Linux kernel's (open-iscsi + ib_iser or
//! iscsi_tcp) against the riser target on the rdma-core provider: the paper's Figure 5 (a
//! kernel initiator and a user-space target), and iWARP against RoCE. xtask/lab/evaluate.sh runs
//! in the guest; the VM runs under TCG emulation, so the report shows ratios only.

use super::{Eval, Spread, Table, median};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

pub(super) fn run(ev: &Eval) -> Result<(), String> {
    let (examples, _) = crate::lab::prepare()?;
    let shared = std::fs::canonicalize(crate::shared()).map_err(|e| format!("{}: {e}", crate::shared().display()))?;
    let reps = ev.reps.max(2);
    let env = vec![
        format!("RISER_TARGET={}", examples.join("target").display()),
        format!("RISER_INITIATOR={}", examples.join("initiator").display()),
        format!("EVAL_REPS={reps}"),
        format!("EVAL_MIB={}", if ev.quick { 32 } else { 64 }),
    ];
    println!("lab: booting the VM (rxe and siw), {reps} repetitions per link; its log goes to stderr");
    let (lines, ok) = crate::lab::guest(&shared, 3600, &env, "xtask/lab/evaluate.sh", None)?;
    let mut csv = format!("{},link,initiator,transport,op,io_bytes,queue_depth,rep,value,unit\n", super::COMMON);
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    for l in &lines {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() == 9 && f[0] == "EVAL" {
            let key = f[1..7].join(" ");
            let rep = seen.entry(key).or_default();
            let _ = writeln!(csv, "{}{},{},{},{},{},{},{rep},{},{}", ev.row(), f[1], f[2], f[3], f[4], f[5], f[6], f[7], f[8]);
            *rep += 1;
        }
    }
    let failures: Vec<&String> = lines.iter().filter(|l| l.starts_with("FAIL ")).collect();
    if seen.is_empty() {
        return Err(format!("the lab produced no measurements: {failures:?}"));
    }
    ev.write("lab.csv", &csv)?;
    if !ok || !failures.is_empty() {
        return Err(format!("lab runs failed: {failures:?}"));
    }
    Ok(())
}

/// The lab runs of (link, initiator, transport, op), in repetition order.
fn runs(t: &Table, link: &str, initiator: &str, transport: &str, op: &str) -> Vec<f64> {
    t.runs(&[("link", link), ("initiator", initiator), ("transport", transport), ("op", op)], "value")
}

/// The lab's table for the report, or `None` without a lab run.
pub(super) fn table(dir: &Path) -> Result<Option<String>, String> {
    let Some(t) = Table::read(dir, "lab.csv")? else { return Ok(None) };
    let mut md = String::from("| link | initiator | op | TCP | iSER | iSER / TCP (min–max) |\n|---|---|---|---:|---:|---:|\n");
    for link in ["rxe", "siw"] {
        for initiator in ["riser", "kernel"] {
            for op in ["write", "read", "randread"] {
                let (tcp_runs, iser_runs) = (runs(&t, link, initiator, "tcp", op), runs(&t, link, initiator, "iser", op));
                if tcp_runs.is_empty() && iser_runs.is_empty() {
                    continue;
                }
                // Each repetition ran iSER and TCP one after the other: the ratio is the median
                // of the per-repetition ratios.
                let ratio = Spread::of_ratios(&iser_runs, &tcp_runs);
                let (tcp, iser) = (median(tcp_runs), median(iser_runs));
                let unit = if op == "randread" { "IOPS" } else { "MiB/s" };
                let what = match op {
                    "randread" => "4K random reads, QD 8",
                    "read" if initiator == "kernel" => "1M reads (dd O_DIRECT)",
                    "write" if initiator == "kernel" => "1M writes (dd O_DIRECT)",
                    "read" => "1M reads, QD 8",
                    _ => "1M writes, QD 8",
                };
                let who = if initiator == "kernel" { "Linux (open-iscsi)" } else { "riser" };
                let _ = writeln!(
                    md,
                    "| {link} | {who} | {what} | {tcp:.1} {unit} | {iser:.1} {unit} | {:.2}× ({:.2}–{:.2}) |",
                    ratio.median, ratio.min, ratio.max
                );
            }
        }
    }
    // iWARP against RoCE: the same initiator, transport and op on siw over rxe.
    let mut cmp = Vec::new();
    for initiator in ["riser", "kernel"] {
        for op in ["write", "read"] {
            // Different links ran minutes apart: a ratio of medians.
            let r = median(runs(&t, "siw", initiator, "iser", op)) / median(runs(&t, "rxe", initiator, "iser", op));
            if r.is_finite() {
                cmp.push(format!("{} iSER {op}s {r:.2}×", if initiator == "kernel" { "Linux" } else { "riser" }));
            }
        }
    }
    if !cmp.is_empty() {
        let _ = writeln!(md, "\niWARP (siw) over RoCE (rxe), same initiator and op: {}.", cmp.join(", "));
    }
    Ok(Some(md))
}
