//! The [`Header`] enum over the per-opcode header values (dispatching parse and emit by opcode to
//! the PDU family files), the [`Pdu`] container and its [`PduLayout`], and the newtypes more
//! than one PDU shares.

use super::bhs::{BHS_LEN, Bhs, pad4};
use super::{
    AhsIter, AsyncMessage, DataIn, DataOut, DecodeError, LoginRequest, LoginResponse, LogoutRequest, LogoutResponse, MAX_DATA_SEGMENT_LEN,
    NopIn, NopOut, Opcode, R2t, Reject, ScsiCommand, ScsiResponse, Snack, TaskMgmtRequest, TaskMgmtResponse, TextRequest, TextResponse,
};
use alloc::vec::Vec;
use bytes::Bytes;
use core::fmt;

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

impl Header {
    /// Parse the opcode-specific fields of a checked BHS (an unchecked view over fewer than 48
    /// bytes is [`DecodeError::Truncated`]).
    pub fn parse<T: AsRef<[u8]>>(h: &Bhs<T>) -> Result<Self, DecodeError> {
        Self::parse_array(&Bhs::new_unchecked(h.array()?))
    }

    /// The dispatch by opcode, over a fixed-size array whatever the buffer type: the families'
    /// constant field offsets then need no bounds checks.
    #[inline]
    fn parse_array(h: &Bhs<&[u8; BHS_LEN]>) -> Result<Self, DecodeError> {
        Ok(match h.opcode() {
            Opcode::NOP_OUT => Self::NopOut(NopOut::parse(h)?),
            Opcode::SCSI_COMMAND => Self::ScsiCommand(ScsiCommand::parse(h)?),
            Opcode::TASK_MGMT_REQUEST => Self::TaskMgmtRequest(TaskMgmtRequest::parse(h)?),
            Opcode::LOGIN_REQUEST => Self::LoginRequest(LoginRequest::parse(h)?),
            Opcode::TEXT_REQUEST => Self::TextRequest(TextRequest::parse(h)?),
            Opcode::DATA_OUT => Self::DataOut(DataOut::parse(h)?),
            Opcode::LOGOUT_REQUEST => Self::LogoutRequest(LogoutRequest::parse(h)?),
            Opcode::SNACK => Self::Snack(Snack::parse(h)?),
            Opcode::NOP_IN => Self::NopIn(NopIn::parse(h)?),
            Opcode::SCSI_RESPONSE => Self::ScsiResponse(ScsiResponse::parse(h)?),
            Opcode::TASK_MGMT_RESPONSE => Self::TaskMgmtResponse(TaskMgmtResponse::parse(h)?),
            Opcode::LOGIN_RESPONSE => Self::LoginResponse(LoginResponse::parse(h)?),
            Opcode::TEXT_RESPONSE => Self::TextResponse(TextResponse::parse(h)?),
            Opcode::DATA_IN => Self::DataIn(DataIn::parse(h)?),
            Opcode::LOGOUT_RESPONSE => Self::LogoutResponse(LogoutResponse::parse(h)?),
            Opcode::R2T => Self::R2t(R2t::parse(h)?),
            Opcode::ASYNC_MESSAGE => Self::AsyncMessage(AsyncMessage::parse(h)?),
            Opcode::REJECT => Self::Reject(Reject::parse(h)?),
            _ => {
                let mut raw = [0u8; BHS_LEN];
                raw.copy_from_slice(h.bytes());
                // The lengths belong to the PDU, not the header value.
                let mut r = Bhs::new_unchecked(&mut raw[..]);
                r.set_total_ahs_len(0);
                r.set_data_segment_len(0);
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
            Self::Unknown(raw) => Bhs::new_unchecked(&raw[..]).opcode(),
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
            Self::Unknown(raw) => Bhs::new_unchecked(&raw[..]).itt(),
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
        let mut h = Bhs::new_unchecked(out);
        match self {
            Self::NopOut(p) => p.emit(&mut h),
            Self::ScsiCommand(p) => p.emit(&mut h),
            Self::TaskMgmtRequest(p) => p.emit(&mut h),
            Self::LoginRequest(p) => p.emit(&mut h),
            Self::TextRequest(p) => p.emit(&mut h),
            Self::DataOut(p) => p.emit(&mut h),
            Self::LogoutRequest(p) => p.emit(&mut h),
            Self::Snack(p) => p.emit(&mut h),
            Self::NopIn(p) => p.emit(&mut h),
            Self::ScsiResponse(p) => p.emit(&mut h),
            Self::TaskMgmtResponse(p) => p.emit(&mut h),
            Self::LoginResponse(p) => p.emit(&mut h),
            Self::TextResponse(p) => p.emit(&mut h),
            Self::DataIn(p) => p.emit(&mut h),
            Self::LogoutResponse(p) => p.emit(&mut h),
            Self::R2t(p) => p.emit(&mut h),
            Self::AsyncMessage(p) => p.emit(&mut h),
            Self::Reject(p) => p.emit(&mut h),
            Self::Unknown(_) => {}
        }
        h.set_total_ahs_len(ahs_len);
        h.set_data_segment_len(dsl);
    }
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

    /// The complete CDB of a SCSI Command ([`ScsiCommand::full_cdb`](super::ScsiCommand::full_cdb)).
    pub fn full_cdb(&self) -> Option<Vec<u8>> {
        let Header::ScsiCommand(c) = &self.header else {
            return None;
        };
        Some(c.full_cdb(self.ahs.as_ref()))
    }
}

/// What the per-family byte-array tests share.
#[cfg(test)]
pub(super) mod testing {
    use super::super::{BHS_LEN, Bhs, DecodeError, Header, Pdu};

    /// `bytes` parses through [`Header::parse`] to `expect`, [`Header::emit`] (with the
    /// lengths `bytes` holds) gives `bytes` back, and one byte fewer is a truncated PDU.
    pub(crate) fn check(bytes: &[u8; BHS_LEN], expect: Header) {
        let bhs = Bhs::new_checked(&bytes[..]).unwrap();
        let h = Header::parse(&bhs).unwrap();
        assert_eq!(h, expect);
        let mut out = [0u8; BHS_LEN];
        h.emit(&mut out, bhs.total_ahs_len(), bhs.data_segment_len());
        assert_eq!(out, *bytes);
        assert_eq!(Pdu::parse(&bytes[..BHS_LEN - 1]), Err(DecodeError::Truncated { need: BHS_LEN, have: BHS_LEN - 1 }));
    }

    /// The checked view over a test vector.
    pub(crate) fn view(bytes: &[u8; BHS_LEN]) -> Bhs<&[u8]> {
        Bhs::new_checked(&bytes[..]).unwrap()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[rustfmt::skip]
    const VENDOR: [u8; BHS_LEN] = [
        0x5c, 0x81, 0x02, 0x03, // vendor opcode 0x1c with I; flags and bytes 2-3 kept as sent
        0x00, 0x00, 0x00, 0x00, // TotalAHSLength, DataSegmentLength: zero in the header value
        0x10, 0x11, 0x12, 0x13,
        0x14, 0x15, 0x16, 0x17,
        0x0a, 0x0b, 0x0c, 0x0d, // ITT
        0x20, 0x21, 0x22, 0x23,
        0x24, 0x25, 0x26, 0x27,
        0x28, 0x29, 0x2a, 0x2b,
        0x2c, 0x2d, 0x2e, 0x2f,
        0x30, 0x31, 0x32, 0x33,
        0x34, 0x35, 0x36, 0x37,
        0x38, 0x39, 0x3a, 0x3b,
    ];

    #[test]
    fn unknown_opcode_kept_whole() {
        let mut sent = VENDOR;
        let mut view = Bhs::new_unchecked(&mut sent[..]);
        view.set_total_ahs_len(4);
        view.set_data_segment_len(8);
        let h = Header::parse(&Bhs::new_checked(&sent[..]).unwrap()).unwrap();
        assert_eq!(h, Header::Unknown(VENDOR));
        assert_eq!((h.opcode(), h.itt()), (Opcode(0x1c), 0x0a0b_0c0d));
        let mut out = [0u8; BHS_LEN];
        h.emit(&mut out, 4, 8);
        assert_eq!(out, sent);
    }

    #[test]
    fn unchecked_short_view_is_truncated() {
        let short = [0u8; 40];
        assert_eq!(Header::parse(&Bhs::new_unchecked(&short[..])), Err(DecodeError::Truncated { need: BHS_LEN, have: 40 }));
    }

    #[test]
    fn reactions() {
        use super::super::{Reaction, RejectReason};
        assert_eq!(DecodeError::InvalidField("x").reaction(), Reaction::Reject(RejectReason::INVALID_PDU_FIELD));
        assert_eq!(DecodeError::DataSegmentTooLong { len: 9000, max: 8192 }.reaction(), Reaction::DropConnection);
    }

    #[test]
    fn layout_and_padding() {
        let nop = Pdu::new(Header::NopOut(NopOut { itt: 1, ..NopOut::default() }), &[][..], &b"abcde"[..]);
        let mut bytes = Vec::new();
        nop.encode(&mut bytes);
        assert_eq!(bytes.len(), nop.encoded_len());
        assert_eq!(bytes.len(), BHS_LEN + 8);
        let layout = PduLayout::of(&Bhs::new_checked(&bytes[..]).unwrap(), 8192).unwrap();
        assert_eq!((layout.data_offset(), layout.padded_len()), (BHS_LEN, BHS_LEN + 8));
        assert_eq!(Pdu::parse_limited(&bytes[..BHS_LEN + 5], 8192, false).unwrap(), (nop.clone(), BHS_LEN + 5));
        assert!(Pdu::parse(&bytes[..BHS_LEN + 5]).is_err());
        assert_eq!(PduLayout::of(&Bhs::new_checked(&bytes[..]).unwrap(), 4), Err(DecodeError::DataSegmentTooLong { len: 5, max: 4 }));
    }
}
