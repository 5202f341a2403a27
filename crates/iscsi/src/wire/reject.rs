//! Reject (RFC 7143 §11.17), with its reason code space. The data segment carries the rejected
//! PDU's header.

use super::bhs::{BHS_LEN, Bhs, FINAL};
use super::{DecodeError, Opcode};

code_space!(
    /// Reject reason (RFC 7143 §11.17.1).
    RejectReason(u8) {
        /// Data (payload) digest error.
        DATA_DIGEST_ERROR = 0x02,
        /// SNACK reject.
        SNACK_REJECT = 0x03,
        /// Protocol error.
        PROTOCOL_ERROR = 0x04,
        /// Command not supported.
        COMMAND_NOT_SUPPORTED = 0x05,
        /// Immediate command rejected: too many immediate commands.
        IMMEDIATE_COMMAND_REJECTED = 0x06,
        /// Task in progress.
        TASK_IN_PROGRESS = 0x07,
        /// Invalid data ACK.
        INVALID_DATA_ACK = 0x08,
        /// Invalid PDU field.
        INVALID_PDU_FIELD = 0x09,
        /// Long operation reject: out of resources.
        LONG_OP_REJECT = 0x0a,
        /// Deprecated (negotiation reset).
        NEGOTIATION_RESET = 0x0b,
        /// Waiting for logout.
        WAITING_FOR_LOGOUT = 0x0c,
    }
);

/// Byte offsets of the Reject fields.
mod field {
    pub(super) use super::super::bhs::field::{EXP_CMD_SN, ITT, MAX_CMD_SN, STAT_SN};

    /// Reason.
    pub(super) const REASON: usize = 2;
    /// DataSN/R2TSN (when a SNACK is rejected).
    pub(super) const DATA_SN: usize = 36;
}

/// Reject (0x3F). The data segment carries the rejected PDU's header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Reject {
    pub reason: RejectReason,
    /// Always 0xFFFFFFFF on the wire per RFC; kept for round trips.
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
}

impl Reject {
    /// The fields of a Reject BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            reason: RejectReason(h.u8(field::REASON)),
            itt: h.u32(field::ITT),
            stat_sn: h.u32(field::STAT_SN),
            exp_cmd_sn: h.u32(field::EXP_CMD_SN),
            max_cmd_sn: h.u32(field::MAX_CMD_SN),
            data_sn: h.u32(field::DATA_SN),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::REJECT, false);
        h.set_flags(FINAL);
        h.set_u8(field::REASON, self.reason.0);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::STAT_SN, self.stat_sn);
        h.set_u32(field::EXP_CMD_SN, self.exp_cmd_sn);
        h.set_u32(field::MAX_CMD_SN, self.max_cmd_sn);
        h.set_u32(field::DATA_SN, self.data_sn);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pdu::testing::{check, view};
    use super::super::{BHS_LEN, Header};
    use super::*;

    /// A protocol error; the data segment holds the 48-byte header rejected.
    #[rustfmt::skip]
    const PROTOCOL_ERROR: [u8; BHS_LEN] = [
        0x3f, 0x80, 0x04, 0x00, // 0x3f, F, reason protocol error
        0x00, 0x00, 0x00, 0x30, // DataSegmentLength 48
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0xff, 0xff, 0xff, 0xff, // ITT (reserved)
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x08, // StatSN
        0x00, 0x00, 0x00, 0x09, // ExpCmdSN
        0x00, 0x00, 0x00, 0x28, // MaxCmdSN
        0x00, 0x00, 0x00, 0x00, // DataSN/R2TSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    /// A SNACK rejected: the DataSN it asked for.
    #[rustfmt::skip]
    const SNACK_REJECT: [u8; BHS_LEN] = [
        0x3f, 0x80, 0x03, 0x00, // 0x3f, F, reason SNACK reject
        0x00, 0x00, 0x00, 0x30, // DataSegmentLength 48
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0xff, 0xff, 0xff, 0xff, // ITT (reserved)
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x0c, // StatSN
        0x00, 0x00, 0x00, 0x0d, // ExpCmdSN
        0x00, 0x00, 0x00, 0x2d, // MaxCmdSN
        0x00, 0x00, 0x00, 0x06, // DataSN/R2TSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn reject_protocol_error() {
        let p = Reject::parse(&view(&PROTOCOL_ERROR)).unwrap();
        let expect = Reject { reason: RejectReason::PROTOCOL_ERROR, itt: u32::MAX, stat_sn: 8, exp_cmd_sn: 9, max_cmd_sn: 40, data_sn: 0 };
        assert_eq!(p, expect);
        check(&PROTOCOL_ERROR, Header::Reject(p));
        assert_eq!(format!("{:?}", RejectReason(0x04)), "PROTOCOL_ERROR");
        assert_eq!(format!("{:?}", RejectReason(0x77)), "RejectReason(0x77)");
    }

    #[test]
    fn reject_snack() {
        let p = Reject::parse(&view(&SNACK_REJECT)).unwrap();
        let expect = Reject { reason: RejectReason::SNACK_REJECT, itt: u32::MAX, stat_sn: 12, exp_cmd_sn: 13, max_cmd_sn: 45, data_sn: 6 };
        assert_eq!(p, expect);
        check(&SNACK_REJECT, Header::Reject(p));
    }
}
