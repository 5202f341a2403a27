//! The data transfer PDUs: SCSI Data-Out and Data-In (RFC 7143 §11.7) and Ready To Transfer
//! (§11.8).

use super::bhs::{BHS_LEN, Bhs, FINAL, bit, flag};
use super::{DecodeError, Opcode};
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

/// Byte offsets of the Data-Out, Data-In and R2T fields.
mod field {
    pub(super) use super::super::bhs::field::{EXP_CMD_SN, EXP_STAT_SN, ITT, MAX_CMD_SN, STAT_SN, TTT};

    /// Data-In: SCSI status (valid with the S bit).
    pub(super) const STATUS: usize = 3;
    /// Data-Out, Data-In: DataSN.
    pub(super) const DATA_SN: usize = 36;
    /// R2T: R2TSN.
    pub(super) const R2T_SN: usize = 36;
    /// Data-Out, Data-In, R2T: Buffer Offset.
    pub(super) const BUFFER_OFFSET: usize = 40;
    /// Data-In: Residual Count.
    pub(super) const RESIDUAL: usize = 44;
    /// R2T: Desired Data Transfer Length.
    pub(super) const DESIRED_LEN: usize = 44;
}

/// Flags (byte 1) of Data-In (Data-Out and R2T have only F).
mod flags {
    /// A: acknowledge requested.
    pub(super) const ACK: u8 = 0x40;
    /// O: residual overflow.
    pub(super) const OVERFLOW: u8 = 0x04;
    /// U: residual underflow.
    pub(super) const UNDERFLOW: u8 = 0x02;
    /// S: status present.
    pub(super) const STATUS: u8 = 0x01;
}

/// SCSI Data-Out (0x05).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct DataOut {
    pub final_: bool,
    pub lun: Lun,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

impl DataOut {
    /// The fields of a Data-Out BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            final_: bit(h.flags(), FINAL),
            lun: h.lun(),
            itt: h.u32(field::ITT),
            ttt: h.u32(field::TTT),
            exp_stat_sn: h.u32(field::EXP_STAT_SN),
            data_sn: h.u32(field::DATA_SN),
            buffer_offset: h.u32(field::BUFFER_OFFSET),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::DATA_OUT, false);
        h.set_flags(flag(self.final_, FINAL));
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::TTT, self.ttt);
        h.set_u32(field::EXP_STAT_SN, self.exp_stat_sn);
        h.set_u32(field::DATA_SN, self.data_sn);
        h.set_u32(field::BUFFER_OFFSET, self.buffer_offset);
    }
}

/// SCSI Data-In (0x25).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct DataIn {
    pub final_: bool,
    /// A: acknowledge requested (ERL > 0).
    pub ack: bool,
    pub overflow: bool,
    pub underflow: bool,
    /// S: status carried (phase collapse).
    pub status_present: bool,
    pub status: Status,
    pub lun: Lun,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub residual: u32,
}

impl DataIn {
    /// The fields of a Data-In BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        let f = h.flags();
        Ok(Self {
            final_: bit(f, FINAL),
            ack: bit(f, flags::ACK),
            overflow: bit(f, flags::OVERFLOW),
            underflow: bit(f, flags::UNDERFLOW),
            status_present: bit(f, flags::STATUS),
            status: Status(h.u8(field::STATUS)),
            lun: h.lun(),
            itt: h.u32(field::ITT),
            ttt: h.u32(field::TTT),
            stat_sn: h.u32(field::STAT_SN),
            exp_cmd_sn: h.u32(field::EXP_CMD_SN),
            max_cmd_sn: h.u32(field::MAX_CMD_SN),
            data_sn: h.u32(field::DATA_SN),
            buffer_offset: h.u32(field::BUFFER_OFFSET),
            residual: h.u32(field::RESIDUAL),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::DATA_IN, false);
        h.set_flags(
            flag(self.final_, FINAL)
                | flag(self.ack, flags::ACK)
                | flag(self.overflow, flags::OVERFLOW)
                | flag(self.underflow, flags::UNDERFLOW)
                | flag(self.status_present, flags::STATUS),
        );
        h.set_u8(field::STATUS, self.status.0);
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::TTT, self.ttt);
        h.set_u32(field::STAT_SN, self.stat_sn);
        h.set_u32(field::EXP_CMD_SN, self.exp_cmd_sn);
        h.set_u32(field::MAX_CMD_SN, self.max_cmd_sn);
        h.set_u32(field::DATA_SN, self.data_sn);
        h.set_u32(field::BUFFER_OFFSET, self.buffer_offset);
        h.set_u32(field::RESIDUAL, self.residual);
    }
}

/// Ready To Transfer (0x31).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct R2t {
    pub lun: Lun,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_len: u32,
}

impl R2t {
    /// The fields of an R2T BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            lun: h.lun(),
            itt: h.u32(field::ITT),
            ttt: h.u32(field::TTT),
            stat_sn: h.u32(field::STAT_SN),
            exp_cmd_sn: h.u32(field::EXP_CMD_SN),
            max_cmd_sn: h.u32(field::MAX_CMD_SN),
            r2t_sn: h.u32(field::R2T_SN),
            buffer_offset: h.u32(field::BUFFER_OFFSET),
            desired_len: h.u32(field::DESIRED_LEN),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::R2T, false);
        h.set_flags(FINAL);
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::TTT, self.ttt);
        h.set_u32(field::STAT_SN, self.stat_sn);
        h.set_u32(field::EXP_CMD_SN, self.exp_cmd_sn);
        h.set_u32(field::MAX_CMD_SN, self.max_cmd_sn);
        h.set_u32(field::R2T_SN, self.r2t_sn);
        h.set_u32(field::BUFFER_OFFSET, self.buffer_offset);
        h.set_u32(field::DESIRED_LEN, self.desired_len);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pdu::testing::{check, view};
    use super::super::{BHS_LEN, Header};
    use super::*;

    #[rustfmt::skip]
    const DATA_OUT: [u8; BHS_LEN] = [
        0x05, 0x80, 0x00, 0x00, // 0x05, F
        0x00, 0x00, 0x20, 0x00, // DataSegmentLength 8192
        0x00, 0x01, 0x00, 0x00, // LUN 1
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x11, // ITT
        0x00, 0x00, 0x00, 0x22, // TTT
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x33, // ExpStatSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x02, // DataSN
        0x00, 0x00, 0x40, 0x00, // Buffer Offset 16384
        0x00, 0x00, 0x00, 0x00,
    ];

    #[rustfmt::skip]
    const DATA_IN: [u8; BHS_LEN] = [
        0x25, 0xc3, 0x00, 0x00, // 0x25, F | A | U | S, status GOOD
        0x00, 0x00, 0x02, 0x00, // DataSegmentLength 512
        0x00, 0x04, 0x00, 0x00, // LUN 4
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x07, // ITT
        0x00, 0x00, 0x00, 0x08, // TTT
        0x00, 0x00, 0x00, 0x0c, // StatSN
        0x00, 0x00, 0x00, 0x0d, // ExpCmdSN
        0x00, 0x00, 0x00, 0x4d, // MaxCmdSN
        0x00, 0x00, 0x00, 0x03, // DataSN
        0x00, 0x01, 0x00, 0x00, // Buffer Offset 65536
        0x00, 0x00, 0x01, 0x00, // Residual Count 256
    ];

    #[rustfmt::skip]
    const R2T: [u8; BHS_LEN] = [
        0x31, 0x80, 0x00, 0x00, // 0x31, F
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x05, 0x00, 0x00, // LUN 5
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x09, // ITT
        0x00, 0x00, 0x01, 0x01, // TTT
        0x00, 0x00, 0x00, 0x0e, // StatSN
        0x00, 0x00, 0x00, 0x0f, // ExpCmdSN
        0x00, 0x00, 0x00, 0x4f, // MaxCmdSN
        0x00, 0x00, 0x00, 0x01, // R2TSN
        0x00, 0x00, 0x80, 0x00, // Buffer Offset 32768
        0x00, 0x04, 0x00, 0x00, // Desired Data Transfer Length 256 KiB
    ];

    #[test]
    fn data_out_final() {
        let p = DataOut::parse(&view(&DATA_OUT)).unwrap();
        let lun = Lun::from_number(1).unwrap();
        assert_eq!(p, DataOut { final_: true, lun, itt: 0x11, ttt: 0x22, exp_stat_sn: 0x33, data_sn: 2, buffer_offset: 16384 });
        check(&DATA_OUT, Header::DataOut(p));
    }

    #[test]
    fn data_in_with_status() {
        let p = DataIn::parse(&view(&DATA_IN)).unwrap();
        let expect = DataIn {
            final_: true,
            ack: true,
            overflow: false,
            underflow: true,
            status_present: true,
            status: Status::GOOD,
            lun: Lun::from_number(4).unwrap(),
            itt: 7,
            ttt: 8,
            stat_sn: 12,
            exp_cmd_sn: 13,
            max_cmd_sn: 77,
            data_sn: 3,
            buffer_offset: 65536,
            residual: 256,
        };
        assert_eq!(p, expect);
        check(&DATA_IN, Header::DataIn(p));
    }

    #[test]
    fn r2t() {
        let p = R2t::parse(&view(&R2T)).unwrap();
        let expect = R2t {
            lun: Lun::from_number(5).unwrap(),
            itt: 9,
            ttt: 0x101,
            stat_sn: 14,
            exp_cmd_sn: 15,
            max_cmd_sn: 79,
            r2t_sn: 1,
            buffer_offset: 32768,
            desired_len: 256 * 1024,
        };
        assert_eq!(p, expect);
        check(&R2T, Header::R2t(p));
    }
}
