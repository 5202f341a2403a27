//! RFC 1982 serial number arithmetic over 32 bits (CmdSN, StatSN, DataSN, R2TSN).

use core::fmt;

/// A 32-bit sequence number compared with RFC 1982 arithmetic: `a < b` when `b - a` (mod 2^32)
/// is in `1..2^31`. Two numbers exactly 2^31 apart are unordered.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct SerialNumber(pub u32);

impl SerialNumber {
    /// `self + n`, wrapping.
    #[must_use]
    pub const fn add(self, n: u32) -> Self {
        Self(self.0.wrapping_add(n))
    }
    /// `self - n`, wrapping.
    #[must_use]
    pub const fn sub(self, n: u32) -> Self {
        Self(self.0.wrapping_sub(n))
    }
    /// RFC 1982 "less than".
    pub const fn lt(self, other: Self) -> bool {
        let d = other.0.wrapping_sub(self.0);
        d != 0 && d < 0x8000_0000
    }
    /// RFC 1982 "greater than".
    pub const fn gt(self, other: Self) -> bool {
        other.lt(self)
    }
    /// `self <= other`.
    pub const fn le(self, other: Self) -> bool {
        self.0 == other.0 || self.lt(other)
    }
    /// `self >= other`.
    pub const fn ge(self, other: Self) -> bool {
        self.0 == other.0 || self.gt(other)
    }
    /// Whether `self` lies in the command window `[exp, max]` (RFC 7143 §4.2.2.1).
    /// An empty window is `max == exp - 1`.
    pub const fn in_window(self, exp: Self, max: Self) -> bool {
        self.ge(exp) && self.le(max)
    }
    /// Distance `other - self` (wrapping).
    pub const fn distance_to(self, other: Self) -> u32 {
        other.0.wrapping_sub(self.0)
    }
}

impl fmt::Debug for SerialNumber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SN({})", self.0)
    }
}

impl From<u32> for SerialNumber {
    fn from(v: u32) -> Self {
        Self(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wraparound() {
        let a = SerialNumber(u32::MAX);
        let b = a.add(1);
        assert_eq!(b.0, 0);
        assert!(a.lt(b) && b.gt(a));
        assert!(!SerialNumber(0).lt(SerialNumber(0x8000_0000)));
        assert!(!SerialNumber(0x8000_0000).lt(SerialNumber(0)));
        assert!(SerialNumber(0).lt(SerialNumber(0x7fff_ffff)));
        assert!(SerialNumber(5).in_window(SerialNumber(3), SerialNumber(10)));
        assert!(!SerialNumber(11).in_window(SerialNumber(3), SerialNumber(10)));
        assert!(SerialNumber(2).in_window(SerialNumber(u32::MAX - 2), SerialNumber(4)));
        // Empty window: max = exp - 1.
        assert!(!SerialNumber(7).in_window(SerialNumber(7), SerialNumber(6)));
    }
}
