//! `cargo xtask fuzz-seeds`, `fuzz-smoke` and `fuzz-list`: the fuzz targets, their seeds from the
//! captured PDUs and iWARP streams, and a short run of each.

use crate::root;
use riser_iscsi::wire::{Opcode, Pdu};
use std::process::Command;

pub(crate) const FUZZ_TARGETS: [&str; 14] = [
    "pdu",
    "text",
    "cdb",
    "sense",
    "login_target",
    "login_initiator",
    "target_session",
    "session_pair",
    "mpa",
    "ddp_rdmap",
    "iwarp_rx",
    "iser_header",
    "iser_rx",
    "control",
];

/// Control-plane requests (the `control` target's seeds): each method with typical
/// parameters, a pipelined pair, a batch.
const CONTROL_SEEDS: [(&str, &str); 8] = [
    (
        "lists",
        r#"{"jsonrpc":"2.0","method":"target_list","id":1}{"jsonrpc":"2.0","method":"store_list","id":2}{"jsonrpc":"2.0","method":"session_list","id":3}{"jsonrpc":"2.0","method":"stats_get","id":4}"#,
    ),
    (
        "store",
        r#"{"jsonrpc":"2.0","method":"store_add","params":{"name":"s1","backing":"ram:2MiB","block_size":4096},"id":1}{"jsonrpc":"2.0","method":"store_resize","params":{"name":"s1","size":"4MiB"},"id":2}{"jsonrpc":"2.0","method":"store_remove","params":{"name":"s1"},"id":3}"#,
    ),
    (
        "lun",
        r#"{"jsonrpc":"2.0","method":"store_add","params":{"name":"s2","backing":"ram:1MiB"},"id":1}{"jsonrpc":"2.0","method":"lun_add","params":{"target":"iqn.2026-11.io.riser:target0","lun":3,"store":"s2"},"id":2}{"jsonrpc":"2.0","method":"lun_remove","params":{"target":"iqn.2026-11.io.riser:target0","lun":3},"id":3}"#,
    ),
    (
        "target",
        r#"{"jsonrpc":"2.0","method":"target_add","params":{"name":"iqn.2026-11.io.riser:t2","alias":"two","open":true},"id":1}{"jsonrpc":"2.0","method":"target_remove","params":{"name":"iqn.2026-11.io.riser:t2"},"id":2}"#,
    ),
    (
        "acl",
        r#"{"jsonrpc":"2.0","method":"acl_add","params":{"target":"iqn.2026-11.io.riser:target0","initiator":"iqn.2026-11.io.riser:i","chap":{"user":"u","secret":"secret-123456"},"luns":{"0":0}},"id":1}{"jsonrpc":"2.0","method":"acl_remove","params":{"target":"iqn.2026-11.io.riser:target0","initiator":"iqn.2026-11.io.riser:i"},"id":2}"#,
    ),
    (
        "batch",
        r#"[{"jsonrpc":"2.0","method":"version","id":"a"},{"jsonrpc":"2.0","method":"rpc_get_methods"},{"jsonrpc":"2.0","method":"nope","id":null},42]"#,
    ),
    (
        "sessions",
        r#"{"jsonrpc":"2.0","method":"session_logout","params":{"tsih":7},"id":1}{"jsonrpc":"2.0","method":"portal_remove","params":{"target":"iqn.2026-11.io.riser:target0","address":"127.0.0.1:3260","transport":"tcp"},"id":2}"#,
    ),
    ("bad", r#"{"jsonrpc":"2.0","method":"lun_add","params":{"target":1,"lun":"x"},"id":{}}{"jsonrpc":"1.0","method":"version","id":1}"#),
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
    for (name, script) in session_pair_seeds() {
        write("session_pair", name, &script)?;
    }
    for (name, text) in CONTROL_SEEDS {
        write("control", name, text.as_bytes())?;
    }
    println!("wrote seeds under {}", seeds.display());
    Ok(())
}

/// Scripts for the `session_pair` target (both session machines against each other). The
/// encoding is the target's (fuzz/fuzz_targets/session_pair.rs): 10 bytes of configuration
/// (queue depth mod 9; flags: 0..=1 immediate allowance, 0x04 keepalive, 0x18 both set discovery,
/// 0x20 a 512-byte initiator receive limit, 0x40 no ImmediateData, 0x80 InitialR2T; then the
/// first CmdSN and StatSN, big-endian), then operations: an opcode byte (mod 21) and its
/// arguments.
pub(crate) fn session_pair_seeds() -> Vec<(&'static str, Vec<u8>)> {
    // Operations.
    let cmd = |lun: u8, mode: u8, len: u16| {
        let [h, l] = len.to_be_bytes();
        vec![0, lun | (mode << 2), h, l]
    };
    const READ: u8 = 1;
    const WRITE: u8 = 2;
    const PING: [u8; 2] = [2, 8];
    let tmf = |function: u8, lun: u8, ref_index: u8| vec![3, function, lun, ref_index];
    const TEXT: [u8; 2] = [4, 16];
    const LOGOUT: [u8; 2] = [5, 0];
    const TO_TARGET: [u8; 2] = [6, 0];
    const TO_INITIATOR: [u8; 2] = [8, 0];
    const FINISH: [u8; 5] = [11, 0, 0, 0, 0];
    const SENSE_UNDERFLOW: [u8; 5] = [11, 0, 0x19, 0x01, 0x00];
    const DROP_TASK: [u8; 2] = [12, 0];
    const COLLAPSE: [u8; 3] = [13, 0, 0];
    let answer_text = |len: u16| {
        let [h, l] = len.to_be_bytes();
        vec![14, 0, h, l]
    };
    const COMPLETE_TMF: [u8; 2] = [15, 0];
    const ANSWER_LOGOUT: [u8; 2] = [16, 0];
    const PLAN_WRITE: [u8; 5] = [17, 0, 0x10, 0x00, 4];
    let clock_secs = |s: u8| vec![18, (s << 2) | 1];
    const CLOCK_TO_TIMER: [u8; 2] = [18, 2];
    let config = |depth: u8, flags: u8, cmd_sn: u32, stat_sn: u32| {
        let mut v = vec![depth, flags];
        v.extend_from_slice(&cmd_sn.to_be_bytes());
        v.extend_from_slice(&stat_sn.to_be_bytes());
        v
    };
    let script = |head: Vec<u8>, ops: &[&[u8]]| {
        let mut v = head;
        ops.iter().for_each(|op| v.extend_from_slice(op));
        v
    };
    let (c0r, c1w, c1r) = (cmd(0, READ, 512), cmd(1, WRITE, 4096), cmd(1, READ, 4096));
    let mut raw_target = vec![19, 0, 0x01];
    let mut nop = [0u8; 48];
    nop[0] = 0x40;
    nop[16..20].copy_from_slice(&7u32.to_be_bytes());
    nop[20..24].copy_from_slice(&u32::MAX.to_be_bytes());
    raw_target.extend_from_slice(&nop);
    raw_target.extend_from_slice(&[4, 0, 0]);
    let mut raw_initiator = vec![19, 1, 0x03];
    let mut rsp = [0u8; 48];
    rsp[0] = 0x21;
    rsp[1] = 0x80;
    rsp[28..32].copy_from_slice(&1u32.to_be_bytes());
    rsp[32..36].copy_from_slice(&64u32.to_be_bytes());
    raw_initiator.extend_from_slice(&rsp);
    raw_initiator.push(0);
    vec![
        (
            "commands",
            script(
                config(4, 0, 1, 100),
                &[
                    &c0r,
                    &c1w,
                    &c1r,
                    &TO_TARGET,
                    &TO_TARGET,
                    &TO_TARGET,
                    &FINISH,
                    &SENSE_UNDERFLOW,
                    &COLLAPSE,
                    &TO_INITIATOR,
                    &TO_INITIATOR,
                    &TO_INITIATOR,
                ],
            ),
        ),
        ("write-r2t", script(config(2, 0x80, 7, 7), &[&c1w, &TO_TARGET, &PLAN_WRITE, &TO_INITIATOR, &FINISH, &TO_INITIATOR])),
        (
            "task-management",
            script(
                config(8, 0, 1, 1),
                &[
                    &c0r,
                    &c1r,
                    &c0r,
                    &tmf(1, 0, 0),
                    &tmf(2, 1, 0),
                    &tmf(6, 0, 0),
                    &tmf(0x80 | 0x55, 0, 0),
                    &TO_TARGET,
                    &TO_TARGET,
                    &TO_TARGET,
                    &TO_TARGET,
                    &TO_TARGET,
                    &TO_TARGET,
                    &TO_TARGET,
                    &COMPLETE_TMF,
                    &COMPLETE_TMF,
                    &COMPLETE_TMF,
                    &COMPLETE_TMF,
                    &TO_INITIATOR,
                    &TO_INITIATOR,
                    &TO_INITIATOR,
                    &TO_INITIATOR,
                ],
            ),
        ),
        (
            "text-continued",
            script(
                config(4, 0x20, 1, 1),
                &[
                    &TEXT,
                    &TO_TARGET,
                    &answer_text(1500),
                    &TO_INITIATOR,
                    &TO_TARGET,
                    &TO_INITIATOR,
                    &TO_TARGET,
                    &TO_INITIATOR,
                    &PING,
                    &TO_TARGET,
                    &TO_INITIATOR,
                ],
            ),
        ),
        (
            "keepalive",
            script(
                config(4, 0x04, 1, 1),
                &[&clock_secs(5), &TO_INITIATOR, &TO_TARGET, &c0r, &clock_secs(6), &CLOCK_TO_TIMER, &CLOCK_TO_TIMER, &FINISH],
            ),
        ),
        (
            "logout",
            script(
                config(4, 0, 1, 1),
                &[&c0r, &c1r, &TO_TARGET, &TO_TARGET, &FINISH, &LOGOUT, &TO_TARGET, &ANSWER_LOGOUT, &TO_INITIATOR, &TO_INITIATOR],
            ),
        ),
        ("wrap", {
            let mut ops: Vec<&[u8]> = Vec::new();
            for _ in 0..6 {
                ops.extend_from_slice(&[&c0r, &TO_TARGET, &FINISH, &TO_INITIATOR]);
            }
            script(config(2, 0, u32::MAX - 2, u32::MAX - 1), &ops)
        }),
        (
            "network",
            script(
                config(4, 0, 1, 1),
                &[&c0r, &c0r, &[10, 0, 0], &[6, 1], &[6, 1], &[6, 0], &FINISH, &[10, 3, 0], &TO_INITIATOR, &DROP_TASK],
            ),
        ),
        (
            "raw",
            script(
                config(4, 0x01, 1, 1),
                &[&c0r, &TO_TARGET, &raw_target, &raw_initiator, &[20, 0, 0], &[20, 1, 8], &TO_TARGET, &TO_TARGET, &FINISH],
            ),
        ),
        (
            "discovery",
            script(
                config(4, 0x18, 1, 1),
                &[
                    &c0r,
                    &TEXT,
                    &tmf(2, 0, 0),
                    &TO_TARGET,
                    &TO_TARGET,
                    &TO_TARGET,
                    &answer_text(40),
                    &TO_INITIATOR,
                    &TO_INITIATOR,
                    &TO_INITIATOR,
                ],
            ),
        ),
    ]
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
