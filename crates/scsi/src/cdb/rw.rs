//! The block read/write family: READ, WRITE, WRITE AND VERIFY, VERIFY, WRITE SAME, SYNCHRONIZE
//! CACHE, PRE-FETCH and ORWRITE (all laid out as an [`Rw`]), and COMPARE AND WRITE, WRITE ATOMIC,
//! UNMAP and SANITIZE.

use super::{Cdb, cdb_len, op};
use crate::be::{put_u16, put_u24, put_u32, put_u64, u16_at, u24_at, u32_at, u64_at};

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

fn rw_size(opcode: u8) -> CdbSize {
    match cdb_len(opcode) {
        Some(6) => CdbSize::Six,
        Some(12) => CdbSize::Twelve,
        Some(16) => CdbSize::Sixteen,
        _ => CdbSize::Ten,
    }
}

/// Parse a command of this family from `b` (exactly the CDB's length); `None` when `opcode`
/// belongs to another family.
pub(super) fn parse(opcode: u8, b: &[u8]) -> Option<Cdb> {
    use op::*;
    Some(match opcode {
        READ_6 | READ_10 | READ_12 | READ_16 => Cdb::Read(Rw::parse(rw_size(opcode), b)),
        WRITE_6 | WRITE_10 | WRITE_12 | WRITE_16 => Cdb::Write(Rw::parse(rw_size(opcode), b)),
        WRITE_AND_VERIFY_10 | WRITE_AND_VERIFY_12 | WRITE_AND_VERIFY_16 => Cdb::WriteAndVerify(Rw::parse(rw_size(opcode), b)),
        VERIFY_10 | VERIFY_12 | VERIFY_16 => Cdb::Verify(Rw::parse(rw_size(opcode), b)),
        SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 => Cdb::SynchronizeCache(Rw::parse(rw_size(opcode), b)),
        WRITE_SAME_10 | WRITE_SAME_16 => Cdb::WriteSame(Rw::parse(rw_size(opcode), b)),
        PRE_FETCH_10 | PRE_FETCH_16 => Cdb::PreFetch(Rw::parse(rw_size(opcode), b)),
        ORWRITE_16 => Cdb::OrWrite(Rw::parse(CdbSize::Sixteen, b)),
        SANITIZE => {
            let mut reserved = [0u8; 5];
            reserved.copy_from_slice(&b[2..7]);
            Cdb::Sanitize { flags: b[1], reserved, param_len: u16_at(b, 7), control: b[9] }
        }
        WRITE_ATOMIC_16 => Cdb::WriteAtomic { lba: u64_at(b, 2), blocks: u16_at(b, 12), flags: b[1], group: b[14], control: b[15] },
        UNMAP => Cdb::Unmap { anchor: b[1] & 1 != 0, group: b[6], param_len: u16_at(b, 7), control: b[9] },
        COMPARE_AND_WRITE => Cdb::CompareAndWrite { lba: u64_at(b, 2), blocks: b[13], flags: b[1], group: b[14], control: b[15] },
        _ => return None,
    })
}

/// Encode a command of this family into `b` (exactly the CDB's length, zeroed, opcode set).
pub(super) fn emit(cdb: &Cdb, b: &mut [u8]) {
    match *cdb {
        Cdb::Read(ref r)
        | Cdb::Write(ref r)
        | Cdb::WriteAndVerify(ref r)
        | Cdb::Verify(ref r)
        | Cdb::SynchronizeCache(ref r)
        | Cdb::WriteSame(ref r)
        | Cdb::PreFetch(ref r)
        | Cdb::OrWrite(ref r) => r.emit(b),
        Cdb::Sanitize { flags, reserved, param_len, control } => {
            b[1] = flags;
            b[2..7].copy_from_slice(&reserved);
            put_u16(b, 7, param_len);
            b[9] = control;
        }
        Cdb::WriteAtomic { lba, blocks, flags, group, control } => {
            b[1] = flags;
            put_u64(b, 2, lba);
            put_u16(b, 12, blocks);
            b[14] = group;
            b[15] = control;
        }
        Cdb::Unmap { anchor, group, param_len, control } => {
            b[1] = u8::from(anchor);
            b[6] = group;
            put_u16(b, 7, param_len);
            b[9] = control;
        }
        Cdb::CompareAndWrite { lba, blocks, flags, group, control } => {
            b[1] = flags;
            put_u64(b, 2, lba);
            b[13] = blocks;
            b[14] = group;
            b[15] = control;
        }
        _ => unreachable!("not a block read/write command: {cdb:?}"),
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
}
