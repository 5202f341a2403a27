//! `cargo xtask <command>`: the project's automation.
//!
//! * `demo` — start the example target on a RAM LUN on a free loopback port, run the example
//!   initiator's discover, inquiry, readcap, a 128 MiB verify and a short bench against it,
//!   stop the target.
//! * `bench [--full] [--reps N] [--runtime S]` — the same clients (libiscsi's iscsi-perf and fio
//!   with the libiscsi engine, via ../shared/peers/bench-client.sh) against the riser target and
//!   tgtd, both RAM-backed with the same limits, in one run; prints medians and riser/tgtd, plus
//!   the raw loopback TCP and memcpy ceilings; then RDMA Write / Read / Send over the software
//!   iWARP RNIC against raw TCP for 4 KiB–4 MiB messages (`--rdma-only`: just that part); then
//!   riser iSER against riser TCP, same target and initiator, 4 KiB–16 MiB, with CPU seconds per
//!   GiB of each process (`--iser-only`: just that part; `--sessions N` initiators at once;
//!   `--pin split`: target on CPU 0 and initiators on CPU 1, `--pin same`: all on CPU 0, where
//!   each transport's rate is its CPU cost; default `none`).
//! * `bench --rbd [--reps N] [--runtime S] [--pin split|none]` — a riser gateway serving a Ceph RBD
//!   image (the example target built with `rbd`) against `rbd bench` straight on librbd, on one
//!   throw-away cluster of `../shared/ceph` (its own directory and port): 4 KiB random reads and
//!   writes and 1 MiB sequential reads and writes, QD 16 and librbd's cache off on both sides;
//!   through the gateway with iscsi-perf, fio's libiscsi engine and the riser initiator; runs
//!   interleaved, medians and ratios to the `rbd bench` run beside each, and the CPU each process
//!   spent. `--pin split` (default): Ceph's mon and OSD on CPU 0, gateway and client (or rbd bench)
//!   on CPU 1, each started there; `--pin none`: nothing pinned.
//! * `lab [--quick] [CELL...]` — build with the rdma-core provider, check it fails cleanly on this
//!   host (no RDMA), boot the RDMA lab VM once (../shared/lab/rdma-lab.sh: soft-RoCE rxe and
//!   soft-iWARP siw) and run the interop matrix of xtask/lab/matrix.sh inside it: riser on
//!   rdma-core and on its software RNIC against itself, the Linux kernel's initiators (open-iscsi
//!   with ib_iser and iscsi_tcp), LIO with ib_isert and tgt, the driver-trap tests, rping, and
//!   the fault cells. One line per cell, then `N passed, N failed`. `--quick`: the CI subset.
//! * `soak [--minutes N | --seconds N] [--sessions N] [--queue-depth N]` — the soak of
//!   `tests/reliability.rs` in release: sessions over TCP and iSER (default 64 × QD 32, 60 s) on
//!   a file LUN of a target process, data verified, ABORT TASK SET and connection drops at
//!   random, the target's RSS and descriptors sampled and bounded.
//! * `faults [--cuts N] [--kills N]` — the long forms of the fault tests of
//!   `tests/reliability.rs` in release: connections cut at random points under QD 16 writes on a
//!   file LUN (default 1000 cuts), and the target killed with SIGKILL mid-write and restarted
//!   (default 10 kills); every acknowledged (resp. durable) write is checked.
//! * `evaluate [--quick] [--lab] [--reps N] [--out DIR] [--only SECTIONS] [--publish]` — the
//!   performance evaluation (issue 14): throughput against size, IOPS and latency, CPU cost, riser
//!   against tgtd and libiscsi, the lab's rxe and siw, a parameter sweep, the micro-benchmarks;
//!   CSVs, figures and EVALUATION.md (`--publish`: docs/EVALUATION.md and docs/evaluation/).
//!   `--plot-only DIR [--publish]` redraws the figures and the report from a run's CSVs.
//! * `fuzz-seeds` — regenerate `fuzz/seeds/<target>/` from the captured PDUs in
//!   `testdata/captures/`.
//! * `fuzz-smoke [--seconds N]` — run every fuzz target for N seconds (default 10) on its seeds.
//! * `fuzz-list` — print the fuzz targets.
//! * `interop` — install libiscsi's tools if needed, start the example target on a RAM LUN and
//!   run libiscsi's conformance suite against it (iscsi-test-cu: SCSI.* and iSCSI.* on one path,
//!   then MultipathIO on two; SANITIZE allowed) with the expectations in
//!   `testdata/conformance/known-failures.txt`; then the riser
//!   initiator against tgtd (discovery, login without and with CHAP, inquiry, readcap, a
//!   256 MiB verify at queue depth 16).
//! * `rbd` — the Ceph RBD suite: install Ceph's packages if needed, start the single-node
//!   cluster of `../shared/ceph`, run the librbd binding's tests, the target's RBD tests, and
//!   libiscsi's conformance suite against an RBD-backed LUN (expectations in
//!   `testdata/conformance/known-failures-rbd.txt`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

mod ab;
mod bench;
mod bench_rbd;
mod evaluate;
mod fuzz;
mod interop;
mod lab;
mod live;
mod measure;
mod public_api;
mod rbd;

use bench::bench;
use fuzz::{FUZZ_TARGETS, fuzz_seeds, fuzz_smoke};
use interop::{Tgtd, interop};
use measure::{Measured, initiator_run, measured, median, sessions_run};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

/// The arguments each subcommand takes: its switches, its flags with a value, and whether it
/// takes bare words (the lab's cells). `None`: not a subcommand.
fn accepted(sub: &str) -> Option<(&'static [&'static str], &'static [&'static str], bool)> {
    Some(match sub {
        "demo" | "interop" | "rbd" | "fuzz-seeds" | "fuzz-list" => (&[], &[], false),
        "fuzz-smoke" => (&[], &["--seconds"], false),
        "lab" => (&["--quick"], &[], true),
        "soak" => (&[], &["--minutes", "--seconds", "--sessions", "--queue-depth"], false),
        "faults" => (&[], &["--cuts", "--kills"], false),
        "evaluate" => (&["--quick", "--lab", "--publish"], &["--reps", "--out", "--only", "--plot-only"], false),
        "bench" => (
            &["--full", "--rdma-only", "--iser-only", "--rbd", "--live"],
            &["--reps", "--runtime", "--sessions", "--pin", "--against", "--seconds", "--interval-ms"],
            false,
        ),
        "public-api" => (&["--bless"], &[], false),
        _ => return None,
    })
}

/// Refuse what `sub` does not take (a misspelt or unknown flag used to be ignored, and the
/// subcommand ran with its defaults: `bench --help` ran the whole bench).
fn check_args(sub: &str, args: &[String]) -> Result<(), String> {
    let Some((switches, valued, words)) = accepted(sub) else { return Ok(()) };
    let mut i = 0;
    while i < args.len() {
        let a = args[i].as_str();
        if valued.contains(&a) {
            if args.get(i + 1).is_none_or(|v| v.starts_with("--")) {
                return Err(format!("{a} needs a value"));
            }
            i += 2;
        } else if switches.contains(&a) || (words && !a.starts_with('-')) {
            i += 1;
        } else {
            return Err(format!("{sub} does not take {a}"));
        }
    }
    Ok(())
}

const USAGE: &str = "usage: cargo xtask <demo | interop | rbd | lab [--quick] [CELL...] | soak [--minutes N | --seconds N] [--sessions N] [--queue-depth N] | faults [--cuts N] [--kills N] | evaluate [--quick] [--lab] [--reps N] [--out DIR] [--only SECTIONS] [--publish] | evaluate --plot-only DIR [--publish] | bench [--full] [--reps N] [--runtime S] [--rdma-only | --iser-only [--sessions N] [--pin none|split|same] | --rbd [--pin split|none] | --against DIR | --live [--seconds S] [--interval-ms MS]] | fuzz-seeds | fuzz-smoke [--seconds N] | fuzz-list | public-api [--bless]>";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    if let Some(sub) = args.first()
        && let Err(e) = check_args(sub, &args[1..])
    {
        eprintln!("xtask: {e}\n{USAGE}");
        return ExitCode::from(2);
    }
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(),
        Some("fuzz-seeds") => fuzz_seeds(),
        Some("fuzz-smoke") => {
            let secs = args.iter().position(|a| a == "--seconds").and_then(|i| args.get(i + 1)).and_then(|s| s.parse().ok()).unwrap_or(10);
            fuzz_smoke(secs)
        }
        Some("interop") => interop(),
        Some("rbd") => rbd::run(&args[1..]),
        Some("lab") => lab::run(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("soak") => soak(&args[1..]),
        Some("faults") => faults(&args[1..]),
        Some("evaluate") => evaluate::run(&args[1..]),
        Some("public-api") => public_api::run(&args[1..]),
        Some("fuzz-list") => {
            FUZZ_TARGETS.iter().for_each(|t| println!("{t}"));
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

fn demo() -> Result<(), String> {
    println!("riser demo: the example target on a 256 MiB RAM LUN, driven by the example initiator over TCP and over iSER\n");
    let iqn = "iqn.2026-11.io.riser:demo";
    build_examples()?;
    let iser_port = free_port()?;
    let iser_portal = format!("127.0.0.1:{iser_port}");
    let target = RunningTarget::start(&["--target-name", iqn, "--lun", "ram:256MiB", "--iser-portal", &iser_portal])?;
    let tcp = format!("iscsi://127.0.0.1:{}/{iqn}/0", target.port);
    let iser = format!("iser://{iser_portal}/{iqn}/0");
    let initiator = root().join("target/release/examples/initiator");
    let run = |args: &[&str]| -> Result<String, String> {
        println!("$ initiator {}", args.join(" "));
        let out = Command::new(&initiator).args(args).stderr(std::process::Stdio::inherit()).output().map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        print!("{text}");
        if out.status.success() { Ok(text) } else { Err(format!("initiator {} {} failed", args[0], args[1])) }
    };
    run(&["discover", &format!("iscsi://127.0.0.1:{}", target.port)])?;
    run(&["discover", &format!("iser://{iser_portal}")])?;
    run(&["inquiry", &tcp])?;
    run(&["readcap", &iser])?;
    let mut tables = Vec::new();
    for url in [&tcp, &iser] {
        run(&["verify", url, "--size", "128MiB", "--queue-depth", "16"])?;
        tables.push(run(&["bench", url, "--size", "128MiB", "--queue-depth", "16", "--seconds", "1"])?);
    }
    drop(target);
    // Side by side: the rows of both bench tables ("SIZE DIR MiB/s IOPS").
    let rows = |t: &str| -> Vec<(String, f64)> {
        t.lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() == 4).then(|| f[2].parse::<f64>().ok().map(|m| (format!("{} {}", f[0], f[1]), m))).flatten()
            })
            .collect()
    };
    println!("\n{:<16} {:>12} {:>12} {:>9}", "block  dir", "TCP MiB/s", "iSER MiB/s", "iSER/TCP");
    for ((k, t), (_, i)) in rows(&tables[0]).into_iter().zip(rows(&tables[1])) {
        println!("{k:<16} {t:>12.1} {i:>12.1} {:>8.2}x", i / t);
    }
    println!("\n(iSER runs on riser's software iWARP RNIC over loopback TCP: it shows the protocol, not RDMA hardware.)");
    println!("demo finished: target stopped");
    Ok(())
}

fn shared() -> PathBuf {
    std::env::var_os("RISER_SHARED").map(PathBuf::from).unwrap_or_else(|| root().join("../shared"))
}

fn have(cmd: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {cmd} >/dev/null")]).status().is_ok_and(|s| s.success())
}

/// Install Debian packages that provide the given commands, if any is missing.
fn ensure_packages(wanted: &[(&str, &str)]) -> Result<(), String> {
    let missing: Vec<&str> = wanted.iter().filter(|(cmd, _)| !have(cmd)).map(|(_, pkg)| *pkg).collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("installing {}", missing.join(" "));
    let ok = Command::new("apt-get").arg("update").arg("-qq").status().is_ok_and(|s| s.success())
        && Command::new("apt-get")
            .args(["install", "-y", "-qq"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success());
    if ok { Ok(()) } else { Err(format!("could not install {}", missing.join(" "))) }
}

fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(l.local_addr().map_err(|e| e.to_string())?.port())
}

/// The example target, started in the background; killed on drop.
struct RunningTarget {
    child: std::process::Child,
    port: u16,
}

impl RunningTarget {
    fn start(args: &[&str]) -> Result<Self, String> {
        build_examples()?;
        Self::start_from(&root().join("target/release/examples"), args)
    }

    /// The example target of the build in `examples`, configured by the file `config`, which
    /// has it listen on 127.0.0.1:`port`.
    fn start_config(examples: &Path, config: &Path, port: u16) -> Result<Self, String> {
        Self::spawn(Command::new(examples.join("target")).arg("--config").arg(config), port)
    }

    /// The example target of the build in `examples` (a directory holding `target`).
    fn start_from(examples: &Path, args: &[&str]) -> Result<Self, String> {
        Self::start_on(examples, args, None)
    }

    /// [`start_from`](Self::start_from), started on the CPUs of the `taskset -c` list `cpus`
    /// if given: its threads, and the number of workers its runtime sizes itself to, are
    /// theirs from the start (as under systemd's `CPUAffinity=`).
    fn start_on(examples: &Path, args: &[&str], cpus: Option<&str>) -> Result<Self, String> {
        let port = free_port()?;
        let program = examples.join("target");
        let mut cmd = match cpus {
            Some(cpus) => {
                let mut c = Command::new("taskset");
                c.args(["-c", cpus]).arg(program);
                c
            }
            None => Command::new(program),
        };
        Self::spawn(cmd.args(["--portal", &format!("127.0.0.1:{port}")]).args(args), port)
    }

    /// Start `cmd`, a target that is to listen on 127.0.0.1:`port`, and wait until it does.
    fn spawn(cmd: &mut Command, port: u16) -> Result<Self, String> {
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the target: {e}"))?;
        let t = Self { child, port };
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return Ok(t);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("the target did not listen on 127.0.0.1:{port}"))
    }
}

impl Drop for RunningTarget {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

/// Build the example target and initiator (release).
fn build_examples() -> Result<(), String> {
    let st = Command::new("cargo")
        .current_dir(root())
        .args(["build", "--quiet", "--release", "--examples"])
        .status()
        .map_err(|e| e.to_string())?;
    if st.success() { Ok(()) } else { Err("building the examples failed".into()) }
}

/// `cargo test --release --test reliability` with `env`, the test filter and its arguments.
fn reliability(filter: &str, ignored: bool, env: &[(&str, String)]) -> Result<(), String> {
    let mut c = Command::new(env!("CARGO"));
    c.current_dir(root()).args(["test", "--release", "--test", "reliability", filter, "--", "--nocapture", "--test-threads", "1"]);
    if ignored {
        c.arg("--ignored");
    }
    for (k, v) in env {
        c.env(k, v);
    }
    let st = c.status().map_err(|e| format!("cargo test: {e}"))?;
    if st.success() { Ok(()) } else { Err(format!("reliability test {filter} failed ({st})")) }
}

fn number(args: &[String], name: &str, default: u64) -> Result<u64, String> {
    arg_value(args, name).map_or(Ok(default), |v| v.parse().map_err(|_| format!("{name} {v}: not a number")))
}

/// `cargo xtask soak`.
fn soak(args: &[String]) -> Result<(), String> {
    let secs = match arg_value(args, "--minutes") {
        Some(_) => number(args, "--minutes", 1)? * 60,
        None => number(args, "--seconds", 60)?,
    };
    let env = [
        ("RISER_SOAK_SECS", secs.to_string()),
        ("RISER_SOAK_SESSIONS", number(args, "--sessions", 64)?.to_string()),
        ("RISER_SOAK_QD", number(args, "--queue-depth", 32)?.to_string()),
    ];
    reliability("soak", true, &env)
}

/// `cargo xtask faults`.
fn faults(args: &[String]) -> Result<(), String> {
    reliability("connection_cuts", false, &[("RISER_CUTS", number(args, "--cuts", 1000)?.to_string())])?;
    reliability("sigkill", false, &[("RISER_KILLS", number(args, "--kills", 10)?.to_string())])
}

fn arg_value<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::check_args;

    fn check(sub: &str, args: &[&str]) -> Result<(), String> {
        check_args(sub, &args.iter().map(|a| a.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn subcommands_refuse_what_they_do_not_take() {
        assert_eq!(check("bench", &["--iser-only", "--reps", "3", "--sessions", "4"]), Ok(()));
        assert_eq!(check("bench", &["--iser-only", "--pin", "same"]), Ok(()));
        assert_eq!(check("bench", &["--against", "/tmp/base", "--reps", "4"]), Ok(()));
        assert_eq!(check("lab", &["--quick"]), Ok(()));
        assert_eq!(check("lab", &["7", "fault-tcp"]), Ok(()));
        assert_eq!(check("evaluate", &["--publish", "--lab"]), Ok(()));
        assert_eq!(check("soak", &["--seconds", "60"]), Ok(()));
        assert_eq!(check("bench", &["--iser-olny"]), Err("bench does not take --iser-olny".into()));
        assert_eq!(check("soak", &["5"]), Err("soak does not take 5".into()));
        assert_eq!(check("evaluate", &["--reps"]), Err("--reps needs a value".into()));
        assert_eq!(check("bench", &["--against", "--reps", "3"]), Err("--against needs a value".into()));
        assert_eq!(check("demo", &["--quick"]), Err("demo does not take --quick".into()));
    }
}
