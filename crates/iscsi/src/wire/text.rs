//! Text Request (RFC 7143 §11.10) and Text Response (§11.11).

use super::bhs::{BHS_LEN, Bhs, FINAL, bit, flag};
use super::{DecodeError, Opcode};
use riser_scsi::lun::Lun;

/// Byte offsets of the Text fields.
mod field {
    pub(super) use super::super::bhs::field::{CMD_SN, EXP_CMD_SN, EXP_STAT_SN, ITT, MAX_CMD_SN, STAT_SN, TTT};
}

/// Flags (byte 1) of both directions, besides F.
mod flags {
    /// C: the text continues in the next PDU.
    pub(super) const CONTINUE: u8 = 0x40;
}

/// Text Request (0x04).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_: bool,
    pub cont: bool,
    pub lun: Lun,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl TextRequest {
    /// The fields of a Text Request BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        let f = h.flags();
        Ok(Self {
            immediate: h.immediate(),
            final_: bit(f, FINAL),
            cont: bit(f, flags::CONTINUE),
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
        h.set_opcode(Opcode::TEXT_REQUEST, self.immediate);
        h.set_flags(flag(self.final_, FINAL) | flag(self.cont, flags::CONTINUE));
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::TTT, self.ttt);
        h.set_u32(field::CMD_SN, self.cmd_sn);
        h.set_u32(field::EXP_STAT_SN, self.exp_stat_sn);
    }
}

/// Text Response (0x24).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct TextResponse {
    pub final_: bool,
    pub cont: bool,
    pub lun: Lun,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

impl TextResponse {
    /// The fields of a Text Response BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        let f = h.flags();
        Ok(Self {
            final_: bit(f, FINAL),
            cont: bit(f, flags::CONTINUE),
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
        h.set_opcode(Opcode::TEXT_RESPONSE, false);
        h.set_flags(flag(self.final_, FINAL) | flag(self.cont, flags::CONTINUE));
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

    /// SendTargets=All, immediate, in one PDU.
    #[rustfmt::skip]
    const TEXT_REQUEST: [u8; BHS_LEN] = [
        0x44, 0x80, 0x00, 0x00, // I | 0x04, F
        0x00, 0x00, 0x00, 0x10, // DataSegmentLength 16
        0x00, 0x00, 0x00, 0x00, // LUN 0
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x02, // ITT
        0xff, 0xff, 0xff, 0xff, // TTT (a new exchange)
        0x00, 0x00, 0x00, 0x05, // CmdSN
        0x00, 0x00, 0x00, 0x06, // ExpStatSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    /// The first part of a long answer: C set, F clear, a TTT to continue with.
    #[rustfmt::skip]
    const TEXT_RESPONSE: [u8; BHS_LEN] = [
        0x24, 0x40, 0x00, 0x00, // 0x24, C
        0x00, 0x00, 0x20, 0x00, // DataSegmentLength 8192
        0x00, 0x07, 0x00, 0x00, // LUN 7
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x02, // ITT
        0x00, 0x00, 0x00, 0x17, // TTT
        0x00, 0x00, 0x00, 0x06, // StatSN
        0x00, 0x00, 0x00, 0x05, // ExpCmdSN
        0x00, 0x00, 0x00, 0x45, // MaxCmdSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn text_request_send_targets() {
        let p = TextRequest::parse(&view(&TEXT_REQUEST)).unwrap();
        let expect =
            TextRequest { immediate: true, final_: true, cont: false, lun: Lun::ZERO, itt: 2, ttt: u32::MAX, cmd_sn: 5, exp_stat_sn: 6 };
        assert_eq!(p, expect);
        check(&TEXT_REQUEST, Header::TextRequest(p));
    }

    #[test]
    fn text_response_continued() {
        let p = TextResponse::parse(&view(&TEXT_RESPONSE)).unwrap();
        let lun = Lun::from_number(7).unwrap();
        let expect = TextResponse { final_: false, cont: true, lun, itt: 2, ttt: 0x17, stat_sn: 6, exp_cmd_sn: 5, max_cmd_sn: 0x45 };
        assert_eq!(p, expect);
        check(&TEXT_RESPONSE, Header::TextResponse(p));
    }
}
