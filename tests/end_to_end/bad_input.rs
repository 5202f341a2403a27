//! PDUs the initiator library never sends, on every transport: each gets the RFC's answer (or
//! is ignored as the RFC says), fails no more than its own task, and the connection goes on.

use crate::support::{Gated, Raw, Transport, read10, sense, write10};
use bytes::Bytes;
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::wire::{DataOut, Header, LoginRequest, NopOut, Pdu, RejectReason, Snack, TextRequest};
use riser::scsi::lun::Lun;
use riser::scsi::sense::{AscAscq, SenseKey, Status};
use riser::target::server::TargetConfig;
use std::time::Duration;

on_every_transport!(
    cmdsn_window_snack_and_stray_data_out,
    data_out_outside_its_sequence_ends_only_that_task,
    impossible_write_lengths_get_check_condition,
    an_unsolicited_burst_ended_early_fails_the_task,
    unsolicited_data_out_out_of_order_fails_its_task_on_every_transport,
    a_command_whose_flags_contradict_its_cdb_gets_an_answer,
    unsolicited_data_that_never_comes_ends_the_command_not_the_connection,
    a_header_with_an_impossible_field_is_rejected_and_the_session_goes_on,
    a_write_tag_reused_while_its_write_is_outstanding_ends_the_connection,
    a_command_reusing_a_live_tasks_tag_is_rejected_and_that_task_goes_on,
    a_text_request_repeating_send_targets_gets_one_listing,
);

/// A target that takes unsolicited data (InitialR2T=No, ImmediateData=Yes, FirstBurstLength
/// 64 KiB; over iSER too), configured further by `cfg`, and a raw session to it (ISID `isid`).
async fn unsolicited_data_allowed(t: Transport, isid: u8, cfg: impl FnOnce(&mut TargetConfig)) -> Raw {
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true).first_burst_length(65_536);
    let addr = t
        .start(
            |_| {},
            |c| {
                c.login.operational = op.clone();
                c.iser_unsolicited_data = true;
                cfg(c);
            },
        )
        .await;
    t.raw(addr, op, isid).await
}

async fn cmdsn_window_snack_and_stray_data_out(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let mut r = t.raw(addr, OperationalConfig::default(), 1).await;
    let o = r.o.clone();
    let ping = |itt: u32, cmd_sn: u32, immediate: bool| {
        Header::NopOut(NopOut { immediate, lun: Lun::ZERO, itt, ttt: u32::MAX, cmd_sn, exp_stat_sn: o.stat_sn })
    };
    // A non-immediate PDU far outside the window is silently ignored (RFC 7143 §4.2.2.1)...
    r.send(ping(5, o.exp_cmd_sn.wrapping_add(100_000), false), &[]).await;
    // ...a stray Data-Out for no task is drained and ignored...
    let d = DataOut { final_: true, itt: 0x4444, ttt: 0x1234, ..DataOut::default() };
    r.send(Header::DataOut(d), &[7u8; 512]).await;
    // ...so the next answer is the one to the in-window ping.
    r.send(ping(6, o.exp_cmd_sn, false), &[]).await;
    match r.next().await.0 {
        Header::NopIn(n) => assert_eq!(n.itt, 6),
        h => panic!("{h:?}"),
    }
    // SNACK at ERL 0: Reject (protocol error), connection kept.
    r.send(Header::Snack(Snack { itt: 9, ..Snack::default() }), &[]).await;
    match r.next().await.0 {
        Header::Reject(j) => assert_eq!(j.reason, RejectReason::PROTOCOL_ERROR),
        h => panic!("{h:?}"),
    }
    r.send(ping(7, o.exp_cmd_sn.wrapping_add(1), true), &[]).await;
    assert!(matches!(r.next().await.0, Header::NopIn(n) if n.itt == 7));
}

async fn data_out_outside_its_sequence_ends_only_that_task(t: Transport) {
    let op = OperationalConfig::default().initial_r2t(true).immediate_data(false);
    let addr = t.start(|_| {}, |c| c.login.operational = op.clone()).await;
    let mut r = t.raw(addr, op, 2).await;
    // Data-Out for a Target Transfer Tag the target never issued.
    let h = r.command(0x10, &write10(256, 8), 4096, true, true, false);
    r.send(h, &[]).await;
    let d = DataOut { final_: true, itt: 0x10, ttt: 0x5555, ..DataOut::default() };
    r.send(Header::DataOut(d), &[1u8; 4096]).await;
    let (resp, data) = r.response(0x10, |_| {}).await;
    assert_eq!(resp.status, Status::CHECK_CONDITION);
    assert_eq!((sense(&data).key, sense(&data).asc), (SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR));
    // Unsolicited Data-Out although InitialR2T=Yes (beyond the allowed burst of zero).
    let h = r.command(0x11, &write10(256, 8), 4096, true, true, false);
    r.send(h, &[]).await;
    let d = DataOut { final_: true, itt: 0x11, ttt: u32::MAX, ..DataOut::default() };
    r.send(Header::DataOut(d), &[1u8; 4096]).await;
    assert_eq!(r.response(0x11, |_| {}).await.0.status, Status::CHECK_CONDITION);
    // The connection is still good.
    r.ping(0x12).await;
}

/// Every command gets an answer: an expected length beyond any task buffer, immediate data
/// longer than the expected length (both were left unanswered; over iSER the datamover used to
/// drop the connection, or hand the core a task for immediate data beyond the command's
/// length). Sent as built, and with the datamover's buffers (as the library sends).
async fn impossible_write_lengths_get_check_condition(t: Transport) {
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let addr = t.start(|_| {}, |c| c.iser_unsolicited_data = true).await;
    let mut r = t.raw(addr, op, 13).await;
    // An expected length of 1 GiB, beyond any task buffer: with no data, then with one block.
    let h = r.command(0xa00, &write10(0, 1), 1 << 30, true, true, false);
    r.send(h, &[]).await;
    let (resp, d) = r.response(0xa00, |_| {}).await;
    assert_eq!((resp.status, sense(&d).key), (Status::CHECK_CONDITION, SenseKey::ILLEGAL_REQUEST));
    let h = r.command(0xa10, &write10(8, 1), 1 << 30, true, true, false);
    r.submit(h, 0, Some(Bytes::from(vec![2; 512]))).await;
    let (resp, d) = r.response(0xa10, |_| {}).await;
    assert_eq!((resp.status, sense(&d).key), (Status::CHECK_CONDITION, SenseKey::ILLEGAL_REQUEST));
    // 1 KiB of immediate data for a 512-byte command: as built, and with a write buffer.
    let h = r.command(0xa01, &write10(0, 1), 512, true, true, false);
    r.send(h, &[5; 1024]).await;
    let (resp, d) = r.response(0xa01, |_| {}).await;
    assert_eq!(
        (resp.status, sense(&d).key, sense(&d).asc),
        (Status::CHECK_CONDITION, SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR)
    );
    let h = r.command(0xa11, &write10(8, 1), 512, true, true, false);
    r.submit(h, 0, Some(Bytes::from(vec![1; 1024]))).await;
    let (resp, d) = r.response(0xa11, |_| {}).await;
    assert_eq!(
        (resp.status, sense(&d).key, sense(&d).asc),
        (Status::CHECK_CONDITION, SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR)
    );
    // The connection lives: it answers a ping, and a consistent write succeeds.
    r.ping(0xa02).await;
    let h = r.command(0xa12, &write10(8, 1), 512, true, true, false);
    r.submit(h, 0, Some(Bytes::from(vec![3; 512]))).await;
    assert_eq!(r.response(0xa12, |_| {}).await.0.status, Status::GOOD);
}

/// The unsolicited burst is FirstBurstLength or the whole transfer: one that ends early (F=1
/// short of it) would leave bytes nobody sent between it and the first R2T, and the reused
/// buffer's stale contents reached the medium with GOOD status. F=0 under InitialR2T=Yes is the
/// same hole. Both now fail the task, and the connection stays.
async fn an_unsolicited_burst_ended_early_fails_the_task(t: Transport) {
    let mut r = unsolicited_data_allowed(t, 14, |_| {}).await;
    assert!(!r.o.params.initial_r2t && r.o.params.first_burst_length == 65536);
    // 128 KiB write: 8 KiB immediate, then Data-Out 8..16 KiB with F=1 (FirstBurstLength is 64 KiB).
    let h = r.command(0xb00, &write10(100, 256), 131_072, true, false, false);
    r.send(h, &[1; 8192]).await;
    let d = DataOut { final_: true, lun: Lun::ZERO, itt: 0xb00, ttt: u32::MAX, data_sn: 0, buffer_offset: 8192, ..DataOut::default() };
    r.send(Header::DataOut(d), &[2; 8192]).await;
    let (resp, d) = r.response(0xb00, |_| {}).await;
    assert_eq!((resp.status, sense(&d).asc), (Status::CHECK_CONDITION, AscAscq::DATA_PHASE_ERROR));
    r.ping(0xb01).await;
    // The connection lives: a whole unsolicited write (immediate data, F=1) succeeds.
    let h = r.command(0xb02, &write10(100, 16), 8192, true, true, false);
    r.send(h, &[3; 8192]).await;
    assert_eq!(r.response(0xb02, |_| {}).await.0.status, Status::GOOD);

    // InitialR2T=Yes (the target's iSER default): F=0 announces Data-Out that may not come.
    let strict = OperationalConfig::default().initial_r2t(true).immediate_data(true);
    let addr = t.start(|_| {}, |c| c.login.operational = strict.clone()).await;
    let mut r = t.raw(addr, strict, 15).await;
    assert!(r.o.params.initial_r2t);
    let h = r.command(0xb10, &write10(0, 64), 32768, true, false, false);
    r.send(h, &[4; 8192]).await;
    let (resp, d) = r.response(0xb10, |_| {}).await;
    assert_eq!((resp.status, sense(&d).asc), (Status::CHECK_CONDITION, AscAscq::DATA_PHASE_ERROR));
    r.ping(0xb11).await;
    r.whole_write_succeeds(0xb12).await;
}

/// Unsolicited Data-Out at another offset than the next one, or with another DataSN, fails its
/// task (CHECK CONDITION) and only it, over TCP and iSER alike: one set of rules (riser-iscsi's
/// `UnsolicitedIn`). Before, iSER dropped the connection at a wrong offset and took a wrong
/// DataSN with GOOD status.
async fn unsolicited_data_out_out_of_order_fails_its_task_on_every_transport(t: Transport) {
    let mut r = unsolicited_data_allowed(t, 0x16, |_| {}).await;
    // 32 KiB writes, 8 KiB immediate, the rest unsolicited (F=0): the next Data-Out is due at
    // 8 KiB with DataSN 0; one at 16 KiB, then one with DataSN 1.
    for (itt, offset, data_sn) in [(0xc00u32, 16_384u32, 0u32), (0xc01, 8192, 1)] {
        let h = r.command(itt, &write10(200, 64), 32_768, true, false, false);
        r.send(h, &[1; 8192]).await;
        let d = DataOut { final_: false, lun: Lun::ZERO, itt, ttt: u32::MAX, data_sn, buffer_offset: offset, ..DataOut::default() };
        r.send(Header::DataOut(d), &[2; 8192]).await;
        let (resp, d) = r.response(itt, |_| {}).await;
        assert_eq!((resp.status, sense(&d).asc), (Status::CHECK_CONDITION, AscAscq::DATA_PHASE_ERROR), "{itt:#x}");
    }
    // The connection lives, and a write whose Data-Out keeps its sequence succeeds.
    r.ping(0xc02).await;
    let h = r.command(0xc03, &write10(200, 32), 16_384, true, false, false);
    r.send(h, &[3; 8192]).await;
    let d = DataOut { final_: true, lun: Lun::ZERO, itt: 0xc03, ttt: u32::MAX, data_sn: 0, buffer_offset: 8192, ..DataOut::default() };
    r.send(Header::DataOut(d), &[4; 8192]).await;
    assert_eq!(r.response(0xc03, |_| {}).await.0.status, Status::GOOD);
}

/// Every command gets an answer whatever its flags say against its CDB: data the CDB wants but
/// the flags do not announce is refused; flags announcing data the CDB does not move end GOOD
/// with the whole length as residual. The connection goes on. (Over iSER, a read that
/// advertised no buffer: see `iser::a_read_without_a_buffer_gets_check_condition`.)
async fn a_command_whose_flags_contradict_its_cdb_gets_an_answer(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let mut r = t.raw(addr, OperationalConfig::default(), 17).await;
    // A WRITE CDB with R instead of W, then with neither (expecting data, and not).
    for (itt, read, edtl) in [(0xd00, true, 512), (0xd01, false, 0), (0xd04, false, 512)] {
        let h = r.command_rw(itt, &write10(0, 1), edtl, read, false, true, false);
        r.send(h, &[]).await;
        let (resp, d) = r.response(itt, |_| {}).await;
        assert_eq!(
            (resp.status, sense(&d).key, sense(&d).asc),
            (Status::CHECK_CONDITION, SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_CDB),
            "{itt:#x}"
        );
    }
    // A READ CDB with W (no data sent, F=1), or with neither flag: nothing moves, the whole
    // length is residual.
    for (itt, write) in [(0xd02, true), (0xd05, false)] {
        let h = r.command_rw(itt, &read10(0, 1), 512, false, write, true, false);
        r.send(h, &[]).await;
        let (resp, d) = r.response(itt, |h| panic!("no data moves: {h:?}")).await;
        assert_eq!((resp.status, d.len(), resp.underflow, resp.residual), (Status::GOOD, 0, true, 512), "{resp:?}");
    }
    r.ping(0xd03).await;
}

/// Unsolicited Data-Out announced (F=0) and never sent ends the command with CHECK CONDITION
/// at `data_timeout`, and only the command: the connection goes on.
async fn unsolicited_data_that_never_comes_ends_the_command_not_the_connection(t: Transport) {
    let mut r = unsolicited_data_allowed(t, 0x51, |c| c.data_timeout = Duration::from_millis(500)).await;
    // WRITE(10) of 64 KiB, 8 KiB immediate, F=0: 56 KiB of unsolicited Data-Out promised.
    let h = r.command(0xe00, &write10(0, 128), 65_536, true, false, false);
    r.send(h, &[6; 8192]).await;
    let started = std::time::Instant::now();
    let (resp, d) = r.response(0xe00, |_| {}).await;
    assert_eq!((resp.status, sense(&d).asc), (Status::CHECK_CONDITION, AscAscq::DATA_PHASE_ERROR));
    assert!(started.elapsed() >= Duration::from_millis(400), "answered at the data timeout, not before");
    r.whole_write_succeeds(0xe01).await;
}

/// A header that is well framed but holds an impossible field (here a Login Request with both
/// the T and C bits, RFC 7143 §11.12.2) gets a Reject carrying it (Invalid PDU Field), and the
/// session goes on: the datamover hands the decode error to the session, which acts on its
/// reaction. It used to end the connection.
async fn a_header_with_an_impossible_field_is_rejected_and_the_session_goes_on(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let mut r = t.raw(addr, OperationalConfig::default(), 18).await;
    let bad = Header::LoginRequest(LoginRequest { transit: true, cont: true, itt: 77, cmd_sn: r.cmd_sn, ..LoginRequest::default() });
    let mut sent = Vec::new();
    Pdu::new(bad, &[][..], &b"junk"[..]).encode(&mut sent);
    r.send(bad, b"junk").await;
    match r.next().await {
        (Header::Reject(j), bhs) => {
            assert_eq!(j.reason, RejectReason::INVALID_PDU_FIELD);
            assert_eq!(bhs, sent[..48], "the Reject carries the offending header as sent");
        }
        other => panic!("expected a Reject, got {other:?}"),
    }
    // Its data segment was skipped, not taken for a header: the connection still works.
    r.ping(2).await;
    let h = r.command(3, &read10(0, 1), 512, false, true, false);
    r.submit(h, 512, None).await;
    assert_eq!(r.response(3, |_| {}).await.0.status, Status::GOOD);
}

/// A write command whose Initiator Task Tag names a write still outstanding (its unsolicited
/// data announced and not sent) ends the connection on every transport (the datamover's
/// `Violation::TaskTagReused`): its data would go into the other task's buffer. Over iSER the
/// second command used to replace the first one's buffer and sequence.
async fn a_write_tag_reused_while_its_write_is_outstanding_ends_the_connection(t: Transport) {
    let mut r = unsolicited_data_allowed(t, 0x17, |_| {}).await;
    let h = r.command(0xd00, &write10(300, 64), 32_768, true, false, false);
    r.send(h, &[1; 8192]).await;
    r.ping(0xd01).await;
    let again = r.command(0xd00, &write10(400, 16), 8192, true, true, false);
    r.send(again, &[2; 8192]).await;
    assert!(r.ends_within(Duration::from_secs(10)).await, "the connection goes on after a write reused a live write's tag");
}

/// A command whose Initiator Task Tag names a task still running gets Reject (Task in
/// progress, RFC 7143 §11.17.1), and the running task goes on: its data lands, its status
/// comes. The discard of the rejected command used to free what the datamover held under the
/// tag — the running task's: over TCP a write's buffer (its Data-Out was then drained and the
/// write failed), over iSER a command's remote keys (a read's data could not be put).
async fn a_command_reusing_a_live_tasks_tag_is_rejected_and_that_task_goes_on(t: Transport) {
    let gated = Gated::new();
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true).first_burst_length(65_536);
    let config = |c: &mut TargetConfig| {
        c.login.operational = op.clone();
        c.iser_unsolicited_data = true;
    };
    let addr = t.start_on(gated.clone(), |_| {}, config).await;
    let mut r = t.raw(addr, op.clone(), 0x18).await;
    let in_progress = |h: Header| match h {
        Header::Reject(j) => assert_eq!(j.reason, RejectReason::TASK_IN_PROGRESS),
        h => panic!("expected Reject (Task in progress), got {h:?}"),
    };
    // A write whose unsolicited data is announced and not all sent, and a read reusing its tag.
    let h = r.command(0xe00, &write10(600, 64), 32_768, true, false, false);
    r.send(h, &[5; 8192]).await;
    let dup = r.command(0xe00, &read10(0, 8), 4096, false, true, false);
    r.send(dup, &[]).await;
    in_progress(r.next().await.0);
    for n in 0..3u32 {
        let at = 8192 * (n + 1);
        let d = DataOut { final_: n == 2, lun: Lun::ZERO, itt: 0xe00, ttt: u32::MAX, data_sn: n, buffer_offset: at, ..DataOut::default() };
        r.send(Header::DataOut(d), &[6; 8192]).await;
    }
    assert_eq!(r.response(0xe00, |_| {}).await.0.status, Status::GOOD, "the write whose tag was reused");
    // A read (150 ms at the disk), and a command reusing its tag while it runs.
    let h = r.command(0xe01, &read10(600, 64), 32_768, false, true, false);
    r.submit(h, 32_768, None).await;
    let dup = r.command(0xe01, &read10(0, 1), 512, false, true, false);
    r.send(dup, &[]).await;
    in_progress(r.next().await.0);
    assert_eq!(r.response(0xe01, |_| {}).await.0.status, Status::GOOD, "the read whose tag was reused");
    r.ping(0xe02).await;
    // What the write carried is on the disk.
    let s = t.session(addr).await;
    let mut want = vec![5u8; 8192];
    want.extend_from_slice(&[6; 24_576]);
    assert_eq!(s.read(Lun::ZERO, 600, 64, 512).await.unwrap(), want);
}

/// A text request repeating `SendTargets=All` is answered with one listing: the answer does not
/// grow with the repeats (a 256 KiB request of them was answered with 16,384 listings).
async fn a_text_request_repeating_send_targets_gets_one_listing(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let mut r = t.raw(addr, OperationalConfig::default(), 1).await;
    let o = r.o.clone();
    let keys = "SendTargets=All\0".repeat(50);
    let req = TextRequest { final_: true, itt: 9, ttt: u32::MAX, cmd_sn: o.exp_cmd_sn, exp_stat_sn: o.stat_sn, ..TextRequest::default() };
    r.send(Header::TextRequest(req), keys.as_bytes()).await;
    let (h, data) = r.next().await;
    let Header::TextResponse(resp) = h else { panic!("{h:?}") };
    let text = String::from_utf8_lossy(&data);
    assert!(resp.final_, "one answer");
    assert_eq!(text.matches("TargetName=").count(), 1, "{text}");
}
