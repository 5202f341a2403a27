//! Third-party copy, LID1 (SPC-4 §6.4 EXTENDED COPY, §6.18 RECEIVE COPY RESULTS, §7.8.17 the
//! Third-party Copy VPD page): the EXTENDED COPY parameter list, the COPY STATUS and OPERATING
//! PARAMETERS data of RECEIVE COPY RESULTS, and the VPD page body.
//!
//! [`ExtendedCopy::parse`] checks a parameter list against the copy manager's [`Limits`] and
//! keeps only what riser implements: identification CSCD descriptors (0xE4) and the
//! block→block segment descriptors (0x02, and 0x0A with byte counts). Anything else is an
//! error that maps to the sense data SPC asks for ([`CopyError::sense`]). Like every parser
//! here it is total: any input gives a value or an error, never a panic.

use crate::Error;
use crate::be::{put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use crate::inquiry::Designator;
use crate::sense::{AscAscq, Sense, SenseKey};
use alloc::vec::Vec;

/// VPD page code of the Third-party Copy page.
pub const VPD_THIRD_PARTY_COPY: u8 = 0x8f;

/// EXTENDED COPY service action LID1 (the only one riser implements).
pub const EXTENDED_COPY_LID1: u8 = 0x00;

/// RECEIVE COPY RESULTS service actions.
pub mod rcr {
    /// COPY STATUS.
    pub const COPY_STATUS: u8 = 0x00;
    /// RECEIVE DATA.
    pub const RECEIVE_DATA: u8 = 0x01;
    /// OPERATING PARAMETERS.
    pub const OPERATING_PARAMETERS: u8 = 0x03;
    /// FAILED SEGMENT DETAILS.
    pub const FAILED_SEGMENT_DETAILS: u8 = 0x04;
}

/// Descriptor type codes (segment descriptors 0x00-0xBF, CSCD descriptors 0xC0-0xFF).
pub mod descriptor {
    /// Segment: block device to block device, a number of blocks.
    pub const BLOCK_TO_BLOCK: u8 = 0x02;
    /// Segment: block device to block device, a number of bytes at byte offsets.
    pub const BLOCK_TO_BLOCK_OFFSET: u8 = 0x0a;
    /// CSCD: identification descriptor (a designator of VPD page 0x83).
    pub const IDENTIFICATION: u8 = 0xe4;
}

/// LIST ID USAGE values (parameter list byte 1 bits 4-3).
pub mod list_id_usage {
    /// Hold the results for RECEIVE COPY RESULTS; the list identifier is unique.
    pub const HOLD: u8 = 0;
    /// Hold nothing; the list identifier is still unique among copies in progress.
    pub const DISCARD: u8 = 2;
    /// Hold nothing; the list identifier means nothing.
    pub const NONE: u8 = 3;
}

/// Copy manager status (COPY STATUS byte 4 bits 6-0).
pub mod status {
    /// The copy is in progress.
    pub const IN_PROGRESS: u8 = 0x00;
    /// The copy completed without errors.
    pub const COMPLETED: u8 = 0x01;
    /// The copy completed with errors.
    pub const FAILED: u8 = 0x02;
}

/// Length of the parameter list header.
pub const HEADER_LEN: usize = 16;
/// Length of an identification (and every other 0xE0-0xE9) CSCD descriptor.
pub const CSCD_LEN: usize = 32;
/// Length of a block→block (0x02) segment descriptor.
pub const BLOCK_TO_BLOCK_LEN: usize = 28;
/// Length of a block→block with offsets (0x0A) segment descriptor.
pub const BLOCK_TO_BLOCK_OFFSET_LEN: usize = 32;

/// What a copy manager accepts; reported in OPERATING PARAMETERS and the VPD page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most CSCD descriptors in one list.
    pub max_cscds: u16,
    /// Most segment descriptors in one list.
    pub max_segments: u16,
    /// Most bytes of CSCD and segment descriptors together.
    pub max_list_len: u32,
    /// Most bytes one segment descriptor may move.
    pub max_segment_bytes: u32,
}

/// Why a parameter list was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CopyError {
    /// The list is shorter than its header says (PARAMETER LIST LENGTH ERROR).
    Truncated,
    /// The descriptors are longer than [`Limits::max_list_len`] (PARAMETER LIST LENGTH ERROR).
    ListTooLong,
    /// More CSCD descriptors than [`Limits::max_cscds`].
    TooManyCscds,
    /// More segment descriptors than [`Limits::max_segments`].
    TooManySegments,
    /// A CSCD descriptor type riser does not implement, at this byte of the list.
    UnsupportedCscd(usize),
    /// A segment descriptor type riser does not implement, at this byte of the list.
    UnsupportedSegment(usize),
    /// INVALID FIELD IN PARAMETER LIST at this byte (and bit).
    InvalidField(usize, Option<u8>),
}

fn pointer(at: usize) -> u16 {
    u16::try_from(at).unwrap_or(u16::MAX)
}

impl CopyError {
    /// The sense data (ILLEGAL REQUEST) a copy manager answers with, with a field pointer into
    /// the parameter list where SPC has one.
    pub fn sense(&self) -> Sense {
        let with = |asc: AscAscq, at: usize, bit: Option<u8>| {
            let mut s = Sense::invalid_field_in_parameter_list(pointer(at), bit);
            s.asc = asc;
            s
        };
        match *self {
            Self::Truncated | Self::ListTooLong => Sense::new(SenseKey::ILLEGAL_REQUEST, AscAscq::PARAMETER_LIST_LENGTH_ERROR),
            Self::TooManyCscds => with(AscAscq::TOO_MANY_TARGET_DESCRIPTORS, 2, None),
            Self::TooManySegments => with(AscAscq::TOO_MANY_SEGMENT_DESCRIPTORS, 8, None),
            Self::UnsupportedCscd(at) => with(AscAscq::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE, at, None),
            Self::UnsupportedSegment(at) => with(AscAscq::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE, at, None),
            Self::InvalidField(at, bit) => Sense::invalid_field_in_parameter_list(pointer(at), bit),
        }
    }
}

/// An identification CSCD descriptor (0xE4): a logical unit named by one of its designators.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cscd {
    /// Byte 1 bits 7-6 (reserved for this descriptor type since SPC-4: ignored).
    pub lu_id_type: u8,
    /// NUL (obsolete since SPC-4: ignored).
    pub nul: bool,
    /// Peripheral device type (0: block device).
    pub peripheral_type: u8,
    /// RELATIVE INITIATOR PORT IDENTIFIER.
    pub relative_initiator_port: u16,
    /// The designator (association, type, code set and value as in VPD page 0x83).
    pub designator: Designator,
    /// PAD (block device type specific parameters).
    pub pad: bool,
    /// DISK BLOCK LENGTH.
    pub block_len: u32,
}

impl Cscd {
    /// A block-device identification descriptor naming `designator`.
    pub fn block(designator: Designator, block_len: u32) -> Self {
        Self { lu_id_type: 0, nul: false, peripheral_type: 0, relative_initiator_port: 0, designator, pad: false, block_len }
    }

    fn parse(d: &[u8], at: usize) -> Result<Self, CopyError> {
        let len = usize::from(d[7]);
        if len > 20 {
            return Err(CopyError::InvalidField(at + 7, None));
        }
        Ok(Self {
            lu_id_type: d[1] >> 6,
            nul: d[1] & 0x20 != 0,
            peripheral_type: d[1] & 0x1f,
            relative_initiator_port: u16_at(d, 2),
            designator: Designator {
                protocol: d[4] >> 4,
                code_set: d[4] & 0x0f,
                piv: d[5] & 0x80 != 0,
                association: (d[5] >> 4) & 3,
                kind: d[5] & 0x0f,
                value: d[8..8 + len].to_vec(),
            },
            pad: d[28] & 0x04 != 0,
            block_len: u32_at(d, 28) & 0x00ff_ffff,
        })
    }

    fn emit(&self, out: &mut Vec<u8>) {
        let mut d = [0u8; CSCD_LEN];
        d[0] = descriptor::IDENTIFICATION;
        d[1] = (self.lu_id_type << 6) | if self.nul { 0x20 } else { 0 } | (self.peripheral_type & 0x1f);
        put_u16(&mut d, 2, self.relative_initiator_port);
        let g = &self.designator;
        d[4] = (g.protocol << 4) | (g.code_set & 0x0f);
        d[5] = if g.piv { 0x80 } else { 0 } | ((g.association & 3) << 4) | (g.kind & 0x0f);
        let n = g.value.len().min(20);
        d[7] = n as u8;
        d[8..8 + n].copy_from_slice(&g.value[..n]);
        put_u32(&mut d, 28, self.block_len & 0x00ff_ffff);
        d[28] = if self.pad { 0x04 } else { 0 };
        out.extend_from_slice(&d);
    }
}

/// How much a segment moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentLength {
    /// Type 0x02: a number of blocks (of the source's block size, or the destination's with DC).
    Blocks(u16),
    /// Type 0x0A: a number of bytes, starting at byte offsets into the first blocks.
    Bytes {
        /// NUMBER OF BYTES.
        count: u32,
        /// SOURCE BYTE OFFSET.
        src_offset: u16,
        /// DESTINATION BYTE OFFSET.
        dst_offset: u16,
    },
}

/// A block→block segment descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment {
    /// Where the descriptor starts in the parameter list (the segment pointer of sense data).
    pub at: usize,
    /// DC: the number of blocks counts destination blocks.
    pub dc: bool,
    /// CAT.
    pub cat: bool,
    /// Index of the source in the CSCD descriptor list.
    pub src: u16,
    /// Index of the destination in the CSCD descriptor list.
    pub dst: u16,
    /// The amount.
    pub length: SegmentLength,
    /// SOURCE BLOCK DEVICE LOGICAL BLOCK ADDRESS.
    pub src_lba: u64,
    /// DESTINATION BLOCK DEVICE LOGICAL BLOCK ADDRESS.
    pub dst_lba: u64,
}

impl Segment {
    /// A type 0x02 segment.
    pub fn blocks(src: u16, dst: u16, blocks: u16, src_lba: u64, dst_lba: u64) -> Self {
        Self { at: 0, dc: false, cat: false, src, dst, length: SegmentLength::Blocks(blocks), src_lba, dst_lba }
    }

    fn emit(&self, out: &mut Vec<u8>) {
        let (kind, len) = match self.length {
            SegmentLength::Blocks(_) => (descriptor::BLOCK_TO_BLOCK, BLOCK_TO_BLOCK_LEN),
            SegmentLength::Bytes { .. } => (descriptor::BLOCK_TO_BLOCK_OFFSET, BLOCK_TO_BLOCK_OFFSET_LEN),
        };
        let mut d = alloc::vec![0u8; len];
        d[0] = kind;
        d[1] = if self.dc { 0x02 } else { 0 } | u8::from(self.cat);
        put_u16(&mut d, 2, (len - 4) as u16);
        put_u16(&mut d, 4, self.src);
        put_u16(&mut d, 6, self.dst);
        match self.length {
            SegmentLength::Blocks(n) => put_u16(&mut d, 10, n),
            SegmentLength::Bytes { count, src_offset, dst_offset } => {
                put_u32(&mut d, 8, count);
                put_u16(&mut d, 28, src_offset);
                put_u16(&mut d, 30, dst_offset);
            }
        }
        put_u64(&mut d, 12, self.src_lba);
        put_u64(&mut d, 20, self.dst_lba);
        out.extend_from_slice(&d);
    }
}

/// An EXTENDED COPY (LID1) parameter list.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ExtendedCopy {
    /// LIST IDENTIFIER.
    pub list_id: u8,
    /// STR (sequential striped: a hint).
    pub str: bool,
    /// LIST ID USAGE ([`list_id_usage`]).
    pub list_id_usage: u8,
    /// PRIORITY.
    pub priority: u8,
    /// The CSCD descriptors, by index.
    pub cscds: Vec<Cscd>,
    /// The segment descriptors, in order.
    pub segments: Vec<Segment>,
}

impl ExtendedCopy {
    /// Parse and check a parameter list (at least its 16-byte header; bytes beyond the lists
    /// are ignored). Order of the checks: the header, the lengths against the list and
    /// [`Limits::max_list_len`], then each descriptor in turn.
    pub fn parse(b: &[u8], limits: &Limits) -> Result<Self, CopyError> {
        if b.len() < HEADER_LEN {
            return Err(CopyError::Truncated);
        }
        let usage = (b[1] >> 3) & 3;
        if usage == 1 {
            return Err(CopyError::InvalidField(1, Some(3)));
        }
        let cscd_len = usize::from(u16_at(b, 2));
        let seg_len = u32_at(b, 8) as usize;
        let inline_len = u32_at(b, 12) as usize;
        let total = HEADER_LEN as u64 + cscd_len as u64 + seg_len as u64 + inline_len as u64;
        if total > b.len() as u64 {
            return Err(CopyError::Truncated);
        }
        if cscd_len as u64 + seg_len as u64 > u64::from(limits.max_list_len) {
            return Err(CopyError::ListTooLong);
        }
        if inline_len != 0 {
            // No segment type riser implements uses inline data (MAXIMUM INLINE DATA LENGTH 0).
            return Err(CopyError::InvalidField(12, None));
        }
        let mut cscds = Vec::new();
        let mut at = HEADER_LEN;
        let cscd_end = HEADER_LEN + cscd_len;
        while at < cscd_end {
            if cscds.len() >= usize::from(limits.max_cscds) {
                return Err(CopyError::TooManyCscds);
            }
            if b[at] != descriptor::IDENTIFICATION {
                return Err(CopyError::UnsupportedCscd(at));
            }
            if at + CSCD_LEN > cscd_end {
                return Err(CopyError::InvalidField(2, None));
            }
            cscds.push(Cscd::parse(&b[at..at + CSCD_LEN], at)?);
            at += CSCD_LEN;
        }
        let mut segments = Vec::new();
        let seg_end = cscd_end + seg_len;
        while at < seg_end {
            if segments.len() >= usize::from(limits.max_segments) {
                return Err(CopyError::TooManySegments);
            }
            let kind = b[at];
            let want = match kind {
                descriptor::BLOCK_TO_BLOCK => BLOCK_TO_BLOCK_LEN,
                descriptor::BLOCK_TO_BLOCK_OFFSET => BLOCK_TO_BLOCK_OFFSET_LEN,
                _ => return Err(CopyError::UnsupportedSegment(at)),
            };
            if at + 4 > seg_end || usize::from(u16_at(b, at + 2)) + 4 != want {
                return Err(CopyError::InvalidField(at + 2, None));
            }
            if at + want > seg_end {
                return Err(CopyError::InvalidField(8, None));
            }
            let d = &b[at..at + want];
            let length = if kind == descriptor::BLOCK_TO_BLOCK {
                SegmentLength::Blocks(u16_at(d, 10))
            } else {
                SegmentLength::Bytes { count: u32_at(d, 8), src_offset: u16_at(d, 28), dst_offset: u16_at(d, 30) }
            };
            if kind == descriptor::BLOCK_TO_BLOCK_OFFSET && d[1] & 0x02 != 0 {
                // DC is reserved in a 0x0A descriptor.
                return Err(CopyError::InvalidField(at + 1, Some(1)));
            }
            segments.push(Segment {
                at,
                dc: d[1] & 0x02 != 0,
                cat: d[1] & 0x01 != 0,
                src: u16_at(d, 4),
                dst: u16_at(d, 6),
                length,
                src_lba: u64_at(d, 12),
                dst_lba: u64_at(d, 20),
            });
            at += want;
        }
        Ok(Self { list_id: b[0], str: b[1] & 0x20 != 0, list_id_usage: usage, priority: b[1] & 7, cscds, segments })
    }

    /// Encode (segment `at` fields are not encoded: they follow from the order).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = alloc::vec![0u8; HEADER_LEN];
        b[0] = self.list_id;
        b[1] = if self.str { 0x20 } else { 0 } | ((self.list_id_usage & 3) << 3) | (self.priority & 7);
        for c in &self.cscds {
            c.emit(&mut b);
        }
        let cscd_len = b.len() - HEADER_LEN;
        for s in &self.segments {
            s.emit(&mut b);
        }
        let seg_len = b.len() - HEADER_LEN - cscd_len;
        put_u16(&mut b, 2, cscd_len as u16);
        put_u32(&mut b, 8, seg_len as u32);
        b
    }
}

/// RECEIVE COPY RESULTS, COPY STATUS data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CopyStatus {
    /// HDD: held data discarded.
    pub hdd: bool,
    /// Copy manager status ([`status`]).
    pub status: u8,
    /// SEGMENTS PROCESSED.
    pub segments_processed: u16,
    /// TRANSFER COUNT UNITS: 0 bytes, 0xF1 kibibytes, 0xF2 mebibytes…
    pub transfer_count_units: u8,
    /// TRANSFER COUNT.
    pub transfer_count: u32,
}

impl CopyStatus {
    /// Length of the data.
    pub const LEN: usize = 12;

    /// The transfer count of `bytes` moved, in bytes when it fits 32 bits, else in kibibytes.
    pub fn with_bytes(mut self, bytes: u64) -> Self {
        (self.transfer_count_units, self.transfer_count) = match u32::try_from(bytes) {
            Ok(b) => (0, b),
            Err(_) => (0xf1, u32::try_from(bytes >> 10).unwrap_or(u32::MAX)),
        };
        self
    }

    /// Encode.
    pub fn to_bytes(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        put_u32(&mut b, 0, (Self::LEN - 4) as u32);
        b[4] = if self.hdd { 0x80 } else { 0 } | (self.status & 0x7f);
        put_u16(&mut b, 5, self.segments_processed);
        b[7] = self.transfer_count_units;
        put_u32(&mut b, 8, self.transfer_count);
        b
    }

    /// Parse.
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        crate::be::need("COPY STATUS data", b, Self::LEN)?;
        Ok(Self {
            hdd: b[4] & 0x80 != 0,
            status: b[4] & 0x7f,
            segments_processed: u16_at(b, 5),
            transfer_count_units: b[7],
            transfer_count: u32_at(b, 8),
        })
    }
}

/// RECEIVE COPY RESULTS, OPERATING PARAMETERS data: the [`Limits`] and the rest a copy manager
/// reports.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OperatingParameters {
    /// SNLID: LIST ID USAGE 11b (no list identifier) is supported.
    pub snlid: bool,
    /// The descriptor limits.
    pub limits: Limits,
    /// TOTAL CONCURRENT COPIES (and MAXIMUM CONCURRENT COPIES, capped at 255).
    pub concurrent_copies: u16,
    /// DATA SEGMENT GRANULARITY (log2 of bytes).
    pub data_segment_granularity: u8,
    /// The implemented descriptor type codes.
    pub descriptor_types: Vec<u8>,
}

impl OperatingParameters {
    /// Encode.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = alloc::vec![0u8; 44];
        b[4] = u8::from(self.snlid);
        put_u16(&mut b, 8, self.limits.max_cscds);
        put_u16(&mut b, 10, self.limits.max_segments);
        put_u32(&mut b, 12, self.limits.max_list_len);
        put_u32(&mut b, 16, self.limits.max_segment_bytes);
        // Inline data, held data, stream devices: none.
        put_u16(&mut b, 34, self.concurrent_copies);
        b[36] = u8::try_from(self.concurrent_copies).unwrap_or(u8::MAX);
        b[37] = self.data_segment_granularity;
        let n = self.descriptor_types.len().min(255);
        b[43] = n as u8;
        b.extend_from_slice(&self.descriptor_types[..n]);
        let len = b.len() - 4;
        put_u32(&mut b, 0, len as u32);
        b
    }
}

/// The Third-party Copy VPD page body (LID1 only): the Supported Commands descriptor
/// (`commands`: each operation code with its service actions), the Parameter Data, Supported
/// Descriptors and General Copy Operations descriptors, from `p`.
pub fn third_party_copy_vpd(p: &OperatingParameters, commands: &[(u8, &[u8])]) -> Vec<u8> {
    fn descriptor(out: &mut Vec<u8>, kind: u16, body: &[u8]) {
        let padded = body.len().div_ceil(4) * 4;
        let mut d = alloc::vec![0u8; 4 + padded];
        put_u16(&mut d, 0, kind);
        put_u16(&mut d, 2, padded as u16);
        d[4..4 + body.len()].copy_from_slice(body);
        out.extend_from_slice(&d);
    }
    let mut out = Vec::new();
    // Supported Commands (0x0001).
    let mut list = Vec::new();
    for (opcode, sas) in commands {
        list.push(*opcode);
        list.push(sas.len() as u8);
        list.extend_from_slice(sas);
    }
    let mut body = alloc::vec![list.len().min(255) as u8];
    body.extend_from_slice(&list);
    descriptor(&mut out, 0x0001, &body);
    // Parameter Data (0x0004).
    let mut body = [0u8; 28];
    put_u16(&mut body, 4, p.limits.max_cscds);
    put_u16(&mut body, 6, p.limits.max_segments);
    put_u32(&mut body, 8, p.limits.max_list_len);
    descriptor(&mut out, 0x0004, &body);
    // Supported Descriptors (0x0108).
    let n = p.descriptor_types.len().min(255);
    let mut body = alloc::vec![n as u8];
    body.extend_from_slice(&p.descriptor_types[..n]);
    descriptor(&mut out, 0x0108, &body);
    // General Copy Operations (0x8001).
    let mut body = [0u8; 32];
    put_u32(&mut body, 0, u32::from(p.concurrent_copies));
    put_u32(&mut body, 4, u32::from(p.concurrent_copies));
    put_u32(&mut body, 8, p.limits.max_segment_bytes);
    body[12] = p.data_segment_granularity;
    descriptor(&mut out, 0x8001, &body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits { max_cscds: 4, max_segments: 8, max_list_len: 1024, max_segment_bytes: 1 << 20 };

    fn list() -> ExtendedCopy {
        ExtendedCopy {
            list_id: 7,
            list_id_usage: list_id_usage::DISCARD,
            priority: 1,
            cscds: alloc::vec![Cscd::block(Designator::naa_locally_assigned(0x1234), 512)],
            segments: alloc::vec![
                Segment::blocks(0, 0, 16, 0, 100),
                Segment { length: SegmentLength::Bytes { count: 4096, src_offset: 0, dst_offset: 0 }, ..Segment::blocks(0, 0, 0, 8, 200) },
            ],
            ..ExtendedCopy::default()
        }
    }

    #[test]
    fn round_trip() {
        let l = list();
        let b = l.to_bytes();
        assert_eq!(b.len(), HEADER_LEN + CSCD_LEN + BLOCK_TO_BLOCK_LEN + BLOCK_TO_BLOCK_OFFSET_LEN);
        let p = ExtendedCopy::parse(&b, &LIMITS).unwrap();
        assert_eq!(p.segments[0].at, HEADER_LEN + CSCD_LEN);
        assert_eq!(p.segments[1].at, HEADER_LEN + CSCD_LEN + BLOCK_TO_BLOCK_LEN);
        let mut q = p.clone();
        q.segments.iter_mut().for_each(|s| s.at = 0);
        assert_eq!(q, l);
        assert_eq!(p.cscds[0].designator.value.len(), 8);
        // Trailing bytes beyond the lists are ignored.
        let mut longer = b.clone();
        longer.extend_from_slice(&[0xff; 9]);
        assert_eq!(ExtendedCopy::parse(&longer, &LIMITS).unwrap(), p);
    }

    #[test]
    fn every_truncation_is_a_length_error() {
        let b = list().to_bytes();
        for n in 0..b.len() {
            assert_eq!(ExtendedCopy::parse(&b[..n], &LIMITS), Err(CopyError::Truncated), "{n} bytes");
        }
        let s = CopyError::Truncated.sense();
        assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::PARAMETER_LIST_LENGTH_ERROR));
    }

    #[test]
    fn limits_are_enforced() {
        let mut l = list();
        l.cscds = alloc::vec![l.cscds[0].clone(); 5];
        assert_eq!(ExtendedCopy::parse(&l.to_bytes(), &LIMITS), Err(CopyError::TooManyCscds));
        let mut l = list();
        l.segments = alloc::vec![l.segments[0]; 9];
        assert_eq!(ExtendedCopy::parse(&l.to_bytes(), &LIMITS), Err(CopyError::TooManySegments));
        let small = Limits { max_list_len: 32 + 28 + 31, ..LIMITS };
        assert_eq!(ExtendedCopy::parse(&list().to_bytes(), &small), Err(CopyError::ListTooLong));
        let s = CopyError::TooManyCscds.sense();
        assert_eq!(s.asc, AscAscq::TOO_MANY_TARGET_DESCRIPTORS);
        assert_eq!(CopyError::TooManySegments.sense().asc, AscAscq::TOO_MANY_SEGMENT_DESCRIPTORS);
    }

    #[test]
    fn bad_descriptors_are_refused_with_a_pointer() {
        let good = list().to_bytes();
        let mut b = good.clone();
        b[HEADER_LEN] = 0xe0;
        assert_eq!(ExtendedCopy::parse(&b, &LIMITS), Err(CopyError::UnsupportedCscd(HEADER_LEN)));
        let s = CopyError::UnsupportedCscd(HEADER_LEN).sense();
        assert_eq!(s.asc, AscAscq::UNSUPPORTED_TARGET_DESCRIPTOR_TYPE_CODE);
        assert_eq!(s.field_pointer().unwrap().byte, HEADER_LEN as u16);
        let seg = HEADER_LEN + CSCD_LEN;
        let mut b = good.clone();
        b[seg] = 0x03;
        assert_eq!(ExtendedCopy::parse(&b, &LIMITS), Err(CopyError::UnsupportedSegment(seg)));
        assert_eq!(CopyError::UnsupportedSegment(seg).sense().asc, AscAscq::UNSUPPORTED_SEGMENT_DESCRIPTOR_TYPE_CODE);
        // A wrong descriptor length, a designator longer than 20 bytes, LIST ID USAGE 01b,
        // inline data, a CSCD list that is not whole descriptors.
        let mut b = good.clone();
        b[seg + 3] = 0x19;
        assert_eq!(ExtendedCopy::parse(&b, &LIMITS), Err(CopyError::InvalidField(seg + 2, None)));
        let mut b = good.clone();
        b[HEADER_LEN + 7] = 21;
        assert_eq!(ExtendedCopy::parse(&b, &LIMITS), Err(CopyError::InvalidField(HEADER_LEN + 7, None)));
        let mut b = good.clone();
        b[1] = 1 << 3;
        assert_eq!(ExtendedCopy::parse(&b, &LIMITS), Err(CopyError::InvalidField(1, Some(3))));
        let mut b = good.clone();
        b[15] = 1;
        b.push(0);
        assert_eq!(ExtendedCopy::parse(&b, &LIMITS), Err(CopyError::InvalidField(12, None)));
        let mut b = good.clone();
        b[3] = CSCD_LEN as u8 + 4;
        put_u32(&mut b, 8, (BLOCK_TO_BLOCK_LEN + BLOCK_TO_BLOCK_OFFSET_LEN - 4) as u32);
        assert_eq!(ExtendedCopy::parse(&b, &LIMITS), Err(CopyError::UnsupportedCscd(HEADER_LEN + CSCD_LEN)));
    }

    #[test]
    fn parsing_is_total() {
        // Every one-byte corruption of a valid list, and every prefix of those: an answer.
        let good = list().to_bytes();
        for i in 0..good.len() {
            for v in [0x00, 0x01, 0x02, 0x0a, 0x1f, 0x80, 0xe4, 0xff] {
                let mut b = good.clone();
                b[i] = v;
                for n in [b.len(), b.len() - 1, i] {
                    let _ = ExtendedCopy::parse(&b[..n], &LIMITS);
                }
            }
        }
    }

    #[test]
    fn results_data() {
        let s = CopyStatus { status: status::COMPLETED, segments_processed: 2, ..Default::default() }.with_bytes(8192);
        let b = s.to_bytes();
        assert_eq!(&b[..4], &[0, 0, 0, 8]);
        assert_eq!(CopyStatus::parse(&b).unwrap(), s);
        assert_eq!(CopyStatus::default().with_bytes(1 << 40).transfer_count, 1 << 30);
        let p = OperatingParameters {
            snlid: true,
            limits: LIMITS,
            concurrent_copies: 300,
            data_segment_granularity: 9,
            descriptor_types: alloc::vec![0x02, 0x0a, 0xe4],
        };
        let b = p.to_bytes();
        assert_eq!(b.len(), 47);
        assert_eq!(u32_at(&b, 0), 43);
        assert_eq!((u16_at(&b, 8), u16_at(&b, 10), u32_at(&b, 12), u32_at(&b, 16)), (4, 8, 1024, 1 << 20));
        assert_eq!((b[36], b[37], b[43], b[46]), (255, 9, 3, 0xe4));
        let v = third_party_copy_vpd(&p, &[(0x83, &[0]), (0x84, &[0, 3])]);
        // Supported Commands first: type 1, padded to 4, list length 7.
        assert_eq!(&v[..5], &[0, 1, 0, 8, 7]);
        assert_eq!(&v[5..12], &[0x83, 1, 0, 0x84, 2, 0, 3]);
        let mut at = 0;
        let mut kinds = Vec::new();
        while at < v.len() {
            kinds.push(u16_at(&v, at));
            let len = usize::from(u16_at(&v, at + 2));
            assert_eq!(len % 4, 0);
            at += 4 + len;
        }
        assert_eq!((at, kinds), (v.len(), alloc::vec![0x0001, 0x0004, 0x0108, 0x8001]));
    }
}
