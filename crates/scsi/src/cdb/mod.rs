//! Command Descriptor Blocks (SPC-5 §4.2, SBC-4 §5).
//!
//! [`Cdb::parse`] accepts a buffer at least as long as the CDB (iSCSI carries CDBs in a 16-byte
//! field padded with zeros) and returns a typed value; opcodes and service actions riser does not
//! model come back as [`Cdb::Unknown`] with the raw bytes, so they round-trip. Fields are kept as
//! they are on the wire (for instance READ(6)'s transfer length 0, which means 256 blocks; use
//! [`Rw::transfer_blocks`]); flag bytes are kept raw with accessors, so reserved and obsolete bits
//! survive a parse/emit round trip and the target core can decide whether to reject them.

use crate::Error;
use crate::be::need;
use alloc::vec::Vec;

// This file holds the opcodes, the `Cdb` enum and the dispatch; each command family parses and
// encodes its own variants: `rw` the block read/write family (`Rw`, COMPARE AND WRITE, UNMAP, …),
// `inquiry` device queries (INQUIRY, READ CAPACITY, REPORT LUNS, …), `control` mode pages,
// start/stop and reservations, `copy` the third-party copy commands.
mod control;
mod copy;
mod inquiry;
mod rw;

pub use control::{ModeSelect, ModeSense};
pub use rw::{CdbSize, Rw, rw_flags};

/// Operation codes.
#[allow(missing_docs)]
pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0a;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1a;
    pub const START_STOP_UNIT: u8 = 0x1b;
    pub const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1e;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2a;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2e;
    pub const VERIFY_10: u8 = 0x2f;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const RESERVE_10: u8 = 0x56;
    pub const RELEASE_10: u8 = 0x57;
    pub const MODE_SENSE_10: u8 = 0x5a;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5e;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5f;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const WRITE_16: u8 = 0x8a;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8e;
    pub const VERIFY_16: u8 = 0x8f;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9e;
    pub const REPORT_LUNS: u8 = 0xa0;
    pub const MAINTENANCE_IN: u8 = 0xa3;
    pub const READ_12: u8 = 0xa8;
    pub const WRITE_12: u8 = 0xaa;
    pub const WRITE_AND_VERIFY_12: u8 = 0xae;
    pub const VERIFY_12: u8 = 0xaf;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SANITIZE: u8 = 0x48;
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    pub const ORWRITE_16: u8 = 0x8b;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const WRITE_ATOMIC_16: u8 = 0x9c;
    pub const READ_DEFECT_DATA_12: u8 = 0xb7;
    pub const EXTENDED_COPY: u8 = 0x83;
    pub const RECEIVE_COPY_RESULTS: u8 = 0x84;

    /// SERVICE ACTION IN(16) service actions.
    pub const SA_READ_CAPACITY_16: u8 = 0x10;
    /// SERVICE ACTION IN(16): GET LBA STATUS.
    pub const SA_GET_LBA_STATUS: u8 = 0x12;
    /// MAINTENANCE IN: REPORT SUPPORTED OPERATION CODES.
    pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0c;
    /// MAINTENANCE IN: REPORT TARGET PORT GROUPS.
    pub const SA_REPORT_TARGET_PORT_GROUPS: u8 = 0x0a;
}

/// The CDB length implied by the opcode's group code, or `None` for variable-length (0x7F) and
/// vendor-specific groups.
pub const fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// A parsed CDB.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)]
pub enum Cdb {
    TestUnitReady {
        control: u8,
    },
    RequestSense {
        desc: bool,
        alloc_len: u8,
        control: u8,
    },
    Inquiry {
        evpd: bool,
        page_code: u8,
        alloc_len: u16,
        control: u8,
    },
    ReadCapacity10 {
        lba: u32,
        pmi: bool,
        control: u8,
    },
    ReadCapacity16 {
        lba: u64,
        alloc_len: u32,
        pmi: bool,
        control: u8,
    },
    Read(Rw),
    Write(Rw),
    WriteAndVerify(Rw),
    Verify(Rw),
    SynchronizeCache(Rw),
    WriteSame(Rw),
    /// PRE-FETCH (10/16); byte 1 bit 1 is IMMED.
    PreFetch(Rw),
    /// ORWRITE (16).
    OrWrite(Rw),
    /// SANITIZE: `flags` is byte 1 (IMMED 0x80, AUSE 0x20, service action in bits 4-0; bit 6
    /// reserved); `reserved` holds CDB bytes 2-6 (must be zero).
    Sanitize {
        flags: u8,
        reserved: [u8; 5],
        param_len: u16,
        control: u8,
    },
    /// WRITE ATOMIC (16): transfer length is 16 bits (bytes 12-13).
    WriteAtomic {
        lba: u64,
        blocks: u16,
        flags: u8,
        group: u8,
        control: u8,
    },
    /// READ DEFECT DATA (10/12): `flags` is the REQ_PLIST/REQ_GLIST/format byte.
    ReadDefectData {
        twelve: bool,
        flags: u8,
        index: u32,
        alloc_len: u32,
        control: u8,
    },
    Unmap {
        anchor: bool,
        group: u8,
        param_len: u16,
        control: u8,
    },
    CompareAndWrite {
        lba: u64,
        blocks: u8,
        flags: u8,
        group: u8,
        control: u8,
    },
    GetLbaStatus {
        lba: u64,
        alloc_len: u32,
        control: u8,
    },
    ModeSense(ModeSense),
    ModeSelect(ModeSelect),
    ReportLuns {
        select: u8,
        alloc_len: u32,
        control: u8,
    },
    /// REPORT SUPPORTED OPERATION CODES: `options` is the 3-bit REPORTING OPTIONS field.
    ReportSupportedOpcodes {
        rctd: bool,
        options: u8,
        opcode: u8,
        service_action: u16,
        alloc_len: u32,
        control: u8,
    },
    /// REPORT TARGET PORT GROUPS (SPC-5 §6.37): `format` is the 3-bit PARAMETER DATA FORMAT
    /// field (byte 1 bits 7-5: 000b length only, 001b extended header).
    ReportTargetPortGroups {
        format: u8,
        alloc_len: u32,
        control: u8,
    },
    StartStopUnit {
        immed: bool,
        power_condition_modifier: u8,
        power_condition: u8,
        no_flush: bool,
        loej: bool,
        start: bool,
        control: u8,
    },
    PreventAllowMediumRemoval {
        prevent: u8,
        control: u8,
    },
    Reserve6 {
        control: u8,
    },
    Release6 {
        control: u8,
    },
    Reserve10 {
        third_party: bool,
        longid: bool,
        third_party_id: u8,
        param_len: u16,
        control: u8,
    },
    Release10 {
        third_party: bool,
        longid: bool,
        third_party_id: u8,
        param_len: u16,
        control: u8,
    },
    PersistentReserveIn {
        service_action: u8,
        alloc_len: u16,
        control: u8,
    },
    PersistentReserveOut {
        service_action: u8,
        scope: u8,
        pr_type: u8,
        param_len: u32,
        control: u8,
    },
    /// EXTENDED COPY: `service_action` is byte 1 bits 4-0 (0: LID1; SPC-3 had no field there).
    ExtendedCopy {
        service_action: u8,
        param_len: u32,
        control: u8,
    },
    /// RECEIVE COPY RESULTS: `service_action` is byte 1 bits 4-0 (see
    /// [`crate::copy::rcr`]), `list_id` the list identifier of the copy asked about.
    ReceiveCopyResults {
        service_action: u8,
        list_id: u8,
        alloc_len: u32,
        control: u8,
    },
    /// An opcode or service action riser does not model; the CDB bytes as received.
    Unknown(Vec<u8>),
}

impl Cdb {
    /// Parse a CDB. `b` may be longer than the CDB (trailing bytes are ignored).
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        need("CDB", b, 1)?;
        let opcode = b[0];
        let Some(len) = cdb_len(opcode) else {
            return Ok(Self::Unknown(b.to_vec()));
        };
        need("CDB", b, len)?;
        let b = &b[..len];
        // Each family claims its own opcodes (and service actions); the rest stay raw.
        Ok(rw::parse(opcode, b)
            .or_else(|| inquiry::parse(opcode, b))
            .or_else(|| control::parse(opcode, b))
            .or_else(|| copy::parse(opcode, b))
            .unwrap_or_else(|| Self::Unknown(b.to_vec())))
    }

    /// The operation code.
    pub fn opcode(&self) -> u8 {
        use op::*;
        let rw = |rw: &Rw, ops: [u8; 4]| match rw.size {
            CdbSize::Six => ops[0],
            CdbSize::Ten => ops[1],
            CdbSize::Twelve => ops[2],
            CdbSize::Sixteen => ops[3],
        };
        match self {
            Self::TestUnitReady { .. } => TEST_UNIT_READY,
            Self::RequestSense { .. } => REQUEST_SENSE,
            Self::Inquiry { .. } => INQUIRY,
            Self::ReadCapacity10 { .. } => READ_CAPACITY_10,
            Self::ReadCapacity16 { .. } | Self::GetLbaStatus { .. } => SERVICE_ACTION_IN_16,
            Self::Read(r) => rw(r, [READ_6, READ_10, READ_12, READ_16]),
            Self::Write(r) => rw(r, [WRITE_6, WRITE_10, WRITE_12, WRITE_16]),
            Self::WriteAndVerify(r) => rw(r, [0, WRITE_AND_VERIFY_10, WRITE_AND_VERIFY_12, WRITE_AND_VERIFY_16]),
            Self::Verify(r) => rw(r, [0, VERIFY_10, VERIFY_12, VERIFY_16]),
            Self::SynchronizeCache(r) => rw(r, [0, SYNCHRONIZE_CACHE_10, 0, SYNCHRONIZE_CACHE_16]),
            Self::WriteSame(r) => rw(r, [0, WRITE_SAME_10, 0, WRITE_SAME_16]),
            Self::PreFetch(r) => rw(r, [0, PRE_FETCH_10, 0, PRE_FETCH_16]),
            Self::OrWrite(_) => ORWRITE_16,
            Self::Sanitize { .. } => SANITIZE,
            Self::WriteAtomic { .. } => WRITE_ATOMIC_16,
            Self::ReadDefectData { twelve, .. } => {
                if *twelve {
                    READ_DEFECT_DATA_12
                } else {
                    READ_DEFECT_DATA_10
                }
            }
            Self::Unmap { .. } => UNMAP,
            Self::CompareAndWrite { .. } => COMPARE_AND_WRITE,
            Self::ModeSense(m) => {
                if m.ten {
                    MODE_SENSE_10
                } else {
                    MODE_SENSE_6
                }
            }
            Self::ModeSelect(m) => {
                if m.ten {
                    MODE_SELECT_10
                } else {
                    MODE_SELECT_6
                }
            }
            Self::ReportLuns { .. } => REPORT_LUNS,
            Self::ReportSupportedOpcodes { .. } | Self::ReportTargetPortGroups { .. } => MAINTENANCE_IN,
            Self::StartStopUnit { .. } => START_STOP_UNIT,
            Self::PreventAllowMediumRemoval { .. } => PREVENT_ALLOW_MEDIUM_REMOVAL,
            Self::Reserve6 { .. } => RESERVE_6,
            Self::Release6 { .. } => RELEASE_6,
            Self::Reserve10 { .. } => RESERVE_10,
            Self::Release10 { .. } => RELEASE_10,
            Self::PersistentReserveIn { .. } => PERSISTENT_RESERVE_IN,
            Self::PersistentReserveOut { .. } => PERSISTENT_RESERVE_OUT,
            Self::ExtendedCopy { .. } => EXTENDED_COPY,
            Self::ReceiveCopyResults { .. } => RECEIVE_COPY_RESULTS,
            Self::Unknown(b) => b.first().copied().unwrap_or(0),
        }
    }

    /// Length of the encoded CDB.
    pub fn len(&self) -> usize {
        match self {
            Self::Unknown(b) => b.len(),
            _ => cdb_len(self.opcode()).unwrap_or(0),
        }
    }

    /// Always false for a parsed CDB; present for symmetry with `len`.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Encode into `out`, which must hold at least [`Cdb::len`] bytes; returns the length.
    /// Bytes the value does not model are written as zero. Values that do not fit the chosen
    /// size (see [`Rw::fits`]) are truncated to the field width.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, Error> {
        let len = self.len();
        need("CDB output buffer", out, len)?;
        let b = &mut out[..len];
        if let Self::Unknown(raw) = self {
            b.copy_from_slice(raw);
            return Ok(len);
        }
        b.fill(0);
        b[0] = self.opcode();
        match self {
            Self::Read(_)
            | Self::Write(_)
            | Self::WriteAndVerify(_)
            | Self::Verify(_)
            | Self::SynchronizeCache(_)
            | Self::WriteSame(_)
            | Self::PreFetch(_)
            | Self::OrWrite(_)
            | Self::Sanitize { .. }
            | Self::WriteAtomic { .. }
            | Self::Unmap { .. }
            | Self::CompareAndWrite { .. } => rw::emit(self, b),
            Self::TestUnitReady { .. }
            | Self::RequestSense { .. }
            | Self::Inquiry { .. }
            | Self::ReadCapacity10 { .. }
            | Self::ReadCapacity16 { .. }
            | Self::GetLbaStatus { .. }
            | Self::ReadDefectData { .. }
            | Self::ReportLuns { .. }
            | Self::ReportSupportedOpcodes { .. }
            | Self::ReportTargetPortGroups { .. } => inquiry::emit(self, b),
            Self::ModeSense(_)
            | Self::ModeSelect(_)
            | Self::StartStopUnit { .. }
            | Self::PreventAllowMediumRemoval { .. }
            | Self::Reserve6 { .. }
            | Self::Release6 { .. }
            | Self::Reserve10 { .. }
            | Self::Release10 { .. }
            | Self::PersistentReserveIn { .. }
            | Self::PersistentReserveOut { .. } => control::emit(self, b),
            Self::ExtendedCopy { .. } | Self::ReceiveCopyResults { .. } => copy::emit(self, b),
            Self::Unknown(_) => unreachable!("handled above"),
        }
        Ok(len)
    }

    /// Encode into a new vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = alloc::vec![0u8; self.len()];
        // The buffer has exactly `len` bytes, so emit cannot fail.
        let _ = self.emit(&mut v);
        v
    }

    /// Data-out bytes the CDB announces for a device with `block_size`-byte blocks, when that is
    /// determined by the CDB alone (WRITE family, parameter lists). `None` for data-in commands.
    pub fn data_out_len(&self, block_size: u32) -> Option<u64> {
        let blocks = |r: &Rw| u64::from(r.transfer_blocks()) * u64::from(block_size);
        match self {
            Self::Write(r) | Self::WriteAndVerify(r) | Self::OrWrite(r) => Some(blocks(r)),
            Self::Verify(r) => Some(match r.bytchk() {
                0 => 0,
                3 => u64::from(block_size),
                _ => blocks(r),
            }),
            Self::WriteSame(r) => Some(if r.flags & rw_flags::NDOB != 0 && r.size == CdbSize::Sixteen { 0 } else { u64::from(block_size) }),
            Self::CompareAndWrite { blocks, .. } => Some(2 * u64::from(*blocks) * u64::from(block_size)),
            Self::WriteAtomic { blocks, .. } => Some(u64::from(*blocks) * u64::from(block_size)),
            Self::Unmap { param_len, .. } | Self::Sanitize { param_len, .. } => Some(u64::from(*param_len)),
            Self::ModeSelect(m) => Some(u64::from(m.param_len)),
            Self::PersistentReserveOut { param_len, .. } | Self::ExtendedCopy { param_len, .. } => Some(u64::from(*param_len)),
            Self::Reserve10 { param_len, .. } | Self::Release10 { param_len, .. } => Some(u64::from(*param_len)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncated_and_unknown() {
        assert!(Cdb::parse(&[]).is_err());
        assert!(Cdb::parse(&[0x28, 0, 0]).is_err());
        assert_eq!(Cdb::parse(&[0xc0, 1, 2]).unwrap(), Cdb::Unknown(alloc::vec![0xc0, 1, 2]));
        assert_eq!(Cdb::parse(&[0x02; 6]).unwrap().to_vec(), [0x02; 6]);
    }

    #[test]
    fn errors_map_to_sense() {
        use crate::sense::{AscAscq, SenseKey};
        let s = Cdb::parse(&[0x28, 0, 0]).unwrap_err().sense(true);
        assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_CDB));
        let s = crate::unmap::parse(&[0, 6, 0, 17, 0, 0, 0, 0]).unwrap_err().sense(false);
        assert_eq!(s.asc, AscAscq::INVALID_FIELD_IN_PARAMETER_LIST);
        assert_eq!(s.field_pointer().unwrap().byte, 2);
        let s = crate::pr::PrOutParams::parse(&[0; 4]).unwrap_err().sense(false);
        assert_eq!(s.asc, AscAscq::PARAMETER_LIST_LENGTH_ERROR);
    }
}
