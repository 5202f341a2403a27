//! Task Management Function Request (RFC 7143 §11.5) and Response (§11.6), with their code
//! spaces.

use super::bhs::{BHS_LEN, Bhs, FINAL};
use super::{DecodeError, Opcode};
use riser_scsi::lun::Lun;

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

/// Byte offsets of the task management fields.
mod field {
    pub(super) use super::super::bhs::field::{CMD_SN, EXP_CMD_SN, EXP_STAT_SN, ITT, MAX_CMD_SN, STAT_SN};

    /// Request: Referenced Task Tag.
    pub(super) const REF_TASK_TAG: usize = 20;
    /// Request: RefCmdSN.
    pub(super) const REF_CMD_SN: usize = 32;
    /// Request: ExpDataSN.
    pub(super) const EXP_DATA_SN: usize = 36;
    /// Response: the response code.
    pub(super) const RESPONSE: usize = 2;
}

/// Flags (byte 1) of the request.
mod flags {
    /// The function code, below the F bit.
    pub(super) const FUNCTION: u8 = 0x7f;
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

impl TaskMgmtRequest {
    /// The fields of a Task Management Function Request BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            immediate: h.immediate(),
            function: TmfFunction(h.flags() & flags::FUNCTION),
            lun: h.lun(),
            itt: h.u32(field::ITT),
            ref_task_tag: h.u32(field::REF_TASK_TAG),
            cmd_sn: h.u32(field::CMD_SN),
            exp_stat_sn: h.u32(field::EXP_STAT_SN),
            ref_cmd_sn: h.u32(field::REF_CMD_SN),
            exp_data_sn: h.u32(field::EXP_DATA_SN),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::TASK_MGMT_REQUEST, self.immediate);
        h.set_flags(FINAL | (self.function.0 & flags::FUNCTION));
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::REF_TASK_TAG, self.ref_task_tag);
        h.set_u32(field::CMD_SN, self.cmd_sn);
        h.set_u32(field::EXP_STAT_SN, self.exp_stat_sn);
        h.set_u32(field::REF_CMD_SN, self.ref_cmd_sn);
        h.set_u32(field::EXP_DATA_SN, self.exp_data_sn);
    }
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

impl TaskMgmtResponse {
    /// The fields of a Task Management Function Response BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Ok(Self {
            response: TmfResponse(h.u8(field::RESPONSE)),
            itt: h.u32(field::ITT),
            stat_sn: h.u32(field::STAT_SN),
            exp_cmd_sn: h.u32(field::EXP_CMD_SN),
            max_cmd_sn: h.u32(field::MAX_CMD_SN),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::TASK_MGMT_RESPONSE, false);
        h.set_flags(FINAL);
        h.set_u8(field::RESPONSE, self.response.0);
        h.set_u32(field::ITT, self.itt);
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
    const ABORT_TASK: [u8; BHS_LEN] = [
        0x42, 0x81, 0x00, 0x00, // I | 0x02, F | ABORT TASK
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x06, 0x00, 0x00, // LUN 6
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x30, // ITT
        0x00, 0x00, 0x00, 0x2a, // Referenced Task Tag
        0x00, 0x00, 0x00, 0x31, // CmdSN
        0x00, 0x00, 0x00, 0x32, // ExpStatSN
        0x00, 0x00, 0x00, 0x29, // RefCmdSN
        0x00, 0x00, 0x00, 0x05, // ExpDataSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[rustfmt::skip]
    const TMF_RESPONSE: [u8; BHS_LEN] = [
        0x22, 0x80, 0x01, 0x00, // 0x22, F, Task does not exist
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x30, // ITT
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x33, // StatSN
        0x00, 0x00, 0x00, 0x32, // ExpCmdSN
        0x00, 0x00, 0x00, 0x72, // MaxCmdSN
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn abort_task() {
        let p = TaskMgmtRequest::parse(&view(&ABORT_TASK)).unwrap();
        let expect = TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::ABORT_TASK,
            lun: Lun::from_number(6).unwrap(),
            itt: 0x30,
            ref_task_tag: 0x2a,
            cmd_sn: 0x31,
            exp_stat_sn: 0x32,
            ref_cmd_sn: 0x29,
            exp_data_sn: 5,
        };
        assert_eq!(p, expect);
        check(&ABORT_TASK, Header::TaskMgmtRequest(p));
    }

    #[test]
    fn tmf_response_task_does_not_exist() {
        let p = TaskMgmtResponse::parse(&view(&TMF_RESPONSE)).unwrap();
        let expect =
            TaskMgmtResponse { response: TmfResponse::TASK_DOES_NOT_EXIST, itt: 0x30, stat_sn: 0x33, exp_cmd_sn: 0x32, max_cmd_sn: 0x72 };
        assert_eq!(p, expect);
        check(&TMF_RESPONSE, Header::TaskMgmtResponse(p));
        assert_eq!(format!("{:?}", TmfFunction(9)), "TmfFunction(0x9)");
    }
}
