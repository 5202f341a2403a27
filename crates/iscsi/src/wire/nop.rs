//! NOP-Out (RFC 7143 §11.18) and NOP-In (§11.19): pings in either direction, and the answers.

use super::bhs::{BHS_LEN, Bhs, FINAL};
use super::{DecodeError, Opcode};
use riser_scsi::lun::Lun;

/// Byte offsets of the NOP fields.
mod field {
    pub(super) use super::super::bhs::field::{CMD_SN, EXP_CMD_SN, EXP_STAT_SN, ITT, MAX_CMD_SN, STAT_SN, TTT};
}

/// NOP-Out (0x00).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: Lun,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl NopOut {
    /// The fields of a NOP-Out BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            immediate: h.immediate(),
            lun: h.lun(),
            itt: h.u32(field::ITT),
            ttt: h.u32(field::TTT),
            cmd_sn: h.u32(field::CMD_SN),
            exp_stat_sn: h.u32(field::EXP_STAT_SN),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::NOP_OUT, self.immediate);
        h.set_flags(FINAL);
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::TTT, self.ttt);
        h.set_u32(field::CMD_SN, self.cmd_sn);
        h.set_u32(field::EXP_STAT_SN, self.exp_stat_sn);
    }
}

/// NOP-In (0x20).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct NopIn {
    pub lun: Lun,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

impl NopIn {
    /// The fields of a NOP-In BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            lun: h.lun(),
            itt: h.u32(field::ITT),
            ttt: h.u32(field::TTT),
            stat_sn: h.u32(field::STAT_SN),
            exp_cmd_sn: h.u32(field::EXP_CMD_SN),
            max_cmd_sn: h.u32(field::MAX_CMD_SN),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::NOP_IN, false);
        h.set_flags(FINAL);
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::TTT, self.ttt);
        h.set_u32(field::STAT_SN, self.stat_sn);
        h.set_u32(field::EXP_CMD_SN, self.exp_cmd_sn);
        h.set_u32(field::MAX_CMD_SN, self.max_cmd_sn);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pdu::testing::{check, view};
    use super::super::{BHS_LEN, Header};
    use super::*;

    #[rustfmt::skip]
    const NOP_OUT: [u8; BHS_LEN] = [
        0x40, 0x80, 0x00, 0x00, // I | 0x00, F
        0x00, 0x00, 0x00, 0x04, // TotalAHSLength, DataSegmentLength (4 bytes of ping data)
        0x00, 0x03, 0x00, 0x00, // LUN 3
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x05, // ITT
        0xff, 0xff, 0xff, 0xff, // TTT (reserved: an initiator's ping)
        0x00, 0x00, 0x00, 0x09, // CmdSN
        0x00, 0x00, 0x00, 0x02, // ExpStatSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[rustfmt::skip]
    const NOP_IN: [u8; BHS_LEN] = [
        0x20, 0x80, 0x00, 0x00, // 0x20, F
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x01, 0x00, 0x00, // LUN 1
        0x00, 0x00, 0x00, 0x00,
        0xff, 0xff, 0xff, 0xff, // ITT (reserved: the target's ping)
        0x00, 0x00, 0x00, 0x01, // TTT
        0x00, 0x00, 0x00, 0x0a, // StatSN
        0x00, 0x00, 0x00, 0x0b, // ExpCmdSN
        0x00, 0x00, 0x00, 0x2a, // MaxCmdSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn nop_out_ping() {
        let p = NopOut::parse(&view(&NOP_OUT)).unwrap();
        let lun = Lun::from_number(3).unwrap();
        assert_eq!(p, NopOut { immediate: true, lun, itt: 5, ttt: u32::MAX, cmd_sn: 9, exp_stat_sn: 2 });
        check(&NOP_OUT, Header::NopOut(p));
    }

    #[test]
    fn nop_in_target_ping() {
        let p = NopIn::parse(&view(&NOP_IN)).unwrap();
        let lun = Lun::from_number(1).unwrap();
        assert_eq!(p, NopIn { lun, itt: u32::MAX, ttt: 1, stat_sn: 10, exp_cmd_sn: 11, max_cmd_sn: 42 });
        check(&NOP_IN, Header::NopIn(p));
    }
}
