//! The medium data path: READ, WRITE (and WRITE AND VERIFY, WRITE ATOMIC), VERIFY, ORWRITE,
//! COMPARE AND WRITE, WRITE SAME, UNMAP, PRE-FETCH and SYNCHRONIZE CACHE, with the range
//! checks, the flush and FUA rules, and the range locks of the read-modify-write commands.

use super::{Fast, LogicalUnit, MAX_ATOMIC_BLOCKS, MAX_TRANSFER_BLOCKS, Outcome, R, bad_field, illegal};
use bytes::Bytes;
use riser_scsi::cdb::{CdbSize, Rw, rw_flags};
use riser_scsi::sense::{AscAscq, Sense, SenseKey};
use std::ops::Range;
use std::sync::{Condvar, Mutex};

/// The byte ranges held by the read-modify-write commands (COMPARE AND WRITE, ORWRITE), which
/// must be atomic against each other where they overlap. Only those commands take a range,
/// and one waits only while another holds bytes it needs; READ, WRITE and every other command
/// never look here. A disk that hangs under one of them therefore holds up only the
/// read-modify-writes of the same blocks, never the LU (its state lock is not held across I/O).
#[derive(Debug, Default)]
pub(super) struct RangeLocks {
    held: Mutex<Vec<Range<u64>>>,
    released: Condvar,
}

impl RangeLocks {
    /// Wait until no held range overlaps `range`, then hold it until the guard drops.
    fn lock(&self, range: Range<u64>) -> RangeGuard<'_> {
        let overlaps = |held: &mut Vec<Range<u64>>| held.iter().any(|h| h.start < range.end && range.start < h.end);
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut held = self.released.wait_while(held, overlaps).unwrap_or_else(|e| e.into_inner());
        held.push(range.clone());
        RangeGuard { locks: self, range }
    }
}

/// A range held in [`RangeLocks`].
struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: Range<u64>,
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = held.iter().position(|h| *h == self.range) {
            held.swap_remove(i);
        }
        drop(held);
        // Waiters for different ranges share the condvar: wake them all to recheck.
        self.locks.released.notify_all();
    }
}

/// What a checked WRITE SAME does: over `len` bytes at `off`, deallocate (UNMAP=1 on a thin
/// unit, whatever the pattern: LBPRZ=1, the blocks then read as zeros, as Linux LIO does and
/// libiscsi's suite expects) or write `block` (`None`: zeros, for NDOB).
pub(super) struct SameWrite<'a> {
    pub(super) off: u64,
    pub(super) len: u64,
    pub(super) dealloc: bool,
    pub(super) block: Option<&'a [u8]>,
}

impl LogicalUnit {
    /// Check an LBA range against the capacity.
    pub(super) fn range(&self, lba: u64, blocks: u64) -> Result<(u64, usize), Sense> {
        if lba.checked_add(blocks).is_none_or(|end| end > self.blocks()) {
            return Err(illegal(AscAscq::LBA_OUT_OF_RANGE));
        }
        if blocks > u64::from(MAX_TRANSFER_BLOCKS) {
            return Err(bad_field(if blocks > 0xffff { 10 } else { 7 }, None));
        }
        Ok((lba * u64::from(self.bs()), (blocks * u64::from(self.bs())) as usize))
    }

    pub(super) fn io_error(&self, read: bool) -> Sense {
        Sense::new(SenseKey::MEDIUM_ERROR, if read { AscAscq::UNRECOVERED_READ_ERROR } else { AscAscq::WRITE_ERROR })
    }

    /// Make everything written so far durable (SYNCHRONIZE CACHE, and [`Self::settle`]).
    ///
    /// A flush error is sticky: once a flush has failed, every later one fails too (MEDIUM
    /// ERROR, WRITE ERROR) until the LU is reset ([`Self::reset`]: LOGICAL UNIT RESET, target
    /// warm or cold reset). After a failed `fdatasync` the kernel marks the pages it could not
    /// write clean (and reports the error once per open file), so the next `fdatasync`
    /// succeeds although those writes are lost; a GOOD then would tell the initiator that data
    /// which is gone is on the medium. The backend is still flushed every time, so what is
    /// written afterwards is as durable as the device allows.
    fn flush(&self) -> Result<(), Sense> {
        self.flushed(self.backend.flush())
    }

    /// The outcome of a flush that returned `result` ([`Self::flush`]'s sticky rule).
    pub(super) fn flushed(&self, result: std::io::Result<()>) -> Result<(), Sense> {
        let mut s = self.st();
        if let Err(e) = &result
            && !s.flush_failed
        {
            tracing::error!(unit = %self.identity, "flush failed, failing every flush until a LUN reset: {e}");
            s.flush_failed = true;
        }
        if s.flush_failed { Err(self.io_error(false)) } else { Ok(()) }
    }

    /// The end of every command that modifies the medium: with FUA, or with the write cache
    /// disabled (Caching mode page WCE=0), GOOD may only be returned once the data is on the
    /// medium, so flush first. `fua` is false for commands without the bit (WRITE SAME, UNMAP:
    /// byte 1 bit 3 of WRITE SAME is UNMAP, not FUA).
    pub(super) fn settle(&self, fua: bool) -> Result<Outcome, Sense> {
        if fua || self.fast() & Fast::WCE == 0 {
            self.flush()?;
        }
        Ok(Outcome::good(Bytes::new()))
    }

    pub(super) fn write_protected(&self) -> Result<(), Sense> {
        if self.fast() & Fast::SWP != 0 { Err(Sense::new(SenseKey::DATA_PROTECT, AscAscq::WRITE_PROTECTED)) } else { Ok(()) }
    }

    /// SYNCHRONIZE CACHE (10/16).
    pub(super) fn synchronize_cache(&self, r: &Rw) -> R {
        self.range(r.lba, u64::from(r.blocks).min(u64::from(MAX_TRANSFER_BLOCKS)))?;
        self.flush()?;
        Ok(Outcome::good(Bytes::new()))
    }

    /// PRE-FETCH (10/16).
    pub(super) fn pre_fetch(&self, r: &Rw) -> R {
        // Everything is already in memory (or the page cache): nothing to stage.
        self.range(r.lba, u64::from(r.blocks).min(u64::from(MAX_TRANSFER_BLOCKS)))?;
        Ok(Outcome::good(Bytes::new()))
    }

    pub(super) fn check_rw(&self, r: &Rw) -> Result<(u64, usize), Sense> {
        if r.protect() != 0 {
            // No protection information on riser LUs.
            return Err(bad_field(1, Some(7)));
        }
        self.range(r.lba, u64::from(r.transfer_blocks()))
    }

    pub(super) fn read(&self, r: &Rw, mut buf: Vec<u8>) -> R {
        let (off, len) = self.check_rw(r)?;
        self.backend.read_into(off, len, &mut buf).map_err(|_| self.io_error(true))?;
        Ok(Outcome::good(buf))
    }

    pub(super) fn write(&self, r: &Rw, out: &[u8]) -> R {
        let (off, len) = self.check_rw(r)?;
        self.write_protected()?;
        // With an iSCSI EDTL below the CDB's transfer length only the whole blocks received are
        // written (the residual overflow tells the initiator); RFC 7143 §11.4.5.1.
        let bs = self.bs() as usize;
        let len = len.min(out.len() / bs * bs);
        self.backend.write(off, &out[..len]).map_err(|_| self.io_error(false))?;
        self.settle(r.fua())
    }

    /// WRITE AND VERIFY: a WRITE (the medium is not read back).
    pub(super) fn write_and_verify(&self, r: &Rw, out: &[u8]) -> R {
        if r.protect() != 0 {
            return Err(bad_field(1, Some(7)));
        }
        self.write(&Rw { flags: r.flags & !0x06, ..*r }, out)
    }

    /// WRITE ATOMIC (16): a WRITE of at most [`MAX_ATOMIC_BLOCKS`] (offered only over a backend
    /// with atomic writes).
    pub(super) fn write_atomic(&self, lba: u64, blocks: u16, flags: u8, group: u8, control: u8, out: &[u8]) -> R {
        if u32::from(blocks) > MAX_ATOMIC_BLOCKS {
            return Err(bad_field(12, None));
        }
        let rw = Rw { size: CdbSize::Sixteen, lba, blocks: u32::from(blocks), flags, group, control };
        self.write(&rw, out)
    }

    pub(super) fn or_write(&self, r: &Rw, out: &[u8]) -> R {
        let (off, len) = self.check_rw(r)?;
        self.write_protected()?;
        let bs = self.bs() as usize;
        let len = len.min(out.len() / bs * bs);
        let held = self.read_modify_write.lock(off..off + len as u64);
        let mut cur = vec![0u8; len];
        self.backend.read(off, &mut cur).map_err(|_| self.io_error(true))?;
        cur.iter_mut().zip(&out[..len]).for_each(|(c, o)| *c |= o);
        self.backend.write(off, &cur).map_err(|_| self.io_error(false))?;
        // The flush needs no atomicity: hand the blocks on first.
        drop(held);
        self.settle(r.fua())
    }

    pub(super) fn verify(&self, r: &Rw, out: &[u8]) -> R {
        if r.protect() != 0 {
            return Err(bad_field(1, Some(7)));
        }
        let (off, len) = self.range(r.lba, u64::from(r.blocks))?;
        let mut buf = vec![0u8; len];
        self.backend.read(off, &mut buf).map_err(|_| self.io_error(true))?;
        let bs = self.bs() as usize;
        let cmp = |expected: &[u8], actual: &[u8]| expected.iter().zip(actual).position(|(a, b)| a != b);
        let miscompare = match r.bytchk() {
            0 => None,
            1 => cmp(out, &buf),
            3 => buf.chunks(bs).enumerate().find_map(|(i, blk)| cmp(&out[..bs.min(out.len())], blk).map(|p| i * bs + p)),
            _ => return Err(bad_field(1, Some(2))),
        };
        match miscompare {
            Some(at) => {
                let mut s = Sense::new(SenseKey::MISCOMPARE, AscAscq::MISCOMPARE_DURING_VERIFY);
                s.information = Some(at as u64);
                Err(s)
            }
            None => Ok(Outcome::good(Bytes::new())),
        }
    }

    /// WRITE SAME, checked (see [`SameWrite`]).
    pub(super) fn check_write_same<'a>(&self, r: &Rw, out: &'a [u8]) -> Result<SameWrite<'a>, Sense> {
        if r.protect() != 0 {
            return Err(bad_field(1, Some(7)));
        }
        let ndob = r.size == CdbSize::Sixteen && r.flags & rw_flags::NDOB != 0;
        let unmap = r.flags & rw_flags::UNMAP != 0;
        if r.flags & rw_flags::ANCHOR != 0 {
            return Err(bad_field(1, Some(4)));
        }
        let blocks = if r.blocks == 0 { self.blocks().saturating_sub(r.lba) } else { u64::from(r.blocks) };
        if r.lba.checked_add(blocks).is_none_or(|e| e > self.blocks()) {
            return Err(illegal(AscAscq::LBA_OUT_OF_RANGE));
        }
        self.write_protected()?;
        let bs = u64::from(self.bs());
        let block = if ndob { None } else { Some(out.get(..bs as usize).ok_or_else(|| illegal(AscAscq::PARAMETER_LIST_LENGTH_ERROR))?) };
        Ok(SameWrite { off: r.lba * bs, len: blocks * bs, dealloc: unmap && self.backend.thin(), block })
    }

    pub(super) fn write_same(&self, r: &Rw, out: &[u8]) -> R {
        let SameWrite { off, len, dealloc, block } = self.check_write_same(r, out)?;
        if dealloc {
            self.backend.unmap(off, len).map_err(|_| self.io_error(false))?;
        } else {
            let bs = u64::from(self.bs());
            let pattern = block.map_or_else(|| vec![0; bs as usize], <[u8]>::to_vec);
            let per_chunk = (1u64 << 20) / bs;
            let blocks = len / bs;
            let chunk: Vec<u8> = pattern.iter().copied().cycle().take((per_chunk.min(blocks) * bs) as usize).collect();
            let mut b = 0;
            while b < blocks {
                let n = per_chunk.min(blocks - b);
                self.backend.write(off + b * bs, &chunk[..(n * bs) as usize]).map_err(|_| self.io_error(false))?;
                b += n;
            }
        }
        self.settle(false)
    }

    /// UNMAP, checked: the byte ranges of its descriptors.
    pub(super) fn check_unmap(&self, out: &[u8]) -> Result<Vec<(u64, u64)>, Sense> {
        let ds = riser_scsi::unmap::parse(out).map_err(|e| e.sense(false))?;
        self.write_protected()?;
        if ds.iter().any(|d| d.lba.checked_add(u64::from(d.blocks)).is_none_or(|e| e > self.blocks())) {
            return Err(illegal(AscAscq::LBA_OUT_OF_RANGE));
        }
        if ds.len() > 256 {
            return Err(bad_field(7, None));
        }
        let bs = u64::from(self.bs());
        Ok(ds.iter().map(|d| (d.lba * bs, u64::from(d.blocks) * bs)).collect())
    }

    pub(super) fn unmap(&self, out: &[u8]) -> R {
        for (off, len) in self.check_unmap(out)? {
            self.backend.unmap(off, len).map_err(|_| self.io_error(false))?;
        }
        self.settle(false)
    }

    /// COMPARE AND WRITE of at most `max` blocks, checked: the byte range compared and
    /// written (`None`: zero blocks, nothing to do).
    pub(super) fn check_compare_and_write(
        &self,
        lba: u64,
        blocks: u8,
        flags: u8,
        out: &[u8],
        max: u8,
    ) -> Result<Option<(u64, usize)>, Sense> {
        if flags >> 5 != 0 {
            return Err(bad_field(1, Some(7)));
        }
        if blocks > max {
            return Err(bad_field(13, None));
        }
        if blocks == 0 {
            return Ok(None);
        }
        let (off, len) = self.range(lba, u64::from(blocks))?;
        if out.len() < 2 * len {
            return Err(illegal(AscAscq::PARAMETER_LIST_LENGTH_ERROR));
        }
        self.write_protected()?;
        Ok(Some((off, len)))
    }

    pub(super) fn compare_and_write(&self, lba: u64, blocks: u8, flags: u8, out: &[u8]) -> R {
        let Some((off, len)) = self.check_compare_and_write(lba, blocks, flags, out, 1)? else {
            return Ok(Outcome::good(Bytes::new()));
        };
        let held = self.read_modify_write.lock(off..off + len as u64);
        let mut cur = vec![0u8; len];
        self.backend.read(off, &mut cur).map_err(|_| self.io_error(true))?;
        if let Some(at) = cur.iter().zip(&out[..len]).position(|(a, b)| a != b) {
            let mut s = Sense::new(SenseKey::MISCOMPARE, AscAscq::MISCOMPARE_DURING_VERIFY);
            s.information = Some(at as u64);
            return Err(s);
        }
        self.backend.write(off, &out[len..2 * len]).map_err(|_| self.io_error(false))?;
        drop(held);
        self.settle(flags & rw_flags::FUA != 0)
    }
}
