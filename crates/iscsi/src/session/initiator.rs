//! [`InitiatorSession`]: the initiator's side of the full feature phase, sans IO.
//!
//! It numbers what the initiator sends (CmdSN inside the target's window, Initiator Task
//! Tags, ExpStatSN), keeps the table of outstanding tasks, and turns what the target sends
//! into events for the tasks: a command's status and residual, the answer to a NOP-Out, a
//! text exchange gathered across continuations, a Reject, and the commands a task management
//! function ended (the target sends them no response, RFC 7143 §11.5.1). It answers the
//! target's pings itself. The driver (`riser-initiator`) owns the datamover and the callers.
//!
//! Call contract: start requests with [`InitiatorSession::start_command`],
//! [`InitiatorSession::ping`], [`InitiatorSession::task_management`],
//! [`InitiatorSession::text`] or [`InitiatorSession::logout`]; feed received PDUs to
//! [`InitiatorSession::handle_pdu`]; drain [`InitiatorSession::poll_transmit`] and
//! [`InitiatorSession::poll_event`].

use super::residual::Residual;
use super::target_session::Transmit;
use super::window::InitiatorWindow;
use crate::login::LoginOutcome;
use crate::serial::SerialNumber;
use crate::wire::{
    Bhs, Header, LogoutReason, LogoutRequest, NopOut, RESERVED_TAG, RejectReason, ScsiCommand, TaskMgmtRequest, TextRequest, TmfFunction,
    TmfResponse,
};
use alloc::collections::VecDeque;
use alloc::vec::Vec;
use bytes::Bytes;
use hashbrown::HashMap;
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

/// What a task is. A command's `cmd_sn` is its own; a task management function's is the
/// (immediate) CmdSN it carries: the commands it concerns are numbered before it.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Kind {
    Command { lun: Lun, cmd_sn: u32 },
    Ping,
    TaskManagement { function: TmfFunction, lun: Lun, ref_itt: u32, cmd_sn: u32 },
    Text { gathered: Vec<u8> },
    Logout,
}

/// The most text one exchange gathers across its continuations: 16 MiB, room for a SendTargets
/// answer listing well over 100,000 targets (each name and address about 100 bytes); a target
/// that keeps continuing beyond it ends the exchange ([`InitiatorEvent::TextTooLong`]).
pub const MAX_TEXT_ANSWER: usize = 16 << 20;

/// What happened to a task.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum InitiatorEvent {
    /// A SCSI command ended (SCSI Response, or the last Data-In carrying its status).
    CommandDone {
        /// The task.
        itt: u32,
        /// SCSI status.
        status: Status,
        /// Sense data (without its length prefix), if any.
        sense: Option<Bytes>,
        /// The residual.
        residual: Residual,
    },
    /// A command ended without a response: task management aborted it.
    Aborted {
        /// The task.
        itt: u32,
    },
    /// The target answered a NOP-Out.
    Pong {
        /// The ping's task.
        itt: u32,
        /// The echoed data.
        data: Bytes,
    },
    /// A task management function was answered.
    TaskManagementDone {
        /// Its task.
        itt: u32,
        /// The target's answer.
        response: TmfResponse,
    },
    /// A text exchange ended; its text is gathered across continuations.
    TextDone {
        /// Its task.
        itt: u32,
        /// The whole answer.
        text: Vec<u8>,
    },
    /// A text answer grew beyond [`MAX_TEXT_ANSWER`] across its continuations: the exchange
    /// ended without it.
    TextTooLong {
        /// Its task.
        itt: u32,
        /// The limit it crossed.
        limit: usize,
    },
    /// The target answered the logout: the connection ends.
    LoggedOut {
        /// Its task.
        itt: u32,
    },
    /// The target rejected the request of this task.
    Rejected {
        /// The task.
        itt: u32,
        /// Why.
        reason: RejectReason,
    },
    /// A PDU the session cannot match to anything, or that breaks the protocol (the driver
    /// logs it; at ERL 0 it may drop the connection).
    Unexpected(Header),
    /// The CmdSN window opened, or a task ended while the task limit was reached: requests
    /// waiting may try again.
    WindowOpen,
}

impl InitiatorEvent {
    /// The task the event ends (`None`: a PDU matched to no task, or the window opening).
    pub fn itt(&self) -> Option<u32> {
        match *self {
            Self::CommandDone { itt, .. }
            | Self::Aborted { itt }
            | Self::Pong { itt, .. }
            | Self::TaskManagementDone { itt, .. }
            | Self::TextDone { itt, .. }
            | Self::TextTooLong { itt, .. }
            | Self::LoggedOut { itt }
            | Self::Rejected { itt, .. } => Some(itt),
            Self::Unexpected(_) | Self::WindowOpen => None,
        }
    }
}

/// Immediate requests an initiator may have outstanding beyond its task limit (see
/// [`InitiatorSession::immediate_room`]).
pub const IMMEDIATE_BEYOND_LIMIT: usize = 8;

/// Why a request cannot start now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Busy {
    /// The target's window is closed: wait for [`InitiatorEvent::WindowOpen`].
    WindowClosed,
    /// As many tasks are outstanding as the transport takes answers for (see
    /// [`InitiatorSession::set_task_limit`]): wait for [`InitiatorEvent::WindowOpen`], which
    /// also comes when a task ends below the limit.
    TaskLimit,
}

/// The initiator's full-feature session machine.
#[derive(Debug)]
pub struct InitiatorSession {
    window: InitiatorWindow,
    next_itt: u32,
    tasks: HashMap<u32, Kind>,
    transmit: VecDeque<Transmit>,
    events: VecDeque<InitiatorEvent>,
    /// Tasks outstanding at most before a SCSI command waits (`None`: the window alone).
    task_limit: Option<usize>,
}

impl InitiatorSession {
    /// The session a successful login opened.
    pub fn new(login: &LoginOutcome) -> Self {
        Self::with_numbers(login.exp_cmd_sn, login.max_cmd_sn, login.stat_sn)
    }

    /// The session with the first CmdSN to send, the target's MaxCmdSN and the next StatSN.
    pub fn with_numbers(cmd_sn: u32, max_cmd_sn: u32, exp_stat_sn: u32) -> Self {
        Self {
            window: InitiatorWindow::new(cmd_sn, max_cmd_sn, exp_stat_sn),
            next_itt: 0x100,
            tasks: HashMap::new(),
            transmit: VecDeque::new(),
            events: VecDeque::new(),
            task_limit: None,
        }
    }

    /// Bound the tasks outstanding when a SCSI command starts: at `limit` (of every kind), a
    /// command gets [`Busy::TaskLimit`] whatever the window says. For a transport whose answers
    /// need a place made ready beforehand (iSER's posted receives:
    /// `Datamover::max_outstanding_commands` in riser-datamover). Immediate requests may go
    /// [`IMMEDIATE_BEYOND_LIMIT`] further (see [`immediate_room`](Self::immediate_room)); while
    /// the limit is reached, every task that ends says so ([`InitiatorEvent::WindowOpen`]).
    /// `None` (the default) lifts the bound.
    pub fn set_task_limit(&mut self, limit: Option<u32>) {
        self.task_limit = limit.map(|n| n.max(1) as usize);
    }

    /// Whether an immediate request (ping, task management, text, logout) may start under the
    /// task limit: fewer tasks than the limit plus [`IMMEDIATE_BEYOND_LIMIT`]. The machine
    /// starts one regardless (they never wait for the window); a driver that wants its answers
    /// to fit asks first, and waits for [`InitiatorEvent::WindowOpen`] when there is no room.
    pub fn immediate_room(&self) -> bool {
        self.task_limit.is_none_or(|n| self.tasks.len() < n + IMMEDIATE_BEYOND_LIMIT)
    }

    /// Whether the task limit is reached.
    fn at_task_limit(&self) -> bool {
        self.task_limit.is_some_and(|n| self.tasks.len() >= n)
    }

    /// After tasks ended: if the limit was reached before (`full`, `before` tasks), say there
    /// is room again, unless the window opening said it already.
    fn note_room(&mut self, full: bool, before: usize, said: bool) {
        if full && !said && self.tasks.len() < before {
            self.events.push_back(InitiatorEvent::WindowOpen);
        }
    }

    /// The numbering: next CmdSN, MaxCmdSN, ExpStatSN.
    pub fn window(&self) -> &InitiatorWindow {
        &self.window
    }

    /// Outstanding tasks.
    pub fn tasks(&self) -> usize {
        self.tasks.len()
    }

    /// Whether task `itt` is outstanding.
    pub fn has_task(&self, itt: u32) -> bool {
        self.tasks.contains_key(&itt)
    }

    /// Whether PDUs wait to be sent ([`poll_transmit`](Self::poll_transmit) has one).
    pub fn has_transmit(&self) -> bool {
        !self.transmit.is_empty()
    }

    /// PDUs to send (requests other than SCSI commands, answers to pings), in order.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.transmit.pop_front()
    }

    /// What happened to tasks.
    pub fn poll_event(&mut self) -> Option<InitiatorEvent> {
        self.events.pop_front()
    }

    fn take_itt(&mut self) -> u32 {
        loop {
            let itt = self.next_itt & 0x7fff_ffff;
            self.next_itt = self.next_itt.wrapping_add(1);
            if itt != RESERVED_TAG && !self.tasks.contains_key(&itt) {
                return itt;
            }
        }
    }

    /// Number and register a request; `(itt, cmd_sn, exp_stat_sn)`.
    fn start(&mut self, kind: Kind, immediate: bool) -> Result<(u32, u32, u32), Busy> {
        if !immediate && self.at_task_limit() {
            return Err(Busy::TaskLimit);
        }
        let cmd_sn = self.window.take(immediate).ok_or(Busy::WindowClosed)?;
        let itt = self.take_itt();
        self.tasks.insert(itt, kind);
        Ok((itt, cmd_sn, self.window.exp_stat_sn()))
    }

    /// A SCSI Command for `lun` with `cdb` (its first 16 bytes; a longer CDB goes in an AHS),
    /// expecting `read_len` bytes back and sending `write_len`. The driver hands it to the
    /// datamover with the task's buffers (which sets the F bit by the write's split).
    pub fn start_command(&mut self, lun: Lun, cdb: &[u8], read_len: u32, write_len: u32) -> Result<ScsiCommand, Busy> {
        let cmd_sn = self.window.cmd_sn();
        let (itt, cmd_sn, exp_stat_sn) = self.start(Kind::Command { lun, cmd_sn }, false)?;
        let mut c = [0u8; 16];
        let n = cdb.len().min(16);
        c[..n].copy_from_slice(&cdb[..n]);
        Ok(ScsiCommand {
            immediate: false,
            final_: true,
            read: read_len > 0,
            write: write_len > 0,
            attr: 1,
            lun,
            itt,
            expected_data_len: read_len.max(write_len),
            cmd_sn,
            exp_stat_sn,
            cdb: c,
        })
    }

    /// The command `itt` could not be sent (or its caller gave up): forget it.
    pub fn forget(&mut self, itt: u32) {
        let (full, before) = (self.at_task_limit(), self.tasks.len());
        self.tasks.remove(&itt);
        self.note_room(full, before, false);
    }

    /// A NOP-Out ping (immediate) carrying `data`; returns its task tag.
    pub fn ping(&mut self, data: Bytes) -> u32 {
        let (itt, cmd_sn, exp_stat_sn) = self.start(Kind::Ping, true).unwrap_or_default();
        let h = NopOut { immediate: true, lun: Lun::ZERO, itt, ttt: RESERVED_TAG, cmd_sn, exp_stat_sn };
        self.transmit.push_back(Transmit { header: Header::NopOut(h), data });
        itt
    }

    /// A task management function (immediate); returns its task tag. Once it is answered
    /// COMPLETE, the commands it concerns that are still outstanding end as
    /// [`InitiatorEvent::Aborted`]: those numbered before it (a command started after it
    /// carries a CmdSN at least its own, which the function does not reach, RFC 7143 §4.2.2.1).
    /// The driver sends the commands it started before this call ahead of this request.
    ///
    /// For ABORT TASK, RefCmdSN is the referenced command's CmdSN; for a command the session
    /// no longer holds (it ended), the CmdSN before the next one, which the target has seen.
    pub fn task_management(&mut self, function: TmfFunction, lun: Lun, ref_itt: u32) -> u32 {
        let ref_cmd_sn = match self.tasks.get(&ref_itt) {
            Some(Kind::Command { cmd_sn, .. }) => *cmd_sn,
            _ => self.window.cmd_sn().wrapping_sub(1),
        };
        let own_cmd_sn = self.window.cmd_sn();
        let (itt, cmd_sn, exp_stat_sn) =
            self.start(Kind::TaskManagement { function, lun, ref_itt, cmd_sn: own_cmd_sn }, true).unwrap_or_default();
        let h = TaskMgmtRequest {
            immediate: true,
            function,
            lun,
            itt,
            ref_task_tag: if function == TmfFunction::ABORT_TASK { ref_itt } else { RESERVED_TAG },
            cmd_sn,
            exp_stat_sn,
            ref_cmd_sn,
            exp_data_sn: 0,
        };
        self.transmit.push_back(Transmit { header: Header::TaskMgmtRequest(h), data: Bytes::new() });
        itt
    }

    /// A text request (immediate); the answer is gathered across continuations.
    pub fn text(&mut self, text: Vec<u8>) -> u32 {
        let (itt, cmd_sn, exp_stat_sn) = self.start(Kind::Text { gathered: Vec::new() }, true).unwrap_or_default();
        let h = TextRequest { immediate: true, final_: true, itt, ttt: RESERVED_TAG, cmd_sn, exp_stat_sn, ..TextRequest::default() };
        self.transmit.push_back(Transmit { header: Header::TextRequest(h), data: text.into() });
        itt
    }

    /// Log out, closing the session (immediate).
    pub fn logout(&mut self) -> u32 {
        let (itt, cmd_sn, exp_stat_sn) = self.start(Kind::Logout, true).unwrap_or_default();
        let h = LogoutRequest { immediate: true, reason: LogoutReason::CLOSE_SESSION, itt, cid: 0, cmd_sn, exp_stat_sn };
        self.transmit.push_back(Transmit { header: Header::LogoutRequest(h), data: Bytes::new() });
        itt
    }

    /// A PDU from the target (Data-In without status and R2Ts are the datamover's; give them
    /// here too, for their window fields).
    pub fn handle_pdu(&mut self, header: &Header, data: Bytes) {
        let (full, before) = (self.at_task_limit(), self.tasks.len());
        let opened = self.window.note(header);
        if opened {
            self.events.push_back(InitiatorEvent::WindowOpen);
        }
        self.answer(header, data);
        // Room under the task limit again (after the task's own event).
        self.note_room(full, before, opened);
    }

    fn answer(&mut self, header: &Header, data: Bytes) {
        match *header {
            Header::ScsiResponse(r) => {
                let sense = (data.len() > 2).then(|| {
                    let n = usize::from(u16::from_be_bytes([data[0], data[1]])).min(data.len() - 2);
                    data.slice(2..2 + n)
                });
                self.command_done(r.itt, r.status, sense, Residual::from_flags(r.underflow, r.overflow, r.residual), header);
            }
            Header::DataIn(d) if d.status_present => {
                self.command_done(d.itt, d.status, None, Residual::from_flags(d.underflow, d.overflow, d.residual), header);
            }
            Header::DataIn(_) | Header::R2t(_) => {}
            Header::NopIn(n) if n.itt == RESERVED_TAG => {
                if n.ttt != RESERVED_TAG {
                    // The target's ping: answer at once with its TTT (immediate, current CmdSN).
                    let out = NopOut {
                        immediate: true,
                        lun: n.lun,
                        itt: RESERVED_TAG,
                        ttt: n.ttt,
                        cmd_sn: self.window.cmd_sn(),
                        exp_stat_sn: self.window.exp_stat_sn(),
                    };
                    self.transmit.push_back(Transmit { header: Header::NopOut(out), data });
                }
            }
            Header::NopIn(n) => match self.tasks.remove(&n.itt) {
                Some(Kind::Ping) => self.events.push_back(InitiatorEvent::Pong { itt: n.itt, data }),
                other => self.unexpected(n.itt, other, header),
            },
            Header::TaskMgmtResponse(r) => match self.tasks.remove(&r.itt) {
                Some(Kind::TaskManagement { function, lun, ref_itt, cmd_sn }) => {
                    if r.response == TmfResponse::COMPLETE {
                        self.aborted_by(function, lun, ref_itt, cmd_sn);
                    }
                    self.events.push_back(InitiatorEvent::TaskManagementDone { itt: r.itt, response: r.response });
                }
                other => self.unexpected(r.itt, other, header),
            },
            Header::TextResponse(r) => match self.tasks.get_mut(&r.itt) {
                Some(Kind::Text { gathered }) if gathered.len().saturating_add(data.len()) > MAX_TEXT_ANSWER => {
                    // A target that keeps continuing: the exchange ends here (its further
                    // pieces are unexpected), and nothing more is kept.
                    self.tasks.remove(&r.itt);
                    self.events.push_back(InitiatorEvent::TextTooLong { itt: r.itt, limit: MAX_TEXT_ANSWER });
                }
                Some(Kind::Text { gathered }) => {
                    gathered.extend_from_slice(&data);
                    if r.cont || !r.final_ {
                        // More to come: ask for it with the target's TTT (RFC 7143 §11.10.2).
                        let h = TextRequest {
                            immediate: true,
                            final_: true,
                            itt: r.itt,
                            ttt: r.ttt,
                            cmd_sn: self.window.cmd_sn(),
                            exp_stat_sn: self.window.exp_stat_sn(),
                            ..TextRequest::default()
                        };
                        self.transmit.push_back(Transmit { header: Header::TextRequest(h), data: Bytes::new() });
                    } else if let Some(Kind::Text { gathered }) = self.tasks.remove(&r.itt) {
                        self.events.push_back(InitiatorEvent::TextDone { itt: r.itt, text: gathered });
                    }
                }
                _ => self.events.push_back(InitiatorEvent::Unexpected(*header)),
            },
            Header::LogoutResponse(r) => match self.tasks.remove(&r.itt) {
                Some(Kind::Logout) => self.events.push_back(InitiatorEvent::LoggedOut { itt: r.itt }),
                other => self.unexpected(r.itt, other, header),
            },
            Header::Reject(j) => {
                // The rejected header is the data segment: its task failed.
                let itt = (data.len() >= crate::wire::BHS_LEN).then(|| Bhs::new_unchecked(&data[..]).itt());
                match itt.filter(|i| self.tasks.remove(i).is_some()) {
                    Some(itt) => self.events.push_back(InitiatorEvent::Rejected { itt, reason: j.reason }),
                    None => self.events.push_back(InitiatorEvent::Unexpected(*header)),
                }
            }
            _ => self.events.push_back(InitiatorEvent::Unexpected(*header)),
        }
    }

    fn unexpected(&mut self, itt: u32, was: Option<Kind>, header: &Header) {
        if let Some(k) = was {
            // Not this task's kind of answer: the task stays.
            self.tasks.insert(itt, k);
        }
        self.events.push_back(InitiatorEvent::Unexpected(*header));
    }

    fn command_done(&mut self, itt: u32, status: Status, sense: Option<Bytes>, residual: Residual, header: &Header) {
        match self.tasks.remove(&itt) {
            Some(Kind::Command { .. }) => self.events.push_back(InitiatorEvent::CommandDone { itt, status, sense, residual }),
            other => self.unexpected(itt, other, header),
        }
    }

    /// A task management function numbered `before` completed: the commands it ended get no
    /// response.
    fn aborted_by(&mut self, function: TmfFunction, lun: Lun, ref_itt: u32, before: u32) {
        let hit = |itt: u32, l: Lun| match function {
            TmfFunction::ABORT_TASK => itt == ref_itt,
            TmfFunction::ABORT_TASK_SET | TmfFunction::CLEAR_TASK_SET | TmfFunction::LOGICAL_UNIT_RESET => l == lun,
            TmfFunction::TARGET_WARM_RESET | TmfFunction::TARGET_COLD_RESET => true,
            _ => false,
        };
        let before = SerialNumber(before);
        let victims: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(i, k)| matches!(k, Kind::Command { lun: l, cmd_sn } if SerialNumber(*cmd_sn).lt(before) && hit(**i, *l)))
            .map(|(i, _)| *i)
            .collect();
        for itt in victims {
            self.tasks.remove(&itt);
            self.events.push_back(InitiatorEvent::Aborted { itt });
        }
    }
}
