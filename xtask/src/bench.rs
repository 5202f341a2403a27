//! `cargo xtask bench`: the older side-by-side tables (bench-client.sh against riser and tgtd,
//! the software RNIC against raw TCP, iSER against TCP). `cargo xtask evaluate` supersedes them.

use crate::{RunningTarget, Tgtd, arg_value, build_examples, ensure_packages, free_port, median, root, sessions_run, shared};
use std::process::Command;

/// Run bench-client.sh against `url`; returns its table rows keyed by
/// (tool, workload, bs, qd, unit) with the median.
pub(crate) fn bench_client(url: &str, env: &[(&str, String)]) -> Result<Vec<(String, f64)>, String> {
    let out = Command::new("bash")
        .arg(shared().join("peers/bench-client.sh"))
        .arg(url)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let mut rows = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() == 9
            && let Ok(median) = f[6].parse::<f64>()
        {
            rows.push((format!("{:<13} {:<14} {:>5} {:>3} {:<6}", f[0], f[1], f[2], f[3], f[4]), median));
        }
    }
    Ok(rows)
}

/// RDMA Write / Read / Send over the software iWARP RNIC against raw TCP, both ends in one
/// process over loopback, the same sizes in the same run: median MiB/s of `reps` runs.
pub(crate) fn bench_rdma(reps: usize) -> Result<(), String> {
    build_examples()?;
    let perf = root().join("target/release/examples/iwarp_perf");
    let once = |op: &str, size: u64| -> Result<f64, String> {
        let total = (size * 256).clamp(1 << 30, 4 << 30);
        let (op, crc) = op.split_once('+').map_or((op, None), |(o, _)| (o, Some("--crc")));
        let out = Command::new(&perf)
            .args(["--op", op, "--size", &size.to_string(), "--total", &total.to_string()])
            .args(crc)
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        let mibs = text.split_whitespace().nth(2).and_then(|x| x.parse::<f64>().ok());
        mibs.ok_or_else(|| format!("iwarp_perf {op} {size}: {text}{}", String::from_utf8_lossy(&out.stderr)))
    };
    println!(
        "== software iWARP RNIC over loopback (MiB/s, median of {reps}; ratio: median of each run over the raw TCP \
         run beside it, same message size; MPA CRC off unless the column says CRC)"
    );
    println!(
        "{:>8} {:>10} {:>10} {:>7} {:>10} {:>7} {:>10} {:>7} {:>10} {:>7}",
        "size", "raw TCP", "Write", "ratio", "Read", "ratio", "Send", "ratio", "Write+CRC", "ratio"
    );
    for size in [4u64 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20] {
        // Interleaved, so the machine's noise spreads over all four.
        let mut runs: [Vec<f64>; 5] = Default::default();
        for _ in 0..reps {
            for (i, op) in ["tcp", "write", "read", "send", "write+crc"].into_iter().enumerate() {
                runs[i].push(once(op, size)?);
            }
        }
        // Ratios pair each run with the raw TCP run beside it, then take the median.
        let ratio = |i: usize| median(runs[i].iter().zip(&runs[0]).map(|(x, t)| x / t).collect());
        let (rw, rr, rs, rwc) = (ratio(1), ratio(2), ratio(3), ratio(4));
        let [tcp, w, r, s, wc] = runs.map(median);
        println!("{:>7}K {tcp:>10.0} {w:>10.0} {rw:>6.2}x {r:>10.0} {rr:>6.2}x {s:>10.0} {rs:>6.2}x {wc:>10.0} {rwc:>6.2}x", size >> 10);
    }
    Ok(())
}

/// Where `bench --iser-only` runs the target and the initiators (`--pin`): the target's threads
/// pinned with `taskset`, and this process itself, whose children the initiators are (the iSER
/// part is the last thing it runs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IserPin {
    /// Unpinned: the scheduler places them (the default).
    None,
    /// Target on CPU 0, initiators on CPU 1: every hand-off between them crosses CPUs.
    Split,
    /// Target and initiators on CPU 0: no cross-CPU wake-ups, so each transport's rate is its
    /// CPU cost per byte (the steadiest ratio on a shared VM).
    Same,
}

impl IserPin {
    pub(crate) fn parse(args: &[String]) -> Result<Self, String> {
        match arg_value(args, "--pin").unwrap_or("none") {
            "none" => Ok(Self::None),
            "split" => Ok(Self::Split),
            "same" => Ok(Self::Same),
            other => Err(format!("--pin {other}: none, split or same")),
        }
    }

    /// The CPUs (`taskset -c` lists) of the target and of the initiators.
    fn cpus(self) -> Option<(&'static str, &'static str)> {
        match self {
            Self::None => None,
            Self::Split => Some(("0", "1")),
            Self::Same => Some(("0", "0")),
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::None => "nothing pinned",
            Self::Split => "target pinned to CPU 0, initiators to CPU 1",
            Self::Same => "target and initiators pinned to CPU 0",
        }
    }
}

/// `taskset` every thread of process `pid` to `cpus`.
pub(crate) fn taskset(pid: u32, cpus: &str) -> Result<(), String> {
    let st = Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .map_err(|e| format!("taskset: {e}"))?;
    if st.success() { Ok(()) } else { Err(format!("taskset -a -p -c {cpus} {pid} failed")) }
}

/// riser iSER (software iWARP RNIC) against riser TCP: the same target process and the same
/// initiator program, reads and writes of 4 KiB–16 MiB, throughput and CPU seconds per GiB of
/// the target and of the initiator; `sessions` initiators at once (each a session of its own),
/// placed on the CPUs as `pin` says.
pub(crate) fn bench_iser(reps: usize, sessions: usize, pin: IserPin) -> Result<(), String> {
    build_examples()?;
    let iqn = "iqn.2026-11.io.riser:bench-iser";
    let iser_portal = format!("127.0.0.1:{}", free_port()?);
    let target = RunningTarget::start(&["--target-name", iqn, "--lun", "ram:1GiB", "--iser-portal", &iser_portal])?;
    if let Some((target_cpus, initiator_cpus)) = pin.cpus() {
        ensure_packages(&[("taskset", "util-linux")])?;
        taskset(target.child.id(), target_cpus)?;
        // The initiators are this process's children: they start on its CPUs.
        taskset(std::process::id(), initiator_cpus)?;
    }
    let urls = [("TCP", format!("iscsi://127.0.0.1:{}/{iqn}/0", target.port)), ("iSER", format!("iser://{iser_portal}/{iqn}/0"))];
    println!(
        "== riser iSER (software iWARP RNIC) vs riser TCP: same target, same initiator, QD 8, {sessions} session(s) at once, {}; \
         MiB/s (all sessions) median of {reps} (interleaved; ratio: median of per-run ratios, then the lowest and highest \
         of them), CPU s/GiB (user + system)",
        pin.describe()
    );
    println!(
        "{:>6} {:<5} {:>9} {:>9} {:>6} {:>11} {:>12} {:>12} {:>12} {:>12}",
        "io", "op", "TCP", "iSER", "ratio", "runs", "TCP tgt", "iSER tgt", "TCP ini", "iSER ini"
    );
    let run = |op: &str, url: &str, size: u64, bs: u64| {
        sessions_run(target.child.id(), op, url, size, bs, 8, sessions).map(|s| (s.mib_s, s.target_cpu_s, s.initiator_cpu_s))
    };
    // The LUN is written once first, so no run pays for the target's first touch of its memory.
    run("write", &urls[0].1, 1 << 30, 1 << 20)?;
    for bs in [4u64 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20, 16 << 20] {
        // Long enough for a steady state: 64 MiB at 64 KiB took ~25 ms, so a session's login
        // and start-up, and any hiccup of the shared machine, weighed in each run.
        let size: u64 = if bs < 64 << 10 { 256 << 20 } else { 1 << 30 };
        for op in ["write", "read"] {
            // TCP and iSER runs interleaved, so the machine's noise spreads over both; the ratio
            // is the median of each iSER run over the TCP run beside it.
            let (mut mibs, mut tgt, mut ini) = ([Vec::new(), Vec::new()], [0.0; 2], [0.0; 2]);
            for _ in 0..reps {
                for (i, (_, url)) in urls.iter().enumerate() {
                    let (m, t, c) = run(op, url, size, bs)?;
                    mibs[i].push(m);
                    tgt[i] += t;
                    ini[i] += c;
                }
            }
            let gib = (size * (reps * sessions) as u64) as f64 / (1u64 << 30) as f64;
            let ratios: Vec<f64> = mibs[1].iter().zip(&mibs[0]).map(|(i, t)| i / t).collect();
            // How far the runs' ratios spread: on this shared machine one run in five can be a
            // quarter off, and a median near a line is not a cell on either side of it.
            let (lo, hi) = ratios.iter().fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), &r| (lo.min(r), hi.max(r)));
            let ratio = median(ratios);
            let [tm, im] = mibs.map(median);
            let ([tt, it], [ti, ii]) = (tgt.map(|c| c / gib), ini.map(|c| c / gib));
            let runs = format!("{lo:.2}-{hi:.2}");
            println!("{:>5}K {op:<5} {tm:>9.0} {im:>9.0} {ratio:>5.2}x {runs:>11} {tt:>12.2} {it:>12.2} {ti:>12.2} {ii:>12.2}", bs >> 10);
        }
    }
    println!("(the software RNIC runs over loopback TCP: iSER here shows the protocol's costs, not RDMA offload)");
    // The host's TCP congestion control shapes both transports' loopback runs: BBR paces sends
    // with timers, and a connection's runs alternate between two rates (README, "iSER on the
    // software RNIC").
    if let Ok(cc) = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control") {
        let cc = cc.trim();
        let note = if cc == "bbr" { ": BBR paces loopback sends, so runs alternate between two rates" } else { "" };
        println!("(loopback TCP congestion control: {cc}{note})");
    }
    Ok(())
}

pub(crate) fn bench(args: &[String]) -> Result<(), String> {
    let reps: usize = arg_value(args, "--reps").and_then(|r| r.parse().ok()).unwrap_or(3);
    if arg_value(args, "--against").is_some() {
        return crate::ab::bench_against(args);
    }
    if args.iter().any(|a| a == "--rbd") {
        return crate::bench_rbd::bench_rbd(args);
    }
    if args.iter().any(|a| a == "--live") {
        return crate::live::bench_live(args);
    }
    if args.iter().any(|a| a == "--rdma-only") {
        return bench_rdma(reps);
    }
    let sessions: usize = arg_value(args, "--sessions").and_then(|r| r.parse().ok()).unwrap_or(1).max(1);
    if args.iter().any(|a| a == "--iser-only") {
        return bench_iser(reps, sessions, IserPin::parse(args)?);
    }
    if arg_value(args, "--pin").is_some() {
        return Err("--pin goes with --iser-only or --rbd".into());
    }
    ensure_packages(&[("iscsi-perf", "libiscsi-bin"), ("tgtd", "tgt"), ("iperf3", "iperf3")])?;
    // fio with the libiscsi engine (Debian's lacks it); bench-client.sh skips fio rows without it.
    let _ = Command::new("bash").arg(shared().join("peers/build-fio-libiscsi.sh")).status();
    let full = args.iter().any(|a| a == "--full");
    let env = vec![
        ("REPS", arg_value(args, "--reps").unwrap_or("3").to_string()),
        ("RUNTIME", arg_value(args, "--runtime").unwrap_or("5").to_string()),
        ("QUICK", if full { "0" } else { "1" }.to_string()),
    ];
    let iqn = "iqn.2026-11.io.riser:bench";
    println!("== riser target (RAM LUN)");
    let riser_rows = {
        let t = RunningTarget::start(&["--target-name", iqn, "--lun", "ram:1GiB"])?;
        let rows = bench_client(&format!("iscsi://127.0.0.1:{}/{iqn}/0", t.port), &env)?;
        drop(t);
        rows
    };
    println!("== tgtd (LUN on /dev/shm, limits raised to riser's: TUNED=1)");
    let tgt_rows = {
        let tiqn = "iqn.2026-11.io.riser.test:bench";
        let guard = Tgtd::start(tiqn, "1G", "shm", true)?;
        let port = guard.port;
        let rows = bench_client(&format!("iscsi://127.0.0.1:{port}/{tiqn}/1"), &env)?;
        drop(guard);
        rows
    };
    println!("\n{:<46} {:>10} {:>10} {:>12}", "tool workload bs qd unit (medians)", "riser", "tgtd", "riser/tgtd");
    for (k, r) in &riser_rows {
        match tgt_rows.iter().find(|(tk, _)| tk == k) {
            Some((_, t)) if *t > 0.0 => println!("{k:<46} {r:>10.1} {t:>10.1} {:>11.2}x", r / t),
            _ => println!("{k:<46} {r:>10.1} {:>10} {:>12}", "-", "-"),
        }
    }
    println!("\n== physical ceilings");
    let _ = Command::new("bash").arg(shared().join("peers/bench-raw.sh")).env("REPS", "1").env("SECS", "3").status();
    println!();
    bench_rdma(reps)?;
    println!();
    bench_iser(reps, sessions, IserPin::None)
}

#[cfg(test)]
mod tests {
    use super::IserPin;

    fn parse(args: &[&str]) -> Result<IserPin, String> {
        IserPin::parse(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn iser_placement_defaults_to_unpinned_and_refuses_unknown_ones() {
        assert_eq!(parse(&["--iser-only"]), Ok(IserPin::None));
        assert_eq!(parse(&["--pin", "split"]), Ok(IserPin::Split));
        assert_eq!(parse(&["--pin", "same"]), Ok(IserPin::Same));
        assert_eq!(parse(&["--pin", "both"]), Err("--pin both: none, split or same".into()));
        assert_eq!(IserPin::Same.cpus(), Some(("0", "0")));
        assert_eq!(IserPin::None.cpus(), None);
    }
}
