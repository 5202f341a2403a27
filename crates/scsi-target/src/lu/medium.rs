//! The medium as a whole: its capacity (READ CAPACITY 10/16), provisioning (GET LBA STATUS),
//! defects (READ DEFECT DATA), and START STOP UNIT and PREVENT ALLOW MEDIUM REMOVAL.

use super::{LogicalUnit, Outcome, R, bad_field, illegal, truncate};
use bytes::Bytes;
use riser_scsi::capacity::{Capacity10, Capacity16, LbaStatusDescriptor, lba_status_to_bytes};
use riser_scsi::sense::AscAscq;

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

    /// GET LBA STATUS: one descriptor, for the run of blocks from `lba` that are all mapped or
    /// all deallocated.
    pub(super) fn get_lba_status(&self, lba: u64, alloc_len: u32) -> R {
        if lba >= self.blocks() {
            return Err(illegal(AscAscq::LBA_OUT_OF_RANGE));
        }
        let bs = u64::from(self.bs());
        let mapped = self.backend.is_mapped(lba * bs);
        let mut n = 1u64;
        while lba + n < self.blocks() && n < 0xffff_ffff && self.backend.is_mapped((lba + n) * bs) == mapped && n < 65536 {
            n += 1;
        }
        let d = LbaStatusDescriptor { lba, blocks: n as u32, status: if mapped { 0 } else { 1 } };
        Ok(Outcome::good(truncate(lba_status_to_bytes(&[d]), alloc_len)))
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
