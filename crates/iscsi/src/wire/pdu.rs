//! Owned header values per opcode, the [`Header`] enum over them, and the [`Pdu`] container.

use super::bhs::{BHS_LEN, Bhs, FINAL, pad4};
use super::{AhsIter, DecodeError, MAX_DATA_SEGMENT_LEN, Opcode};
use alloc::vec::Vec;
use bytes::Bytes;
use core::fmt;
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

macro_rules! code_space {
    ($(#[$m:meta])* $name:ident($ty:ty) { $($(#[$cm:meta])* $c:ident = $v:literal,)* }) => {
        $(#[$m])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
        pub struct $name(pub $ty);
        impl $name {
            $($(#[$cm])* pub const $c: Self = Self($v);)*
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                match self.0 {
                    $($v => f.write_str(stringify!($c)),)*
                    other => write!(f, "{}({:#x})", stringify!($name), other),
                }
            }
        }
    };
}

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

code_space!(
    /// Task management function (RFC 7143 §11.5.1).
    TmfFunction(u8) {
        /// ABORT TASK.
        ABORT_TASK = 1,
        /// ABORT TASK SET.
        ABORT_TASK_SET = 2,
        /// CLEAR ACA.
        CLEAR_ACA = 3,
        /// CLEAR TASK SET.
        CLEAR_TASK_SET = 4,
        /// LOGICAL UNIT RESET.
        LOGICAL_UNIT_RESET = 5,
        /// TARGET WARM RESET.
        TARGET_WARM_RESET = 6,
        /// TARGET COLD RESET.
        TARGET_COLD_RESET = 7,
        /// TASK REASSIGN.
        TASK_REASSIGN = 8,
    }
);

code_space!(
    /// Task management response (RFC 7143 §11.6.1).
    TmfResponse(u8) {
        /// Function complete.
        COMPLETE = 0,
        /// Task does not exist.
        TASK_DOES_NOT_EXIST = 1,
        /// LUN does not exist.
        LUN_DOES_NOT_EXIST = 2,
        /// Task still allegiant.
        TASK_STILL_ALLEGIANT = 3,
        /// Task allegiance reassignment not supported.
        REASSIGNMENT_NOT_SUPPORTED = 4,
        /// Task management function not supported.
        NOT_SUPPORTED = 5,
        /// Function authorization failed.
        AUTHORIZATION_FAILED = 6,
        /// Function rejected.
        REJECTED = 255,
    }
);

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

/// Initiator Session ID (6 bytes).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Isid(pub [u8; 6]);

impl fmt::Debug for Isid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Isid(0x")?;
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        f.write_str(")")
    }
}

/// Login stage (CSG/NSG values).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug, Default)]
pub struct Stage(pub u8);

impl Stage {
    /// SecurityNegotiation.
    pub const SECURITY: Self = Self(0);
    /// LoginOperationalNegotiation.
    pub const OPERATIONAL: Self = Self(1);
    /// FullFeaturePhase.
    pub const FULL_FEATURE: Self = Self(3);
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

/// SCSI Command (0x01).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct ScsiCommand {
    pub immediate: bool,
    /// F: no unsolicited Data-Out follows.
    pub final_: bool,
    pub read: bool,
    pub write: bool,
    /// Task attribute (3 bits): 0 untagged, 1 simple, 2 ordered, 3 head of queue, 4 ACA.
    pub attr: u8,
    pub lun: Lun,
    pub itt: u32,
    pub expected_data_len: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    /// CDB bytes 0..16 (longer CDBs continue in an extended-CDB AHS).
    pub cdb: [u8; 16],
}

/// Task Management Function Request (0x02).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    pub function: TmfFunction,
    pub lun: Lun,
    pub itt: u32,
    pub ref_task_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
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

/// SNACK Request (0x10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Snack {
    /// Type (4 bits): 0 Data/R2T, 1 Status, 2 DataACK, 3 R-Data.
    pub snack_type: u8,
    pub lun: Lun,
    pub itt: u32,
    /// Target Transfer Tag or SNACK Tag.
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
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

/// SCSI Response (0x21).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct ScsiResponse {
    pub bidi_overflow: bool,
    pub bidi_underflow: bool,
    pub overflow: bool,
    pub underflow: bool,
    /// 0 command completed at target, 1 target failure.
    pub response: u8,
    pub status: Status,
    pub itt: u32,
    pub snack_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_data_sn: u32,
    pub bidi_read_residual: u32,
    pub residual: u32,
}

/// Task Management Function Response (0x22).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct TaskMgmtResponse {
    pub response: TmfResponse,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
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

/// A parsed BHS: one variant per opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub enum Header {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    Snack(Snack),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
    /// Vendor-specific or unassigned opcode: the 48 bytes as received, with TotalAHSLength and
    /// DataSegmentLength zeroed (they are the PDU's).
    Unknown([u8; BHS_LEN]),
}

const fn bit(b: u8, mask: u8) -> bool {
    b & mask != 0
}
const fn flag(on: bool, mask: u8) -> u8 {
    if on { mask } else { 0 }
}

impl Header {
    /// Parse the opcode-specific fields of a checked BHS.
    pub fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        let f = h.flags();
        let imm = h.immediate();
        Ok(match h.opcode() {
            Opcode::NOP_OUT => Self::NopOut(NopOut {
                immediate: imm,
                lun: h.lun(),
                itt: h.itt(),
                ttt: h.u32(20),
                cmd_sn: h.u32(24),
                exp_stat_sn: h.u32(28),
            }),
            Opcode::SCSI_COMMAND => {
                let mut cdb = [0u8; 16];
                cdb.copy_from_slice(&h.bytes()[32..48]);
                Self::ScsiCommand(ScsiCommand {
                    immediate: imm,
                    final_: bit(f, FINAL),
                    read: bit(f, 0x40),
                    write: bit(f, 0x20),
                    attr: f & 0x07,
                    lun: h.lun(),
                    itt: h.itt(),
                    expected_data_len: h.u32(20),
                    cmd_sn: h.u32(24),
                    exp_stat_sn: h.u32(28),
                    cdb,
                })
            }
            Opcode::TASK_MGMT_REQUEST => Self::TaskMgmtRequest(TaskMgmtRequest {
                immediate: imm,
                function: TmfFunction(f & 0x7f),
                lun: h.lun(),
                itt: h.itt(),
                ref_task_tag: h.u32(20),
                cmd_sn: h.u32(24),
                exp_stat_sn: h.u32(28),
                ref_cmd_sn: h.u32(32),
                exp_data_sn: h.u32(36),
            }),
            Opcode::LOGIN_REQUEST => {
                if bit(f, 0x80) && bit(f, 0x40) {
                    return Err(DecodeError::InvalidField("login T and C both set"));
                }
                Self::LoginRequest(LoginRequest {
                    transit: bit(f, 0x80),
                    cont: bit(f, 0x40),
                    csg: Stage((f >> 2) & 3),
                    nsg: Stage(f & 3),
                    version_max: h.u8(2),
                    version_min: h.u8(3),
                    isid: isid(h),
                    tsih: h.u16(14),
                    itt: h.itt(),
                    cid: h.u16(20),
                    cmd_sn: h.u32(24),
                    exp_stat_sn: h.u32(28),
                })
            }
            Opcode::TEXT_REQUEST => Self::TextRequest(TextRequest {
                immediate: imm,
                final_: bit(f, FINAL),
                cont: bit(f, 0x40),
                lun: h.lun(),
                itt: h.itt(),
                ttt: h.u32(20),
                cmd_sn: h.u32(24),
                exp_stat_sn: h.u32(28),
            }),
            Opcode::DATA_OUT => Self::DataOut(DataOut {
                final_: bit(f, FINAL),
                lun: h.lun(),
                itt: h.itt(),
                ttt: h.u32(20),
                exp_stat_sn: h.u32(28),
                data_sn: h.u32(36),
                buffer_offset: h.u32(40),
            }),
            Opcode::LOGOUT_REQUEST => Self::LogoutRequest(LogoutRequest {
                immediate: imm,
                reason: LogoutReason(f & 0x7f),
                itt: h.itt(),
                cid: h.u16(20),
                cmd_sn: h.u32(24),
                exp_stat_sn: h.u32(28),
            }),
            Opcode::SNACK => Self::Snack(Snack {
                snack_type: f & 0x0f,
                lun: h.lun(),
                itt: h.itt(),
                ttt: h.u32(20),
                exp_stat_sn: h.u32(28),
                beg_run: h.u32(40),
                run_length: h.u32(44),
            }),
            Opcode::NOP_IN => Self::NopIn(NopIn {
                lun: h.lun(),
                itt: h.itt(),
                ttt: h.u32(20),
                stat_sn: h.u32(24),
                exp_cmd_sn: h.u32(28),
                max_cmd_sn: h.u32(32),
            }),
            Opcode::SCSI_RESPONSE => Self::ScsiResponse(ScsiResponse {
                bidi_overflow: bit(f, 0x10),
                bidi_underflow: bit(f, 0x08),
                overflow: bit(f, 0x04),
                underflow: bit(f, 0x02),
                response: h.u8(2),
                status: Status(h.u8(3)),
                itt: h.itt(),
                snack_tag: h.u32(20),
                stat_sn: h.u32(24),
                exp_cmd_sn: h.u32(28),
                max_cmd_sn: h.u32(32),
                exp_data_sn: h.u32(36),
                bidi_read_residual: h.u32(40),
                residual: h.u32(44),
            }),
            Opcode::TASK_MGMT_RESPONSE => Self::TaskMgmtResponse(TaskMgmtResponse {
                response: TmfResponse(h.u8(2)),
                itt: h.itt(),
                stat_sn: h.u32(24),
                exp_cmd_sn: h.u32(28),
                max_cmd_sn: h.u32(32),
            }),
            Opcode::LOGIN_RESPONSE => {
                if bit(f, 0x80) && bit(f, 0x40) {
                    return Err(DecodeError::InvalidField("login T and C both set"));
                }
                Self::LoginResponse(LoginResponse {
                    transit: bit(f, 0x80),
                    cont: bit(f, 0x40),
                    csg: Stage((f >> 2) & 3),
                    nsg: Stage(f & 3),
                    version_max: h.u8(2),
                    version_active: h.u8(3),
                    isid: isid(h),
                    tsih: h.u16(14),
                    itt: h.itt(),
                    stat_sn: h.u32(24),
                    exp_cmd_sn: h.u32(28),
                    max_cmd_sn: h.u32(32),
                    status_class: h.u8(36),
                    status_detail: h.u8(37),
                })
            }
            Opcode::TEXT_RESPONSE => Self::TextResponse(TextResponse {
                final_: bit(f, FINAL),
                cont: bit(f, 0x40),
                lun: h.lun(),
                itt: h.itt(),
                ttt: h.u32(20),
                stat_sn: h.u32(24),
                exp_cmd_sn: h.u32(28),
                max_cmd_sn: h.u32(32),
            }),
            Opcode::DATA_IN => Self::DataIn(DataIn {
                final_: bit(f, FINAL),
                ack: bit(f, 0x40),
                overflow: bit(f, 0x04),
                underflow: bit(f, 0x02),
                status_present: bit(f, 0x01),
                status: Status(h.u8(3)),
                lun: h.lun(),
                itt: h.itt(),
                ttt: h.u32(20),
                stat_sn: h.u32(24),
                exp_cmd_sn: h.u32(28),
                max_cmd_sn: h.u32(32),
                data_sn: h.u32(36),
                buffer_offset: h.u32(40),
                residual: h.u32(44),
            }),
            Opcode::LOGOUT_RESPONSE => Self::LogoutResponse(LogoutResponse {
                response: LogoutResponseCode(h.u8(2)),
                itt: h.itt(),
                stat_sn: h.u32(24),
                exp_cmd_sn: h.u32(28),
                max_cmd_sn: h.u32(32),
                time2wait: h.u16(40),
                time2retain: h.u16(42),
            }),
            Opcode::R2T => Self::R2t(R2t {
                lun: h.lun(),
                itt: h.itt(),
                ttt: h.u32(20),
                stat_sn: h.u32(24),
                exp_cmd_sn: h.u32(28),
                max_cmd_sn: h.u32(32),
                r2t_sn: h.u32(36),
                buffer_offset: h.u32(40),
                desired_len: h.u32(44),
            }),
            Opcode::ASYNC_MESSAGE => Self::AsyncMessage(AsyncMessage {
                lun: h.lun(),
                itt: h.itt(),
                stat_sn: h.u32(24),
                exp_cmd_sn: h.u32(28),
                max_cmd_sn: h.u32(32),
                event: AsyncEvent(h.u8(36)),
                vcode: h.u8(37),
                param1: h.u16(38),
                param2: h.u16(40),
                param3: h.u16(42),
            }),
            Opcode::REJECT => Self::Reject(Reject {
                reason: RejectReason(h.u8(2)),
                itt: h.itt(),
                stat_sn: h.u32(24),
                exp_cmd_sn: h.u32(28),
                max_cmd_sn: h.u32(32),
                data_sn: h.u32(36),
            }),
            _ => {
                let mut raw = [0u8; BHS_LEN];
                raw.copy_from_slice(h.bytes());
                // The lengths belong to the PDU, not the header value.
                raw[4..8].fill(0);
                Self::Unknown(raw)
            }
        })
    }

    /// The opcode.
    pub fn opcode(&self) -> Opcode {
        match self {
            Self::NopOut(_) => Opcode::NOP_OUT,
            Self::ScsiCommand(_) => Opcode::SCSI_COMMAND,
            Self::TaskMgmtRequest(_) => Opcode::TASK_MGMT_REQUEST,
            Self::LoginRequest(_) => Opcode::LOGIN_REQUEST,
            Self::TextRequest(_) => Opcode::TEXT_REQUEST,
            Self::DataOut(_) => Opcode::DATA_OUT,
            Self::LogoutRequest(_) => Opcode::LOGOUT_REQUEST,
            Self::Snack(_) => Opcode::SNACK,
            Self::NopIn(_) => Opcode::NOP_IN,
            Self::ScsiResponse(_) => Opcode::SCSI_RESPONSE,
            Self::TaskMgmtResponse(_) => Opcode::TASK_MGMT_RESPONSE,
            Self::LoginResponse(_) => Opcode::LOGIN_RESPONSE,
            Self::TextResponse(_) => Opcode::TEXT_RESPONSE,
            Self::DataIn(_) => Opcode::DATA_IN,
            Self::LogoutResponse(_) => Opcode::LOGOUT_RESPONSE,
            Self::R2t(_) => Opcode::R2T,
            Self::AsyncMessage(_) => Opcode::ASYNC_MESSAGE,
            Self::Reject(_) => Opcode::REJECT,
            Self::Unknown(raw) => Opcode(raw[0] & 0x3f),
        }
    }

    /// The Initiator Task Tag.
    pub fn itt(&self) -> u32 {
        match self {
            Self::NopOut(h) => h.itt,
            Self::ScsiCommand(h) => h.itt,
            Self::TaskMgmtRequest(h) => h.itt,
            Self::LoginRequest(h) => h.itt,
            Self::TextRequest(h) => h.itt,
            Self::DataOut(h) => h.itt,
            Self::LogoutRequest(h) => h.itt,
            Self::Snack(h) => h.itt,
            Self::NopIn(h) => h.itt,
            Self::ScsiResponse(h) => h.itt,
            Self::TaskMgmtResponse(h) => h.itt,
            Self::LoginResponse(h) => h.itt,
            Self::TextResponse(h) => h.itt,
            Self::DataIn(h) => h.itt,
            Self::LogoutResponse(h) => h.itt,
            Self::R2t(h) => h.itt,
            Self::AsyncMessage(h) => h.itt,
            Self::Reject(h) => h.itt,
            Self::Unknown(raw) => u32::from_be_bytes([raw[16], raw[17], raw[18], raw[19]]),
        }
    }

    /// Write the full BHS with the given TotalAHSLength (bytes) and DataSegmentLength.
    /// Reserved fields are written as zero.
    pub fn emit(&self, out: &mut [u8; BHS_LEN], ahs_len: usize, dsl: u32) {
        if let Self::Unknown(raw) = self {
            out.copy_from_slice(raw);
        } else {
            out.fill(0);
        }
        let mut h = Bhs::new_unchecked(&mut out[..]);
        if let Self::Unknown(_) = self {
            h.set_total_ahs_len(ahs_len);
            h.set_data_segment_len(dsl);
            return;
        }
        let op = self.opcode();
        match *self {
            Self::NopOut(p) => {
                h.set_opcode(op, p.immediate);
                h.set_flags(FINAL);
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(24, p.cmd_sn);
                h.set_u32(28, p.exp_stat_sn);
            }
            Self::ScsiCommand(p) => {
                h.set_opcode(op, p.immediate);
                h.set_flags(flag(p.final_, FINAL) | flag(p.read, 0x40) | flag(p.write, 0x20) | (p.attr & 7));
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.expected_data_len);
                h.set_u32(24, p.cmd_sn);
                h.set_u32(28, p.exp_stat_sn);
                for (k, b) in p.cdb.iter().enumerate() {
                    h.set_u8(32 + k, *b);
                }
            }
            Self::TaskMgmtRequest(p) => {
                h.set_opcode(op, p.immediate);
                h.set_flags(FINAL | (p.function.0 & 0x7f));
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.ref_task_tag);
                h.set_u32(24, p.cmd_sn);
                h.set_u32(28, p.exp_stat_sn);
                h.set_u32(32, p.ref_cmd_sn);
                h.set_u32(36, p.exp_data_sn);
            }
            Self::LoginRequest(p) => {
                h.set_opcode(op, true);
                h.set_flags(login_flags(p.transit, p.cont, p.csg, p.nsg));
                h.set_u8(2, p.version_max);
                h.set_u8(3, p.version_min);
                set_isid(&mut h, p.isid);
                h.set_u16(14, p.tsih);
                h.set_itt(p.itt);
                h.set_u16(20, p.cid);
                h.set_u32(24, p.cmd_sn);
                h.set_u32(28, p.exp_stat_sn);
            }
            Self::TextRequest(p) => {
                h.set_opcode(op, p.immediate);
                h.set_flags(flag(p.final_, FINAL) | flag(p.cont, 0x40));
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(24, p.cmd_sn);
                h.set_u32(28, p.exp_stat_sn);
            }
            Self::DataOut(p) => {
                h.set_opcode(op, false);
                h.set_flags(flag(p.final_, FINAL));
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(28, p.exp_stat_sn);
                h.set_u32(36, p.data_sn);
                h.set_u32(40, p.buffer_offset);
            }
            Self::LogoutRequest(p) => {
                h.set_opcode(op, p.immediate);
                h.set_flags(FINAL | (p.reason.0 & 0x7f));
                h.set_itt(p.itt);
                h.set_u16(20, p.cid);
                h.set_u32(24, p.cmd_sn);
                h.set_u32(28, p.exp_stat_sn);
            }
            Self::Snack(p) => {
                h.set_opcode(op, false);
                h.set_flags(FINAL | (p.snack_type & 0x0f));
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.ttt);
                h.set_u32(28, p.exp_stat_sn);
                h.set_u32(40, p.beg_run);
                h.set_u32(44, p.run_length);
            }
            Self::NopIn(p) => {
                h.set_opcode(op, false);
                h.set_flags(FINAL);
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.ttt);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
            }
            Self::ScsiResponse(p) => {
                h.set_opcode(op, false);
                h.set_flags(
                    FINAL | flag(p.bidi_overflow, 0x10) | flag(p.bidi_underflow, 0x08) | flag(p.overflow, 0x04) | flag(p.underflow, 0x02),
                );
                h.set_u8(2, p.response);
                h.set_u8(3, p.status.0);
                h.set_itt(p.itt);
                h.set_u32(20, p.snack_tag);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
                h.set_u32(36, p.exp_data_sn);
                h.set_u32(40, p.bidi_read_residual);
                h.set_u32(44, p.residual);
            }
            Self::TaskMgmtResponse(p) => {
                h.set_opcode(op, false);
                h.set_flags(FINAL);
                h.set_u8(2, p.response.0);
                h.set_itt(p.itt);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
            }
            Self::LoginResponse(p) => {
                h.set_opcode(op, false);
                h.set_flags(login_flags(p.transit, p.cont, p.csg, p.nsg));
                h.set_u8(2, p.version_max);
                h.set_u8(3, p.version_active);
                set_isid(&mut h, p.isid);
                h.set_u16(14, p.tsih);
                h.set_itt(p.itt);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
                h.set_u8(36, p.status_class);
                h.set_u8(37, p.status_detail);
            }
            Self::TextResponse(p) => {
                h.set_opcode(op, false);
                h.set_flags(flag(p.final_, FINAL) | flag(p.cont, 0x40));
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.ttt);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
            }
            Self::DataIn(p) => {
                h.set_opcode(op, false);
                h.set_flags(
                    flag(p.final_, FINAL)
                        | flag(p.ack, 0x40)
                        | flag(p.overflow, 0x04)
                        | flag(p.underflow, 0x02)
                        | flag(p.status_present, 0x01),
                );
                h.set_u8(3, p.status.0);
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.ttt);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
                h.set_u32(36, p.data_sn);
                h.set_u32(40, p.buffer_offset);
                h.set_u32(44, p.residual);
            }
            Self::LogoutResponse(p) => {
                h.set_opcode(op, false);
                h.set_flags(FINAL);
                h.set_u8(2, p.response.0);
                h.set_itt(p.itt);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
                h.set_u16(40, p.time2wait);
                h.set_u16(42, p.time2retain);
            }
            Self::R2t(p) => {
                h.set_opcode(op, false);
                h.set_flags(FINAL);
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                h.set_u32(20, p.ttt);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
                h.set_u32(36, p.r2t_sn);
                h.set_u32(40, p.buffer_offset);
                h.set_u32(44, p.desired_len);
            }
            Self::AsyncMessage(p) => {
                h.set_opcode(op, false);
                h.set_flags(FINAL);
                h.set_lun(p.lun);
                h.set_itt(p.itt);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
                h.set_u8(36, p.event.0);
                h.set_u8(37, p.vcode);
                h.set_u16(38, p.param1);
                h.set_u16(40, p.param2);
                h.set_u16(42, p.param3);
            }
            Self::Reject(p) => {
                h.set_opcode(op, false);
                h.set_flags(FINAL);
                h.set_u8(2, p.reason.0);
                h.set_itt(p.itt);
                set_sns(&mut h, p.stat_sn, p.exp_cmd_sn, p.max_cmd_sn);
                h.set_u32(36, p.data_sn);
            }
            Self::Unknown(_) => unreachable!("handled above"),
        }
        h.set_total_ahs_len(ahs_len);
        h.set_data_segment_len(dsl);
    }
}

fn isid<T: AsRef<[u8]>>(h: &Bhs<T>) -> Isid {
    let mut i = [0u8; 6];
    i.copy_from_slice(&h.bytes()[8..14]);
    Isid(i)
}

fn set_isid(h: &mut Bhs<&mut [u8]>, isid: Isid) {
    for (k, b) in isid.0.iter().enumerate() {
        h.set_u8(8 + k, *b);
    }
}

fn set_sns(h: &mut Bhs<&mut [u8]>, stat_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) {
    h.set_u32(24, stat_sn);
    h.set_u32(28, exp_cmd_sn);
    h.set_u32(32, max_cmd_sn);
}

const fn login_flags(t: bool, c: bool, csg: Stage, nsg: Stage) -> u8 {
    flag(t, 0x80) | flag(c, 0x40) | ((csg.0 & 3) << 2) | (nsg.0 & 3)
}

/// A whole PDU: header, AHS area and data segment. `D` is `&[u8]` or `Bytes` (a handle into the
/// receive buffer), or an owned `Vec<u8>` when building PDUs to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pdu<D> {
    /// The BHS.
    pub header: Header,
    /// The AHS area (TotalAHSLength bytes), possibly empty.
    pub ahs: D,
    /// The data segment without padding.
    pub data: D,
}

/// Where the parts of a PDU lie in a buffer that starts with its BHS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PduLayout {
    /// AHS bytes.
    pub ahs_len: usize,
    /// Data segment bytes (without padding).
    pub data_len: usize,
}

impl PduLayout {
    /// Read the lengths from a BHS, refusing a data segment over `max_data`.
    pub fn of<T: AsRef<[u8]>>(bhs: &Bhs<T>, max_data: u32) -> Result<Self, DecodeError> {
        let dsl = bhs.data_segment_len();
        if dsl > max_data {
            return Err(DecodeError::DataSegmentTooLong { len: dsl, max: max_data });
        }
        Ok(Self { ahs_len: bhs.total_ahs_len(), data_len: dsl as usize })
    }
    /// Offset of the data segment.
    pub const fn data_offset(&self) -> usize {
        BHS_LEN + self.ahs_len
    }
    /// Total bytes including data padding (no digests).
    pub const fn padded_len(&self) -> usize {
        BHS_LEN + self.ahs_len + pad4(self.data_len)
    }
}

impl<'a> Pdu<&'a [u8]> {
    /// Parse the PDU at the start of a stream-format buffer (BHS, AHS, data, padding; no
    /// digests). Returns the PDU and the bytes it occupied, padding included.
    pub fn parse(buf: &'a [u8]) -> Result<(Self, usize), DecodeError> {
        Self::parse_limited(buf, MAX_DATA_SEGMENT_LEN, true)
    }

    /// Parse with a data segment limit (the receiver's MaxRecvDataSegmentLength). With
    /// `padded == false` (message transports such as iSER) the data padding may be absent.
    pub fn parse_limited(buf: &'a [u8], max_data: u32, padded: bool) -> Result<(Self, usize), DecodeError> {
        let bhs = Bhs::new_checked(buf)?;
        let layout = PduLayout::of(&bhs, max_data)?;
        let need = if padded { layout.padded_len() } else { layout.data_offset() + layout.data_len };
        if buf.len() < need {
            return Err(DecodeError::Truncated { need, have: buf.len() });
        }
        let header = Header::parse(&bhs)?;
        let ahs = &buf[BHS_LEN..layout.data_offset()];
        for a in AhsIter::new(ahs) {
            a?;
        }
        let data = &buf[layout.data_offset()..layout.data_offset() + layout.data_len];
        Ok((Self { header, ahs, data }, need))
    }
}

impl Pdu<Bytes> {
    /// Like [`Pdu::parse`], returning handles into `buf` instead of borrows (no copy).
    pub fn parse_bytes(buf: &Bytes) -> Result<(Self, usize), DecodeError> {
        let (p, used) = Pdu::parse(buf)?;
        Ok((Self { header: p.header, ahs: buf.slice_ref(p.ahs), data: buf.slice_ref(p.data) }, used))
    }
}

impl<D: AsRef<[u8]>> Pdu<D> {
    /// Build a PDU.
    pub const fn new(header: Header, ahs: D, data: D) -> Self {
        Self { header, ahs, data }
    }

    /// The encoded BHS with lengths filled in.
    pub fn bhs(&self) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        self.header.emit(&mut b, self.ahs.as_ref().len(), self.data.as_ref().len() as u32);
        b
    }

    /// Encoded length with padding (no digests).
    pub fn encoded_len(&self) -> usize {
        BHS_LEN + self.ahs.as_ref().len() + pad4(self.data.as_ref().len())
    }

    /// Append the stream encoding (BHS, AHS, data, zero padding) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.bhs());
        out.extend_from_slice(self.ahs.as_ref());
        let data = self.data.as_ref();
        out.extend_from_slice(data);
        out.extend_from_slice(&[0u8; 3][..pad4(data.len()) - data.len()]);
    }

    /// Iterate over the AHS.
    pub fn ahs_iter(&self) -> AhsIter<'_> {
        AhsIter::new(self.ahs.as_ref())
    }

    /// The complete CDB of a SCSI Command: the 16 bytes of the BHS followed by an extended-CDB
    /// AHS if present.
    pub fn full_cdb(&self) -> Option<Vec<u8>> {
        let Header::ScsiCommand(c) = &self.header else {
            return None;
        };
        let mut cdb = c.cdb.to_vec();
        for a in self.ahs_iter().flatten() {
            if let super::Ahs::ExtendedCdb(rest) = a {
                cdb.extend_from_slice(rest);
            }
        }
        Some(cdb)
    }
}

#[cfg(test)]
mod tests {
    //! Byte-array vectors for the PDU types the captures do not contain (NOP-Out/In, SNACK,
    //! Asynchronous Message, Reject): deconstruct, construct, truncated.
    use super::*;

    fn bhs(fill: &[(usize, &[u8])]) -> [u8; BHS_LEN] {
        let mut b = [0u8; BHS_LEN];
        for (at, bytes) in fill {
            b[*at..*at + bytes.len()].copy_from_slice(bytes);
        }
        b
    }

    fn check(bytes: [u8; BHS_LEN], expect: Header) {
        let h = Header::parse(&Bhs::new_checked(&bytes[..]).unwrap()).unwrap();
        assert_eq!(h, expect);
        let mut out = [0u8; BHS_LEN];
        h.emit(&mut out, 0, 0);
        assert_eq!(out, bytes);
        assert!(Bhs::new_checked(&bytes[..47]).is_err());
    }

    #[test]
    fn nop_out_ping() {
        let b = bhs(&[(0, &[0x40, 0x80]), (9, &[3]), (16, &[0, 0, 0, 5]), (20, &[0xff; 4]), (24, &[0, 0, 0, 9]), (28, &[0, 0, 0, 2])]);
        check(
            b,
            Header::NopOut(NopOut { immediate: true, lun: Lun::from_number(3).unwrap(), itt: 5, ttt: u32::MAX, cmd_sn: 9, exp_stat_sn: 2 }),
        );
    }

    #[test]
    fn nop_in_target_ping() {
        let b = bhs(&[
            (0, &[0x20, 0x80]),
            (16, &[0xff; 4]),
            (20, &[0, 0, 0, 1]),
            (24, &[0, 0, 0, 10]),
            (28, &[0, 0, 0, 11]),
            (32, &[0, 0, 0, 42]),
        ]);
        check(b, Header::NopIn(NopIn { lun: Lun::ZERO, itt: u32::MAX, ttt: 1, stat_sn: 10, exp_cmd_sn: 11, max_cmd_sn: 42 }));
    }

    #[test]
    fn snack_data() {
        let b = bhs(&[
            (0, &[0x10, 0x80]),
            (16, &[0, 0, 0, 7]),
            (20, &[0xff; 4]),
            (28, &[0, 0, 0, 3]),
            (40, &[0, 0, 0, 4]),
            (44, &[0, 0, 0, 2]),
        ]);
        check(b, Header::Snack(Snack { snack_type: 0, lun: Lun::ZERO, itt: 7, ttt: u32::MAX, exp_stat_sn: 3, beg_run: 4, run_length: 2 }));
    }

    #[test]
    fn async_drop_connection() {
        let b = bhs(&[
            (0, &[0x32, 0x80]),
            (16, &[0xff; 4]),
            (24, &[0, 0, 0, 8]),
            (28, &[0, 0, 0, 9]),
            (32, &[0, 0, 0, 40]),
            (36, &[2, 0, 0, 1, 0, 2, 0, 20]),
        ]);
        check(
            b,
            Header::AsyncMessage(AsyncMessage {
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
            }),
        );
    }

    #[test]
    fn reject_protocol_error() {
        let b = bhs(&[(0, &[0x3f, 0x80, 0x04]), (16, &[0xff; 4]), (24, &[0, 0, 0, 8]), (28, &[0, 0, 0, 9]), (32, &[0, 0, 0, 40])]);
        check(
            b,
            Header::Reject(Reject {
                reason: RejectReason::PROTOCOL_ERROR,
                itt: u32::MAX,
                stat_sn: 8,
                exp_cmd_sn: 9,
                max_cmd_sn: 40,
                data_sn: 0,
            }),
        );
        assert_eq!(format!("{:?}", RejectReason(0x04)), "PROTOCOL_ERROR");
        assert_eq!(format!("{:?}", RejectReason(0x77)), "RejectReason(0x77)");
    }

    #[test]
    fn reactions() {
        use super::super::Reaction;
        assert_eq!(DecodeError::InvalidField("x").reaction(), Reaction::Reject(RejectReason::INVALID_PDU_FIELD));
        assert_eq!(DecodeError::DataSegmentTooLong { len: 9000, max: 8192 }.reaction(), Reaction::DropConnection);
    }
}
