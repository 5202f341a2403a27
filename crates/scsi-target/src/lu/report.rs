//! What the LU reports of itself outside the medium: REQUEST SENSE (the sanitize progress or
//! failure, else no sense) and REPORT LUNS.

use super::sanitize::SanitizeState;
use super::{LogicalUnit, Outcome, R, bad_field, truncate};
use riser_scsi::report::report_luns_to_bytes;
use riser_scsi::sense::{AscAscq, Sense, SenseKey};

impl LogicalUnit {
    /// REQUEST SENSE.
    pub(super) fn request_sense(&self, desc: bool, alloc_len: u8) -> R {
        let s = match self.st().sanitize_state() {
            SanitizeState::Running { done, total } => Sense::not_ready_in_progress(AscAscq::SANITIZE_IN_PROGRESS, done, total),
            SanitizeState::Failed => Sense::new(SenseKey::MEDIUM_ERROR, AscAscq::SANITIZE_COMMAND_FAILED),
            SanitizeState::Idle => Sense::new(SenseKey::NO_SENSE, AscAscq::NO_ADDITIONAL_SENSE),
        };
        let b = if desc { s.to_descriptor() } else { s.to_fixed().to_vec() };
        Ok(Outcome::good(truncate(b, u32::from(alloc_len))))
    }

    /// REPORT LUNS: this LU's own LUN.
    pub(super) fn report_luns(&self, select: u8, alloc_len: u32) -> R {
        if alloc_len < 16 {
            return Err(bad_field(6, None));
        }
        if select > 2 {
            return Err(bad_field(2, None));
        }
        Ok(Outcome::good(truncate(report_luns_to_bytes(&[self.lun]), alloc_len)))
    }
}
