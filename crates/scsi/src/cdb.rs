//! Command Descriptor Blocks (SPC-5 §4.2, SBC-4 §5).
//!
//! [`Cdb::parse`] accepts a buffer at least as long as the CDB (iSCSI carries CDBs in a 16-byte
//! field padded with zeros) and returns a typed value; opcodes and service actions riser does not
//! model come back as [`Cdb::Unknown`] with the raw bytes, so they round-trip. Fields are kept as
//! they are on the wire (for instance READ(6)'s transfer length 0, which means 256 blocks; use
//! [`Rw::transfer_blocks`]); flag bytes are kept raw with accessors, so reserved and obsolete bits
//! survive a parse/emit round trip and the target core can decide whether to reject them.

use crate::Error;
use crate::be::{need, put_u16, put_u24, put_u32, put_u64, u16_at, u24_at, u32_at, u64_at};
use alloc::vec::Vec;

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

    /// SERVICE ACTION IN(16) service actions.
    pub const SA_READ_CAPACITY_16: u8 = 0x10;
    /// SERVICE ACTION IN(16): GET LBA STATUS.
    pub const SA_GET_LBA_STATUS: u8 = 0x12;
    /// MAINTENANCE IN: REPORT SUPPORTED OPERATION CODES.
    pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0c;
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

/// CDB size of a READ/WRITE-family command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[allow(missing_docs)]
pub enum CdbSize {
    Six,
    #[default]
    Ten,
    Twelve,
    Sixteen,
}

impl CdbSize {
    /// Bytes in the CDB.
    pub const fn bytes(self) -> usize {
        match self {
            Self::Six => 6,
            Self::Ten => 10,
            Self::Twelve => 12,
            Self::Sixteen => 16,
        }
    }
}

/// Flag bits of byte 1 in the READ/WRITE/VERIFY/WRITE SAME/SYNCHRONIZE CACHE families.
pub mod rw_flags {
    /// Force unit access.
    pub const FUA: u8 = 0x08;
    /// Disable page out.
    pub const DPO: u8 = 0x10;
    /// WRITE SAME: unmap.
    pub const UNMAP: u8 = 0x08;
    /// WRITE SAME / UNMAP: anchor.
    pub const ANCHOR: u8 = 0x10;
    /// WRITE SAME(16): no data-out buffer.
    pub const NDOB: u8 = 0x01;
    /// SYNCHRONIZE CACHE: immediate.
    pub const IMMED: u8 = 0x02;
}

/// A command of the block read/write family: READ, WRITE, WRITE AND VERIFY, VERIFY, WRITE SAME,
/// SYNCHRONIZE CACHE. The layout (LBA, group, length) is the same within a size.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Rw {
    /// CDB size.
    pub size: CdbSize,
    /// Logical block address (21 bits in 6-byte CDBs).
    pub lba: u64,
    /// Transfer / verification / number-of-blocks field as on the wire.
    pub blocks: u32,
    /// Byte 1 as on the wire (RDPROTECT/WRPROTECT, DPO, FUA, BYTCHK, UNMAP…); 0 for 6-byte CDBs.
    pub flags: u8,
    /// Group number byte as on the wire (unused in 6-byte CDBs).
    pub group: u8,
    /// CONTROL byte.
    pub control: u8,
}

impl Rw {
    /// Blocks to transfer: READ(6)/WRITE(6) encode 256 as 0.
    pub const fn transfer_blocks(&self) -> u32 {
        if matches!(self.size, CdbSize::Six) && self.blocks == 0 { 256 } else { self.blocks }
    }
    /// RDPROTECT/WRPROTECT/VRPROTECT (bits 7..5 of byte 1).
    pub const fn protect(&self) -> u8 {
        self.flags >> 5
    }
    /// FUA bit.
    pub const fn fua(&self) -> bool {
        self.flags & rw_flags::FUA != 0
    }
    /// DPO bit.
    pub const fn dpo(&self) -> bool {
        self.flags & rw_flags::DPO != 0
    }
    /// BYTCHK field of VERIFY / WRITE AND VERIFY (bits 2..1).
    pub const fn bytchk(&self) -> u8 {
        (self.flags >> 1) & 3
    }

    fn parse(size: CdbSize, b: &[u8]) -> Self {
        match size {
            CdbSize::Six => {
                Self { size, lba: u64::from(u24_at(b, 1) & 0x1f_ffff), blocks: u32::from(b[4]), flags: 0, group: 0, control: b[5] }
            }
            CdbSize::Ten => {
                Self { size, lba: u64::from(u32_at(b, 2)), blocks: u32::from(u16_at(b, 7)), flags: b[1], group: b[6], control: b[9] }
            }
            CdbSize::Twelve => Self { size, lba: u64::from(u32_at(b, 2)), blocks: u32_at(b, 6), flags: b[1], group: b[10], control: b[11] },
            CdbSize::Sixteen => Self { size, lba: u64_at(b, 2), blocks: u32_at(b, 10), flags: b[1], group: b[14], control: b[15] },
        }
    }

    fn emit(&self, b: &mut [u8]) {
        match self.size {
            CdbSize::Six => {
                put_u24(b, 1, (self.lba as u32) & 0x1f_ffff);
                b[4] = self.blocks as u8;
                b[5] = self.control;
            }
            CdbSize::Ten => {
                b[1] = self.flags;
                put_u32(b, 2, self.lba as u32);
                b[6] = self.group;
                put_u16(b, 7, self.blocks as u16);
                b[9] = self.control;
            }
            CdbSize::Twelve => {
                b[1] = self.flags;
                put_u32(b, 2, self.lba as u32);
                put_u32(b, 6, self.blocks);
                b[10] = self.group;
                b[11] = self.control;
            }
            CdbSize::Sixteen => {
                b[1] = self.flags;
                put_u64(b, 2, self.lba);
                put_u32(b, 10, self.blocks);
                b[14] = self.group;
                b[15] = self.control;
            }
        }
    }

    /// Whether the fields fit the CDB size (a value parsed from bytes always does).
    pub fn fits(&self) -> bool {
        match self.size {
            CdbSize::Six => self.lba <= 0x1f_ffff && self.blocks <= 0xff && self.flags == 0 && self.group == 0,
            CdbSize::Ten => self.lba <= u64::from(u32::MAX) && self.blocks <= 0xffff,
            CdbSize::Twelve => self.lba <= u64::from(u32::MAX),
            CdbSize::Sixteen => true,
        }
    }
}

/// MODE SENSE (6) or (10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ModeSense {
    /// MODE SENSE(10) rather than (6).
    pub ten: bool,
    /// Disable block descriptors.
    pub dbd: bool,
    /// Long LBA accepted (10 only).
    pub llbaa: bool,
    /// Page control: 0 current, 1 changeable, 2 default, 3 saved.
    pub pc: u8,
    /// Page code (6 bits).
    pub page: u8,
    /// Subpage code.
    pub subpage: u8,
    /// Allocation length.
    pub alloc_len: u16,
    /// CONTROL byte.
    pub control: u8,
}

/// MODE SELECT (6) or (10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct ModeSelect {
    /// MODE SELECT(10) rather than (6).
    pub ten: bool,
    /// Page format.
    pub pf: bool,
    /// Save pages.
    pub sp: bool,
    /// Parameter list length.
    pub param_len: u16,
    /// CONTROL byte.
    pub control: u8,
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
    /// An opcode or service action riser does not model; the CDB bytes as received.
    Unknown(Vec<u8>),
}

fn rw_size(opcode: u8) -> CdbSize {
    match cdb_len(opcode) {
        Some(6) => CdbSize::Six,
        Some(12) => CdbSize::Twelve,
        Some(16) => CdbSize::Sixteen,
        _ => CdbSize::Ten,
    }
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
        use op::*;
        Ok(match opcode {
            TEST_UNIT_READY => Self::TestUnitReady { control: b[5] },
            REQUEST_SENSE => Self::RequestSense { desc: b[1] & 1 != 0, alloc_len: b[4], control: b[5] },
            INQUIRY => Self::Inquiry { evpd: b[1] & 1 != 0, page_code: b[2], alloc_len: u16_at(b, 3), control: b[5] },
            READ_CAPACITY_10 => Self::ReadCapacity10 { lba: u32_at(b, 2), pmi: b[8] & 1 != 0, control: b[9] },
            READ_6 | READ_10 | READ_12 | READ_16 => Self::Read(Rw::parse(rw_size(opcode), b)),
            WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 => Self::Write(Rw::parse(rw_size(opcode), b)),
            WRITE_AND_VERIFY_10 | WRITE_AND_VERIFY_12 | WRITE_AND_VERIFY_16 => Self::WriteAndVerify(Rw::parse(rw_size(opcode), b)),
            VERIFY_10 | VERIFY_12 | VERIFY_16 => Self::Verify(Rw::parse(rw_size(opcode), b)),
            SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 => Self::SynchronizeCache(Rw::parse(rw_size(opcode), b)),
            WRITE_SAME_10 | WRITE_SAME_16 => Self::WriteSame(Rw::parse(rw_size(opcode), b)),
            PRE_FETCH_10 | PRE_FETCH_16 => Self::PreFetch(Rw::parse(rw_size(opcode), b)),
            ORWRITE_16 => Self::OrWrite(Rw::parse(CdbSize::Sixteen, b)),
            SANITIZE => {
                let mut reserved = [0u8; 5];
                reserved.copy_from_slice(&b[2..7]);
                Self::Sanitize { flags: b[1], reserved, param_len: u16_at(b, 7), control: b[9] }
            }
            WRITE_ATOMIC_16 => Self::WriteAtomic { lba: u64_at(b, 2), blocks: u16_at(b, 12), flags: b[1], group: b[14], control: b[15] },
            READ_DEFECT_DATA_10 => {
                Self::ReadDefectData { twelve: false, flags: b[2], index: 0, alloc_len: u32::from(u16_at(b, 7)), control: b[9] }
            }
            READ_DEFECT_DATA_12 => {
                Self::ReadDefectData { twelve: true, flags: b[1], index: u32_at(b, 2), alloc_len: u32_at(b, 6), control: b[11] }
            }
            UNMAP => Self::Unmap { anchor: b[1] & 1 != 0, group: b[6], param_len: u16_at(b, 7), control: b[9] },
            COMPARE_AND_WRITE => Self::CompareAndWrite { lba: u64_at(b, 2), blocks: b[13], flags: b[1], group: b[14], control: b[15] },
            SERVICE_ACTION_IN_16 => match b[1] & 0x1f {
                SA_READ_CAPACITY_16 => {
                    Self::ReadCapacity16 { lba: u64_at(b, 2), alloc_len: u32_at(b, 10), pmi: b[14] & 1 != 0, control: b[15] }
                }
                SA_GET_LBA_STATUS => Self::GetLbaStatus { lba: u64_at(b, 2), alloc_len: u32_at(b, 10), control: b[15] },
                _ => Self::Unknown(b.to_vec()),
            },
            MODE_SENSE_6 | MODE_SENSE_10 => {
                let ten = opcode == MODE_SENSE_10;
                Self::ModeSense(ModeSense {
                    ten,
                    dbd: b[1] & 0x08 != 0,
                    llbaa: ten && b[1] & 0x10 != 0,
                    pc: b[2] >> 6,
                    page: b[2] & 0x3f,
                    subpage: b[3],
                    alloc_len: if ten { u16_at(b, 7) } else { u16::from(b[4]) },
                    control: b[len - 1],
                })
            }
            MODE_SELECT_6 | MODE_SELECT_10 => {
                let ten = opcode == MODE_SELECT_10;
                Self::ModeSelect(ModeSelect {
                    ten,
                    pf: b[1] & 0x10 != 0,
                    sp: b[1] & 0x01 != 0,
                    param_len: if ten { u16_at(b, 7) } else { u16::from(b[4]) },
                    control: b[len - 1],
                })
            }
            REPORT_LUNS => Self::ReportLuns { select: b[2], alloc_len: u32_at(b, 6), control: b[11] },
            MAINTENANCE_IN if b[1] & 0x1f == SA_REPORT_SUPPORTED_OPCODES => Self::ReportSupportedOpcodes {
                rctd: b[2] & 0x80 != 0,
                options: b[2] & 0x07,
                opcode: b[3],
                service_action: u16_at(b, 4),
                alloc_len: u32_at(b, 6),
                control: b[11],
            },
            START_STOP_UNIT => Self::StartStopUnit {
                immed: b[1] & 1 != 0,
                power_condition_modifier: b[3] & 0x0f,
                power_condition: b[4] >> 4,
                no_flush: b[4] & 0x04 != 0,
                loej: b[4] & 0x02 != 0,
                start: b[4] & 0x01 != 0,
                control: b[5],
            },
            PREVENT_ALLOW_MEDIUM_REMOVAL => Self::PreventAllowMediumRemoval { prevent: b[4] & 3, control: b[5] },
            RESERVE_6 => Self::Reserve6 { control: b[5] },
            RELEASE_6 => Self::Release6 { control: b[5] },
            RESERVE_10 | RELEASE_10 => {
                let (third_party, longid, third_party_id, param_len, control) =
                    (b[1] & 0x10 != 0, b[1] & 0x02 != 0, b[3], u16_at(b, 7), b[9]);
                if opcode == RESERVE_10 {
                    Self::Reserve10 { third_party, longid, third_party_id, param_len, control }
                } else {
                    Self::Release10 { third_party, longid, third_party_id, param_len, control }
                }
            }
            PERSISTENT_RESERVE_IN => Self::PersistentReserveIn { service_action: b[1] & 0x1f, alloc_len: u16_at(b, 7), control: b[9] },
            PERSISTENT_RESERVE_OUT => Self::PersistentReserveOut {
                service_action: b[1] & 0x1f,
                scope: b[2] >> 4,
                pr_type: b[2] & 0x0f,
                param_len: u32_at(b, 5),
                control: b[9],
            },
            _ => Self::Unknown(b.to_vec()),
        })
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
            Self::ReportSupportedOpcodes { .. } => MAINTENANCE_IN,
            Self::StartStopUnit { .. } => START_STOP_UNIT,
            Self::PreventAllowMediumRemoval { .. } => PREVENT_ALLOW_MEDIUM_REMOVAL,
            Self::Reserve6 { .. } => RESERVE_6,
            Self::Release6 { .. } => RELEASE_6,
            Self::Reserve10 { .. } => RESERVE_10,
            Self::Release10 { .. } => RELEASE_10,
            Self::PersistentReserveIn { .. } => PERSISTENT_RESERVE_IN,
            Self::PersistentReserveOut { .. } => PERSISTENT_RESERVE_OUT,
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
        let last = len - 1;
        match *self {
            Self::TestUnitReady { control } | Self::Reserve6 { control } | Self::Release6 { control } => b[5] = control,
            Self::RequestSense { desc, alloc_len, control } => {
                b[1] = u8::from(desc);
                b[4] = alloc_len;
                b[5] = control;
            }
            Self::Inquiry { evpd, page_code, alloc_len, control } => {
                b[1] = u8::from(evpd);
                b[2] = page_code;
                put_u16(b, 3, alloc_len);
                b[5] = control;
            }
            Self::ReadCapacity10 { lba, pmi, control } => {
                put_u32(b, 2, lba);
                b[8] = u8::from(pmi);
                b[9] = control;
            }
            Self::ReadCapacity16 { lba, alloc_len, pmi, control } => {
                b[1] = op::SA_READ_CAPACITY_16;
                put_u64(b, 2, lba);
                put_u32(b, 10, alloc_len);
                b[14] = u8::from(pmi);
                b[15] = control;
            }
            Self::GetLbaStatus { lba, alloc_len, control } => {
                b[1] = op::SA_GET_LBA_STATUS;
                put_u64(b, 2, lba);
                put_u32(b, 10, alloc_len);
                b[15] = control;
            }
            Self::Read(ref r)
            | Self::Write(ref r)
            | Self::WriteAndVerify(ref r)
            | Self::Verify(ref r)
            | Self::SynchronizeCache(ref r)
            | Self::WriteSame(ref r)
            | Self::PreFetch(ref r)
            | Self::OrWrite(ref r) => r.emit(b),
            Self::Sanitize { flags, reserved, param_len, control } => {
                b[1] = flags;
                b[2..7].copy_from_slice(&reserved);
                put_u16(b, 7, param_len);
                b[9] = control;
            }
            Self::WriteAtomic { lba, blocks, flags, group, control } => {
                b[1] = flags;
                put_u64(b, 2, lba);
                put_u16(b, 12, blocks);
                b[14] = group;
                b[15] = control;
            }
            Self::ReadDefectData { twelve, flags, index, alloc_len, control } => {
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
            Self::Unmap { anchor, group, param_len, control } => {
                b[1] = u8::from(anchor);
                b[6] = group;
                put_u16(b, 7, param_len);
                b[9] = control;
            }
            Self::CompareAndWrite { lba, blocks, flags, group, control } => {
                b[1] = flags;
                put_u64(b, 2, lba);
                b[13] = blocks;
                b[14] = group;
                b[15] = control;
            }
            Self::ModeSense(m) => {
                b[1] = if m.dbd { 0x08 } else { 0 } | if m.llbaa && m.ten { 0x10 } else { 0 };
                b[2] = (m.pc << 6) | (m.page & 0x3f);
                b[3] = m.subpage;
                if m.ten {
                    put_u16(b, 7, m.alloc_len)
                } else {
                    b[4] = m.alloc_len as u8
                }
                b[last] = m.control;
            }
            Self::ModeSelect(m) => {
                b[1] = if m.pf { 0x10 } else { 0 } | u8::from(m.sp);
                if m.ten {
                    put_u16(b, 7, m.param_len)
                } else {
                    b[4] = m.param_len as u8
                }
                b[last] = m.control;
            }
            Self::ReportLuns { select, alloc_len, control } => {
                b[2] = select;
                put_u32(b, 6, alloc_len);
                b[11] = control;
            }
            Self::ReportSupportedOpcodes { rctd, options, opcode, service_action, alloc_len, control } => {
                b[1] = op::SA_REPORT_SUPPORTED_OPCODES;
                b[2] = if rctd { 0x80 } else { 0 } | (options & 7);
                b[3] = opcode;
                put_u16(b, 4, service_action);
                put_u32(b, 6, alloc_len);
                b[11] = control;
            }
            Self::StartStopUnit { immed, power_condition_modifier, power_condition, no_flush, loej, start, control } => {
                b[1] = u8::from(immed);
                b[3] = power_condition_modifier & 0x0f;
                b[4] = (power_condition << 4) | if no_flush { 4 } else { 0 } | if loej { 2 } else { 0 } | u8::from(start);
                b[5] = control;
            }
            Self::PreventAllowMediumRemoval { prevent, control } => {
                b[4] = prevent & 3;
                b[5] = control;
            }
            Self::Reserve10 { third_party, longid, third_party_id, param_len, control }
            | Self::Release10 { third_party, longid, third_party_id, param_len, control } => {
                b[1] = if third_party { 0x10 } else { 0 } | if longid { 0x02 } else { 0 };
                b[3] = third_party_id;
                put_u16(b, 7, param_len);
                b[9] = control;
            }
            Self::PersistentReserveIn { service_action, alloc_len, control } => {
                b[1] = service_action & 0x1f;
                put_u16(b, 7, alloc_len);
                b[9] = control;
            }
            Self::PersistentReserveOut { service_action, scope, pr_type, param_len, control } => {
                b[1] = service_action & 0x1f;
                b[2] = (scope << 4) | (pr_type & 0x0f);
                put_u32(b, 5, param_len);
                b[9] = control;
            }
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
            Self::PersistentReserveOut { param_len, .. } => Some(u64::from(*param_len)),
            Self::Reserve10 { param_len, .. } | Self::Release10 { param_len, .. } => Some(u64::from(*param_len)),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read6_zero_means_256() {
        let c = Cdb::parse(&[0x08, 0xff, 0x12, 0x34, 0, 0]).unwrap();
        let Cdb::Read(r) = c else { panic!("{c:?}") };
        assert_eq!(r.lba, 0x1f1234);
        assert_eq!(r.transfer_blocks(), 256);
        assert_eq!(Cdb::Read(r).to_vec(), [0x08, 0x1f, 0x12, 0x34, 0, 0]);
    }

    #[test]
    fn write16_fua() {
        let b = [0x8a, 0x08, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0x10, 0, 0, 0];
        let Cdb::Write(r) = Cdb::parse(&b).unwrap() else { panic!() };
        assert_eq!((r.lba, r.blocks, r.fua(), r.size), (1 << 32, 4096, true, CdbSize::Sixteen));
        assert_eq!(Cdb::Write(r).to_vec(), b);
    }

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

    #[test]
    fn inquiry_vpd() {
        let b = [0x12, 1, 0x83, 0x01, 0x00, 0];
        let c = Cdb::parse(&b).unwrap();
        assert_eq!(c, Cdb::Inquiry { evpd: true, page_code: 0x83, alloc_len: 256, control: 0 });
        assert_eq!(c.to_vec(), b);
    }

    #[test]
    fn pr_out_and_data_out_len() {
        let b = [0x5f, 0x01, 0x13, 0, 0, 0, 0, 0, 24, 0];
        let c = Cdb::parse(&b).unwrap();
        assert_eq!(c, Cdb::PersistentReserveOut { service_action: 1, scope: 1, pr_type: 3, param_len: 24, control: 0 });
        assert_eq!(c.data_out_len(512), Some(24));
        assert_eq!(c.to_vec(), b);
        let caw = Cdb::CompareAndWrite { lba: 0, blocks: 1, flags: 0, group: 0, control: 0 };
        assert_eq!(caw.data_out_len(512), Some(1024));
    }
}
