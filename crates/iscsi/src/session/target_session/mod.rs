//! [`TargetSession`]: the target's side of the full feature phase, sans IO.
//!
//! It owns what RFC 7143 asks a target to keep per session: the CmdSN window (sliding as
//! commands end), StatSN, the immediate commands' allowance, the task table, Target Transfer
//! Tags and R2T plans, the immediate/unsolicited split of each write, text continuation, the
//! NOP-In keepalive and the bookkeeping of task management. The driver (`riser-target`'s
//! server) owns the rest: the datamover, the logical units, spawning and aborting work.
//!
//! Call contract, as the login machines: feed [`TargetSession::handle_pdu`],
//! [`TargetSession::handle_malformed`] and [`TargetSession::handle_timeout`]; tell it what
//! the application did ([`TargetSession::finish_command`], [`TargetSession::answer_text`], …);
//! then drain [`TargetSession::poll_transmit`] (PDUs to send, in order, StatSN already stamped),
//! [`TargetSession::poll_event`] and [`TargetSession::poll_timeout`].

use super::residual::Residual;
use super::transfer::{R2tPlan, TransferLimits, WriteSplit};
use super::window::CommandWindow;

mod tmf;
use crate::keys::{NegotiatedParams, Role, SessionType};
use crate::login::LoginOutcome;
use crate::wire::{
    AsyncEvent, AsyncMessage, BHS_LEN, DecodeError, Header, LogoutRequest, LogoutResponse, LogoutResponseCode, NopIn, RESERVED_TAG,
    Reaction, Reject, RejectReason, ScsiCommand, ScsiResponse, TextRequest, TextResponse,
};
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use bytes::Bytes;
use core::time::Duration;
use hashbrown::HashMap;
use hashbrown::hash_map::Entry;
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

/// What a target session is allowed to hold, and how it keeps the connection alive.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TargetSessionConfig {
    /// Commands in the CmdSN window (the login announced MaxCmdSN = ExpCmdSN + this − 1).
    pub queue_depth: u32,
    /// Immediate SCSI commands in flight beyond the window; more get an Immediate Command
    /// Reject (RFC 7143 §11.17.1). Also the most task-set functions (ABORT/CLEAR TASK SET)
    /// waiting for commands numbered before them; more are answered Function rejected.
    pub max_immediate_commands: u32,
    /// Idle time after which a NOP-In ping is sent; `None`: never.
    pub nop_interval: Option<Duration>,
    /// How long a ping may go unanswered before the connection is given up.
    pub nop_timeout: Duration,
    /// The logical units of the session's target (task management names them).
    pub luns: Vec<Lun>,
}

impl TargetSessionConfig {
    /// Defaults: a window of `queue_depth`, 16 immediate commands, no keepalive, no LUNs.
    pub fn new(queue_depth: u32) -> Self {
        Self { queue_depth, max_immediate_commands: 16, nop_interval: None, nop_timeout: Duration::from_secs(30), luns: Vec::new() }
    }

    /// Immediate commands allowed beyond the window.
    #[must_use]
    pub fn max_immediate_commands(mut self, n: u32) -> Self {
        self.max_immediate_commands = n;
        self
    }

    /// Ping after `interval` of silence; give up after `timeout` without an answer.
    #[must_use]
    pub fn keepalive(mut self, interval: Option<Duration>, timeout: Duration) -> Self {
        self.nop_interval = interval;
        self.nop_timeout = timeout;
        self
    }

    /// The target's logical units.
    #[must_use]
    pub fn luns(mut self, luns: impl IntoIterator<Item = Lun>) -> Self {
        self.luns = luns.into_iter().collect();
        self
    }
}

/// A PDU to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Transmit {
    /// Header, StatSN, ExpCmdSN and MaxCmdSN stamped.
    pub header: Header,
    /// Data segment.
    pub data: Bytes,
}

/// What a task management function asks of the logical units beyond aborting tasks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reset {
    /// Nothing more.
    None,
    /// Reset this logical unit (LOGICAL UNIT RESET).
    Unit(Lun),
    /// Reset every logical unit (TARGET WARM/COLD RESET).
    Target,
}

/// What the driver must do.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TargetEvent {
    /// Run a SCSI command. Its task is registered and holds a slot of the window (or of the
    /// immediate allowance) until [`TargetSession::finish_command`] or
    /// [`TargetSession::drop_task`].
    Command {
        /// The task: name it to finish or drop the command.
        task: TaskId,
        /// The command.
        cmd: ScsiCommand,
        /// Additional header segments (an extended CDB).
        ahs: Bytes,
        /// How its write data travels (immediate, unsolicited, solicited).
        split: WriteSplit,
    },
    /// A command the session did not take (outside the window, over the immediate
    /// allowance, duplicate tag): free what the datamover holds for it.
    Discard {
        /// Its task tag.
        itt: u32,
    },
    /// Task management: abort these tasks (they are no longer the session's), wait until
    /// their backend I/O is over, reset as asked, then call
    /// [`TargetSession::complete_task_management`].
    TaskManagement {
        /// The request's task tag.
        itt: u32,
        /// The tasks aborted.
        aborted: Vec<u32>,
        /// Resets to do.
        reset: Reset,
    },
    /// A text request to answer with [`TargetSession::answer_text`].
    Text {
        /// The request.
        req: TextRequest,
        /// Its text.
        data: Bytes,
    },
    /// Logout: abort these tasks, release the nexus, wait for backend I/O, then call
    /// [`TargetSession::answer_logout`].
    Logout {
        /// The request.
        req: LogoutRequest,
        /// The tasks aborted.
        aborted: Vec<u32>,
    },
    /// The connection must end: a ping went unanswered, a PDU lost the framing, or a
    /// TARGET COLD RESET was answered.
    Close(CloseReason),
}

/// Why the session closes the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CloseReason {
    /// A NOP-In ping went unanswered for the configured timeout.
    Unresponsive,
    /// A malformed PDU whose reaction is to drop the connection.
    Malformed(DecodeError),
    /// TARGET COLD RESET answered.
    ColdReset,
    /// Logout answered.
    Logout,
    /// The initiator did not log out within the time an asked-for logout allowed
    /// ([`TargetSession::request_logout`]).
    LogoutTimeout,
}

/// StatSN, ExpCmdSN and MaxCmdSN for a status (the driver puts them in a Data-In carrying
/// the status, phase collapse).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// StatSN.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// A task of the session: its Initiator Task Tag and a number of its own, so a late call about
/// an ended task can never touch a newer task that reuses the tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskId {
    /// Initiator Task Tag.
    pub itt: u32,
    serial: u64,
}

/// Hashed by the tag alone (live tasks never share one): consistent with `Eq`, and cheaper
/// in a driver's tables.
impl core::hash::Hash for TaskId {
    fn hash<H: core::hash::Hasher>(&self, state: &mut H) {
        self.itt.hash(state);
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Task {
    serial: u64,
    lun: Lun,
    /// Its CmdSN (an immediate command's: the one it carried).
    cmd_sn: u32,
    /// Holds a slot of the immediate allowance rather than of the window.
    immediate: bool,
}

/// The target's full-feature session machine (one connection per session).
#[derive(Debug)]
pub struct TargetSession {
    cfg: TargetSessionConfig,
    limits: TransferLimits,
    discovery: bool,
    window: CommandWindow,
    stat_sn: u32,
    immediate_in_flight: u32,
    /// By Initiator Task Tag (a hash table: it is looked up at every command's start and
    /// end, where a B-tree cost ~450 instructions per command).
    tasks: HashMap<u32, Task>,
    next_serial: u64,
    tmfs: tmf::Tmfs,
    next_ttt: u32,
    last_heard: Duration,
    ping: Option<(u32, Duration)>,
    text_rest: Option<(u32, Vec<u8>)>,
    transmit: VecDeque<Transmit>,
    events: VecDeque<TargetEvent>,
    closed: bool,
    /// When an asked-for logout is overdue ([`TargetSession::request_logout`]).
    logout_due: Option<Duration>,
}

/// Put StatSN, ExpCmdSN and MaxCmdSN into a response header.
fn stamp(header: &mut Header, s: Stamp) {
    let fields = match header {
        Header::ScsiResponse(h) => (&mut h.stat_sn, &mut h.exp_cmd_sn, &mut h.max_cmd_sn),
        Header::NopIn(h) => (&mut h.stat_sn, &mut h.exp_cmd_sn, &mut h.max_cmd_sn),
        Header::TextResponse(h) => (&mut h.stat_sn, &mut h.exp_cmd_sn, &mut h.max_cmd_sn),
        Header::TaskMgmtResponse(h) => (&mut h.stat_sn, &mut h.exp_cmd_sn, &mut h.max_cmd_sn),
        Header::LogoutResponse(h) => (&mut h.stat_sn, &mut h.exp_cmd_sn, &mut h.max_cmd_sn),
        Header::Reject(h) => (&mut h.stat_sn, &mut h.exp_cmd_sn, &mut h.max_cmd_sn),
        Header::AsyncMessage(h) => (&mut h.stat_sn, &mut h.exp_cmd_sn, &mut h.max_cmd_sn),
        Header::DataIn(h) => (&mut h.stat_sn, &mut h.exp_cmd_sn, &mut h.max_cmd_sn),
        Header::R2t(h) => (&mut h.stat_sn, &mut h.exp_cmd_sn, &mut h.max_cmd_sn),
        _ => return,
    };
    (*fields.0, *fields.1, *fields.2) = (s.stat_sn, s.exp_cmd_sn, s.max_cmd_sn);
}

impl TargetSession {
    /// The session a successful login opened, at time `now`.
    pub fn new(cfg: TargetSessionConfig, login: &LoginOutcome, now: Duration) -> Self {
        Self::with_params(cfg, &login.params, login.exp_cmd_sn, login.stat_sn, now)
    }

    /// The session for negotiated `params`, the first CmdSN expected and the next StatSN.
    pub fn with_params(cfg: TargetSessionConfig, params: &NegotiatedParams, exp_cmd_sn: u32, stat_sn: u32, now: Duration) -> Self {
        Self {
            window: CommandWindow::new(exp_cmd_sn, cfg.queue_depth),
            limits: params.transfer_limits(Role::Target),
            discovery: params.session_type == SessionType::Discovery,
            cfg,
            stat_sn,
            immediate_in_flight: 0,
            tasks: HashMap::new(),
            next_serial: 0,
            tmfs: tmf::Tmfs::default(),
            next_ttt: 1,
            last_heard: now,
            ping: None,
            text_rest: None,
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            closed: false,
            logout_due: None,
        }
    }

    /// The data-transfer limits of the connection.
    pub fn limits(&self) -> &TransferLimits {
        &self.limits
    }

    /// ExpCmdSN and MaxCmdSN now.
    pub fn window(&self) -> (u32, u32) {
        (self.window.exp_cmd_sn(), self.window.max_cmd_sn())
    }

    /// The next StatSN.
    pub fn stat_sn(&self) -> u32 {
        self.stat_sn
    }

    /// Whether task `itt` is the session's (registered, not ended nor aborted).
    pub fn has_task(&self, itt: u32) -> bool {
        self.tasks.contains_key(&itt)
    }

    /// Tasks the session holds.
    pub fn tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Whether the session asked for the connection to end.
    pub fn is_closed(&self) -> bool {
        self.closed
    }

    /// PDUs to send, in order.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmit.pop_front()
    }

    /// Whether [`poll_transmit`](Self::poll_transmit) has something (a driver need not take its
    /// send order lock when nothing waits).
    pub fn has_transmit(&self) -> bool {
        !self.transmit.is_empty()
    }

    /// What the driver must do next.
    pub fn poll_event(&mut self) -> Option<TargetEvent> {
        self.events.pop_front()
    }

    /// When to call [`handle_timeout`](Self::handle_timeout) (keepalive).
    pub fn poll_timeout(&self) -> Option<Duration> {
        if self.closed {
            return None;
        }
        let keepalive = match self.ping {
            Some((_, sent)) => Some(sent + self.cfg.nop_timeout),
            None => self.cfg.nop_interval.map(|i| self.last_heard + i),
        };
        match (keepalive, self.logout_due) {
            (Some(k), Some(l)) => Some(k.min(l)),
            (k, l) => k.or(l),
        }
    }

    /// The logical units of the session's target changed (task management names them).
    pub fn set_luns(&mut self, luns: impl IntoIterator<Item = Lun>) {
        self.cfg.luns = luns.into_iter().collect();
    }

    /// Ask the initiator to log out within `within` (an Asynchronous Message, RFC 7143
    /// §11.9.1 event 1, "target requests logout", whose Parameter3 gives the time in seconds,
    /// at least one). If no logout has ended the session by then, the machine closes the
    /// connection ([`CloseReason::LogoutTimeout`]). Asking again keeps the earlier deadline.
    pub fn request_logout(&mut self, now: Duration, within: Duration) {
        if self.closed || self.logout_due.is_some() {
            return;
        }
        let secs = within.as_secs().clamp(1, u64::from(u16::MAX));
        self.logout_due = Some(now + Duration::from_secs(secs));
        let h = Header::AsyncMessage(AsyncMessage {
            itt: RESERVED_TAG,
            event: AsyncEvent::REQUEST_LOGOUT,
            param3: secs as u16,
            ..AsyncMessage::default()
        });
        // It takes a StatSN (Linux's initiator expects the next one after it).
        self.respond(h, Bytes::new(), true);
    }

    /// Whether a logout was asked for ([`request_logout`](Self::request_logout)).
    pub fn logout_requested(&self) -> bool {
        self.logout_due.is_some()
    }

    fn stamp_now(&mut self, advance: bool) -> Stamp {
        let s = Stamp { stat_sn: self.stat_sn, exp_cmd_sn: self.window.exp_cmd_sn(), max_cmd_sn: self.window.max_cmd_sn() };
        if advance {
            self.stat_sn = self.stat_sn.wrapping_add(1);
        }
        s
    }

    /// Queue a response, stamping StatSN (consumed when `advance`), ExpCmdSN and MaxCmdSN.
    fn respond(&mut self, mut header: Header, data: Bytes, advance: bool) {
        if self.closed {
            // The connection is over: nothing more goes out (the application may still answer
            // what it had in hand).
            return;
        }
        let s = self.stamp_now(advance);
        stamp(&mut header, s);
        self.transmit.push_back(Transmit { header, data });
    }

    fn reject(&mut self, reason: RejectReason, bhs: [u8; BHS_LEN]) {
        let h = Header::Reject(Reject { reason, itt: RESERVED_TAG, ..Reject::default() });
        self.respond(h, Bytes::copy_from_slice(&bhs), true);
    }

    fn reject_header(&mut self, reason: RejectReason, bad: &Header) {
        let mut bhs = [0u8; BHS_LEN];
        bad.emit(&mut bhs, 0, 0);
        self.reject(reason, bhs);
    }

    fn close(&mut self, why: CloseReason) {
        if !self.closed {
            self.closed = true;
            self.events.push_back(TargetEvent::Close(why));
        }
    }

    /// A control PDU arrived (for a write command, `immediate` bytes of immediate data are
    /// already in the datamover's task buffer).
    pub fn handle_pdu(&mut self, now: Duration, header: &Header, ahs: Bytes, data: Bytes, immediate: u32) {
        if self.closed {
            return;
        }
        self.last_heard = now;
        // Any PDU shows the initiator is alive; a NOP-Out answering our ping names it.
        match header {
            Header::NopOut(n) if n.itt == RESERVED_TAG => {
                if self.ping.is_some_and(|(ttt, _)| ttt == n.ttt) {
                    self.ping = None;
                }
            }
            _ => self.ping = None,
        }
        match *header {
            Header::ScsiCommand(c) if !self.discovery => self.command(c, ahs, immediate, header),
            Header::ScsiCommand(c) => {
                // A discovery session runs no SCSI command; the datamover frees its buffers.
                self.events.push_back(TargetEvent::Discard { itt: c.itt });
                if c.immediate || self.admit_request(c.cmd_sn) {
                    self.reject_header(RejectReason::COMMAND_NOT_SUPPORTED, header);
                }
            }
            Header::TaskMgmtRequest(t) if self.discovery => {
                if t.immediate || self.admit_request(t.cmd_sn) {
                    self.reject_header(RejectReason::COMMAND_NOT_SUPPORTED, header);
                }
            }
            Header::NopOut(n) => {
                if !n.immediate && !self.admit_request(n.cmd_sn) {
                    return;
                }
                if n.itt != RESERVED_TAG {
                    let h = Header::NopIn(NopIn { lun: n.lun, itt: n.itt, ttt: RESERVED_TAG, ..NopIn::default() });
                    self.respond(h, data, true);
                }
            }
            Header::TextRequest(t) => {
                if !t.immediate && !self.admit_request(t.cmd_sn) {
                    return;
                }
                self.text(t, data, header);
            }
            Header::TaskMgmtRequest(t) => {
                if !t.immediate && !self.admit_request(t.cmd_sn) {
                    return;
                }
                self.task_management(t);
            }
            Header::LogoutRequest(l) => {
                if !l.immediate {
                    self.window.admit(l.cmd_sn);
                }
                let aborted = self.abort_where(|_| true);
                self.events.push_back(TargetEvent::Logout { req: l, aborted });
            }
            Header::Snack(_) | Header::LoginRequest(_) => self.reject_header(RejectReason::PROTOCOL_ERROR, header),
            ref other => self.reject_header(RejectReason::COMMAND_NOT_SUPPORTED, other),
        }
        self.run_waiting_task_management();
    }

    /// A well-framed PDU whose header breaks a rule: the RFC's reaction (a Reject, or the end
    /// of the connection).
    pub fn handle_malformed(&mut self, now: Duration, bhs: [u8; BHS_LEN], error: DecodeError) {
        if self.closed {
            return;
        }
        self.last_heard = now;
        self.ping = None;
        match error.reaction() {
            Reaction::Reject(reason) => self.reject(reason, bhs),
            Reaction::DropConnection => self.close(CloseReason::Malformed(error)),
        }
    }

    /// Time passed: ping an idle initiator (one ping outstanding at a time, carrying the next
    /// StatSN without consuming it), or give up on one that does not answer.
    pub fn handle_timeout(&mut self, now: Duration) {
        if self.closed {
            return;
        }
        if self.logout_due.is_some_and(|due| now >= due) {
            return self.close(CloseReason::LogoutTimeout);
        }
        match self.ping {
            Some((_, sent)) if now >= sent + self.cfg.nop_timeout => self.close(CloseReason::Unresponsive),
            Some(_) => {}
            None => {
                if self.cfg.nop_interval.is_some_and(|i| now >= self.last_heard + i) {
                    let ttt = self.take_ttts(1);
                    self.ping = Some((ttt, now));
                    let h = Header::NopIn(NopIn { lun: Lun::ZERO, itt: RESERVED_TAG, ttt, ..NopIn::default() });
                    self.respond(h, Bytes::new(), false);
                }
            }
        }
    }

    /// Account the CmdSN of a non-immediate request that holds no task (NOP-Out, text, task
    /// management, a rejected command): received, so ExpCmdSN passes it, and its slot is free
    /// again at once. `false`: outside the window or a duplicate, ignored.
    fn admit_request(&mut self, cmd_sn: u32) -> bool {
        let admitted = self.window.admit(cmd_sn);
        if admitted {
            self.window.open_one();
        }
        admitted
    }

    fn command(&mut self, c: ScsiCommand, ahs: Bytes, immediate: u32, header: &Header) {
        if c.immediate {
            // Immediate commands stand outside the window: their own allowance.
            if self.immediate_in_flight >= self.cfg.max_immediate_commands {
                self.events.push_back(TargetEvent::Discard { itt: c.itt });
                self.reject_header(RejectReason::IMMEDIATE_COMMAND_REJECTED, header);
                return;
            }
        } else if !self.window.admit(c.cmd_sn) {
            self.events.push_back(TargetEvent::Discard { itt: c.itt });
            return;
        }
        // One look-up of the tag: the table is walked once per command.
        let Entry::Vacant(slot) = self.tasks.entry(c.itt) else {
            // A tag in use names another task (RFC 7143 §11.17.1, Task in progress); the
            // command took no slot.
            if !c.immediate {
                self.window.open_one();
            }
            self.events.push_back(TargetEvent::Discard { itt: c.itt });
            self.reject_header(RejectReason::TASK_IN_PROGRESS, header);
            return;
        };
        self.next_serial += 1;
        let task = TaskId { itt: c.itt, serial: self.next_serial };
        slot.insert(Task { serial: task.serial, lun: c.lun, cmd_sn: c.cmd_sn, immediate: c.immediate });
        if c.immediate {
            self.immediate_in_flight += 1;
        }
        let split = self.limits.incoming_write(c.expected_data_len, immediate, c.final_);
        self.events.push_back(TargetEvent::Command { task, cmd: c, ahs, split });
    }

    /// Give back a task's slot; `false` if the task is not the session's any more.
    fn end(&mut self, task: TaskId) -> bool {
        match self.tasks.entry(task.itt) {
            Entry::Occupied(e) if e.get().serial == task.serial => {
                let t = e.remove();
                self.free_slot(&t);
                true
            }
            _ => false,
        }
    }

    fn end_task(&mut self, itt: u32) -> bool {
        match self.tasks.remove(&itt) {
            Some(t) => {
                self.free_slot(&t);
                true
            }
            None => false,
        }
    }

    /// An ended task's slot: of the immediate allowance, or of the window.
    fn free_slot(&mut self, t: &Task) {
        if t.immediate {
            self.immediate_in_flight -= 1;
        } else {
            self.window.open_one();
        }
    }

    /// The plan to collect a write's data: after the unsolicited part `[0, split.unsolicited_end)`,
    /// solicit up to `end` (what the CDB uses; at least the unsolicited part) in bursts of
    /// MaxBurstLength, with Target Transfer Tags taken from the session.
    pub fn plan_write(&mut self, cmd: &ScsiCommand, split: WriteSplit, end: u32) -> R2tPlan {
        let s = self.stamp_now(false);
        let mut plan = R2tPlan {
            itt: cmd.itt,
            lun: cmd.lun,
            start: split.unsolicited_end,
            end: end.max(split.unsolicited_end),
            max_burst: self.limits.burst() as u32,
            first_ttt: 0,
            stat_sn: s.stat_sn,
            exp_cmd_sn: s.exp_cmd_sn,
            max_cmd_sn: s.max_cmd_sn,
        };
        plan.first_ttt = self.take_ttts(plan.count().max(1));
        plan
    }

    /// `n` consecutive Target Transfer Tags (below 0x8000_0000, never the reserved tag).
    fn take_ttts(&mut self, n: u32) -> u32 {
        let first = self.next_ttt & 0x7fff_ffff;
        self.next_ttt = self.next_ttt.wrapping_add(n);
        first
    }

    /// End task `itt` and take the StatSN for its status, for a status the driver sends itself
    /// (in the last Data-In, phase collapse). The driver must send it before anything polled
    /// later. `None`: the task is no longer the session's (aborted), or the session closed (the
    /// task ends all the same); nothing may be sent.
    pub fn take_status(&mut self, task: TaskId) -> Option<Stamp> {
        (self.end(task) && !self.closed).then(|| self.stamp_now(true))
    }

    /// End task `itt` with its SCSI Response. `sense` is the sense data (without its length
    /// prefix). `false`: the task was aborted meanwhile, or the session closed, and no response
    /// goes out.
    pub fn finish_command(&mut self, task: TaskId, status: Status, sense: Option<&[u8]>, residual: Residual, exp_data_sn: u32) -> bool {
        let Some(s) = self.take_status(task) else { return false };
        self.transmit.push_back(Self::scsi_response(task.itt, status, sense, residual, exp_data_sn, s));
        true
    }

    /// A SCSI Response with a given stamp (for a status whose collapse into Data-In did not
    /// happen after [`take_status`](Self::take_status)).
    pub fn scsi_response(itt: u32, status: Status, sense: Option<&[u8]>, residual: Residual, exp_data_sn: u32, s: Stamp) -> Transmit {
        let (underflow, overflow, count) = residual.flags();
        let mut header = Header::ScsiResponse(ScsiResponse {
            overflow,
            underflow,
            status,
            itt,
            exp_data_sn,
            residual: count,
            ..ScsiResponse::default()
        });
        stamp(&mut header, s);
        let data = sense.map(|sense| Bytes::from(riser_scsi::sense::with_length_prefix(sense))).unwrap_or_default();
        Transmit { header, data }
    }

    /// Task `itt` ended without a response (its connection or command was given up): its
    /// slot is free. Whether it was still held (a task that has ended already, or a later one
    /// under the same tag, is left alone).
    pub fn drop_task(&mut self, task: TaskId) -> bool {
        self.end(task)
    }

    fn abort_where(&mut self, pred: impl Fn(&Task) -> bool) -> Vec<u32> {
        let mut victims: Vec<u32> = self.tasks.iter().filter(|(_, t)| pred(t)).map(|(i, _)| *i).collect();
        // In tag order, whatever the table's: the events and answers do not depend on hashing.
        victims.sort_unstable();
        for itt in &victims {
            self.end_task(*itt);
        }
        victims
    }

    fn text(&mut self, t: TextRequest, data: Bytes, header: &Header) {
        if t.ttt == RESERVED_TAG {
            // A new request ends any answer the initiator did not fetch to its end.
            self.text_rest = None;
            self.events.push_back(TargetEvent::Text { req: t, data });
            return;
        }
        // The initiator fetching the next piece of a long answer.
        match self.text_rest.take() {
            Some((ttt, rest)) if ttt == t.ttt => self.answer_text(t, rest),
            other => {
                self.text_rest = other;
                self.reject_header(RejectReason::INVALID_PDU_FIELD, header);
            }
        }
    }

    /// Answer text request `req` with `text`: one Text Response, or the first piece of a
    /// C-bit sequence when it exceeds what the initiator receives in one PDU (RFC 7143
    /// §11.10.2); the rest goes out as the initiator asks for it (same ITT, our TTT).
    pub fn answer_text(&mut self, t: TextRequest, mut text: Vec<u8>) {
        let max = self.limits.send_segment();
        let ttt = if text.len() > max {
            let rest = text.split_off(max);
            let ttt = self.take_ttts(1);
            self.text_rest = Some((ttt, rest));
            ttt
        } else {
            RESERVED_TAG
        };
        let last = ttt == RESERVED_TAG;
        let h = Header::TextResponse(TextResponse { final_: last, cont: !last, lun: t.lun, itt: t.itt, ttt, ..TextResponse::default() });
        self.respond(h, text.into(), true);
    }

    /// Answer logout request `req` (once no write of the session can still land); the
    /// connection then ends.
    pub fn answer_logout(&mut self, req: &LogoutRequest) {
        let h = Header::LogoutResponse(LogoutResponse {
            response: LogoutResponseCode::SUCCESS,
            itt: req.itt,
            time2wait: 0,
            time2retain: 0,
            ..LogoutResponse::default()
        });
        self.respond(h, Bytes::new(), true);
        self.close(CloseReason::Logout);
    }
}
