//! `cargo xtask fuzz-seeds`, `fuzz-smoke` and `fuzz-list`: the fuzz targets, their seeds from the
//! captured PDUs and iWARP streams, and a short run of each.

use crate::root;
use riser_iscsi::wire::{Opcode, Pdu};
use std::process::Command;

pub(crate) const FUZZ_TARGETS: [&str; 12] = [
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

pub(crate) fn capture_pdus() -> Result<Vec<(String, Vec<u8>)>, String> {
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

pub(crate) fn fuzz_seeds() -> Result<(), String> {
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
pub(crate) fn iwarp_seeds() -> Vec<(String, Vec<u8>)> {
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

pub(crate) fn iwarp_headers() -> Vec<riser_iwarp::wire::Header> {
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
pub(crate) fn iwarp_stream(crc: bool) -> Vec<u8> {
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

pub(crate) fn fuzz_smoke(secs: u32) -> Result<(), String> {
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
