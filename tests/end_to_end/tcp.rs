//! What only TCP has: header and data digests, the byte stream's framing (garbage, a command
//! before login, an oversized segment), R2Ts and Data-Out as PDUs, and peers that speak TCP
//! as other targets do.

use crate::support::raw::{read_pdu, write_pdu};
use crate::support::{ME, TARGET, Transport, pattern};
use riser::datamover::{Datamover, DmError, R2tPlan};
use riser::initiator::{Session, SessionConfig, discover};
use riser::iscsi::keys::{Digest, NegotiatedParams, Role};
use riser::iscsi::login::{InitiatorAuth, TargetLogin, TargetLoginConfig, TargetLoginEvent, TargetLoginParams, TargetNode};
use riser::iscsi::wire::{
    AsyncEvent, AsyncMessage, DataOut, Header, LoginRequest, LogoutResponse, NopIn, NopOut, Pdu, ScsiCommand, ScsiResponse, Stage,
    TextResponse,
};
use riser::scsi::lun::Lun;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crc32c_header_and_data_digests() {
    let addr = Transport::Tcp.start(|_| {}, |_| {}).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.login.operational.header_digest = vec![Digest::Crc32c];
    cfg.login.operational.data_digest = vec![Digest::Crc32c];
    let s = Session::connect(addr, cfg).await.unwrap();
    assert_eq!((s.params().header_digest, s.params().data_digest), (Digest::Crc32c, Digest::Crc32c));
    let data = pattern(11, 1 << 20);
    s.write(Lun::ZERO, 300, data.clone(), 512).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 300, 2048, 512).await.unwrap(), data);
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_the_rfc_reaction_and_spares_other_sessions() {
    let addr = Transport::Tcp.start(|_| {}, |_| {}).await;
    let good = Session::connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();

    // Garbage: the connection is dropped.
    let mut g = TcpStream::connect(addr).await.unwrap();
    g.write_all(&[0xde; 200]).await.unwrap();
    let mut buf = [0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(5), g.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert!(n == 0 || n >= 48, "garbage must end in a close or a login reject");

    // A command before login: Login Response 0x020B, then close.
    let mut c = TcpStream::connect(addr).await.unwrap();
    write_pdu(&mut c, Header::NopOut(NopOut { immediate: true, itt: 1, ttt: u32::MAX, ..NopOut::default() }), &[]).await;
    match read_pdu(&mut c).await {
        Some((Header::LoginResponse(r), _)) => assert_eq!((r.status_class, r.status_detail), (2, 0x0b)),
        other => panic!("{other:?}"),
    }

    // An oversized data segment in a Login Request: dropped without reading 16 MiB.
    let mut o = TcpStream::connect(addr).await.unwrap();
    let mut bhs = [0u8; 48];
    Header::LoginRequest(LoginRequest { csg: Stage::SECURITY, nsg: Stage::OPERATIONAL, ..LoginRequest::default() }).emit(
        &mut bhs,
        0,
        (1 << 24) - 1,
    );
    o.write_all(&bhs).await.unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), o.read(&mut buf)).await.unwrap().unwrap_or(0);
    assert_eq!(n, 0, "connection must be closed");

    // The well-behaved session never noticed.
    let data = pattern(5, 8192);
    good.write(Lun::ZERO, 5, data.clone(), 512).await.unwrap();
    assert_eq!(good.read(Lun::ZERO, 5, 16, 512).await.unwrap(), data);
}

/// One connection of a target that numbers its Login Responses as tgt's iSER login does
/// (usr/iscsi/iser_text.c: ExpCmdSN = the login's CmdSN + 1, MaxCmdSN = the login's CmdSN), then
/// opens its window with a NOP-In (ExpCmdSN = the login's CmdSN) and, as tgt, executes commands
/// strictly in CmdSN order from the login's CmdSN: a command with a later CmdSN waits for the
/// missing one forever. Every command ends GOOD; a Logout is answered.
async fn tgt_iser_like_connection(mut sock: TcpStream) {
    let cfg = TargetLoginConfig::default().target(TargetNode::open(TARGET));
    let mut login = TargetLogin::new(cfg, TargetLoginParams { new_tsih: 7, initial_stat_sn: 1, cmd_window: 32, entropy: [9; 32] });
    let (mut exp_cmd_sn, mut stat_sn) = loop {
        let Some((h, d)) = read_pdu(&mut sock).await else { return };
        let Header::LoginRequest(req) = h else { return };
        login.handle_pdu(Duration::ZERO, &h, &d);
        while let Some(mut p) = login.poll_transmit() {
            (p.header.exp_cmd_sn, p.header.max_cmd_sn) = (req.cmd_sn.wrapping_add(1), req.cmd_sn);
            write_pdu(&mut sock, Header::LoginResponse(p.header), &p.data).await;
        }
        match login.poll_event() {
            Some(TargetLoginEvent::Complete(o)) => break (req.cmd_sn, o.stat_sn),
            Some(_) => return,
            None => {}
        }
    };
    let nop = NopIn { itt: u32::MAX, ttt: u32::MAX, stat_sn, exp_cmd_sn, max_cmd_sn: exp_cmd_sn + 31, ..NopIn::default() };
    write_pdu(&mut sock, Header::NopIn(nop), &[]).await;
    while let Some((h, _)) = read_pdu(&mut sock).await {
        match h {
            Header::ScsiCommand(c) if c.cmd_sn == exp_cmd_sn => {
                exp_cmd_sn += 1;
                let r = ScsiResponse { itt: c.itt, stat_sn, exp_cmd_sn, max_cmd_sn: exp_cmd_sn + 31, ..ScsiResponse::default() };
                stat_sn += 1;
                write_pdu(&mut sock, Header::ScsiResponse(r), &[]).await;
            }
            Header::LogoutRequest(l) => {
                let r = LogoutResponse { itt: l.itt, stat_sn, exp_cmd_sn, max_cmd_sn: exp_cmd_sn + 31, ..LogoutResponse::default() };
                write_pdu(&mut sock, Header::LogoutResponse(r), &[]).await;
                return;
            }
            _ => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_reach_a_target_whose_login_responses_overstate_expcmdsn() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((sock, _)) = l.accept().await {
            tokio::spawn(tgt_iser_like_connection(sock));
        }
    });
    let cfg = SessionConfig::new(ME, TARGET).timeout(Duration::from_secs(3));
    let s = Session::connect(addr, cfg).await.unwrap();
    // The first command carries the login's CmdSN (RFC 7143 §11.12.8), then the sequence goes on.
    for _ in 0..3 {
        s.test_unit_ready(Lun::ZERO).await.unwrap();
    }
    s.logout().await.unwrap();
}

/// Answer an initiator's login on `sock` as an open target named `TARGET` would; the StatSN
/// the full feature phase starts with.
async fn log_in_as_target(sock: &mut TcpStream, params: TargetLoginParams) -> u32 {
    let cfg = TargetLoginConfig::default().target(TargetNode::open(TARGET));
    let mut login = TargetLogin::new(cfg, params);
    loop {
        let (h, d) = read_pdu(sock).await.unwrap();
        login.handle_pdu(Duration::ZERO, &h, &d);
        while let Some(p) = login.poll_transmit() {
            write_pdu(sock, Header::LoginResponse(p.header), &p.data).await;
        }
        if let Some(TargetLoginEvent::Complete(o)) = login.poll_event() {
            return o.stat_sn;
        }
    }
}

/// A discovery session ends with a Logout acknowledging every status it got (ExpStatSN = the
/// last StatSN + 1, RFC 7143 §11.14), and waits for the Logout Response before it closes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_logout_acknowledges_the_last_status() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut sock, _) = l.accept().await.unwrap();
        let stat_sn =
            log_in_as_target(&mut sock, TargetLoginParams { new_tsih: 3, initial_stat_sn: 100, cmd_window: 8, entropy: [1; 32] }).await;
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
        write_pdu(&mut sock, Header::TextResponse(r), text.as_bytes()).await;
        let (h, _) = read_pdu(&mut sock).await.unwrap();
        let Header::LogoutRequest(lo) = h else { panic!("expected a Logout, got {h:?}") };
        let r = LogoutResponse {
            itt: lo.itt,
            stat_sn: stat_sn + 1,
            exp_cmd_sn: lo.cmd_sn,
            max_cmd_sn: lo.cmd_sn + 8,
            ..LogoutResponse::default()
        };
        write_pdu(&mut sock, Header::LogoutResponse(r), &[]).await;
        let _ = tx.send((lo.exp_stat_sn, stat_sn));
    });
    let found = discover(addr, ME, InitiatorAuth::None).await.unwrap();
    assert_eq!(found[0].0, TARGET);
    let (acked, last) = rx.await.unwrap();
    assert_eq!(acked, last.wrapping_add(1), "the Logout's ExpStatSN");
}

/// The target's datamover is reading an unsolicited Data-Out's data (half of it has come) when
/// the core starts collecting the write: Get_Data waits for the buffer. The task is then dropped
/// (as an abort or the connection's end does): Get_Data must end with NoTask, not wait for a
/// wake-up nobody sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_waiting_for_a_data_out_ends_when_its_task_is_dropped() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut peer = TcpStream::connect(l.local_addr().unwrap()).await.unwrap();
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
    tokio::time::sleep(Duration::from_millis(200)).await;
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
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!collect.is_finished(), "Get_Data waits while the Data-Out's data is read");
    dm.deallocate_task_resources(7);
    let r = tokio::time::timeout(Duration::from_secs(3), collect).await.expect("Get_Data ended").unwrap();
    assert_eq!(r, Err(DmError::NoTask(7)));
}

/// An R2T's Data-Out sequence that ends (F bit) before the R2T's desired length fails its task
/// at once (CHECK CONDITION, DATA PHASE ERROR) and only it: the initiator says it sends no more
/// of it. The target used to wait for the rest until its data timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_r2t_sequence_ended_early_fails_its_task_at_once() {
    use crate::support::{sense, write10};
    use riser::iscsi::keys::OperationalConfig;
    use riser::scsi::sense::{AscAscq, Status};
    let op = OperationalConfig::default().initial_r2t(true).immediate_data(false);
    let t = Transport::Tcp;
    let addr = t
        .start(
            |_| {},
            |c| {
                c.login.operational = op.clone();
                c.data_timeout = Duration::from_secs(60);
            },
        )
        .await;
    let mut r = crate::support::Raw::login_tcp(addr, op, 3).await;
    let h = r.command(0x20, &write10(256, 64), 32_768, true, true, false);
    r.send(h, &[]).await;
    let Header::R2t(r2t) = r.next().await.0 else { panic!("an R2T") };
    assert_eq!((r2t.buffer_offset, r2t.desired_len), (0, 32_768));
    let d = DataOut { final_: true, lun: Lun::ZERO, itt: 0x20, ttt: r2t.ttt, data_sn: 0, buffer_offset: 0, ..DataOut::default() };
    r.send(Header::DataOut(d), &[1u8; 8192]).await;
    let started = std::time::Instant::now();
    let (resp, data) = r.response(0x20, |_| {}).await;
    assert_eq!((resp.status, sense(&data).asc), (Status::CHECK_CONDITION, AscAscq::DATA_PHASE_ERROR));
    assert!(started.elapsed() < Duration::from_secs(5), "answered after {:?}", started.elapsed());
    r.ping(0x21).await;
}

/// A target repeating its request to log out (Async Message, REQUEST_LOGOUT) while a command is
/// in flight: the riser initiator acts on it once per connection — it started a task for every
/// repeat, each waiting for the first to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_request_to_log_out_is_acted_on_once() {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let (asked_tx, asked_rx) = tokio::sync::oneshot::channel();
    let (sent_tx, sent_rx) = tokio::sync::oneshot::channel();
    tokio::spawn(async move {
        let (mut sock, _) = l.accept().await.unwrap();
        let stat_sn =
            log_in_as_target(&mut sock, TargetLoginParams { new_tsih: 7, initial_stat_sn: 1, cmd_window: 32, entropy: [9; 32] }).await;
        // The command is left unanswered: the logout waits for it.
        let (h, _) = read_pdu(&mut sock).await.unwrap();
        let Header::ScsiCommand(c) = h else { panic!("expected the command, got {h:?}") };
        let _ = asked_tx.send(());
        let a = AsyncMessage {
            itt: u32::MAX,
            stat_sn,
            exp_cmd_sn: c.cmd_sn + 1,
            max_cmd_sn: c.cmd_sn + 32,
            event: AsyncEvent::REQUEST_LOGOUT,
            param3: 60,
            ..AsyncMessage::default()
        };
        for _ in 0..500 {
            write_pdu(&mut sock, Header::AsyncMessage(a), &[]).await;
        }
        let _ = sent_tx.send(());
        // Hold the connection until the test ends.
        while read_pdu(&mut sock).await.is_some() {}
    });
    let s = Session::connect(addr, SessionConfig::new(ME, TARGET).timeout(Duration::from_secs(60))).await.unwrap();
    let pending = s.clone();
    let command = tokio::spawn(async move { pending.test_unit_ready(Lun::ZERO).await });
    asked_rx.await.unwrap();
    let metrics = tokio::runtime::Handle::current().metrics();
    let before = metrics.num_alive_tasks();
    sent_rx.await.unwrap();
    // Every repeat has been read once the last one's effect shows; give the receiver a moment.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = metrics.num_alive_tasks().saturating_sub(before);
    assert!(started <= 2, "{started} tasks started for 500 requests to log out");
    command.abort();
}
