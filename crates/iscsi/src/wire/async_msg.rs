//! Asynchronous Message (RFC 7143 §11.9), with its event code space.

use super::bhs::{BHS_LEN, Bhs, FINAL};
use super::{DecodeError, Opcode};
use riser_scsi::lun::Lun;

code_space!(
    /// Asynchronous event (RFC 7143 §11.9.1).
    AsyncEvent(u8) {
        /// SCSI asynchronous event (sense data in the data segment).
        SCSI_EVENT = 0,
        /// Target requests logout.
        REQUEST_LOGOUT = 1,
        /// Target will drop the connection.
        DROP_CONNECTION = 2,
        /// Target will drop all connections of the session.
        DROP_ALL_CONNECTIONS = 3,
        /// Target requests parameter renegotiation.
        RENEGOTIATE = 4,
        /// Vendor specific.
        VENDOR = 255,
    }
);

/// Byte offsets of the Asynchronous Message fields.
mod field {
    pub(super) use super::super::bhs::field::{EXP_CMD_SN, ITT, MAX_CMD_SN, STAT_SN};

    /// AsyncEvent.
    pub(super) const EVENT: usize = 36;
    /// AsyncVCode.
    pub(super) const VCODE: usize = 37;
    /// Parameter1.
    pub(super) const PARAMETER1: usize = 38;
    /// Parameter2.
    pub(super) const PARAMETER2: usize = 40;
    /// Parameter3.
    pub(super) const PARAMETER3: usize = 42;
}

/// Asynchronous Message (0x32).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct AsyncMessage {
    pub lun: Lun,
    /// Always 0xFFFFFFFF on the wire per RFC; kept for round trips.
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub event: AsyncEvent,
    pub vcode: u8,
    pub param1: u16,
    pub param2: u16,
    pub param3: u16,
}

impl AsyncMessage {
    /// The fields of an Asynchronous Message BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            lun: h.lun(),
            itt: h.u32(field::ITT),
            stat_sn: h.u32(field::STAT_SN),
            exp_cmd_sn: h.u32(field::EXP_CMD_SN),
            max_cmd_sn: h.u32(field::MAX_CMD_SN),
            event: AsyncEvent(h.u8(field::EVENT)),
            vcode: h.u8(field::VCODE),
            param1: h.u16(field::PARAMETER1),
            param2: h.u16(field::PARAMETER2),
            param3: h.u16(field::PARAMETER3),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::ASYNC_MESSAGE, false);
        h.set_flags(FINAL);
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::STAT_SN, self.stat_sn);
        h.set_u32(field::EXP_CMD_SN, self.exp_cmd_sn);
        h.set_u32(field::MAX_CMD_SN, self.max_cmd_sn);
        h.set_u8(field::EVENT, self.event.0);
        h.set_u8(field::VCODE, self.vcode);
        h.set_u16(field::PARAMETER1, self.param1);
        h.set_u16(field::PARAMETER2, self.param2);
        h.set_u16(field::PARAMETER3, self.param3);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pdu::testing::{check, view};
    use super::super::{BHS_LEN, Header};
    use super::*;

    /// The target will drop connection 1 in 2 seconds; reconnect within 20.
    #[rustfmt::skip]
    const DROP_CONNECTION: [u8; BHS_LEN] = [
        0x32, 0x80, 0x00, 0x00, // 0x32, F
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, // LUN 0
        0x00, 0x00, 0x00, 0x00,
        0xff, 0xff, 0xff, 0xff, // ITT (reserved)
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x08, // StatSN
        0x00, 0x00, 0x00, 0x09, // ExpCmdSN
        0x00, 0x00, 0x00, 0x28, // MaxCmdSN
        0x02, 0x00, 0x00, 0x01, // AsyncEvent drop connection, AsyncVCode, Parameter1: CID 1
        0x00, 0x02, 0x00, 0x14, // Parameter2: Time2Wait 2, Parameter3: Time2Retain 20
        0x00, 0x00, 0x00, 0x00,
    ];

    /// A SCSI event (sense data in the data segment) for LUN 3, with a vendor code.
    #[rustfmt::skip]
    const SCSI_EVENT: [u8; BHS_LEN] = [
        0x32, 0x80, 0x00, 0x00, // 0x32, F
        0x00, 0x00, 0x00, 0x14, // DataSegmentLength 20
        0x00, 0x03, 0x00, 0x00, // LUN 3
        0x00, 0x00, 0x00, 0x00,
        0xff, 0xff, 0xff, 0xff, // ITT (reserved)
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x0a, // StatSN
        0x00, 0x00, 0x00, 0x0b, // ExpCmdSN
        0x00, 0x00, 0x00, 0x2b, // MaxCmdSN
        0x00, 0x5a, 0x00, 0x00, // AsyncEvent SCSI event, AsyncVCode
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn async_drop_connection() {
        let p = AsyncMessage::parse(&view(&DROP_CONNECTION)).unwrap();
        let expect = AsyncMessage {
            lun: Lun::ZERO,
            itt: u32::MAX,
            stat_sn: 8,
            exp_cmd_sn: 9,
            max_cmd_sn: 40,
            event: AsyncEvent::DROP_CONNECTION,
            vcode: 0,
            param1: 1,
            param2: 2,
            param3: 20,
        };
        assert_eq!(p, expect);
        check(&DROP_CONNECTION, Header::AsyncMessage(p));
    }

    #[test]
    fn async_scsi_event() {
        let p = AsyncMessage::parse(&view(&SCSI_EVENT)).unwrap();
        let expect = AsyncMessage {
            lun: Lun::from_number(3).unwrap(),
            itt: u32::MAX,
            stat_sn: 10,
            exp_cmd_sn: 11,
            max_cmd_sn: 43,
            event: AsyncEvent::SCSI_EVENT,
            vcode: 0x5a,
            param1: 0,
            param2: 0,
            param3: 0,
        };
        assert_eq!(p, expect);
        check(&SCSI_EVENT, Header::AsyncMessage(p));
    }
}
