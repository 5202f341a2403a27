//! End to end over TCP on loopback, in process: the riser target served by the example's
//! building blocks, driven by the riser initiator and by raw sockets.

use bytes::Bytes;
use riser::initiator::{Error, Session, SessionConfig, discover};
use riser::iscsi::chap::ChapCredentials;
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::login::{AuthFailure, InitiatorAuth, LoginFailure, LoginStatus};
use riser::iscsi::wire::{Header, LoginRequest, NopOut, Pdu, Stage, TmfFunction, TmfResponse};
use riser::scsi::lun::Lun;
use riser::scsi::sense::{AscAscq, SenseKey};
use riser::target::backend::RamBackend;
use riser::target::lu::LogicalUnit;
use riser::target::server::{DiscoveryScope, Node, Target, TargetConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TARGET: &str = "iqn.2026-11.io.riser:e2e";
const ME: &str = "iqn.2026-11.io.riser:tester";
const OTHER: &str = "iqn.2026-11.io.riser:other-tester";

fn creds(u: &str, s: &str) -> ChapCredentials {
    ChapCredentials::new(u, s.as_bytes().to_vec()).unwrap()
}

async fn start(node: impl FnOnce(&mut Node), cfg: impl FnOnce(&mut TargetConfig)) -> SocketAddr {
    let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(64 << 20, 512)), Lun::ZERO, 7));
    let mut n = Node::new(TARGET).lun(lu);
    node(&mut n);
    let mut c = TargetConfig::default().node(n);
    cfg(&mut c);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(Target::new(c).serve(l));
    addr
}

fn pattern(seed: u8, len: usize) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8).collect::<Vec<_>>().into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_write_every_size_and_queue_depth() {
    let addr = start(|_| {}, |_| {}).await;
    let s = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    let (blocks, bs) = s.read_capacity(Lun::ZERO).await.unwrap();
    assert_eq!((blocks, bs), (131_072, 512));
    let inq = s.inquiry(Lun::ZERO).await.unwrap();
    assert_eq!(&inq.vendor, b"RISER   ");
    // Sizes from one block to 4 MiB, each written and read back byte for byte.
    let mut lba = 0;
    for (i, len) in [512usize, 4096, 8192, 65_536, 262_144, 1 << 20, 4 << 20].into_iter().enumerate() {
        let data = pattern(i as u8, len);
        s.write(Lun::ZERO, lba, data.clone(), bs).await.unwrap();
        let back = s.read(Lun::ZERO, lba, (len / 512) as u32, bs).await.unwrap();
        assert_eq!(back, data, "{len} bytes");
        // Read buffers go back to the datamover for later reads.
        s.recycle(back);
        lba += (len / 512) as u64;
    }
    // 64 commands in flight.
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 16_384);
            s.write(Lun::ZERO, 20_000 + i * 32, data.clone(), 512).await.unwrap();
            assert_eq!(s.read(Lun::ZERO, 20_000 + i * 32, 32, 512).await.unwrap(), data);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.sync(Lun::ZERO).await.unwrap();
    s.unmap(Lun::ZERO, 0, 8).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 0, 8, 512).await.unwrap(), vec![0u8; 4096]);
    s.ping().await.unwrap();
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn r2t_path_with_small_segments_and_bursts() {
    // InitialR2T=Yes, no immediate data, 4 KiB segments, 16 KiB bursts: every write is
    // solicited through several R2Ts and many Data-Out PDUs; reads come in many Data-Ins.
    let op = OperationalConfig::default()
        .initial_r2t(true)
        .immediate_data(false)
        .max_recv_data_segment_length(4096)
        .max_burst_length(16_384)
        .first_burst_length(8192);
    let addr = start(|_| {}, |c| c.operational = op).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.operational.max_recv_data_segment_length = 4096;
    let s = Session::connect(addr, cfg).await.unwrap();
    assert!(s.params().initial_r2t && !s.params().immediate_data);
    let data = pattern(9, 300 * 512);
    s.write(Lun::ZERO, 1000, data.clone(), 512).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 1000, 300, 512).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_data_and_immediate_data() {
    let op =
        OperationalConfig::default().initial_r2t(false).immediate_data(true).first_burst_length(65_536).max_recv_data_segment_length(8192);
    let addr = start(|_| {}, |c| c.operational = op).await;
    let s = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    assert!(!s.params().initial_r2t);
    // 8 KiB immediate, up to 64 KiB unsolicited Data-Out, the rest by R2T.
    let data = pattern(3, 200 * 1024);
    s.write(Lun::ZERO, 77, data.clone(), 512).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 77, 400, 512).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_bursts_racing_their_r2ts_lose_no_task() {
    // riser's defaults but for an 8 KiB receive segment on the target: each 1 MiB write sends
    // 8 KiB immediate data, 31 unsolicited Data-Outs and answers one 768 KiB R2T with 96 more,
    // eight writes at once. The R2T is sent while the unsolicited Data-Outs still arrive, and
    // the last Data-Out of an R2T races the end of the collection. (Found by `cargo xtask
    // evaluate`'s parameter sweep: the target took a Data-Out's task out of its table while
    // reading the data, so a Get_Data that looked meanwhile found no task and failed the
    // command with CHECK CONDITION, DATA PHASE ERROR.)
    let op = OperationalConfig::default().max_recv_data_segment_length(8192);
    let addr = start(|_| {}, |c| c.operational = op).await;
    let s = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    assert!(!s.params().initial_r2t && s.params().immediate_data);
    for round in 0..4u8 {
        let mut writes = Vec::new();
        for i in 0..8u8 {
            let (s, data) = (s.clone(), pattern(round * 8 + i, 1 << 20));
            writes.push(tokio::spawn(async move { s.write(Lun::ZERO, u64::from(i) * 2048, data, 512).await }));
        }
        for (i, w) in writes.into_iter().enumerate() {
            w.await.unwrap().unwrap_or_else(|e| panic!("round {round}, write {i}: {e}"));
        }
        for i in 0..8u8 {
            assert_eq!(
                s.read(Lun::ZERO, u64::from(i) * 2048, 2048, 512).await.unwrap(),
                pattern(round * 8 + i, 1 << 20),
                "round {round}, write {i}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_lists_the_target() {
    let addr = start(|_| {}, |_| {}).await;
    let found = discover(addr, ME, InitiatorAuth::None).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, TARGET);
    assert_eq!(found[0].1, [format!("{addr},1")]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chap_one_way_mutual_and_wrong_secret() {
    let addr = start(|n| n.chap = Some(creds("alice", "alicesecret12")), |_| {}).await;
    Session::connect(addr, SessionConfig::new(ME, TARGET).with_chap(creds("alice", "alicesecret12"), None)).await.unwrap();
    let e = Session::connect(addr, SessionConfig::new(ME, TARGET).with_chap(creds("alice", "wrongsecret12"), None)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "{e}");
    let e = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "{e}");

    let addr = start(
        |n| {
            n.chap = Some(creds("alice", "alicesecret12"));
            n.mutual_chap = Some(creds("target", "targetsecret1"));
        },
        |_| {},
    )
    .await;
    let s = Session::connect(
        addr,
        SessionConfig::new(ME, TARGET).with_chap(creds("alice", "alicesecret12"), Some(creds("target", "targetsecret1"))),
    )
    .await
    .unwrap();
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    let e = Session::connect(
        addr,
        SessionConfig::new(ME, TARGET).with_chap(creds("alice", "alicesecret12"), Some(creds("target", "impostorsecret"))),
    )
    .await
    .unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Authentication(AuthFailure::MutualChapFailed))), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_and_unknown_target_and_lun() {
    let addr = start(|n| n.acl = vec!["iqn.2026-11.io.riser:someone-else".into()], |_| {}).await;
    let e = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHORIZATION_FAILURE))), "{e}");
    let e = Session::connect(addr, SessionConfig::new(ME, "iqn.2026-11.io.riser:nothing")).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::NOT_FOUND))), "{e}");

    let addr = start(|_| {}, |_| {}).await;
    let s = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    match s.test_unit_ready(Lun::from(3)).await.unwrap_err() {
        Error::Scsi { sense: Some(sense), .. } => {
            assert_eq!((sense.key, sense.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::LOGICAL_UNIT_NOT_SUPPORTED))
        }
        e => panic!("{e}"),
    }
    // Out of range and unknown opcode get the SBC answers.
    match s.read(Lun::ZERO, 1 << 30, 1, 512).await.unwrap_err() {
        Error::Scsi { sense: Some(sense), .. } => assert_eq!(sense.asc, AscAscq::LBA_OUT_OF_RANGE),
        e => panic!("{e}"),
    }
    let r = s.command(Lun::ZERO, &[0xc7, 0, 0, 0, 0, 0], None, 0).await.unwrap();
    assert_eq!(riser::scsi::sense::Sense::parse(&r.sense.unwrap()).unwrap().asc, AscAscq::INVALID_COMMAND_OPERATION_CODE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn task_management_and_unit_attention() {
    let addr = start(|_| {}, |_| {}).await;
    let s = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    // ABORT TASK naming a task the session does not hold: its RefCmdSN is one the target has
    // seen, so the task does not exist (RFC 7143 §11.5.1).
    match s.task_management(Lun::ZERO, TmfFunction::ABORT_TASK, 0x7777).await {
        Err(Error::TaskManagement(TmfResponse::TASK_DOES_NOT_EXIST)) => {}
        other => panic!("{other:?}"),
    }
    s.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await.unwrap();
    // The reset's UNIT ATTENTION is reported once and retried past by the initiator.
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    let r = s.command(Lun::ZERO, &[0, 0, 0, 0, 0, 0], None, 0).await.unwrap();
    assert_eq!(r.status, riser::scsi::sense::Status::GOOD);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_reinstatement_closes_the_old_connection() {
    let addr = start(|_| {}, |_| {}).await;
    let cfg = SessionConfig::new(ME, TARGET);
    let first = Session::connect(addr, cfg.clone()).await.unwrap();
    first.test_unit_ready(Lun::ZERO).await.unwrap();
    let second = Session::connect(addr, cfg).await.unwrap();
    second.test_unit_ready(Lun::ZERO).await.unwrap();
    // The target closed the first connection; the first session notices, logs in again
    // (reinstating the session in turn) and its command goes through.
    let data = pattern(1, 4096);
    first.write(Lun::ZERO, 0, data.clone(), 512).await.unwrap();
    assert_eq!(first.read(Lun::ZERO, 0, 8, 512).await.unwrap(), data);
    first.logout().await.unwrap();
    assert!(matches!(first.test_unit_ready(Lun::ZERO).await.unwrap_err(), Error::ConnectionLost));
}

async fn raw(addr: SocketAddr) -> tokio::net::TcpStream {
    tokio::net::TcpStream::connect(addr).await.unwrap()
}

async fn read_pdu(sock: &mut tokio::net::TcpStream) -> Option<(Header, Vec<u8>)> {
    let mut bhs = [0u8; 48];
    if sock.read_exact(&mut bhs).await.is_err() {
        return None;
    }
    let dsl = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
    let mut rest = vec![0u8; bhs[4] as usize * 4 + dsl.div_ceil(4) * 4];
    sock.read_exact(&mut rest).await.ok()?;
    let mut all = bhs.to_vec();
    all.extend_from_slice(&rest);
    let (p, _) = Pdu::parse(&all).ok()?;
    Some((p.header, p.data.to_vec()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_rfc_reaction_and_spares_other_sessions() {
    let addr = start(|_| {}, |_| {}).await;
    let good = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();

    // Garbage: the connection is dropped.
    let mut g = raw(addr).await;
    g.write_all(&[0xde; 200]).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), g.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert!(n == 0 || n >= 48, "garbage must end in a close or a login reject");

    // A command before login: Login Response 0x020B, then close.
    let mut c = raw(addr).await;
    let mut bytes = Vec::new();
    Pdu::new(Header::NopOut(NopOut { immediate: true, itt: 1, ttt: u32::MAX, ..NopOut::default() }), &[][..], &[][..]).encode(&mut bytes);
    c.write_all(&bytes).await.unwrap();
    match read_pdu(&mut c).await {
        Some((Header::LoginResponse(r), _)) => assert_eq!((r.status_class, r.status_detail), (2, 0x0b)),
        other => panic!("{other:?}"),
    }

    // An oversized data segment in a Login Request: dropped without reading 16 MiB.
    let mut o = raw(addr).await;
    let mut bhs = [0u8; 48];
    Header::LoginRequest(LoginRequest { csg: Stage::SECURITY, nsg: Stage::OPERATIONAL, ..LoginRequest::default() }).emit(
        &mut bhs,
        0,
        (1 << 24) - 1,
    );
    o.write_all(&bhs).await.unwrap();
    let n = tokio::time::timeout(std::time::Duration::from_secs(5), o.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "connection must be closed");

    // The well-behaved session never noticed.
    let data = pattern(5, 8192);
    good.write(Lun::ZERO, 5, data.clone(), 512).await.unwrap();
    assert_eq!(good.read(Lun::ZERO, 5, 16, 512).await.unwrap(), data);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crc32c_header_and_data_digests() {
    use riser::iscsi::keys::Digest;
    let addr = start(|_| {}, |_| {}).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.operational.header_digest = vec![Digest::Crc32c];
    cfg.operational.data_digest = vec![Digest::Crc32c];
    let s = Session::connect(addr, cfg).await.unwrap();
    assert_eq!((s.params().header_digest, s.params().data_digest), (Digest::Crc32c, Digest::Crc32c));
    let data = pattern(11, 1 << 20);
    s.write(Lun::ZERO, 300, data.clone(), 512).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 300, 2048, 512).await.unwrap(), data);
    s.logout().await.unwrap();
}

/// Log in with the sans-IO machine over a TCP datamover, for tests that then send raw PDUs.
async fn raw_session(addr: SocketAddr) -> (riser::tcp::PduDatamover, riser::iscsi::login::LoginOutcome) {
    use riser::datamover::{ControlPdu, Datamover, DmEvent};
    use riser::iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (dm, driver) = riser::tcp::datamover(stream, riser::iscsi::keys::Role::Initiator);
    tokio::spawn(driver);
    let cfg = InitiatorLoginConfig::new(ME, Some(TARGET.into()), riser::iscsi::wire::Isid([0x80, 1, 2, 3, 4, 5]));
    let mut l = InitiatorLogin::new(cfg, std::time::Duration::ZERO, [4; 32]);
    loop {
        while let Some(p) = l.poll_transmit() {
            dm.send_control(ControlPdu::new(Header::LoginRequest(p.header), p.data.into())).await.unwrap();
        }
        if let Some(InitiatorLoginEvent::Complete(o)) = l.poll_event() {
            dm.notice_key_values(&o.params);
            dm.enable();
            return (dm, o);
        }
        let DmEvent::Control(p) = dm.next_event().await else { panic!("connection ended during login") };
        l.handle_pdu(std::time::Duration::ZERO, &p.header, &p.data);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cmdsn_window_snack_and_stray_data_out() {
    use riser::datamover::{ControlPdu, Datamover, DmEvent};
    use riser::iscsi::wire::{DataOut, RejectReason, Snack};
    let addr = start(|_| {}, |_| {}).await;
    let (dm, o) = raw_session(addr).await;
    let next = |dm: &riser::tcp::PduDatamover| {
        let dm = dm.clone();
        async move {
            match tokio::time::timeout(std::time::Duration::from_secs(5), dm.next_event()).await.expect("an answer") {
                DmEvent::Control(p) => p.header,
                other => panic!("{other:?}"),
            }
        }
    };
    let ping = |itt: u32, cmd_sn: u32, immediate: bool| {
        Header::NopOut(NopOut { immediate, lun: Lun::ZERO, itt, ttt: u32::MAX, cmd_sn, exp_stat_sn: o.stat_sn })
    };
    // A non-immediate PDU far outside the window is silently ignored (RFC 7143 §4.2.2.1)...
    dm.send_control(ControlPdu::new(ping(5, o.exp_cmd_sn.wrapping_add(100_000), false), Bytes::new())).await.unwrap();
    // ...a stray Data-Out for no task is drained and ignored...
    let d = DataOut { final_: true, itt: 0x4444, ttt: 0x1234, ..DataOut::default() };
    dm.send_control(ControlPdu::new(Header::DataOut(d), Bytes::from(vec![7u8; 512]))).await.unwrap();
    // ...so the next answer is the one to the in-window ping.
    dm.send_control(ControlPdu::new(ping(6, o.exp_cmd_sn, false), Bytes::new())).await.unwrap();
    match next(&dm).await {
        Header::NopIn(n) => assert_eq!(n.itt, 6),
        h => panic!("{h:?}"),
    }
    // SNACK at ERL 0: Reject (protocol error), connection kept.
    dm.send_control(ControlPdu::new(Header::Snack(Snack { itt: 9, ..Snack::default() }), Bytes::new())).await.unwrap();
    match next(&dm).await {
        Header::Reject(r) => assert_eq!(r.reason, RejectReason::PROTOCOL_ERROR),
        h => panic!("{h:?}"),
    }
    dm.send_control(ControlPdu::new(ping(7, o.exp_cmd_sn.wrapping_add(1), true), Bytes::new())).await.unwrap();
    assert!(matches!(next(&dm).await, Header::NopIn(n) if n.itt == 7));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nop_in_keepalive_answered_keeps_the_session_unanswered_drops_it() {
    use riser::datamover::{ControlPdu, Datamover, DmEvent};
    use std::time::Duration;
    let quick = |c: &mut TargetConfig| {
        c.nop_interval = Some(Duration::from_millis(200));
        c.nop_timeout = Duration::from_millis(600);
    };
    // The riser initiator answers pings: the session outlives many intervals.
    let addr = start(|_| {}, quick).await;
    let s = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.test_unit_ready(Lun::ZERO).await.unwrap();

    // A silent initiator is dropped after the timeout.
    let (dm, _) = raw_session(addr).await;
    let first = tokio::time::timeout(Duration::from_secs(5), dm.next_event()).await.unwrap();
    assert!(matches!(first, DmEvent::Control(ControlPdu { header: Header::NopIn(n), .. }) if n.itt == u32::MAX && n.ttt != u32::MAX));
    let end = tokio::time::timeout(Duration::from_secs(5), dm.next_event()).await.unwrap();
    assert!(matches!(end, DmEvent::Terminated(_)), "{end:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn data_out_outside_its_sequence_ends_only_that_task() {
    use riser::datamover::{ControlPdu, Datamover, DmEvent};
    use riser::iscsi::wire::{DataOut, ScsiCommand};
    use riser::scsi::sense::Sense;
    let op = OperationalConfig::default().initial_r2t(true).immediate_data(false);
    let addr = start(|_| {}, |c| c.operational = op).await;
    let (dm, o) = raw_session(addr).await;
    let write10 = |itt: u32, cmd_sn: u32| {
        let mut cdb = [0u8; 16];
        cdb[..10].copy_from_slice(&[0x2a, 0, 0, 0, 0, 1, 0, 0, 8, 0]);
        Header::ScsiCommand(ScsiCommand {
            final_: true,
            write: true,
            attr: 1,
            itt,
            expected_data_len: 4096,
            cmd_sn,
            exp_stat_sn: o.stat_sn,
            cdb,
            ..ScsiCommand::default()
        })
    };
    let response = |dm: riser::tcp::PduDatamover| async move {
        loop {
            match tokio::time::timeout(std::time::Duration::from_secs(5), dm.next_event()).await.expect("an answer") {
                DmEvent::Control(ControlPdu { header: Header::ScsiResponse(r), data, .. }) => return (r, data),
                DmEvent::Control(_) => continue,
                other => panic!("{other:?}"),
            }
        }
    };
    // Data-Out for a Target Transfer Tag the target never issued.
    dm.send_control(ControlPdu::new(write10(0x10, o.exp_cmd_sn), Bytes::new())).await.unwrap();
    let d = DataOut { final_: true, itt: 0x10, ttt: 0x5555, ..DataOut::default() };
    dm.send_control(ControlPdu::new(Header::DataOut(d), Bytes::from(vec![1u8; 4096]))).await.unwrap();
    let (r, data) = response(dm.clone()).await;
    assert_eq!(r.itt, 0x10);
    assert_eq!(r.status, riser::scsi::sense::Status::CHECK_CONDITION);
    let sense = Sense::parse(&data[2..]).unwrap();
    assert_eq!((sense.key, sense.asc), (SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR));
    // Unsolicited Data-Out although InitialR2T=Yes (beyond the allowed burst of zero).
    dm.send_control(ControlPdu::new(write10(0x11, o.exp_cmd_sn.wrapping_add(1)), Bytes::new())).await.unwrap();
    let d = DataOut { final_: true, itt: 0x11, ttt: u32::MAX, ..DataOut::default() };
    dm.send_control(ControlPdu::new(Header::DataOut(d), Bytes::from(vec![1u8; 4096]))).await.unwrap();
    let (r, _) = response(dm.clone()).await;
    assert_eq!((r.itt, r.status), (0x11, riser::scsi::sense::Status::CHECK_CONDITION));
    // The connection is still good.
    let ping =
        NopOut { immediate: true, lun: Lun::ZERO, itt: 0x12, ttt: u32::MAX, cmd_sn: o.exp_cmd_sn.wrapping_add(2), exp_stat_sn: o.stat_sn };
    dm.send_control(ControlPdu::new(Header::NopOut(ping), Bytes::new())).await.unwrap();
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(5), dm.next_event()).await.unwrap() {
            DmEvent::Control(ControlPdu { header: Header::NopIn(n), .. }) if n.itt == 0x12 => break,
            DmEvent::Control(_) => continue,
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sendtargets_longer_than_one_pdu_uses_continuation() {
    // 4000 targets: about 400 KB of SendTargets text, more than the initiator's 256 KiB
    // MaxRecvDataSegmentLength, so the answer comes in C-bit pieces.
    let names: Vec<String> = (0..4000).map(|i| format!("iqn.2026-11.io.riser:a-rather-long-target-name-for-the-list-{i:05}")).collect();
    let addr = start(
        |_| {},
        |c| {
            for n in &names {
                c.nodes.push(Node::new(n.clone()));
            }
        },
    )
    .await;
    let found = discover(addr, ME, InitiatorAuth::None).await.unwrap();
    assert_eq!(found.len(), 4001);
    assert_eq!(found[4000].0, names[3999]);
    assert!(found.iter().all(|(_, a)| a.len() == 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_aborted_by_a_lun_reset_end_at_once() {
    let addr = start(|_| {}, |_| {}).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.timeout = std::time::Duration::from_secs(20);
    let s = Session::connect(addr, cfg).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 4 << 20);
            match s.write(Lun::ZERO, i * 8192, data.clone(), 512).await {
                Ok(()) | Err(Error::Aborted) => {}
                Err(e) => panic!("write: {e}"),
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let t0 = std::time::Instant::now();
    s.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    // Aborted commands get no response from the target: they end with the reset, not a timeout.
    assert!(t0.elapsed() < std::time::Duration::from_secs(10));
    s.test_unit_ready(Lun::ZERO).await.unwrap();
}

/// ABORT TASK of a command that has ended: the session names the command's own CmdSN as
/// RefCmdSN, which the target has received, so the task does not exist (riser's initiator once
/// sent its next CmdSN, and the target took the abort for one of a command not arrived yet).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_of_a_finished_command_says_it_does_not_exist() {
    let addr = start(|_| {}, |_| {}).await;
    let s = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    // The session's first task tag (riser_iscsi's InitiatorSession starts at 0x100): the TEST
    // UNIT READY above, or the first try of it before a UNIT ATTENTION. The riser target drops
    // a task from its table just after its response has left, so an abort right behind the
    // response may still find it there ("complete"); it is asked again until that is over.
    let mut answers = Vec::new();
    for _ in 0..20 {
        match s.task_management(Lun::ZERO, TmfFunction::ABORT_TASK, 0x100).await {
            Err(Error::TaskManagement(TmfResponse::TASK_DOES_NOT_EXIST)) => break,
            other => answers.push(format!("{other:?}")),
        }
        tokio::time::sleep(std::time::Duration::from_millis(25)).await;
    }
    assert!(answers.len() < 20, "the abort of an ended command completes: {answers:?}");
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    s.logout().await.unwrap();
}

/// A RAM disk whose writes wait while `hold` is set: a command the target is still executing.
#[derive(Debug)]
struct HeldWrites {
    ram: RamBackend,
    hold: std::sync::Mutex<bool>,
    moved: std::sync::Condvar,
    waiting: std::sync::atomic::AtomicUsize,
}

impl HeldWrites {
    fn hold(&self, on: bool) {
        *self.hold.lock().unwrap() = on;
        self.moved.notify_all();
    }
}

impl riser::target::backend::BlockBackend for HeldWrites {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        use std::sync::atomic::Ordering::SeqCst;
        self.waiting.fetch_add(1, SeqCst);
        let mut held = self.hold.lock().unwrap();
        while *held {
            held = self.moved.wait(held).unwrap();
        }
        drop(held);
        self.waiting.fetch_sub(1, SeqCst);
        self.ram.write(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.ram.unmap(offset, len)
    }
    fn is_mapped(&self, offset: u64) -> bool {
        self.ram.is_mapped(offset)
    }
    fn thin(&self) -> bool {
        false
    }
}

/// ABORT TASK SET ends the command the target is executing (its caller gets `Aborted` once the
/// function completes), and not a command sent after the function while it was pending.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_task_set_ends_the_commands_before_it_not_those_after() {
    use std::sync::atomic::Ordering::SeqCst;
    let disk = Arc::new(HeldWrites {
        ram: RamBackend::new(64 << 20, 512),
        hold: std::sync::Mutex::new(true),
        moved: std::sync::Condvar::new(),
        waiting: std::sync::atomic::AtomicUsize::new(0),
    });
    let lu = Arc::new(LogicalUnit::new(disk.clone(), Lun::ZERO, 9));
    let n = Node::new(TARGET).lun(lu);
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(Target::new(TargetConfig::default().node(n)).serve(l));
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.timeout = std::time::Duration::from_secs(10);
    let s = Session::connect(addr, cfg).await.unwrap();
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    let held = tokio::spawn({
        let s = s.clone();
        async move { s.write(Lun::ZERO, 0, pattern(1, 512), 512).await }
    });
    let t0 = std::time::Instant::now();
    while disk.waiting.load(SeqCst) == 0 {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "the write never reached the disk");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    let tmf = tokio::spawn({
        let s = s.clone();
        async move { s.task_management(Lun::ZERO, TmfFunction::ABORT_TASK_SET, 0).await }
    });
    // The function waits at the target for the held write; a read goes out meanwhile.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!tmf.is_finished(), "answered while the aborted write still runs");
    let after = tokio::spawn({
        let s = s.clone();
        async move { s.read(Lun::ZERO, 64, 1, 512).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    disk.hold(false);
    tmf.await.unwrap().unwrap();
    assert!(matches!(held.await.unwrap(), Err(Error::Aborted)));
    assert_eq!(after.await.unwrap().unwrap(), vec![0u8; 512], "the read sent after the function is not its victim");
    s.logout().await.unwrap();
}

/// One connection of a target that numbers its Login Responses as tgt's iSER login does
/// (usr/iscsi/iser_text.c: ExpCmdSN = the login's CmdSN + 1, MaxCmdSN = the login's CmdSN), then
/// opens its window with a NOP-In (ExpCmdSN = the login's CmdSN) and, as tgt, executes commands
/// strictly in CmdSN order from the login's CmdSN: a command with a later CmdSN waits for the
/// missing one forever. Every command ends GOOD; a Logout is answered.
async fn tgt_iser_like_connection(mut sock: tokio::net::TcpStream) {
    use riser::iscsi::login::{TargetLogin, TargetLoginConfig, TargetLoginEvent, TargetLoginParams, TargetNode};
    use riser::iscsi::wire::{LogoutResponse, NopIn, ScsiResponse};
    async fn send(sock: &mut tokio::net::TcpStream, h: Header, data: &[u8]) {
        let mut bytes = Vec::new();
        Pdu::new(h, &[][..], data).encode(&mut bytes);
        sock.write_all(&bytes).await.unwrap();
    }
    let cfg = TargetLoginConfig::default().target(TargetNode::open(TARGET));
    let mut login = TargetLogin::new(cfg, TargetLoginParams { new_tsih: 7, initial_stat_sn: 1, cmd_window: 32, entropy: [9; 32] });
    let (mut exp_cmd_sn, mut stat_sn) = loop {
        let Some((h, d)) = read_pdu(&mut sock).await else { return };
        let Header::LoginRequest(req) = h else { return };
        login.handle_pdu(std::time::Duration::ZERO, &h, &d);
        while let Some(mut p) = login.poll_transmit() {
            (p.header.exp_cmd_sn, p.header.max_cmd_sn) = (req.cmd_sn.wrapping_add(1), req.cmd_sn);
            send(&mut sock, Header::LoginResponse(p.header), &p.data).await;
        }
        match login.poll_event() {
            Some(TargetLoginEvent::Complete(o)) => break (req.cmd_sn, o.stat_sn),
            Some(_) => return,
            None => {}
        }
    };
    let nop = NopIn { itt: u32::MAX, ttt: u32::MAX, stat_sn, exp_cmd_sn, max_cmd_sn: exp_cmd_sn + 31, ..NopIn::default() };
    send(&mut sock, Header::NopIn(nop), &[]).await;
    while let Some((h, _)) = read_pdu(&mut sock).await {
        match h {
            Header::ScsiCommand(c) if c.cmd_sn == exp_cmd_sn => {
                exp_cmd_sn += 1;
                let r = ScsiResponse { itt: c.itt, stat_sn, exp_cmd_sn, max_cmd_sn: exp_cmd_sn + 31, ..ScsiResponse::default() };
                stat_sn += 1;
                send(&mut sock, Header::ScsiResponse(r), &[]).await;
            }
            Header::LogoutRequest(l) => {
                let r = LogoutResponse { itt: l.itt, stat_sn, exp_cmd_sn, max_cmd_sn: exp_cmd_sn + 31, ..LogoutResponse::default() };
                send(&mut sock, Header::LogoutResponse(r), &[]).await;
                return;
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_reach_a_target_whose_login_responses_overstate_expcmdsn() {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((sock, _)) = l.accept().await {
            tokio::spawn(tgt_iser_like_connection(sock));
        }
    });
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.timeout = std::time::Duration::from_secs(3);
    let s = Session::connect(addr, cfg).await.unwrap();
    // The first command carries the login's CmdSN (RFC 7143 §11.12.8), then the sequence goes on.
    for _ in 0..3 {
        s.test_unit_ready(Lun::ZERO).await.unwrap();
    }
    s.logout().await.unwrap();
}

/// A discovery session ends with a Logout acknowledging every status it got (ExpStatSN = the
/// last StatSN + 1, RFC 7143 §11.14), and waits for the Logout Response before it closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_logout_acknowledges_the_last_status() {
    use riser::iscsi::login::{TargetLogin, TargetLoginConfig, TargetLoginEvent, TargetLoginParams, TargetNode};
    use riser::iscsi::wire::{LogoutResponse, TextResponse};
    async fn send(sock: &mut tokio::net::TcpStream, h: Header, data: &[u8]) {
        let mut bytes = Vec::new();
        Pdu::new(h, &[][..], data).encode(&mut bytes);
        sock.write_all(&bytes).await.unwrap();
    }
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut sock, _) = l.accept().await.unwrap();
        let cfg = TargetLoginConfig::default().target(TargetNode::open(TARGET));
        let mut login = TargetLogin::new(cfg, TargetLoginParams { new_tsih: 3, initial_stat_sn: 100, cmd_window: 8, entropy: [1; 32] });
        let stat_sn = loop {
            let (h, d) = read_pdu(&mut sock).await.unwrap();
            login.handle_pdu(std::time::Duration::ZERO, &h, &d);
            while let Some(p) = login.poll_transmit() {
                send(&mut sock, Header::LoginResponse(p.header), &p.data).await;
            }
            if let Some(TargetLoginEvent::Complete(o)) = login.poll_event() {
                break o.stat_sn;
            }
        };
        let (h, _) = read_pdu(&mut sock).await.unwrap();
        let Header::TextRequest(t) = h else { panic!("expected SendTargets, got {h:?}") };
        let text = format!("TargetName={TARGET}\0TargetAddress=127.0.0.1:3260,1\0");
        let r = TextResponse {
            final_: true,
            itt: t.itt,
            ttt: u32::MAX,
            stat_sn,
            exp_cmd_sn: t.cmd_sn,
            max_cmd_sn: t.cmd_sn + 8,
            ..TextResponse::default()
        };
        send(&mut sock, Header::TextResponse(r), text.as_bytes()).await;
        let (h, _) = read_pdu(&mut sock).await.unwrap();
        let Header::LogoutRequest(lo) = h else { panic!("expected a Logout, got {h:?}") };
        let r = LogoutResponse {
            itt: lo.itt,
            stat_sn: stat_sn + 1,
            exp_cmd_sn: lo.cmd_sn,
            max_cmd_sn: lo.cmd_sn + 8,
            ..LogoutResponse::default()
        };
        send(&mut sock, Header::LogoutResponse(r), &[]).await;
        let _ = tx.send((lo.exp_stat_sn, stat_sn));
    });
    let found = discover(addr, ME, InitiatorAuth::None).await.unwrap();
    assert_eq!(found[0].0, TARGET);
    let (acked, last) = rx.await.unwrap();
    assert_eq!(acked, last.wrapping_add(1), "the Logout's ExpStatSN");
}

/// A discovery session (the sans-IO machine over a TCP datamover) in the name of `initiator`
/// with `isid`, that also declares `TargetName=target` in its first request (RFC 7143 requires
/// TargetName only on normal sessions; nothing forbids it on discovery).
async fn discovery_session_naming(
    addr: SocketAddr,
    initiator: &str,
    isid: riser::iscsi::wire::Isid,
    target: &str,
) -> (riser::tcp::PduDatamover, riser::iscsi::login::LoginOutcome) {
    use riser::datamover::{ControlPdu, Datamover, DmEvent};
    use riser::iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (dm, driver) = riser::tcp::datamover(stream, riser::iscsi::keys::Role::Initiator);
    tokio::spawn(driver);
    let mut l = InitiatorLogin::new(InitiatorLoginConfig::new(initiator, None, isid), std::time::Duration::ZERO, [5; 32]);
    let mut first = true;
    loop {
        while let Some(mut p) = l.poll_transmit() {
            if std::mem::take(&mut first) {
                p.data.extend_from_slice(format!("TargetName={target}\0").as_bytes());
            }
            dm.send_control(ControlPdu::new(Header::LoginRequest(p.header), p.data.into())).await.unwrap();
        }
        match l.poll_event() {
            Some(InitiatorLoginEvent::Complete(o)) => {
                dm.notice_key_values(&o.params);
                dm.enable();
                return (dm, o);
            }
            Some(e) => panic!("discovery login: {e:?}"),
            None => {}
        }
        let DmEvent::Control(p) = dm.next_event().await else { panic!("connection ended during login") };
        l.handle_pdu(std::time::Duration::ZERO, &p.header, &p.data);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_in_a_victims_names_leaves_its_reservation_and_session() {
    use riser::datamover::{ControlPdu, Datamover, DmEvent};
    use riser::iscsi::wire::{Isid, LogoutReason, LogoutRequest};
    use riser::scsi::sense::Status;
    let addr = start(|n| n.acl = vec![ME.into(), OTHER.into()], |_| {}).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.isid = Isid([0x80, 0x11, 0x22, 0x33, 0x44, 0x55]);
    let victim = Session::connect(addr, cfg.clone()).await.unwrap();
    let reserve6 = [0x16, 0, 0, 0, 0, 0];
    assert_eq!(victim.command(Lun::ZERO, &reserve6, None, 0).await.unwrap().status, Status::GOOD);
    let other = Session::connect(addr, SessionConfig::new(OTHER, TARGET)).await.unwrap();
    let tur = |s: Session| async move { s.command(Lun::ZERO, &[0; 6], None, 0).await.unwrap().status };
    assert_eq!(tur(other.clone()).await, Status::RESERVATION_CONFLICT);

    // A discovery session with the victim's InitiatorName, ISID and TargetName, ending with a
    // Logout (the target releases what the nexus holds before it answers)...
    let (dm, o) = discovery_session_naming(addr, ME, cfg.isid, TARGET).await;
    let logout = LogoutRequest {
        immediate: true,
        reason: LogoutReason::CLOSE_SESSION,
        itt: 2,
        cmd_sn: o.exp_cmd_sn,
        exp_stat_sn: o.stat_sn,
        ..LogoutRequest::default()
    };
    dm.send_control(ControlPdu::new(Header::LogoutRequest(logout), Bytes::new())).await.unwrap();
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(5), dm.next_event()).await.unwrap() {
            DmEvent::Control(ControlPdu { header: Header::LogoutResponse(_), .. }) => break,
            DmEvent::Control(_) => continue,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(tur(other.clone()).await, Status::RESERVATION_CONFLICT, "a discovery Logout released the victim's RESERVE(6)");

    // ...and one that just drops its connection.
    let (dm, _) = discovery_session_naming(addr, ME, cfg.isid, TARGET).await;
    dm.terminate();
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(tur(other.clone()).await, Status::RESERVATION_CONFLICT, "a discovery session's end released the victim's RESERVE(6)");

    // The victim still holds the unit (a reinstatement or a closed session would have ended
    // its nexus, and the reservation with it) and releases it.
    assert_eq!(tur(victim.clone()).await, Status::GOOD);
    assert_eq!(victim.command(Lun::ZERO, &[0x17, 0, 0, 0, 0, 0], None, 0).await.unwrap().status, Status::GOOD);
    assert_eq!(tur(other).await, Status::GOOD, "RELEASE(6) by the victim frees the unit");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sendtargets_lists_only_permitted_targets_unless_told_to_list_all() {
    const MINE: &str = "iqn.2026-11.io.riser:mine";
    const THEIRS: &str = "iqn.2026-11.io.riser:theirs";
    let nodes = |c: &mut TargetConfig| {
        for (name, acl) in [(MINE, ME), (THEIRS, OTHER)] {
            c.nodes.push(Node::new(name).allow(acl));
        }
    };
    let names = |found: Vec<(String, Vec<String>)>| found.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    // Default: the open target and those whose ACL names the initiator.
    let addr = start(|_| {}, nodes).await;
    assert_eq!(names(discover(addr, ME, InitiatorAuth::None).await.unwrap()), [TARGET, MINE]);
    assert_eq!(names(discover(addr, OTHER, InitiatorAuth::None).await.unwrap()), [TARGET, THEIRS]);
    // A normal session to a target the ACL refuses stays refused.
    let e = Session::connect(addr, SessionConfig::new(ME, THEIRS)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHORIZATION_FAILURE))), "{e}");
    // Configured to list everything (LIO's demo_mode_discovery=1).
    let addr = start(
        |_| {},
        |c| {
            nodes(c);
            c.discovery_scope = DiscoveryScope::All;
        },
    )
    .await;
    assert_eq!(names(discover(addr, ME, InitiatorAuth::None).await.unwrap()), [TARGET, MINE, THEIRS]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_chap_required_refused_and_mutual() {
    use riser::iscsi::chap::ChapAlgorithm;
    let chap = |secret: &str, mutual: Option<ChapCredentials>| InitiatorAuth::Chap {
        credentials: creds("disc", secret),
        algorithms: ChapAlgorithm::ALL.to_vec(),
        mutual,
    };
    let addr = start(|_| {}, |c| c.discovery_chap = Some(creds("disc", "discoverysecret"))).await;
    let e = discover(addr, ME, InitiatorAuth::None).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "{e}");
    let e = discover(addr, ME, chap("wrongsecret1234", None)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "{e}");
    assert_eq!(discover(addr, ME, chap("discoverysecret", None)).await.unwrap().len(), 1);
    // Discovery CHAP is not the targets' CHAP: a normal session to the open node needs none.
    Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap().test_unit_ready(Lun::ZERO).await.unwrap();

    let addr = start(
        |_| {},
        |c| {
            c.discovery_chap = Some(creds("disc", "discoverysecret"));
            c.discovery_mutual_chap = Some(creds("portal", "portalsecret12"));
        },
    )
    .await;
    assert_eq!(discover(addr, ME, chap("discoverysecret", Some(creds("portal", "portalsecret12")))).await.unwrap().len(), 1);
    let e = discover(addr, ME, chap("discoverysecret", Some(creds("portal", "impostorsecret")))).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Authentication(AuthFailure::MutualChapFailed))), "{e}");
    let e = discover(addr, ME, chap("discoverysecret", None)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "mutual CHAP required: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_waiting_for_a_data_out_ends_when_its_task_is_dropped() {
    // The target's datamover is reading an unsolicited Data-Out's data (half of it has come)
    // when the core starts collecting the write: Get_Data waits for the buffer. The task is
    // then dropped (as an abort or the connection's end does): Get_Data must end with NoTask,
    // not wait for a wake-up nobody sends.
    use riser::datamover::{Datamover, DmError, R2tPlan};
    use riser::iscsi::keys::{NegotiatedParams, Role};
    use riser::iscsi::wire::{DataOut, ScsiCommand};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut peer = tokio::net::TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
    let (sock, _) = l.accept().await.unwrap();
    let (dm, driver) = riser::tcp::datamover(sock, Role::Target);
    tokio::spawn(driver);
    let dm = Arc::new(dm);
    let params = NegotiatedParams {
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 65536,
        max_burst_length: 262_144,
        ..NegotiatedParams::default()
    };
    dm.notice_key_values(&params);
    dm.enable();
    let mut out = Vec::new();
    let cdb = [0x2a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    let cmd = ScsiCommand { write: true, itt: 7, expected_data_len: 131_072, cmd_sn: 1, cdb, ..ScsiCommand::default() };
    Pdu::new(Header::ScsiCommand(cmd), &[][..], &[][..]).encode(&mut out);
    let mut data_out = Vec::new();
    let d = DataOut { itt: 7, ttt: u32::MAX, ..DataOut::default() };
    Pdu::new(Header::DataOut(d), &[][..], &[0x5a; 8192][..]).encode(&mut data_out);
    out.extend_from_slice(&data_out[..48 + 4096]);
    peer.write_all(&out).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let plan = R2tPlan {
        itt: 7,
        lun: Lun::ZERO,
        start: 65536,
        end: 131_072,
        max_burst: 262_144,
        first_ttt: 1,
        stat_sn: 1,
        exp_cmd_sn: 2,
        max_cmd_sn: 33,
    };
    let collector = dm.clone();
    let collect = tokio::spawn(async move { collector.get_data(plan).await.map(|_| ()) });
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    assert!(!collect.is_finished(), "Get_Data waits while the Data-Out's data is read");
    dm.deallocate_task_resources(7);
    let r = tokio::time::timeout(std::time::Duration::from_secs(3), collect).await.expect("Get_Data ended").unwrap();
    assert_eq!(r, Err(DmError::NoTask(7)));
}
