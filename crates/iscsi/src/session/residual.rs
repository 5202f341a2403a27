//! A command's residual (RFC 7143 §11.4.5.1): how the data the command would move compares with
//! the Expected Data Transfer Length the initiator announced.

/// Residual of a command, as the U and O bits and the Residual Count carry it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Residual {
    /// The command moved exactly the expected length.
    #[default]
    None,
    /// Underflow: this many expected bytes were not moved.
    Underflow(u32),
    /// Overflow: the command would have moved this many bytes more than expected.
    Overflow(u32),
}

impl Residual {
    /// The residual of a command expecting `expected` bytes whose CDB moves `wanted`.
    pub const fn between(expected: u32, wanted: u32) -> Self {
        if wanted < expected {
            Self::Underflow(expected - wanted)
        } else if wanted > expected {
            Self::Overflow(wanted - expected)
        } else {
            Self::None
        }
    }

    /// From a response's U bit, O bit and count (U wins if a broken peer sets both).
    pub const fn from_flags(underflow: bool, overflow: bool, count: u32) -> Self {
        if underflow {
            Self::Underflow(count)
        } else if overflow {
            Self::Overflow(count)
        } else {
            Self::None
        }
    }

    /// `(underflow, overflow, count)` for a response header.
    pub const fn flags(self) -> (bool, bool, u32) {
        match self {
            Self::None => (false, false, 0),
            Self::Underflow(n) => (true, false, n),
            Self::Overflow(n) => (false, true, n),
        }
    }

    /// Of `received` bytes of read data, the ones that count (an underflow drops its count
    /// from the end).
    pub fn keep(self, received: usize) -> usize {
        match self {
            Self::Underflow(n) => received.saturating_sub(n as usize),
            _ => received,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn residuals_compare_what_moves_with_what_was_expected() {
        assert_eq!(Residual::between(4096, 512), Residual::Underflow(3584));
        assert_eq!(Residual::between(512, 4096), Residual::Overflow(3584));
        assert_eq!(Residual::between(512, 512), Residual::None);
        assert_eq!(Residual::Underflow(3584).flags(), (true, false, 3584));
        assert_eq!(Residual::Overflow(7).flags(), (false, true, 7));
        assert_eq!(Residual::None.flags(), (false, false, 0));
        for r in [Residual::None, Residual::Underflow(1), Residual::Overflow(u32::MAX)] {
            let (u, o, n) = r.flags();
            assert_eq!(Residual::from_flags(u, o, n), r);
        }
        assert_eq!(Residual::Underflow(100).keep(512), 412);
        assert_eq!(Residual::Underflow(1000).keep(512), 0);
        assert_eq!(Residual::Overflow(100).keep(512), 512);
    }
}
