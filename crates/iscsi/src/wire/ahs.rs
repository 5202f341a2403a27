//! Additional Header Segments (RFC 7143 §11.2.2).

use super::DecodeError;
use alloc::vec::Vec;

/// AHS type: extended CDB.
pub const AHS_EXTENDED_CDB: u8 = 0x01;
/// AHS type: bidirectional read expected data transfer length.
pub const AHS_BIDI_READ_LENGTH: u8 = 0x02;

/// One AHS, borrowing from the header buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ahs<'a> {
    /// CDB bytes 16 and onward.
    ExtendedCdb(&'a [u8]),
    /// Expected read length of a bidirectional command.
    BidiReadLength(u32),
    /// Any other type: (type, bytes after the type byte).
    Other(u8, &'a [u8]),
}

/// Iterator over the AHS area; yields an error (once) if the lengths are inconsistent.
#[derive(Clone, Debug)]
pub struct AhsIter<'a> {
    rest: &'a [u8],
}

impl<'a> AhsIter<'a> {
    /// Iterate over `area` (TotalAHSLength bytes).
    pub const fn new(area: &'a [u8]) -> Self {
        Self { rest: area }
    }
}

impl<'a> Iterator for AhsIter<'a> {
    type Item = Result<Ahs<'a>, DecodeError>;
    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        if self.rest.len() < 4 {
            self.rest = &[];
            return Some(Err(DecodeError::BadAhsLength));
        }
        let len = usize::from(u16::from_be_bytes([self.rest[0], self.rest[1]]));
        let ty = self.rest[2];
        let total = super::pad4(3 + len);
        if len == 0 || total > self.rest.len() {
            self.rest = &[];
            return Some(Err(DecodeError::BadAhsLength));
        }
        // AHS-specific byte (reserved for both defined types) then data.
        let body = &self.rest[3..3 + len];
        self.rest = &self.rest[total..];
        Some(Ok(match ty {
            AHS_EXTENDED_CDB => Ahs::ExtendedCdb(&body[1..]),
            AHS_BIDI_READ_LENGTH if len == 5 => Ahs::BidiReadLength(u32::from_be_bytes([body[1], body[2], body[3], body[4]])),
            AHS_BIDI_READ_LENGTH => return Some(Err(DecodeError::BadAhsLength)),
            _ => Ahs::Other(ty, body),
        }))
    }
}

fn push_ahs(out: &mut Vec<u8>, ty: u8, data: &[u8]) {
    let len = data.len() + 1;
    out.extend_from_slice(&(len as u16).to_be_bytes());
    out.push(ty);
    out.push(0);
    out.extend_from_slice(data);
    while !out.len().is_multiple_of(4) {
        out.push(0);
    }
}

/// Append an extended-CDB AHS carrying `cdb[16..]`.
pub fn extended_cdb_ahs(out: &mut Vec<u8>, cdb_tail: &[u8]) {
    push_ahs(out, AHS_EXTENDED_CDB, cdb_tail);
}

/// Append a bidirectional read length AHS.
pub fn bidi_read_length_ahs(out: &mut Vec<u8>, len: u32) {
    push_ahs(out, AHS_BIDI_READ_LENGTH, &len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_and_iterate() {
        let mut a = Vec::new();
        extended_cdb_ahs(&mut a, &[1, 2, 3, 4, 5]);
        bidi_read_length_ahs(&mut a, 4096);
        assert_eq!(&a[..4], &[0, 6, 1, 0]);
        assert_eq!(a.len(), 12 + 8);
        let v: Vec<_> = AhsIter::new(&a).collect::<Result<_, _>>().unwrap();
        assert_eq!(v, [Ahs::ExtendedCdb(&[1, 2, 3, 4, 5]), Ahs::BidiReadLength(4096)]);
    }

    #[test]
    fn bad_lengths() {
        assert_eq!(AhsIter::new(&[0, 40, 1, 0]).next(), Some(Err(DecodeError::BadAhsLength)));
        assert_eq!(AhsIter::new(&[0, 0, 1, 0]).next(), Some(Err(DecodeError::BadAhsLength)));
        assert_eq!(AhsIter::new(&[0, 1]).next(), Some(Err(DecodeError::BadAhsLength)));
        assert_eq!(AhsIter::new(&[0, 2, 2, 0]).next(), Some(Err(DecodeError::BadAhsLength)));
    }
}
