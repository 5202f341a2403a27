//! The pair and what the harness knows of it: the two machines, the wire between them, the
//! target application's tasks and requests, the numbers sent, and the initiator's tags.

use crate::input::{Input, lun};
use bytes::Bytes;
use riser_iscsi::keys::{NegotiatedParams, Role, SessionType};
use riser_iscsi::serial::SerialNumber;
use riser_iscsi::session::{InitiatorSession, TargetSession, TargetSessionConfig, TaskId, WriteSplit};
use riser_iscsi::wire::{Header, LogoutRequest, ScsiCommand, TextRequest};
use std::collections::{HashSet, VecDeque};
use std::time::Duration;

/// Tags of commands the harness sends on its own (never the initiator session's).
pub(crate) const FOREIGN_ITT: u32 = 0x4000_0000;

/// A PDU on the wire: for a SCSI command, `immediate` bytes of write data ride with it.
#[derive(Clone)]
pub(crate) struct Wire {
    pub(crate) header: Header,
    pub(crate) data: Bytes,
    pub(crate) immediate: u32,
}

pub(crate) fn serial_le(a: u32, b: u32) -> bool {
    SerialNumber(a).le(SerialNumber(b))
}

pub(crate) struct Live {
    pub(crate) task: TaskId,
    pub(crate) cmd: ScsiCommand,
    pub(crate) split: WriteSplit,
}

pub(crate) struct Pair {
    pub(crate) t: TargetSession,
    pub(crate) i: InitiatorSession,
    pub(crate) now: Duration,
    pub(crate) depth: u32,
    pub(crate) max_immediate: u32,
    pub(crate) discovery: bool,
    pub(crate) ilimits: riser_iscsi::session::TransferLimits,
    pub(crate) to_t: VecDeque<Wire>,
    pub(crate) to_i: VecDeque<Wire>,
    // What the target application knows.
    pub(crate) live: Vec<Live>,
    pub(crate) ended: Vec<TaskId>,
    pub(crate) texts: Vec<TextRequest>,
    pub(crate) tmfs: Vec<u32>,
    pub(crate) logouts: Vec<LogoutRequest>,
    pub(crate) closed: bool,
    // What the target has sent so far.
    pub(crate) next_stat_sn: u32,
    pub(crate) last_window: (u32, u32),
    // The initiator's tasks.
    pub(crate) issued: Vec<u32>,
    pub(crate) issued_set: HashSet<u32>,
    pub(crate) terminated: HashSet<u32>,
    pub(crate) next_foreign: u32,
    /// SCSI commands delivered to the open target and not yet taken or discarded (the
    /// datamover frees a command's buffers on one or the other).
    pub(crate) commands_unanswered: u32,
    /// The initiator heard only what the target sent.
    pub(crate) honest: bool,
    /// Every CmdSN the initiator took reaches the target (nothing dropped on the way there,
    /// nothing forged): once all is delivered and answered, the target's window is whole.
    pub(crate) gapless: bool,
    /// Moreover nothing was dropped or duplicated either way and the target application gave up
    /// no task: the initiator then ends up idle too, agreeing on every number.
    pub(crate) lossless: bool,
    /// Every delivery took the oldest PDU, and nothing foreign was sent.
    pub(crate) in_order: bool,
}

impl Pair {
    pub(crate) fn new(r: &mut Input) -> Self {
        let depth = u32::from(r.u8() % 9);
        let b = r.u8();
        let max_immediate = u32::from(b & 3);
        let discovery = b & 0x18 == 0x18;
        let params = NegotiatedParams {
            session_type: if discovery { SessionType::Discovery } else { SessionType::Normal },
            initiator_recv_data_segment_length: if b & 0x20 != 0 { 512 } else { 8192 },
            immediate_data: b & 0x40 == 0,
            initial_r2t: b & 0x80 != 0,
            first_burst_length: 16_384,
            max_burst_length: 32_768,
            ..NegotiatedParams::default()
        };
        let cmd_sn = r.u32();
        let stat_sn = r.u32();
        let mut cfg = TargetSessionConfig::new(depth).max_immediate_commands(max_immediate).luns([lun(0), lun(1)]);
        if b & 4 != 0 {
            cfg = cfg.keepalive(Some(Duration::from_secs(5)), Duration::from_secs(10));
        }
        let t = TargetSession::with_params(cfg, &params, cmd_sn, stat_sn, Duration::ZERO);
        let i = InitiatorSession::with_numbers(cmd_sn, cmd_sn.wrapping_add(depth.max(1) - 1), stat_sn);
        let last_window = t.window();
        Self {
            t,
            i,
            now: Duration::ZERO,
            depth: depth.max(1),
            max_immediate,
            discovery,
            ilimits: params.transfer_limits(Role::Initiator),
            to_t: VecDeque::new(),
            to_i: VecDeque::new(),
            live: Vec::new(),
            ended: Vec::new(),
            texts: Vec::new(),
            tmfs: Vec::new(),
            logouts: Vec::new(),
            closed: false,
            next_stat_sn: stat_sn,
            last_window,
            issued: Vec::new(),
            issued_set: HashSet::new(),
            terminated: HashSet::new(),
            next_foreign: FOREIGN_ITT,
            commands_unanswered: 0,
            honest: true,
            gapless: true,
            lossless: true,
            in_order: true,
        }
    }

    pub(crate) fn issue(&mut self, itt: u32) {
        assert!(self.issued_set.insert(itt), "the initiator reused live or ended tag {itt:#x}");
        self.issued.push(itt);
    }

    pub(crate) fn foreign_itt(&mut self) -> u32 {
        self.next_foreign += 1;
        self.next_foreign
    }

    pub(crate) fn command_answered(&mut self) {
        self.commands_unanswered = self.commands_unanswered.checked_sub(1).expect("a Command or Discard event for no command received");
    }

    pub(crate) fn is_live(&self, task: TaskId) -> bool {
        self.live.iter().any(|l| l.task == task)
    }

    pub(crate) fn end_live(&mut self, task: TaskId) {
        if let Some(k) = self.live.iter().position(|l| l.task == task) {
            self.live.swap_remove(k);
            self.ended.push(task);
        }
    }

    pub(crate) fn end_aborted(&mut self, itts: &[u32]) {
        for itt in itts {
            let k = self.live.iter().position(|l| l.task.itt == *itt).expect("aborted a task the session did not hold");
            let l = self.live.swap_remove(k);
            self.ended.push(l.task);
        }
    }

    /// A task to act on: a live one, or (high bit) one that already ended.
    pub(crate) fn pick_task(&self, sel: u8) -> Option<TaskId> {
        if sel & 0x80 != 0 && !self.ended.is_empty() {
            Some(self.ended[usize::from(sel & 0x7f) % self.ended.len()])
        } else if !self.live.is_empty() {
            Some(self.live[usize::from(sel) % self.live.len()].task)
        } else {
            None
        }
    }
}
