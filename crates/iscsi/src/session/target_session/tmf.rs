//! Task management in [`TargetSession`] (RFC 7143 §11.5.1, §4.2.3): which tasks a function
//! ends, when it may act, and its answer once the driver has done what it asked.
//!
//! - ABORT TASK ends the task its Referenced Task Tag names. If no such task exists but its
//!   RefCmdSN lies in the window, before the request's own CmdSN and not received yet, that
//!   CmdSN counts as received (the command, should it still come, is dropped) and the answer
//!   is Function complete; otherwise Task does not exist.
//! - ABORT TASK SET and CLEAR TASK SET act on the LU's commands numbered before the request,
//!   only once all of them have arrived (a request ahead of a CmdSN gap waits for it to close;
//!   at most `max_immediate_commands` wait, more are answered Function rejected). Commands
//!   numbered after the request are not touched.
//! - LOGICAL UNIT RESET and TARGET WARM/COLD RESET end every task of the LU (of the session),
//!   whatever its CmdSN, as the RFC allows. The other sessions' tasks on the LU end too (SAM-5
//!   §6.3.3: every task set of the unit), without a response (TAS is 0):
//!   [`TargetSession::end_tasks_reset_elsewhere`], which their drivers call.

use super::{Reset, TargetEvent, TargetSession, Task};
use crate::serial::SerialNumber;
use crate::wire::{Header, TaskMgmtRequest, TaskMgmtResponse, TmfFunction, TmfResponse};
use alloc::collections::BTreeMap;
use alloc::vec::Vec;
use bytes::Bytes;
use riser_scsi::lun::Lun;

/// The session's task management requests between arrival and answer.
#[derive(Debug, Default)]
pub(super) struct Tmfs {
    /// Acted on; answered once the driver calls `complete_task_management`.
    answering: BTreeMap<u32, Answer>,
    /// Task-set functions waiting for the commands numbered before them, in arrival order.
    waiting: Vec<TaskMgmtRequest>,
}

#[derive(Clone, Copy, Debug)]
struct Answer {
    response: TmfResponse,
    cold: bool,
}

impl TargetSession {
    fn has_lun(&self, lun: Lun) -> bool {
        lun.number().is_some_and(|n| self.cfg.luns.iter().any(|l| l.number() == Some(n)))
    }

    /// Whether every CmdSN before `cmd_sn` has arrived. A CmdSN beyond the window's end (where
    /// no command can be waiting) counts as all arrived, so nothing waits forever on it.
    fn all_received_before(&self, cmd_sn: u32) -> bool {
        let (exp, max) = (SerialNumber(self.window.exp_cmd_sn()), SerialNumber(self.window.max_cmd_sn()));
        let sn = SerialNumber(cmd_sn);
        !(sn.gt(exp) && sn.le(max.add(1)))
    }

    pub(super) fn task_management(&mut self, t: TaskMgmtRequest) {
        let task_set = matches!(t.function, TmfFunction::ABORT_TASK_SET | TmfFunction::CLEAR_TASK_SET);
        if task_set && self.has_lun(t.lun) && !self.all_received_before(t.cmd_sn) {
            if self.tmfs.waiting.len() < self.cfg.max_immediate_commands as usize {
                self.tmfs.waiting.push(t);
            } else {
                self.answer_now(t, TmfResponse::REJECTED);
            }
            return;
        }
        self.act(t);
    }

    /// Run the task-set functions whose commands have all arrived (after a PDU moved ExpCmdSN).
    pub(super) fn run_waiting_task_management(&mut self) {
        while let Some(i) = self.tmfs.waiting.iter().position(|t| self.all_received_before(t.cmd_sn)) {
            let t = self.tmfs.waiting.remove(i);
            self.act(t);
        }
    }

    fn act(&mut self, t: TaskMgmtRequest) {
        let mut aborted = Vec::new();
        let mut reset = Reset::None;
        let before = |task: &Task| SerialNumber(task.cmd_sn).lt(SerialNumber(t.cmd_sn));
        let response = match t.function {
            TmfFunction::ABORT_TASK => {
                if self.end_task(t.ref_task_tag) {
                    aborted.push(t.ref_task_tag);
                    TmfResponse::COMPLETE
                } else if self.window.not_yet_received(t.ref_cmd_sn) && SerialNumber(t.ref_cmd_sn).lt(SerialNumber(t.cmd_sn)) {
                    // Not arrived yet: it counts as received, so it will not run when it comes.
                    self.admit_request(t.ref_cmd_sn);
                    TmfResponse::COMPLETE
                } else {
                    TmfResponse::TASK_DOES_NOT_EXIST
                }
            }
            TmfFunction::ABORT_TASK_SET | TmfFunction::CLEAR_TASK_SET if self.has_lun(t.lun) => {
                aborted = self.abort_where(|task| task.lun == t.lun && before(task));
                TmfResponse::COMPLETE
            }
            TmfFunction::LOGICAL_UNIT_RESET if self.has_lun(t.lun) => {
                aborted = self.abort_where(|task| task.lun == t.lun);
                reset = Reset::Unit(t.lun);
                TmfResponse::COMPLETE
            }
            TmfFunction::ABORT_TASK_SET | TmfFunction::CLEAR_TASK_SET | TmfFunction::LOGICAL_UNIT_RESET => TmfResponse::LUN_DOES_NOT_EXIST,
            TmfFunction::TARGET_WARM_RESET | TmfFunction::TARGET_COLD_RESET => {
                aborted = self.abort_where(|_| true);
                reset = Reset::Target;
                TmfResponse::COMPLETE
            }
            TmfFunction::TASK_REASSIGN => TmfResponse::REASSIGNMENT_NOT_SUPPORTED,
            TmfFunction::CLEAR_ACA => TmfResponse::NOT_SUPPORTED,
            _ => TmfResponse::REJECTED,
        };
        let cold = t.function == TmfFunction::TARGET_COLD_RESET;
        self.tmfs.answering.insert(t.itt, Answer { response, cold });
        self.events.push_back(TargetEvent::TaskManagement { itt: t.itt, aborted, reset });
    }

    /// Another session reset the unit this session sees as `lun` (a LOGICAL UNIT RESET, or a
    /// target reset): this session's tasks there end without a response (the control mode
    /// page's TAS is 0, SAM-5 §6.3.3), their slots free. Returns their tags, for the driver
    /// to stop what they were doing; their initiator learns of the reset from the unit
    /// attention, and an ABORT TASK for one of them finds no task.
    pub fn end_tasks_reset_elsewhere(&mut self, lun: Lun) -> Vec<u32> {
        match lun.number() {
            Some(n) => self.abort_where(|task| task.lun.number() == Some(n)),
            None => Vec::new(),
        }
    }

    /// Answer at once, having done nothing.
    fn answer_now(&mut self, t: TaskMgmtRequest, response: TmfResponse) {
        self.tmfs.answering.insert(t.itt, Answer { response, cold: false });
        self.complete_task_management(t.itt);
    }

    /// The aborted tasks' backend I/O is over and the resets are done: answer task management
    /// request `itt` (no aborted write can land after the answer).
    pub fn complete_task_management(&mut self, itt: u32) {
        let Some(Answer { response, cold }) = self.tmfs.answering.remove(&itt) else { return };
        self.respond(Header::TaskMgmtResponse(TaskMgmtResponse { response, itt, ..TaskMgmtResponse::default() }), Bytes::new(), true);
        if cold {
            self.close(super::CloseReason::ColdReset);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{TargetSessionConfig, Transmit};
    use super::*;
    use crate::keys::NegotiatedParams;
    use crate::wire::ScsiCommand;
    use core::time::Duration;

    const LUN1: Lun = Lun([0, 1, 0, 0, 0, 0, 0, 0]);

    /// A session expecting CmdSN 10 with a window of 8, on LUNs 0 and 1.
    fn session(max_immediate: u32) -> TargetSession {
        let cfg = TargetSessionConfig::new(8).max_immediate_commands(max_immediate).luns([Lun::ZERO, LUN1]);
        TargetSession::with_params(cfg, &NegotiatedParams::default(), 10, 100, Duration::ZERO)
    }

    fn command(s: &mut TargetSession, itt: u32, cmd_sn: u32, lun: Lun) {
        let c = ScsiCommand { final_: true, read: true, lun, itt, expected_data_len: 512, cmd_sn, ..ScsiCommand::default() };
        s.handle_pdu(Duration::ZERO, &Header::ScsiCommand(c), Bytes::new(), Bytes::new(), 0);
    }

    /// An immediate task management request, as initiators send them.
    fn tmf(s: &mut TargetSession, function: TmfFunction, itt: u32, cmd_sn: u32, lun: Lun, ref_itt: u32, ref_cmd_sn: u32) {
        let t = TaskMgmtRequest {
            immediate: true,
            function,
            lun,
            itt,
            ref_task_tag: ref_itt,
            cmd_sn,
            ref_cmd_sn,
            ..TaskMgmtRequest::default()
        };
        s.handle_pdu(Duration::ZERO, &Header::TaskMgmtRequest(t), Bytes::new(), Bytes::new(), 0);
    }

    /// Task management requests acted on: (itt, the tasks they aborted).
    type Acted = Vec<(u32, Vec<u32>)>;

    /// The events so far, as (commands run, commands discarded, task management acted on).
    fn events(s: &mut TargetSession) -> (Vec<u32>, Vec<u32>, Acted) {
        let (mut run, mut discarded, mut tmfs) = (Vec::new(), Vec::new(), Vec::new());
        while let Some(e) = s.poll_event() {
            match e {
                TargetEvent::Command { task, .. } => run.push(task.itt),
                TargetEvent::Discard { itt } => discarded.push(itt),
                TargetEvent::TaskManagement { itt, aborted, .. } => tmfs.push((itt, aborted)),
                other => panic!("unexpected {other:?}"),
            }
        }
        (run, discarded, tmfs)
    }

    /// The answers sent so far to task management requests.
    fn answers(s: &mut TargetSession) -> Vec<(u32, TmfResponse)> {
        core::iter::from_fn(|| s.poll_transmit())
            .filter_map(|Transmit { header, .. }| match header {
                Header::TaskMgmtResponse(r) => Some((r.itt, r.response)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn abort_task_of_a_command_not_arrived_yet_counts_it_received_and_it_never_runs() {
        let mut s = session(16);
        command(&mut s, 1, 10, Lun::ZERO);
        // Command 2 (CmdSN 11) is still on its way when the initiator aborts it.
        tmf(&mut s, TmfFunction::ABORT_TASK, 90, 12, Lun::ZERO, 2, 11);
        assert_eq!(events(&mut s), (vec![1], vec![], vec![(90, vec![])]));
        s.complete_task_management(90);
        assert_eq!(answers(&mut s), [(90, TmfResponse::COMPLETE)]);
        assert_eq!(s.window().0, 12, "CmdSN 11 counts as received");
        command(&mut s, 2, 11, Lun::ZERO);
        assert_eq!(events(&mut s), (vec![], vec![2], vec![]), "the aborted command must not run");
        // Its slot was given back when it was counted: the window still holds 8.
        assert_eq!(s.window(), (12, 18));
    }

    #[test]
    fn abort_task_naming_a_cmdsn_not_before_its_own_says_the_task_does_not_exist() {
        let mut s = session(16);
        tmf(&mut s, TmfFunction::ABORT_TASK, 90, 10, Lun::ZERO, 2, 10);
        tmf(&mut s, TmfFunction::ABORT_TASK, 91, 10, Lun::ZERO, 3, 13);
        s.complete_task_management(90);
        s.complete_task_management(91);
        assert_eq!(answers(&mut s), [(90, TmfResponse::TASK_DOES_NOT_EXIST), (91, TmfResponse::TASK_DOES_NOT_EXIST)]);
        // Nothing was counted as received: command 10 still runs.
        command(&mut s, 2, 10, Lun::ZERO);
        assert_eq!(events(&mut s).0, [2]);
    }

    #[test]
    fn abort_task_set_ends_the_commands_before_it_and_spares_those_after() {
        let mut s = session(16);
        command(&mut s, 1, 10, Lun::ZERO);
        command(&mut s, 2, 11, LUN1);
        command(&mut s, 3, 12, Lun::ZERO); // numbered after the request below
        tmf(&mut s, TmfFunction::ABORT_TASK_SET, 90, 12, Lun::ZERO, 0, 0);
        assert_eq!(events(&mut s), (vec![1, 2, 3], vec![], vec![(90, vec![1])]));
        assert!(s.has_task(2) && s.has_task(3));
    }

    /// Another session's reset of a unit ends this session's tasks there (whatever their
    /// CmdSN), answers nothing, and frees their window slots; an ABORT TASK for one of them
    /// then finds no task.
    #[test]
    fn a_reset_by_another_session_ends_the_units_tasks_silently() {
        let mut s = session(16);
        command(&mut s, 1, 10, Lun::ZERO);
        command(&mut s, 2, 11, LUN1);
        command(&mut s, 3, 12, Lun::ZERO);
        let _ = events(&mut s);
        let max_before = s.window.max_cmd_sn();
        assert_eq!(s.end_tasks_reset_elsewhere(Lun::ZERO), vec![1, 3]);
        assert!(!s.has_task(1) && s.has_task(2) && !s.has_task(3));
        assert_eq!(s.window.max_cmd_sn(), max_before.wrapping_add(2), "the ended tasks' slots are free");
        assert!(answers(&mut s).is_empty(), "no response for the ended tasks");
        tmf(&mut s, TmfFunction::ABORT_TASK, 90, 13, Lun::ZERO, 1, 10);
        assert_eq!(events(&mut s), (vec![], vec![], vec![(90, vec![])]));
        s.complete_task_management(90);
        assert_eq!(answers(&mut s), vec![(90, TmfResponse::TASK_DOES_NOT_EXIST)]);
        assert!(s.end_tasks_reset_elsewhere(Lun::ZERO).is_empty());
    }

    #[test]
    fn abort_task_set_waits_for_the_commands_numbered_before_it() {
        let mut s = session(16);
        command(&mut s, 1, 10, Lun::ZERO);
        // CmdSN 11 is late; the request (CmdSN 12) must cover it.
        tmf(&mut s, TmfFunction::CLEAR_TASK_SET, 90, 12, Lun::ZERO, 0, 0);
        assert_eq!(events(&mut s), (vec![1], vec![], vec![]), "acted before all its commands arrived");
        command(&mut s, 2, 11, Lun::ZERO);
        assert_eq!(events(&mut s), (vec![2], vec![], vec![(90, vec![1, 2])]));
        s.complete_task_management(90);
        assert_eq!(answers(&mut s), [(90, TmfResponse::COMPLETE)]);
    }

    #[test]
    fn waiting_task_set_functions_are_bounded() {
        let mut s = session(1);
        tmf(&mut s, TmfFunction::ABORT_TASK_SET, 90, 12, Lun::ZERO, 0, 0);
        tmf(&mut s, TmfFunction::ABORT_TASK_SET, 91, 12, Lun::ZERO, 0, 0);
        assert_eq!(answers(&mut s), [(91, TmfResponse::REJECTED)]);
        // A CmdSN beyond the window never waits.
        tmf(&mut s, TmfFunction::ABORT_TASK_SET, 92, 1000, Lun::ZERO, 0, 0);
        assert_eq!(events(&mut s).2, [(92, vec![])]);
    }
}
