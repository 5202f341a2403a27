//! UNMAP parameter list (SBC-4 §5.32.2).

use crate::Error;
use crate::be::{need, put_u16, put_u32, put_u64, u16_at, u32_at, u64_at};
use alloc::vec::Vec;

/// One UNMAP block descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnmapDescriptor {
    /// First LBA.
    pub lba: u64,
    /// Number of blocks.
    pub blocks: u32,
}

/// Encode an UNMAP parameter list.
pub fn to_bytes(descriptors: &[UnmapDescriptor]) -> Vec<u8> {
    let mut b = alloc::vec![0u8; 8 + 16 * descriptors.len()];
    put_u16(&mut b, 0, (6 + 16 * descriptors.len()) as u16);
    put_u16(&mut b, 2, (16 * descriptors.len()) as u16);
    for (i, d) in descriptors.iter().enumerate() {
        put_u64(&mut b, 8 + 16 * i, d.lba);
        put_u32(&mut b, 16 + 16 * i, d.blocks);
    }
    b
}

/// Parse an UNMAP parameter list. An empty list (length < 8) is valid and unmaps nothing.
/// Inconsistent lengths give `InvalidField` pointing at the offending byte of the parameter
/// list (report as INVALID FIELD IN PARAMETER LIST / PARAMETER LIST LENGTH ERROR).
pub fn parse(b: &[u8]) -> Result<Vec<UnmapDescriptor>, Error> {
    if b.len() < 8 {
        return Ok(Vec::new());
    }
    let data_len = usize::from(u16_at(b, 0));
    let bd_len = usize::from(u16_at(b, 2));
    if data_len + 2 > b.len() || data_len < 6 {
        return Err(Error::InvalidField { what: "UNMAP data length", byte: 0, bit: None });
    }
    if bd_len % 16 != 0 || bd_len + 8 > b.len() || bd_len + 6 > data_len {
        return Err(Error::InvalidField { what: "UNMAP block descriptor data length", byte: 2, bit: None });
    }
    need("UNMAP descriptors", b, 8 + bd_len)?;
    Ok(b[8..8 + bd_len].chunks_exact(16).map(|d| UnmapDescriptor { lba: u64_at(d, 0), blocks: u32_at(d, 8) }).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let d = [UnmapDescriptor { lba: 1, blocks: 2 }, UnmapDescriptor { lba: 1 << 40, blocks: 7 }];
        let b = to_bytes(&d);
        assert_eq!(&b[..4], &[0, 38, 0, 32]);
        assert_eq!(parse(&b).unwrap(), d);
        assert_eq!(parse(&[]).unwrap(), []);
        let mut bad = b.clone();
        bad[3] = 17;
        assert!(parse(&bad).is_err());
        assert!(parse(&b[..20]).is_err());
    }
}
