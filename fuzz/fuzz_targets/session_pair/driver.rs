//! The script's operations, and the network between the two machines.

use crate::input::{Input, lun, trace};
use crate::model::{Pair, Wire};
use bytes::Bytes;
use riser_iscsi::wire::{Header, TmfFunction};
use std::collections::VecDeque;
use std::time::Duration;

impl Pair {
    pub(crate) fn deliver_to_target(&mut self, w: Wire) {
        self.target_handles(&w.header, w.data, w.immediate);
    }

    pub(crate) fn target_handles(&mut self, header: &Header, data: Bytes, immediate: u32) {
        if trace() {
            eprintln!("  -> target {header:?}");
        }
        if matches!(header, Header::ScsiCommand(_)) && !self.t.is_closed() {
            self.commands_unanswered += 1;
        }
        self.t.handle_pdu(self.now, header, Bytes::new(), data, immediate);
    }

    pub(crate) fn deliver_to_initiator(&mut self, w: Wire) {
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

    pub(crate) fn op(&mut self, r: &mut Input) {
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
}
