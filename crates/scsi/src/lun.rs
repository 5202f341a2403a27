//! SAM logical unit numbers: the 8-byte encoding used in REPORT LUNS and in iSCSI headers.

use core::fmt;

/// An 8-byte SAM LUN, kept exactly as on the wire so any value round-trips.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Lun(pub [u8; 8]);

/// Address method in the two top bits of byte 0 (SAM-5 §4.7.4).
const METHOD_PERIPHERAL: u8 = 0b00;
const METHOD_FLAT: u8 = 0b01;

impl Lun {
    /// LUN 0.
    pub const ZERO: Self = Self([0; 8]);

    /// Encode a single-level LUN number the way Linux `int_to_scsilun` does: peripheral device
    /// addressing below 256, flat space addressing up to 16383. `None` above that.
    pub const fn from_number(n: u16) -> Option<Self> {
        let mut b = [0u8; 8];
        if n < 256 {
            b[1] = n as u8;
        } else if n < 0x4000 {
            b[0] = (METHOD_FLAT << 6) | (n >> 8) as u8;
            b[1] = (n & 0xff) as u8;
        } else {
            return None;
        }
        Some(Self(b))
    }

    /// The single-level LUN number, if this LUN uses peripheral or flat addressing with the
    /// lower levels zero.
    pub fn number(&self) -> Option<u16> {
        if self.0[2..].iter().any(|&b| b != 0) {
            return None;
        }
        match self.0[0] >> 6 {
            METHOD_PERIPHERAL if self.0[0] == 0 => Some(u16::from(self.0[1])),
            METHOD_FLAT => Some(u16::from(self.0[0] & 0x3f) << 8 | u16::from(self.0[1])),
            _ => None,
        }
    }

    /// The raw value as a big-endian integer.
    pub const fn to_u64(&self) -> u64 {
        u64::from_be_bytes(self.0)
    }

    /// From a raw big-endian integer.
    pub const fn from_u64(v: u64) -> Self {
        Self(v.to_be_bytes())
    }
}

/// A LUN number that single-level addressing cannot hold (16384 and above).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LunOutOfRange(pub u16);

impl fmt::Display for LunOutOfRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LUN {} is beyond single-level addressing (0..=16383)", self.0)
    }
}

impl core::error::Error for LunOutOfRange {}

/// LUNs 0 to 255: peripheral device addressing, always representable.
impl From<u8> for Lun {
    fn from(n: u8) -> Self {
        Self([0, n, 0, 0, 0, 0, 0, 0])
    }
}

/// As [`Lun::from_number`]: peripheral addressing below 256, flat space up to 16383.
impl TryFrom<u16> for Lun {
    type Error = LunOutOfRange;
    fn try_from(n: u16) -> Result<Self, LunOutOfRange> {
        Self::from_number(n).ok_or(LunOutOfRange(n))
    }
}

impl fmt::Debug for Lun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.number() {
            Some(n) => write!(f, "Lun({n})"),
            None => write!(f, "Lun({:#018x})", self.to_u64()),
        }
    }
}

impl fmt::Display for Lun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.number() {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "{:#018x}", self.to_u64()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conversions_from_numbers() {
        assert_eq!(Lun::from(7u8), Lun::from_number(7).unwrap());
        assert_eq!(Lun::try_from(300u16), Ok(Lun::from_number(300).unwrap()));
        assert_eq!(Lun::try_from(16383u16).map(|l| l.number()), Ok(Some(16383)));
        assert_eq!(Lun::try_from(16384u16), Err(LunOutOfRange(16384)));
    }

    #[test]
    fn peripheral_and_flat() {
        assert_eq!(Lun::from_number(5).unwrap().0, [0, 5, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Lun::from_number(300).unwrap().0, [0x41, 0x2c, 0, 0, 0, 0, 0, 0]);
        assert_eq!(Lun::from_number(0x4000), None);
        for n in [0u16, 1, 255, 256, 16383] {
            assert_eq!(Lun::from_number(n).unwrap().number(), Some(n));
        }
        assert_eq!(Lun([0x80, 1, 0, 0, 0, 0, 0, 0]).number(), None);
        assert_eq!(Lun([0, 1, 0, 0, 0, 0, 0, 1]).number(), None);
    }
}
