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
//!   GiB of each process (`--iser-only`: just that part).
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

use riser_iscsi::wire::{Opcode, Pdu};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Duration;

const FUZZ_TARGETS: [&str; 12] = [
    "pdu",
    "text",
    "cdb",
    "sense",
    "login_target",
    "login_initiator",
    "target_session",
    "mpa",
    "ddp_rdmap",
    "iwarp_rx",
    "iser_header",
    "iser_rx",
];

mod evaluate;
mod lab;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("demo") => demo(),
        Some("fuzz-seeds") => fuzz_seeds(),
        Some("fuzz-smoke") => {
            let secs = args.iter().position(|a| a == "--seconds").and_then(|i| args.get(i + 1)).and_then(|s| s.parse().ok()).unwrap_or(10);
            fuzz_smoke(secs)
        }
        Some("interop") => interop(),
        Some("lab") => lab::run(&args[1..]),
        Some("bench") => bench(&args[1..]),
        Some("soak") => soak(&args[1..]),
        Some("faults") => faults(&args[1..]),
        Some("evaluate") => evaluate::run(&args[1..]),
        Some("fuzz-list") => {
            FUZZ_TARGETS.iter().for_each(|t| println!("{t}"));
            Ok(())
        }
        _ => {
            eprintln!(
                "usage: cargo xtask <demo | interop | lab [--quick] [CELL...] | soak [--minutes N | --seconds N] [--sessions N] [--queue-depth N] | faults [--cuts N] [--kills N] | evaluate [--quick] [--reps N] [--out DIR] | bench [--full] [--reps N] [--runtime S] [--rdma-only | --iser-only] | fuzz-seeds | fuzz-smoke [--seconds N] | fuzz-list>"
            );
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

fn capture_pdus() -> Result<Vec<(String, Vec<u8>)>, String> {
    let dir = root().join("testdata/captures");
    let mut out = Vec::new();
    let mut dirs: Vec<_> = std::fs::read_dir(&dir)
        .map_err(|e| format!("{}: {e}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    for d in dirs {
        let mut files: Vec<_> = std::fs::read_dir(&d).map_err(|e| e.to_string())?.flatten().map(|e| e.path()).collect();
        files.sort();
        for f in files.into_iter().filter(|f| f.extension().is_some_and(|e| e == "bin")) {
            let name =
                format!("{}-{}", d.file_name().unwrap_or_default().to_string_lossy(), f.file_stem().unwrap_or_default().to_string_lossy());
            out.push((name, std::fs::read(&f).map_err(|e| e.to_string())?));
        }
    }
    Ok(out)
}

fn fuzz_seeds() -> Result<(), String> {
    let pdus = capture_pdus()?;
    let seeds = root().join("fuzz/seeds");
    let _ = std::fs::remove_dir_all(&seeds);
    let write = |target: &str, name: &str, bytes: &[u8]| -> Result<(), String> {
        let d = seeds.join(target);
        std::fs::create_dir_all(&d).map_err(|e| e.to_string())?;
        std::fs::write(d.join(name), bytes).map_err(|e| e.to_string())
    };
    let mut logins: std::collections::BTreeMap<String, (Vec<u8>, Vec<u8>)> = Default::default();
    let mut sessions: std::collections::BTreeMap<String, Vec<u8>> = Default::default();
    let mut iser_msgs: std::collections::BTreeMap<String, (Vec<u8>, Vec<u8>)> = Default::default();
    for (name, bytes) in &pdus {
        let (pdu, _) = Pdu::parse(bytes).map_err(|e| format!("{name}: {e}"))?;
        write("pdu", name, bytes)?;
        // "<capture>-<NNN>-s<stream>-<i|t>-<op>": one login per capture and TCP stream.
        let parts: Vec<&str> = name.split('-').collect();
        let session = format!("{}-{}", parts.first().unwrap_or(&""), parts.get(2).unwrap_or(&""));
        match pdu.header.opcode() {
            Opcode::LOGIN_REQUEST | Opcode::TEXT_REQUEST | Opcode::LOGIN_RESPONSE | Opcode::TEXT_RESPONSE if !pdu.data.is_empty() => {
                let mut t = vec![8u8];
                t.extend_from_slice(pdu.data);
                write("text", name, &t)?;
            }
            Opcode::SCSI_COMMAND => write("cdb", name, &pdu.full_cdb().unwrap_or_default())?,
            Opcode::SCSI_RESPONSE if pdu.data.len() > 2 => write("sense", name, &pdu.data[2..])?,
            Opcode::DATA_IN if !pdu.data.is_empty() => write("sense", name, pdu.data)?,
            _ => {}
        }
        if pdu.header.opcode().is_initiator() {
            sessions.entry(session.clone()).or_default().extend_from_slice(bytes);
        }
        // The same PDUs as iSER messages: [selector, length, iSER header | PDU], initiator-sent
        // ones for the target side (control byte 0), target-sent ones for the initiator side
        // (1; with remote invalidation, 3, the selector names a key).
        let mut ih = vec![0x10u8; 1];
        ih.resize(28, 0);
        if pdu.header.opcode() == Opcode::SCSI_COMMAND {
            ih[0] |= 0x0c;
            ih[4..8].copy_from_slice(&0x1234_5600u32.to_be_bytes());
            ih[16..20].copy_from_slice(&0x00ab_cd00u32.to_be_bytes());
        }
        let msg_len = u16::try_from(28 + bytes.len()).unwrap_or(u16::MAX);
        let e = iser_msgs.entry(session.clone()).or_insert_with(|| (vec![0u8], vec![3u8]));
        let side = if pdu.header.opcode().is_initiator() { &mut e.0 } else { &mut e.1 };
        side.push(u8::from(pdu.header.opcode() == Opcode::SCSI_RESPONSE));
        side.extend_from_slice(&msg_len.to_le_bytes());
        side.extend_from_slice(&ih);
        side.extend_from_slice(bytes);
        let e = logins.entry(session).or_default();
        match pdu.header.opcode() {
            Opcode::LOGIN_REQUEST => e.0.extend_from_slice(bytes),
            Opcode::LOGIN_RESPONSE => e.1.extend_from_slice(bytes),
            _ => {}
        }
    }
    for (session, (reqs, rsps)) in logins {
        for ctl in [0u8, 1] {
            if !reqs.is_empty() {
                let mut s = vec![ctl];
                s.extend_from_slice(&reqs);
                write("login_target", &format!("{session}-{ctl}"), &s)?;
            }
            if !rsps.is_empty() {
                let mut s = vec![ctl];
                s.extend_from_slice(&rsps);
                write("login_initiator", &format!("{session}-{ctl}"), &s)?;
            }
        }
    }
    for (session, pdus) in sessions {
        write("target_session", &session, &pdus)?;
    }
    for (session, (target_side, initiator_side)) in iser_msgs {
        write("iser_rx", &format!("{session}-target"), &target_side)?;
        write("iser_rx", &format!("{session}-initiator"), &initiator_side)?;
    }
    for (name, bytes) in iwarp_seeds() {
        let target = if name.starts_with("mpa") { "mpa" } else { "ddp_rdmap" };
        write(target, &name, &bytes)?;
    }
    write("iwarp_rx", "stream-nocrc", &iwarp_stream(false))?;
    // iSER headers as Linux sends them: control, read (R), write (W).
    for (name, flags) in [("control", 0x10u8), ("read", 0x14), ("write", 0x18), ("bidi", 0x1c)] {
        let mut h = vec![0u8; 28];
        h[0] = flags;
        h[4..8].copy_from_slice(&0x1234_5600u32.to_be_bytes());
        h[16..20].copy_from_slice(&0x00ab_cd00u32.to_be_bytes());
        write("iser_header", name, &h)?;
    }
    write("iwarp_rx", "stream-crc", &iwarp_stream(true))?;
    println!("wrote seeds under {}", seeds.display());
    Ok(())
}

/// MPA frames and DDP/RDMAP headers of every kind (after the MPA length field).
fn iwarp_seeds() -> Vec<(String, Vec<u8>)> {
    use riser_iwarp::wire::{IrdOrd, MPA_FLAG_CRC, MpaFrame, Opcode, ReadRequest, TerminateMsg};
    let mut out = Vec::new();
    for (i, rev) in [1u8, 2].into_iter().enumerate() {
        for reply in [false, true] {
            let f = MpaFrame {
                reply,
                flags: MPA_FLAG_CRC,
                rev,
                ird_ord: (rev == 2).then_some(IrdOrd { ird: 4, ord: 4, p2p: reply, write_rtr: true, read_rtr: false }),
                private_data: b"riser".to_vec(),
            };
            out.push((format!("mpa-{i}-{reply}"), f.emit()));
        }
    }
    for h in iwarp_headers() {
        let mut b = [0u8; 32];
        let n = h.emit(&mut b);
        let mut v = b[..n].to_vec();
        match h.op() {
            Opcode::ReadRequest => {
                v.extend_from_slice(&ReadRequest { sink_stag: 0x100, sink_to: 0, size: 64, src_stag: 0x200, src_to: 0 }.emit())
            }
            Opcode::Terminate => v.extend_from_slice(
                &TerminateMsg {
                    term: riser_iwarp::Term::DDP_TAGGED_BOUNDS,
                    segment_len: Some(4),
                    ddp_header: true,
                    rdmap_header: false,
                    attached: vec![0, 4, 0xc1, 0x40],
                }
                .emit(),
            ),
            _ => {}
        }
        out.push((format!("ddp-{:?}", h.op()), v));
    }
    out
}

fn iwarp_headers() -> Vec<riser_iwarp::wire::Header> {
    use riser_iwarp::wire::{Header, Opcode};
    let u = |op, msn, qn| Header::Untagged { op, last: true, inv_stag: 0, qn, msn, mo: 0 };
    vec![
        Header::Tagged { op: Opcode::Write, last: true, stag: 0x100, to: 0 },
        Header::Tagged { op: Opcode::ReadResponse, last: true, stag: 0x100, to: 0 },
        u(Opcode::Send, 1, 0),
        u(Opcode::SendInvalidate, 1, 0),
        u(Opcode::SendSe, 1, 0),
        u(Opcode::SendSeInvalidate, 1, 0),
        u(Opcode::ReadRequest, 1, 1),
        u(Opcode::Terminate, 1, 2),
    ]
}

/// A byte stream of FPDUs: two Sends, a Read Request, a Write, a Terminate.
fn iwarp_stream(crc: bool) -> Vec<u8> {
    use riser_iwarp::wire::{self, Header, Opcode, ReadRequest};
    let mut out = vec![u8::from(crc)];
    let mut fpdu = |h: Header, extra: &[u8]| {
        let mut b = [0u8; 64];
        let n = h.emit(&mut b);
        let mut v = ((n + extra.len()) as u16).to_be_bytes().to_vec();
        v.extend_from_slice(&b[..n]);
        v.extend_from_slice(extra);
        v.resize(v.len() + wire::fpdu_pad(n + extra.len()), 0);
        let sum = if crc { wire::fpdu_crc(&[&v]) } else { [0; 4] };
        v.extend_from_slice(&sum);
        out.extend_from_slice(&v);
    };
    fpdu(Header::Untagged { op: Opcode::Send, last: true, inv_stag: 0, qn: 0, msn: 1, mo: 0 }, b"hello");
    fpdu(Header::Untagged { op: Opcode::Send, last: false, inv_stag: 0, qn: 0, msn: 2, mo: 0 }, &[7; 8]);
    fpdu(Header::Untagged { op: Opcode::Send, last: true, inv_stag: 0, qn: 0, msn: 2, mo: 8 }, &[8; 8]);
    fpdu(
        Header::Untagged { op: Opcode::ReadRequest, last: true, inv_stag: 0, qn: 1, msn: 1, mo: 0 },
        &ReadRequest { sink_stag: 0x100, sink_to: 0, size: 0, src_stag: 0, src_to: 0 }.emit(),
    );
    fpdu(Header::Tagged { op: Opcode::Write, last: true, stag: 1, to: 0 }, &[]);
    out
}

fn fuzz_smoke(secs: u32) -> Result<(), String> {
    let fuzz = root().join("fuzz");
    let ok = Command::new("cargo").args(["fuzz", "--help"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        println!("installing cargo-fuzz");
        let st = Command::new("cargo").args(["install", "--locked", "cargo-fuzz"]).status().map_err(|e| e.to_string())?;
        if !st.success() {
            return Err("cargo install cargo-fuzz failed".into());
        }
    }
    let mut failed = Vec::new();
    for t in FUZZ_TARGETS {
        let corpus = fuzz.join("corpus").join(t);
        std::fs::create_dir_all(&corpus).map_err(|e| e.to_string())?;
        let seeds = fuzz.join("seeds").join(t);
        println!("== fuzz {t} for {secs} s");
        let mut cmd = Command::new("cargo");
        cmd.current_dir(&fuzz).args(["fuzz", "run", "-s", "none", t]).arg(&corpus);
        if seeds.is_dir() {
            cmd.arg(&seeds);
        }
        cmd.args(["--", &format!("-max_total_time={secs}"), "-print_final_stats=1"]);
        let st = cmd.status().map_err(|e| e.to_string())?;
        if !st.success() {
            failed.push(t);
        }
    }
    if failed.is_empty() {
        println!("{} passed, 0 failed", FUZZ_TARGETS.len());
        Ok(())
    } else {
        Err(format!("fuzz targets failed: {failed:?}"))
    }
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
        let port = free_port()?;
        let portal = format!("127.0.0.1:{port}");
        let child = Command::new(root().join("target/release/examples/target"))
            .args(["--portal", &portal])
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting the target: {e}"))?;
        let t = Self { child, port };
        for _ in 0..100 {
            if std::net::TcpStream::connect(&portal).is_ok() {
                return Ok(t);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(format!("the target did not listen on {portal}"))
    }
}

impl Drop for RunningTarget {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.child.id().to_string()).status();
        let _ = self.child.wait();
    }
}

fn interop() -> Result<(), String> {
    ensure_packages(&[("iscsi-test-cu", "libiscsi-bin")])?;
    let script = shared().join("peers/run-conformance.sh");
    if !script.exists() {
        return Err(format!("{} not found (set RISER_SHARED)", script.display()));
    }
    let iqn = "iqn.2026-11.io.riser:target0";
    // Sanitize.Reset needs a SANITIZE still running ~5 s after it started (across task management,
    // a logout and a new login): paced, the 256 MiB overwrite takes ~6.4 s.
    let target = RunningTarget::start(&["--target-name", iqn, "--lun", "ram:256MiB", "--sanitize-rate", "40MiB"])?;
    let url = format!("iscsi://127.0.0.1:{}/{iqn}/0", target.port);
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
            .arg(&url)
            .env("KNOWN_FAILURES", root().join("testdata/conformance/known-failures.txt"))
            .env("TESTS", tests)
            .env("MULTIPATH", multipath)
            .env("SANITIZE", "1")
            .env("TIMEOUT", "600")
            .output()
            .map_err(|e| e.to_string())?;
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        conformance_ok &= out.status.success();
        let counts = text.lines().rev().find_map(|l| {
            let n: Vec<u32> = l.split(", ").filter_map(|part| part.split(' ').next()?.parse().ok()).collect();
            (l.ends_with(" skipped") && n.len() == 3).then(|| (n[0], n[1], n[2]))
        });
        let (p, f, s) = counts.ok_or("run-conformance.sh printed no result line")?;
        (passed, failed, skipped) = (passed + p, failed + f, skipped + s);
    }
    println!("iscsi-test-cu in all: {passed} passed, {failed} failed, {skipped} skipped");
    drop(target);
    let (ipassed, ifailed) = initiator_vs_tgtd()?;
    println!("riser initiator against tgtd: {ipassed} passed, {ifailed} failed");
    println!("{} passed, {} failed", passed + ipassed, failed + ifailed);
    if !conformance_ok {
        return Err("conformance suite reported unexpected failures".into());
    }
    if ifailed > 0 {
        return Err("the riser initiator failed against tgtd".into());
    }
    Ok(())
}

/// tgtd started by ../shared/peers/start-tgtd.sh; stopped on drop.
struct Tgtd {
    port: u16,
    /// The daemon's process id (for its CPU time), as the script reports it.
    pid: Option<u32>,
    script: PathBuf,
}

impl Tgtd {
    /// Start a private tgtd with one LUN (`backing`: file or shm); `tuned` raises its limits to
    /// riser's.
    fn start(iqn: &str, size: &str, backing: &str, tuned: bool) -> Result<Self, String> {
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

/// Build the example target and initiator (release).
fn build_examples() -> Result<(), String> {
    let st = Command::new("cargo")
        .current_dir(root())
        .args(["build", "--quiet", "--release", "--examples"])
        .status()
        .map_err(|e| e.to_string())?;
    if st.success() { Ok(()) } else { Err("building the examples failed".into()) }
}

impl Drop for Tgtd {
    fn drop(&mut self) {
        let _ = Command::new("bash").arg(&self.script).args(["stop", &self.port.to_string()]).stdout(std::process::Stdio::null()).status();
    }
}

fn initiator_vs_tgtd() -> Result<(u32, u32), String> {
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

/// Run bench-client.sh against `url`; returns its table rows keyed by
/// (tool, workload, bs, qd, unit) with the median.
fn bench_client(url: &str, env: &[(&str, String)]) -> Result<Vec<(String, f64)>, String> {
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
fn bench_rdma(reps: usize) -> Result<(), String> {
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

/// CPU seconds (user + system) from a /proc stat line: fields `first` and `first + 1` after
/// the command name (utime/stime of a process, or cutime/cstime of its waited-for children).
fn proc_cpu(path: &str, first: usize) -> f64 {
    let tick =
        Command::new("getconf").arg("CLK_TCK").output().ok().and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok());
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let after = text.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = after.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    // After ")" come state (not numeric, skipped), ppid, … : field N of stat is f[N - 4].
    let get = |n: usize| f.get(n - 4).copied().unwrap_or(0.0);
    (get(first) + get(first + 1)) / tick.unwrap_or(100.0)
}

/// A client program run to completion beside a target process.
struct Measured {
    stdout: String,
    stderr: String,
    success: bool,
    /// CPU seconds (user + system) the target process spent meanwhile.
    target_cpu_s: f64,
    /// CPU seconds of the client (and of every process it waited for).
    client_cpu_s: f64,
    wall_s: f64,
}

/// Run `cmd` to completion while measuring the CPU time of the target process `target_pid`
/// and of the client (as a child of this process: /proc/self/stat's cutime and cstime).
fn measured(target_pid: u32, cmd: &mut Command) -> Result<Measured, String> {
    let target_stat = format!("/proc/{target_pid}/stat");
    let (t0, c0, w0) = (proc_cpu(&target_stat, 14), proc_cpu("/proc/self/stat", 16), std::time::Instant::now());
    let out = cmd.output().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    Ok(Measured {
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        success: out.status.success(),
        target_cpu_s: proc_cpu(&target_stat, 14) - t0,
        client_cpu_s: proc_cpu("/proc/self/stat", 16) - c0,
        wall_s: w0.elapsed().as_secs_f64(),
    })
}

/// What one run of the example initiator measured.
struct Sample {
    mib_s: f64,
    target_cpu_s: f64,
    initiator_cpu_s: f64,
}

/// One `read` or `write` of the example initiator against `url` (`extra`: more of its options):
/// the MiB/s it reports, and the CPU seconds the target process `target_pid` and the
/// initiator spent meanwhile.
fn initiator_run(target_pid: u32, op: &str, url: &str, size: u64, bs: u64, qd: u32, extra: &[&str]) -> Result<Sample, String> {
    let m = measured(
        target_pid,
        Command::new(root().join("target/release/examples/initiator"))
            .args([op, url, "--size", &size.to_string(), "--block-size", &bs.to_string(), "--queue-depth", &qd.to_string()])
            .args(extra),
    )?;
    let mib_s = m.stdout.split('(').nth(1).and_then(|r| r.split_whitespace().next()).and_then(|x| x.parse::<f64>().ok());
    let mib_s = mib_s.ok_or_else(|| format!("initiator {op} {url}: {}{}", m.stdout, m.stderr))?;
    Ok(Sample { mib_s, target_cpu_s: m.target_cpu_s, initiator_cpu_s: m.client_cpu_s })
}

/// The median (the upper one of an even count; NaN for none).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() { f64::NAN } else { v[v.len() / 2] }
}

/// riser iSER (software iWARP RNIC) against riser TCP: the same target process and the same
/// initiator program, reads and writes of 4 KiB–16 MiB, throughput and CPU seconds per GiB of
/// the target and of the initiator.
fn bench_iser(reps: usize) -> Result<(), String> {
    build_examples()?;
    let iqn = "iqn.2026-11.io.riser:bench-iser";
    let iser_portal = format!("127.0.0.1:{}", free_port()?);
    let target = RunningTarget::start(&["--target-name", iqn, "--lun", "ram:1GiB", "--iser-portal", &iser_portal])?;
    let urls = [("TCP", format!("iscsi://127.0.0.1:{}/{iqn}/0", target.port)), ("iSER", format!("iser://{iser_portal}/{iqn}/0"))];
    println!(
        "== riser iSER (software iWARP RNIC) vs riser TCP: same target, same initiator, QD 8; MiB/s median of {reps} \
         (interleaved; ratio: median of per-run ratios), CPU s/GiB (user + system)"
    );
    println!(
        "{:>6} {:<5} {:>9} {:>9} {:>6} {:>12} {:>12} {:>12} {:>12}",
        "io", "op", "TCP", "iSER", "ratio", "TCP tgt", "iSER tgt", "TCP ini", "iSER ini"
    );
    let run = |op: &str, url: &str, size: u64, bs: u64| {
        initiator_run(target.child.id(), op, url, size, bs, 8, &[]).map(|s| (s.mib_s, s.target_cpu_s, s.initiator_cpu_s))
    };
    // The LUN is written once first, so no run pays for the target's first touch of its memory.
    run("write", &urls[0].1, 1 << 30, 1 << 20)?;
    for bs in [4u64 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20, 16 << 20] {
        let size = (bs * 1024).clamp(64 << 20, 512 << 20);
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
            let gib = (size * reps as u64) as f64 / (1u64 << 30) as f64;
            let ratio = median(mibs[1].iter().zip(&mibs[0]).map(|(i, t)| i / t).collect());
            let [tm, im] = mibs.map(median);
            let ([tt, it], [ti, ii]) = (tgt.map(|c| c / gib), ini.map(|c| c / gib));
            println!("{:>5}K {op:<5} {tm:>9.0} {im:>9.0} {ratio:>5.2}x {tt:>12.2} {it:>12.2} {ti:>12.2} {ii:>12.2}", bs >> 10);
        }
    }
    println!("(the software RNIC runs over loopback TCP: iSER here shows the protocol's costs, not RDMA offload)");
    Ok(())
}

fn bench(args: &[String]) -> Result<(), String> {
    let reps: usize = arg_value(args, "--reps").and_then(|r| r.parse().ok()).unwrap_or(3);
    if args.iter().any(|a| a == "--rdma-only") {
        return bench_rdma(reps);
    }
    if args.iter().any(|a| a == "--iser-only") {
        return bench_iser(reps);
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
    bench_iser(reps)
}
