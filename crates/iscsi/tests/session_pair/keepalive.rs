//! Keepalive: the target pings an idle initiator, and the initiator answers target pings.

use crate::harness::*;
use bytes::Bytes;
use core::time::Duration;
use riser_iscsi::session::{CloseReason, InitiatorSession, Residual, TargetEvent};
use riser_iscsi::wire::{Header, NopOut, RESERVED_TAG, ScsiCommand};
use riser_scsi::sense::Status;

#[test]
fn an_idle_initiator_is_pinged_and_its_answer_keeps_the_connection() {
    let mut p = keepalive_pair();
    assert_eq!(p.t.poll_timeout(), Some(Duration::from_secs(5)));
    p.now = Duration::from_secs(5);
    p.t.handle_timeout(p.now);
    p.pump();
    let ping = p.t_sent.iter().find_map(|h| match h {
        Header::NopIn(n) if n.itt == RESERVED_TAG => Some(*n),
        _ => None,
    });
    let ping = ping.expect("a ping");
    assert_ne!(ping.ttt, RESERVED_TAG);
    assert_eq!(ping.stat_sn, 1, "a ping carries the next StatSN without consuming it");
    assert_eq!(p.t.stat_sn(), 1);
    // The initiator answered within pump(); the next ping is due after another idle interval.
    assert_eq!(p.t.poll_timeout(), Some(Duration::from_secs(10)));
    p.now = Duration::from_secs(9);
    p.t.handle_timeout(p.now);
    assert!(!p.t.is_closed());
}

#[test]
fn an_unanswered_ping_gives_up_the_connection_after_the_timeout() {
    let mut p = keepalive_pair();
    p.t.handle_timeout(Duration::from_secs(5));
    assert!(p.t.poll_transmit().is_some(), "the ping (not delivered)");
    assert_eq!(p.t.poll_timeout(), Some(Duration::from_secs(15)));
    p.t.handle_timeout(Duration::from_secs(14));
    assert!(!p.t.is_closed());
    p.t.handle_timeout(Duration::from_secs(15));
    assert_eq!(p.t.poll_event(), Some(TargetEvent::Close(CloseReason::Unresponsive)));
    assert_eq!(p.t.poll_timeout(), None);
}

#[test]
fn only_one_ping_is_outstanding() {
    let mut p = keepalive_pair();
    p.t.handle_timeout(Duration::from_secs(5));
    p.t.handle_timeout(Duration::from_secs(6));
    p.t.handle_timeout(Duration::from_secs(9));
    let pings = std::iter::from_fn(|| p.t.poll_transmit()).count();
    assert_eq!(pings, 1);
}

#[test]
fn any_pdu_from_the_initiator_counts_as_alive() {
    let mut p = keepalive_pair();
    p.t.handle_timeout(Duration::from_secs(5));
    let _ = p.t.poll_transmit();
    p.now = Duration::from_secs(12);
    p.command(LUN0, 0);
    assert_eq!(p.t.poll_timeout(), Some(Duration::from_secs(17)));
    p.t.handle_timeout(Duration::from_secs(16));
    assert!(!p.t.is_closed());
}

#[test]
fn a_nop_out_naming_another_ping_does_not_count_as_the_answer() {
    let mut p = keepalive_pair();
    p.t.handle_timeout(Duration::from_secs(5));
    let _ = p.t.poll_transmit();
    let wrong = NopOut { immediate: true, itt: RESERVED_TAG, ttt: 0x7777, ..NopOut::default() };
    p.t.handle_pdu(Duration::from_secs(6), &Header::NopOut(wrong), Bytes::new(), Bytes::new(), 0);
    p.t.handle_timeout(Duration::from_secs(15));
    assert_eq!(p.t.poll_event(), Some(TargetEvent::Close(CloseReason::Unresponsive)));
}

#[test]
fn without_keepalive_no_timer_runs() {
    let p = Pair::new(4);
    assert_eq!(p.t.poll_timeout(), None);
}

#[test]
fn the_initiator_answers_a_target_ping_with_its_ttt_and_current_numbers() {
    let mut i = InitiatorSession::with_numbers(10, 20, 5);
    let ping = riser_iscsi::wire::NopIn { itt: RESERVED_TAG, ttt: 42, stat_sn: 5, exp_cmd_sn: 10, max_cmd_sn: 20, ..Default::default() };
    i.handle_pdu(&Header::NopIn(ping), Bytes::from_static(b"x"));
    let t = i.poll_transmit().expect("an answer");
    match t.header {
        Header::NopOut(n) => assert_eq!((n.itt, n.ttt, n.cmd_sn, n.exp_stat_sn, n.immediate), (RESERVED_TAG, 42, 10, 5, true)),
        other => panic!("{other:?}"),
    }
    assert_eq!(&t.data[..], b"x");
    assert_eq!(i.window().cmd_sn(), 10, "an immediate answer consumes no CmdSN");
}

#[test]
fn a_late_call_about_an_ended_task_leaves_a_new_task_with_its_tag_alone() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 0);
    let old = p.task(itt);
    assert!(p.finish(itt));
    // The initiator reuses the tag for a new command.
    let c = p.i.start_command(LUN0, &[0], 0, 0).unwrap();
    let reuse = ScsiCommand { itt, ..c };
    p.deliver_command(reuse);
    assert!(p.t.has_task(itt));
    p.t.drop_task(old);
    assert!(!p.t.finish_command(old, Status::GOOD, None, Residual::None, 0));
    assert!(p.t.has_task(itt), "the new task is untouched");
    assert!(p.t.finish_command(p.task(itt), Status::GOOD, None, Residual::None, 0));
}
