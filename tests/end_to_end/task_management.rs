//! Task management on every transport: the RFC's answers, commands ended by an abort or a
//! reset, and an abort answered only once the aborted I/O is over.

use crate::support::{Gated, ME, TARGET, Transport, WAIT, pattern, read10, until, write10};
use riser::initiator::{Error, Session, SessionConfig};
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::wire::{Header, TaskMgmtRequest, TmfFunction, TmfResponse};
use riser::scsi::lun::Lun;
use riser::target::backend::RamBackend;
use riser::target::lu::{LogicalUnit, LuIdentity};
use riser::target::server::{Node, Target};
use std::sync::Arc;
use std::time::Duration;

on_every_transport!(
    task_management_and_unit_attention,
    commands_aborted_by_a_lun_reset_end_at_once,
    abort_task_of_a_finished_command_says_it_does_not_exist,
    abort_task_set_ends_the_commands_before_it_not_those_after,
    task_management_waits_for_the_aborted_writes_backend_io,
    task_management_does_not_wait_for_a_sanitize,
    a_command_whose_time_is_up_is_aborted_before_its_caller_hears,
    an_abort_unanswered_in_time_drops_the_connection,
    a_reset_through_another_session_ends_the_units_commands_silently,
    a_reset_waits_for_the_writes_of_a_session_whose_connection_ended,
    an_abort_of_a_write_another_sessions_reset_ended_waits_for_its_io,
    a_reset_on_another_gateway_ends_the_units_commands_before_it_is_acknowledged,
    a_reset_on_another_gateway_is_not_held_up_by_a_sessions_own_reset,
    a_reset_on_another_gateway_waits_for_a_write_an_abort_task_ended,
    a_reset_ends_the_units_commands_under_the_nexus_s_other_luns,
    a_reset_of_a_copys_destination_stops_the_copy_and_waits_for_its_write,
    a_reset_of_a_copys_destination_on_another_gateway_waits_for_its_write,
    a_reset_of_a_copys_destination_through_its_own_session_stops_it,
    a_reset_of_the_copy_manager_stops_the_copy_at_its_next_write,
    a_reset_ends_a_write_whose_lun_was_mapped_away_since_it_started,
    a_copy_whose_time_is_up_stops_at_its_next_write,
);

async fn task_management_and_unit_attention(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let s = t.session(addr).await;
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

/// Large writes in flight while the LU is reset: aborted commands get no response from the
/// target, and end with the reset, not a timeout.
async fn commands_aborted_by_a_lun_reset_end_at_once(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let cfg = SessionConfig::new(ME, TARGET).timeout(Duration::from_secs(20));
    let s = t.connect(addr, cfg).await.unwrap();
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
    tokio::time::sleep(Duration::from_millis(5)).await;
    let t0 = std::time::Instant::now();
    s.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await.unwrap();
    for t in tasks {
        t.await.unwrap();
    }
    assert!(t0.elapsed() < Duration::from_secs(10));
    s.test_unit_ready(Lun::ZERO).await.unwrap();
}

/// ABORT TASK of a command that has ended: the session names the command's own CmdSN as
/// RefCmdSN, which the target has received, so the task does not exist (riser's initiator once
/// sent its next CmdSN, and the target took the abort for one of a command not arrived yet).
async fn abort_task_of_a_finished_command_says_it_does_not_exist(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let s = t.session(addr).await;
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
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(answers.len() < 20, "the abort of an ended command completes: {answers:?}");
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    s.logout().await.unwrap();
}

/// ABORT TASK SET ends the command the target is executing (its caller gets `Aborted` once the
/// function completes), and not a command sent after the function while it was pending.
async fn abort_task_set_ends_the_commands_before_it_not_those_after(t: Transport) {
    let disk = Gated::new();
    let addr = t.start_on(disk.clone(), |_| {}, |_| {}).await;
    let cfg = SessionConfig::new(ME, TARGET).timeout(Duration::from_secs(10));
    let s = t.connect(addr, cfg).await.unwrap();
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    disk.hold(true);
    let held = tokio::spawn({
        let s = s.clone();
        async move { s.write(Lun::ZERO, 0, pattern(1, 512), 512).await }
    });
    until("the write never reached the disk", || disk.waiting() > 0).await;
    let tmf = tokio::spawn({
        let s = s.clone();
        async move { s.task_management(Lun::ZERO, TmfFunction::ABORT_TASK_SET, 0).await }
    });
    // The function waits at the target for the held write; a read goes out meanwhile.
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!tmf.is_finished(), "answered while the aborted write still runs");
    let after = tokio::spawn({
        let s = s.clone();
        async move { s.read(Lun::ZERO, 64, 1, 512).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    disk.hold(false);
    tmf.await.unwrap().unwrap();
    assert!(matches!(held.await.unwrap(), Err(Error::Aborted)));
    assert_eq!(after.await.unwrap().unwrap(), vec![0u8; 512], "the read sent after the function is not its victim");
    s.logout().await.unwrap();
}

/// ABORT TASK and LUN RESET are answered only once the aborted write's backend I/O is over (a
/// write on the blocking pool cannot be stopped; answering earlier let a stale write land on
/// blocks the initiator had rewritten since).
async fn task_management_waits_for_the_aborted_writes_backend_io(t: Transport) {
    let gated = Gated::new();
    let addr = t.start_on(gated.clone(), |_| {}, |_| {}).await;
    tmf_waits_for_the_aborted_write(t, addr, &gated, 10).await;
}

/// Against the target at `addr`, whose LUN 0 writes through `gated`: ABORT TASK, then LUN RESET,
/// each of a write held at the gate, is answered only once that write is over (session ISID
/// `80 00 00 00 00 isid`).
pub(crate) async fn tmf_waits_for_the_aborted_write(t: Transport, addr: std::net::SocketAddr, gated: &Gated, isid: u8) {
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = t.raw(addr, op, isid).await;
    for (i, function) in [TmfFunction::ABORT_TASK, TmfFunction::LOGICAL_UNIT_RESET].into_iter().enumerate() {
        gated.hold(true);
        let itt = 0x700 + i as u32;
        let h = r.command(itt, &write10(0, 1), 512, true, true, false);
        let ref_cmd_sn = r.cmd_sn.wrapping_sub(1);
        r.send(h, &[3; 512]).await;
        until("the write reached the disk", || gated.waiting() > 0).await;
        let done_before = gated.done();
        let tmf = TaskMgmtRequest {
            immediate: true,
            function,
            lun: Lun::ZERO,
            itt: 0x7f0 + i as u32,
            ref_task_tag: itt,
            cmd_sn: r.cmd_sn,
            exp_stat_sn: r.o.stat_sn,
            ref_cmd_sn,
            ..TaskMgmtRequest::default()
        };
        r.send(Header::TaskMgmtRequest(tmf), &[]).await;
        assert!(r.next_within(Duration::from_millis(400)).await.is_none(), "{function:?} answered while the write still runs");
        gated.hold(false);
        match r.next().await {
            (Header::TaskMgmtResponse(t), _) => assert_eq!(t.response, TmfResponse::COMPLETE),
            other => panic!("{other:?}"),
        }
        assert_eq!(gated.done(), done_before + 1, "the write ended before the answer");
        // (A LUN RESET leaves a UNIT ATTENTION: collect it before the next round.)
        let h = r.command(0x7e0 + i as u32, &[0; 6], 0, false, true, false);
        r.send(h, &[]).await;
        let _ = r.response(0x7e0 + i as u32, |_| {}).await;
    }
}

/// A SANITIZE goes on across task management (SBC-4; libiscsi's Sanitize.Reset checks it): task
/// management answers at once and does not wait for it, as it waits for a write. The LU fences
/// the medium meanwhile.
async fn task_management_does_not_wait_for_a_sanitize(t: Transport) {
    let gated = Gated::new();
    let addr = t.start_on(gated.clone(), |_| {}, |_| {}).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = t.raw(addr, op, 0x41).await;
    gated.hold(true);
    // SANITIZE OVERWRITE without IMMED: one pass of one 512-byte pattern.
    let cdb = [0x48, 0x01, 0, 0, 0, 0, 0, 0x02, 0x04, 0];
    let mut params = vec![0x01, 0, 0x02, 0x00];
    params.extend_from_slice(&[0x5a; 512]);
    let h = r.command(0xc00, &cdb, params.len() as u32, true, true, false);
    r.send(h, &params).await;
    let t0 = std::time::Instant::now();
    while gated.waiting() == 0 && t0.elapsed() < WAIT {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(gated.waiting() > 0, "the sanitize is writing");
    let tmf = TaskMgmtRequest {
        immediate: true,
        function: TmfFunction::ABORT_TASK_SET,
        lun: Lun::ZERO,
        itt: 0xc01,
        cmd_sn: r.cmd_sn,
        exp_stat_sn: r.o.stat_sn,
        ..TaskMgmtRequest::default()
    };
    r.send(Header::TaskMgmtRequest(tmf), &[]).await;
    let answer = r.next_within(Duration::from_secs(3)).await;
    // Let the sanitize go before judging (a held blocking thread would hold the test's runtime).
    gated.hold(false);
    match answer {
        Some((Header::TaskMgmtResponse(t), _)) => assert_eq!(t.response, TmfResponse::COMPLETE),
        other => panic!("ABORT TASK SET waited for the sanitize: {other:?}"),
    }
}

/// A target over a [`Gated`] store (and its address), a session with `timeout` that wrote
/// `pattern(seed, 4096)` at LBA 0, and the store's reads held from then on.
async fn reads_held_after(t: Transport, timeout: Duration, seed: u8) -> (Arc<Gated>, Arc<Target>, Session, std::net::SocketAddr) {
    let disk = Gated::new();
    let lu = Arc::new(LogicalUnit::new(disk.clone(), LuIdentity::random()));
    let (addr, target) = t.serve(t.config().node(Node::new(TARGET).lun(lu))).await;
    let s = t.connect(addr, SessionConfig::new(ME, TARGET).timeout(timeout)).await.unwrap();
    s.write(Lun::ZERO, 0, pattern(seed, 4096), 512).await.unwrap();
    disk.hold_reads(true);
    (disk, target, s, addr)
}

/// A command unanswered within the session's timeout is aborted, and its caller told
/// `Timeout` only once the target has ended it: until then the command keeps its task and its
/// memory, so its answer cannot land anywhere else. Here a read is held at the store beyond the
/// timeout; the ABORT TASK waits at the target for it. (Before, the caller was told at the
/// timeout and the read's buffer let go — its iSER registration revoked — while the target
/// still ran the read: its data then came for a task the initiator no longer had, and the
/// connection ended.)
async fn a_command_whose_time_is_up_is_aborted_before_its_caller_hears(t: Transport) {
    let (disk, target, s, _) = reads_held_after(t, Duration::from_secs(2), 7).await;
    let read = tokio::spawn({
        let s = s.clone();
        async move { s.read(Lun::ZERO, 0, 8, 512).await }
    });
    until("the read never reached the store", || disk.reads_waiting() > 0).await;
    // Given up between 2 and 2.5 s; the abort then waits for the read at the target (its own
    // time would be up between 4 and 5 s).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let early = read.is_finished();
    // Let go before any assertion: a read left held would keep the runtime from shutting down.
    disk.hold_reads(false);
    assert!(!early, "the caller heard before the target ended the command: {:?}", read.await);
    match read.await.unwrap() {
        Err(Error::Timeout) => {}
        other => panic!("the read whose time was up: {other:?}"),
    }
    // The connection went on: the command is answered on it, with what was written.
    assert_eq!(s.read(Lun::ZERO, 0, 8, 512).await.unwrap(), pattern(7, 4096));
    assert_eq!(target.stats().logins, 1, "the connection was dropped");
    s.logout().await.unwrap();
}

/// The abort of a command whose time is up goes unanswered in time too (the read stays held at
/// the store): the connection is dropped, failing the command with `ConnectionLost` — never
/// `Timeout` while the target may still run it — and the next command logs in again (a session
/// reinstatement, which ends the old connection's tasks at the target).
async fn an_abort_unanswered_in_time_drops_the_connection(t: Transport) {
    let (disk, target, s, _) = reads_held_after(t, Duration::from_secs(1), 9).await;
    let t0 = std::time::Instant::now();
    let r = tokio::time::timeout(WAIT, s.command_once(Lun::ZERO, &read10(0, 8), None, 4096)).await;
    let took = t0.elapsed();
    disk.hold_reads(false);
    assert!(matches!(r, Ok(Err(Error::ConnectionLost))), "{r:?}");
    // Given up between 1 and 1.25 s, its abort between 2 and 2.5 s.
    assert!(took >= Duration::from_millis(1900), "the abort had its own time: {took:?}");
    assert_eq!(s.read(Lun::ZERO, 0, 8, 512).await.unwrap(), pattern(9, 4096));
    assert_eq!(target.stats().logins, 2);
    s.logout().await.unwrap();
}

/// A LOGICAL UNIT RESET through one session ends the unit's commands of every session (SAM-5
/// §6.3.3), those of the others without a response (TAS is 0), and is answered once their
/// backend I/O is over. The other session's command, unanswered, is aborted at its timeout;
/// its ABORT TASK finds no task (*Task does not exist*), so its answer will never come: it is
/// given up then — its caller told `Timeout` after one timeout, not the connection dropped
/// after two — and the next command finds the reset's unit attention (retried past) and goes
/// on, on the same connection. (Before, the reset ended only its own session's commands: the
/// other session's read ran on and was answered.)
async fn a_reset_through_another_session_ends_the_units_commands_silently(t: Transport) {
    let (disk, target, s, addr) = reads_held_after(t, Duration::from_secs(2), 5).await;
    let other = t.connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    let t0 = std::time::Instant::now();
    let read = tokio::spawn({
        let s = s.clone();
        async move { s.command_once(Lun::ZERO, &read10(0, 8), None, 4096).await }
    });
    until("the read never reached the store", || disk.reads_waiting() > 0).await;
    let reset = reset_through(other);
    // The reset has reached the read's session once that holds no task any more.
    let ended = no_task_left(&target).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let early = reset.is_finished();
    // Let go before any assertion: a read left held would keep the runtime from shutting down.
    disk.hold_reads(false);
    assert!(ended, "the reset did not end the other session's read");
    assert!(!early, "the reset was answered while the other session's read still ran");
    let other = reset.await.unwrap().unwrap();
    let r = tokio::time::timeout(WAIT, read).await.unwrap().unwrap();
    let took = t0.elapsed();
    ended_unanswered(r, "read");
    // Given up between 2 and 2.5 s, as soon as its abort was answered (a dropped connection
    // would have taken another timeout).
    assert!(took >= Duration::from_millis(1900) && took < Duration::from_millis(3900), "{took:?}");
    assert_eq!(s.read(Lun::ZERO, 0, 8, 512).await.unwrap(), pattern(5, 4096));
    assert_eq!(target.stats().logins, 2, "a connection was dropped");
    other.logout().await.unwrap();
    s.logout().await.unwrap();
}

/// A session whose connection ended has stopped its commands, but a write of it may still run
/// in the store: a LOGICAL UNIT RESET through another session is answered only once that write
/// is over (the ended session hands the reset the gates of what it stopped).
async fn a_reset_waits_for_the_writes_of_a_session_whose_connection_ended(t: Transport) {
    let (disk, gone, other, write, _) = write_held_beside_another_session(t, Duration::from_secs(20), 3).await;
    gone.drop_connection();
    let lost = tokio::time::timeout(WAIT, write).await.unwrap().unwrap();
    // The target sees the connection end at once on loopback.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let reset = reset_through(other);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let early = reset.is_finished();
    // Let go before any assertion: a write left held would keep the runtime from shutting down.
    disk.hold(false);
    assert!(matches!(lost, Err(Error::ConnectionLost)), "{lost:?}");
    assert!(!early, "the reset was answered while the ended session's write still ran");
    let other = reset.await.unwrap().unwrap();
    other.logout().await.unwrap();
}

/// A write another session's reset ended (no task left in its session) may still be running in
/// the store: when its own initiator, hearing nothing, aborts it, the answer (*Task does not
/// exist*) waits until the write is over — a `Timeout` means the command can no longer land.
/// (Before, it came at once, while the write could still land after the caller had been told,
/// and after a multipath initiator had sent it again elsewhere.)
async fn an_abort_of_a_write_another_sessions_reset_ended_waits_for_its_io(t: Transport) {
    let (disk, s, other, write, t0) = write_held_beside_another_session(t, Duration::from_secs(3), 4).await;
    let reset = reset_through(other);
    // The write is given up between 3 and 3.75 s and aborted; its abort's own time would be up
    // 3 s later.
    tokio::time::sleep(Duration::from_secs(5).saturating_sub(t0.elapsed())).await;
    let (heard, reset_early) = (write.is_finished(), reset.is_finished());
    // Let go before any assertion: a write left held would keep the runtime from shutting down.
    disk.hold(false);
    assert!(!heard, "the write's caller heard while it still ran: {:?}", write.await);
    assert!(!reset_early, "the reset was answered while the write still ran");
    let r = tokio::time::timeout(WAIT, write).await.unwrap().unwrap();
    assert!(matches!(r, Err(Error::Timeout)), "{r:?}");
    let other = reset.await.unwrap().unwrap();
    other.logout().await.unwrap();
    s.logout().await.unwrap();
}

/// Another gateway of the unit's store reset it ([`LogicalUnit::remote_reset`], what the RBD
/// gateway calls when the cluster tells it): the unit's tasks here end without a response
/// (SAM-5 §6.3.3: every task set of the unit), and what the call returns — when the other
/// gateway is acknowledged, and answers its reset — resolves only once their writes are over.
/// (Before, only a unit attention was queued: the write ran on and was answered GOOD, after
/// the other gateway could have answered its reset.)
async fn a_reset_on_another_gateway_ends_the_units_commands_before_it_is_acknowledged(t: Transport) {
    let disk = Gated::new();
    let lu = Arc::new(LogicalUnit::new(disk.clone(), LuIdentity::random()));
    let (addr, target) = t.serve(t.config().node(Node::new(TARGET).lun(lu.clone()))).await;
    let s = t.connect(addr, SessionConfig::new(ME, TARGET).timeout(Duration::from_secs(3))).await.unwrap();
    disk.hold(true);
    let t0 = std::time::Instant::now();
    let write = tokio::spawn({
        let s = s.clone();
        async move { s.command_once(Lun::ZERO, &write10(0, 8), Some(pattern(6, 4096)), 0).await }
    });
    until("the write never reached the store", || disk.waiting() > 0).await;
    let acknowledged = tokio::spawn(lu.remote_reset());
    let ended = no_task_left(&target).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = acknowledged.is_finished();
    // Let go before any assertion: a write left held would keep the runtime from shutting down.
    disk.hold(false);
    assert!(ended, "the other gateway's reset did not end the write's task here");
    assert!(!early, "acknowledged while the write still ran");
    tokio::time::timeout(WAIT, acknowledged).await.expect("not acknowledged once the write was over").unwrap();
    // No answer: its caller gives up at its timeout, once its abort finds no task.
    let r = tokio::time::timeout(WAIT, write).await.unwrap().unwrap();
    ended_unanswered(r, "write");
    assert!(t0.elapsed() >= Duration::from_millis(2900), "{:?}", t0.elapsed());
    // The reset's unit attention comes next (retried past by the initiator), and the session
    // goes on.
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    assert_eq!(target.stats().logins, 1, "the connection was dropped");
    s.logout().await.unwrap();
}

/// A session busy answering a reset of its own (waiting for a held write on LUN 0) still ends
/// its tasks on another unit that another gateway reset meanwhile, so that gateway is
/// acknowledged once those tasks' writes are over — not after the session's own reset. (Before,
/// the session saw to the ask only after its own reset: the acknowledgement waited for an
/// unrelated write, up to the gateway's bound, and then came while the unit's write could still
/// land.)
async fn a_reset_on_another_gateway_is_not_held_up_by_a_sessions_own_reset(t: Transport) {
    let (disk0, disk1) = (Gated::new(), Gated::new());
    let lu0 = Arc::new(LogicalUnit::new(disk0.clone(), LuIdentity::random()));
    let lu1 = Arc::new(LogicalUnit::new(disk1.clone(), LuIdentity::random()));
    let (addr, _target) = t.serve(t.config().node(Node::new(TARGET).lun(lu0).lun(lu1.clone()))).await;
    let s = t.connect(addr, SessionConfig::new(ME, TARGET).timeout(Duration::from_secs(20))).await.unwrap();
    disk0.hold(true);
    disk1.hold(true);
    let write = |lun: Lun, seed: u8| {
        let s = s.clone();
        tokio::spawn(async move { s.command_once(lun, &write10(0, 8), Some(pattern(seed, 4096)), 0).await })
    };
    let (w0, w1) = (write(Lun::ZERO, 1), write(Lun::from_number(1).unwrap(), 2));
    until("the writes never reached the stores", || disk0.waiting() > 0 && disk1.waiting() > 0).await;
    // The session's own reset of LUN 0 waits for its write there.
    let own = tokio::spawn({
        let s = s.clone();
        async move { s.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let acknowledged = tokio::spawn(lu1.remote_reset());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = acknowledged.is_finished();
    disk1.hold(false);
    // Before, it never came while LUN 0's write was held.
    let in_time = tokio::time::timeout(
        WAIT,
        &mut Box::pin(async {
            while !acknowledged.is_finished() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }),
    )
    .await;
    let own_early = own.is_finished();
    // Let go before any assertion: a write left held would keep the runtime from shutting down.
    disk0.hold(false);
    assert!(!early, "acknowledged while LUN 1's write still ran");
    assert!(in_time.is_ok(), "the acknowledgement waited for the session's own reset of another unit");
    assert!(!own_early, "the session's reset was answered while its write still ran");
    tokio::time::timeout(WAIT, own).await.unwrap().unwrap().unwrap();
    // Both writes were ended by a reset (their callers are not waited for: LUN 1's would sit
    // out its timeout).
    for w in [w0, w1] {
        w.abort();
    }
    s.logout().await.unwrap();
}

/// A write an ABORT TASK ended (gone from the session's machine, its abort answered once it is
/// over) still holds up a reset of its unit by another gateway meanwhile: the acknowledgement
/// waits for it. (Before, the session saw to the other gateway's ask while its abort waited,
/// and answered it with nothing to wait for.)
async fn a_reset_on_another_gateway_waits_for_a_write_an_abort_task_ended(t: Transport) {
    let disk = Gated::new();
    let lu = Arc::new(LogicalUnit::new(disk.clone(), LuIdentity::random()));
    let (addr, _target) = t.serve(t.config().node(Node::new(TARGET).lun(lu.clone()))).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = t.raw(addr, op, 12).await;
    disk.hold(true);
    let itt = 0x900;
    let h = r.command(itt, &write10(0, 1), 512, true, true, false);
    let ref_cmd_sn = r.cmd_sn.wrapping_sub(1);
    r.send(h, &[4; 512]).await;
    until("the write reached the disk", || disk.waiting() > 0).await;
    let tmf = TaskMgmtRequest {
        immediate: true,
        function: TmfFunction::ABORT_TASK,
        lun: Lun::ZERO,
        itt: 0x9f0,
        ref_task_tag: itt,
        cmd_sn: r.cmd_sn,
        exp_stat_sn: r.o.stat_sn,
        ref_cmd_sn,
        ..TaskMgmtRequest::default()
    };
    r.send(Header::TaskMgmtRequest(tmf), &[]).await;
    let unanswered = r.next_within(Duration::from_millis(300)).await.is_none();
    let acknowledged = tokio::spawn(lu.remote_reset());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let early = acknowledged.is_finished();
    // Let go before any assertion: a write left held would keep the runtime from shutting down.
    disk.hold(false);
    assert!(unanswered, "the abort was answered while the write still ran");
    assert!(!early, "the other gateway was acknowledged while the aborted write still ran");
    tokio::time::timeout(WAIT, acknowledged).await.unwrap().unwrap();
    match r.next().await {
        (Header::TaskMgmtResponse(t), _) => assert_eq!(t.response, TmfResponse::COMPLETE),
        other => panic!("{other:?}"),
    }
}

/// One unit under two LUNs of a nexus: a LOGICAL UNIT RESET through LUN 0 ends the unit's
/// write sent through LUN 1 too (SAM-5 §6.3.3 names the unit), without a response, and is
/// answered once that write is over. (Before, it ended LUN 0's tasks only: the write ran on and
/// was answered GOOD after the reset.)
async fn a_reset_ends_the_units_commands_under_the_nexus_s_other_luns(t: Transport) {
    let disk = Gated::new();
    let lu = Arc::new(LogicalUnit::new(disk.clone(), LuIdentity::random()));
    let (addr, target) = t.serve(t.config().node(Node::new(TARGET).lun(lu.clone()).lun(lu))).await;
    let s = t.connect(addr, SessionConfig::new(ME, TARGET).timeout(Duration::from_secs(3))).await.unwrap();
    disk.hold(true);
    let write = tokio::spawn({
        let s = s.clone();
        async move { s.command_once(Lun::from_number(1).unwrap(), &write10(0, 8), Some(pattern(8, 4096)), 0).await }
    });
    until("the write never reached the store", || disk.waiting() > 0).await;
    let reset = tokio::spawn({
        let s = s.clone();
        async move { s.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await }
    });
    let ended = no_task_left(&target).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = reset.is_finished();
    // Let go before any assertion: a write left held would keep the runtime from shutting down.
    disk.hold(false);
    assert!(ended, "the reset through LUN 0 did not end the unit's write under LUN 1");
    assert!(!early, "the reset was answered while the unit's write still ran");
    tokio::time::timeout(WAIT, reset).await.unwrap().unwrap().unwrap();
    ended_unanswered(tokio::time::timeout(WAIT, write).await.unwrap().unwrap(), "write");
    s.logout().await.unwrap();
}

/// A command a reset ended without a response: its caller gave it up (`Timeout`), never an
/// answer.
fn ended_unanswered(r: Result<riser::initiator::CommandResult, Error>, what: &str) {
    match r {
        Err(Error::Timeout) => {}
        Ok(r) => panic!("the {what} was answered: {:?}", r.status),
        Err(e) => panic!("the {what}: {e}"),
    }
}

/// Whether, within `WAIT`, no session of `target` holds a task any more.
async fn no_task_left(target: &Target) -> bool {
    tokio::time::timeout(WAIT, async {
        while target.sessions().iter().map(|s| s.commands).sum::<usize>() > 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .is_ok()
}

/// A target over a [`Gated`] store, a session with `timeout` and another one, and a write of
/// `pattern(seed, 4096)` through the first, held in the store (the store's writes held from
/// then on); when the write was sent.
async fn write_held_beside_another_session(
    t: Transport,
    timeout: Duration,
    seed: u8,
) -> (Arc<Gated>, Session, Session, tokio::task::JoinHandle<Result<riser::initiator::CommandResult, Error>>, std::time::Instant) {
    let disk = Gated::new();
    let lu = Arc::new(LogicalUnit::new(disk.clone(), LuIdentity::random()));
    let (addr, _target) = t.serve(t.config().node(Node::new(TARGET).lun(lu))).await;
    let s = t.connect(addr, SessionConfig::new(ME, TARGET).timeout(timeout)).await.unwrap();
    let other = t.connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    disk.hold(true);
    let sent = std::time::Instant::now();
    let write = tokio::spawn({
        let s = s.clone();
        async move { s.command_once(Lun::ZERO, &write10(0, 8), Some(pattern(seed, 4096)), 0).await }
    });
    until("the write never reached the store", || disk.waiting() > 0).await;
    (disk, s, other, write, sent)
}

/// A LOGICAL UNIT RESET of LUN 0 through `other`, in a task of its own (which gives the session
/// back once answered).
fn reset_through(other: Session) -> tokio::task::JoinHandle<Result<Session, Error>> {
    tokio::spawn(async move { other.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await.map(|()| other) })
}

/// A target with a 4 MiB RAM disk under LUN 0 (filled) and a [`Gated`] store under LUN 1, a
/// session, and an EXTENDED COPY copying 2 MiB from LUN 0 to LUN 1 — two writes of
/// [`COPY_CHUNK`](riser::target::lu::COPY_CHUNK) — its first write held in LUN 1's store.
/// The copy is sent to LUN 0 (the copy manager is its source), or with `manager_apart` to a
/// RAM disk under LUN 2 that takes no other part. The session's commands time out after
/// `timeout`.
async fn copy_held_at_its_destination(
    t: Transport,
    timeout: Duration,
    manager_apart: bool,
) -> (Arc<Gated>, Arc<LogicalUnit>, std::net::SocketAddr, Session, tokio::task::JoinHandle<Result<riser::initiator::CommandResult, Error>>)
{
    use riser::scsi::copy::{Cscd, ExtendedCopy, Segment};
    use riser::scsi::inquiry::Designator;
    let disk = Gated::new();
    let source = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(4 << 20, 512)), LuIdentity::random()));
    source.backend().write(0, &vec![0x5a; 2 << 20]).unwrap();
    let dest = Arc::new(LogicalUnit::new(disk.clone(), LuIdentity::random()));
    let mut node = Node::new(TARGET).lun(source.clone()).lun(dest.clone());
    if manager_apart {
        node = node.lun(Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random())));
    }
    let (addr, _target) = t.serve(t.config().node(node)).await;
    let s = t.connect(addr, SessionConfig::new(ME, TARGET).timeout(timeout)).await.unwrap();
    let cscd = |lu: &LogicalUnit| Cscd::block(Designator::naa_locally_assigned(lu.identity().naa()), 512);
    let list = ExtendedCopy {
        list_id: 1,
        cscds: vec![cscd(&source), cscd(&dest)],
        segments: vec![Segment::blocks(0, 1, 4096, 0, 0)],
        ..ExtendedCopy::default()
    }
    .to_bytes();
    let mut cdb = [0u8; 16];
    cdb[0] = 0x83;
    cdb[10..14].copy_from_slice(&(list.len() as u32).to_be_bytes());
    disk.hold(true);
    let copy = tokio::spawn({
        let s = s.clone();
        let manager = Lun::from_number(if manager_apart { 2 } else { 0 }).unwrap();
        async move { s.command_once(manager, &cdb, Some(list.into()), 0).await }
    });
    until("the copy's write never reached the store", || disk.waiting() > 0).await;
    (disk, dest, addr, s, copy)
}

/// A LOGICAL UNIT RESET of `lun` through `through` while the copy's write is held in `disk`:
/// not answered before the write is let go (300 ms on), answered once it is.
async fn reset_while_held(through: &Session, lun: u16, disk: &Gated) {
    let reset = tokio::spawn({
        let s = through.clone();
        async move { s.task_management(Lun::from_number(lun).unwrap(), TmfFunction::LOGICAL_UNIT_RESET, 0).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = reset.is_finished();
    disk.hold(false);
    assert!(!early, "the reset was answered while the copy's write still ran");
    tokio::time::timeout(WAIT, reset).await.unwrap().unwrap().unwrap();
}

/// The copy a reset of its destination stopped: COPY ABORTED, its second write never made.
async fn copy_stopped(disk: &Gated, copy: tokio::task::JoinHandle<Result<riser::initiator::CommandResult, Error>>) {
    let r = tokio::time::timeout(WAIT, copy).await.unwrap().unwrap().unwrap();
    assert_eq!(r.status, riser::scsi::sense::Status::CHECK_CONDITION, "the copy went on after its destination's reset");
    let sense = riser::scsi::sense::Sense::parse(r.sense.as_ref().unwrap()).unwrap();
    assert_eq!(sense.key, riser::scsi::sense::SenseKey::COPY_ABORTED);
    assert_eq!(disk.done(), 1, "a write of the copy landed after the reset");
}

/// A LOGICAL UNIT RESET of a copy's destination (the copy sent to another unit, whose task the
/// reset does not end) is answered only once the copy's write under way is over, and the copy
/// writes nothing more: it ends with COPY ABORTED. (Before, the reset was answered at once and
/// the copy went on writing to the unit afterwards.)
async fn a_reset_of_a_copys_destination_stops_the_copy_and_waits_for_its_write(t: Transport) {
    let (disk, _dest, addr, s, copy) = copy_held_at_its_destination(t, Duration::from_secs(20), false).await;
    let other = t.connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    reset_while_held(&other, 1, &disk).await;
    copy_stopped(&disk, copy).await;
    s.logout().await.unwrap();
    other.logout().await.unwrap();
}

/// The same when another gateway of the destination's store reset it: acknowledged once the
/// copy's write is over, and the copy stops.
async fn a_reset_of_a_copys_destination_on_another_gateway_waits_for_its_write(t: Transport) {
    let (disk, dest, _addr, s, copy) = copy_held_at_its_destination(t, Duration::from_secs(20), false).await;
    let acknowledged = tokio::spawn(dest.remote_reset());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = acknowledged.is_finished();
    disk.hold(false);
    assert!(!early, "acknowledged while the copy's write to the unit still ran");
    tokio::time::timeout(WAIT, acknowledged).await.unwrap().unwrap();
    copy_stopped(&disk, copy).await;
    s.logout().await.unwrap();
}

/// The same through the copy's own session (its task, under LUN 0, goes on: it ends with COPY
/// ABORTED).
async fn a_reset_of_a_copys_destination_through_its_own_session_stops_it(t: Transport) {
    let (disk, _dest, _addr, s, copy) = copy_held_at_its_destination(t, Duration::from_secs(20), false).await;
    reset_while_held(&s, 1, &disk).await;
    copy_stopped(&disk, copy).await;
    s.logout().await.unwrap();
}

/// A reset of the copy manager (the unit the EXTENDED COPY was sent to, here neither its source
/// nor its destination) ends the copy's task without a response, and the copy writes nothing
/// after its write under way: the reset is answered then. (Before, the copy ran on to its end on
/// the blocking pool, the reset waiting for all of it — up to 2 GiB.)
async fn a_reset_of_the_copy_manager_stops_the_copy_at_its_next_write(t: Transport) {
    let (disk, _dest, addr, s, copy) = copy_held_at_its_destination(t, Duration::from_secs(3), true).await;
    let other = t.connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap();
    reset_while_held(&other, 2, &disk).await;
    assert_eq!(disk.done(), 1, "the copy wrote on after its manager's reset");
    ended_unanswered(tokio::time::timeout(WAIT, copy).await.unwrap().unwrap(), "copy");
    s.logout().await.unwrap();
    other.logout().await.unwrap();
}

/// A write running on a unit whose LUN was then mapped away from its session (a LUN map changed
/// live) is still the unit's task: another session's reset of the unit ends it without a
/// response and is answered only once its I/O is over. (Before, the session matched tasks
/// through its current view only: the reset was answered at once, and the write landed after.)
async fn a_reset_ends_a_write_whose_lun_was_mapped_away_since_it_started(t: Transport) {
    let disk = Gated::new();
    let lu = Arc::new(LogicalUnit::new(disk.clone(), LuIdentity::random()));
    let ram = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random()));
    let (addr, target) = t.serve(t.config().node(Node::new(TARGET).lun(ram).lun(lu))).await;
    // Its commands time out beyond `WAIT`: only the reset can end the write's task.
    let s = t.connect(addr, SessionConfig::new(ME, TARGET).timeout(2 * WAIT)).await.unwrap();
    let other = t.connect(addr, SessionConfig::new("iqn.2026-11.io.riser:another", TARGET)).await.unwrap();
    disk.hold(true);
    let write = tokio::spawn({
        let s = s.clone();
        async move { s.command_once(Lun::from_number(1).unwrap(), &write10(0, 8), Some(pattern(3, 4096)), 0).await }
    });
    until("the write never reached the store", || disk.waiting() > 0).await;
    // This initiator now sees LUN 0 only; its session learns so at its next command.
    target
        .update_node(TARGET, |n| {
            n.lun_maps.insert(ME.to_ascii_lowercase(), [(0, 0)].into());
            Ok(())
        })
        .await
        .unwrap();
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    let reset = tokio::spawn({
        let other = other.clone();
        async move { other.task_management(Lun::from_number(1).unwrap(), TmfFunction::LOGICAL_UNIT_RESET, 0).await }
    });
    let ended = no_task_left(&target).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let early = reset.is_finished();
    disk.hold(false);
    assert!(ended, "the reset did not end the write");
    assert!(!early, "the reset was answered while the write still ran");
    tokio::time::timeout(WAIT, reset).await.unwrap().unwrap().unwrap();
    // Its caller would hear only at its timeout (no answer comes): not waited for.
    write.abort();
    other.logout().await.unwrap();
}

/// A copy its initiator gives up (its time up: the session aborts it with ABORT TASK) stops
/// before its next write, so the abort is answered once the write under way is over. (Before,
/// the copy ran on to its end on the blocking pool, the abort waiting for all of it.)
async fn a_copy_whose_time_is_up_stops_at_its_next_write(t: Transport) {
    let (disk, _dest, _addr, s, copy) = copy_held_at_its_destination(t, Duration::from_secs(1), false).await;
    // Past the timeout: the abort is under way, waiting for the held write.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    let early = copy.is_finished();
    disk.hold(false);
    assert!(!early, "the copy's caller heard before its write was over");
    ended_unanswered(tokio::time::timeout(WAIT, copy).await.unwrap().unwrap(), "copy");
    assert_eq!(disk.done(), 1, "the copy wrote on after it was aborted");
    s.logout().await.unwrap();
}
