//! What the LU reports of itself outside the medium: REQUEST SENSE (the sanitize progress or
//! failure, else no sense); and REPORT LUNS, whose answer is the I_T nexus's LUN inventory
//! (the server holds it and calls [`report_luns`]).

use super::sanitize::SanitizeState;
use super::{LogicalUnit, Outcome, R, bad_field, truncate};
use bytes::Bytes;
use riser_scsi::lun::Lun;
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
}

/// REPORT LUNS (SPC-5 §6.33) for an I_T nexus that sees `luns`: SELECT REPORT 0 and 2 list
/// them (there are no well-known LUNs), 1 lists none; an allocation length under 16 or another
/// SELECT REPORT is an invalid field.
pub fn report_luns(select: u8, alloc_len: u32, luns: &[Lun]) -> Result<Bytes, Sense> {
    if alloc_len < 16 {
        return Err(bad_field(6, None));
    }
    let listed: &[Lun] = match select {
        0 | 2 => luns,
        1 => &[],
        _ => return Err(bad_field(2, None)),
    };
    Ok(truncate(report_luns_to_bytes(listed), alloc_len))
}
