//! Login Request (RFC 7143 §11.12) and Login Response (§11.13), and the response's
//! [`LoginStatus`]. The login state machines that exchange them are in [`crate::login`].

use super::bhs::{BHS_LEN, Bhs, bit, flag};
use super::{DecodeError, Isid, Opcode, Stage};
use core::fmt;

/// Login status class and detail (RFC 7143 §11.13.5).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LoginStatus {
    /// Status-Class.
    pub class: u8,
    /// Status-Detail.
    pub detail: u8,
}

macro_rules! statuses {
    ($($(#[$m:meta])* $name:ident = $c:literal, $d:literal;)*) => {
        impl LoginStatus {
            $($(#[$m])* pub const $name: Self = Self { class: $c, detail: $d };)*
            /// The constant's name, if known.
            pub const fn name(self) -> Option<&'static str> {
                match (self.class, self.detail) {
                    $(($c, $d) => Some(stringify!($name)),)*
                    _ => None,
                }
            }
        }
    };
}

statuses! {
    /// Login is proceeding OK.
    SUCCESS = 0, 0;
    /// Target moved temporarily (TargetAddress in the response).
    TARGET_MOVED_TEMPORARILY = 1, 1;
    /// Target moved permanently.
    TARGET_MOVED_PERMANENTLY = 1, 2;
    /// Miscellaneous initiator error.
    INITIATOR_ERROR = 2, 0;
    /// Authentication failed.
    AUTHENTICATION_FAILURE = 2, 1;
    /// Authorization failure (not allowed to access this target).
    AUTHORIZATION_FAILURE = 2, 2;
    /// Target not found.
    NOT_FOUND = 2, 3;
    /// Target removed.
    TARGET_REMOVED = 2, 4;
    /// Unsupported version.
    UNSUPPORTED_VERSION = 2, 5;
    /// Too many connections.
    TOO_MANY_CONNECTIONS = 2, 6;
    /// Missing parameter.
    MISSING_PARAMETER = 2, 7;
    /// Can't include in session.
    CANT_INCLUDE_IN_SESSION = 2, 8;
    /// Session type not supported.
    SESSION_TYPE_NOT_SUPPORTED = 2, 9;
    /// Session does not exist.
    SESSION_DOES_NOT_EXIST = 2, 10;
    /// Invalid request during login.
    INVALID_DURING_LOGIN = 2, 11;
    /// Target hardware or software error.
    TARGET_ERROR = 3, 0;
    /// Service unavailable.
    SERVICE_UNAVAILABLE = 3, 1;
    /// Out of resources.
    OUT_OF_RESOURCES = 3, 2;
}

impl fmt::Debug for LoginStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:02x}{:02x}", self.class, self.detail)?;
        if let Some(n) = self.name() {
            write!(f, " {n}")?;
        }
        Ok(())
    }
}

impl fmt::Display for LoginStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

/// Byte offsets of the Login Request and Response fields.
mod field {
    use core::ops::Range;

    pub(super) use super::super::bhs::field::{CMD_SN, EXP_CMD_SN, EXP_STAT_SN, ITT, MAX_CMD_SN, STAT_SN};

    /// Version-max.
    pub(super) const VERSION_MAX: usize = 2;
    /// Request: Version-min.
    pub(super) const VERSION_MIN: usize = 3;
    /// Response: Version-active.
    pub(super) const VERSION_ACTIVE: usize = 3;
    /// ISID (where other PDUs have the LUN).
    pub(super) const ISID: Range<usize> = 8..14;
    /// TSIH.
    pub(super) const TSIH: usize = 14;
    /// Request: CID.
    pub(super) const CID: usize = 20;
    /// Response: Status-Class.
    pub(super) const STATUS_CLASS: usize = 36;
    /// Response: Status-Detail.
    pub(super) const STATUS_DETAIL: usize = 37;
}

/// Flags (byte 1) of both directions.
mod flags {
    /// T: transit to the next stage.
    pub(super) const TRANSIT: u8 = 0x80;
    /// C: the text continues in the next PDU.
    pub(super) const CONTINUE: u8 = 0x40;
    /// CSG: the current stage, two bits from bit 2.
    pub(super) const CSG_SHIFT: u8 = 2;
    /// NSG: the next stage, the low two bits; CSG has the same width.
    pub(super) const STAGE: u8 = 0x03;
}

/// The flags byte of a Login PDU: T, C, CSG and NSG; T and C together are refused.
struct LoginFlags {
    transit: bool,
    cont: bool,
    csg: Stage,
    nsg: Stage,
}

impl LoginFlags {
    #[inline]
    fn parse(f: u8) -> Result<Self, DecodeError> {
        let (transit, cont) = (bit(f, flags::TRANSIT), bit(f, flags::CONTINUE));
        if transit && cont {
            return Err(DecodeError::InvalidField("login T and C both set"));
        }
        Ok(Self { transit, cont, csg: Stage((f >> flags::CSG_SHIFT) & flags::STAGE), nsg: Stage(f & flags::STAGE) })
    }

    #[inline]
    const fn emit(&self) -> u8 {
        flag(self.transit, flags::TRANSIT)
            | flag(self.cont, flags::CONTINUE)
            | ((self.csg.0 & flags::STAGE) << flags::CSG_SHIFT)
            | (self.nsg.0 & flags::STAGE)
    }
}

#[inline]
fn isid<T: AsRef<[u8]>>(h: &Bhs<T>) -> Isid {
    let mut i = [0u8; 6];
    i.copy_from_slice(&h.bytes()[field::ISID]);
    Isid(i)
}

/// Login Request (0x03; always immediate).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct LoginRequest {
    pub transit: bool,
    pub cont: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: Isid,
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

impl LoginRequest {
    /// The fields of a Login Request BHS; T and C both set is an invalid field.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        let LoginFlags { transit, cont, csg, nsg } = LoginFlags::parse(h.flags())?;
        Ok(Self {
            transit,
            cont,
            csg,
            nsg,
            version_max: h.u8(field::VERSION_MAX),
            version_min: h.u8(field::VERSION_MIN),
            isid: isid(h),
            tsih: h.u16(field::TSIH),
            itt: h.u32(field::ITT),
            cid: h.u16(field::CID),
            cmd_sn: h.u32(field::CMD_SN),
            exp_stat_sn: h.u32(field::EXP_STAT_SN),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::LOGIN_REQUEST, true);
        h.set_flags(LoginFlags { transit: self.transit, cont: self.cont, csg: self.csg, nsg: self.nsg }.emit());
        h.set_u8(field::VERSION_MAX, self.version_max);
        h.set_u8(field::VERSION_MIN, self.version_min);
        h.set_bytes(field::ISID, &self.isid.0);
        h.set_u16(field::TSIH, self.tsih);
        h.set_u32(field::ITT, self.itt);
        h.set_u16(field::CID, self.cid);
        h.set_u32(field::CMD_SN, self.cmd_sn);
        h.set_u32(field::EXP_STAT_SN, self.exp_stat_sn);
    }
}

/// Login Response (0x23).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct LoginResponse {
    pub transit: bool,
    pub cont: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: Isid,
    pub tsih: u16,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub status_class: u8,
    pub status_detail: u8,
}

impl LoginResponse {
    /// The fields of a Login Response BHS; T and C both set is an invalid field.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        let LoginFlags { transit, cont, csg, nsg } = LoginFlags::parse(h.flags())?;
        Ok(Self {
            transit,
            cont,
            csg,
            nsg,
            version_max: h.u8(field::VERSION_MAX),
            version_active: h.u8(field::VERSION_ACTIVE),
            isid: isid(h),
            tsih: h.u16(field::TSIH),
            itt: h.u32(field::ITT),
            stat_sn: h.u32(field::STAT_SN),
            exp_cmd_sn: h.u32(field::EXP_CMD_SN),
            max_cmd_sn: h.u32(field::MAX_CMD_SN),
            status_class: h.u8(field::STATUS_CLASS),
            status_detail: h.u8(field::STATUS_DETAIL),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::LOGIN_RESPONSE, false);
        h.set_flags(LoginFlags { transit: self.transit, cont: self.cont, csg: self.csg, nsg: self.nsg }.emit());
        h.set_u8(field::VERSION_MAX, self.version_max);
        h.set_u8(field::VERSION_ACTIVE, self.version_active);
        h.set_bytes(field::ISID, &self.isid.0);
        h.set_u16(field::TSIH, self.tsih);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::STAT_SN, self.stat_sn);
        h.set_u32(field::EXP_CMD_SN, self.exp_cmd_sn);
        h.set_u32(field::MAX_CMD_SN, self.max_cmd_sn);
        h.set_u8(field::STATUS_CLASS, self.status_class);
        h.set_u8(field::STATUS_DETAIL, self.status_detail);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pdu::testing::{check, view};
    use super::super::{BHS_LEN, Header};
    use super::*;

    /// The first request of a login adding connection 2 to session 0x1201: security stage,
    /// transit to operational negotiation.
    #[rustfmt::skip]
    const LOGIN_REQUEST: [u8; BHS_LEN] = [
        0x43, 0x81, 0x00, 0x00, // I | 0x03, T | CSG 0 | NSG 1, Version-max, Version-min
        0x00, 0x00, 0x01, 0x2c, // DataSegmentLength 300
        0x80, 0x12, 0x34, 0x56, // ISID
        0x78, 0x9a, 0x12, 0x01, // ISID, TSIH
        0x00, 0x00, 0x00, 0x01, // ITT
        0x00, 0x02, 0x00, 0x00, // CID 2
        0x00, 0x00, 0x00, 0x07, // CmdSN
        0x00, 0x00, 0x00, 0x03, // ExpStatSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    /// A failed login in the operational stage (no T: NSG is zero).
    #[rustfmt::skip]
    const LOGIN_RESPONSE: [u8; BHS_LEN] = [
        0x23, 0x04, 0x00, 0x00, // 0x23, CSG 1, Version-max, Version-active
        0x00, 0x00, 0x00, 0x00,
        0x80, 0x12, 0x34, 0x56, // ISID
        0x78, 0x9a, 0x12, 0x01, // ISID, TSIH
        0x00, 0x00, 0x00, 0x01, // ITT
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x04, // StatSN
        0x00, 0x00, 0x00, 0x07, // ExpCmdSN
        0x00, 0x00, 0x00, 0x47, // MaxCmdSN
        0x02, 0x07, 0x00, 0x00, // Status-Class, Status-Detail: missing parameter
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    const ISID: Isid = Isid([0x80, 0x12, 0x34, 0x56, 0x78, 0x9a]);

    #[test]
    fn login_request_security_to_operational() {
        let p = LoginRequest::parse(&view(&LOGIN_REQUEST)).unwrap();
        let expect = LoginRequest {
            transit: true,
            cont: false,
            csg: Stage::SECURITY,
            nsg: Stage::OPERATIONAL,
            version_max: 0,
            version_min: 0,
            isid: ISID,
            tsih: 0x1201,
            itt: 1,
            cid: 2,
            cmd_sn: 7,
            exp_stat_sn: 3,
        };
        assert_eq!(p, expect);
        check(&LOGIN_REQUEST, Header::LoginRequest(p));
    }

    #[test]
    fn login_response_missing_parameter() {
        let p = LoginResponse::parse(&view(&LOGIN_RESPONSE)).unwrap();
        let expect = LoginResponse {
            transit: false,
            cont: false,
            csg: Stage::OPERATIONAL,
            nsg: Stage::SECURITY,
            version_max: 0,
            version_active: 0,
            isid: ISID,
            tsih: 0x1201,
            itt: 1,
            stat_sn: 4,
            exp_cmd_sn: 7,
            max_cmd_sn: 0x47,
            status_class: 2,
            status_detail: 7,
        };
        assert_eq!(p, expect);
        assert_eq!(LoginStatus { class: p.status_class, detail: p.status_detail }, LoginStatus::MISSING_PARAMETER);
        check(&LOGIN_RESPONSE, Header::LoginResponse(p));
    }

    #[test]
    fn transit_and_continue_together_are_invalid() {
        for mut b in [LOGIN_REQUEST, LOGIN_RESPONSE] {
            b[1] |= flags::TRANSIT | flags::CONTINUE;
            assert_eq!(Header::parse(&view(&b)), Err(DecodeError::InvalidField("login T and C both set")));
            b[1] &= !flags::TRANSIT;
            assert!(matches!(
                Header::parse(&view(&b)),
                Ok(Header::LoginRequest(LoginRequest { cont: true, .. }) | Header::LoginResponse(LoginResponse { cont: true, .. }))
            ));
        }
    }

    #[test]
    fn login_status_names() {
        assert_eq!(format!("{:?}", LoginStatus::NOT_FOUND), "0203 NOT_FOUND");
        assert_eq!(LoginStatus { class: 3, detail: 9 }.to_string(), "0309");
        assert_eq!(LoginStatus::SUCCESS.name(), Some("SUCCESS"));
    }
}
