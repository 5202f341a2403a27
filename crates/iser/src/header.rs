//! The iSER header (RFC 7145 §9.2, 28 bytes, as Linux, libiscsi and tgt put it before every
//! BHS) and the 4-byte iSER private data of the connection request and reply.

/// Length of the iSER header.
pub const ISER_HDR_LEN: usize = 28;
/// iSER header + BHS: the fixed part of every Send.
pub const ISER_HEADERS_LEN: usize = ISER_HDR_LEN + 48;
/// Length of the RFC 5046 (iWARP-era) iSER header, which no Linux stack speaks.
pub const RFC5046_HDR_LEN: usize = 12;

const OP_CONTROL: u8 = 0x10;
const OP_HELLO: u8 = 0x20;
const OP_HELLO_REPLY: u8 = 0x30;
const WSV: u8 = 0x08;
const RSV: u8 = 0x04;

/// The iSER opcode (high nibble of byte 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IserOpcode {
    /// An iSCSI control-type PDU follows.
    Control,
    /// iSER Hello (RFC 5046 iWARP only; never sent by Linux).
    Hello,
    /// iSER HelloReply.
    HelloReply,
    /// Anything else (the nibble).
    Other(u8),
}

/// Errors in an iSER header.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeaderError {
    /// Fewer than 28 bytes.
    #[error("iSER message of {0} bytes is shorter than the 28-byte iSER header")]
    Truncated(usize),
}

/// An advertised buffer: STag and (absolute, non-zero-based) virtual address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteBuf {
    /// STag (rkey).
    pub stag: u32,
    /// Virtual address of the first byte.
    pub va: u64,
}

/// The iSER header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IserHeader {
    /// Opcode.
    pub opcode: IserOpcode,
    /// Write STag and base offset (W bit): where the target RDMA Reads solicited write data;
    /// the address of the first byte not sent as immediate/unsolicited data.
    pub write: Option<RemoteBuf>,
    /// Read STag and base offset (R bit): where the target RDMA Writes read data.
    pub read: Option<RemoteBuf>,
}

impl IserHeader {
    /// A control header without buffers (flags 0x10).
    pub const CONTROL: Self = Self { opcode: IserOpcode::Control, write: None, read: None };

    /// Parse the first 28 bytes. STag pairs whose W/R bit is clear are ignored (as isert).
    pub fn parse(b: &[u8]) -> Result<Self, HeaderError> {
        if b.len() < ISER_HDR_LEN {
            return Err(HeaderError::Truncated(b.len()));
        }
        let be32 = |o: usize| u32::from_be_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let be64 = |o: usize| (u64::from(be32(o)) << 32) | u64::from(be32(o + 4));
        let opcode = match b[0] & 0xf0 {
            OP_CONTROL => IserOpcode::Control,
            OP_HELLO => IserOpcode::Hello,
            OP_HELLO_REPLY => IserOpcode::HelloReply,
            n => IserOpcode::Other(n >> 4),
        };
        Ok(Self {
            opcode,
            write: (b[0] & WSV != 0).then(|| RemoteBuf { stag: be32(4), va: be64(8) }),
            read: (b[0] & RSV != 0).then(|| RemoteBuf { stag: be32(16), va: be64(20) }),
        })
    }

    /// The 28 bytes.
    pub fn emit(&self) -> [u8; ISER_HDR_LEN] {
        let mut b = [0u8; ISER_HDR_LEN];
        b[0] = match self.opcode {
            IserOpcode::Control => OP_CONTROL,
            IserOpcode::Hello => OP_HELLO,
            IserOpcode::HelloReply => OP_HELLO_REPLY,
            IserOpcode::Other(n) => n << 4,
        };
        if let Some(w) = self.write {
            b[0] |= WSV;
            b[4..8].copy_from_slice(&w.stag.to_be_bytes());
            b[8..16].copy_from_slice(&w.va.to_be_bytes());
        }
        if let Some(r) = self.read {
            b[0] |= RSV;
            b[16..20].copy_from_slice(&r.stag.to_be_bytes());
            b[20..28].copy_from_slice(&r.va.to_be_bytes());
        }
        b
    }
}

/// The iSER CM private data (4 bytes in the connection request and reply).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct CmPrivateData {
    /// Zero-based virtual addressing is not supported/used (bit 0x80; always set by Linux).
    pub zbva_not_supported: bool,
    /// Send with Invalidate is not supported/used (bit 0x40).
    pub send_inv_not_supported: bool,
}

impl CmPrivateData {
    /// Parse (absent or short private data reads as flags 0).
    pub fn parse(b: &[u8]) -> Self {
        let f = b.first().copied().unwrap_or(0);
        Self { zbva_not_supported: f & 0x80 != 0, send_inv_not_supported: f & 0x40 != 0 }
    }
    /// The 4 bytes.
    pub fn emit(&self) -> [u8; 4] {
        [u8::from(self.zbva_not_supported) << 7 | u8::from(self.send_inv_not_supported) << 6, 0, 0, 0]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_command_header_as_linux_sends_it() {
        let h =
            IserHeader { opcode: IserOpcode::Control, write: None, read: Some(RemoteBuf { stag: 0x0012_3456, va: 0xffff_8880_1234_5000 }) };
        let b = h.emit();
        assert_eq!(b[0], 0x14);
        assert_eq!(&b[1..16], &[0u8; 15]);
        assert_eq!(&b[16..20], &[0x00, 0x12, 0x34, 0x56]);
        assert_eq!(&b[20..28], &[0xff, 0xff, 0x88, 0x80, 0x12, 0x34, 0x50, 0x00]);
        assert_eq!(IserHeader::parse(&b).unwrap(), h);
    }

    #[test]
    fn flags_of_write_bidi_and_control() {
        let buf = RemoteBuf { stag: 1, va: 2 };
        assert_eq!(IserHeader { write: Some(buf), ..IserHeader::CONTROL }.emit()[0], 0x18);
        assert_eq!(IserHeader { write: Some(buf), read: Some(buf), ..IserHeader::CONTROL }.emit()[0], 0x1c);
        assert_eq!(IserHeader::CONTROL.emit(), {
            let mut b = [0u8; 28];
            b[0] = 0x10;
            b
        });
    }

    #[test]
    fn stag_pairs_without_their_bit_are_ignored_and_hello_is_recognised() {
        let mut b = IserHeader { write: Some(RemoteBuf { stag: 7, va: 9 }), ..IserHeader::CONTROL }.emit();
        b[0] = 0x10;
        assert_eq!(IserHeader::parse(&b).unwrap(), IserHeader::CONTROL);
        b[0] = 0x20;
        assert_eq!(IserHeader::parse(&b).unwrap().opcode, IserOpcode::Hello);
        b[0] = 0x30;
        assert_eq!(IserHeader::parse(&b).unwrap().opcode, IserOpcode::HelloReply);
        b[0] = 0x50;
        assert_eq!(IserHeader::parse(&b).unwrap().opcode, IserOpcode::Other(5));
        assert_eq!(IserHeader::parse(&b[..27]), Err(HeaderError::Truncated(27)));
    }

    #[test]
    fn cm_private_data() {
        let linux = CmPrivateData { zbva_not_supported: true, send_inv_not_supported: false };
        assert_eq!(linux.emit(), [0x80, 0, 0, 0]);
        let libiscsi = CmPrivateData { zbva_not_supported: true, send_inv_not_supported: true };
        assert_eq!(libiscsi.emit(), [0xc0, 0, 0, 0]);
        assert_eq!(CmPrivateData::parse(&[0xc0, 0, 0, 0]), libiscsi);
        assert_eq!(CmPrivateData::parse(&[]), CmPrivateData::default());
    }

    proptest::proptest! {
        #[test]
        fn round_trip(w: Option<(u32, u64)>, r: Option<(u32, u64)>) {
            let h = IserHeader {
                opcode: IserOpcode::Control,
                write: w.map(|(stag, va)| RemoteBuf { stag, va }),
                read: r.map(|(stag, va)| RemoteBuf { stag, va }),
            };
            proptest::prop_assert_eq!(IserHeader::parse(&h.emit()).unwrap(), h);
        }
    }
}
