//! `cargo xtask evaluate`: the founding paper's measurements re-made on this host, and what it
//! named as future work (issue 14).
//!
//! Sections, each writing one CSV in the output directory (every row with the date, commit and
//! machine), and the figures and the report drawn from those CSVs:
//! 1. `throughput.csv` ([`throughput`]): payload MiB/s against transfer size, riser TCP against
//!    riser iSER (software iWARP RNIC), the paper's parameters and riser's, QD 1 and 8, as a
//!    share of the loopback TCP ceiling; with both processes' CPU seconds (section 3).
//! 2. `iops.csv`, `latency-cdf.csv` ([`iops`]): random reads and writes 512 B … 64 KiB at QD 1
//!    and 32, latency percentiles (HdrHistogram in the initiator) and CPU.
//! 4. `peers.csv` ([`peers`]): riser target against tgtd with the same clients (fio's libiscsi
//!    engine, iscsi-perf, the riser initiator), interleaved repetitions.
//! 5. `lab.csv` ([`lab`], `--lab`): rxe and siw in the lab VM, riser's and the kernel's initiator.
//! 6. `sweep.csv` ([`sweep`]): negotiated parameters and the iSER signalling interval and send
//!    queue depth, on 1 MiB writes and 4 KiB random reads.
//! 7. `micro.csv` ([`micro`]): the criterion micro-benchmarks.
//! 8. `EVALUATION.md` ([`report`]): the summary, the goals, the tables and the figures.

mod iops;
mod lab;
mod micro;
mod peers;
mod plot;
mod report;
mod sections;
mod sweep;
mod throughput;

use super::{Measured, RunningTarget, arg_value, build_examples, ensure_packages, free_port, measured, median, root};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The columns every CSV starts with.
const COMMON: &str = "date,commit,machine";

/// What every section needs: where to write, how long to measure, the facts for each row.
struct Eval {
    date: String,
    commit: String,
    machine: String,
    quick: bool,
    reps: usize,
    out: PathBuf,
}

impl Eval {
    fn new(quick: bool, reps: usize, out: PathBuf) -> Self {
        let out_of = |cmd: &str, args: &[&str]| {
            Command::new(cmd)
                .args(args)
                .current_dir(root())
                .output()
                .map_or_else(|_| "unknown".to_string(), |o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        };
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines().find(|l| l.starts_with("model name")).and_then(|l| l.split_once(':')).map(|(_, m)| m.trim().to_string())
            })
            .unwrap_or_else(|| "unknown CPU".into());
        let cores = std::thread::available_parallelism().map_or(0, usize::from);
        let mem = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| m.lines().next().and_then(|l| l.split_whitespace().nth(1)).and_then(|k| k.parse::<u64>().ok()))
            .map_or_else(String::new, |kib| format!(" {} GiB", (kib + (1 << 19)) >> 20));
        Self {
            date: out_of("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
            commit: out_of("git", &["rev-parse", "--short=12", "HEAD"]),
            // No commas: the field goes into a CSV as is.
            machine: format!("{cpu} x{cores}{mem}; Linux {}", out_of("uname", &["-r"])).replace(',', ";"),
            quick,
            reps,
            out,
        }
    }

    /// The common columns of one row (with a trailing comma).
    fn row(&self) -> String {
        format!("{},{},{},", self.date, self.commit, self.machine)
    }

    /// Seconds each timed (`load`) run lasts.
    fn seconds(&self) -> f64 {
        if self.quick { 1.0 } else { 3.0 }
    }

    fn write(&self, name: &str, text: &str) -> Result<(), String> {
        let p = self.out.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    }

    fn bar(&self, len: usize, what: &str) -> Result<indicatif::ProgressBar, String> {
        let bar = indicatif::ProgressBar::new(len as u64);
        let style = format!("{what:<11} {{bar:30}} {{pos}}/{{len}} {{msg}} [{{elapsed}}]");
        bar.set_style(indicatif::ProgressStyle::with_template(&style).map_err(|e| e.to_string())?);
        Ok(bar)
    }
}

/// A CSV read back: the header's names and the rows as name → field.
struct Table {
    rows: Vec<BTreeMap<String, String>>,
}

impl Table {
    /// `dir/name`, or `None` when the section did not run.
    fn read(dir: &Path, name: &str) -> Result<Option<Self>, String> {
        let path = dir.join(name);
        let Ok(text) = std::fs::read_to_string(&path) else { return Ok(None) };
        let mut lines = text.lines();
        let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
        let mut rows = Vec::new();
        for (n, line) in lines.enumerate() {
            let f: Vec<&str> = line.split(',').collect();
            if f.len() != header.len() {
                return Err(format!("{}, line {}: {} fields, the header has {}", path.display(), n + 2, f.len(), header.len()));
            }
            rows.push(header.iter().zip(f).map(|(h, v)| ((*h).to_string(), v.to_string())).collect());
        }
        Ok(Some(Self { rows }))
    }

    /// The rows whose fields equal the given values.
    fn select(&self, want: &[(&str, &str)]) -> Vec<&BTreeMap<String, String>> {
        self.rows.iter().filter(|r| want.iter().all(|(k, v)| r.get(*k).is_some_and(|x| x == v))).collect()
    }

    /// The values of `col` in the rows whose fields equal `want`, in repetition order (so two
    /// such lists pair the runs of the same repetition).
    fn runs(&self, want: &[(&str, &str)], col: &str) -> Vec<f64> {
        by_rep(&self.select(want), col)
    }

    /// The distinct values of a column, in first-seen order.
    fn distinct(&self, col: &str) -> Vec<String> {
        let mut seen = Vec::new();
        for r in &self.rows {
            if let Some(v) = r.get(col).filter(|v| !seen.contains(*v)) {
                seen.push(v.clone());
            }
        }
        seen
    }
}

/// The values of `col` in `rows`, in repetition order.
fn by_rep(rows: &[&BTreeMap<String, String>], col: &str) -> Vec<f64> {
    let mut v = rows.to_vec();
    v.sort_by_key(|r| num(r, "rep") as u64);
    v.iter().map(|r| num(r, col)).collect()
}

/// A field as a number (NaN when absent or not a number).
fn num(r: &BTreeMap<String, String>, col: &str) -> f64 {
    r.get(col).and_then(|v| v.parse().ok()).unwrap_or(f64::NAN)
}

/// Minimum, median and maximum of some runs.
#[derive(Clone, Copy, Debug)]
struct Spread {
    min: f64,
    median: f64,
    max: f64,
}

impl Spread {
    fn of(v: &[f64]) -> Self {
        let v: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
        let min = v.iter().copied().fold(f64::NAN, f64::min);
        let max = v.iter().copied().fold(f64::NAN, f64::max);
        Self { min, median: median(v), max }
    }

    /// Of the pairwise ratios `a[i] / b[i]` (runs side by side in the same repetition).
    fn of_ratios(a: &[f64], b: &[f64]) -> Self {
        Self::of(&a.iter().zip(b).map(|(x, y)| x / y).collect::<Vec<_>>())
    }
}

/// What one `load` of the example initiator measured.
struct LoadRun {
    iops: f64,
    mib_s: f64,
    p50_us: f64,
    p99_us: f64,
    p999_us: f64,
    m: Measured,
}

/// The example initiator's `load` (`rw`: read, write, randread, randwrite) of `bs`-byte
/// commands at `qd` for `secs` against `url`, beside the target process `target_pid`; `extra`:
/// more of its options.
fn load(target_pid: u32, url: &str, rw: &str, bs: u64, qd: u32, secs: f64, extra: &[String]) -> Result<LoadRun, String> {
    let m = measured(
        target_pid,
        Command::new(root().join("target/release/examples/initiator"))
            .args(["load", url, "--rw", rw, "--block-size", &bs.to_string(), "--queue-depth", &qd.to_string()])
            .args(["--seconds", &secs.to_string(), "--size", "1GiB"])
            .args(extra),
    )?;
    let line =
        m.stdout.lines().find(|l| l.starts_with("load ")).ok_or_else(|| format!("initiator load {rw} {url}: {}{}", m.stdout, m.stderr))?;
    let field = |k: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(k).and_then(|r| r.strip_prefix('=')))
            .and_then(|v| v.parse::<f64>().ok())
            .ok_or_else(|| format!("initiator load: no {k} in {line:?}"))
    };
    Ok(LoadRun {
        iops: field("iops")?,
        mib_s: field("mib_s")?,
        p50_us: field("p50_us")?,
        p99_us: field("p99_us")?,
        p999_us: field("p999_us")?,
        m,
    })
}

/// `cargo xtask evaluate [--quick] [--lab] [--reps N] [--out DIR] [--only SECTIONS] [--publish]`,
/// or `--plot-only DIR [--publish]` to redraw the figures and the report from a run's CSVs
/// (`--publish`: the report is docs/EVALUATION.md, the run's directory docs/evaluation).
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let publish = args.iter().any(|a| a == "--publish");
    if let Some(dir) = arg_value(args, "--plot-only") {
        plot::register_font()?;
        let report = publish.then(|| root().join("docs/EVALUATION.md"));
        return finish(Path::new(dir), report.as_deref());
    }
    let quick = args.iter().any(|a| a == "--quick");
    let reps: usize = arg_value(args, "--reps").map_or(Ok(if quick { 1 } else { 3 }), |r| r.parse().map_err(|_| format!("--reps {r}")))?;
    let out = match arg_value(args, "--out") {
        Some(d) => PathBuf::from(d),
        None if publish => root().join("docs/evaluation"),
        None => root().join("target/evaluate"),
    };
    let all = ["throughput", "iops", "peers", "sweep", "micro"];
    let only: Vec<&str> = arg_value(args, "--only").map_or_else(|| all.to_vec(), |o| o.split(',').collect());
    if let Some(bad) = only.iter().find(|s| !all.contains(s) && **s != "lab") {
        return Err(format!("--only {bad}: sections are {}, lab", all.join(", ")));
    }
    std::fs::create_dir_all(&out).map_err(|e| format!("{}: {e}", out.display()))?;
    ensure_packages(&[("iperf3", "iperf3"), ("iscsi-perf", "libiscsi-bin"), ("tgtd", "tgt")])?;
    plot::register_font()?;
    build_examples()?;
    let ev = Eval::new(quick, reps, out.clone());
    let t0 = std::time::Instant::now();
    let mut took = Vec::new();
    let mut section = |name: &str, f: &dyn Fn(&Eval) -> Result<(), String>| {
        if !only.contains(&name) {
            return Ok(());
        }
        let t = std::time::Instant::now();
        f(&ev)?;
        took.push(format!("{name} {:.0} s", t.elapsed().as_secs_f64()));
        Ok::<(), String>(())
    };
    section("throughput", &throughput::run)?;
    section("iops", &iops::run)?;
    section("peers", &peers::run)?;
    section("sweep", &sweep::run)?;
    section("micro", &micro::run)?;
    if args.iter().any(|a| a == "--lab") || only.contains(&"lab") {
        let t = std::time::Instant::now();
        lab::run(&ev)?;
        took.push(format!("lab {:.0} s", t.elapsed().as_secs_f64()));
    }
    let report = publish.then(|| root().join("docs/EVALUATION.md"));
    finish(&out, report.as_deref())?;
    println!("evaluate: {} in {:.0} s ({})", out.display(), t0.elapsed().as_secs_f64(), took.join(", "));
    Ok(())
}

/// Draw every figure and write the report from the CSVs in `dir`: `dir/EVALUATION.md`, or
/// `report` with the figures linked relative to it.
fn finish(dir: &Path, report: Option<&Path>) -> Result<(), String> {
    throughput::figures(dir)?;
    iops::figures(dir)?;
    peers::figures(dir)?;
    sweep::figures(dir)?;
    let path = report.map_or_else(|| dir.join("EVALUATION.md"), Path::to_path_buf);
    report::write(dir, &path)?;
    print!("{}", report::summary(dir)?);
    println!("report: {}", path.display());
    Ok(())
}

/// Another RunningTarget with a TCP portal and an iSER (software RNIC) portal, a RAM LUN of `lun`,
/// `params` offered as `--param`s and `iser` as `--iser-param`s: (target, TCP URL, iSER URL).
fn target_with(iqn: &str, lun: &str, params: &[String], iser: &[String]) -> Result<(RunningTarget, [String; 2]), String> {
    let iser_portal = format!("127.0.0.1:{}", free_port()?);
    let lun = format!("ram:{lun}");
    let mut targs: Vec<&str> = vec!["--target-name", iqn, "--lun", &lun, "--iser-portal", &iser_portal];
    for p in params {
        targs.extend(["--param", p]);
    }
    for p in iser {
        targs.extend(["--iser-param", p]);
    }
    let target = RunningTarget::start(&targs)?;
    let urls = [format!("iscsi://127.0.0.1:{}/{iqn}/0", target.port), format!("iser://{iser_portal}/{iqn}/0")];
    Ok((target, urls))
}

/// Write the whole LUN (up to 1 GiB) once, so no measured run pays for the target's first touch of its memory.
fn prefill(target: &RunningTarget, url: &str, extra: &[&str]) -> Result<(), String> {
    super::initiator_run(target.child.id(), "write", url, 1 << 30, 1 << 20, 8, extra).map(|_| ())
}

/// A byte count as 512, 4K, 1M.
fn size_name(b: u64) -> String {
    if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{}M", b >> 20)
    } else if b >= 1 << 10 && b.is_multiple_of(1 << 10) {
        format!("{}K", b >> 10)
    } else {
        b.to_string()
    }
}
