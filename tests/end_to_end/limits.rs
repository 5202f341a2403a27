//! The target under a hostile initiator, on every transport: the window, immediate commands
//! and command data are bounded. (Limits on the connection itself — a peer that stops reading
//! or stalls in a PDU, the connection cap — are TCP's, in `tcp_limits`.)

use crate::support::{Gated, Transport, read10, until, write10};
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::wire::{Header, Pdu, RejectReason};
use riser::scsi::sense::Status;
use std::sync::atomic::Ordering;
use std::time::Duration;

on_every_transport!(
    the_window_slides_when_commands_end_not_when_they_arrive,
    immediate_commands_beyond_their_allowance_are_rejected,
    the_session_memory_budget_holds_reads_back,
    the_target_memory_budget_holds_reads_of_all_sessions_back,
);

/// Commands held in the target keep their window slots: MaxCmdSN moves when they end, not when
/// they arrive (it used to slide on arrival, so queue_depth bounded nothing).
async fn the_window_slides_when_commands_end_not_when_they_arrive(t: Transport) {
    let gated = Gated::new();
    let addr = t.start_on(gated.clone(), |_| {}, |c| c.queue_depth = 4).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = t.raw(addr, op, 1).await;
    let first_max = r.o.max_cmd_sn;
    assert_eq!(first_max, r.o.exp_cmd_sn.wrapping_add(3));
    gated.hold(true);
    for i in 0..4u32 {
        let h = r.command(0x100 + i, &write10(i, 1), 512, true, true, false);
        r.send(h, &[0xaa; 512]).await;
    }
    // All four are in the target, held at the backend: no room opened.
    until("four writes reached the disk", || gated.waiting() == 4).await;
    assert_eq!(r.ping(1).await, first_max, "MaxCmdSN while four commands are held");
    // A fifth, beyond MaxCmdSN, is ignored (RFC 7143 §4.2.2.1).
    let h = r.command(0x200, &write10(9, 1), 512, true, true, false);
    r.send(h, &[0xbb; 512]).await;
    // (PDUs are handled in order: once this ping is answered the fifth was seen and ignored.)
    r.ping(2).await;
    gated.hold(false);
    let mut maxes = Vec::new();
    for i in 0..4u32 {
        let (resp, _) = r.response(0x100 + i, |_| {}).await;
        assert_eq!(resp.status, Status::GOOD);
        maxes.push(resp.max_cmd_sn);
    }
    assert_eq!(*maxes.iter().max().unwrap(), first_max.wrapping_add(4), "each ended command opens one slot: {maxes:?}");
    assert!(r.next_within(Duration::from_millis(300)).await.is_none(), "the command beyond the window was ignored");
}

/// Immediate commands do not count in the window: they have an allowance of their own, past
/// which the RFC's Immediate Command Reject answers them.
async fn immediate_commands_beyond_their_allowance_are_rejected(t: Transport) {
    let gated = Gated::new();
    let addr = t.start_on(gated.clone(), |_| {}, |c| c.max_immediate_commands = 2).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut r = t.raw(addr, op, 2).await;
    gated.hold(true);
    for i in 0..3u32 {
        let h = r.command(0x300 + i, &write10(i, 1), 512, true, true, true);
        r.send(h, &[1; 512]).await;
    }
    let reject = r.next().await;
    gated.hold(false);
    match reject {
        (Header::Reject(j), bhs) => {
            assert_eq!(j.reason, RejectReason::IMMEDIATE_COMMAND_REJECTED);
            let (p, _) = Pdu::parse(&bhs).unwrap();
            assert!(matches!(p.header, Header::ScsiCommand(c) if c.itt == 0x302));
        }
        other => panic!("expected an Immediate Command Reject, got {other:?}"),
    }
    for i in 0..2u32 {
        assert_eq!(r.response(0x300 + i, |_| {}).await.0.status, Status::GOOD);
    }
}

/// A session holds at most `max_session_bytes` of command data: further reads wait for room
/// before their memory is taken (it used to allocate every read's whole transfer at once).
async fn the_session_memory_budget_holds_reads_back(t: Transport) {
    let gated = Gated::new();
    let addr = t.start_on(gated.clone(), |_| {}, |c| c.max_session_bytes = 1 << 20).await;
    let mut r = t.raw(addr, OperationalConfig::default(), 3).await;
    for i in 0..4u32 {
        let h = r.command(0x400 + i, &read10(i * 2048, 2048), 1 << 20, false, true, false);
        r.submit(h, 1 << 20, None).await;
    }
    for i in 0..4u32 {
        assert_eq!(r.response(0x400 + i, |_| {}).await.0.status, Status::GOOD);
    }
    assert_eq!(gated.reads_max.load(Ordering::SeqCst), 1, "four 1 MiB reads under a 1 MiB budget ran one at a time");
}

/// The target-wide budget holds across sessions: two sessions, each within its own budget,
/// together wait for the target's.
async fn the_target_memory_budget_holds_reads_of_all_sessions_back(t: Transport) {
    let gated = Gated::new();
    let addr = t.start_on(gated.clone(), |_| {}, |c| c.max_target_bytes = 1 << 20).await;
    let mut a = t.raw(addr, OperationalConfig::default(), 0x31).await;
    let mut b = t.raw(addr, OperationalConfig::default(), 0x32).await;
    for (i, r) in [&mut a, &mut b].into_iter().enumerate() {
        for j in 0..2u32 {
            let n = i as u32 * 2 + j;
            let h = r.command(0x600 + n, &read10(n * 2048, 2048), 1 << 20, false, true, false);
            r.submit(h, 1 << 20, None).await;
        }
    }
    for j in 0..2u32 {
        assert_eq!(a.response(0x600 + j, |_| {}).await.0.status, Status::GOOD);
        assert_eq!(b.response(0x602 + j, |_| {}).await.0.status, Status::GOOD);
    }
    assert_eq!(gated.reads_max.load(Ordering::SeqCst), 1, "four 1 MiB reads of two sessions under a 1 MiB target budget ran one at a time");
}
