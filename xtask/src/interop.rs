//! `cargo xtask interop`: libiscsi's conformance suite against the riser target, then the riser
//! initiator against tgtd; and tgtd started for the benches.

use crate::{RunningTarget, build_examples, ensure_packages, root, shared};
use std::path::PathBuf;
use std::process::Command;

pub(crate) fn interop() -> Result<(), String> {
    ensure_packages(&[("iscsi-test-cu", "libiscsi-bin")])?;
    let iqn = "iqn.2026-11.io.riser:target0";
    // Sanitize.Reset needs a SANITIZE still running ~5 s after it started (across task management,
    // a logout and a new login): paced, the 256 MiB overwrite takes ~6.4 s.
    let target = RunningTarget::start(&["--target-name", iqn, "--lun", "ram:256MiB", "--sanitize-rate", "40MiB"])?;
    let url = format!("iscsi://127.0.0.1:{}/{iqn}/0", target.port);
    let (passed, failed, skipped, conformance_ok) = conformance(&url, &root().join("testdata/conformance/known-failures.txt"), None)?;
    println!("iscsi-test-cu in all: {passed} passed, {failed} failed, {skipped} skipped");
    drop(target);
    let (mpassed, mfailed) = several_luns()?;
    println!("a target with several LUNs: {mpassed} passed, {mfailed} failed");
    let (ipassed, ifailed) = initiator_vs_tgtd()?;
    println!("riser initiator against tgtd: {ipassed} passed, {ifailed} failed");
    println!("{} passed, {} failed", passed + mpassed + ipassed, failed + mfailed + ifailed);
    if mfailed > 0 {
        return Err("a client did not see every LUN of the target".into());
    }
    if !conformance_ok {
        return Err("conformance suite reported unexpected failures".into());
    }
    if ifailed > 0 {
        return Err("the riser initiator failed against tgtd".into());
    }
    Ok(())
}

/// libiscsi's conformance suite against the LUN at `url`, failures listed in `known` tolerated:
/// (passed, failed, skipped, whether every failure was a known one). With `skips`, a skipped
/// test is an unexpected failure too unless that file lists it (`Suite.Test` or `Suite.*`, each
/// with its reason).
pub(crate) fn conformance(url: &str, known: &std::path::Path, skips: Option<&std::path::Path>) -> Result<(u32, u32, u32, bool), String> {
    let allowed: Vec<String> = match skips {
        Some(p) => std::fs::read_to_string(p)
            .map_err(|e| format!("{}: {e}", p.display()))?
            .lines()
            .map(|l| l.split('#').next().unwrap_or("").trim().to_string())
            .filter(|l| !l.is_empty())
            .collect(),
        None => Vec::new(),
    };
    let skip_allowed =
        |name: &str| allowed.iter().any(|a| a == name || a.strip_suffix(".*").is_some_and(|suite| name.split('.').next() == Some(suite)));
    let script = shared().join("peers/run-conformance.sh");
    if !script.exists() {
        return Err(format!("{} not found (set RISER_SHARED)", script.display()));
    }
    // Two passes. The whole suite runs on one path, where every test that needs a second
    // I_T nexus logs one in and out itself. Only MultipathIO needs two standing paths; given
    // them for the whole suite, libiscsi reuses the second path across tests without logging it
    // out, so Sanitize.Reservations' RESERVE(6) stays held and Sanitize.Reset's SANITIZE rightly
    // meets RESERVATION CONFLICT.
    let passes = [("SCSI.* and iSCSI.*, one path", "ALL", "0"), ("MultipathIO, two paths", "SCSI.MultipathIO", "1")];
    let (mut passed, mut failed, mut skipped, mut conformance_ok) = (0, 0, 0, true);
    for (what, tests, multipath) in passes {
        println!("== iscsi-test-cu ({what}) against the riser target at {url}");
        let out = Command::new("bash")
            .arg(&script)
            .arg(url)
            .env("KNOWN_FAILURES", known)
            .env("TESTS", tests)
            .env("MULTIPATH", multipath)
            .env("SANITIZE", "1")
            .env("TIMEOUT", "600")
            .env("VERBOSE", if skips.is_some() { "1" } else { "0" })
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        conformance_ok &= out.status.success();
        if skips.is_some() {
            // The two-path pass is there to run MultipathIO: none of it may skip there.
            let unexpected: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("skip ")?.split(':').next())
                .filter(|n| !skip_allowed(n) || (multipath == "1" && n.starts_with("MultipathIO.")))
                .collect();
            for n in &unexpected {
                println!("SKIP[NEW] {n}: skipped, and not in the expected skips");
            }
            conformance_ok &= unexpected.is_empty();
        }
        let counts = text.lines().rev().find_map(|l| {
            let n: Vec<u32> = l.split(", ").filter_map(|part| part.split(' ').next()?.parse().ok()).collect();
            (l.ends_with(" skipped") && n.len() == 3).then(|| (n[0], n[1], n[2]))
        });
        let (p, f, s) = counts.ok_or("run-conformance.sh printed no result line")?;
        (passed, failed, skipped) = (passed + p, failed + f, skipped + s);
    }
    Ok((passed, failed, skipped, conformance_ok))
}

/// A target with three LUNs of different sizes: libiscsi's `iscsi-ls -s` and the riser
/// initiator's `luns` must list all three, with their sizes (REPORT LUNS is the I_T nexus's).
fn several_luns() -> Result<(u32, u32), String> {
    let iqn = "iqn.2026-11.io.riser:luns";
    let target = RunningTarget::start(&["--target-name", iqn, "--lun", "ram:64MiB", "--lun", "ram:32MiB", "--lun", "ram:16MiB"])?;
    let (mut passed, mut failed) = (0, 0);
    let mut check = |name: &str, out: Result<std::process::Output, std::io::Error>, want: &[&str]| {
        let text = out
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
            .unwrap_or_else(|e| e.to_string());
        let ok = want.iter().all(|w| text.contains(w));
        println!("{} {name}", if ok { "PASS" } else { "FAIL" });
        if !ok {
            println!("{text}");
        }
        if ok { passed += 1 } else { failed += 1 }
    };
    let portal = format!("127.0.0.1:{}", target.port);
    check(
        "iscsi-ls -s lists the three LUNs",
        Command::new("iscsi-ls").args(["-s", "-i", "iqn.2026-11.io.riser:interop-ls", &format!("iscsi://{portal}")]).output(),
        // iscsi-ls prints the last LBA times the block size, in whole MiB: one block short.
        &["Lun:0", "Lun:1", "Lun:2", "Size:63M", "Size:31M", "Size:15M"],
    );
    let initiator = root().join("target/release/examples/initiator");
    check(
        "riser initiator's luns lists the three LUNs",
        Command::new(&initiator).args(["luns", &format!("iscsi://{portal}/{iqn}/0")]).output(),
        &["LUN 0: 131072 blocks", "LUN 1: 65536 blocks", "LUN 2: 32768 blocks"],
    );
    Ok((passed, failed))
}

/// tgtd started by ../shared/peers/start-tgtd.sh; stopped on drop.
pub(crate) struct Tgtd {
    pub(crate) port: u16,
    /// The daemon's process id (for its CPU time), as the script reports it.
    pub(crate) pid: Option<u32>,
    pub(crate) script: PathBuf,
}

impl Tgtd {
    /// Start a private tgtd with one LUN (`backing`: file or shm); `tuned` raises its limits to
    /// riser's.
    pub(crate) fn start(iqn: &str, size: &str, backing: &str, tuned: bool) -> Result<Self, String> {
        let script = shared().join("peers/start-tgtd.sh");
        // tgtd takes the port as its control-socket number too, which must stay small.
        let port =
            (3300..3400).find(|p| std::net::TcpListener::bind(("127.0.0.1", *p)).is_ok()).ok_or("no free port in 3300..3400 for tgtd")?;
        let out = Command::new("bash")
            .arg(&script)
            .args(["start", &port.to_string(), iqn, size, backing])
            .env("TUNED", if tuned { "1" } else { "0" })
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("tgtd did not start: {}", String::from_utf8_lossy(&out.stderr)));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let pid = text.split_whitespace().find_map(|w| w.strip_prefix("PID=")).and_then(|p| p.parse().ok());
        Ok(Self { port, pid, script })
    }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(&self.script).args(["stop", &self.port.to_string()]).stdout(std::process::Stdio::null()).status();
    }
}

pub(crate) fn initiator_vs_tgtd() -> Result<(u32, u32), String> {
    ensure_packages(&[("tgtd", "tgt")])?;
    let iqn = "iqn.2026-11.io.riser.test:interop";
    let tgtd = Tgtd::start(iqn, "512M", "file", false)?;
    let port = tgtd.port;
    let initiator = root().join("target/release/examples/initiator");
    build_examples()?;
    let url = format!("iscsi://127.0.0.1:{port}/{iqn}/1");
    let (mut passed, mut failed) = (0, 0);
    let mut check = |name: &str, args: &[&str], expect_ok: bool| {
        let out = Command::new(&initiator).args(args).output();
        let ok = out.as_ref().is_ok_and(|o| o.status.success()) == expect_ok;
        let detail = out
            .map(|o| {
                String::from_utf8_lossy(if o.status.success() { &o.stdout } else { &o.stderr }).lines().last().unwrap_or("").to_string()
            })
            .unwrap_or_default();
        println!("{} {name}: {detail}", if ok { "PASS" } else { "FAIL" });
        if ok { passed += 1 } else { failed += 1 }
    };
    check("discovery", &["discover", &format!("iscsi://127.0.0.1:{port}")], true);
    check("inquiry", &["inquiry", &url], true);
    check("readcap", &["readcap", &url], true);
    check("verify 256 MiB at queue depth 16", &["verify", &url, "--size", "256MiB", "--queue-depth", "16"], true);
    // CHAP: an incoming account bound to the target, then a mutual (outgoing) one.
    let tgtadm = |args: &[&str]| {
        Command::new("tgtadm").args(["-C", &port.to_string(), "--lld", "iscsi"]).args(args).status().is_ok_and(|s| s.success())
    };
    let chap_set = tgtadm(&["--mode", "account", "--op", "new", "--user", "riseruser", "--password", "risersecret12"])
        && tgtadm(&["--mode", "account", "--op", "bind", "--tid", "1", "--user", "riseruser"]);
    if chap_set {
        check("login without CHAP refused", &["inquiry", &url], false);
        check("login with CHAP", &["inquiry", &url, "--chap", "riseruser:risersecret12"], true);
        check("login with a wrong CHAP secret refused", &["inquiry", &url, "--chap", "riseruser:wrongsecret12"], false);
        let mutual = tgtadm(&["--mode", "account", "--op", "new", "--user", "tgtuser", "--password", "tgtsecret1234"])
            && tgtadm(&["--mode", "account", "--op", "bind", "--tid", "1", "--user", "tgtuser", "--outgoing"]);
        if mutual {
            check(
                "login with mutual CHAP",
                &["readcap", &url, "--chap", "riseruser:risersecret12", "--mutual-chap", "tgtuser:tgtsecret1234"],
                true,
            );
        }
    } else {
        println!("FAIL could not configure CHAP on tgtd");
        failed += 1;
    }
    drop(tgtd);
    Ok((passed, failed))
}
