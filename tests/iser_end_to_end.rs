//! End to end over iSER on the software iWARP RNIC (loopback TCP underneath), in process: the
//! same target server and initiator as over TCP, with the iSER datamover in between.

use bytes::Bytes;
use riser::initiator::{IserConnector, Session, SessionConfig, discover_via};
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::login::InitiatorAuth;
use riser::iscsi::wire::TmfFunction;
use riser::iser::IserConfig;
use riser::iwarp::SoftRnic;
use riser::scsi::lun::Lun;
use riser::target::backend::RamBackend;
use riser::target::lu::LogicalUnit;
use riser::target::server::{Node, Target, TargetConfig};
use riser::verbs::Provider;
use std::net::SocketAddr;
use std::sync::Arc;

const TARGET: &str = "iqn.2026-11.io.riser:iser-e2e";
const ME: &str = "iqn.2026-11.io.riser:iser-tester";

async fn start() -> SocketAddr {
    start_with(|_| {}).await
}

async fn start_with(f: impl FnOnce(&mut TargetConfig)) -> SocketAddr {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
    let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(64 << 20, 512)), Lun::ZERO, 9));
    let n = Node::new(TARGET).lun(lu);
    let mut c = TargetConfig::default().node(n).queue_depth(64);
    f(&mut c);
    let rnic = SoftRnic::default();
    let l = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = riser::verbs::Listener::local_addr(&l).unwrap();
    tokio::spawn(Target::new(c).serve_iser(rnic, l, IserConfig::default()));
    addr
}

fn config() -> SessionConfig {
    let mut c = SessionConfig::new(ME, TARGET);
    c.connector = Arc::new(IserConnector::new(SoftRnic::default(), IserConfig::default()));
    c
}

fn pattern(seed: u8, len: usize) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 11) as u8).collect::<Vec<_>>().into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_login_and_every_transfer_size() {
    let addr = start().await;
    let found = discover_via(&*config().connector, addr, ME, InitiatorAuth::None).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, TARGET);
    let s = Session::connect(addr, config()).await.unwrap();
    assert!(s.params().rdma_extensions, "RDMAExtensions=Yes negotiated");
    let (blocks, bs) = s.read_capacity(Lun::ZERO).await.unwrap();
    assert_eq!((blocks, bs), (131_072, 512));
    // 512 B to 16 MiB, written (immediate data + RDMA Read) and read back (RDMA Write).
    let mut lba = 0;
    for (i, len) in [512usize, 4096, 8192, 8704, 65_536, 262_144, 1 << 20, 4 << 20, 16 << 20].into_iter().enumerate() {
        let data = pattern(i as u8, len);
        s.write(Lun::ZERO, lba, data.clone(), bs).await.unwrap();
        let back = s.read(Lun::ZERO, lba, (len / 512) as u32, bs).await.unwrap();
        assert_eq!(back, data, "{len} bytes");
        // Read buffers go back to the datamover; the next (smaller or larger) reads reuse them.
        s.recycle(back);
        lba = (lba + (len / 512) as u64) % 65_536;
    }
    // A recycled buffer never shows its old bytes: a read of fresh data into one.
    let fresh = pattern(200, 8192);
    s.write(Lun::ZERO, 40_000, fresh.clone(), bs).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 40_000, 16, bs).await.unwrap(), fresh);
    s.ping().await.unwrap();
    s.logout().await.unwrap();
}

/// A connection the initiator ends itself (as after a fault it detected) ends its commands in
/// flight and the session logs in again: over iSER the local end was never reported, so the
/// session waited for its commands until they timed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_dropped_by_the_initiator_is_replaced() {
    let addr = start().await;
    let mut c = config();
    c.timeout = std::time::Duration::from_secs(5);
    let s = Session::connect(addr, c).await.unwrap();
    let data = pattern(7, 1 << 20);
    s.write(Lun::ZERO, 0, data.clone(), 512).await.unwrap();
    let reads: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.read(Lun::ZERO, 0, 2048, 512).await })
        })
        .collect();
    s.drop_connection();
    for r in reads {
        // Done before the drop, retried on the new connection, or failed with the connection:
        // never waiting out the timeout.
        match r.await.unwrap() {
            Ok(back) => assert_eq!(back, data),
            Err(e) => assert!(matches!(e, riser::initiator::Error::ConnectionLost), "{e}"),
        }
    }
    assert_eq!(s.read(Lun::ZERO, 0, 2048, 512).await.unwrap(), data);
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_commands_in_flight() {
    let addr = start().await;
    let s = Session::connect(addr, config()).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 32_768);
            s.write(Lun::ZERO, 1000 + i * 64, data.clone(), 512).await.unwrap();
            assert_eq!(s.read(Lun::ZERO, 1000 + i * 64, 64, 512).await.unwrap(), data);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await.unwrap();
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_during_transfers_and_teardown_leave_no_registration_behind() {
    let addr = start().await;
    let rnic = SoftRnic::default();
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.connector = Arc::new(IserConnector::new(rnic.clone(), IserConfig::default()));
    let s = Session::connect(addr, cfg).await.unwrap();
    // Large transfers in flight while the LU is reset: each command either completes with its
    // data intact or fails; none hangs, and the session carries on.
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 4 << 20);
            if s.write(Lun::ZERO, i * 8192, data.clone(), 512).await.is_ok()
                && let Ok(back) = s.read(Lun::ZERO, i * 8192, 8192, 512).await
            {
                assert_eq!(back, data);
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    s.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await.unwrap();
    s.task_management(Lun::ZERO, TmfFunction::ABORT_TASK_SET, 0).await.unwrap();
    for t in tasks {
        tokio::time::timeout(std::time::Duration::from_secs(30), t).await.expect("no command hangs").unwrap();
    }
    let data = pattern(99, 1 << 20);
    s.write(Lun::ZERO, 100_000, data.clone(), 512).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 100_000, 2048, 512).await.unwrap(), data);
    assert!(rnic.registered_regions() > 0, "receive buffers are registered while connected");
    s.logout().await.unwrap();
    drop(s);
    // Every per-command registration was revoked and deregistered; with the connection gone
    // its receive buffers are too.
    let t0 = std::time::Instant::now();
    while rnic.registered_regions() != 0 {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{} regions still registered", rnic.registered_regions());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn immediate_unsolicited_and_rdma_read_data_in_one_write() {
    let addr = start_with(|c| c.iser_unsolicited_data = true).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    // As the Linux initiator: InitialR2T=No, so up to FirstBurstLength goes unsolicited: 8 KiB of
    // immediate data, then Data-Out Sends to 64 KiB, then the target RDMA Reads the rest.
    cfg.operational.first_burst_length = 65_536;
    let iser = IserConfig::default().unsolicited_data_out(true);
    cfg.connector = Arc::new(IserConnector::new(SoftRnic::default(), iser));
    let s = Session::connect(addr, cfg).await.unwrap();
    assert!(!s.params().initial_r2t && s.params().immediate_data);
    assert_eq!(s.params().first_burst_length, 65_536);
    for (i, len) in [4096usize, 65_536, 70_000 / 512 * 512, 1 << 20].into_iter().enumerate() {
        let data = pattern(40 + i as u8, len);
        s.write(Lun::ZERO, 4096, data.clone(), 512).await.unwrap();
        assert_eq!(s.read(Lun::ZERO, 4096, (len / 512) as u32, 512).await.unwrap(), data, "{len} bytes");
    }
    s.logout().await.unwrap();
}

/// Log in on a bare iSER datamover (what the riser initiator does, without its safety).
async fn bare_login(addr: SocketAddr) -> (Arc<riser::iser::IserDatamover<SoftRnic>>, riser::iscsi::login::LoginOutcome) {
    use riser::datamover::{ControlPdu, Datamover, DmEvent};
    use riser::iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent};
    use riser::iscsi::wire::{Header, Isid};
    let rnic = SoftRnic::default();
    let dm = tokio::task::spawn_blocking(move || riser::iser::connect(&rnic, addr, IserConfig::default())).await.unwrap().unwrap();
    tokio::spawn(dm.driver());
    let dm = Arc::new(dm);
    let mut cfg = InitiatorLoginConfig::new(ME, Some(TARGET.into()), Isid([0x80, 1, 2, 3, 4, 5]));
    cfg.transport = riser::iscsi::keys::Transport::Iser;
    cfg.operational.max_recv_data_segment_length = 8192;
    let mut l = InitiatorLogin::new(cfg, std::time::Duration::ZERO, [7; 32]);
    loop {
        while let Some(p) = l.poll_transmit() {
            dm.send_control(ControlPdu::new(Header::LoginRequest(p.header), p.data.into())).await.unwrap();
        }
        if let Some(InitiatorLoginEvent::Complete(o)) = l.poll_event() {
            dm.notice_key_values(&o.params);
            dm.enable();
            return (dm, o);
        }
        match dm.next_event().await {
            DmEvent::Control(p) => l.handle_pdu(std::time::Duration::ZERO, &p.header, &p.data),
            other => panic!("login: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffer_smaller_than_the_command_says_is_protected_by_the_rnic() {
    use riser::datamover::{Datamover, DmEvent};
    use riser::iscsi::wire::ScsiCommand;
    let addr = start().await;
    let (dm, o) = bare_login(addr).await;
    // READ(10) of 128 blocks (64 KiB) with EDTL 64 KiB, but only 4 KiB registered and advertised:
    // the target's RDMA Write runs past the region and the initiator's RNIC refuses it.
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&[0x28, 0, 0, 0, 0, 0, 0, 0, 128, 0]);
    let cmd = ScsiCommand {
        final_: true,
        read: true,
        attr: 1,
        itt: 0x42,
        expected_data_len: 65_536,
        cmd_sn: o.exp_cmd_sn,
        exp_stat_sn: o.stat_sn,
        cdb,
        ..ScsiCommand::default()
    };
    dm.send_command(cmd, Bytes::new(), 4096, None).await.unwrap();
    let ended = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            if let DmEvent::Terminated(_) = dm.next_event().await {
                return;
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the out-of-bounds write ends the connection");
    // The target is unharmed: a well-behaved session works.
    let s = Session::connect(addr, config()).await.unwrap();
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    s.logout().await.unwrap();
}

/// The Linux initiator offers InitialR2T=No with a 256 KiB FirstBurstLength and sends the
/// unsolicited part as 8 KiB Data-Out Sends, each needing a receive the target posted. By
/// default the target answers InitialR2T=Yes over iSER (as LIO), so a full window of writes
/// never outruns its receives; it used to accept, and ran out (Terminate: Send with no receive
/// posted) under a window of concurrent writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_of_writes_from_a_linux_like_initiator_never_outruns_the_targets_receives() {
    let addr = start().await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.operational.first_burst_length = 262_144;
    cfg.connector = Arc::new(IserConnector::new(SoftRnic::default(), IserConfig::default().unsolicited_data_out(true)));
    let s = Session::connect(addr, cfg).await.unwrap();
    assert!(s.params().initial_r2t, "the target answers InitialR2T=Yes over iSER");
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 512 << 10);
            s.write(Lun::ZERO, i * 1024, data.clone(), 512).await.unwrap();
            assert_eq!(s.read(Lun::ZERO, i * 1024, 1024, 512).await.unwrap(), data);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.logout().await.unwrap();
}

/// A login below the initiator library (the tests that need PDUs it would never send): the
/// iSER datamover and the login's outcome, the connection in full feature phase.
async fn raw_login(
    addr: SocketAddr,
    operational: OperationalConfig,
    isid: u8,
) -> (riser::datamover::SharedDatamover, riser::iscsi::login::LoginOutcome) {
    use riser::datamover::{ControlPdu, DmEvent};
    use riser::initiator::Connector;
    use riser::iscsi::login::{InitiatorLogin, InitiatorLoginConfig, InitiatorLoginEvent};
    use riser::iscsi::wire::{Header, Isid};
    let connector = IserConnector::new(SoftRnic::default(), IserConfig::default());
    let dm = connector.connect(addr).await.unwrap();
    let mut cfg = InitiatorLoginConfig::new(ME, Some(TARGET.into()), Isid([0x80, 0, 0, 0, 0, isid]));
    cfg.transport = connector.transport();
    cfg.operational = operational;
    let mut l = InitiatorLogin::new(cfg, std::time::Duration::ZERO, [7; 32]);
    let o = loop {
        while let Some(p) = l.poll_transmit() {
            dm.send_control(ControlPdu::new(Header::LoginRequest(p.header), p.data.into())).await.unwrap();
        }
        match l.poll_event() {
            Some(InitiatorLoginEvent::Complete(o)) => break o,
            Some(InitiatorLoginEvent::Failed(f)) => panic!("login failed: {f:?}"),
            _ => {}
        }
        match dm.next_event().await {
            DmEvent::Control(p) => l.handle_pdu(std::time::Duration::ZERO, &p.header, &p.data),
            _ => panic!("connection lost in login"),
        }
    };
    dm.notice_key_values(&o.params);
    dm.enable();
    (dm, o)
}

/// The SCSI Response to `itt` (other PDUs skipped) and its sense data, within 10 s; panics if
/// the connection ends first.
async fn response(
    dm: &riser::datamover::SharedDatamover,
    itt: u32,
) -> (riser::iscsi::wire::ScsiResponse, Option<riser::scsi::sense::Sense>) {
    use riser::datamover::DmEvent;
    use riser::iscsi::wire::Header;
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(10), dm.next_event()).await.expect("an answer") {
            DmEvent::Control(p) => {
                if let Header::ScsiResponse(r) = p.header
                    && r.itt == itt
                {
                    return (r, (p.data.len() > 2).then(|| riser::scsi::sense::Sense::parse(&p.data[2..]).unwrap()));
                }
            }
            DmEvent::Terminated(t) => panic!("the connection ended: {t:?}"),
            _ => {}
        }
    }
}

/// Over iSER, commands whose lengths contradict each other get the same CHECK CONDITION as over
/// TCP, and the connection goes on (the iSER datamover used to drop it, or hand the core a task
/// for immediate data beyond the command's length). Driven below the initiator library: its
/// commands are always consistent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn contradictory_lengths_get_check_condition_and_the_connection_stays() {
    use riser::iscsi::wire::ScsiCommand;
    use riser::scsi::sense::{AscAscq, SenseKey, Status};
    let addr = start().await;
    let (dm, o) = raw_login(addr, OperationalConfig::default(), 0x21).await;
    assert!(o.params.immediate_data && o.params.initial_r2t, "the target's iSER defaults");
    let mut cmd_sn = o.exp_cmd_sn;
    let mut run = async |itt: u32, edtl: u32, data: Vec<u8>| {
        let mut cdb = [0u8; 16];
        cdb[..10].copy_from_slice(&[0x2a, 0, 0, 0, 0, 8, 0, 0, 1, 0]); // WRITE(10), LBA 8, 1 block
        let cmd = ScsiCommand {
            final_: true,
            write: true,
            attr: 1,
            itt,
            expected_data_len: edtl,
            cmd_sn,
            exp_stat_sn: o.stat_sn,
            cdb,
            ..ScsiCommand::default()
        };
        cmd_sn = cmd_sn.wrapping_add(1);
        dm.send_command(cmd, Bytes::new(), 0, Some(data.into())).await.unwrap();
        let (r, sense) = response(&dm, itt).await;
        (r.status, sense)
    };
    // 1 KiB of immediate data for a 512-byte command.
    let (status, sense) = run(1, 512, vec![1; 1024]).await;
    assert_eq!(status, Status::CHECK_CONDITION);
    let s = sense.unwrap();
    assert_eq!((s.key, s.asc), (SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR));
    // An expected length of 1 GiB, beyond any task buffer.
    let (status, sense) = run(2, 1 << 30, vec![2; 512]).await;
    assert_eq!(status, Status::CHECK_CONDITION);
    assert_eq!(sense.unwrap().key, SenseKey::ILLEGAL_REQUEST);
    // The connection lives: a consistent write succeeds.
    let (status, _) = run(3, 512, vec![3; 512]).await;
    assert_eq!(status, Status::GOOD);
}

/// Over iSER as over TCP: a write whose unsolicited burst ends early (Data-Out with F=1 before
/// FirstBurstLength) or is announced where InitialR2T=Yes forbids it (F=0) fails with CHECK
/// CONDITION and writes nothing; the connection goes on. Before, the bytes nobody sent came from
/// a reused task buffer and reached the medium with GOOD status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsolicited_burst_ended_early_fails_the_task() {
    use riser::datamover::{ControlPdu, SharedDatamover};
    use riser::iscsi::wire::{DataOut, Header, ScsiCommand};
    use riser::scsi::sense::{AscAscq, Sense, Status};
    async fn answer(dm: &SharedDatamover, itt: u32) -> (Status, Option<Sense>) {
        let (r, sense) = response(dm, itt).await;
        (r.status, sense)
    }
    let command = |itt: u32, lba: u32, blocks: u16, final_: bool, cmd_sn: u32, stat_sn: u32| {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x2a; // WRITE(10)
        cdb[2..6].copy_from_slice(&lba.to_be_bytes());
        cdb[7..9].copy_from_slice(&blocks.to_be_bytes());
        let edtl = u32::from(blocks) * 512;
        Header::ScsiCommand(ScsiCommand {
            final_,
            write: true,
            attr: 1,
            itt,
            expected_data_len: edtl,
            cmd_sn,
            exp_stat_sn: stat_sn,
            cdb,
            ..ScsiCommand::default()
        })
    };
    let send = async |dm: &SharedDatamover, h: Header, data: Vec<u8>| dm.send_control(ControlPdu::new(h, data.into())).await.unwrap();

    // InitialR2T=No, FirstBurstLength 64 KiB: 8 KiB immediate, then a Data-Out of 8 KiB with F=1.
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true).first_burst_length(65_536);
    let addr = start_with(|c| {
        c.operational = op.clone();
        c.iser_unsolicited_data = true;
    })
    .await;
    let (dm, o) = raw_login(addr, op, 0x31).await;
    assert!(!o.params.initial_r2t && o.params.first_burst_length == 65_536);
    let (mut cmd_sn, stat_sn) = (o.exp_cmd_sn, o.stat_sn);
    send(&dm, command(0xb00, 100, 256, false, cmd_sn, stat_sn), vec![1; 8192]).await;
    let d = DataOut { final_: true, itt: 0xb00, ttt: u32::MAX, data_sn: 0, buffer_offset: 8192, ..DataOut::default() };
    send(&dm, Header::DataOut(d), vec![2; 8192]).await;
    let (status, sense) = answer(&dm, 0xb00).await;
    assert_eq!((status, sense.map(|s| s.asc)), (Status::CHECK_CONDITION, Some(AscAscq::DATA_PHASE_ERROR)));
    // The connection lives: a whole unsolicited write (immediate data, F=1) succeeds.
    cmd_sn = cmd_sn.wrapping_add(1);
    send(&dm, command(0xb01, 100, 16, true, cmd_sn, stat_sn), vec![3; 8192]).await;
    assert_eq!(answer(&dm, 0xb01).await.0, Status::GOOD);

    // InitialR2T=Yes (the target's iSER default): F=0 announces Data-Out that may not come.
    let addr = start().await;
    let (dm, o) = raw_login(addr, OperationalConfig::default(), 0x32).await;
    assert!(o.params.initial_r2t);
    send(&dm, command(0xb10, 0, 64, false, o.exp_cmd_sn, o.stat_sn), vec![4; 8192]).await;
    let (status, sense) = answer(&dm, 0xb10).await;
    assert_eq!((status, sense.map(|s| s.asc)), (Status::CHECK_CONDITION, Some(AscAscq::DATA_PHASE_ERROR)));
    send(&dm, command(0xb11, 0, 16, true, o.exp_cmd_sn.wrapping_add(1), o.stat_sn), vec![5; 8192]).await;
    assert_eq!(answer(&dm, 0xb11).await.0, Status::GOOD);
}

/// Every command gets an answer over iSER, whatever its flags say against its CDB: a read that
/// advertised no read buffer (STag) gets CHECK CONDITION before the medium is read (it was left
/// unanswered: its read data had nowhere to go); data the CDB wants but the flags do not
/// announce is refused as over TCP; flags announcing data the CDB does not move end GOOD with the
/// whole length as residual. The connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_whose_flags_contradict_its_cdb_gets_an_answer() {
    use riser::datamover::{ControlPdu, DmEvent};
    use riser::iscsi::wire::{Header, NopOut, ScsiCommand, ScsiResponse};
    use riser::scsi::sense::{AscAscq, Sense, SenseKey, Status};
    let addr = start().await;
    let (dm, o) = raw_login(addr, OperationalConfig::default(), 0x41).await;
    let mut cmd_sn = o.exp_cmd_sn;
    let mut run = async |itt: u32, op: u8, read: bool, write: bool| -> (ScsiResponse, Option<Sense>) {
        let mut cdb = [0u8; 16];
        cdb[0] = op;
        cdb[8] = 1; // one block
        let c = ScsiCommand {
            final_: true,
            read,
            write,
            attr: 1,
            itt,
            expected_data_len: 512,
            cmd_sn,
            exp_stat_sn: o.stat_sn,
            cdb,
            ..ScsiCommand::default()
        };
        cmd_sn = cmd_sn.wrapping_add(1);
        // As a control PDU: no STag in the iSER header, whatever the flags say.
        dm.send_control(ControlPdu::new(Header::ScsiCommand(c), Bytes::new())).await.unwrap();
        response(&dm, itt).await
    };
    let (read10, write10) = (0x28, 0x2a);
    // R=1 without a read STag.
    let (r, sense) = run(1, read10, true, false).await;
    assert_eq!(
        (r.status, sense.map(|s| (s.key, s.asc))),
        (Status::CHECK_CONDITION, Some((SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR)))
    );
    assert!(r.underflow && r.residual == 512, "{r:?}");
    // A WRITE CDB without W (with R, or with neither).
    for (itt, read) in [(2, true), (3, false)] {
        let (r, sense) = run(itt, write10, read, false).await;
        assert_eq!(
            (r.status, sense.map(|s| (s.key, s.asc))),
            (Status::CHECK_CONDITION, Some((SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_CDB)))
        );
    }
    // A READ CDB with W, or with neither flag: nothing moves, the whole length is residual.
    for (itt, write) in [(4, true), (5, false)] {
        let (r, sense) = run(itt, read10, false, write).await;
        assert_eq!((r.status, sense.is_none(), r.underflow, r.residual), (Status::GOOD, true, true, 512), "{r:?}");
    }
    // The connection lives: it answers a ping.
    let ping = NopOut { immediate: true, itt: 9, ttt: u32::MAX, cmd_sn, exp_stat_sn: o.stat_sn, ..NopOut::default() };
    dm.send_control(ControlPdu::new(Header::NopOut(ping), Bytes::new())).await.unwrap();
    loop {
        match tokio::time::timeout(std::time::Duration::from_secs(10), dm.next_event()).await.expect("a NOP-In") {
            DmEvent::Control(p) if matches!(p.header, Header::NopIn(n) if n.itt == 9) => break,
            DmEvent::Terminated(t) => panic!("the connection ended: {t:?}"),
            _ => {}
        }
    }
}

/// Unsolicited Data-Out announced (F=0) and never sent ends the command with CHECK CONDITION
/// at `data_timeout`, and only the command: the connection goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsolicited_data_that_never_comes_ends_the_command_not_the_connection() {
    use riser::datamover::ControlPdu;
    use riser::iscsi::wire::{Header, ScsiCommand};
    use riser::scsi::sense::{AscAscq, Status};
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true).first_burst_length(65_536);
    let addr = start_with(|c| {
        c.operational = op.clone();
        c.iser_unsolicited_data = true;
        c.data_timeout = std::time::Duration::from_millis(500);
    })
    .await;
    let (dm, o) = raw_login(addr, op, 0x51).await;
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 128, 0]); // WRITE(10), 64 KiB
    let c = ScsiCommand {
        write: true,
        attr: 1,
        itt: 0xe00,
        expected_data_len: 65_536,
        cmd_sn: o.exp_cmd_sn,
        exp_stat_sn: o.stat_sn,
        cdb,
        ..ScsiCommand::default()
    };
    // 8 KiB immediate, F=0: 56 KiB of unsolicited Data-Out promised.
    dm.send_control(ControlPdu::new(Header::ScsiCommand(c), vec![6; 8192].into())).await.unwrap();
    let started = std::time::Instant::now();
    let (r, sense) = response(&dm, 0xe00).await;
    assert_eq!((r.status, sense.map(|s| s.asc)), (Status::CHECK_CONDITION, Some(AscAscq::DATA_PHASE_ERROR)));
    assert!(started.elapsed() >= std::time::Duration::from_millis(400), "answered at the data timeout, not before");
    // The connection lives: a whole write (all immediate, F=1) succeeds.
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&[0x2a, 0, 0, 0, 0, 0, 0, 0, 16, 0]);
    let c = ScsiCommand {
        final_: true,
        write: true,
        attr: 1,
        itt: 0xe01,
        expected_data_len: 8192,
        cmd_sn: o.exp_cmd_sn.wrapping_add(1),
        exp_stat_sn: o.stat_sn,
        cdb,
        ..ScsiCommand::default()
    };
    dm.send_control(ControlPdu::new(Header::ScsiCommand(c), vec![7; 8192].into())).await.unwrap();
    assert_eq!(response(&dm, 0xe01).await.0.status, Status::GOOD);
}
