//! CRC32C digests (RFC 7143 §12.1, Castagnoli polynomial), hardware accelerated where the CPU
//! has it. The 4 digest bytes travel least-significant byte first.

/// CRC32C of `data`.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// Continue a CRC32C over further bytes (for header + AHS, or data + padding, in pieces).
pub fn crc32c_append(crc: u32, data: &[u8]) -> u32 {
    crc32c::crc32c_append(crc, data)
}

/// The digest as it goes on the wire.
pub fn to_wire(crc: u32) -> [u8; 4] {
    crc.to_le_bytes()
}

/// Read a digest from the wire.
pub fn from_wire(b: [u8; 4]) -> u32 {
    u32::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 7143 §B.4 (CRC examples).
    #[test]
    fn rfc_vectors() {
        assert_eq!(to_wire(crc32c(&[0u8; 32])), [0xaa, 0x36, 0x91, 0x8a]);
        assert_eq!(to_wire(crc32c(&[0xffu8; 32])), [0x43, 0xab, 0xa8, 0x62]);
        let inc: Vec<u8> = (0u8..32).collect();
        assert_eq!(to_wire(crc32c(&inc)), [0x4e, 0x79, 0xdd, 0x46]);
        let dec: Vec<u8> = (0u8..32).rev().collect();
        assert_eq!(to_wire(crc32c(&dec)), [0x5c, 0xdb, 0x3f, 0x11]);
        let scsi_read: [u8; 48] = [
            0x01, 0xc0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x14, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0x14, 0, 0, 0, 0x18, 0x28, 0, 0, 0,
            0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0,
        ];
        assert_eq!(to_wire(crc32c(&scsi_read)), [0x56, 0x3a, 0x96, 0xd9]);
        assert_eq!(crc32c_append(crc32c(&inc[..10]), &inc[10..]), crc32c(&inc));
        assert_eq!(from_wire(to_wire(0x1234_5678)), 0x1234_5678);
    }
}
