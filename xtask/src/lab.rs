//! `cargo xtask lab [--quick] [CELL...]`: riser against the Linux kernel's RDMA and iSCSI stacks.
//!
//! The examples are built with the rdma-core provider; on this host (no RDMA in its kernel) the
//! target must refuse an rdma-core portal cleanly. Then the lab VM (../shared/lab/rdma-lab.sh:
//! soft-RoCE rxe0 on 10.233.0.1, soft-iWARP siw0 on 10.233.1.1, the kernel's iSCSI, iSER, LIO
//! and isert modules) boots once and xtask/lab/matrix.sh runs the cells inside it. The VM runs
//! under TCG emulation: the figures are for correctness, not speed.

use crate::{root, shared};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Every cell of the matrix (see xtask/lab/matrix.sh).
const ALL: &str = "traps 1 2 3 3b 4 5 6 7 fault fault-tcp fault-rinit fault-target ops ops-iser rbd-mpath";
/// The CI subset: the provider's traps, cells 1, 2, 4 and 5 on siw, rping, and the target
/// changed live through its control socket under the kernel's initiator over TCP (ops).
const QUICK: &str = "traps 1 2 4 5 7 ops";
/// The HA-gateway cell (Ceph in the guest, two riser gateways on one RBD image, dm-multipath):
/// minutes under TCG, never in QUICK; the VM's timeout grows by its budget when it runs.
const RBD_MPATH: &str = "rbd-mpath";
const RBD_MPATH_BUDGET: u32 = 900;

/// Variables handed on to matrix.sh when set in the environment (see its header).
const PASS_ENV: [&str; 27] = [
    "CELL2_TARGET_CMD",
    "CELL2_LABEL",
    "CELL3_INITIATOR",
    "CELL3_ARGS",
    "CELL3_TIMEOUT",
    "CELL4_TARGET_CMD",
    "CELL6_TARGET_CMD",
    "RDMA_TARGET_CMD",
    "FAULT_TARGET_CMD",
    "FAULT_PORTAL",
    "FAULT_ABORT_CMD",
    "FAULT_RECOVER_S",
    "TCP_IP",
    "DD_MIB",
    "DD_BS",
    "FAULT_LOAD_BS",
    "TARGET_RUST_LOG",
    "ISCSID_CONF_EXTRA",
    "PCAP",
    "RISER_IQN",
    "LIO_IQN",
    "MPATH_BUDGET",
    "MPATH_SCSI_TIMEOUT",
    "MPATH_CHUNK_KIB",
    "MPATH_REGION_MIB",
    "MPATH_PHASE_N",
    "MPATH_IQN",
];

pub(crate) fn run(args: &[String]) -> Result<(), String> {
    let quick = args.iter().any(|a| a == "--quick");
    let cells: Vec<&str> = args.iter().filter(|a| !a.starts_with("--")).map(String::as_str).collect();
    let cells = if !cells.is_empty() {
        cells.join(" ")
    } else if quick {
        QUICK.into()
    } else {
        ALL.into()
    };
    let rbd_mpath = cells.split_whitespace().any(|c| c == RBD_MPATH);
    if rbd_mpath {
        // Before the lab's setup: the guest's initramfs copies the host's ld.so.cache.
        crate::rbd::ensure_ceph()?;
        ensure_debs(&["multipath-tools", "udev"])?;
    }
    let (examples, tests) = prepare()?;
    let host = host_without_rdma(&examples.join("target"))?;
    let shared = std::fs::canonicalize(shared()).map_err(|e| format!("{}: {e}", shared().display()))?;
    let mut env = vec![
        format!("RISER_TARGET={}", examples.join("target").display()),
        format!("RISER_INITIATOR={}", examples.join("initiator").display()),
        format!("RPING={}", examples.join("rping").display()),
        format!("RISERCTL={}", examples.join("riserctl").display()),
        format!("RDMA_LAB_TESTS={}", tests.display()),
        format!("TGTD_IN_GUEST={}", shared.join("lab/tgtd-in-guest.sh").display()),
        format!("CELLS={cells}"),
    ];
    if let Ok(l) = std::env::var("LINKS") {
        env.push(format!("LINKS={l}"));
    } else if quick {
        env.push("LINKS=siw".into());
    }
    env.extend(PASS_ENV.iter().filter_map(|k| std::env::var(k).ok().map(|v| format!("{k}={v}"))));
    let mut timeout = if quick { 1800 } else { 5400 };
    if rbd_mpath {
        env.extend(prepare_rbd_mpath(&shared)?);
        let budget = std::env::var("MPATH_BUDGET").ok().and_then(|b| b.parse().ok()).unwrap_or(RBD_MPATH_BUDGET);
        timeout += budget;
    }
    run_script(&shared, timeout, &env, "xtask/lab/matrix.sh", host)
}

/// Everything a lab run needs on the host: the guest's packages (it sees the host's /usr), the
/// VM image, and the examples and the provider's lab tests built with rdma-core:
/// (examples directory, lab test binary).
pub(crate) fn prepare() -> Result<(PathBuf, PathBuf), String> {
    // cmake and libclang build rdma-mummy-sys (libibverbs and librdmacm themselves are loaded
    // at run time); jq reads riserctl's JSON in the ops cells.
    ensure_debs(&["cmake", "libclang-dev", "open-iscsi", "e2fsprogs", "tgt", "jq"])?;
    setup()?;
    build()
}

/// The rbd-mpath cell's environment lines: the example target built with `rbd` (Ceph's packages
/// and multipath-tools are installed before the lab's setup), the Ceph fixture's script.
fn prepare_rbd_mpath(shared: &Path) -> Result<Vec<String>, String> {
    let examples = crate::rbd::build_rbd_examples()?;
    Ok(vec![
        format!("RISER_RBD_TARGET={}", examples.join("target").display()),
        format!("CEPH_UP={}", shared.join("ceph/ceph-up.sh").display()),
    ])
}

/// Debian packages by name (some have no command to look for).
fn ensure_debs(pkgs: &[&str]) -> Result<(), String> {
    let missing: Vec<&str> = pkgs
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("installing {}", missing.join(" "));
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "-o", "DPkg::Lock::Timeout=300", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if install() || (Command::new("apt-get").args(["update", "-qq"]).status().is_ok_and(|s| s.success()) && install()) {
        Ok(())
    } else {
        Err(format!("could not install {}", missing.join(" ")))
    }
}

fn setup() -> Result<(), String> {
    let script = shared().join("lab/rdma-lab.sh");
    if !script.exists() {
        return Err(format!("{} not found (set RISER_SHARED)", script.display()));
    }
    let st = Command::new("bash").arg(&script).arg("setup").status().map_err(|e| e.to_string())?;
    if st.success() { Ok(()) } else { Err("rdma-lab.sh setup failed".into()) }
}

/// The examples with the rdma-core provider (riserctl too: the ops cells drive the target with
/// it), and the provider's lab test binary.
fn build() -> Result<(PathBuf, PathBuf), String> {
    let st = Command::new("cargo")
        .current_dir(root())
        .args([
            "build",
            "--quiet",
            "--release",
            "--features",
            "rdma-core",
            "--example",
            "target",
            "--example",
            "initiator",
            "--example",
            "rping",
            "--example",
            "riserctl",
        ])
        .status()
        .map_err(|e| e.to_string())?;
    if !st.success() {
        return Err("building the examples with --features rdma-core failed".into());
    }
    let out = Command::new("cargo")
        .current_dir(root())
        .args(["test", "--release", "-p", "riser-verbs", "--features", "rdma-core", "--test", "rdma_core_lab", "--no-run"])
        .args(["--message-format", "json"])
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        return Err("building the rdma-core lab tests failed".into());
    }
    // The artifact line of the test binary: `"executable":"/path"` of target `rdma_core_lab`.
    let text = String::from_utf8_lossy(&out.stdout);
    let tests = text
        .lines()
        .filter(|l| l.contains("\"rdma_core_lab\"") && l.contains("\"executable\":\""))
        .find_map(|l| l.split("\"executable\":\"").nth(1).and_then(|r| r.split('"').next()).map(PathBuf::from))
        .ok_or("the rdma-core lab test binary was not built")?;
    let examples = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root().join("target"), PathBuf::from).join("release/examples");
    Ok((examples, tests))
}

/// On this host, whose kernel has no RDMA: the target asked for an rdma-core portal must say
/// so and exit non-zero, not crash. A cell line of its own (`None` where the host has RDMA).
fn host_without_rdma(target: &Path) -> Result<Option<String>, String> {
    if std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some()) {
        return Ok(None);
    }
    let name = "0 rdma-core build on this host (no RDMA): target --rdma-provider rdma-core";
    let mut child = Command::new(target)
        .args(["--portal", "none", "--rdma-provider", "rdma-core", "--iser-portal", "127.0.0.1", "--lun", "ram:16MiB"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| e.to_string())?;
    let t0 = std::time::Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            break Some(st);
        }
        if t0.elapsed() > std::time::Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        use std::io::Read;
        let _ = e.read_to_string(&mut err);
    }
    let err = err.trim().replace('\n', " ");
    Ok(Some(match status {
        Some(st) if st.code().is_some_and(|c| c != 0) && err.contains("no RDMA device") => {
            format!("PASS {name}: exit {}, \"{err}\"", st.code().unwrap_or_default())
        }
        Some(st) => format!("FAIL {name}: {st} (a signal means a crash), stderr \"{err}\""),
        None => format!("FAIL {name}: still running after 20 s"),
    }))
}

/// Boot the lab VM (rxe and siw) and run `script` in it with `env` and ../shared visible; the
/// guest's output streams to stderr meanwhile. Its stdout lines (after `host`), and whether
/// the script succeeded.
pub(crate) fn guest(
    shared: &Path,
    timeout: u32,
    env: &[String],
    script: &str,
    host: Option<String>,
) -> Result<(Vec<String>, bool), String> {
    let mut cmd = Command::new("bash");
    cmd.current_dir(root()).arg(shared.join("lab/rdma-lab.sh")).args(["run", "--links", "rxe siw", "--timeout", &timeout.to_string()]);
    cmd.arg("-v").arg(shared);
    for e in env {
        cmd.arg("-e").arg(e);
    }
    let mut child = cmd.args(["--script", script]).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().map_err(|e| e.to_string())?;
    let mut lines: Vec<String> = host.into_iter().collect();
    lines.iter().for_each(|l| eprintln!("{l}"));
    if let Some(out) = child.stdout.take() {
        use std::io::BufRead;
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            eprintln!("{line}");
            lines.push(line);
        }
    }
    let status = child.wait().map_err(|e| e.to_string())?;
    Ok((lines, status.success()))
}

/// Run `script` in the lab VM ([`guest`]); print its PASS/FAIL lines (after `host`'s) and the
/// tally.
fn run_script(shared: &Path, timeout: u32, env: &[String], script: &str, host: Option<String>) -> Result<(), String> {
    let (lines, success) = guest(shared, timeout, env, script, host)?;
    let cells: Vec<&String> = lines.iter().filter(|l| l.starts_with("PASS ") || l.starts_with("FAIL ")).collect();
    lines.iter().filter(|l| l.starts_with("SKIP ")).chain(cells.iter().copied()).for_each(|l| println!("{l}"));
    let failed = cells.iter().filter(|l| l.starts_with("FAIL")).count();
    println!("{} passed, {failed} failed", cells.len() - failed);
    if cells.len() < 2 {
        return Err("the lab run produced no results".into());
    }
    if failed > 0 || !success {
        return Err("lab cells failed".into());
    }
    Ok(())
}
