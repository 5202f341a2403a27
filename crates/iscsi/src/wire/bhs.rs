//! The 48-byte Basic Header Segment as a zero-copy view (RFC 7143 §11.2.1).

use super::{DecodeError, Opcode};
use core::ops::Range;
use riser_scsi::lun::Lun;

/// Length of the BHS.
pub const BHS_LEN: usize = 48;

/// Byte offsets of the fields every BHS has, and of those most opcodes place alike. The per-PDU
/// files (`scsi.rs`, `data.rs`, …) name the rest in their own `field` modules.
pub(crate) mod field {
    /// I bit and opcode.
    pub(crate) const OPCODE: usize = 0;
    /// F bit and opcode-specific flags.
    pub(crate) const FLAGS: usize = 1;
    /// TotalAHSLength (4-byte words).
    pub(crate) const AHS_LEN: usize = 4;
    /// DataSegmentLength (24 bits).
    pub(crate) const DSL: usize = 5;
    /// LUN, or opcode-specific (8 bytes).
    pub(crate) const LUN: usize = 8;
    /// Initiator Task Tag.
    pub(crate) const ITT: usize = 16;
    /// Target Transfer Tag (NOP, Text, Data-Out/In, R2T, SNACK).
    pub(crate) const TTT: usize = 20;
    /// CmdSN, in initiator PDUs that carry one.
    pub(crate) const CMD_SN: usize = 24;
    /// ExpStatSN, in initiator PDUs.
    pub(crate) const EXP_STAT_SN: usize = 28;
    /// StatSN, in target PDUs that carry one.
    pub(crate) const STAT_SN: usize = 24;
    /// ExpCmdSN, in target PDUs.
    pub(crate) const EXP_CMD_SN: usize = 28;
    /// MaxCmdSN, in target PDUs.
    pub(crate) const MAX_CMD_SN: usize = 32;
}

/// Bit 6 of byte 0: immediate delivery.
pub const IMMEDIATE: u8 = 0x40;
/// Bit 7 of byte 1: final.
pub const FINAL: u8 = 0x80;

/// A view over a buffer holding a BHS. After [`Bhs::new_checked`] no accessor panics.
/// Setters exist when the buffer is mutable, so a datamover can stamp StatSN, ExpCmdSN, ITT
/// or lengths into an already-encoded header.
#[derive(Clone, Copy, Debug)]
pub struct Bhs<T: AsRef<[u8]>> {
    buf: T,
}

impl<T: AsRef<[u8]>> Bhs<T> {
    /// Wrap without checking the length; accessors panic if it is below 48 bytes.
    #[inline]
    pub const fn new_unchecked(buf: T) -> Self {
        Self { buf }
    }
    /// Wrap, checking that at least 48 bytes are present.
    #[inline]
    pub fn new_checked(buf: T) -> Result<Self, DecodeError> {
        let have = buf.as_ref().len();
        if have < BHS_LEN {
            return Err(DecodeError::Truncated { need: BHS_LEN, have });
        }
        Ok(Self { buf })
    }
    /// The underlying buffer.
    #[inline]
    pub fn into_inner(self) -> T {
        self.buf
    }
    /// The 48 header bytes.
    #[inline]
    pub fn bytes(&self) -> &[u8] {
        &self.buf.as_ref()[..BHS_LEN]
    }
    /// The 48 header bytes as an array: a view over it reads fields at constant offsets
    /// without bounds checks.
    #[inline]
    pub(crate) fn array(&self) -> Result<&[u8; BHS_LEN], DecodeError> {
        let b = self.buf.as_ref();
        b.first_chunk().ok_or(DecodeError::Truncated { need: BHS_LEN, have: b.len() })
    }
    /// Opcode (low 6 bits of byte 0).
    #[inline]
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buf.as_ref()[field::OPCODE] & 0x3f)
    }
    /// I bit.
    #[inline]
    pub fn immediate(&self) -> bool {
        self.buf.as_ref()[field::OPCODE] & IMMEDIATE != 0
    }
    /// Byte 1 (F bit and opcode-specific flags).
    #[inline]
    pub fn flags(&self) -> u8 {
        self.buf.as_ref()[field::FLAGS]
    }
    /// F bit.
    #[inline]
    pub fn final_bit(&self) -> bool {
        self.flags() & FINAL != 0
    }
    /// TotalAHSLength in bytes (the field counts 4-byte words).
    #[inline]
    pub fn total_ahs_len(&self) -> usize {
        usize::from(self.buf.as_ref()[field::AHS_LEN]) * 4
    }
    /// DataSegmentLength (bytes, excluding padding and digest).
    #[inline]
    pub fn data_segment_len(&self) -> u32 {
        self.u24(field::DSL)
    }
    /// The data segment length rounded up to a multiple of 4.
    #[inline]
    pub fn padded_data_len(&self) -> usize {
        pad4(self.data_segment_len() as usize)
    }
    /// Bytes 8..16 as a LUN (opcode-specific in some PDUs).
    #[inline]
    pub fn lun(&self) -> Lun {
        let mut l = [0u8; 8];
        l.copy_from_slice(&self.buf.as_ref()[field::LUN..field::LUN + 8]);
        Lun(l)
    }
    /// Initiator Task Tag.
    #[inline]
    pub fn itt(&self) -> u32 {
        self.u32(field::ITT)
    }
    /// Big-endian u32 at a byte offset of the BHS.
    #[inline]
    pub fn u32(&self, at: usize) -> u32 {
        let b = self.buf.as_ref();
        u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
    }
    /// Big-endian u16 at a byte offset.
    #[inline]
    pub fn u16(&self, at: usize) -> u16 {
        let b = self.buf.as_ref();
        u16::from_be_bytes([b[at], b[at + 1]])
    }
    /// Big-endian 24-bit value at a byte offset.
    #[inline]
    pub fn u24(&self, at: usize) -> u32 {
        let b = self.buf.as_ref();
        u32::from_be_bytes([0, b[at], b[at + 1], b[at + 2]])
    }
    /// Byte at an offset.
    #[inline]
    pub fn u8(&self, at: usize) -> u8 {
        self.buf.as_ref()[at]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Bhs<T> {
    /// Set byte 0 (I bit and opcode).
    #[inline]
    pub fn set_opcode(&mut self, op: Opcode, immediate: bool) {
        self.buf.as_mut()[field::OPCODE] = (op.0 & 0x3f) | if immediate { IMMEDIATE } else { 0 };
    }
    /// Set byte 1.
    #[inline]
    pub fn set_flags(&mut self, flags: u8) {
        self.buf.as_mut()[field::FLAGS] = flags;
    }
    /// Set TotalAHSLength from a byte count (must be a multiple of 4, at most 1020).
    #[inline]
    pub fn set_total_ahs_len(&mut self, bytes: usize) {
        debug_assert!(bytes.is_multiple_of(4) && bytes <= 1020);
        self.buf.as_mut()[field::AHS_LEN] = (bytes / 4) as u8;
    }
    /// Set DataSegmentLength (24 bits).
    #[inline]
    pub fn set_data_segment_len(&mut self, len: u32) {
        debug_assert!(len < 1 << 24);
        self.set_u24(field::DSL, len);
    }
    /// Set the LUN field.
    #[inline]
    pub fn set_lun(&mut self, lun: Lun) {
        self.buf.as_mut()[field::LUN..field::LUN + 8].copy_from_slice(&lun.0);
    }
    /// Set the ITT.
    #[inline]
    pub fn set_itt(&mut self, itt: u32) {
        self.set_u32(field::ITT, itt);
    }
    /// Store a big-endian u32.
    #[inline]
    pub fn set_u32(&mut self, at: usize, v: u32) {
        self.buf.as_mut()[at..at + 4].copy_from_slice(&v.to_be_bytes());
    }
    /// Store a big-endian u16.
    #[inline]
    pub fn set_u16(&mut self, at: usize, v: u16) {
        self.buf.as_mut()[at..at + 2].copy_from_slice(&v.to_be_bytes());
    }
    /// Store a big-endian 24-bit value.
    #[inline]
    pub fn set_u24(&mut self, at: usize, v: u32) {
        self.buf.as_mut()[at..at + 3].copy_from_slice(&v.to_be_bytes()[1..]);
    }
    /// Store a byte.
    #[inline]
    pub fn set_u8(&mut self, at: usize, v: u8) {
        self.buf.as_mut()[at] = v;
    }
    /// Store bytes over a field (`src` is exactly as long as the range).
    #[inline]
    pub(crate) fn set_bytes(&mut self, field: Range<usize>, src: &[u8]) {
        self.buf.as_mut()[field].copy_from_slice(src);
    }
}

/// Whether `mask` is set in a flags byte.
#[inline]
pub(crate) const fn bit(b: u8, mask: u8) -> bool {
    b & mask != 0
}

/// `mask` if `on`, else nothing: one flag of a flags byte.
#[inline]
pub(crate) const fn flag(on: bool, mask: u8) -> u8 {
    if on { mask } else { 0 }
}

/// Round up to a multiple of 4.
#[inline]
pub const fn pad4(n: usize) -> usize {
    (n + 3) & !3
}
