//! PERSISTENT RESERVE IN / OUT (SPC-5 §6.16, §6.17) parameter data.

use crate::Error;
use crate::be::{need, put_u16, put_u32, put_u64, u32_at, u64_at};
use alloc::vec::Vec;

/// PERSISTENT RESERVE IN service actions.
#[allow(missing_docs)]
pub mod in_sa {
    pub const READ_KEYS: u8 = 0;
    pub const READ_RESERVATION: u8 = 1;
    pub const REPORT_CAPABILITIES: u8 = 2;
    pub const READ_FULL_STATUS: u8 = 3;
}

/// PERSISTENT RESERVE OUT service actions.
#[allow(missing_docs)]
pub mod out_sa {
    pub const REGISTER: u8 = 0;
    pub const RESERVE: u8 = 1;
    pub const RELEASE: u8 = 2;
    pub const CLEAR: u8 = 3;
    pub const PREEMPT: u8 = 4;
    pub const PREEMPT_AND_ABORT: u8 = 5;
    pub const REGISTER_AND_IGNORE_EXISTING_KEY: u8 = 6;
    pub const REGISTER_AND_MOVE: u8 = 7;
}

/// Persistent reservation types.
#[allow(missing_docs)]
pub mod pr_type {
    pub const WRITE_EXCLUSIVE: u8 = 1;
    pub const EXCLUSIVE_ACCESS: u8 = 3;
    pub const WRITE_EXCLUSIVE_REGISTRANTS_ONLY: u8 = 5;
    pub const EXCLUSIVE_ACCESS_REGISTRANTS_ONLY: u8 = 6;
    pub const WRITE_EXCLUSIVE_ALL_REGISTRANTS: u8 = 7;
    pub const EXCLUSIVE_ACCESS_ALL_REGISTRANTS: u8 = 8;
}

/// READ KEYS parameter data.
pub fn read_keys_to_bytes(generation: u32, keys: &[u64]) -> Vec<u8> {
    let mut b = alloc::vec![0u8; 8 + 8 * keys.len()];
    put_u32(&mut b, 0, generation);
    put_u32(&mut b, 4, (8 * keys.len()) as u32);
    for (i, k) in keys.iter().enumerate() {
        put_u64(&mut b, 8 + 8 * i, *k);
    }
    b
}

/// Parse READ KEYS parameter data into (generation, keys).
pub fn parse_read_keys(b: &[u8]) -> Result<(u32, Vec<u64>), Error> {
    need("READ KEYS data", b, 8)?;
    let end = (8 + u32_at(b, 4) as usize).min(b.len());
    Ok((u32_at(b, 0), b[8..end].chunks_exact(8).map(|c| u64_at(c, 0)).collect()))
}

/// A held reservation: (key, scope, type).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reservation {
    /// Reservation key of the holder.
    pub key: u64,
    /// Scope (0 = LU scope).
    pub scope: u8,
    /// Reservation type ([`pr_type`]).
    pub pr_type: u8,
}

/// READ RESERVATION parameter data.
pub fn read_reservation_to_bytes(generation: u32, r: Option<Reservation>) -> Vec<u8> {
    let mut b = alloc::vec![0u8; if r.is_some() { 24 } else { 8 }];
    put_u32(&mut b, 0, generation);
    if let Some(r) = r {
        put_u32(&mut b, 4, 16);
        put_u64(&mut b, 8, r.key);
        b[21] = (r.scope << 4) | (r.pr_type & 0x0f);
    }
    b
}

/// Parse READ RESERVATION parameter data.
pub fn parse_read_reservation(b: &[u8]) -> Result<(u32, Option<Reservation>), Error> {
    need("READ RESERVATION data", b, 8)?;
    let generation = u32_at(b, 0);
    if u32_at(b, 4) == 0 {
        return Ok((generation, None));
    }
    need("READ RESERVATION data", b, 24)?;
    Ok((generation, Some(Reservation { key: u64_at(b, 8), scope: b[21] >> 4, pr_type: b[21] & 0x0f })))
}

/// REPORT CAPABILITIES flag bits (SPC-5 §6.16.4): `BYTE2_*` go in byte 2, `BYTE3_*` in byte 3
/// of the parameter data.
pub mod caps {
    /// Byte 2 bit 7, RLR_C: the device server can replace lost reservations.
    pub const BYTE2_RLR_C: u8 = 0x80;
    /// Byte 2 bit 4, CRH: compatible reservation handling (RESERVE/RELEASE as SPC-5 §5.14.3).
    pub const BYTE2_CRH: u8 = 0x10;
    /// Byte 2 bit 3, SIP_C: the SPEC_I_PT bit is supported.
    pub const BYTE2_SIP_C: u8 = 0x08;
    /// Byte 2 bit 2, ATP_C: the ALL_TG_PT bit is supported.
    pub const BYTE2_ATP_C: u8 = 0x04;
    /// Byte 2 bit 0, PTPL_C: persist through power loss is supported (APTPL may be set).
    pub const BYTE2_PTPL_C: u8 = 0x01;
    /// Byte 3 bit 7, TMV: the persistent reservation type mask is valid.
    pub const BYTE3_TMV: u8 = 0x80;
    /// Byte 3 bits 6..4, ALLOW COMMANDS.
    pub const BYTE3_ALLOW_COMMANDS_MASK: u8 = 0x70;
    /// Byte 3 bit 0, PTPL_A: persist through power loss is activated.
    pub const BYTE3_PTPL_A: u8 = 0x01;
}

/// REPORT CAPABILITIES parameter data (8 bytes): flags bytes 2 and 3 ([`caps`]) and the type
/// mask.
pub fn report_capabilities_to_bytes(byte2: u8, byte3: u8, type_mask: u16) -> [u8; 8] {
    let mut b = [0u8; 8];
    put_u16(&mut b, 0, 8);
    b[2] = byte2;
    b[3] = byte3;
    put_u16(&mut b, 4, type_mask);
    b
}

/// The basic PERSISTENT RESERVE OUT parameter list (24 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PrOutParams {
    /// RESERVATION KEY.
    pub key: u64,
    /// SERVICE ACTION RESERVATION KEY.
    pub sa_key: u64,
    /// Specify initiator ports.
    pub spec_i_pt: bool,
    /// All target ports.
    pub all_tg_pt: bool,
    /// Activate persist through power loss.
    pub aptpl: bool,
}

impl PrOutParams {
    /// Encode.
    pub fn to_bytes(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        put_u64(&mut b, 0, self.key);
        put_u64(&mut b, 8, self.sa_key);
        b[20] = if self.spec_i_pt { 0x08 } else { 0 } | if self.all_tg_pt { 0x04 } else { 0 } | u8::from(self.aptpl);
        b
    }
    /// Parse (at least 24 bytes; additional SPEC_I_PT data is not interpreted).
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        need("PERSISTENT RESERVE OUT parameter list", b, 24)?;
        Ok(Self {
            key: u64_at(b, 0),
            sa_key: u64_at(b, 8),
            spec_i_pt: b[20] & 0x08 != 0,
            all_tg_pt: b[20] & 0x04 != 0,
            aptpl: b[20] & 0x01 != 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pr_payloads() {
        let b = read_keys_to_bytes(3, &[0xabc, 0xdef]);
        assert_eq!(parse_read_keys(&b).unwrap(), (3, alloc::vec![0xabc, 0xdef]));
        let r = Reservation { key: 9, scope: 0, pr_type: pr_type::EXCLUSIVE_ACCESS };
        let b = read_reservation_to_bytes(4, Some(r));
        assert_eq!(b[21], 3);
        assert_eq!(parse_read_reservation(&b).unwrap(), (4, Some(r)));
        assert_eq!(parse_read_reservation(&read_reservation_to_bytes(1, None)).unwrap(), (1, None));
        let p = PrOutParams { key: 1, sa_key: 2, aptpl: true, ..Default::default() };
        assert_eq!(PrOutParams::parse(&p.to_bytes()).unwrap(), p);
        assert!(PrOutParams::parse(&[0; 23]).is_err());
        assert_eq!(report_capabilities_to_bytes(0x10, 0x81, 0xea01)[..2], [0, 8]);
    }
}
