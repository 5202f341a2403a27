//! The medium as a whole: its capacity (READ CAPACITY 10/16), provisioning (GET LBA STATUS),
//! defects (READ DEFECT DATA), and START STOP UNIT and PREVENT ALLOW MEDIUM REMOVAL.

use super::{LogicalUnit, Outcome, R, bad_field, illegal, truncate};
use bytes::Bytes;
use riser_scsi::capacity::{Capacity10, Capacity16, LbaStatusDescriptor, lba_status_to_bytes};
use riser_scsi::sense::AscAscq;

/// Most descriptors one GET LBA STATUS returns, and most times it asks the backend (each a look
/// at the store's extents; the default [`mapping`](crate::backend::BlockBackend::mapping) looks
/// at up to 65536 blocks).
pub(super) const MAX_LBA_STATUS_DESCRIPTORS: usize = 512;

impl LogicalUnit {
    /// READ CAPACITY (10).
    pub(super) fn read_capacity_10(&self, lba: u32, pmi: bool) -> R {
        if !pmi && lba != 0 {
            return Err(bad_field(2, None));
        }
        Ok(Outcome::good(Capacity10::new(self.blocks(), self.bs()).to_bytes().to_vec()))
    }

    /// READ CAPACITY (16).
    pub(super) fn read_capacity_16(&self, alloc_len: u32) -> R {
        let thin = self.backend.thin();
        let c = Capacity16 { lbpme: thin, lbprz: thin, ..Capacity16::new(self.blocks(), self.bs()) };
        Ok(Outcome::good(truncate(c.to_bytes().to_vec(), alloc_len)))
    }

    /// READ DEFECT DATA (10/12).
    pub(super) fn read_defect_data(&self, twelve: bool, flags: u8, alloc_len: u32) -> Outcome {
        // No defects: a header with an empty list in the requested format.
        let mut v = if twelve { vec![0u8; 8] } else { vec![0u8; 4] };
        v[1] = flags & 0x1f;
        Outcome::good(truncate(v, alloc_len))
    }

    /// GET LBA STATUS: descriptors for the runs of blocks from `lba` that are all mapped or
    /// all deallocated, as the backend reports them
    /// ([`BlockBackend::mapping`](crate::backend::BlockBackend::mapping)): as many as the
    /// allocation length holds (at least one), each of at most 0xffff_ffff blocks. The backend
    /// is asked at most [`MAX_LBA_STATUS_DESCRIPTORS`] times per command.
    pub(super) fn get_lba_status(&self, lba: u64, alloc_len: u32) -> R {
        let blocks = self.blocks();
        if lba >= blocks {
            return Err(illegal(AscAscq::LBA_OUT_OF_RANGE));
        }
        let bs = u64::from(self.bs());
        let max = ((alloc_len as usize).saturating_sub(8) / 16).clamp(1, MAX_LBA_STATUS_DESCRIPTORS);
        let mut ds: Vec<LbaStatusDescriptor> = Vec::new();
        let mut at = lba;
        for _ in 0..max {
            if at >= blocks {
                break;
            }
            let want = (blocks - at).min(0xffff_ffff);
            let (mapped, n) = match self.backend.mapping(at * bs, want * bs) {
                Ok((mapped, bytes)) => (mapped, (bytes / bs).clamp(1, want)),
                // Mapped is never wrong: status 0 means "mapped or unknown" (SBC-4).
                Err(e) => {
                    tracing::warn!(unit = %self.identity, lba = at, "GET LBA STATUS: the backend cannot tell: {e}");
                    (true, want)
                }
            };
            let status = if mapped { 0 } else { 1 };
            match ds.last_mut() {
                // A backend may report a run in pieces: one descriptor for the whole run.
                Some(d) if d.status == status && u64::from(d.blocks) + n <= 0xffff_ffff => d.blocks += n as u32,
                _ => ds.push(LbaStatusDescriptor { lba: at, blocks: n as u32, status }),
            }
            at += n;
        }
        Ok(Outcome::good(truncate(lba_status_to_bytes(&ds), alloc_len)))
    }

    /// START STOP UNIT.
    pub(super) fn start_stop_unit(&self, power_condition: u8, loej: bool, start: bool) -> R {
        if power_condition != 0 {
            return Ok(Outcome::good(Bytes::new()));
        }
        let mut s = self.st();
        if loej && !start && s.prevent {
            return Err(illegal(AscAscq::new(0x53, 0x02)));
        }
        s.stopped = !start;
        Ok(Outcome::good(Bytes::new()))
    }

    /// PREVENT ALLOW MEDIUM REMOVAL.
    pub(super) fn prevent_allow_medium_removal(&self, prevent: u8) -> Outcome {
        self.st().prevent = prevent & 1 == 1;
        Outcome::good(Bytes::new())
    }
}
