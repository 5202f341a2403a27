//! `cargo xtask bench --against DIR`: this build against another one (DIR holds its release
//! `target` and `initiator` examples, e.g. a worktree of an older commit built with
//! `cargo build --release --examples`), run after run, so the machine's noise falls on both
//! alike. Each round starts one build's target, runs bench-client.sh (libiscsi's iscsi-perf and
//! fio) against it over TCP and that build's initiator over TCP and iSER (software RNIC), then
//! the other build's; per workload it prints both medians and the median of the per-round
//! ratios (this / reference). Each round also measures per core: the target alone on CPU 0,
//! its clients on CPU 1 (eight iscsi-perf sessions: target CPU per command; the build's
//! initiator at QD 32 and QD 1, and QD 1 with `--busy-poll-us 50` where the build has it).

use crate::bench::bench_client;
use crate::measure::{initiator_run_from, proc_cpu};
use crate::{RunningTarget, arg_value, build_examples, ensure_packages, free_port, median, root, shared};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One build's figures of one round, keyed by workload.
type Round = BTreeMap<String, f64>;

fn round(examples: &Path, env: &[(&str, String)]) -> Result<Round, String> {
    let iqn = "iqn.2026-11.io.riser:bench-ab";
    let iser_portal = format!("127.0.0.1:{}", free_port()?);
    let t = RunningTarget::start_from(examples, &["--target-name", iqn, "--lun", "ram:1GiB", "--iser-portal", &iser_portal])?;
    let mut rows: Round = bench_client(&format!("iscsi://127.0.0.1:{}/{iqn}/0", t.port), env)?.into_iter().collect();
    let tcp = format!("iscsi://127.0.0.1:{}/{iqn}/0", t.port);
    let iser = format!("iser://{iser_portal}/{iqn}/0");
    for (name, url) in [("TCP", &tcp), ("iSER", &iser)] {
        for (op, bs, qd) in [("write", 4u64 << 10, 32u32), ("read", 4 << 10, 32), ("write", 1 << 20, 8), ("read", 1 << 20, 8)] {
            let size = if bs < 1 << 20 { 64 << 20 } else { 512 << 20 };
            let s = initiator_run_from(examples, t.child.id(), op, url, size, bs, qd, &[])?;
            rows.insert(format!("{:<13} {:<14} {:>5} {:>3} {:<6}", format!("riser-{name}"), op, bs, qd, "MiB/s"), s.mib_s);
        }
    }
    Ok(rows)
}

/// Per-core figures: the build's target alone on CPU 0 (taskset), its clients on CPU 1 — eight
/// iscsi-perf sessions at QD 32 (4 KiB random reads: target CPU per command, IOPS), then the
/// build's own initiator at QD 32 (IOPS) and QD 1 (p50 latency), `secs` seconds each.
fn pinned_round(examples: &Path, secs: u64) -> Result<Round, String> {
    let iqn = "iqn.2026-11.io.riser:bench-pinned";
    let port = free_port()?;
    let t = RunningTarget::spawn(
        Command::new("taskset").args(["-c", "0"]).arg(examples.join("target")).args([
            "--portal",
            &format!("127.0.0.1:{port}"),
            "--target-name",
            iqn,
            "--lun",
            "ram:1GiB",
        ]),
        port,
    )?;
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/0");
    let stat = format!("/proc/{}/stat", t.child.id());
    let mut rows = Round::new();
    // Eight sessions of libiscsi's iscsi-perf.
    let c0 = proc_cpu(&stat, 14);
    let perfs: Vec<_> = (0..8)
        .map(|k| {
            Command::new("taskset")
                .args(["-c", "1", "iscsi-perf", "-i", &format!("iqn.2026-11.io.riser:pinned-{k}"), "-m", "32", "-b", "8", "-r", "-t"])
                .arg(secs.to_string())
                .arg(&url)
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .map_err(|e| format!("iscsi-perf: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut iops = 0.0;
    for p in perfs {
        let out = p.wait_with_output().map_err(|e| format!("iscsi-perf: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        // The last "iops average N" is the whole run's.
        let last = text.rsplit("iops average ").next().and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse::<f64>().ok());
        iops += last.ok_or_else(|| format!("iscsi-perf printed no IOPS: {}", text.trim()))?;
    }
    let cpu = proc_cpu(&stat, 14) - c0;
    rows.insert(format!("{:<13} {:<14} {:>5} {:>3} {:<6}", "iscsi-perf×8", "randread-pin", 4096, 32, "IOPS"), iops);
    rows.insert(
        format!("{:<13} {:<14} {:>5} {:>3} {:<6}", "target-cpu", "randread-pin", 4096, 32, "us/cmd"),
        cpu * 1e6 / (iops * secs as f64),
    );
    // QD 1 once more with busy polling (50 µs) where the build has it (`--busy-poll-us`); a
    // build without it runs as it is, so the ratio compares this build's polling with an older
    // build's only way of waiting.
    let help = Command::new(examples.join("initiator")).arg("--help").output().map_err(|e| format!("initiator --help: {e}"))?;
    let polls = String::from_utf8_lossy(&help.stdout).contains("--busy-poll-us");
    for (qd, key, unit, poll) in [(32u32, "iops=", "IOPS", false), (1, "p50_us=", "p50 us", false), (1, "p50_us=", "p50 us poll", true)] {
        let out = Command::new("taskset")
            .args(["-c", "1"])
            .arg(examples.join("initiator"))
            .args([
                "load",
                &url,
                "--rw",
                "randread",
                "--block-size",
                "4KiB",
                "--queue-depth",
                &qd.to_string(),
                "--seconds",
                &secs.to_string(),
            ])
            .args(if poll && polls { &["--busy-poll-us", "50"][..] } else { &[][..] })
            .output()
            .map_err(|e| format!("initiator load: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let v = text.split(key).nth(1).and_then(|r| r.split_whitespace().next()).and_then(|n| n.parse::<f64>().ok());
        let v =
            v.ok_or_else(|| format!("initiator load printed no {key}: {}{}", text.trim(), String::from_utf8_lossy(&out.stderr).trim()))?;
        rows.insert(format!("{:<13} {:<14} {:>5} {:>3} {:<6}", "riser-TCP", "randread-pin", 4096, qd, unit), v);
    }
    Ok(rows)
}

pub(crate) fn bench_against(args: &[String]) -> Result<(), String> {
    let reference = PathBuf::from(arg_value(args, "--against").ok_or("--against DIR")?);
    for b in ["target", "initiator"] {
        if !reference.join(b).is_file() {
            return Err(format!("{} has no {b} binary (build the reference with cargo build --release --examples)", reference.display()));
        }
    }
    let reps: usize = arg_value(args, "--reps").and_then(|r| r.parse().ok()).unwrap_or(3);
    let secs: u64 = arg_value(args, "--runtime").and_then(|r| r.parse().ok()).unwrap_or(5);
    ensure_packages(&[("iscsi-perf", "libiscsi-bin"), ("taskset", "util-linux")])?;
    let _ = Command::new("bash").arg(shared().join("peers/build-fio-libiscsi.sh")).status();
    build_examples()?;
    let this = root().join("target/release/examples");
    // One run per workload per round: the rounds are the repetitions.
    let env = vec![
        ("REPS", "1".to_string()),
        ("RUNTIME", arg_value(args, "--runtime").unwrap_or("5").to_string()),
        ("QUICK", "1".to_string()),
        ("WRITES", "1".to_string()),
    ];
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for r in 0..reps {
        // Alternate which build goes first, so neither always runs on a warmer machine.
        let order: [(&Path, bool); 2] =
            if r % 2 == 0 { [(&this, true), (&reference, false)] } else { [(&reference, false), (&this, true)] };
        for (dir, is_this) in order {
            println!("== round {}/{reps}: {}", r + 1, dir.display());
            let mut rows = round(dir, &env)?;
            rows.extend(pinned_round(dir, secs)?);
            if is_this { ours.push(rows) } else { theirs.push(rows) }
        }
    }
    println!("\n{:<46} {:>10} {:>10} {:>10}", "tool workload bs qd unit (medians)", "this", "reference", "ratio");
    for key in ours[0].keys() {
        let a: Vec<f64> = ours.iter().filter_map(|r| r.get(key).copied()).collect();
        let b: Vec<f64> = theirs.iter().filter_map(|r| r.get(key).copied()).collect();
        let ratios: Vec<f64> = a.iter().zip(&b).filter(|(_, b)| **b > 0.0).map(|(a, b)| a / b).collect();
        if ratios.is_empty() {
            continue;
        }
        println!("{key:<46} {:>10.1} {:>10.1} {:>9.2}x", median(a), median(b), median(ratios));
    }
    println!("(ratio: median over rounds of this / reference in the same round; the builds ran in alternating order)");
    Ok(())
}
