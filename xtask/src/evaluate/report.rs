//! Section 8: `EVALUATION.md`, generated from the run's CSVs: a one-screen summary with every
//! goal of issue 14 against its figure, then the machine, the method, each section's tables and
//! figures, and the caveats.

use super::{Spread, Table, median, num};
use std::fmt::Write as _;
use std::path::Path;

/// One goal: what, the figures, and whether they meet it (`None`: not measured in this run).
struct Goal {
    what: &'static str,
    measured: String,
    met: Option<bool>,
}

fn verdict(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "**missed**",
        None => "not measured",
    }
}

/// "2.61× (2.40–2.80)".
fn spread(s: Spread) -> String {
    format!("{:.2}× ({:.2}–{:.2})", s.median, s.min, s.max)
}

fn goals(dir: &Path) -> Result<Vec<Goal>, String> {
    let peers = Table::read(dir, "peers.csv")?;
    let thr = Table::read(dir, "throughput.csv")?;
    let iops = Table::read(dir, "iops.csv")?;
    let mut goals = Vec::new();
    // riser target over tgtd for some workloads and clients: each median ratio, and the least.
    let over_tgtd = |what: &'static str, workloads: &[(&str, u64, u32)], clients: &[&str], want: f64| {
        let Some(t) = &peers else { return Goal { what, measured: "-".into(), met: None } };
        let mut parts = Vec::new();
        let mut least = f64::INFINITY;
        for &w in workloads {
            for c in clients {
                let s = Spread::of_ratios(&super::peers::values(t, "riser", c, w, "iops"), &super::peers::values(t, "tgtd", c, w, "iops"));
                if s.median.is_finite() {
                    least = least.min(s.median);
                    parts.push(format!("{} {}: {}", c, super::peers::workload_name(w.0, w.1, w.2), spread(s)));
                }
            }
        }
        let met = (!parts.is_empty()).then_some(least >= want);
        Goal { what, measured: parts.join("; "), met }
    };
    goals.push(over_tgtd(
        "riser target ≥ 2.5× tgtd on 512 KiB–1 MiB reads",
        &[("read", 512 << 10, 8), ("read", 1 << 20, 8)],
        &["fio-libiscsi", "iscsi-perf"],
        2.5,
    ));
    goals.push(over_tgtd(
        "riser target ≥ 2.5× tgtd on 4 KiB random-read IOPS",
        &[("randread", 4096, 32)],
        &["fio-libiscsi", "iscsi-perf"],
        2.5,
    ));
    goals.push(over_tgtd("riser target ≥ 1.5× tgtd on 1 MiB writes", &[("write", 1 << 20, 8)], &["fio-libiscsi"], 1.5));
    // The riser initiator over libiscsi (fio), the same target.
    goals.push(match &peers {
        None => Goal { what: "riser initiator ≥ 1.2× libiscsi", measured: "-".into(), met: None },
        Some(t) => {
            let mut parts = Vec::new();
            let mut least = f64::INFINITY;
            for w in super::peers::present(t) {
                for target in ["riser", "tgtd"] {
                    let s = Spread::of_ratios(
                        &super::peers::values(t, target, "riser-initiator", w, "iops"),
                        &super::peers::values(t, target, "fio-libiscsi", w, "iops"),
                    );
                    if s.median.is_finite() {
                        least = least.min(s.median);
                        parts.push(format!("{} on {target}: {}", super::peers::workload_name(w.0, w.1, w.2), spread(s)));
                    }
                }
            }
            Goal {
                what: "riser initiator ≥ 1.2× libiscsi", measured: parts.join("; "), met: (!parts.is_empty()).then_some(least >= 1.2)
            }
        }
    });
    // riser initiator against riser target, 4 KiB random reads at QD 32 over TCP.
    goals.push(match &iops {
        None => Goal { what: "riser ↔ riser ≥ 100k 4 KiB random-read IOPS at QD 32", measured: "-".into(), met: None },
        Some(t) => {
            let rows = t.select(&[("transport", "tcp"), ("rw", "randread"), ("io_bytes", "4096"), ("queue_depth", "32")]);
            let v = Spread::of(&rows.iter().map(|r| num(r, "iops")).collect::<Vec<_>>());
            let iser = median(
                t.select(&[("transport", "iser"), ("rw", "randread"), ("io_bytes", "4096"), ("queue_depth", "32")])
                    .iter()
                    .map(|r| num(r, "iops"))
                    .collect(),
            );
            Goal {
                what: "riser ↔ riser ≥ 100k 4 KiB random-read IOPS at QD 32",
                measured: format!("TCP {:.0} IOPS (runs {:.0}–{:.0}); iSER {iser:.0}", v.median, v.min, v.max),
                met: v.median.is_finite().then_some(v.median >= 100_000.0),
            }
        }
    });
    // iSER against TCP from 512 KiB, throughput and CPU per GiB (both processes).
    goals.push(match &thr {
        None => Goal { what: "iSER ≥ 0.9× TCP with ≤ 1.0× CPU per GiB at ≥ 512 KiB", measured: "-".into(), met: None },
        Some(t) => {
            let (mut parts, mut ok) = (Vec::new(), true);
            for qd in ["1", "8"] {
                for op in ["read", "write"] {
                    let rows = |tr: &str| t.select(&[("params", "defaults"), ("transport", tr), ("op", op), ("queue_depth", qd)]);
                    let (tcp, iser) = (rows("tcp"), rows("iser"));
                    let sizes: Vec<u64> = [512u64 << 10, 1 << 20, 4 << 20, 16 << 20]
                        .into_iter()
                        .filter(|s| tcp.iter().any(|r| num(r, "io_bytes") as u64 == *s))
                        .collect();
                    let of = |rows: &[&std::collections::BTreeMap<String, String>], s: u64, col: &str| {
                        let v: Vec<_> = rows.iter().copied().filter(|r| num(r, "io_bytes") as u64 == s).collect();
                        super::by_rep(&v, col)
                    };
                    let ratios: Vec<f64> =
                        sizes.iter().map(|&s| Spread::of_ratios(&of(&iser, s, "mib_s"), &of(&tcp, s, "mib_s")).median).collect();
                    let cpu = |rows: &[&std::collections::BTreeMap<String, String>], s| {
                        super::throughput::cpu_per_gib(rows, s, "target_cpu_s") + super::throughput::cpu_per_gib(rows, s, "initiator_cpu_s")
                    };
                    let cpus: Vec<f64> = sizes.iter().map(|&s| cpu(&iser, s) / cpu(&tcp, s)).collect();
                    let (lo, hi) = (Spread::of(&ratios), Spread::of(&cpus));
                    ok &= lo.min >= 0.9 && hi.max <= 1.0;
                    parts.push(format!("{op}s QD {qd}: {:.2}–{:.2}× throughput, {:.2}–{:.2}× CPU/GiB", lo.min, lo.max, hi.min, hi.max));
                }
            }
            Goal { what: "iSER ≥ 0.9× TCP with ≤ 1.0× CPU per GiB at ≥ 512 KiB", measured: parts.join("; "), met: Some(ok) }
        }
    });
    // The target's CPU per GiB over tgtd's, the same client (fio) and workload.
    goals.push(match &peers {
        None => Goal { what: "riser target CPU per GiB ≤ 0.5× tgtd", measured: "-".into(), met: None },
        Some(t) => {
            let mut parts = Vec::new();
            let mut worst = 0f64;
            for w in [("read", 1u64 << 20, 8u32), ("write", 1 << 20, 8)] {
                for c in ["fio-libiscsi", "riser-initiator"] {
                    let (r, g) = (
                        super::peers::cpu_per_gib(t, "riser", c, w, "target_cpu_s"),
                        super::peers::cpu_per_gib(t, "tgtd", c, w, "target_cpu_s"),
                    );
                    if (r / g).is_finite() {
                        worst = worst.max(r / g);
                        parts.push(format!(
                            "{} with {c}: {r:.2} vs {g:.2} s/GiB = {:.2}×",
                            super::peers::workload_name(w.0, w.1, w.2),
                            r / g
                        ));
                    }
                }
            }
            Goal {
                what: "riser target CPU per GiB ≤ 0.5× tgtd",
                measured: parts.join("; "),
                met: (!parts.is_empty()).then_some(worst <= 0.5),
            }
        }
    });
    Ok(goals)
}

/// The goals as plain text (printed at the end of a run).
pub(super) fn summary(dir: &Path) -> Result<String, String> {
    let mut s = String::from("goals (issue 14):\n");
    for g in goals(dir)? {
        let _ = writeln!(s, "  [{}] {}: {}", verdict(g.met).trim_matches('*'), g.what, g.measured);
    }
    Ok(s)
}

/// A markdown image line when the figure exists: `![alt](prefix/name.png)`.
fn figure(dir: &Path, prefix: &str, name: &str, alt: &str) -> String {
    if dir.join(format!("{name}.png")).exists() { format!("![{alt}]({prefix}{name}.png)\n\n") } else { String::new() }
}

pub(super) fn write(dir: &Path, path: &Path) -> Result<(), String> {
    // Figures are linked relative to the report.
    let absolute = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    let (dir_abs, base) = (absolute(dir), absolute(path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."))));
    let prefix = match dir_abs.strip_prefix(&base) {
        Ok(rel) if rel.as_os_str().is_empty() => String::new(),
        Ok(rel) => format!("{}/", rel.display()),
        Err(_) => format!("{}/", dir.display()),
    };
    let fig = |name: &str, alt: &str| figure(dir, &prefix, name, alt);
    let any = ["throughput.csv", "iops.csv", "peers.csv", "sweep.csv", "micro.csv", "lab.csv"]
        .iter()
        .find_map(|f| Table::read(dir, f).ok().flatten().and_then(|t| t.rows.first().cloned()))
        .ok_or_else(|| format!("{}: no CSV of an evaluate run", dir.display()))?;
    let field = |k: &str| any.get(k).cloned().unwrap_or_default();
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# riser: performance evaluation\n\n\
         Generated by `cargo xtask evaluate` from the CSVs {} (commit `{}`, {}, on {}). \
         Every figure below is re-made by `cargo xtask evaluate --plot-only DIR` from those CSVs; \
         `cargo xtask evaluate --quick` re-runs a short form of everything in a few minutes.\n",
        if prefix.is_empty() { "beside it".to_string() } else { format!("in `{prefix}`") },
        field("commit"),
        field("date"),
        field("machine")
    );
    md.push_str(
        "## Summary: the goals\n\n| goal | measured in this run (median × of per-run ratios, min–max) | verdict |\n|---|---|---|\n",
    );
    for g in goals(dir)? {
        let _ = writeln!(md, "| {} | {} | {} |", g.what, g.measured.replace('|', "/"), verdict(g.met));
    }
    md.push_str(&super::sections::write_sections(dir, &fig)?);
    std::fs::write(path, md).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(())
}
