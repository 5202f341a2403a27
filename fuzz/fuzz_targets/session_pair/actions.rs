//! The operations with more to them: commands (the initiator's and foreign ones), the target
//! application finishing, phase-collapsing and planning writes, raw headers to either side.

use crate::input::{Input, lun};
use crate::model::{Pair, Wire};
use bytes::Bytes;
use riser_iscsi::session::{Residual, TargetSession};
use riser_iscsi::wire::{
    BHS_LEN, Bhs, DataIn, DecodeError, Header, NopOut, R2t, RESERVED_TAG, ScsiCommand, TaskMgmtRequest, TextRequest, TmfFunction,
};
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

impl Pair {
    pub(crate) fn start_command(&mut self, r: &mut Input) {
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
    pub(crate) fn foreign_numbered(&mut self, r: &mut Input) {
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

    pub(crate) fn foreign_immediate_command(&mut self, r: &mut Input) {
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

    pub(crate) fn finish(&mut self, r: &mut Input) {
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

    pub(crate) fn take_status(&mut self, r: &mut Input) {
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

    pub(crate) fn plan_write(&mut self, r: &mut Input) {
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

    pub(crate) fn raw_to_target(&mut self, r: &mut Input) {
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

    pub(crate) fn raw_to_initiator(&mut self, r: &mut Input) {
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
}
