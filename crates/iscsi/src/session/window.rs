//! Command numbering (RFC 7143 §4.2.2): the target's CmdSN window and the initiator's view of it.

use crate::serial::SerialNumber;
use crate::wire::{Header, RESERVED_TAG};

/// The target's CmdSN window. A non-immediate command is accepted once, in any order, when its
/// CmdSN lies in `[ExpCmdSN, MaxCmdSN]`; ExpCmdSN advances over every contiguous CmdSN
/// received. MaxCmdSN moves up by one as a command *ends* (not when it arrives), so the window
/// bounds the commands the session holds at once. Behind a gap (a CmdSN that never comes)
/// MaxCmdSN stops at twice the depth beyond ExpCmdSN, so what the window remembers stays
/// bounded whatever an initiator sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CommandWindow {
    exp: SerialNumber,
    /// MaxCmdSN as the slots given back allow it.
    max: SerialNumber,
    /// How far beyond ExpCmdSN MaxCmdSN may reach: twice the depth, less one.
    reach: u32,
    /// CmdSNs received beyond ExpCmdSN (a gap before them); at most `reach`.
    ahead: alloc::collections::BTreeSet<u32>,
}

impl CommandWindow {
    /// The window after login: ExpCmdSN `exp_cmd_sn`, room for `depth` commands (at least 1),
    /// as the final Login Response announced it (MaxCmdSN = ExpCmdSN + depth − 1).
    pub fn new(exp_cmd_sn: u32, depth: u32) -> Self {
        let exp = SerialNumber(exp_cmd_sn);
        let depth = depth.clamp(1, 1 << 29);
        Self { exp, max: exp.add(depth - 1), reach: 2 * depth - 1, ahead: Default::default() }
    }

    fn max(&self) -> SerialNumber {
        let limit = self.exp.add(self.reach);
        if self.max.gt(limit) { limit } else { self.max }
    }

    /// ExpCmdSN.
    pub fn exp_cmd_sn(&self) -> u32 {
        self.exp.0
    }

    /// MaxCmdSN.
    pub fn max_cmd_sn(&self) -> u32 {
        self.max().0
    }

    /// Account a non-immediate PDU's CmdSN. `false`: outside the window or a duplicate, which
    /// the target ignores silently (§4.2.2.1).
    pub fn admit(&mut self, cmd_sn: u32) -> bool {
        let sn = SerialNumber(cmd_sn);
        if !sn.in_window(self.exp, self.max()) || self.ahead.contains(&cmd_sn) {
            return false;
        }
        if sn == self.exp {
            self.exp = self.exp.add(1);
            while self.ahead.remove(&self.exp.0) {
                self.exp = self.exp.add(1);
            }
        } else {
            self.ahead.insert(cmd_sn);
        }
        true
    }

    /// Whether `cmd_sn` may still arrive: in the window and not yet received (a task
    /// management function naming it as RefCmdSN treats the task as aborted, §11.5.1).
    pub fn not_yet_received(&self, cmd_sn: u32) -> bool {
        SerialNumber(cmd_sn).in_window(self.exp, self.max()) && !self.ahead.contains(&cmd_sn)
    }

    /// A command ended: the window opens by one.
    pub fn open_one(&mut self) {
        self.max = self.max.add(1);
    }
}

/// The initiator's view of the session's numbering: the next CmdSN, the target's MaxCmdSN, and
/// ExpStatSN.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InitiatorWindow {
    cmd_sn: SerialNumber,
    max_cmd_sn: SerialNumber,
    exp_stat_sn: u32,
}

impl InitiatorWindow {
    /// After login: the first command carries `exp_cmd_sn`; the target allows up to
    /// `max_cmd_sn`; the next StatSN expected is `exp_stat_sn`.
    pub fn new(exp_cmd_sn: u32, max_cmd_sn: u32, exp_stat_sn: u32) -> Self {
        Self { cmd_sn: SerialNumber(exp_cmd_sn), max_cmd_sn: SerialNumber(max_cmd_sn), exp_stat_sn }
    }

    /// The CmdSN the next PDU carries.
    pub fn cmd_sn(&self) -> u32 {
        self.cmd_sn.0
    }

    /// The target's MaxCmdSN as last announced.
    pub fn max_cmd_sn(&self) -> u32 {
        self.max_cmd_sn.0
    }

    /// ExpStatSN to send.
    pub fn exp_stat_sn(&self) -> u32 {
        self.exp_stat_sn
    }

    /// Take a CmdSN for a PDU: an immediate one carries the current CmdSN without consuming
    /// it; a non-immediate one only while the window is open (`None`: wait for it to open).
    pub fn take(&mut self, immediate: bool) -> Option<u32> {
        let sn = self.cmd_sn.0;
        if immediate {
            return Some(sn);
        }
        if !self.cmd_sn.le(self.max_cmd_sn) {
            return None;
        }
        self.cmd_sn = self.cmd_sn.add(1);
        Some(sn)
    }

    /// Whether a non-immediate PDU could be sent now.
    pub fn is_open(&self) -> bool {
        self.cmd_sn.le(self.max_cmd_sn)
    }

    /// Learn from a received PDU's StatSN, ExpCmdSN and MaxCmdSN. Returns whether the window
    /// opened. A MaxCmdSN below ExpCmdSN − 1 is ignored and the window never moves back
    /// (§4.2.2.1); StatSN advances ExpStatSN only on PDUs that consume one.
    pub fn note(&mut self, h: &Header) -> bool {
        let (stat_sn, exp, max, advances) = match *h {
            Header::ScsiResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::DataIn(d) if d.status_present => (d.stat_sn, d.exp_cmd_sn, d.max_cmd_sn, true),
            Header::DataIn(d) => (d.stat_sn, d.exp_cmd_sn, d.max_cmd_sn, false),
            Header::NopIn(n) => (n.stat_sn, n.exp_cmd_sn, n.max_cmd_sn, n.itt != RESERVED_TAG),
            Header::TaskMgmtResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::LogoutResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::TextResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::Reject(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, true),
            Header::AsyncMessage(a) => (a.stat_sn, a.exp_cmd_sn, a.max_cmd_sn, true),
            Header::R2t(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn, false),
            _ => return false,
        };
        if advances && SerialNumber(stat_sn).ge(SerialNumber(self.exp_stat_sn)) {
            self.exp_stat_sn = stat_sn.wrapping_add(1);
        }
        let (exp, max) = (SerialNumber(exp), SerialNumber(max));
        if max.ge(exp.sub(1)) && max.gt(self.max_cmd_sn) {
            let was_open = self.is_open();
            self.max_cmd_sn = max;
            return !was_open && self.is_open();
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{NopIn, ScsiResponse};

    #[test]
    fn commands_are_accepted_once_in_any_order_inside_the_window() {
        let mut w = CommandWindow::new(10, 4);
        assert_eq!((w.exp_cmd_sn(), w.max_cmd_sn()), (10, 13));
        assert!(w.admit(12));
        assert_eq!(w.exp_cmd_sn(), 10, "a gap holds ExpCmdSN");
        assert!(!w.admit(12), "duplicate");
        assert!(w.admit(10));
        assert_eq!(w.exp_cmd_sn(), 11);
        assert!(w.admit(11));
        assert_eq!(w.exp_cmd_sn(), 13, "ExpCmdSN jumps over what arrived early");
        assert!(!w.admit(14), "beyond MaxCmdSN");
        assert!(!w.admit(9), "below ExpCmdSN");
        assert!(w.admit(13));
        assert!(!w.admit(14));
        w.open_one();
        assert!(w.admit(14));
    }

    #[test]
    fn the_window_wraps_around_the_serial_number_space() {
        let mut w = CommandWindow::new(u32::MAX - 1, 4);
        assert_eq!(w.max_cmd_sn(), 1);
        for sn in [u32::MAX - 1, u32::MAX, 0, 1] {
            assert!(w.admit(sn), "{sn}");
        }
        assert_eq!(w.exp_cmd_sn(), 2);
        assert!(!w.admit(2));
        w.open_one();
        assert!(w.admit(2));
    }

    #[test]
    fn a_command_not_yet_received_is_known_as_such() {
        let mut w = CommandWindow::new(5, 8);
        assert!(w.admit(7));
        assert!(w.not_yet_received(5));
        assert!(!w.not_yet_received(7), "received");
        assert!(!w.not_yet_received(4), "before the window: it came and went");
        assert!(!w.not_yet_received(13), "beyond the window");
    }

    #[test]
    fn behind_a_gap_the_window_stops_at_twice_its_depth() {
        // An initiator that never sends CmdSN 10 but keeps sending (and finishing) the rest.
        let mut w = CommandWindow::new(10, 4);
        let mut sn = 11;
        while w.admit(sn) {
            w.open_one();
            sn += 1;
        }
        assert_eq!((w.exp_cmd_sn(), w.max_cmd_sn(), sn), (10, 17, 18), "MaxCmdSN stops at ExpCmdSN + 2 x 4 - 1");
        assert_eq!(w.ahead.len(), 7);
        // The gap closes: ExpCmdSN passes everything received, and the slots given back count.
        assert!(w.admit(10));
        assert_eq!((w.exp_cmd_sn(), w.max_cmd_sn()), (18, 20));
        assert!(w.ahead.is_empty());
    }

    #[test]
    fn a_zero_depth_still_admits_one_command() {
        let mut w = CommandWindow::new(0, 0);
        assert!(w.admit(0));
        assert!(!w.admit(1));
    }

    fn response(stat_sn: u32, exp: u32, max: u32) -> Header {
        Header::ScsiResponse(ScsiResponse { stat_sn, exp_cmd_sn: exp, max_cmd_sn: max, ..ScsiResponse::default() })
    }

    #[test]
    fn the_initiator_waits_for_the_window_and_learns_when_it_opens() {
        let mut w = InitiatorWindow::new(1, 2, 100);
        assert_eq!(w.take(false), Some(1));
        assert_eq!(w.take(true), Some(2), "immediate: the current CmdSN, not consumed");
        assert_eq!(w.take(false), Some(2));
        assert_eq!(w.take(false), None, "the window is closed");
        assert!(w.note(&response(100, 3, 3)), "it opened");
        assert_eq!(w.exp_stat_sn(), 101);
        assert_eq!(w.take(false), Some(3));
    }

    #[test]
    fn the_initiator_ignores_a_window_that_moves_back_or_is_invalid() {
        let mut w = InitiatorWindow::new(10, 20, 0);
        assert!(!w.note(&response(0, 10, 15)), "back");
        assert_eq!(w.max_cmd_sn(), 20);
        assert!(!w.note(&response(1, 30, 25)), "MaxCmdSN < ExpCmdSN - 1: invalid");
        assert_eq!(w.max_cmd_sn(), 20);
        // An unsolicited NOP-In (ping) carries StatSN without consuming it.
        w.note(&Header::NopIn(NopIn { itt: RESERVED_TAG, stat_sn: 7, exp_cmd_sn: 10, max_cmd_sn: 20, ..NopIn::default() }));
        assert_eq!(w.exp_stat_sn(), 2);
        // ExpStatSN never moves back.
        w.note(&response(0, 10, 20));
        assert_eq!(w.exp_stat_sn(), 2);
    }
}
