//! READ CAPACITY (10/16) and GET LBA STATUS data (SBC-4 §5.16, §5.20, §5.8).

use crate::Error;
use crate::be::{need, put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use alloc::vec::Vec;

/// READ CAPACITY(10) data: 8 bytes. A device with more than 2^32 blocks reports 0xFFFFFFFF.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Capacity10 {
    /// Last LBA (clamped to 0xFFFFFFFF).
    pub last_lba: u32,
    /// Block length in bytes.
    pub block_len: u32,
}

impl Capacity10 {
    /// From the device geometry.
    pub fn new(blocks: u64, block_len: u32) -> Self {
        Self { last_lba: blocks.saturating_sub(1).min(u64::from(u32::MAX)) as u32, block_len }
    }
    /// Encode.
    pub fn to_bytes(&self) -> [u8; 8] {
        let mut b = [0; 8];
        put_u32(&mut b, 0, self.last_lba);
        put_u32(&mut b, 4, self.block_len);
        b
    }
    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        need("READ CAPACITY(10) data", b, 8)?;
        Ok(Self { last_lba: u32_at(b, 0), block_len: u32_at(b, 4) })
    }
}

/// READ CAPACITY(16) data: 32 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[allow(missing_docs)]
pub struct Capacity16 {
    pub last_lba: u64,
    pub block_len: u32,
    /// P_TYPE (bits 3-1 of byte 12).
    pub p_type: u8,
    pub prot_en: bool,
    /// P_I_EXPONENT (bits 7-4 of byte 13).
    pub p_i_exponent: u8,
    /// LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT.
    pub lbppbe: u8,
    /// Logical block provisioning management enabled (thin provisioning).
    pub lbpme: bool,
    /// Unmapped blocks read as zero.
    pub lbprz: bool,
    pub lowest_aligned_lba: u16,
}

impl Capacity16 {
    /// From the device geometry.
    pub fn new(blocks: u64, block_len: u32) -> Self {
        Self { last_lba: blocks.saturating_sub(1), block_len, ..Self::default() }
    }
    /// Encode.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut b = [0; 32];
        put_u64(&mut b, 0, self.last_lba);
        put_u32(&mut b, 8, self.block_len);
        b[12] = ((self.p_type & 7) << 1) | u8::from(self.prot_en);
        b[13] = (self.p_i_exponent << 4) | (self.lbppbe & 0x0f);
        put_u16(&mut b, 14, self.lowest_aligned_lba & 0x3fff);
        b[14] |= if self.lbpme { 0x80 } else { 0 } | if self.lbprz { 0x40 } else { 0 };
        b
    }
    /// Parse (at least 16 bytes; the rest is reserved).
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        need("READ CAPACITY(16) data", b, 16)?;
        Ok(Self {
            last_lba: u64_at(b, 0),
            block_len: u32_at(b, 8),
            p_type: (b[12] >> 1) & 7,
            prot_en: b[12] & 1 != 0,
            p_i_exponent: b[13] >> 4,
            lbppbe: b[13] & 0x0f,
            lbpme: b[14] & 0x80 != 0,
            lbprz: b[14] & 0x40 != 0,
            lowest_aligned_lba: u16_at(b, 14) & 0x3fff,
        })
    }
}

/// Provisioning status of an extent in GET LBA STATUS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LbaStatusDescriptor {
    /// First LBA of the extent.
    pub lba: u64,
    /// Number of blocks.
    pub blocks: u32,
    /// 0 mapped, 1 deallocated, 2 anchored.
    pub status: u8,
}

/// Encode GET LBA STATUS parameter data.
pub fn lba_status_to_bytes(descriptors: &[LbaStatusDescriptor]) -> Vec<u8> {
    let mut b = alloc::vec![0u8; 8 + 16 * descriptors.len()];
    put_u32(&mut b, 0, (4 + 16 * descriptors.len()) as u32);
    for (i, d) in descriptors.iter().enumerate() {
        let at = 8 + 16 * i;
        put_u64(&mut b, at, d.lba);
        put_u32(&mut b, at + 8, d.blocks);
        b[at + 12] = d.status & 0x0f;
    }
    b
}

/// Parse GET LBA STATUS parameter data (as much as the buffer holds).
pub fn parse_lba_status(b: &[u8]) -> Result<Vec<LbaStatusDescriptor>, Error> {
    need("GET LBA STATUS data", b, 8)?;
    // PARAMETER DATA LENGTH counts from byte 4; a value below 4 leaves no descriptors.
    let end = (4 + u32_at(b, 0) as usize).clamp(8, b.len());
    Ok(b[8..end].chunks_exact(16).map(|d| LbaStatusDescriptor { lba: u64_at(d, 0), blocks: u32_at(d, 8), status: d[12] & 0x0f }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_round_trips() {
        let c = Capacity10::new(2_097_152, 512);
        assert_eq!(c.to_bytes(), [0, 0x1f, 0xff, 0xff, 0, 0, 2, 0]);
        assert_eq!(Capacity10::parse(&c.to_bytes()).unwrap(), c);
        assert_eq!(Capacity10::new(1 << 40, 512).last_lba, u32::MAX);
        let c = Capacity16 { lbpme: true, lbprz: true, lbppbe: 3, ..Capacity16::new(1 << 40, 4096) };
        let b = c.to_bytes();
        assert_eq!(b[14], 0xc0);
        assert_eq!(Capacity16::parse(&b).unwrap(), c);
    }

    #[test]
    fn lba_status() {
        let d = [LbaStatusDescriptor { lba: 0, blocks: 8, status: 0 }, LbaStatusDescriptor { lba: 8, blocks: 100, status: 1 }];
        let b = lba_status_to_bytes(&d);
        assert_eq!(&b[..4], &[0, 0, 0, 36]);
        assert_eq!(parse_lba_status(&b).unwrap(), d);
        assert_eq!(parse_lba_status(&b[..20]).unwrap(), []);
        // A parameter data length below 4 (found by the sense fuzzer): no descriptors, no panic.
        assert_eq!(parse_lba_status(&[0, 0, 0, 1, 0, 0, 0, 0, 9]).unwrap(), []);
    }
}
