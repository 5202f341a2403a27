//! `cargo xtask rbd`: the Ceph RBD suite. It installs Ceph's Debian packages if they are
//! missing, starts the single-node cluster of `../shared/ceph` (memstore, on 127.0.0.1), and
//! runs: the librbd binding's tests (riser-rbd), the RBD end-to-end tests (`tests/rbd.rs`: a
//! riser target on an RBD image, driven by the riser initiator), and libiscsi's conformance suite against a riser target whose
//! LUN is an RBD image. The cluster is stopped at the end, whatever happened.

use crate::{RunningTarget, root, shared};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The Debian packages the suite needs: the cluster's daemons, the `rbd` tool, librbd's headers.
const PACKAGES: [&str; 4] = ["ceph-mon", "ceph-osd", "ceph-common", "librbd-dev"];

/// Where the suite's cluster lives, and its monitor port (apart from a developer's default one).
const CEPH_DIR: &str = "/tmp/riser-ceph-xtask";
const CEPH_PORT: &str = "16889";

/// The cargo target directory of builds with the `rbd` feature (apart, so the default build's
/// examples never link librbd).
fn rbd_target_dir() -> PathBuf {
    root().join("target/rbd")
}

pub(crate) fn ensure_ceph() -> Result<(), String> {
    let installed = |p: &str| {
        Command::new("dpkg-query")
            .args(["-W", "-f=${Status}", p])
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
    };
    let missing: Vec<&str> = PACKAGES.iter().copied().filter(|p| !installed(p)).collect();
    if missing.is_empty() {
        return Ok(());
    }
    println!("installing {}", missing.join(" "));
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-q", "-o", "DPkg::Lock::Timeout=300", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if install() || (Command::new("apt-get").args(["update", "-q"]).status().is_ok_and(|s| s.success()) && install()) {
        Ok(())
    } else {
        Err(format!("could not install {}", missing.join(" ")))
    }
}

/// A running single-node cluster, stopped when dropped.
pub(crate) struct Ceph {
    pub(crate) conf: PathBuf,
    dir: &'static str,
    port: &'static str,
}

impl Ceph {
    /// The suite's cluster (its own directory and monitor port).
    pub(crate) fn up() -> Result<Self, String> {
        Self::up_at(CEPH_DIR, CEPH_PORT)
    }

    /// A cluster in `dir` whose monitor takes `port` (and the next; daemons bind port+10..+99),
    /// so two users of the machine (the suite and the benchmark) each have their own.
    pub(crate) fn up_at(dir: &'static str, port: &'static str) -> Result<Self, String> {
        let script = shared().join("ceph/ceph-up.sh");
        let out = Command::new("bash")
            .arg(&script)
            .env("CEPH_DIR", dir)
            .env("CEPH_PORT", port)
            .output()
            .map_err(|e| format!("{}: {e}", script.display()))?;
        let text = String::from_utf8_lossy(&out.stdout);
        let conf = text.lines().find_map(|l| l.strip_prefix("CEPH_CONF=")).map(|c| PathBuf::from(c.trim().trim_matches('"')));
        match conf {
            Some(conf) if out.status.success() => Ok(Self { conf, dir, port }),
            _ => Err(format!("the Ceph cluster did not start: {text}{}", String::from_utf8_lossy(&out.stderr))),
        }
    }

    /// The process ids of the monitor and the OSD (from their pid files).
    pub(crate) fn daemon_pids(&self) -> Vec<u32> {
        ["mon.a", "osd.0"]
            .iter()
            .filter_map(|d| std::fs::read_to_string(format!("{}/run/{d}.pid", self.dir)).ok()?.trim().parse().ok())
            .collect()
    }

    /// `rbd ARGS` against this cluster.
    pub(crate) fn rbd(&self, args: &[&str]) -> Result<(), String> {
        let st = Command::new("rbd").args(args).env("CEPH_CONF", &self.conf).status().map_err(|e| e.to_string())?;
        if st.success() { Ok(()) } else { Err(format!("rbd {} failed", args.join(" "))) }
    }
}

impl Drop for Ceph {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(shared().join("ceph/ceph-down.sh")).env("CEPH_DIR", self.dir).env("CEPH_PORT", self.port).status();
    }
}

/// `cargo test ARGS` with the `rbd` builds' target directory, the cluster's configuration and
/// `env`.
fn cargo_test(ceph: &Ceph, args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Result<(), String> {
    let st = Command::new(env!("CARGO"))
        .current_dir(root())
        .arg("test")
        .args(args)
        .envs(env.iter().copied())
        .env("CARGO_TARGET_DIR", rbd_target_dir())
        .env("CEPH_CONF", &ceph.conf)
        .status()
        .map_err(|e| e.to_string())?;
    if st.success() { Ok(()) } else { Err(format!("cargo test {} failed", args.join(" "))) }
}

/// The example target built with the `rbd` feature: the directory holding it.
pub(crate) fn build_rbd_examples() -> Result<PathBuf, String> {
    let st = Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["build", "--quiet", "--release", "--features", "rbd", "--example", "target", "--example", "initiator"])
        .env("CARGO_TARGET_DIR", rbd_target_dir())
        .status()
        .map_err(|e| e.to_string())?;
    if st.success() { Ok(rbd_target_dir().join("release/examples")) } else { Err("building the examples with `rbd` failed".into()) }
}

pub(crate) fn run(_args: &[String]) -> Result<(), String> {
    ensure_ceph()?;
    crate::ensure_packages(&[("iscsi-test-cu", "libiscsi-bin")])?;
    let ceph = Ceph::up()?;
    println!("== riser-rbd: the librbd binding against the cluster");
    cargo_test(&ceph, &["-p", "riser-rbd", "--features", "rbd"], &[])?;
    let examples = build_rbd_examples()?;
    println!("== RBD units end to end, two gateways, and the optimized gateway process killed under verified I/O");
    let bin = examples.join("target");
    cargo_test(&ceph, &["--features", "rbd", "--test", "rbd", "--", "--nocapture"], &[("RISER_TARGET_BIN", bin.as_os_str())])?;
    conformance(&ceph, &examples)?;
    multipath_across_gateways(&ceph, &examples)
}

/// A gateway of a pair exporting `rbd/IMAGE` (the TOML of `riser-target --config`, from
/// `testdata/rbd/gateway.toml`): group `group` (1 or 2) on 127.0.0.1:`port`, the other gateway's
/// group remote, group 1 optimized.
pub(crate) fn gateway_config(ceph: &Ceph, image: &str, target: &str, group: u16, port: u16) -> Result<String, String> {
    let template = root().join("testdata/rbd/gateway.toml");
    let text = std::fs::read_to_string(&template).map_err(|e| format!("{}: {e}", template.display()))?;
    Ok(text
        .replace("{image}", image)
        .replace("{conf}", &ceph.conf.display().to_string())
        .replace("{target}", target)
        .replace("{group}", &group.to_string())
        .replace("{other}", &(3 - group).to_string())
        .replace("{port}", &port.to_string()))
}

/// libiscsi's MultipathIO tests with one path through each of two gateways of one image (a LUN
/// reset on one must reach the other's sessions; COMPARE AND WRITE through both is the cluster's).
fn multipath_across_gateways(ceph: &Ceph, examples: &Path) -> Result<(), String> {
    ceph.rbd(&["create", "--size", "64M", "rbd/multipath"])?;
    let iqn = "iqn.2026-11.io.riser:rbd-pair";
    let dir = std::env::temp_dir().join(format!("riser-xtask-pair-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let mut gateways = Vec::new();
    for group in [1u16, 2] {
        let port = crate::free_port()?;
        let file = dir.join(format!("gateway-{group}.toml"));
        std::fs::write(&file, gateway_config(ceph, "multipath", iqn, group, port)?).map_err(|e| e.to_string())?;
        gateways.push(RunningTarget::start_config(examples, &file, port)?);
    }
    let urls: Vec<String> = gateways.iter().map(|g| format!("iscsi://127.0.0.1:{}/{iqn}/0", g.port)).collect();
    println!("== iscsi-test-cu (SCSI.MultipathIO) with a path through each of two gateways: {}", urls.join(" "));
    let out = Command::new("iscsi-test-cu")
        .args(["--dataloss", "-i", "iqn.2026-11.io.riser.test:mp-1", "-I", "iqn.2026-11.io.riser.test:mp-2", "--test=SCSI.MultipathIO"])
        .args(&urls)
        .output()
        .map_err(|e| format!("iscsi-test-cu: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    print!("{text}");
    drop(gateways);
    let _ = ceph.rbd(&["rm", "--no-progress", "rbd/multipath"]);
    let _ = std::fs::remove_dir_all(&dir);
    // CUnit's summary: "tests  RAN  N  PASSED  FAILED"; nothing may skip.
    let row = text.lines().find(|l| l.trim_start().starts_with("tests")).unwrap_or("");
    let n: Vec<u32> = row.split_whitespace().filter_map(|w| w.parse().ok()).collect();
    // A skipped test says so right after its name ("Test: X ...    [SKIPPED] why"); the suite's
    // teardown may print a skip message of its own after the last verdict, which is no test's.
    let skipped = text
        .lines()
        .filter_map(|l| l.split_once("Test: ")?.1.split_once("...").map(|(_, rest)| rest.trim_start()))
        .filter(|rest| rest.starts_with("[SKIPPED]"))
        .count();
    println!("MultipathIO across two gateways: {row:?}, {skipped} skipped");
    match n[..] {
        [total, ran, passed, 0, ..] if total == ran && ran == passed && total >= 4 && skipped == 0 => Ok(()),
        _ => Err("libiscsi's MultipathIO across two gateways failed or skipped".into()),
    }
}

/// libiscsi's conformance suite against a riser target whose LUN is an RBD image (512-byte
/// blocks, so COMPARE AND WRITE is the cluster's), with the tests riser fails there listed in
/// `testdata/conformance/known-failures-rbd.txt` and every test allowed to skip (what an RBD unit
/// does not offer) in `testdata/conformance/skips-rbd.txt`, each with its reason.
fn conformance(ceph: &Ceph, examples: &Path) -> Result<(), String> {
    ceph.rbd(&["create", "--size", "256M", "rbd/conformance"])?;
    let iqn = "iqn.2026-11.io.riser:rbd";
    let lun = format!("rbd:rbd/conformance,conf={}", ceph.conf.display());
    let target = RunningTarget::start_from(examples, &["--target-name", iqn, "--lun", &lun, "--sanitize-rate", "40MiB"])?;
    let url = format!("iscsi://127.0.0.1:{}/{iqn}/0", target.port);
    let known = root().join("testdata/conformance/known-failures-rbd.txt");
    let skips = root().join("testdata/conformance/skips-rbd.txt");
    let (passed, failed, skipped, ok) = crate::interop::conformance(&url, &known, Some(&skips))?;
    println!("iscsi-test-cu against an RBD LUN: {passed} passed, {failed} failed, {skipped} skipped");
    drop(target);
    let _ = ceph.rbd(&["rm", "--no-progress", "rbd/conformance"]);
    if ok { Ok(()) } else { Err("the conformance suite against an RBD LUN reported unexpected failures".into()) }
}
