//! iWARP wire formats: MPA request/reply frames and FPDUs (RFC 5044, RFC 6581), DDP segment
//! headers (RFC 5041) and RDMAP messages (RFC 5040), byte-exact with Linux siw.
//!
//! Offsets in this module count from the first byte after the 2-byte MPA length field (the
//! "ULPDU"), unless a function says otherwise.

/// Key of an MPA Request frame.
pub const MPA_REQ_KEY: &[u8; 16] = b"MPA ID Req Frame";
/// Key of an MPA Reply frame.
pub const MPA_REP_KEY: &[u8; 16] = b"MPA ID Rep Frame";
/// Markers requested (never supported).
pub const MPA_FLAG_MARKERS: u8 = 0x80;
/// CRC requested.
pub const MPA_FLAG_CRC: u8 = 0x40;
/// Reject (replies only).
pub const MPA_FLAG_REJECT: u8 = 0x20;
/// RFC 6581 enhanced setup: a 4-byte IRD/ORD block leads the private data.
pub const MPA_FLAG_ENHANCED: u8 = 0x10;
/// Most private data (IRD/ORD block included) an MPA frame may carry toward Linux siw.
pub const MPA_MAX_PRIVATE_DATA: usize = 256;
/// Length of the fixed MPA frame header.
pub const MPA_HEADER_LEN: usize = 20;

/// Errors in bytes from the wire; each maps to the Terminate RFC 5040 asks for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Not an MPA frame of the expected kind.
    #[error("bad MPA frame key")]
    BadKey,
    /// MPA revision above 2.
    #[error("unsupported MPA revision {0}")]
    BadRevision(u8),
    /// Private data longer than allowed.
    #[error("MPA private data of {0} bytes (at most 256)")]
    PrivateDataTooLong(usize),
    /// Enhanced flag without room for the IRD/ORD block.
    #[error("enhanced MPA frame without its IRD/ORD block")]
    MissingIrdOrd,
    /// A frame shorter than its header says.
    #[error("truncated: need {need} bytes, have {have}")]
    Truncated {
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        have: usize,
    },
    /// A DDP/RDMAP header that breaks the rules (the Terminate to send is attached).
    #[error("protocol violation: {1}")]
    Violation(Term, &'static str),
}

/// The RFC 6581 IRD/ORD block.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IrdOrd {
    /// Inbound RDMA Read queue depth of the sender (14 bits).
    pub ird: u16,
    /// Outbound RDMA Read queue depth of the sender (14 bits).
    pub ord: u16,
    /// Peer-to-peer mode: a ready-to-receive message follows the reply.
    pub p2p: bool,
    /// Zero-length RDMA Write as the ready-to-receive message.
    pub write_rtr: bool,
    /// Zero-length RDMA Read as the ready-to-receive message.
    pub read_rtr: bool,
}

impl IrdOrd {
    fn parse(b: &[u8]) -> Self {
        let a = u16::from_be_bytes([b[0], b[1]]);
        let c = u16::from_be_bytes([b[2], b[3]]);
        Self { ird: a & 0x3fff, ord: c & 0x3fff, p2p: a & 0x8000 != 0, write_rtr: c & 0x8000 != 0, read_rtr: c & 0x4000 != 0 }
    }
    fn emit(&self) -> [u8; 4] {
        let a = (self.ird & 0x3fff) | if self.p2p { 0x8000 } else { 0 };
        let c = (self.ord & 0x3fff) | if self.write_rtr { 0x8000 } else { 0 } | if self.read_rtr { 0x4000 } else { 0 };
        let [a0, a1] = a.to_be_bytes();
        let [c0, c1] = c.to_be_bytes();
        [a0, a1, c0, c1]
    }
}

/// An MPA Request or Reply frame.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MpaFrame {
    /// Reply (true) or request.
    pub reply: bool,
    /// Flag byte (`MPA_FLAG_*`; other bits are kept so a reply can echo them).
    pub flags: u8,
    /// Revision (1 or 2).
    pub rev: u8,
    /// The IRD/ORD block (enhanced frames).
    pub ird_ord: Option<IrdOrd>,
    /// Consumer private data (after the IRD/ORD block).
    pub private_data: Vec<u8>,
}

impl MpaFrame {
    /// Parse the 20-byte header: (reply, flags, revision, private data length).
    pub fn parse_header(h: &[u8; MPA_HEADER_LEN]) -> Result<(bool, u8, u8, usize), WireError> {
        let reply = match &h[..16] {
            k if k == MPA_REQ_KEY => false,
            k if k == MPA_REP_KEY => true,
            _ => return Err(WireError::BadKey),
        };
        let rev = h[17];
        if rev > 2 {
            return Err(WireError::BadRevision(rev));
        }
        let pd_len = usize::from(u16::from_be_bytes([h[18], h[19]]));
        if pd_len > MPA_MAX_PRIVATE_DATA {
            return Err(WireError::PrivateDataTooLong(pd_len));
        }
        Ok((reply, h[16], rev, pd_len))
    }

    /// Parse a whole frame.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let h: &[u8; MPA_HEADER_LEN] =
            b.get(..MPA_HEADER_LEN).and_then(|h| h.try_into().ok()).ok_or(WireError::Truncated { need: MPA_HEADER_LEN, have: b.len() })?;
        let (reply, flags, rev, pd_len) = Self::parse_header(h)?;
        let pd =
            b.get(MPA_HEADER_LEN..MPA_HEADER_LEN + pd_len).ok_or(WireError::Truncated { need: MPA_HEADER_LEN + pd_len, have: b.len() })?;
        Self::with_private_data(reply, flags, rev, pd)
    }

    /// Build from a parsed header and its private data.
    pub fn with_private_data(reply: bool, flags: u8, rev: u8, pd: &[u8]) -> Result<Self, WireError> {
        if rev == 2 && flags & MPA_FLAG_ENHANCED != 0 {
            if pd.len() < 4 {
                return Err(WireError::MissingIrdOrd);
            }
            Ok(Self { reply, flags, rev, ird_ord: Some(IrdOrd::parse(pd)), private_data: pd[4..].to_vec() })
        } else {
            Ok(Self { reply, flags, rev, ird_ord: None, private_data: pd.to_vec() })
        }
    }

    /// The frame's bytes.
    pub fn emit(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(MPA_HEADER_LEN + 4 + self.private_data.len());
        v.extend_from_slice(if self.reply { MPA_REP_KEY } else { MPA_REQ_KEY });
        let flags = if self.ird_ord.is_some() { self.flags | MPA_FLAG_ENHANCED } else { self.flags & !MPA_FLAG_ENHANCED };
        v.push(flags);
        v.push(self.rev);
        let pd_len = self.private_data.len() + if self.ird_ord.is_some() { 4 } else { 0 };
        v.extend_from_slice(&(pd_len as u16).to_be_bytes());
        if let Some(io) = &self.ird_ord {
            v.extend_from_slice(&io.emit());
        }
        v.extend_from_slice(&self.private_data);
        v
    }

    /// CRC requested.
    pub fn crc(&self) -> bool {
        self.flags & MPA_FLAG_CRC != 0
    }
    /// Markers requested.
    pub fn markers(&self) -> bool {
        self.flags & MPA_FLAG_MARKERS != 0
    }
    /// Reject (reply).
    pub fn rejected(&self) -> bool {
        self.flags & MPA_FLAG_REJECT != 0
    }
}

/// Pad bytes after a ULPDU of `mpa_len` bytes so the FPDU ends 4-aligned.
pub fn fpdu_pad(mpa_len: usize) -> usize {
    (4 - (mpa_len + 2) % 4) % 4
}

/// CRC32C of an FPDU's bytes (length field through pad), as the 4 wire bytes.
pub fn fpdu_crc(parts: &[&[u8]]) -> [u8; 4] {
    let crc = parts.iter().fold(0u32, |c, p| crc32c::crc32c_append(c, p));
    crc.to_le_bytes()
}

/// RDMAP opcodes (RFC 5040 §4.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Opcode {
    /// RDMA Write (tagged).
    Write = 0,
    /// RDMA Read Request (untagged, queue 1).
    ReadRequest = 1,
    /// RDMA Read Response (tagged).
    ReadResponse = 2,
    /// Send (queue 0).
    Send = 3,
    /// Send with Invalidate.
    SendInvalidate = 4,
    /// Send with Solicited Event.
    SendSe = 5,
    /// Send with Solicited Event and Invalidate.
    SendSeInvalidate = 6,
    /// Terminate (queue 2).
    Terminate = 7,
}

impl Opcode {
    /// From the 4-bit field.
    pub fn from_u8(v: u8) -> Option<Self> {
        Some(match v {
            0 => Self::Write,
            1 => Self::ReadRequest,
            2 => Self::ReadResponse,
            3 => Self::Send,
            4 => Self::SendInvalidate,
            5 => Self::SendSe,
            6 => Self::SendSeInvalidate,
            7 => Self::Terminate,
            _ => return None,
        })
    }
    /// Whether this opcode rides in tagged DDP segments.
    pub fn tagged(self) -> bool {
        matches!(self, Self::Write | Self::ReadResponse)
    }
    /// Whether this is one of the Send variants.
    pub fn is_send(self) -> bool {
        matches!(self, Self::Send | Self::SendInvalidate | Self::SendSe | Self::SendSeInvalidate)
    }
    /// Header bytes after the MPA length field.
    pub fn header_len(self) -> usize {
        match self {
            Self::Write | Self::ReadResponse => TAGGED_HDR,
            Self::ReadRequest => UNTAGGED_HDR + READ_REQUEST_LEN,
            Self::Terminate => UNTAGGED_HDR + 4,
            _ => UNTAGGED_HDR,
        }
    }
}

/// Tagged DDP header length after the MPA length field (control, STag, TO).
pub const TAGGED_HDR: usize = 14;
/// Untagged DDP header length after the MPA length field (control, reserved/inv STag, QN, MSN, MO).
pub const UNTAGGED_HDR: usize = 18;
/// Read Request body after the untagged header (sink STag, sink TO, size, source STag, source
/// TO): the whole FPDU header is 48 bytes, MPA length 46 (Linux's `struct iwarp_rdma_rreq`).
pub const READ_REQUEST_LEN: usize = 28;
/// Queue number of Sends.
pub const QN_SEND: u32 = 0;
/// Queue number of Read Requests.
pub const QN_READ: u32 = 1;
/// Queue number of Terminates.
pub const QN_TERMINATE: u32 = 2;

/// A decoded DDP segment header with its RDMAP opcode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Header {
    /// Tagged: RDMA Write or Read Response.
    Tagged {
        /// Opcode.
        op: Opcode,
        /// Last segment of the message.
        last: bool,
        /// Sink STag.
        stag: u32,
        /// Tagged offset of this segment's first byte.
        to: u64,
    },
    /// Untagged: Sends, Read Request, Terminate.
    Untagged {
        /// Opcode.
        op: Opcode,
        /// Last segment of the message.
        last: bool,
        /// Invalidate STag (Send with Invalidate), else 0.
        inv_stag: u32,
        /// Queue number.
        qn: u32,
        /// Message sequence number.
        msn: u32,
        /// Message offset of this segment's first byte.
        mo: u32,
    },
}

const DDP_TAGGED: u16 = 0x8000;
const DDP_LAST: u16 = 0x4000;
const DDP_V1: u16 = 0x0100;
const RDMAP_V1: u16 = 0x0040;

impl Header {
    /// The RDMAP opcode.
    pub fn op(&self) -> Opcode {
        match *self {
            Self::Tagged { op, .. } | Self::Untagged { op, .. } => op,
        }
    }
    /// Last segment flag.
    pub fn last(&self) -> bool {
        match *self {
            Self::Tagged { last, .. } | Self::Untagged { last, .. } => last,
        }
    }

    /// Decode the control field and the DDP header from the first bytes of a ULPDU (at least
    /// [`TAGGED_HDR`] or [`UNTAGGED_HDR`] bytes as the tagged bit says). Checks versions and
    /// opcode; the Terminate for a violation is in the error.
    pub fn parse(u: &[u8]) -> Result<Self, WireError> {
        if u.len() < 2 {
            return Err(WireError::Truncated { need: 2, have: u.len() });
        }
        let ctrl = u16::from_be_bytes([u[0], u[1]]);
        let tagged = ctrl & DDP_TAGGED != 0;
        let need = if tagged { TAGGED_HDR } else { UNTAGGED_HDR };
        if u.len() < need {
            return Err(WireError::Truncated { need, have: u.len() });
        }
        if ctrl & 0x0300 != DDP_V1 {
            let t = if tagged { Term::DDP_TAGGED_BAD_VERSION } else { Term::DDP_UNTAGGED_BAD_VERSION };
            return Err(WireError::Violation(t, "DDP version is not 1"));
        }
        if ctrl & 0x00c0 != RDMAP_V1 {
            return Err(WireError::Violation(Term::RDMAP_BAD_VERSION, "RDMAP version is not 1"));
        }
        let op = Opcode::from_u8((ctrl & 0x0f) as u8).ok_or(WireError::Violation(Term::RDMAP_BAD_OPCODE, "unknown RDMAP opcode"))?;
        if op.tagged() != tagged {
            let t = if tagged { Term::DDP_TAGGED_INVALID_STAG } else { Term::DDP_UNTAGGED_INVALID_QN };
            return Err(WireError::Violation(t, "opcode and DDP tagged flag disagree"));
        }
        let last = ctrl & DDP_LAST != 0;
        // One bounds check per field (the length was checked above).
        let be32 = |o: usize| u[o..o + 4].try_into().map_or(0, u32::from_be_bytes);
        Ok(if tagged {
            Self::Tagged { op, last, stag: be32(2), to: (u64::from(be32(6)) << 32) | u64::from(be32(10)) }
        } else {
            Self::Untagged { op, last, inv_stag: be32(2), qn: be32(6), msn: be32(10), mo: be32(14) }
        })
    }

    /// Encode (after the MPA length field) into `out`, returning the bytes written.
    pub fn emit(&self, out: &mut [u8]) -> usize {
        let ctrl = |op: Opcode, tagged: bool, last: bool| {
            (if tagged { DDP_TAGGED } else { 0 } | if last { DDP_LAST } else { 0 } | DDP_V1 | RDMAP_V1 | op as u16).to_be_bytes()
        };
        match *self {
            Self::Tagged { op, last, stag, to } => {
                out[0..2].copy_from_slice(&ctrl(op, true, last));
                out[2..6].copy_from_slice(&stag.to_be_bytes());
                out[6..14].copy_from_slice(&to.to_be_bytes());
                TAGGED_HDR
            }
            Self::Untagged { op, last, inv_stag, qn, msn, mo } => {
                out[0..2].copy_from_slice(&ctrl(op, false, last));
                out[2..6].copy_from_slice(&inv_stag.to_be_bytes());
                out[6..10].copy_from_slice(&qn.to_be_bytes());
                out[10..14].copy_from_slice(&msn.to_be_bytes());
                out[14..18].copy_from_slice(&mo.to_be_bytes());
                UNTAGGED_HDR
            }
        }
    }
}

/// The body of an RDMA Read Request (after its untagged header).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReadRequest {
    /// STag the responses are tagged with (the requester's sink).
    pub sink_stag: u32,
    /// Tagged offset of the sink.
    pub sink_to: u64,
    /// Bytes to read.
    pub size: u32,
    /// STag of the source at the responder.
    pub src_stag: u32,
    /// Tagged offset of the source.
    pub src_to: u64,
}

impl ReadRequest {
    /// Parse the 28 bytes after the untagged header.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < READ_REQUEST_LEN {
            return Err(WireError::Truncated { need: READ_REQUEST_LEN, have: b.len() });
        }
        let be32 = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let be64 = |o: usize| (u64::from(be32(o)) << 32) | u64::from(be32(o + 4));
        Ok(Self { sink_stag: be32(0), sink_to: be64(4), size: be32(12), src_stag: be32(16), src_to: be64(20) })
    }
    /// Encode the 28 bytes.
    pub fn emit(&self) -> [u8; READ_REQUEST_LEN] {
        let mut b = [0u8; READ_REQUEST_LEN];
        b[0..4].copy_from_slice(&self.sink_stag.to_be_bytes());
        b[4..12].copy_from_slice(&self.sink_to.to_be_bytes());
        b[12..16].copy_from_slice(&self.size.to_be_bytes());
        b[16..20].copy_from_slice(&self.src_stag.to_be_bytes());
        b[20..28].copy_from_slice(&self.src_to.to_be_bytes());
        b
    }
}

/// A Terminate's layer, error type and error code (RFC 5040 §7, RFC 5041 §7, RFC 5044 §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Term {
    /// 0 RDMAP, 1 DDP, 2 LLP (MPA).
    pub layer: u8,
    /// Error type within the layer.
    pub etype: u8,
    /// Error code.
    pub code: u8,
}

impl Term {
    /// RDMAP local catastrophic error.
    pub const RDMAP_CATASTROPHIC: Self = Self { layer: 0, etype: 0, code: 0xff };
    /// RDMAP remote protection: invalid STag (Read source).
    pub const RDMAP_INVALID_STAG: Self = Self { layer: 0, etype: 1, code: 0 };
    /// RDMAP remote protection: base or bounds violation (Read source).
    pub const RDMAP_BOUNDS: Self = Self { layer: 0, etype: 1, code: 1 };
    /// RDMAP remote protection: access rights violation (no REMOTE_READ).
    pub const RDMAP_ACCESS: Self = Self { layer: 0, etype: 1, code: 2 };
    /// RDMAP remote protection: STag not associated with this stream (other PD).
    pub const RDMAP_PD: Self = Self { layer: 0, etype: 1, code: 3 };
    /// RDMAP remote operation: invalid RDMAP version.
    pub const RDMAP_BAD_VERSION: Self = Self { layer: 0, etype: 2, code: 5 };
    /// RDMAP remote operation: unexpected opcode.
    pub const RDMAP_BAD_OPCODE: Self = Self { layer: 0, etype: 2, code: 6 };
    /// RDMAP remote operation: catastrophic error localised to the stream (IRD exceeded).
    pub const RDMAP_IRD_EXCEEDED: Self = Self { layer: 0, etype: 2, code: 7 };
    /// RDMAP remote operation: cannot invalidate the STag of a Send with Invalidate.
    pub const RDMAP_CANNOT_INVALIDATE: Self = Self { layer: 0, etype: 2, code: 9 };
    /// DDP local catastrophic error.
    pub const DDP_CATASTROPHIC: Self = Self { layer: 1, etype: 0, code: 0 };
    /// DDP tagged buffer: invalid STag (unknown, stale key, invalidated, or no REMOTE_WRITE).
    pub const DDP_TAGGED_INVALID_STAG: Self = Self { layer: 1, etype: 1, code: 0 };
    /// DDP tagged buffer: base or bounds violation.
    pub const DDP_TAGGED_BOUNDS: Self = Self { layer: 1, etype: 1, code: 1 };
    /// DDP tagged buffer: STag not associated with this stream (other PD).
    pub const DDP_TAGGED_PD: Self = Self { layer: 1, etype: 1, code: 2 };
    /// DDP tagged buffer: invalid DDP version.
    pub const DDP_TAGGED_BAD_VERSION: Self = Self { layer: 1, etype: 1, code: 4 };
    /// DDP untagged buffer: invalid queue number.
    pub const DDP_UNTAGGED_INVALID_QN: Self = Self { layer: 1, etype: 2, code: 1 };
    /// DDP untagged buffer: no buffer posted (or the message does not fit it).
    pub const DDP_UNTAGGED_NO_BUFFER: Self = Self { layer: 1, etype: 2, code: 2 };
    /// DDP untagged buffer: MSN out of range.
    pub const DDP_UNTAGGED_BAD_MSN: Self = Self { layer: 1, etype: 2, code: 3 };
    /// DDP untagged buffer: MO does not follow the bytes received.
    pub const DDP_UNTAGGED_BAD_MO: Self = Self { layer: 1, etype: 2, code: 4 };
    /// DDP untagged buffer: invalid DDP version.
    pub const DDP_UNTAGGED_BAD_VERSION: Self = Self { layer: 1, etype: 2, code: 6 };
    /// MPA: CRC error.
    pub const MPA_CRC: Self = Self { layer: 2, etype: 0, code: 2 };
    /// MPA: FPDU framing error (length shorter than the header).
    pub const MPA_FRAMING: Self = Self { layer: 2, etype: 0, code: 3 };

    /// Whether the peer refused a remote access (as opposed to an operation or transport error).
    pub fn is_protection(self) -> bool {
        self.layer <= 1 && self.etype == 1
    }
}

impl std::fmt::Display for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let layer = ["RDMAP", "DDP", "MPA"].get(usize::from(self.layer)).copied().unwrap_or("?");
        write!(f, "{layer} type {} code {:#04x}", self.etype, self.code)
    }
}

/// A Terminate message's control word and attached header.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TerminateMsg {
    /// Layer, error type and code.
    pub term: Term,
    /// The DDP segment length of the offending segment, if attached (M).
    pub segment_len: Option<u16>,
    /// The offending DDP header was attached (D).
    pub ddp_header: bool,
    /// The offending RDMAP header was attached (R).
    pub rdmap_header: bool,
    /// Attached bytes (after the control word).
    pub attached: Vec<u8>,
}

impl TerminateMsg {
    /// Parse the body after the untagged header. Linux siw on little-endian hosts swaps the
    /// layer/type nibbles and puts M/D/R in the low bits; that form is recognised too.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        if b.len() < 4 {
            return Err(WireError::Truncated { need: 4, have: b.len() });
        }
        let siw_le = b[2] & 0xe0 == 0 && b[2] & 0x07 != 0;
        let (layer, etype) = if siw_le { (b[0] & 0x0f, b[0] >> 4) } else { (b[0] >> 4, b[0] & 0x0f) };
        let (m, d, r) =
            if siw_le { (b[2] & 1 != 0, b[2] & 2 != 0, b[2] & 4 != 0) } else { (b[2] & 0x80 != 0, b[2] & 0x40 != 0, b[2] & 0x20 != 0) };
        let attached = b[4..].to_vec();
        let segment_len = (m && attached.len() >= 2).then(|| u16::from_be_bytes([attached[0], attached[1]]));
        Ok(Self { term: Term { layer, etype, code: b[1] }, segment_len, ddp_header: d, rdmap_header: r, attached })
    }

    /// Encode the body (RFC 5040 bit positions).
    pub fn emit(&self) -> Vec<u8> {
        let mut v = vec![(self.term.layer << 4) | (self.term.etype & 0x0f), self.term.code, 0, 0];
        if self.segment_len.is_some() {
            v[2] |= 0x80;
        }
        if self.ddp_header {
            v[2] |= 0x40;
        }
        if self.rdmap_header {
            v[2] |= 0x20;
        }
        v.extend_from_slice(&self.attached);
        v
    }
}

#[cfg(test)]
mod tests;
