//! Section 4: riser against its peers with the same clients in the same run. The riser target
//! and tgtd (RAM-backed LUNs: riser's RAM store, tgtd's file on /dev/shm; tgtd's limits raised to
//! riser's defaults, so both negotiate MaxRecvDataSegmentLength 256 KiB, MaxBurstLength 1 MiB,
//! FirstBurstLength 256 KiB, InitialR2T=No, ImmediateData=Yes) are both measured by fio with the
//! libiscsi engine, by libiscsi's iscsi-perf and by the riser initiator; so the riser initiator
//! also meets libiscsi against each target. Repetitions interleave every target and client.

use super::{Eval, Spread, Table, load, measured, plot, size_name};
use plotters::style::RGBColor;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The workloads: fio's rw name, size, queue depth, and whether --quick runs it.
const WORKLOADS: [(&str, u64, u32, bool); 4] =
    [("read", 512 << 10, 8, false), ("read", 1 << 20, 8, true), ("randread", 4096, 32, true), ("write", 1 << 20, 8, true)];

/// The initiator name libiscsi's clients log in with.
const LIBISCSI_IQN: &str = "iqn.2026-11.io.riser.test:evaluate";

/// fio with the libiscsi engine: the one ../shared/peers/build-fio-libiscsi.sh builds (Debian's
/// fio lacks the engine), else a fio on the PATH that has it.
fn fio() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|c| c.join("riser/fio-iscsi/bin/fio"));
    let has_engine = |f: &Path| Command::new(f).arg("--enghelp=libiscsi").output().is_ok_and(|o| o.status.success());
    if let Some(c) = cache.filter(|c| has_engine(c)) {
        return Some(c);
    }
    if has_engine(Path::new("fio")) { Some(PathBuf::from("fio")) } else { None }
}

/// What one client run gave: IOPS, MiB/s, and the CPU of the target and of the client.
struct Run {
    iops: f64,
    mib_s: f64,
    target_cpu_s: f64,
    client_cpu_s: f64,
    seconds: f64,
}

fn client_run(
    client: &str,
    fio: Option<&Path>,
    url: &str,
    pid: Option<u32>,
    (rw, bs, qd): (&str, u64, u32),
    secs: f64,
) -> Result<Option<Run>, String> {
    let pid = pid.unwrap_or(u32::MAX);
    let wall = secs.ceil() as u64;
    let m = match client {
        "riser-initiator" => {
            let r = load(pid, url, rw, bs, qd, secs, &[])?;
            return Ok(Some(Run {
                iops: r.iops,
                mib_s: r.mib_s,
                target_cpu_s: r.m.target_cpu_s,
                client_cpu_s: r.m.client_cpu_s,
                seconds: r.m.wall_s,
            }));
        }
        "fio-libiscsi" => {
            let Some(fio) = fio else { return Ok(None) };
            let filename = url.replace(':', "\\:");
            measured(
                pid,
                Command::new("timeout")
                    .args(["-k", "5", &(wall + 30).to_string()])
                    .arg(fio)
                    .args([
                        "--name=evaluate",
                        "--ioengine=libiscsi",
                        &format!("--initiator={LIBISCSI_IQN}"),
                        &format!("--filename={filename}"),
                    ])
                    .args([format!("--rw={rw}"), format!("--bs={bs}"), format!("--iodepth={qd}"), format!("--runtime={wall}")])
                    .args(["--time_based=1", "--output-format=json"]),
            )?
        }
        "iscsi-perf" => {
            if rw.contains("write") {
                return Ok(None);
            }
            let mut c = Command::new("timeout");
            c.args(["-k", "5", &(wall + 30).to_string(), "iscsi-perf", "-i", LIBISCSI_IQN, "-m", &qd.to_string()]);
            c.args(["-b", &(bs / 512).to_string(), "-t", &wall.to_string()]);
            if rw == "randread" {
                c.arg("-r");
            }
            measured(pid, c.arg(url))?
        }
        other => return Err(format!("unknown client {other}")),
    };
    let iops = if client == "fio-libiscsi" {
        // fio may print a note before its JSON (with an external engine it wrongly warns that a
        // synchronous engine caps the queue depth at 1; its iodepth_level shows it does not).
        let json_text = m.stdout.find('{').map_or("", |i| &m.stdout[i..]);
        let json: serde_json::Value =
            serde_json::from_str(json_text).map_err(|e| format!("fio {rw} {bs} on {url}: {e}: {}{}", m.stdout, m.stderr))?;
        let side = if rw.contains("write") { "write" } else { "read" };
        json["jobs"][0][side]["iops"].as_f64().ok_or_else(|| format!("fio {rw} {bs} on {url}: no iops"))?
    } else {
        // iscsi-perf redraws its progress line with \r; the last "iops average N" is the run's.
        let text = m.stdout.replace('\r', "\n");
        let avg = text.rsplit("iops average ").next().filter(|_| text.contains("iops average "));
        avg.and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse::<f64>().ok()).ok_or_else(|| {
            format!("iscsi-perf {rw} {bs} on {url}: no result ({}): {}{}", if m.success { "exit 0" } else { "failed" }, m.stdout, m.stderr)
        })?
    };
    Ok(Some(Run {
        iops,
        mib_s: iops * bs as f64 / 1048576.0,
        target_cpu_s: m.target_cpu_s,
        client_cpu_s: m.client_cpu_s,
        seconds: m.wall_s,
    }))
}

pub(super) fn run(ev: &Eval) -> Result<(), String> {
    // fio with the libiscsi engine (Debian's lacks it); without it the fio rows are missing.
    if fio().is_none() {
        let _ = Command::new("bash")
            .arg(super::super::shared().join("peers/build-fio-libiscsi.sh"))
            .stdout(std::process::Stdio::null())
            .status();
    }
    let fio = fio();
    if fio.is_none() {
        eprintln!("evaluate: fio with the libiscsi engine could not be built: no fio rows");
    }
    let iqn = "iqn.2026-11.io.riser:evaluate-peers";
    let riser = super::RunningTarget::start(&["--target-name", iqn, "--lun", "ram:1GiB"])?;
    let tiqn = "iqn.2026-11.io.riser.test:evaluate";
    let tgtd = super::super::Tgtd::start(tiqn, "1G", "shm", true)?;
    let targets = [
        ("riser", format!("iscsi://127.0.0.1:{}/{iqn}/0", riser.port), Some(riser.child.id())),
        ("tgtd", format!("iscsi://127.0.0.1:{}/{tiqn}/1", tgtd.port), tgtd.pid),
    ];
    for (_, url, pid) in &targets {
        super::super::initiator_run(pid.unwrap_or(u32::MAX), "write", url, 1 << 30, 1 << 20, 8, &[])?;
    }
    let workloads: Vec<_> = WORKLOADS.iter().filter(|w| w.3 || !ev.quick).collect();
    let clients = ["fio-libiscsi", "iscsi-perf", "riser-initiator"];
    let bar = ev.bar(ev.reps * workloads.len() * clients.len() * targets.len(), "peers")?;
    let mut csv =
        format!("{},target,client,rw,io_bytes,queue_depth,rep,run_s,seconds,iops,mib_s,target_cpu_s,client_cpu_s\n", super::COMMON);
    // fio's and iscsi-perf's runs are whole seconds; the riser initiator's the same.
    let secs = if ev.quick { 2.0 } else { 5.0 };
    for rep in 0..ev.reps {
        for &&(rw, bs, qd, _) in &workloads {
            for client in clients {
                for (target, url, pid) in &targets {
                    bar.set_message(format!("{client} -> {target}: {rw} {} QD {qd}", size_name(bs)));
                    if let Some(r) = client_run(client, fio.as_deref(), url, *pid, (rw, bs, qd), secs)? {
                        let cpu = |c: f64| if pid.is_some() { format!("{c:.3}") } else { "nan".into() };
                        let _ = writeln!(
                            csv,
                            "{}{target},{client},{rw},{bs},{qd},{rep},{secs},{:.3},{:.0},{:.1},{},{:.3}",
                            ev.row(),
                            r.seconds,
                            r.iops,
                            r.mib_s,
                            cpu(r.target_cpu_s),
                            r.client_cpu_s
                        );
                    }
                    bar.inc(1);
                }
            }
        }
    }
    bar.finish_and_clear();
    drop((riser, tgtd));
    ev.write("peers.csv", &csv)
}

/// A workload's short name: "read 1M QD 8".
pub(super) fn workload_name(rw: &str, bs: u64, qd: u32) -> String {
    format!("{rw} {} QD {qd}", size_name(bs))
}

/// The runs' values of `col` for (target, client, workload), in repetition order.
pub(super) fn values(t: &Table, target: &str, client: &str, (rw, bs, qd): (&str, u64, u32), col: &str) -> Vec<f64> {
    t.runs(&[("target", target), ("client", client), ("rw", rw), ("io_bytes", &bs.to_string()), ("queue_depth", &qd.to_string())], col)
}

/// CPU seconds (`col`: target_cpu_s or client_cpu_s) per GiB moved over the runs of
/// (target, client, workload).
pub(super) fn cpu_per_gib(t: &Table, target: &str, client: &str, w: (&str, u64, u32), col: &str) -> f64 {
    let cpu: f64 = values(t, target, client, w, col).iter().sum();
    let mib: f64 = values(t, target, client, w, "mib_s").iter().zip(values(t, target, client, w, "run_s")).map(|(m, s)| m * s).sum();
    cpu / (mib / 1024.0)
}

/// The workloads present in the table, in [`WORKLOADS`] order.
pub(super) fn present(t: &Table) -> Vec<(&'static str, u64, u32)> {
    WORKLOADS
        .iter()
        .map(|w| (w.0, w.1, w.2))
        .filter(|&(rw, bs, qd)| !values(t, "riser", "riser-initiator", (rw, bs, qd), "iops").is_empty())
        .collect()
}

/// `peers-target.{png,svg}` (riser target over tgtd, per client) and `peers-initiator.{png,svg}`
/// (riser initiator over fio-libiscsi, per target): medians of the per-repetition ratios.
pub(super) fn figures(dir: &Path) -> Result<(), String> {
    let Some(t) = Table::read(dir, "peers.csv")? else { return Ok(()) };
    let workloads = present(&t);
    let groups: Vec<String> = workloads.iter().map(|&(rw, bs, qd)| workload_name(rw, bs, qd)).collect();
    let ratio =
        |a: (&str, &str), b: (&str, &str), w| Spread::of_ratios(&values(&t, a.0, a.1, w, "iops"), &values(&t, b.0, b.1, w, "iops")).median;
    let colors = [RGBColor(31, 90, 160), RGBColor(90, 160, 90), RGBColor(200, 30, 40)];
    let bars: Vec<plot::Bars> = ["fio-libiscsi", "iscsi-perf", "riser-initiator"]
        .iter()
        .zip(colors)
        .map(|(c, color)| plot::Bars {
            label: format!("measured with {c}"),
            color,
            values: workloads.iter().map(|&w| ratio(("riser", c), ("tgtd", c), w)).collect(),
        })
        .collect();
    plot::bars(
        &dir.join("peers-target"),
        "riser target over tgtd, same client, same run (× tgtd; median of runs)",
        "workload",
        "riser / tgtd",
        &groups,
        &bars,
    )?;
    let bars: Vec<plot::Bars> = [("riser", colors[2]), ("tgtd", colors[0])]
        .iter()
        .map(|&(target, color)| plot::Bars {
            label: format!("against the {target} target"),
            color,
            values: workloads.iter().map(|&w| ratio((target, "riser-initiator"), (target, "fio-libiscsi"), w)).collect(),
        })
        .collect();
    plot::bars(
        &dir.join("peers-initiator"),
        "riser initiator over libiscsi (fio), same target, same run (median of runs)",
        "workload",
        "riser initiator / fio-libiscsi",
        &groups,
        &bars,
    )
}
