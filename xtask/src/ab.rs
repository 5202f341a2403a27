//! `cargo xtask bench --against DIR`: this build against another one (DIR holds its release
//! `target` and `initiator` examples, e.g. a worktree of an older commit built with
//! `cargo build --release --examples`), run after run, so the machine's noise falls on both
//! alike. Each round starts one build's target, runs bench-client.sh (libiscsi's iscsi-perf and
//! fio) against it over TCP and that build's initiator over TCP and iSER (software RNIC), then
//! the other build's; per workload it prints both medians and the median of the per-round
//! ratios (this / reference).

use crate::bench::bench_client;
use crate::measure::initiator_run_from;
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

pub(crate) fn bench_against(args: &[String]) -> Result<(), String> {
    let reference = PathBuf::from(arg_value(args, "--against").ok_or("--against DIR")?);
    for b in ["target", "initiator"] {
        if !reference.join(b).is_file() {
            return Err(format!("{} has no {b} binary (build the reference with cargo build --release --examples)", reference.display()));
        }
    }
    let reps: usize = arg_value(args, "--reps").and_then(|r| r.parse().ok()).unwrap_or(3);
    ensure_packages(&[("iscsi-perf", "libiscsi-bin")])?;
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
            let rows = round(dir, &env)?;
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
