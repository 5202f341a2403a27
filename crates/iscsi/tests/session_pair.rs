//! The full-feature session machines against each other, in memory, with a fake clock: what
//! RFC 7143 asks of the CmdSN window, StatSN, task management, text continuation, keepalive
//! and rejects, seen from both ends. The harness stands in for the datamovers: a SCSI
//! command goes from `InitiatorSession::start_command` straight to the target.

use bytes::Bytes;
use core::time::Duration;
use riser_iscsi::keys::{NegotiatedParams, SessionType};
use riser_iscsi::session::{
    CloseReason, InitiatorEvent, InitiatorSession, Reset, Residual, TargetEvent, TargetSession, TargetSessionConfig, TaskId, Transmit,
};
use riser_iscsi::wire::{
    BHS_LEN, DecodeError, Header, LoginRequest, NopOut, RESERVED_TAG, RejectReason, ScsiCommand, Snack, TextRequest, TmfFunction,
    TmfResponse,
};
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

const LUN0: Lun = Lun::ZERO;

fn lun(n: u16) -> Lun {
    Lun::from_number(n).unwrap()
}

/// A target and an initiator session after a login that left ExpCmdSN `cmd_sn`, StatSN
/// `stat_sn` and a window of `depth`.
struct Pair {
    t: TargetSession,
    i: InitiatorSession,
    now: Duration,
    /// Target events not consumed by the harness.
    t_events: Vec<TargetEvent>,
    /// Initiator events.
    i_events: Vec<InitiatorEvent>,
    /// Every PDU the target sent, in order.
    t_sent: Vec<Header>,
    /// The target's tasks by tag, as its Command events named them.
    ids: std::collections::HashMap<u32, TaskId>,
}

impl Pair {
    fn with(cfg: TargetSessionConfig, params: &NegotiatedParams, cmd_sn: u32, stat_sn: u32) -> Self {
        let depth = cfg.queue_depth.max(1);
        let t = TargetSession::with_params(cfg, params, cmd_sn, stat_sn, Duration::ZERO);
        let i = InitiatorSession::with_numbers(cmd_sn, cmd_sn.wrapping_add(depth - 1), stat_sn);
        Self { t, i, now: Duration::ZERO, t_events: Vec::new(), i_events: Vec::new(), t_sent: Vec::new(), ids: Default::default() }
    }

    fn new(depth: u32) -> Self {
        Self::with(TargetSessionConfig::new(depth).luns([lun(0), lun(1)]), &NegotiatedParams::default(), 1, 100)
    }

    /// Move every queued PDU across until both sides are quiet.
    fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(p) = self.i.poll_transmit() {
                self.t.handle_pdu(self.now, &p.header, Bytes::new(), p.data, 0);
                moved = true;
            }
            while let Some(e) = self.t.poll_event() {
                if let TargetEvent::Command { task, .. } = &e {
                    self.ids.insert(task.itt, *task);
                }
                self.t_events.push(e);
            }
            while let Some(p) = self.t.poll_transmit() {
                self.t_sent.push(p.header);
                self.i.handle_pdu(&p.header, p.data);
                moved = true;
            }
            while let Some(e) = self.i.poll_event() {
                self.i_events.push(e);
            }
            if !moved {
                return;
            }
        }
    }

    /// Send a SCSI command as a datamover would (straight to the target); its tag.
    fn command(&mut self, l: Lun, read_len: u32) -> u32 {
        let c = self.i.start_command(l, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], read_len, 0).expect("window open");
        self.deliver_command(c);
        c.itt
    }

    fn deliver_command(&mut self, c: ScsiCommand) {
        self.t.handle_pdu(self.now, &Header::ScsiCommand(c), Bytes::new(), Bytes::new(), 0);
        self.pump();
    }

    /// The target's task with tag `itt`.
    fn task(&self, itt: u32) -> TaskId {
        self.ids[&itt]
    }

    /// The target finishes task `itt` with GOOD.
    fn finish(&mut self, itt: u32) -> bool {
        let sent = self.t.finish_command(self.task(itt), Status::GOOD, None, Residual::None, 0);
        self.pump();
        sent
    }

    fn commands_seen(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        self.t_events.retain(|e| match e {
            TargetEvent::Command { cmd, .. } => {
                out.push(cmd.itt);
                false
            }
            _ => true,
        });
        out
    }

    fn take_t_events(&mut self) -> Vec<TargetEvent> {
        std::mem::take(&mut self.t_events)
    }

    fn take_i_events(&mut self) -> Vec<InitiatorEvent> {
        std::mem::take(&mut self.i_events).into_iter().filter(|e| *e != InitiatorEvent::WindowOpen).collect()
    }

    fn stat_sns(&self) -> Vec<u32> {
        self.t_sent
            .iter()
            .filter_map(|h| match h {
                Header::ScsiResponse(r) => Some(r.stat_sn),
                Header::TaskMgmtResponse(r) => Some(r.stat_sn),
                Header::TextResponse(r) => Some(r.stat_sn),
                Header::NopIn(n) if n.itt != RESERVED_TAG => Some(n.stat_sn),
                Header::Reject(r) => Some(r.stat_sn),
                Header::LogoutResponse(r) => Some(r.stat_sn),
                _ => None,
            })
            .collect()
    }
}

// --- the CmdSN window -------------------------------------------------------------------

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

// --- data transfer ----------------------------------------------------------------------

#[test]
fn a_write_command_carries_its_split_and_its_r2t_plan_numbers_ttts() {
    let params = NegotiatedParams {
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 65_536,
        max_burst_length: 262_144,
        ..Default::default()
    };
    let mut p = Pair::with(TargetSessionConfig::new(4).luns([LUN0]), &params, 1, 1);
    let c = p.i.start_command(LUN0, &[0x2a], 0, 1 << 20).unwrap();
    let c = ScsiCommand { final_: false, ..c };
    p.t.handle_pdu(p.now, &Header::ScsiCommand(c), Bytes::new(), Bytes::new(), 8192);
    let Some(TargetEvent::Command { split, .. }) = p.t.poll_event() else { panic!("a command") };
    assert_eq!((split.immediate, split.unsolicited_end, split.len), (8192, 65_536, 1 << 20));
    let plan = p.t.plan_write(&c, split, 1 << 20);
    assert_eq!((plan.start, plan.end, plan.count()), (65_536, 1 << 20, 4));
    let second = p.t.plan_write(&c, split, 1 << 20);
    assert_eq!(second.first_ttt, plan.first_ttt + 4, "tags are not reused while the first plan's are live");
    assert!((0..4).all(|n| plan.nth(n).unwrap().ttt != RESERVED_TAG));
    assert_eq!(plan.nth(3).unwrap().len, (1 << 20) - 65_536 - 3 * 262_144);
}

#[test]
fn an_r2t_plan_is_stamped_with_the_current_numbers_without_consuming_stat_sn() {
    let mut p = Pair::new(4);
    let c = p.i.start_command(LUN0, &[0x2a], 0, 4096).unwrap();
    p.deliver_command(c);
    let split = riser_iscsi::session::WriteSplit { immediate: 0, unsolicited_end: 0, len: 4096 };
    let plan = p.t.plan_write(&c, split, 4096);
    assert_eq!((plan.stat_sn, plan.exp_cmd_sn, plan.max_cmd_sn), (100, 2, 4));
    assert_eq!(p.t.stat_sn(), 100);
}

#[test]
fn residuals_and_sense_reach_the_initiator() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 4096);
    let sense = [0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0];
    p.t.finish_command(p.task(itt), Status::CHECK_CONDITION, Some(&sense), Residual::Underflow(4096), 0);
    p.pump();
    assert_eq!(
        p.take_i_events(),
        vec![InitiatorEvent::CommandDone {
            itt,
            status: Status::CHECK_CONDITION,
            sense: Some(Bytes::copy_from_slice(&sense)),
            residual: Residual::Underflow(4096)
        }]
    );
}

#[test]
fn an_overflow_residual_crosses_intact() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 512);
    p.t.finish_command(p.task(itt), Status::GOOD, None, Residual::Overflow(1536), 0);
    p.pump();
    assert!(matches!(p.take_i_events()[..], [InitiatorEvent::CommandDone { residual: Residual::Overflow(1536), .. }]));
}

#[test]
fn a_status_taken_for_phase_collapse_consumes_stat_sn_and_frees_the_slot() {
    let mut p = Pair::new(1);
    let itt = p.command(LUN0, 512);
    let s = p.t.take_status(p.task(itt)).expect("the task is live");
    assert_eq!((s.stat_sn, s.exp_cmd_sn, s.max_cmd_sn), (100, 2, 2), "the window opened before the status is stamped");
    assert_eq!(p.t.stat_sn(), 101);
    assert!(p.t.take_status(p.task(itt)).is_none());
}

// --- task management --------------------------------------------------------------------

fn tmf_done(p: &mut Pair) -> (u32, Vec<u32>, Reset) {
    let ev = p.take_t_events();
    let Some(TargetEvent::TaskManagement { itt, aborted, reset }) =
        ev.into_iter().find(|e| matches!(e, TargetEvent::TaskManagement { .. }))
    else {
        panic!("no task management event")
    };
    (itt, aborted, reset)
}

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

// --- text, NOP, logout, rejects ---------------------------------------------------------

#[test]
fn a_ping_is_echoed_with_its_data() {
    let mut p = Pair::new(4);
    let itt = p.i.ping(Bytes::from_static(b"hello"));
    p.pump();
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::Pong { itt, data: Bytes::from_static(b"hello") }]);
}

#[test]
fn a_long_text_answer_comes_in_pieces_the_initiator_asks_for() {
    let params = NegotiatedParams { initiator_recv_data_segment_length: 512, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(4), &params, 1, 1);
    let itt = p.i.text(b"SendTargets=All\0".to_vec());
    p.pump();
    let Some(TargetEvent::Text { req, data }) = p.take_t_events().pop() else { panic!("a text request") };
    assert_eq!(&data[..], b"SendTargets=All\0");
    let answer: Vec<u8> = (0..2000u32).map(|i| b'a' + (i % 26) as u8).collect();
    p.t.answer_text(req, answer.clone());
    p.pump();
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::TextDone { itt, text: answer }]);
    let pieces = p.t_sent.iter().filter(|h| matches!(h, Header::TextResponse(_))).count();
    assert_eq!(pieces, 4, "2000 bytes in pieces of 512");
}

#[test]
fn a_continuation_naming_an_unknown_ttt_is_rejected() {
    let mut p = Pair::new(4);
    let bad = TextRequest { immediate: true, final_: true, itt: 9, ttt: 1234, ..TextRequest::default() };
    p.t.handle_pdu(p.now, &Header::TextRequest(bad), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert!(matches!(p.t_sent.last(), Some(Header::Reject(r)) if r.reason == RejectReason::INVALID_PDU_FIELD));
}

#[test]
fn a_new_text_request_abandons_an_answer_not_fetched() {
    let params = NegotiatedParams { initiator_recv_data_segment_length: 512, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(4), &params, 1, 1);
    let req = TextRequest { immediate: true, final_: true, itt: 3, ttt: RESERVED_TAG, ..TextRequest::default() };
    p.t.answer_text(req, vec![b'x'; 2000]);
    let Some(first) = p.t.poll_transmit() else { panic!() };
    let Header::TextResponse(r) = first.header else { panic!() };
    p.t.handle_pdu(p.now, &Header::TextRequest(TextRequest { itt: 4, ..req }), Bytes::new(), Bytes::new(), 0);
    let stale = TextRequest { itt: 3, ttt: r.ttt, ..req };
    p.t.handle_pdu(p.now, &Header::TextRequest(stale), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert!(matches!(p.t_sent.last(), Some(Header::Reject(j)) if j.reason == RejectReason::INVALID_PDU_FIELD));
}

#[test]
fn logout_aborts_what_is_left_and_closes_after_its_answer() {
    let mut p = Pair::new(4);
    let t = p.command(LUN0, 512);
    let itt = p.i.logout();
    p.pump();
    let ev = p.take_t_events();
    let Some(TargetEvent::Logout { req, aborted }) = ev.into_iter().find(|e| matches!(e, TargetEvent::Logout { .. })) else { panic!() };
    assert_eq!(aborted, vec![t]);
    p.t.answer_logout(&req);
    p.pump();
    assert!(p.take_i_events().contains(&InitiatorEvent::LoggedOut { itt }));
    assert_eq!(p.take_t_events(), vec![TargetEvent::Close(CloseReason::Logout)]);
}

#[test]
fn snack_and_login_in_full_feature_phase_are_protocol_errors() {
    let mut p = Pair::new(4);
    for h in [Header::Snack(Snack::default()), Header::LoginRequest(LoginRequest::default())] {
        p.t.handle_pdu(p.now, &h, Bytes::new(), Bytes::new(), 0);
        p.pump();
        assert!(matches!(p.t_sent.last(), Some(Header::Reject(r)) if r.reason == RejectReason::PROTOCOL_ERROR));
    }
}

#[test]
fn an_unknown_opcode_is_not_supported() {
    let mut p = Pair::new(4);
    let mut raw = [0u8; BHS_LEN];
    raw[0] = 0x1f;
    p.t.handle_pdu(p.now, &Header::Unknown(raw), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert!(matches!(p.t_sent.last(), Some(Header::Reject(r)) if r.reason == RejectReason::COMMAND_NOT_SUPPORTED));
}

#[test]
fn a_discovery_session_refuses_scsi_commands_and_task_management() {
    let params = NegotiatedParams { session_type: SessionType::Discovery, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(4), &params, 1, 1);
    p.deliver_command(ScsiCommand { cmd_sn: 1, itt: 2, ..ScsiCommand::default() });
    p.i.task_management(TmfFunction::ABORT_TASK_SET, LUN0, 0);
    p.pump();
    let rejects = p.t_sent.iter().filter(|h| matches!(h, Header::Reject(r) if r.reason == RejectReason::COMMAND_NOT_SUPPORTED)).count();
    assert_eq!(rejects, 2);
    assert!(p.commands_seen().is_empty());
}

#[test]
fn a_reject_ends_the_task_it_names_at_the_initiator() {
    let mut p = Pair::new(4);
    let bad = TextRequest { immediate: true, final_: true, ttt: 77, ..TextRequest::default() };
    let itt = p.i.text(Vec::new());
    // Replace the text request with a continuation of nothing (rejected, naming our ITT).
    let _ = p.i.poll_transmit();
    p.t.handle_pdu(p.now, &Header::TextRequest(TextRequest { itt, ..bad }), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::Rejected { itt, reason: RejectReason::INVALID_PDU_FIELD }]);
    assert!(!p.i.has_task(itt));
}

#[test]
fn a_malformed_header_is_rejected_or_closes_by_its_reaction() {
    let mut p = Pair::new(4);
    let mut bhs = [0u8; BHS_LEN];
    bhs[0] = 0x03;
    p.t.handle_malformed(p.now, bhs, DecodeError::InvalidField("login T and C both set"));
    p.pump();
    match p.t_sent.last() {
        Some(Header::Reject(r)) => assert_eq!(r.reason, RejectReason::INVALID_PDU_FIELD),
        other => panic!("{other:?}"),
    }
    assert!(!p.t.is_closed());
    p.t.handle_malformed(p.now, bhs, DecodeError::HeaderDigest);
    p.pump();
    assert_eq!(p.take_t_events(), vec![TargetEvent::Close(CloseReason::Malformed(DecodeError::HeaderDigest))]);
    p.t.handle_pdu(p.now, &Header::NopOut(NopOut { immediate: true, itt: 5, ..NopOut::default() }), Bytes::new(), Bytes::new(), 0);
    assert!(p.t.poll_transmit().is_none(), "nothing is answered once closed");
}

#[test]
fn an_unexpected_answer_is_reported_not_matched() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 512);
    let stray = riser_iscsi::wire::NopIn { itt, ttt: RESERVED_TAG, ..Default::default() };
    p.i.handle_pdu(&Header::NopIn(stray), Bytes::new());
    assert!(matches!(p.i.poll_event(), Some(InitiatorEvent::Unexpected(_))));
    assert!(p.i.has_task(itt), "the command is still waiting for its status");
}

// --- keepalive --------------------------------------------------------------------------

fn keepalive_pair() -> Pair {
    let cfg = TargetSessionConfig::new(4).keepalive(Some(Duration::from_secs(5)), Duration::from_secs(10));
    Pair::with(cfg, &NegotiatedParams::default(), 1, 1)
}

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

// --- more of the same, at the edges ---------------------------------------------------------

fn write_split_for(params: &NegotiatedParams, len: u32, imm: u32, final_: bool) -> riser_iscsi::session::WriteSplit {
    let mut p = Pair::with(TargetSessionConfig::new(4), params, 1, 1);
    let c = ScsiCommand { cmd_sn: 1, itt: 1, write: true, final_, expected_data_len: len, ..ScsiCommand::default() };
    p.t.handle_pdu(p.now, &Header::ScsiCommand(c), Bytes::new(), Bytes::new(), imm);
    match p.t.poll_event() {
        Some(TargetEvent::Command { split, .. }) => split,
        other => panic!("{other:?}"),
    }
}

#[test]
fn with_initial_r2t_a_command_announcing_unsolicited_data_expects_none() {
    let params = NegotiatedParams { initial_r2t: true, ..Default::default() };
    let s = write_split_for(&params, 1 << 20, 8192, false);
    assert_eq!((s.immediate, s.unsolicited_end, s.solicited()), (8192, 8192, (1 << 20) - 8192));
}

#[test]
fn without_immediate_data_the_unsolicited_burst_is_all_data_out() {
    let params = NegotiatedParams { immediate_data: false, initial_r2t: false, first_burst_length: 16_384, ..Default::default() };
    let s = write_split_for(&params, 100_000, 0, false);
    assert_eq!((s.immediate, s.unsolicited_end), (0, 16_384));
}

#[test]
fn a_write_shorter_than_first_burst_is_all_unsolicited() {
    let params = NegotiatedParams { initial_r2t: false, ..Default::default() };
    let s = write_split_for(&params, 4096, 4096, true);
    assert_eq!((s.unsolicited_end, s.solicited()), (4096, 0));
}

#[test]
fn a_plan_with_nothing_to_solicit_still_takes_a_unique_tag() {
    let mut p = Pair::new(4);
    let c = p.i.start_command(LUN0, &[0x2a], 0, 512).unwrap();
    p.deliver_command(c);
    let split = riser_iscsi::session::WriteSplit { immediate: 512, unsolicited_end: 512, len: 512 };
    let a = p.t.plan_write(&c, split, 512);
    let b = p.t.plan_write(&c, split, 512);
    assert_eq!((a.count(), a.nth(0)), (0, None));
    assert_ne!(a.first_ttt, b.first_ttt);
}

#[test]
fn a_non_immediate_nop_out_consumes_its_cmd_sn() {
    let mut p = Pair::new(4);
    let nop = NopOut { immediate: false, itt: 9, ttt: RESERVED_TAG, cmd_sn: 1, ..NopOut::default() };
    p.t.handle_pdu(p.now, &Header::NopOut(nop), Bytes::new(), Bytes::new(), 0);
    assert_eq!(p.t.window().0, 2);
    // The same CmdSN again is a duplicate: no second answer.
    p.t.handle_pdu(p.now, &Header::NopOut(nop), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert_eq!(p.t_sent.iter().filter(|h| matches!(h, Header::NopIn(_))).count(), 1);
}

#[test]
fn non_immediate_text_and_task_management_outside_the_window_are_ignored() {
    let mut p = Pair::new(2);
    let text = TextRequest { immediate: false, final_: true, itt: 3, ttt: RESERVED_TAG, cmd_sn: 50, ..TextRequest::default() };
    p.t.handle_pdu(p.now, &Header::TextRequest(text), Bytes::new(), Bytes::new(), 0);
    let tmf =
        riser_iscsi::wire::TaskMgmtRequest { immediate: false, function: TmfFunction::ABORT_TASK_SET, cmd_sn: 50, ..Default::default() };
    p.t.handle_pdu(p.now, &Header::TaskMgmtRequest(tmf), Bytes::new(), Bytes::new(), 0);
    p.pump();
    assert!(p.take_t_events().is_empty());
    assert!(p.t_sent.is_empty());
}

#[test]
fn a_non_immediate_logout_is_taken_even_outside_the_window() {
    let mut p = Pair::new(2);
    let l = riser_iscsi::wire::LogoutRequest { immediate: false, itt: 4, cmd_sn: 77, ..Default::default() };
    p.t.handle_pdu(p.now, &Header::LogoutRequest(l), Bytes::new(), Bytes::new(), 0);
    assert!(matches!(p.t.poll_event(), Some(TargetEvent::Logout { .. })));
}

#[test]
fn immediate_requests_leave_the_initiators_cmd_sn_where_it_was() {
    let mut p = Pair::new(4);
    let before = p.i.window().cmd_sn();
    p.i.ping(Bytes::new());
    p.i.text(Vec::new());
    p.i.task_management(TmfFunction::ABORT_TASK_SET, LUN0, 0);
    assert_eq!(p.i.window().cmd_sn(), before);
    p.pump();
    assert_eq!(p.t.window().0, before, "nor the target's ExpCmdSN");
}

#[test]
fn many_commands_finished_in_scrambled_order_keep_the_window_exact() {
    let mut p = Pair::new(16);
    let mut live: Vec<u32> = Vec::new();
    let mut seed = 0x9e37_79b9u32;
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        seed
    };
    for _ in 0..2000 {
        if p.i.window().is_open() && next() % 3 != 0 {
            live.push(p.command(lun((next() % 2) as u16), 512));
        } else if !live.is_empty() {
            let i = next() as usize % live.len();
            let itt = live.swap_remove(i);
            assert!(p.finish(itt));
        }
        let (exp, max) = p.t.window();
        assert_eq!(p.t.tasks(), live.len());
        assert_eq!(max.wrapping_sub(exp).wrapping_add(1) as usize + live.len(), 16, "window room + held = depth");
    }
    let sns = p.stat_sns();
    assert!(sns.windows(2).all(|w| w[1] == w[0].wrapping_add(1)), "StatSN consecutive");
}

#[test]
fn data_in_without_status_leaves_the_command_waiting() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 4096);
    let d = riser_iscsi::wire::DataIn { itt, stat_sn: 0, exp_cmd_sn: 2, max_cmd_sn: 4, ..Default::default() };
    p.i.handle_pdu(&Header::DataIn(d), Bytes::new());
    assert!(p.i.has_task(itt));
    let last = riser_iscsi::wire::DataIn { status_present: true, final_: true, underflow: true, residual: 100, stat_sn: 100, ..d };
    p.i.handle_pdu(&Header::DataIn(last), Bytes::new());
    assert_eq!(
        p.i.poll_event(),
        Some(InitiatorEvent::CommandDone { itt, status: Status::GOOD, sense: None, residual: Residual::Underflow(100) })
    );
    assert_eq!(p.i.window().exp_stat_sn(), 101);
}

#[test]
fn a_command_over_the_immediate_allowance_is_rejected_to_its_initiator() {
    let cfg = TargetSessionConfig::new(4).max_immediate_commands(0);
    let mut p = Pair::with(cfg, &NegotiatedParams::default(), 1, 1);
    let c = p.i.start_command(LUN0, &[0], 0, 0).unwrap();
    p.deliver_command(ScsiCommand { immediate: true, ..c });
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::Rejected { itt: c.itt, reason: RejectReason::IMMEDIATE_COMMAND_REJECTED }]);
}

#[test]
fn abort_task_names_its_task_by_tag_whatever_the_lun() {
    let mut p = Pair::new(4);
    let t = p.command(lun(1), 512);
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK, lun(0), t);
    p.pump();
    let (_, aborted, _) = tmf_done(&mut p);
    assert_eq!(aborted, vec![t]);
    p.t.complete_task_management(tmf);
    p.pump();
    assert!(p.take_i_events().contains(&InitiatorEvent::Aborted { itt: t }));
}

#[test]
fn a_closed_session_ignores_everything_and_sets_no_timer() {
    let mut p = keepalive_pair();
    p.t.handle_malformed(p.now, [0; BHS_LEN], DecodeError::BadAhsLength);
    assert_eq!(p.t.poll_event(), Some(TargetEvent::Close(CloseReason::Malformed(DecodeError::BadAhsLength))));
    assert_eq!(p.t.poll_timeout(), None);
    p.t.handle_timeout(Duration::from_secs(100));
    p.t.handle_malformed(p.now, [0; BHS_LEN], DecodeError::InvalidField("x"));
    p.command(LUN0, 0);
    assert!(p.t.poll_event().is_none() && p.t.poll_transmit().is_none());
}

#[test]
fn two_pings_in_flight_get_their_own_answers() {
    let mut p = Pair::new(4);
    let a = p.i.ping(Bytes::from_static(b"a"));
    let b = p.i.ping(Bytes::from_static(b"bb"));
    p.pump();
    let ev = p.take_i_events();
    assert!(ev.contains(&InitiatorEvent::Pong { itt: a, data: Bytes::from_static(b"a") }));
    assert!(ev.contains(&InitiatorEvent::Pong { itt: b, data: Bytes::from_static(b"bb") }));
    assert_ne!(a, b);
}

#[test]
fn a_text_answer_of_exactly_one_segment_is_one_final_pdu() {
    let params = NegotiatedParams { initiator_recv_data_segment_length: 512, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(4), &params, 1, 1);
    let itt = p.i.text(Vec::new());
    p.pump();
    let Some(TargetEvent::Text { req, .. }) = p.take_t_events().pop() else { panic!() };
    p.t.answer_text(req, vec![b'k'; 512]);
    p.pump();
    assert!(matches!(p.t_sent[..], [Header::TextResponse(r)] if r.final_ && !r.cont && r.ttt == RESERVED_TAG));
    assert!(matches!(&p.take_i_events()[..], [InitiatorEvent::TextDone { itt: i, text }] if *i == itt && text.len() == 512));
}

#[test]
fn stat_sn_is_consumed_by_rejects_too() {
    let mut p = Pair::new(4);
    p.t.handle_pdu(p.now, &Header::Snack(Snack::default()), Bytes::new(), Bytes::new(), 0);
    let itt = p.command(LUN0, 0);
    p.finish(itt);
    assert_eq!(p.stat_sns(), vec![100, 101]);
}

// --- found by fuzz/fuzz_targets/session_pair.rs -----------------------------------------

#[test]
fn non_immediate_requests_that_hold_no_task_give_their_window_slot_back() {
    // A non-immediate NOP-Out, text request or task management request takes a CmdSN; it used
    // to keep its slot for ever, so `depth` of them closed the window for good.
    let mut p = Pair::new(2);
    let mut sn = 1;
    for round in 0..4u32 {
        let nop = Header::NopOut(NopOut { immediate: false, itt: 0x10 + round, ttt: RESERVED_TAG, cmd_sn: sn, ..NopOut::default() });
        let text = Header::TextRequest(TextRequest {
            final_: true,
            itt: 0x20 + round,
            ttt: RESERVED_TAG,
            cmd_sn: sn + 1,
            ..TextRequest::default()
        });
        let tmf = Header::TaskMgmtRequest(riser_iscsi::wire::TaskMgmtRequest {
            function: TmfFunction::CLEAR_ACA,
            itt: 0x30 + round,
            ref_task_tag: RESERVED_TAG,
            cmd_sn: sn + 2,
            ..Default::default()
        });
        for h in [nop, text, tmf] {
            p.t.handle_pdu(p.now, &h, Bytes::new(), Bytes::new(), 0);
        }
        sn += 3;
        assert_eq!(p.t.window(), (sn, sn + 1), "round {round}: ExpCmdSN past them, the window still 2 wide");
    }
    let answered =
        std::iter::from_fn(|| p.t.poll_event()).filter(|e| matches!(e, TargetEvent::Text { .. } | TargetEvent::TaskManagement { .. }));
    assert_eq!(answered.count(), 8, "none of them was dropped as outside the window");
}

#[test]
fn a_discovery_session_consumes_the_cmd_sn_of_a_refused_command_and_discards_it() {
    let params = NegotiatedParams { session_type: SessionType::Discovery, ..Default::default() };
    let mut p = Pair::with(TargetSessionConfig::new(1), &params, 1, 1);
    let c = p.i.start_command(LUN0, &[0], 512, 0).unwrap();
    p.deliver_command(c);
    assert_eq!(p.take_t_events(), vec![TargetEvent::Discard { itt: c.itt }], "the datamover frees the command's buffers");
    assert_eq!(p.take_i_events(), vec![InitiatorEvent::Rejected { itt: c.itt, reason: RejectReason::COMMAND_NOT_SUPPORTED }]);
    assert_eq!(p.t.window(), (2, 2), "its CmdSN counts as received and its slot is free");
    assert_eq!((p.i.window().cmd_sn(), p.i.window().max_cmd_sn()), (2, 2), "the initiator may go on");
    // The text request that follows, non-immediate, is in the window (it used to be dropped).
    let text = TextRequest { final_: true, itt: 9, ttt: RESERVED_TAG, cmd_sn: 2, ..TextRequest::default() };
    p.t.handle_pdu(p.now, &Header::TextRequest(text), Bytes::new(), Bytes::new(), 0);
    assert!(matches!(p.t.poll_event(), Some(TargetEvent::Text { .. })));
}

#[test]
fn nothing_is_sent_once_the_session_closed() {
    let mut p = keepalive_pair();
    let a = p.command(LUN0, 512);
    let b = p.command(LUN0, 512);
    let tmf = p.i.task_management(TmfFunction::CLEAR_ACA, LUN0, 0);
    p.i.text(b"k=v\0".to_vec());
    p.pump();
    let Some(TargetEvent::Text { req, .. }) = p.t_events.iter().rev().find(|e| matches!(e, TargetEvent::Text { .. })).cloned() else {
        panic!("a text request")
    };
    // The ping goes unanswered: the connection is given up.
    p.t.handle_timeout(Duration::from_secs(5));
    assert!(matches!(p.t.poll_transmit(), Some(Transmit { header: Header::NopIn(_), .. })));
    p.t.handle_timeout(Duration::from_secs(15));
    assert_eq!(p.t.poll_event(), Some(TargetEvent::Close(CloseReason::Unresponsive)));
    let stat_sn = p.t.stat_sn();
    // The application finishes what it had in hand; none of it goes out.
    assert!(!p.t.finish_command(p.task(a), Status::GOOD, None, Residual::None, 0));
    assert_eq!(p.t.take_status(p.task(b)), None);
    p.t.complete_task_management(tmf);
    p.t.answer_text(req, b"x".to_vec());
    assert_eq!(p.t.poll_transmit(), None);
    assert_eq!(p.t.stat_sn(), stat_sn, "no StatSN taken");
    assert_eq!(p.t.tasks(), 0, "the tasks ended all the same");
}

#[test]
fn task_management_leaves_alone_a_command_sent_after_it() {
    // In order on one connection: ABORT TASK SET, then a command on the same LU. The target
    // handles the function before the command arrives, so the command runs to its status; the
    // initiator used to count it aborted when the function's answer came.
    let mut p = Pair::new(4);
    let tmf = p.i.task_management(TmfFunction::ABORT_TASK_SET, LUN0, 0);
    p.pump();
    let (_, aborted, _) = tmf_done(&mut p);
    assert!(aborted.is_empty());
    let later = p.command(LUN0, 512);
    p.t.complete_task_management(tmf);
    p.pump();
    let ev = p.take_i_events();
    assert!(ev.contains(&InitiatorEvent::TaskManagementDone { itt: tmf, response: TmfResponse::COMPLETE }));
    assert!(!ev.contains(&InitiatorEvent::Aborted { itt: later }));
    assert!(p.finish(later));
    assert_eq!(
        p.take_i_events(),
        vec![InitiatorEvent::CommandDone { itt: later, status: Status::GOOD, sense: None, residual: Residual::None }]
    );
}
