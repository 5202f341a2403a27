//! The CmdSN window: bounds, duplicates, reordering, wrap-around, StatSN, immediate
//! commands and task tags.

use crate::harness::*;
use bytes::Bytes;
use riser_iscsi::keys::NegotiatedParams;
use riser_iscsi::session::{InitiatorEvent, Residual, TargetEvent, TargetSessionConfig};
use riser_iscsi::wire::{Header, RejectReason, ScsiCommand};
use riser_scsi::sense::Status;

#[test]
fn a_command_runs_and_its_status_reaches_the_initiator() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 512);
    assert_eq!(p.commands_seen(), vec![itt]);
    assert!(p.finish(itt));
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::CommandDone { itt, status: Status::GOOD, sense: None, residual: Residual::None }]);
    assert_eq!((p.t.tasks(), p.i.tasks()), (0, 0));
}

#[test]
fn the_window_bounds_commands_held_and_slides_as_they_end() {
    let mut p = Pair::new(3);
    let a = p.command(LUN0, 512);
    let _b = p.command(LUN0, 512);
    let _c = p.command(LUN0, 512);
    assert_eq!(p.i.start_command(LUN0, &[0], 0, 0), Err(riser_iscsi::session::Busy::WindowClosed));
    assert_eq!(p.t.window(), (4, 3), "ExpCmdSN 4, MaxCmdSN still 3: the window is full");
    p.finish(a);
    assert_eq!(p.t.window(), (4, 4), "one command ended, one slot opens");
    assert!(p.i_events.contains(&InitiatorEvent::WindowOpen));
    assert!(p.i.window().is_open());
    p.command(LUN0, 512);
    assert_eq!(p.t.tasks(), 3);
}

#[test]
fn a_command_outside_the_window_is_dropped_silently() {
    let mut p = Pair::new(2);
    let c = ScsiCommand { cmd_sn: 10, itt: 5, lun: LUN0, ..ScsiCommand::default() };
    p.deliver_command(c);
    assert_eq!(p.take_t_events(), vec![TargetEvent::Discard { itt: 5 }]);
    assert!(p.t_sent.is_empty(), "no answer at all (RFC 7143 §4.2.2.1)");
    let old = ScsiCommand { cmd_sn: 0, itt: 6, lun: LUN0, ..ScsiCommand::default() };
    p.deliver_command(old);
    assert_eq!(p.take_t_events(), vec![TargetEvent::Discard { itt: 6 }]);
}

#[test]
fn a_duplicate_cmd_sn_is_dropped() {
    let mut p = Pair::new(4);
    let c = p.i.start_command(LUN0, &[0], 512, 0).unwrap();
    p.deliver_command(c);
    p.deliver_command(ScsiCommand { itt: c.itt + 1000, ..c });
    assert_eq!(p.take_t_events().len(), 2);
    assert_eq!(p.t.tasks(), 1);
}

#[test]
fn commands_arriving_out_of_order_are_all_taken_and_exp_cmd_sn_catches_up() {
    let mut p = Pair::new(8);
    let cmds: Vec<ScsiCommand> = (0..5).map(|_| p.i.start_command(LUN0, &[0], 0, 0).unwrap()).collect();
    for i in [3, 1, 4, 0, 2] {
        p.deliver_command(cmds[i]);
    }
    assert_eq!(p.commands_seen().len(), 5);
    assert_eq!(p.t.window().0, 6);
}

#[test]
fn exp_cmd_sn_waits_at_a_gap() {
    let mut p = Pair::new(8);
    let cmds: Vec<ScsiCommand> = (0..3).map(|_| p.i.start_command(LUN0, &[0], 0, 0).unwrap()).collect();
    p.deliver_command(cmds[2]);
    p.deliver_command(cmds[1]);
    assert_eq!(p.t.window().0, 1, "CmdSN 1 has not arrived");
    p.deliver_command(cmds[0]);
    assert_eq!(p.t.window().0, 4);
}

#[test]
fn the_window_wraps_around_the_serial_number_space() {
    let mut p = Pair::with(TargetSessionConfig::new(4).luns([LUN0]), &NegotiatedParams::default(), u32::MAX - 2, 7);
    for _ in 0..40 {
        let itt = p.command(LUN0, 0);
        assert!(p.finish(itt));
    }
    assert_eq!(p.t.window().0, (u32::MAX - 2).wrapping_add(40));
    assert_eq!(p.t.window().1, (u32::MAX - 2).wrapping_add(40 + 3));
    assert_eq!(p.i.window().cmd_sn(), p.t.window().0);
}

#[test]
fn stat_sn_counts_every_response_in_order_and_exp_stat_sn_follows() {
    let mut p = Pair::with(TargetSessionConfig::new(8).luns([LUN0]), &NegotiatedParams::default(), 1, u32::MAX - 1);
    let tags: Vec<u32> = (0..4).map(|_| p.command(LUN0, 0)).collect();
    for t in tags.iter().rev() {
        p.finish(*t);
    }
    p.i.ping(Bytes::new());
    p.pump();
    assert_eq!(p.stat_sns(), vec![u32::MAX - 1, u32::MAX, 0, 1, 2]);
    assert_eq!(p.i.window().exp_stat_sn(), 3);
    assert_eq!(p.t.stat_sn(), 3);
}

#[test]
fn immediate_commands_stand_outside_the_window_within_their_allowance() {
    let cfg = TargetSessionConfig::new(1).luns([LUN0]).max_immediate_commands(2);
    let mut p = Pair::with(cfg, &NegotiatedParams::default(), 1, 1);
    let base = ScsiCommand { immediate: true, cmd_sn: 1, lun: LUN0, ..ScsiCommand::default() };
    for itt in 1..=3 {
        p.deliver_command(ScsiCommand { itt, ..base });
    }
    let ev = p.take_t_events();
    assert_eq!(ev.iter().filter(|e| matches!(e, TargetEvent::Command { .. })).count(), 2);
    assert!(ev.contains(&TargetEvent::Discard { itt: 3 }));
    assert!(matches!(p.t_sent.last(), Some(Header::Reject(r)) if r.reason == RejectReason::IMMEDIATE_COMMAND_REJECTED));
    assert_eq!(p.t.window(), (1, 1), "immediate commands do not consume CmdSN");
    p.t.finish_command(p.task(1), Status::GOOD, None, Residual::None, 0);
    p.deliver_command(ScsiCommand { itt: 4, ..base });
    assert!(p.take_t_events().iter().any(|e| matches!(e, TargetEvent::Command { cmd, .. } if cmd.itt == 4)), "the allowance came back");
    assert_eq!(p.t.window(), (1, 1), "and the window did not move");
}

#[test]
fn a_task_tag_in_use_is_rejected_as_task_in_progress_and_takes_no_slot() {
    let mut p = Pair::new(4);
    let c = p.i.start_command(LUN0, &[0], 0, 0).unwrap();
    p.deliver_command(c);
    let dup = ScsiCommand { cmd_sn: c.cmd_sn + 1, ..c };
    p.deliver_command(dup);
    assert!(p.take_t_events().contains(&TargetEvent::Discard { itt: c.itt }));
    assert!(matches!(p.t_sent.last(), Some(Header::Reject(r)) if r.reason == RejectReason::TASK_IN_PROGRESS));
    assert_eq!(p.t.window(), (c.cmd_sn + 2, c.cmd_sn + 4), "the duplicate's CmdSN is used, its slot given back");
    assert!(p.t.has_task(c.itt));
}

#[test]
fn a_finished_task_cannot_be_finished_twice() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 0);
    assert!(p.finish(itt));
    let before = p.t.window();
    assert!(!p.finish(itt));
    assert_eq!(p.t.window(), before, "no second slot");
    assert_eq!(p.stat_sns().len(), 1);
}

#[test]
fn dropping_a_task_frees_its_slot_without_a_response() {
    let mut p = Pair::new(1);
    let itt = p.command(LUN0, 0);
    p.t.drop_task(p.task(itt));
    p.pump();
    assert!(p.t_sent.is_empty());
    assert_eq!(p.t.window(), (2, 2));
}

/// A transport that takes a bounded number of answers (iSER: the initiator's posted receives)
/// sets a task limit below the window: at it a command waits (`Busy::TaskLimit`) though the
/// window is open; immediate requests have `IMMEDIATE_BEYOND_LIMIT` more (the machine starts
/// them regardless: the driver asks `immediate_room`); every task that ends while the limit
/// was reached — answered or forgotten — says so (`WindowOpen`).
#[test]
fn the_task_limit_holds_commands_that_the_window_would_admit() {
    use riser_iscsi::session::{Busy, IMMEDIATE_BEYOND_LIMIT};
    let mut p = Pair::new(8);
    p.i.set_task_limit(Some(2));
    let a = p.command(LUN0, 512);
    let b = p.command(LUN0, 512);
    assert_eq!(p.i.start_command(LUN0, &[0], 0, 0), Err(Busy::TaskLimit));
    assert!(p.i.window().is_open(), "the window alone would admit it");
    assert!(p.i.immediate_room());
    let pings: Vec<u32> = (0..IMMEDIATE_BEYOND_LIMIT).map(|_| p.i.ping(Bytes::new())).collect();
    assert_eq!(p.i.tasks(), 2 + IMMEDIATE_BEYOND_LIMIT);
    assert!(!p.i.immediate_room(), "immediate requests have their own few beyond the limit");
    p.i_events.clear();
    p.finish(a);
    // The pings went across and were answered too: one task left, and each that ended at or
    // beyond the limit said so.
    assert_eq!(p.i.tasks(), 1);
    for itt in pings {
        assert!(p.i_events.contains(&InitiatorEvent::Pong { itt, data: Bytes::new() }));
    }
    assert_eq!(p.i_events.iter().filter(|e| **e == InitiatorEvent::WindowOpen).count(), 1 + IMMEDIATE_BEYOND_LIMIT, "{:?}", p.i_events);
    let c = p.command(LUN0, 512);
    assert_eq!(p.i.start_command(LUN0, &[0], 0, 0), Err(Busy::TaskLimit));
    p.i_events.clear();
    p.i.forget(c);
    assert_eq!(p.i.poll_event(), Some(InitiatorEvent::WindowOpen), "a forgotten task makes room as well");
    p.i.forget(b);
    assert_eq!(p.i.poll_event(), None, "below the limit already: nothing to say");
    p.i.set_task_limit(None);
    // b and c still hold their CmdSNs at the target: six more fill the window of eight.
    for _ in 0..6 {
        p.command(LUN0, 512);
    }
    assert_eq!(p.i.start_command(LUN0, &[0], 0, 0), Err(Busy::WindowClosed), "no limit: the window alone");
}
