//! SCSI Command (RFC 7143 §11.3) and SCSI Response (§11.4).

use super::bhs::{BHS_LEN, Bhs, FINAL, bit, flag};
use super::{Ahs, AhsIter, DecodeError, Opcode};
use alloc::vec::Vec;
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

/// Byte offsets of the SCSI Command and Response fields.
mod field {
    use core::ops::Range;

    pub(super) use super::super::bhs::field::{CMD_SN, EXP_CMD_SN, EXP_STAT_SN, ITT, MAX_CMD_SN, STAT_SN};

    /// Command: Expected Data Transfer Length.
    pub(super) const EXPECTED_DATA_LEN: usize = 20;
    /// Command: the first 16 CDB bytes.
    pub(super) const CDB: Range<usize> = 32..48;

    /// Response: iSCSI service response.
    pub(super) const RESPONSE: usize = 2;
    /// Response: SCSI status.
    pub(super) const STATUS: usize = 3;
    /// Response: SNACK Tag.
    pub(super) const SNACK_TAG: usize = 20;
    /// Response: ExpDataSN.
    pub(super) const EXP_DATA_SN: usize = 36;
    /// Response: Bidirectional Read Residual Count.
    pub(super) const BIDI_READ_RESIDUAL: usize = 40;
    /// Response: Residual Count.
    pub(super) const RESIDUAL: usize = 44;
}

/// Flags (byte 1) of the SCSI Command and Response.
mod flags {
    /// Command R: data flows to the initiator.
    pub(super) const READ: u8 = 0x40;
    /// Command W: data flows to the target.
    pub(super) const WRITE: u8 = 0x20;
    /// Command ATTR: the task attribute.
    pub(super) const ATTR: u8 = 0x07;
    /// Response o: bidirectional read residual overflow.
    pub(super) const BIDI_OVERFLOW: u8 = 0x10;
    /// Response u: bidirectional read residual underflow.
    pub(super) const BIDI_UNDERFLOW: u8 = 0x08;
    /// Response O: residual overflow.
    pub(super) const OVERFLOW: u8 = 0x04;
    /// Response U: residual underflow.
    pub(super) const UNDERFLOW: u8 = 0x02;
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

impl ScsiCommand {
    /// The complete CDB: the 16 bytes of the BHS followed by the extended-CDB AHS in `ahs` (the
    /// PDU's AHS area), if there is one. A malformed AHS adds nothing (receivers check the AHS
    /// area when they read the PDU).
    pub fn full_cdb(&self, ahs: &[u8]) -> Vec<u8> {
        let mut cdb = self.cdb.to_vec();
        for a in AhsIter::new(ahs).flatten() {
            if let Ahs::ExtendedCdb(rest) = a {
                cdb.extend_from_slice(rest);
            }
        }
        cdb
    }

    /// The fields of a SCSI Command BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        let f = h.flags();
        let mut cdb = [0u8; 16];
        cdb.copy_from_slice(&h.bytes()[field::CDB]);
        Ok(Self {
            immediate: h.immediate(),
            final_: bit(f, FINAL),
            read: bit(f, flags::READ),
            write: bit(f, flags::WRITE),
            attr: f & flags::ATTR,
            lun: h.lun(),
            itt: h.u32(field::ITT),
            expected_data_len: h.u32(field::EXPECTED_DATA_LEN),
            cmd_sn: h.u32(field::CMD_SN),
            exp_stat_sn: h.u32(field::EXP_STAT_SN),
            cdb,
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::SCSI_COMMAND, self.immediate);
        h.set_flags(flag(self.final_, FINAL) | flag(self.read, flags::READ) | flag(self.write, flags::WRITE) | (self.attr & flags::ATTR));
        h.set_lun(self.lun);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::EXPECTED_DATA_LEN, self.expected_data_len);
        h.set_u32(field::CMD_SN, self.cmd_sn);
        h.set_u32(field::EXP_STAT_SN, self.exp_stat_sn);
        h.set_bytes(field::CDB, &self.cdb);
    }
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

impl ScsiResponse {
    /// The fields of a SCSI Response BHS.
    #[inline]
    pub(super) fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        let f = h.flags();
        Ok(Self {
            bidi_overflow: bit(f, flags::BIDI_OVERFLOW),
            bidi_underflow: bit(f, flags::BIDI_UNDERFLOW),
            overflow: bit(f, flags::OVERFLOW),
            underflow: bit(f, flags::UNDERFLOW),
            response: h.u8(field::RESPONSE),
            status: Status(h.u8(field::STATUS)),
            itt: h.u32(field::ITT),
            snack_tag: h.u32(field::SNACK_TAG),
            stat_sn: h.u32(field::STAT_SN),
            exp_cmd_sn: h.u32(field::EXP_CMD_SN),
            max_cmd_sn: h.u32(field::MAX_CMD_SN),
            exp_data_sn: h.u32(field::EXP_DATA_SN),
            bidi_read_residual: h.u32(field::BIDI_READ_RESIDUAL),
            residual: h.u32(field::RESIDUAL),
        })
    }

    /// Write the fields into a zeroed BHS (the lengths are the PDU's).
    #[inline]
    pub(super) fn emit(&self, h: &mut Bhs<&mut [u8; BHS_LEN]>) {
        h.set_opcode(Opcode::SCSI_RESPONSE, false);
        h.set_flags(
            FINAL
                | flag(self.bidi_overflow, flags::BIDI_OVERFLOW)
                | flag(self.bidi_underflow, flags::BIDI_UNDERFLOW)
                | flag(self.overflow, flags::OVERFLOW)
                | flag(self.underflow, flags::UNDERFLOW),
        );
        h.set_u8(field::RESPONSE, self.response);
        h.set_u8(field::STATUS, self.status.0);
        h.set_u32(field::ITT, self.itt);
        h.set_u32(field::SNACK_TAG, self.snack_tag);
        h.set_u32(field::STAT_SN, self.stat_sn);
        h.set_u32(field::EXP_CMD_SN, self.exp_cmd_sn);
        h.set_u32(field::MAX_CMD_SN, self.max_cmd_sn);
        h.set_u32(field::EXP_DATA_SN, self.exp_data_sn);
        h.set_u32(field::BIDI_READ_RESIDUAL, self.bidi_read_residual);
        h.set_u32(field::RESIDUAL, self.residual);
    }
}

#[cfg(test)]
mod tests {
    use super::super::pdu::testing::{check, view};
    use super::super::{BHS_LEN, Header};
    use super::*;

    /// READ(10) of 8 blocks at LBA 0x1000, simple task attribute.
    #[rustfmt::skip]
    const SCSI_COMMAND: [u8; BHS_LEN] = [
        0x01, 0xc1, 0x00, 0x00, // 0x01, F | R | ATTR simple
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x02, 0x00, 0x00, // LUN 2
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x2a, // ITT
        0x00, 0x00, 0x10, 0x00, // Expected Data Transfer Length 4096
        0x00, 0x00, 0x00, 0x09, // CmdSN
        0x00, 0x00, 0x00, 0x07, // ExpStatSN
        0x28, 0x00, 0x00, 0x00, // CDB
        0x10, 0x00, 0x00, 0x00,
        0x08, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[rustfmt::skip]
    const SCSI_WRITE_COMMAND: [u8; BHS_LEN] = [
        0x41, 0x22, 0x00, 0x00, // I | 0x01, W | ATTR ordered (unsolicited Data-Out follows: no F)
        0x00, 0x00, 0x02, 0x00, // DataSegmentLength 512 (immediate data)
        0x00, 0x00, 0x00, 0x00, // LUN 0
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x2b, // ITT
        0x00, 0x00, 0x04, 0x00, // Expected Data Transfer Length 1024
        0x00, 0x00, 0x00, 0x0a, // CmdSN
        0x00, 0x00, 0x00, 0x08, // ExpStatSN
        0x2a, 0x00, 0x00, 0x00, // CDB: WRITE(10)
        0x00, 0x20, 0x00, 0x00,
        0x02, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[rustfmt::skip]
    const SCSI_RESPONSE: [u8; BHS_LEN] = [
        0x21, 0x92, 0x01, 0x02, // 0x21, F | o | U, response: target failure, status CHECK CONDITION
        0x00, 0x00, 0x00, 0x14, // DataSegmentLength 20 (sense)
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x2a, // ITT
        0x00, 0x00, 0x00, 0x03, // SNACK Tag
        0x00, 0x00, 0x00, 0x07, // StatSN
        0x00, 0x00, 0x00, 0x0a, // ExpCmdSN
        0x00, 0x00, 0x00, 0x29, // MaxCmdSN
        0x00, 0x00, 0x00, 0x04, // ExpDataSN
        0x00, 0x00, 0x00, 0x40, // Bidirectional Read Residual Count
        0x00, 0x00, 0x02, 0x00, // Residual Count
    ];

    #[test]
    fn scsi_command_read() {
        let p = ScsiCommand::parse(&view(&SCSI_COMMAND)).unwrap();
        let expect = ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: 1,
            lun: Lun::from_number(2).unwrap(),
            itt: 42,
            expected_data_len: 4096,
            cmd_sn: 9,
            exp_stat_sn: 7,
            cdb: [0x28, 0, 0, 0, 0x10, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0],
        };
        assert_eq!(p, expect);
        check(&SCSI_COMMAND, Header::ScsiCommand(p));
    }

    #[test]
    fn scsi_command_write_with_immediate_data() {
        let p = ScsiCommand::parse(&view(&SCSI_WRITE_COMMAND)).unwrap();
        let expect = ScsiCommand {
            immediate: true,
            final_: false,
            read: false,
            write: true,
            attr: 2,
            lun: Lun::ZERO,
            itt: 43,
            expected_data_len: 1024,
            cmd_sn: 10,
            exp_stat_sn: 8,
            cdb: [0x2a, 0, 0, 0, 0, 0x20, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0],
        };
        assert_eq!(p, expect);
        check(&SCSI_WRITE_COMMAND, Header::ScsiCommand(p));
    }

    #[test]
    fn scsi_response_check_condition() {
        let p = ScsiResponse::parse(&view(&SCSI_RESPONSE)).unwrap();
        let expect = ScsiResponse {
            bidi_overflow: true,
            bidi_underflow: false,
            overflow: false,
            underflow: true,
            response: 1,
            status: Status::CHECK_CONDITION,
            itt: 42,
            snack_tag: 3,
            stat_sn: 7,
            exp_cmd_sn: 10,
            max_cmd_sn: 41,
            exp_data_sn: 4,
            bidi_read_residual: 64,
            residual: 512,
        };
        assert_eq!(p, expect);
        check(&SCSI_RESPONSE, Header::ScsiResponse(p));
    }

    /// The full CDB is the BHS's 16 bytes, then the extended-CDB AHS wherever it is among the
    /// AHS; the PDU's view of it is the same.
    #[test]
    fn full_cdb_continues_in_the_extended_cdb_ahs() {
        let c = ScsiCommand { cdb: [0x7f; 16], ..ScsiCommand::default() };
        assert_eq!(c.full_cdb(&[]), [0x7f; 16]);
        let mut ahs = Vec::new();
        super::super::bidi_read_length_ahs(&mut ahs, 512);
        super::super::extended_cdb_ahs(&mut ahs, &[0xee; 16]);
        let full = c.full_cdb(&ahs);
        assert_eq!((&full[..16], &full[16..]), (&[0x7f; 16][..], &[0xee; 16][..]));
        let pdu = super::super::Pdu::new(Header::ScsiCommand(c), ahs, Vec::new());
        assert_eq!(pdu.full_cdb(), Some(full));
    }
}
