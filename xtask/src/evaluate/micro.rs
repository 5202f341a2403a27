//! Section 7: the criterion micro-benchmarks (benches/: PDU and BHS parse/emit, CRC32C, CDB
//! parse/emit, login, iWARP FPDU framing with and without the MPA CRC, DDP and MPA parse, the
//! iSER header), run briefly and summarised: the median time per iteration and, where the bench
//! declares one, the throughput.

use super::{Eval, root};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

/// Every file called `name` under `dir`, recursively.
fn find(dir: &Path, name: &str, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            find(&p, name, out);
        } else if p.file_name().is_some_and(|n| n == name) {
            out.push(p);
        }
    }
}

pub(super) fn run(ev: &Eval) -> Result<(), String> {
    let (warm, measure) = if ev.quick { ("0.2", "0.5") } else { ("1", "3") };
    let started = std::time::SystemTime::now();
    let log = ev.out.join("micro.log");
    println!("micro: cargo bench (criterion, {measure} s per benchmark; its output in {})", log.display());
    let log_file = std::fs::File::create(&log).map_err(|e| format!("{}: {e}", log.display()))?;
    let out = Command::new("cargo")
        .current_dir(root())
        .args(["bench", "--quiet", "--bench", "pdu", "--bench", "cdb", "--bench", "login", "--bench", "iwarp", "--"])
        .args(["--warm-up-time", warm, "--measurement-time", measure])
        .stdout(log_file.try_clone().map_err(|e| e.to_string())?)
        .stderr(log_file)
        .status()
        .map_err(|e| format!("cargo bench: {e}"))?;
    if !out.success() {
        return Err(format!("cargo bench failed: see {}", log.display()));
    }
    let dir = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), std::path::PathBuf::from).join("criterion");
    let mut found = Vec::new();
    find(&dir, "benchmark.json", &mut found);
    let mut rows = Vec::new();
    for b in found.iter().filter(|p| p.parent().is_some_and(|d| d.ends_with("new"))) {
        // Only what this run measured (criterion keeps every earlier run's directories).
        if std::fs::metadata(b).and_then(|m| m.modified()).is_ok_and(|t| t < started) {
            continue;
        }
        let read = |p: &Path| -> Result<serde_json::Value, String> {
            let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))
        };
        let bench = read(b)?;
        let est = read(&b.with_file_name("estimates.json"))?;
        let id = bench["full_id"].as_str().unwrap_or("?").to_string();
        let ns = est["median"]["point_estimate"].as_f64().unwrap_or(f64::NAN);
        let (unit, rate) = match (bench["throughput"]["Bytes"].as_f64(), bench["throughput"]["Elements"].as_f64()) {
            (Some(bytes), _) => ("MiB/s", bytes / (ns * 1e-9) / 1048576.0),
            (_, Some(n)) => ("M/s", n / (ns * 1e-9) / 1e6),
            _ => ("M/s", 1.0 / (ns * 1e-9) / 1e6),
        };
        rows.push((id, ns, unit, rate));
    }
    if rows.is_empty() {
        return Err(format!("cargo bench left no results under {}", dir.display()));
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    let mut csv = format!("{},bench,median_ns,unit,rate\n", super::COMMON);
    for (id, ns, unit, rate) in rows {
        let _ = writeln!(csv, "{}{},{ns:.2},{unit},{rate:.1}", ev.row(), id.replace(',', ";"));
    }
    ev.write("micro.csv", &csv)
}
