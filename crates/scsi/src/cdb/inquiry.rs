//! Device queries: TEST UNIT READY, REQUEST SENSE, INQUIRY, READ CAPACITY (10/16), GET LBA
//! STATUS, READ DEFECT DATA, REPORT LUNS, REPORT SUPPORTED OPERATION CODES and REPORT TARGET
//! PORT GROUPS.

use super::{Cdb, op};
use crate::be::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};

/// Parse a command of this family from `b` (exactly the CDB's length); `None` when `opcode`
/// belongs to another family.
pub(super) fn parse(opcode: u8, b: &[u8]) -> Option<Cdb> {
    use op::*;
    Some(match opcode {
        TEST_UNIT_READY => Cdb::TestUnitReady { control: b[5] },
        REQUEST_SENSE => Cdb::RequestSense { desc: b[1] & 1 != 0, alloc_len: b[4], control: b[5] },
        INQUIRY => Cdb::Inquiry { evpd: b[1] & 1 != 0, page_code: b[2], alloc_len: u16_at(b, 3), control: b[5] },
        READ_CAPACITY_10 => Cdb::ReadCapacity10 { lba: u32_at(b, 2), pmi: b[8] & 1 != 0, control: b[9] },
        READ_DEFECT_DATA_10 => {
            Cdb::ReadDefectData { twelve: false, flags: b[2], index: 0, alloc_len: u32::from(u16_at(b, 7)), control: b[9] }
        }
        READ_DEFECT_DATA_12 => {
            Cdb::ReadDefectData { twelve: true, flags: b[1], index: u32_at(b, 2), alloc_len: u32_at(b, 6), control: b[11] }
        }
        SERVICE_ACTION_IN_16 => match b[1] & 0x1f {
            SA_READ_CAPACITY_16 => Cdb::ReadCapacity16 { lba: u64_at(b, 2), alloc_len: u32_at(b, 10), pmi: b[14] & 1 != 0, control: b[15] },
            SA_GET_LBA_STATUS => Cdb::GetLbaStatus { lba: u64_at(b, 2), alloc_len: u32_at(b, 10), control: b[15] },
            _ => Cdb::Unknown(b.to_vec()),
        },
        REPORT_LUNS => Cdb::ReportLuns { select: b[2], alloc_len: u32_at(b, 6), control: b[11] },
        MAINTENANCE_IN if b[1] & 0x1f == SA_REPORT_SUPPORTED_OPCODES => Cdb::ReportSupportedOpcodes {
            rctd: b[2] & 0x80 != 0,
            options: b[2] & 0x07,
            opcode: b[3],
            service_action: u16_at(b, 4),
            alloc_len: u32_at(b, 6),
            control: b[11],
        },
        MAINTENANCE_IN if b[1] & 0x1f == SA_REPORT_TARGET_PORT_GROUPS => {
            Cdb::ReportTargetPortGroups { format: b[1] >> 5, alloc_len: u32_at(b, 6), control: b[11] }
        }
        _ => return None,
    })
}

/// Encode a command of this family into `b` (exactly the CDB's length, zeroed, opcode set).
pub(super) fn emit(cdb: &Cdb, b: &mut [u8]) {
    match *cdb {
        Cdb::TestUnitReady { control } => b[5] = control,
        Cdb::RequestSense { desc, alloc_len, control } => {
            b[1] = u8::from(desc);
            b[4] = alloc_len;
            b[5] = control;
        }
        Cdb::Inquiry { evpd, page_code, alloc_len, control } => {
            b[1] = u8::from(evpd);
            b[2] = page_code;
            put_u16(b, 3, alloc_len);
            b[5] = control;
        }
        Cdb::ReadCapacity10 { lba, pmi, control } => {
            put_u32(b, 2, lba);
            b[8] = u8::from(pmi);
            b[9] = control;
        }
        Cdb::ReadCapacity16 { lba, alloc_len, pmi, control } => {
            b[1] = op::SA_READ_CAPACITY_16;
            put_u64(b, 2, lba);
            put_u32(b, 10, alloc_len);
            b[14] = u8::from(pmi);
            b[15] = control;
        }
        Cdb::GetLbaStatus { lba, alloc_len, control } => {
            b[1] = op::SA_GET_LBA_STATUS;
            put_u64(b, 2, lba);
            put_u32(b, 10, alloc_len);
            b[15] = control;
        }
        Cdb::ReadDefectData { twelve, flags, index, alloc_len, control } => {
            if twelve {
                b[1] = flags;
                put_u32(b, 2, index);
                put_u32(b, 6, alloc_len);
                b[11] = control;
            } else {
                b[2] = flags;
                put_u16(b, 7, alloc_len as u16);
                b[9] = control;
            }
        }
        Cdb::ReportLuns { select, alloc_len, control } => {
            b[2] = select;
            put_u32(b, 6, alloc_len);
            b[11] = control;
        }
        Cdb::ReportSupportedOpcodes { rctd, options, opcode, service_action, alloc_len, control } => {
            b[1] = op::SA_REPORT_SUPPORTED_OPCODES;
            b[2] = if rctd { 0x80 } else { 0 } | (options & 7);
            b[3] = opcode;
            put_u16(b, 4, service_action);
            put_u32(b, 6, alloc_len);
            b[11] = control;
        }
        Cdb::ReportTargetPortGroups { format, alloc_len, control } => {
            b[1] = (format << 5) | op::SA_REPORT_TARGET_PORT_GROUPS;
            put_u32(b, 6, alloc_len);
            b[11] = control;
        }
        _ => unreachable!("not a device query: {cdb:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn service_actions() {
        let mut b = [0u8; 16];
        b[0] = 0x9e;
        b[1] = 0x10;
        b[13] = 32;
        assert_eq!(Cdb::parse(&b).unwrap(), Cdb::ReadCapacity16 { lba: 0, alloc_len: 32, pmi: false, control: 0 });
        b[1] = 0x12;
        assert!(matches!(Cdb::parse(&b).unwrap(), Cdb::GetLbaStatus { alloc_len: 32, .. }));
        b[1] = 0x1f;
        assert_eq!(Cdb::parse(&b).unwrap(), Cdb::Unknown(b.to_vec()));
        assert_eq!(Cdb::parse(&b).unwrap().to_vec(), b);
    }

    #[test]
    fn report_target_port_groups() {
        // Extended header format (as Linux's scsi_dh_alua asks first), 0x1000 bytes.
        let b = [0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0];
        let c = Cdb::parse(&b).unwrap();
        assert_eq!(c, Cdb::ReportTargetPortGroups { format: 1, alloc_len: 0x1000, control: 0 });
        assert_eq!(c.to_vec(), b);
        assert_eq!(c.opcode(), op::MAINTENANCE_IN);
        let short = Cdb::ReportTargetPortGroups { format: 0, alloc_len: 8, control: 4 }.to_vec();
        assert_eq!(short, [0xa3, 0x0a, 0, 0, 0, 0, 0, 0, 0, 8, 0, 4]);
        // Another MAINTENANCE IN service action stays raw.
        let mut other = b;
        other[1] = 0x0b;
        assert_eq!(Cdb::parse(&other).unwrap(), Cdb::Unknown(other.to_vec()));
    }

    #[test]
    fn inquiry_vpd() {
        let b = [0x12, 1, 0x83, 0x01, 0x00, 0];
        let c = Cdb::parse(&b).unwrap();
        assert_eq!(c, Cdb::Inquiry { evpd: true, page_code: 0x83, alloc_len: 256, control: 0 });
        assert_eq!(c.to_vec(), b);
    }
}
