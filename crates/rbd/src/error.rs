//! Errors: a librados/librbd call that failed, with its negative errno.

use std::fmt;

/// `EILSEQ` on Linux: what librbd's compare-and-write returns on a miscompare.
pub const EILSEQ: i32 = 84;
/// `ESHUTDOWN` on Linux, which Ceph calls `EBLOCKLISTED`: the client has been blocklisted.
pub const EBLOCKLISTED: i32 = 108;
/// `ETIMEDOUT` on Linux.
pub const ETIMEDOUT: i32 = 110;
/// `ENOENT` on Linux.
pub const ENOENT: i32 = 2;
/// `EROFS` on Linux: librbd's answer to a write while another client holds the exclusive lock
/// and will not give it up.
pub const EROFS: i32 = 30;
/// `EBUSY` on Linux: an object lock held by another client (`Ioctx::lock_exclusive`).
pub const EBUSY: i32 = 16;

/// A failure reported by librados or librbd, or an argument the binding refused before
/// calling them. Never produced by a panic: every librbd error ends up here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A librados/librbd call returned a negative errno.
    #[error("{op}: {} (errno {errno})", Errno(*.errno))]
    Rados {
        /// The C function that failed, e.g. `"rbd_aio_write2"`.
        op: &'static str,
        /// The negative errno it returned (e.g. `-2` for ENOENT).
        errno: i32,
    },
    /// A name (pool, image, object, option, key, value) contains a NUL byte.
    #[error("invalid {0}: contains a NUL byte")]
    InvalidName(&'static str),
    /// An argument the binding refuses before calling librados/librbd (e.g. a payload too
    /// long for the C `int` length, or compare and write buffers of different lengths).
    #[error("invalid argument: {0}")]
    InvalidArgument(&'static str),
    /// A reply buffer (e.g. of `rados_notify2`) did not have the documented layout.
    #[error("malformed reply from {0}")]
    Malformed(&'static str),
}

impl Error {
    /// The negative errno of a [`Error::Rados`] failure (`None` for the binding's own errors).
    pub fn errno(&self) -> Option<i32> {
        match self {
            Self::Rados { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// Whether this failure says the client has been blocklisted (`-EBLOCKLISTED`).
    pub fn is_blocklisted(&self) -> bool {
        self.errno() == Some(-EBLOCKLISTED)
    }

    /// Turns a C return value into `Ok(value)` (non-negative) or `Err(Error::Rados)`.
    pub fn check(op: &'static str, ret: i64) -> Result<u64, Self> {
        if ret < 0 { Err(Self::Rados { op, errno: ret.max(i64::from(i32::MIN)) as i32 }) } else { Ok(ret as u64) }
    }
}

/// The outcome of a failed compare-and-write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CompareError {
    /// The data on the image differed from the compare buffer; nothing was written.
    /// `offset` is the first differing byte, counted from the start of the compare buffer.
    #[error("compare and write: miscompare at byte {offset}")]
    Mismatch {
        /// The first differing byte, relative to the start of the request.
        offset: u64,
    },
    /// Any other failure (including librbd's refusal of anything but 512 bytes inside one
    /// 512-byte sector, `-EINVAL`).
    #[error(transparent)]
    Io(#[from] Error),
}

/// strerror text for a (negative or positive) errno, through std (no unsafe needed).
struct Errno(i32);

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = std::io::Error::from_raw_os_error(self.0.saturating_abs()).to_string();
        // std appends " (os error N)"; the errno is printed by the caller.
        let text = text.split(" (os error").next().unwrap_or(&text);
        f.write_str(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_has_op_text_and_errno() {
        let e = Error::Rados { op: "rbd_open", errno: -ENOENT };
        assert_eq!(e.to_string(), "rbd_open: No such file or directory (errno -2)");
        assert_eq!(e.errno(), Some(-2));
        assert!(!e.is_blocklisted());
        assert!(Error::Rados { op: "x", errno: -EBLOCKLISTED }.is_blocklisted());
        assert_eq!(Error::check("x", 5), Ok(5));
        assert_eq!(Error::check("x", -22), Err(Error::Rados { op: "x", errno: -22 }));
    }

    #[test]
    fn compare_error_wraps_io() {
        let e: CompareError = Error::Rados { op: "rbd_aio_compare_and_write", errno: -22 }.into();
        assert!(matches!(e, CompareError::Io(_)));
        assert_eq!(CompareError::Mismatch { offset: 7 }.to_string(), "compare and write: miscompare at byte 7");
    }
}
