//! Logout Request (RFC 7143 §11.14) and Logout Response (§11.15), with their code spaces.

use super::bhs::{BHS_LEN, Bhs, FINAL};
use super::{DecodeError, Opcode};

code_space!(
    /// Logout reason (RFC 7143 §11.14.1).
    LogoutReason(u8) {
        /// Close the session.
        CLOSE_SESSION = 0,
        /// Close the connection.
        CLOSE_CONNECTION = 1,
        /// Remove the connection for recovery.
        REMOVE_FOR_RECOVERY = 2,
    }
);

code_space!(
    /// Logout response (RFC 7143 §11.15.1).
    LogoutResponseCode(u8) {
        /// Connection or session closed successfully.
        SUCCESS = 0,
        /// CID not found.
        CID_NOT_FOUND = 1,
        /// Connection recovery is not supported.
        RECOVERY_NOT_SUPPORTED = 2,
        /// Cleanup failed for various reasons.
        CLEANUP_FAILED = 3,
    }
);

/// Byte offsets of the Logout fields.
mod field {
    pub(super) use super::super::bhs::field::{CMD_SN, EXP_CMD_SN, EXP_STAT_SN, ITT, MAX_CMD_SN, STAT_SN};

    /// Request: CID (or reserved when the session closes).
    pub(super) const CID: usize = 20;
    /// Response: the response code.
    pub(super) const RESPONSE: usize = 2;
    /// Response: Time2Wait.
    pub(super) const TIME2WAIT: usize = 40;
    /// Response: Time2Retain.
    pub(super) const TIME2RETAIN: usize = 42;
}

/// Flags (byte 1) of the request.
mod flags {
    /// The reason code, below the F bit.
    pub(super) const REASON: u8 = 0x7f;
}

/// Logout Request (0x06).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct LogoutRequest {
    pub immediate: bool,
    pub reason: LogoutReason,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl LogoutRequest {
    /// The fields of a Logout Request BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            immediate: h.immediate(),
            reason: LogoutReason(h.flags() & flags::REASON),
            itt: h.u32(field::ITT),
            cid: h.u16(field::CID),
            cmd_sn: h.u32(field::CMD_SN),
            exp_stat_sn: h.u32(field::EXP_STAT_SN),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::LOGOUT_REQUEST, self.immediate);
        h.set_flags(FINAL | (self.reason.0 & flags::REASON));
        h.set_u32(field::ITT, self.itt);
        h.set_u16(field::CID, self.cid);
        h.set_u32(field::CMD_SN, self.cmd_sn);
        h.set_u32(field::EXP_STAT_SN, self.exp_stat_sn);
    }
}

/// Logout Response (0x26).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct LogoutResponse {
    pub response: LogoutResponseCode,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

impl LogoutResponse {
    /// The fields of a Logout Response BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            response: LogoutResponseCode(h.u8(field::RESPONSE)),
            itt: h.u32(field::ITT),
            stat_sn: h.u32(field::STAT_SN),
            exp_cmd_sn: h.u32(field::EXP_CMD_SN),
            max_cmd_sn: h.u32(field::MAX_CMD_SN),
            time2wait: h.u16(field::TIME2WAIT),
            time2retain: h.u16(field::TIME2RETAIN),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::LOGOUT_RESPONSE, false);
        h.set_flags(FINAL);
        h.set_u8(field::RESPONSE, self.response.0);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::STAT_SN, self.stat_sn);
        h.set_u32(field::EXP_CMD_SN, self.exp_cmd_sn);
        h.set_u32(field::MAX_CMD_SN, self.max_cmd_sn);
        h.set_u16(field::TIME2WAIT, self.time2wait);
        h.set_u16(field::TIME2RETAIN, self.time2retain);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pdu::testing::{check, view};
    use super::super::{BHS_LEN, Header};
    use super::*;

    #[rustfmt::skip]
    const LOGOUT_REQUEST: [u8; BHS_LEN] = [
        0x46, 0x81, 0x00, 0x00, // I | 0x06, F | close the connection
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x0e, // ITT
        0x00, 0x03, 0x00, 0x00, // CID 3
        0x00, 0x00, 0x00, 0x21, // CmdSN
        0x00, 0x00, 0x00, 0x12, // ExpStatSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[rustfmt::skip]
    const LOGOUT_RESPONSE: [u8; BHS_LEN] = [
        0x26, 0x80, 0x02, 0x00, // 0x26, F, recovery not supported
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x0e, // ITT
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x12, // StatSN
        0x00, 0x00, 0x00, 0x22, // ExpCmdSN
        0x00, 0x00, 0x00, 0x62, // MaxCmdSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x02, 0x00, 0x14, // Time2Wait 2, Time2Retain 20
        0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn logout_request_close_connection() {
        let p = LogoutRequest::parse(&view(&LOGOUT_REQUEST)).unwrap();
        let expect =
            LogoutRequest { immediate: true, reason: LogoutReason::CLOSE_CONNECTION, itt: 0x0e, cid: 3, cmd_sn: 0x21, exp_stat_sn: 0x12 };
        assert_eq!(p, expect);
        check(&LOGOUT_REQUEST, Header::LogoutRequest(p));
    }

    #[test]
    fn logout_response_recovery_not_supported() {
        let p = LogoutResponse::parse(&view(&LOGOUT_RESPONSE)).unwrap();
        let expect = LogoutResponse {
            response: LogoutResponseCode::RECOVERY_NOT_SUPPORTED,
            itt: 0x0e,
            stat_sn: 0x12,
            exp_cmd_sn: 0x22,
            max_cmd_sn: 0x62,
            time2wait: 2,
            time2retain: 20,
        };
        assert_eq!(p, expect);
        check(&LOGOUT_RESPONSE, Header::LogoutResponse(p));
    }
}
