//! Both full-feature session machines (`riser_iscsi::session`) against each other, with the
//! input read as a script of operations: the initiator starts commands, pings, task management
//! (unknown functions included), text and logout; a "network" of two queues (initiator → target,
//! target → initiator) delivers any queued PDU, drops or duplicates one; the target application
//! finishes, drops or phase-collapses live tasks, answers text, task management and logout, and
//! plans writes; the clock runs the keepalive; raw 48-byte headers reach either side.
//!
//! Whatever happens: no panic; the target's StatSNs are consecutive, its ExpCmdSN and MaxCmdSN
//! never move back and ExpCmdSN ≤ MaxCmdSN + 1; it never holds more tasks than the window and the
//! immediate allowance; a task ends at most once (finish_command / take_status succeed exactly
//! while the task is live); after it closes it sends nothing; an initiator task gets at most one
//! terminal event; every SCSI command the open target receives is taken or discarded. At the
//! end everything is delivered and answered: if every CmdSN the initiator took reached the target,
//! the target holds no task and its window is whole again; if moreover nothing was lost,
//! duplicated or given up, the initiator is idle too and agrees on every number. Delivered in
//! order, the initiator is never surprised by an answer.
//!
//! Input: 10 bytes of configuration (queue depth mod 9; flags: 0..=1 immediate allowance, 0x04
//! keepalive, 0x18 both set a discovery session, 0x20 a 512-byte initiator receive limit, 0x40 no
//! ImmediateData, 0x80 InitialR2T; first CmdSN and StatSN, big-endian), then at most [`MAX_OPS`]
//! operations, an opcode byte (mod 21) and its arguments, missing bytes reading as zero:
//! 0–1 command, 2 ping, 3 task management, 4 text, 5 logout, 6–7 deliver to the target, 8–9
//! deliver to the initiator, 10 duplicate or drop, 11 finish, 12 drop task, 13 take status (phase
//! collapse), 14 answer text, 15 complete task management, 16 answer logout, 17 plan a write
//! (R2Ts), 18 clock, 19 raw header to either side, 20 a request from outside the initiator
//! session. `cargo xtask fuzz-seeds` writes scripts in this encoding.
#![no_main]
use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use riser_iscsi::keys::{NegotiatedParams, Role, SessionType};
use riser_iscsi::serial::SerialNumber;
use riser_iscsi::session::{
    InitiatorEvent, InitiatorSession, Residual, TargetEvent, TargetSession, TargetSessionConfig, TaskId, WriteSplit,
};
use riser_iscsi::wire::{
    BHS_LEN, Bhs, DataIn, DecodeError, Header, LogoutRequest, NopOut, R2t, RESERVED_TAG, ScsiCommand, TaskMgmtRequest, TextRequest,
    TmfFunction,
};
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;
use std::collections::{HashSet, VecDeque};
use std::time::Duration;

const MAX_OPS: usize = 512;
/// Tags of commands the harness sends on its own (never the initiator session's).
const FOREIGN_ITT: u32 = 0x4000_0000;

/// `SESSION_PAIR_TRACE=1` prints each operation and each PDU delivered (to read a crash).
fn trace() -> bool {
    static T: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *T.get_or_init(|| std::env::var_os("SESSION_PAIR_TRACE").is_some())
}

struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }
    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }
    fn bhs(&mut self) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        let n = self.0.len().min(BHS_LEN);
        b[..n].copy_from_slice(&self.0[..n]);
        self.0 = &self.0[n..];
        b
    }
}

/// A PDU on the wire: for a SCSI command, `immediate` bytes of write data ride with it.
#[derive(Clone)]
struct Wire {
    header: Header,
    data: Bytes,
    immediate: u32,
}

fn lun(n: u8) -> Lun {
    Lun::from_number(u16::from(n)).unwrap_or(Lun::ZERO)
}

fn serial_le(a: u32, b: u32) -> bool {
    SerialNumber(a).le(SerialNumber(b))
}

struct Live {
    task: TaskId,
    cmd: ScsiCommand,
    split: WriteSplit,
}

struct Pair {
    t: TargetSession,
    i: InitiatorSession,
    now: Duration,
    depth: u32,
    max_immediate: u32,
    discovery: bool,
    ilimits: riser_iscsi::session::TransferLimits,
    to_t: VecDeque<Wire>,
    to_i: VecDeque<Wire>,
    // What the target application knows.
    live: Vec<Live>,
    ended: Vec<TaskId>,
    texts: Vec<TextRequest>,
    tmfs: Vec<u32>,
    logouts: Vec<LogoutRequest>,
    closed: bool,
    // What the target has sent so far.
    next_stat_sn: u32,
    last_window: (u32, u32),
    // The initiator's tasks.
    issued: Vec<u32>,
    issued_set: HashSet<u32>,
    terminated: HashSet<u32>,
    next_foreign: u32,
    /// SCSI commands delivered to the open target and not yet taken or discarded (the
    /// datamover frees a command's buffers on one or the other).
    commands_unanswered: u32,
    /// The initiator heard only what the target sent.
    honest: bool,
    /// Every CmdSN the initiator took reaches the target (nothing dropped on the way there,
    /// nothing forged): once all is delivered and answered, the target's window is whole.
    gapless: bool,
    /// Moreover nothing was dropped or duplicated either way and the target application gave up
    /// no task: the initiator then ends up idle too, agreeing on every number.
    lossless: bool,
    /// Every delivery took the oldest PDU, and nothing foreign was sent.
    in_order: bool,
}

impl Pair {
    fn new(r: &mut Input) -> Self {
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

    fn issue(&mut self, itt: u32) {
        assert!(self.issued_set.insert(itt), "the initiator reused live or ended tag {itt:#x}");
        self.issued.push(itt);
    }

    fn foreign_itt(&mut self) -> u32 {
        self.next_foreign += 1;
        self.next_foreign
    }

    fn command_answered(&mut self) {
        self.commands_unanswered = self.commands_unanswered.checked_sub(1).expect("a Command or Discard event for no command received");
    }

    fn is_live(&self, task: TaskId) -> bool {
        self.live.iter().any(|l| l.task == task)
    }

    fn end_live(&mut self, task: TaskId) {
        if let Some(k) = self.live.iter().position(|l| l.task == task) {
            self.live.swap_remove(k);
            self.ended.push(task);
        }
    }

    fn end_aborted(&mut self, itts: &[u32]) {
        for itt in itts {
            let k = self.live.iter().position(|l| l.task.itt == *itt).expect("aborted a task the session did not hold");
            let l = self.live.swap_remove(k);
            self.ended.push(l.task);
        }
    }

    /// A task to act on: a live one, or (high bit) one that already ended.
    fn pick_task(&self, sel: u8) -> Option<TaskId> {
        if sel & 0x80 != 0 && !self.ended.is_empty() {
            Some(self.ended[usize::from(sel & 0x7f) % self.ended.len()])
        } else if !self.live.is_empty() {
            Some(self.live[usize::from(sel) % self.live.len()].task)
        } else {
            None
        }
    }

    /// A PDU leaves the target: check its numbers, then put it on the wire.
    fn target_sends(&mut self, header: Header, data: Bytes) {
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
    fn drain(&mut self, was_closed: bool) {
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
            let itt = match e {
                InitiatorEvent::CommandDone { itt, .. }
                | InitiatorEvent::Aborted { itt }
                | InitiatorEvent::Pong { itt, .. }
                | InitiatorEvent::TaskManagementDone { itt, .. }
                | InitiatorEvent::TextDone { itt, .. }
                | InitiatorEvent::LoggedOut { itt }
                | InitiatorEvent::Rejected { itt, .. } => itt,
                InitiatorEvent::Unexpected(h) => {
                    assert!(!self.in_order, "delivered in order, the initiator did not expect {h:?}");
                    continue;
                }
                _ => continue,
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

    fn deliver_to_target(&mut self, w: Wire) {
        self.target_handles(&w.header, w.data, w.immediate);
    }

    fn target_handles(&mut self, header: &Header, data: Bytes, immediate: u32) {
        if trace() {
            eprintln!("  -> target {header:?}");
        }
        if matches!(header, Header::ScsiCommand(_)) && !self.t.is_closed() {
            self.commands_unanswered += 1;
        }
        self.t.handle_pdu(self.now, header, Bytes::new(), data, immediate);
    }

    fn deliver_to_initiator(&mut self, w: Wire) {
        if trace() {
            eprintln!("  -> initiator {:?}", w.header);
        }
        self.i.handle_pdu(&w.header, w.data);
    }

    fn take(q: &mut VecDeque<Wire>, sel: u8, in_order: &mut bool) -> Option<Wire> {
        if q.is_empty() {
            return None;
        }
        let k = usize::from(sel) % q.len();
        if k != 0 {
            *in_order = false;
        }
        q.remove(k)
    }

    fn start_command(&mut self, r: &mut Input) {
        let b = r.u8();
        let len = u32::from(r.u16()) << (b >> 5);
        let (read, write) = match (b >> 2) & 3 {
            0 => (0, 0),
            1 => (len, 0),
            2 => (0, len),
            _ => (len, len / 2),
        };
        let Ok(mut c) = self.i.start_command(lun(b & 3), &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], read, write) else { return };
        self.issue(c.itt);
        // As a datamover sends it: immediate data and the F bit by the write's split.
        let split = self.ilimits.outgoing_write(write, b & 0x10 == 0);
        c.final_ = split.command_is_final();
        self.to_t.push_back(Wire { header: Header::ScsiCommand(c), data: Bytes::new(), immediate: split.immediate });
    }

    /// A non-immediate request numbered by the initiator session but sent by someone else
    /// (the CmdSN it took is used, so the target's window has no gap).
    fn foreign_numbered(&mut self, r: &mut Input) {
        let b = r.u8();
        let Ok(c) = self.i.start_command(Lun::ZERO, &[0], 0, 0) else { return };
        self.i.forget(c.itt);
        let itt = self.foreign_itt();
        let (cmd_sn, exp_stat_sn) = (c.cmd_sn, c.exp_stat_sn);
        let header = match b % 3 {
            0 => Header::NopOut(NopOut { immediate: false, lun: Lun::ZERO, itt, ttt: RESERVED_TAG, cmd_sn, exp_stat_sn }),
            1 => Header::TextRequest(TextRequest {
                immediate: false,
                final_: true,
                itt,
                ttt: RESERVED_TAG,
                cmd_sn,
                exp_stat_sn,
                ..Default::default()
            }),
            // Functions that abort nothing, so the initiator's tasks stay its own.
            _ => Header::TaskMgmtRequest(TaskMgmtRequest {
                immediate: false,
                function: [TmfFunction::CLEAR_ACA, TmfFunction::TASK_REASSIGN, TmfFunction(0x55)][usize::from(b >> 2) % 3],
                lun: Lun::ZERO,
                itt,
                ref_task_tag: RESERVED_TAG,
                cmd_sn,
                exp_stat_sn,
                ref_cmd_sn: cmd_sn,
                exp_data_sn: 0,
            }),
        };
        self.in_order = false;
        self.to_t.push_back(Wire { header, data: Bytes::new(), immediate: 0 });
    }

    fn foreign_immediate_command(&mut self, r: &mut Input) {
        let b = r.u8();
        let itt = self.foreign_itt();
        let c = ScsiCommand {
            immediate: true,
            final_: true,
            read: true,
            lun: lun(b & 3),
            itt,
            expected_data_len: u32::from(b) * 512,
            cmd_sn: self.i.window().cmd_sn(),
            exp_stat_sn: self.i.window().exp_stat_sn(),
            ..ScsiCommand::default()
        };
        self.in_order = false;
        self.to_t.push_back(Wire { header: Header::ScsiCommand(c), data: Bytes::new(), immediate: 0 });
    }

    fn finish(&mut self, r: &mut Input) {
        let sel = r.u8();
        let b = r.u8();
        let amount = u32::from(r.u16());
        let Some(task) = self.pick_task(sel) else { return };
        let status = [Status::GOOD, Status::CHECK_CONDITION, Status(0x08), Status(b)][usize::from(b & 3)];
        let residual = match (b >> 2) & 3 {
            0 | 1 => Residual::None,
            2 => Residual::Underflow(amount),
            _ => Residual::Overflow(amount),
        };
        let sense: Vec<u8> = vec![0x70; usize::from(b >> 4)];
        let live = self.is_live(task);
        let closed = self.t.is_closed();
        let sent = self.t.finish_command(task, status, (b & 0x10 != 0).then_some(&sense[..]), residual, 0);
        assert_eq!(sent, live && !closed, "finish_command of {task:?} (live: {live}, closed: {closed})");
        // A live task ends, answered or not.
        self.end_live(task);
    }

    fn take_status(&mut self, r: &mut Input) {
        let sel = r.u8();
        let b = r.u8();
        let Some(task) = self.pick_task(sel) else { return };
        let live = self.is_live(task);
        let closed = self.t.is_closed();
        let stamp = self.t.take_status(task);
        assert_eq!(stamp.is_some(), live && !closed, "take_status of {task:?} (live: {live}, closed: {closed})");
        self.end_live(task);
        let Some(s) = stamp else { return };
        let header = if b & 1 == 0 {
            // Phase collapse: the last Data-In carries the status.
            Header::DataIn(DataIn {
                final_: true,
                status_present: true,
                status: Status::GOOD,
                itt: task.itt,
                ttt: RESERVED_TAG,
                stat_sn: s.stat_sn,
                exp_cmd_sn: s.exp_cmd_sn,
                max_cmd_sn: s.max_cmd_sn,
                ..DataIn::default()
            })
        } else {
            // The collapse did not happen: a SCSI Response with the stamp taken.
            TargetSession::scsi_response(task.itt, Status::GOOD, None, Residual::None, 1, s).header
        };
        self.target_sends(header, Bytes::new());
    }

    fn plan_write(&mut self, r: &mut Input) {
        let sel = r.u8();
        let end = u32::from(r.u16()) << 4;
        let n = r.u8() % 5;
        if self.live.is_empty() || self.t.is_closed() {
            return;
        }
        let l = &self.live[usize::from(sel) % self.live.len()];
        let (cmd, split) = (l.cmd, l.split);
        let plan = self.t.plan_write(&cmd, split, end);
        assert_eq!(plan.start, split.unsolicited_end);
        assert!(plan.end >= plan.start);
        let mut covered = 0u64;
        for k in 0..plan.count() {
            let d = plan.nth(k).expect("an R2T the plan counts");
            assert!(d.len > 0 && d.len <= plan.max_burst.max(512) && d.offset >= plan.start && d.offset + d.len <= plan.end);
            covered += u64::from(d.len);
            if k < u32::from(n) {
                let h = R2t {
                    lun: d.lun,
                    itt: d.itt,
                    ttt: d.ttt,
                    stat_sn: d.stat_sn,
                    exp_cmd_sn: d.exp_cmd_sn,
                    max_cmd_sn: d.max_cmd_sn,
                    r2t_sn: d.r2t_sn,
                    buffer_offset: d.offset,
                    desired_len: d.len,
                };
                self.target_sends(Header::R2t(h), Bytes::new());
            }
        }
        assert!(plan.nth(plan.count()).is_none());
        assert_eq!(covered, u64::from(plan.end - plan.start), "the R2Ts do not cover the solicited range");
    }

    fn raw_to_target(&mut self, r: &mut Input) {
        let b = r.u8();
        let mut raw = r.bhs();
        let data = Bytes::from(vec![0x61; usize::from(r.u8() % 64)]);
        let immediate = u32::from(r.u16());
        if b & 1 != 0 {
            // Steer the opcode to the initiator's, and the CmdSN into the window.
            const OPS: [u8; 8] = [0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x10];
            raw[0] = (raw[0] & 0x40) | OPS[usize::from(b >> 1) & 7];
            let cmd_sn = self.t.window().0.wrapping_add(u32::from(raw[24] & 3));
            raw[24..28].copy_from_slice(&cmd_sn.to_be_bytes());
        }
        self.gapless = false;
        self.lossless = false;
        self.in_order = false;
        if b & 0x80 != 0 {
            let errors = [
                DecodeError::InvalidField("fuzz"),
                DecodeError::HeaderDigest,
                DecodeError::DataDigest,
                DecodeError::BadAhsLength,
                DecodeError::Truncated { need: 48, have: 47 },
                DecodeError::DataSegmentTooLong { len: 1 << 20, max: 8192 },
            ];
            self.t.handle_malformed(self.now, raw, errors[usize::from(b >> 4) % errors.len()]);
            return;
        }
        match Header::parse(&Bhs::new_unchecked(&raw[..])) {
            Ok(h) => self.target_handles(&h, data, immediate),
            Err(e) => self.t.handle_malformed(self.now, raw, e),
        }
    }

    fn raw_to_initiator(&mut self, r: &mut Input) {
        let b = r.u8();
        let mut raw = r.bhs();
        let data_len = usize::from(r.u8() % 80);
        if b & 1 != 0 {
            const OPS: [u8; 9] = [0x20, 0x21, 0x22, 0x24, 0x25, 0x26, 0x31, 0x32, 0x3f];
            raw[0] = OPS[usize::from(b >> 1) % OPS.len()];
            if !self.issued.is_empty() {
                let itt = self.issued[usize::from(raw[16]) % self.issued.len()];
                raw[16..20].copy_from_slice(&itt.to_be_bytes());
            }
        }
        // A Reject's data is the rejected header: let it name one of the initiator's tags.
        let mut data = vec![0u8; data_len];
        if data_len >= BHS_LEN && !self.issued.is_empty() {
            let itt = self.issued[usize::from(b) % self.issued.len()];
            data[16..20].copy_from_slice(&itt.to_be_bytes());
        }
        // A forged MaxCmdSN sends the initiator beyond the window: CmdSNs the target discards.
        self.honest = false;
        self.gapless = false;
        self.lossless = false;
        self.in_order = false;
        if let Ok(h) = Header::parse(&Bhs::new_unchecked(&raw[..])) {
            self.i.handle_pdu(&h, Bytes::from(data));
        }
    }

    fn op(&mut self, r: &mut Input) {
        let op = r.u8() % 21;
        if trace() {
            eprintln!("op {op:2} next bytes {:02x?}", &r.0[..r.0.len().min(8)]);
        }
        match op {
            0 | 1 => self.start_command(r),
            2 => {
                let n = usize::from(r.u8() % 64);
                let itt = self.i.ping(Bytes::from(vec![0x70; n]));
                self.issue(itt);
            }
            3 => {
                let f = r.u8();
                let function = if f & 0x80 == 0 { TmfFunction(f % 10) } else { TmfFunction(f & 0x7f) };
                let l = r.u8();
                let ref_itt =
                    if l & 0x80 != 0 || self.issued.is_empty() { r.u32() } else { self.issued[usize::from(r.u8()) % self.issued.len()] };
                let itt = self.i.task_management(function, lun(l & 3), ref_itt);
                self.issue(itt);
            }
            4 => {
                let n = usize::from(r.u8());
                let itt = self.i.text(vec![b'k'; n]);
                self.issue(itt);
            }
            5 => {
                if r.u8() < 32 {
                    let itt = self.i.logout();
                    self.issue(itt);
                }
            }
            6 | 7 => {
                let sel = r.u8();
                let k = usize::from(sel) % self.to_t.len().max(1);
                if self.to_t.get(k).is_some_and(|w| matches!(w.header, Header::ScsiCommand(_)))
                    && self.to_t.range(..k).any(|w| matches!(w.header, Header::TaskMgmtRequest(_)))
                {
                    // A command overtakes a task management request sent before it (impossible on
                    // one TCP connection): the target may abort a command its initiator knows
                    // was sent after the function, which then waits for it forever.
                    self.lossless = false;
                }
                if self.to_t.get(k).is_some_and(|w| matches!(w.header, Header::TaskMgmtRequest(t) if t.function == TmfFunction::ABORT_TASK))
                    && self.to_t.range(..k).any(|w| matches!(w.header, Header::ScsiCommand(_)))
                {
                    // An ABORT TASK overtakes a command sent before it (impossible too): for a
                    // task its initiator no longer holds, RefCmdSN names the last command sent,
                    // which the target then counts as received and never runs (RFC 7143 §11.5.1).
                    self.lossless = false;
                }
                if let Some(w) = Self::take(&mut self.to_t, sel, &mut self.in_order) {
                    self.deliver_to_target(w);
                }
            }
            8 | 9 => {
                let sel = r.u8();
                if let Some(w) = Self::take(&mut self.to_i, sel, &mut self.in_order) {
                    self.deliver_to_initiator(w);
                }
            }
            10 => {
                // The network duplicates or drops a PDU.
                let b = r.u8();
                let sel = usize::from(r.u8());
                let q = if b & 1 == 0 { &mut self.to_t } else { &mut self.to_i };
                if !q.is_empty() {
                    let k = sel % q.len();
                    if b & 2 == 0 {
                        let w = q[k].clone();
                        q.push_back(w);
                    } else {
                        q.remove(k);
                        if b & 1 == 0 {
                            self.gapless = false;
                        }
                    }
                    self.lossless = false;
                    self.in_order = false;
                }
            }
            11 => self.finish(r),
            12 => {
                if let Some(task) = self.pick_task(r.u8()) {
                    if self.is_live(task) {
                        // Its initiator waits for an answer that never comes.
                        self.lossless = false;
                    }
                    self.t.drop_task(task);
                    self.end_live(task);
                }
            }
            13 => self.take_status(r),
            14 => {
                let sel = usize::from(r.u8());
                let len = usize::from(r.u16() % 3000);
                if !self.texts.is_empty() {
                    let req = self.texts.remove(sel % self.texts.len());
                    self.t.answer_text(req, vec![b'v'; len]);
                }
            }
            15 => {
                let sel = r.u8();
                if sel & 0x80 != 0 || self.tmfs.is_empty() {
                    let itt = r.u32();
                    self.t.complete_task_management(itt);
                    self.tmfs.retain(|t| *t != itt);
                } else {
                    let itt = self.tmfs.remove(usize::from(sel) % self.tmfs.len());
                    self.t.complete_task_management(itt);
                }
            }
            16 => {
                let sel = usize::from(r.u8());
                if !self.logouts.is_empty() {
                    let req = self.logouts.remove(sel % self.logouts.len());
                    self.t.answer_logout(&req);
                }
            }
            17 => self.plan_write(r),
            18 => {
                let b = r.u8();
                match b & 3 {
                    0 => self.now += Duration::from_millis(u64::from(b >> 2) * 50),
                    1 => self.now += Duration::from_secs(u64::from(b >> 2)),
                    2 => {
                        if let Some(at) = self.t.poll_timeout() {
                            self.now = self.now.max(at);
                        }
                    }
                    _ => {}
                }
                self.t.handle_timeout(self.now);
            }
            19 => {
                if r.u8() & 1 == 0 {
                    self.raw_to_target(r);
                } else {
                    self.raw_to_initiator(r);
                }
            }
            _ => {
                if r.u8() & 1 == 0 {
                    self.foreign_numbered(r);
                } else {
                    self.foreign_immediate_command(r);
                }
            }
        }
    }

    /// Deliver everything and answer everything until both sides are quiet.
    fn settle(&mut self) {
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

fuzz_target!(|data: &[u8]| {
    let mut r = Input(data);
    let mut p = Pair::new(&mut r);
    for _ in 0..MAX_OPS {
        if r.0.is_empty() {
            break;
        }
        let was_closed = p.t.is_closed();
        p.op(&mut r);
        p.drain(was_closed);
    }
    if p.gapless {
        p.settle();
    }
});
