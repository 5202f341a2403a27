//! `cargo xtask evaluate`: the founding paper's measurements re-made on this host (issue 14).
//!
//! Built so far: section 1, payload throughput against transfer size (1 KiB … 16 MiB, powers of
//! two), reads and writes, one command outstanding (as the paper) and eight, riser over TCP
//! against riser over iSER on the software iWARP RNIC, same target process and same initiator
//! program, each point also as a share of the single-stream loopback TCP ceiling measured in the
//! same run (the paper states its results as a share of the 10GigE payload maximum). Every run
//! is a row of `throughput.csv` (with the machine, commit and date); `throughput.txt` holds the
//! medians side by side. Plots, IOPS/latency, peers and the parameter sweep come next.

mod plot;

use super::{RunningTarget, arg_value, build_examples, ensure_packages, free_port, initiator_run, median, root};
use plotters::style::RGBColor;
use std::fmt::Write as _;
use std::path::PathBuf;
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

/// The transports compared, in the order of each parameter set's URLs.
const TRANSPORTS: [&str; 2] = ["tcp", "iser"];

/// The negotiated parameters measured: riser's defaults, and the founding paper's
/// (MaxRecvDataSegmentLength = MaxBurstLength = 512 KiB), offered by both sides.
const PARAMETER_SETS: [(&str, &[&str]); 2] = [("defaults", &[]), ("paper", &["MaxRecvDataSegmentLength=512KiB", "MaxBurstLength=512KiB"])];

/// The facts every CSV row carries.
struct Context {
    date: String,
    commit: String,
    machine: String,
}

impl Context {
    fn new() -> Self {
        let out = |cmd: &str, args: &[&str]| {
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
        Self {
            date: out("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]),
            commit: out("git", &["rev-parse", "--short=12", "HEAD"]),
            // No commas: the field goes into a CSV as is.
            machine: format!("{cpu} x{cores}, Linux {}", out("uname", &["-r"])).replace(',', ";"),
        }
    }
}

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
    let text = String::from_utf8_lossy(&out.stdout);
    // The receiver's total: "sum_received": { … "bits_per_second": N … }.
    let bps = text
        .split("\"sum_received\"")
        .nth(1)
        .and_then(|r| r.split("\"bits_per_second\":").nth(1))
        .and_then(|r| r.split([',', '}']).next())
        .and_then(|x| x.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("iperf3 gave no result: {text}"))?;
    Ok(bps / 8.0 / 1_048_576.0)
}

/// `cargo xtask evaluate [--quick] [--reps N] [--out DIR]`.
pub(crate) fn run(args: &[String]) -> Result<(), String> {
    if let Some(dir) = arg_value(args, "--plot-only") {
        plot::register_font()?;
        return figures(std::path::Path::new(dir));
    }
    let quick = args.iter().any(|a| a == "--quick");
    if args.iter().any(|a| a == "--lab") {
        return Err("--lab: not built yet (issue 14, section 5)".into());
    }
    let reps: usize = arg_value(args, "--reps").map_or(Ok(if quick { 1 } else { 3 }), |r| r.parse().map_err(|_| format!("--reps {r}")))?;
    let out_dir = arg_value(args, "--out").map_or_else(|| root().join("target/evaluate"), PathBuf::from);
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("{}: {e}", out_dir.display()))?;
    ensure_packages(&[("iperf3", "iperf3")])?;
    plot::register_font()?;
    build_examples()?;
    let ctx = Context::new();

    let iqn = "iqn.2026-11.io.riser:evaluate";
    // One target process per parameter set, each with a TCP and an iSER portal; the initiator
    // offers the same keys, so the set is what both sides negotiate.
    let mut setups = Vec::new();
    for (name, params) in PARAMETER_SETS {
        let iser_portal = format!("127.0.0.1:{}", free_port()?);
        let mut targs = vec!["--target-name", iqn, "--lun", "ram:1GiB", "--iser-portal", &iser_portal];
        for p in params {
            targs.extend(["--param", p]);
        }
        let target = RunningTarget::start(&targs)?;
        let urls = [format!("iscsi://127.0.0.1:{}/{iqn}/0", target.port), format!("iser://{iser_portal}/{iqn}/0")];
        setups.push((name, params, target, urls));
    }
    let once = |target: &RunningTarget, params: &[&str], op: &str, url: &str, size: u64, bs: u64, qd: u32| {
        let extra: Vec<&str> = params.iter().flat_map(|p| ["--param", p]).collect();
        initiator_run(target.child.id(), op, url, size, bs, qd, &extra)
    };
    // Bytes per run: enough commands that the per-run noise averages out, few enough that
    // --quick stays within minutes (process start and login are outside the initiator's timing).
    let volume = |bs: u64| if quick { (bs * 32).clamp(2 << 20, 128 << 20) } else { (bs * 256).clamp(32 << 20, 1 << 30) };

    // Each LUN is written once first, so no run pays for the target's first touch of its memory.
    for (_, params, target, urls) in &setups {
        once(target, params, "write", &urls[0], 1 << 30, 1 << 20, 8)?;
    }
    let ceiling = median((0..reps).map(|_| loopback_ceiling(if quick { 2 } else { 5 })).collect::<Result<Vec<_>, _>>()?);

    let total = (SIZES.len() * QUEUE_DEPTHS.len() * 2 * reps * TRANSPORTS.len() * setups.len()) as u64;
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg} [{elapsed}]").map_err(|e| e.to_string())?);
    let mut csv = String::from(
        "date,commit,machine,params,transport,op,io_bytes,queue_depth,rep,bytes,mib_s,ceiling_mib_s,share_of_ceiling,target_cpu_s,initiator_cpu_s\n",
    );
    let mut table = format!(
        "riser iSCSI/TCP vs riser iSER (software iWARP RNIC): RAM LUN, one target process per parameter set\n\
         params: defaults = riser's (MaxRecvDataSegmentLength 256 KiB, MaxBurstLength 1 MiB), paper = \
         MaxRecvDataSegmentLength = MaxBurstLength = 512 KiB (as the founding paper)\n\
         MiB/s: median of {reps} run(s), TCP and iSER interleaved; share: of the single-stream loopback TCP ceiling \
         ({ceiling:.0} MiB/s, iperf3, 1 MiB writes, same run)\n{:>8} {:<5} {:>3} {:<8} {:>9} {:>6} {:>9} {:>6} {:>6}\n",
        "io", "op", "qd", "params", "TCP", "share", "iSER", "share", "ratio"
    );
    for &qd in &QUEUE_DEPTHS {
        for op in ["read", "write"] {
            for (set, params, target, urls) in &setups {
                for &bs in &SIZES {
                    let size = volume(bs);
                    let mut mibs = [Vec::new(), Vec::new()];
                    for rep in 0..reps {
                        for (i, url) in urls.iter().enumerate() {
                            let transport = TRANSPORTS[i];
                            bar.set_message(format!("{set} {transport} {op} {} KiB QD {qd}", bs >> 10));
                            let s = once(target, params, op, url, size, bs, qd)?;
                            let _ = writeln!(
                                csv,
                                "{},{},{},{set},{transport},{op},{bs},{qd},{rep},{size},{:.1},{ceiling:.1},{:.4},{:.3},{:.3}",
                                ctx.date,
                                ctx.commit,
                                ctx.machine,
                                s.mib_s,
                                s.mib_s / ceiling,
                                s.target_cpu_s,
                                s.initiator_cpu_s
                            );
                            mibs[i].push(s.mib_s);
                            bar.inc(1);
                        }
                    }
                    let ratio = median(mibs[1].iter().zip(&mibs[0]).map(|(i, t)| i / t).collect());
                    let [t, i] = mibs.map(median);
                    let _ = writeln!(
                        table,
                        "{:>7}K {op:<5} {qd:>3} {set:<8} {t:>9.0} {:>5.0}% {i:>9.0} {:>5.0}% {ratio:>5.2}x",
                        bs >> 10,
                        100.0 * t / ceiling,
                        100.0 * i / ceiling
                    );
                }
            }
        }
    }
    bar.finish_and_clear();
    drop(setups);
    table.push_str("(the software RNIC runs over loopback TCP: iSER here shows the protocol's costs, not RDMA offload)\n");
    let write = |name: &str, text: &str| {
        let p = out_dir.join(name);
        std::fs::write(&p, text).map_err(|e| format!("{}: {e}", p.display()))
    };
    write("throughput.csv", &csv)?;
    write("throughput.txt", &table)?;
    figures(&out_dir)?;
    print!("{table}");
    println!("written: {}/throughput.csv, throughput.txt, throughput-{{read,write}}-qd{{1,8}}.{{png,svg}}", out_dir.display());
    Ok(())
}

/// Draw the throughput figures from `dir/throughput.csv` (medians of its runs):
/// `throughput-{read,write}-qd{1,8}.{png,svg}`.
fn figures(dir: &std::path::Path) -> Result<(), String> {
    use std::collections::BTreeMap;
    let path = dir.join("throughput.csv");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).ok_or_else(|| format!("{}: no column {name}", path.display()));
    let (params, transport, op, io, qd, mib_s, ceiling) =
        (col("params")?, col("transport")?, col("op")?, col("io_bytes")?, col("queue_depth")?, col("mib_s")?, col("ceiling_mib_s")?);
    // (op, qd) -> (params, transport) -> size -> runs
    type Lines = BTreeMap<(String, String), BTreeMap<u64, Vec<f64>>>;
    let mut runs: BTreeMap<(String, u32), Lines> = BTreeMap::new();
    let mut ceilings = Vec::new();
    for (n, line) in lines.enumerate() {
        let f: Vec<&str> = line.split(',').collect();
        let bad = || format!("{}, line {}: {line}", path.display(), n + 2);
        let num = |i: usize| f.get(i).and_then(|x| x.parse::<f64>().ok()).ok_or_else(bad);
        let key = (f.get(op).ok_or_else(bad)?.to_string(), num(qd)? as u32);
        let line_key = (f[params].to_string(), f[transport].to_string());
        runs.entry(key).or_default().entry(line_key).or_default().entry(num(io)? as u64).or_default().push(num(mib_s)?);
        ceilings.push(num(ceiling)?);
    }
    let ceiling = median(ceilings);
    for ((op, qd), by_line) in runs {
        let mut series = Vec::new();
        for ((set, transport), sizes) in by_line {
            let paper = set == "paper";
            let tcp = transport == "tcp";
            let color = match (tcp, paper) {
                (true, false) => RGBColor(31, 90, 160),
                (true, true) => RGBColor(120, 180, 230),
                (false, false) => RGBColor(200, 30, 40),
                (false, true) => RGBColor(240, 140, 60),
            };
            let how = if paper { "512 KiB bursts (paper)" } else { "riser defaults" };
            let what = if tcp { "iSCSI/TCP" } else { "iSER (software RNIC)" };
            let points = sizes.into_iter().map(|(size, v)| (size as f64, median(v))).collect();
            series.push(plot::Series { label: format!("{what}, {how}"), color, points });
        }
        // TCP first, then iSER; defaults before the paper's.
        series.sort_by_key(|s| (!s.label.starts_with("iSCSI"), s.label.contains("paper")));
        let what = if op == "read" { "Reads" } else { "Writes" };
        let title = format!("{what}, {qd} command{} outstanding: riser iSER vs iSCSI/TCP over loopback", if qd == 1 { "" } else { "s" });
        plot::throughput(&dir.join(format!("throughput-{op}-qd{qd}")), &title, &series, ceiling)?;
    }
    Ok(())
}
