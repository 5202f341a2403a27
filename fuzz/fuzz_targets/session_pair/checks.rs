//! The invariants: every PDU the target sends and every event of both machines is checked as
//! the harness takes it, and at the end everything is delivered and answered.

use crate::model::{Live, Pair, Wire, serial_le};
use bytes::Bytes;
use riser_iscsi::session::{InitiatorEvent, Residual, TargetEvent};
use riser_iscsi::wire::{Header, RESERVED_TAG};
use riser_scsi::sense::Status;

impl Pair {
    /// A PDU leaves the target: check its numbers, then put it on the wire.
    pub(crate) fn target_sends(&mut self, header: Header, data: Bytes) {
        let (stat_sn, exp, max, consumes) = match header {
            Header::ScsiResponse(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn, true),
            Header::TaskMgmtResponse(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn, true),
            Header::TextResponse(h) => {
                assert_eq!(h.final_, h.ttt == RESERVED_TAG, "a text answer continues exactly when it names a TTT");
                (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn, true)
            }
            Header::LogoutResponse(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn, true),
            Header::Reject(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn, true),
            Header::NopIn(h) => {
                if h.itt == RESERVED_TAG {
                    assert_ne!(h.ttt, RESERVED_TAG, "a ping names a TTT");
                }
                (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn, h.itt != RESERVED_TAG)
            }
            Header::DataIn(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn, h.status_present),
            Header::R2t(h) => {
                assert_ne!(h.ttt, RESERVED_TAG, "an R2T names a TTT");
                (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn, false)
            }
            other => panic!("the target sent an initiator PDU: {other:?}"),
        };
        assert_eq!(stat_sn, self.next_stat_sn, "StatSN out of sequence in {header:?}");
        if consumes {
            self.next_stat_sn = self.next_stat_sn.wrapping_add(1);
        }
        self.check_window(exp, max);
        self.to_i.push_back(Wire { header, data, immediate: 0 });
    }

    fn check_window(&mut self, exp: u32, max: u32) {
        assert!(serial_le(exp, max.wrapping_add(1)), "ExpCmdSN {exp} beyond MaxCmdSN {max} + 1");
        let (last_exp, last_max) = self.last_window;
        assert!(serial_le(last_exp, exp), "ExpCmdSN moved back: {last_exp} -> {exp}");
        assert!(serial_le(last_max, max), "MaxCmdSN moved back: {last_max} -> {max}");
        self.last_window = (exp, max);
    }

    /// Move what both machines produced into the harness (after every operation).
    pub(crate) fn drain(&mut self, was_closed: bool) {
        while let Some(e) = self.t.poll_event() {
            match e {
                TargetEvent::Command { task, cmd, split, .. } => {
                    self.command_answered();
                    assert!(!self.discovery, "a discovery session ran a SCSI command");
                    assert!(!self.is_live(task) && !self.ended.contains(&task), "task {task:?} registered twice");
                    assert!(!self.live.iter().any(|l| l.task.itt == task.itt), "two live tasks with tag {:#x}", task.itt);
                    assert!(split.immediate <= split.unsolicited_end);
                    self.live.push(Live { task, cmd, split });
                    let immediate = self.live.iter().filter(|l| l.cmd.immediate).count() as u32;
                    let windowed = self.live.len() as u32 - immediate;
                    assert!(windowed <= self.depth, "{windowed} tasks in a window of {}", self.depth);
                    assert!(immediate <= self.max_immediate, "{immediate} immediate tasks, allowance {}", self.max_immediate);
                }
                TargetEvent::Discard { .. } => self.command_answered(),
                TargetEvent::TaskManagement { itt, aborted, .. } => {
                    self.end_aborted(&aborted);
                    self.tmfs.push(itt);
                }
                TargetEvent::Text { req, .. } => self.texts.push(req),
                TargetEvent::Logout { req, aborted } => {
                    self.end_aborted(&aborted);
                    self.logouts.push(req);
                }
                TargetEvent::Close(_) => {
                    assert!(!self.closed, "closed twice");
                    self.closed = true;
                }
                _ => {}
            }
        }
        assert_eq!(self.commands_unanswered, 0, "a SCSI command was neither taken nor discarded");
        while let Some(p) = self.t.poll_transmit() {
            assert!(!was_closed, "the target sent {:?} after it closed", p.header);
            self.target_sends(p.header, p.data);
        }
        assert_eq!(self.t.stat_sn(), self.next_stat_sn, "StatSN consumed without a PDU carrying it");
        assert_eq!(self.t.is_closed(), self.closed);
        if self.closed {
            assert_eq!(self.t.poll_timeout(), None, "a timer runs after the close");
        }
        let (exp, max) = self.t.window();
        self.check_window(exp, max);
        assert_eq!(self.t.tasks(), self.live.len(), "the target's task table and its Command events disagree");
        for l in &self.live {
            assert!(self.t.has_task(l.task.itt));
        }
        while let Some(e) = self.i.poll_event() {
            let itt = match (e.itt(), e) {
                (Some(itt), _) => itt,
                (None, InitiatorEvent::Unexpected(h)) => {
                    assert!(!self.in_order, "delivered in order, the initiator did not expect {h:?}");
                    continue;
                }
                (None, _) => continue,
            };
            assert!(self.issued_set.contains(&itt), "an event for tag {itt:#x} the initiator never used");
            assert!(self.terminated.insert(itt), "task {itt:#x} ended twice at the initiator");
        }
        while let Some(p) = self.i.poll_transmit() {
            assert!(p.header.opcode().is_initiator(), "the initiator sent {:?}", p.header);
            self.to_t.push_back(Wire { header: p.header, data: p.data, immediate: 0 });
        }
        assert_eq!(self.i.tasks(), self.issued.len() - self.terminated.len(), "initiator tasks leaked or vanished");
        let w = self.i.window();
        if self.honest {
            // (A forged MaxCmdSN can move the initiator's window by up to 2^31 at a time.)
            assert!(serial_le(w.cmd_sn(), w.max_cmd_sn().wrapping_add(1)), "the initiator went beyond the window");
            assert!(serial_le(w.max_cmd_sn(), max), "the initiator believes in a window the target never opened");
            assert!(serial_le(w.exp_stat_sn(), self.next_stat_sn), "ExpStatSN ahead of StatSN");
        }
    }

    /// Deliver everything and answer everything until both sides are quiet.
    pub(crate) fn settle(&mut self) {
        for _ in 0..64 {
            while let Some(w) = self.to_t.pop_front() {
                self.deliver_to_target(w);
            }
            self.drain(false);
            if self.closed {
                // The driver tears the connection down: the application answers nothing more.
                return;
            }
            while let Some(l) = self.live.first() {
                let task = l.task;
                assert!(self.t.finish_command(task, Status::GOOD, None, Residual::None, 0), "a live task would not finish");
                self.end_live(task);
            }
            for req in std::mem::take(&mut self.texts) {
                self.t.answer_text(req, b"k=v\0".to_vec());
            }
            for itt in std::mem::take(&mut self.tmfs) {
                self.t.complete_task_management(itt);
            }
            for req in std::mem::take(&mut self.logouts) {
                self.t.answer_logout(&req);
            }
            self.drain(false);
            let was_closed = self.t.is_closed();
            while let Some(w) = self.to_i.pop_front() {
                self.deliver_to_initiator(w);
            }
            self.drain(was_closed);
            if self.to_t.is_empty() && self.to_i.is_empty() {
                break;
            }
        }
        if self.closed || !self.to_t.is_empty() {
            return;
        }
        // Every task ended: the window is whole again and every CmdSN taken arrived.
        assert_eq!(self.t.tasks(), 0);
        let (exp, max) = self.t.window();
        assert_eq!(max.wrapping_sub(exp).wrapping_add(1), self.depth, "the window lost slots: ExpCmdSN {exp}, MaxCmdSN {max}");
        let w = self.i.window();
        assert_eq!(w.cmd_sn(), exp, "a CmdSN the initiator took never counted at the target");
        if !self.lossless {
            return;
        }
        // And the initiator heard it all: both sides agree on the numbers.
        assert_eq!((w.cmd_sn(), w.max_cmd_sn(), w.exp_stat_sn()), (exp, max, self.t.stat_sn()), "the initiator's numbers");
        assert_eq!(self.i.tasks(), 0, "initiator tasks still waiting: {:?}", self.i);
    }
}
