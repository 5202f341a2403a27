//! Task management: aborts, task sets, resets, and a response racing its abort.

use crate::harness::*;
use bytes::Bytes;
use riser_iscsi::session::{CloseReason, InitiatorEvent, Reset, Residual, TargetEvent};
use riser_iscsi::wire::{Header, TmfFunction, TmfResponse};
use riser_scsi::sense::Status;

#[test]
fn abort_task_ends_the_task_on_both_sides_and_no_response_follows() {
    let mut p = Pair::new(4);
    let victim = p.command(LUN0, 512);
    let other = p.command(LUN0, 512);
    p.commands_seen();
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK, LUN0, victim);
    p.pump();
    let (itt, aborted, reset) = tmf_done(&mut p);
    assert_eq!((itt, aborted, reset), (tmf, vec![victim], Reset::None));
    assert!(!p.t.has_task(victim) && p.t.has_task(other));
    p.t.complete_task_management(tmf);
    p.pump();
    let ev = p.take_i_events();
    assert!(ev.contains(&InitiatorEvent::Aborted { itt: victim }));
    assert!(ev.contains(&InitiatorEvent::TaskManagementDone { itt: tmf, response: TmfResponse::COMPLETE }));
    assert!(!p.finish(victim), "the aborted task's status never goes out");
    assert!(p.i.has_task(other));
}

#[test]
fn the_task_management_answer_waits_for_the_driver() {
    let mut p = Pair::new(4);
    let victim = p.command(LUN0, 512);
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK, LUN0, victim);
    p.pump();
    assert!(!p.t_sent.iter().any(|h| matches!(h, Header::TaskMgmtResponse(_))), "not before the aborted I/O is over");
    p.t.complete_task_management(tmf);
    p.pump();
    assert!(p.t_sent.iter().any(|h| matches!(h, Header::TaskMgmtResponse(_))));
}

#[test]
fn abort_task_of_a_finished_task_says_it_does_not_exist() {
    let mut p = Pair::new(4);
    let t = p.command(LUN0, 512);
    p.finish(t);
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK, LUN0, t);
    p.pump();
    p.t.complete_task_management(tmf);
    p.pump();
    assert!(p.take_i_events().contains(&InitiatorEvent::TaskManagementDone { itt: tmf, response: TmfResponse::TASK_DOES_NOT_EXIST }));
}

#[test]
fn abort_task_of_a_command_not_arrived_yet_completes() {
    let mut p = Pair::new(4);
    // The command is numbered but the "network" holds it back.
    let late = p.i.start_command(LUN0, &[0], 512, 0).unwrap();
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK, LUN0, late.itt);
    let Some(t) = p.i.poll_transmit() else { panic!("the ABORT TASK") };
    assert!(matches!(t.header, Header::TaskMgmtRequest(r) if r.ref_cmd_sn == late.cmd_sn && r.ref_task_tag == late.itt));
    p.t.handle_pdu(p.now, &t.header, Bytes::new(), t.data, 0);
    p.pump();
    p.t.complete_task_management(tmf);
    p.pump();
    assert!(p.take_i_events().contains(&InitiatorEvent::TaskManagementDone { itt: tmf, response: TmfResponse::COMPLETE }));
}

#[test]
fn abort_task_set_takes_only_that_lus_tasks() {
    let mut p = Pair::new(8);
    let a = p.command(lun(0), 512);
    let b = p.command(lun(1), 512);
    let c = p.command(lun(0), 512);
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK_SET, lun(0), 0);
    p.pump();
    let (_, mut aborted, _) = tmf_done(&mut p);
    aborted.sort();
    assert_eq!(aborted, vec![a, c]);
    p.t.complete_task_management(tmf);
    p.pump();
    let ev = p.take_i_events();
    assert!(ev.contains(&InitiatorEvent::Aborted { itt: a }) && ev.contains(&InitiatorEvent::Aborted { itt: c }));
    assert!(!ev.contains(&InitiatorEvent::Aborted { itt: b }));
    assert!(p.t.has_task(b) && p.i.has_task(b));
}

#[test]
fn a_command_started_after_a_task_management_function_is_not_its_victim() {
    let mut p = Pair::new(8);
    let before = p.command(LUN0, 512);
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK_SET, LUN0, 0);
    // Numbered after the function (its CmdSN is the function's own), sent after it.
    let after = p.i.start_command(LUN0, &[0], 512, 0).unwrap();
    p.pump();
    let (_, aborted, _) = tmf_done(&mut p);
    assert_eq!(aborted, vec![before]);
    p.t.complete_task_management(tmf);
    p.pump();
    p.deliver_command(after);
    let ev = p.take_i_events();
    assert!(ev.contains(&InitiatorEvent::Aborted { itt: before }));
    assert!(!ev.contains(&InitiatorEvent::Aborted { itt: after.itt }), "{ev:?}");
    assert!(p.i.has_task(after.itt) && p.t.has_task(after.itt));
    assert!(p.finish(after.itt));
    assert!(matches!(p.take_i_events()[..], [InitiatorEvent::CommandDone { itt, .. }] if itt == after.itt));
}

#[test]
fn aborted_tasks_give_their_window_slots_back() {
    let mut p = Pair::new(2);
    p.command(LUN0, 512);
    p.command(LUN0, 512);
    assert!(!p.i.window().is_open());
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK_SET, LUN0, 0);
    p.pump();
    p.t.complete_task_management(tmf);
    p.pump();
    assert!(p.i.window().is_open(), "the TMF response announces the room");
    assert_eq!(p.t.window(), (3, 4));
}

#[test]
fn a_task_set_function_on_an_unknown_lun_says_so() {
    let mut p = Pair::new(4);
    for f in [TmfFunction::ABORT_TASK_SET, TmfFunction::CLEAR_TASK_SET, TmfFunction::LOGICAL_UNIT_RESET] {
        let tmf = p.i.task_management(f, lun(9), 0);
        p.pump();
        p.t.complete_task_management(tmf);
        p.pump();
        assert!(p.take_i_events().contains(&InitiatorEvent::TaskManagementDone { itt: tmf, response: TmfResponse::LUN_DOES_NOT_EXIST }));
    }
}

#[test]
fn lun_reset_aborts_the_lus_tasks_and_asks_for_its_reset() {
    let mut p = Pair::new(4);
    let a = p.command(lun(1), 512);
    p.command(lun(0), 512);
    p.i.task_management(TmfFunction::LOGICAL_UNIT_RESET, lun(1), 0);
    p.pump();
    let (_, aborted, reset) = tmf_done(&mut p);
    assert_eq!((aborted, reset), (vec![a], Reset::Unit(lun(1))));
}

#[test]
fn target_warm_reset_aborts_everything() {
    let mut p = Pair::new(4);
    p.command(lun(1), 512);
    p.command(lun(0), 512);
    let tmf = p.i.task_management(TmfFunction::TARGET_WARM_RESET, LUN0, 0);
    p.pump();
    let (_, aborted, reset) = tmf_done(&mut p);
    assert_eq!((aborted.len(), reset), (2, Reset::Target));
    p.t.complete_task_management(tmf);
    p.pump();
    assert_eq!(p.i.tasks(), 0);
    assert!(!p.t.is_closed());
}

#[test]
fn target_cold_reset_closes_the_connection_after_its_answer() {
    let mut p = Pair::new(4);
    let tmf = p.i.task_management(TmfFunction::TARGET_COLD_RESET, LUN0, 0);
    p.pump();
    tmf_done(&mut p);
    p.t.complete_task_management(tmf);
    p.pump();
    assert!(matches!(p.t_sent.last(), Some(Header::TaskMgmtResponse(_))));
    assert_eq!(p.take_t_events(), vec![TargetEvent::Close(CloseReason::ColdReset)]);
    assert!(p.t.is_closed());
}

#[test]
fn unsupported_functions_are_answered_not_dropped() {
    let mut p = Pair::new(4);
    for (f, want) in [
        (TmfFunction::TASK_REASSIGN, TmfResponse::REASSIGNMENT_NOT_SUPPORTED),
        (TmfFunction::CLEAR_ACA, TmfResponse::NOT_SUPPORTED),
        (TmfFunction(0x55), TmfResponse::REJECTED),
    ] {
        let tmf = p.i.task_management(f, LUN0, 0);
        p.pump();
        p.t.complete_task_management(tmf);
        p.pump();
        assert!(p.take_i_events().contains(&InitiatorEvent::TaskManagementDone { itt: tmf, response: want }), "{f:?}");
    }
}

#[test]
fn a_response_racing_its_abort_ends_the_command_once() {
    let mut p = Pair::new(4);
    let t = p.command(LUN0, 512);
    // The target finished the command before the ABORT TASK arrived.
    p.t.finish_command(p.task(t), Status::GOOD, None, Residual::None, 0);
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK, LUN0, t);
    p.pump();
    p.t.complete_task_management(tmf);
    p.pump();
    let ev = p.take_i_events();
    assert_eq!(ev.iter().filter(|e| matches!(e, InitiatorEvent::CommandDone { .. } | InitiatorEvent::Aborted { .. })).count(), 1);
    assert!(ev.contains(&InitiatorEvent::TaskManagementDone { itt: tmf, response: TmfResponse::TASK_DOES_NOT_EXIST }));
}
