//! Asymmetric logical unit access (ALUA, SPC-5 §5.16) as a multipath initiator uses it.
//!
//! The access states and the REPORT TARGET PORT GROUPS parameter data (both formats) are
//! riser-scsi's, re-exported here: [`AccessState`], [`PortGroupDescriptor`] and
//! [`TargetPortGroups`] (parsed by [`TargetPortGroups::parse`], which refuses rather than guesses
//! at data that is cut short or contradicts itself; [`TargetPortGroups::required_len`] tells the
//! allocation length to ask again with). The command is riser-scsi's
//! [`Cdb::ReportTargetPortGroups`].
//!
//! What is the initiator's own: how a multipath handle reads the sense of a command (whether
//! to read the access states again, retry, or give up), and the CDB it sends first (the
//! extended header format, falling back to the length only one).

use riser_scsi::alua::format;
pub use riser_scsi::alua::{AccessState, PortGroupDescriptor, TargetPortGroups};
use riser_scsi::cdb::Cdb;
use riser_scsi::sense::{AscAscq, Sense, SenseKey};

/// The REPORT TARGET PORT GROUPS CDB asking for `alloc_len` bytes, in the extended header
/// format when `extended` (targets of SPC-3 may refuse that with ILLEGAL REQUEST: ask again in
/// the length only format).
pub(crate) fn rtpg_cdb(alloc_len: u32, extended: bool) -> Vec<u8> {
    let format = if extended { format::EXTENDED } else { format::LENGTH_ONLY };
    Cdb::ReportTargetPortGroups { format, alloc_len, control: 0 }.to_vec()
}

/// What a command's sense data asks of a multipath initiator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SenseAction {
    /// Nothing: the result is the command's.
    None,
    /// The access states changed (UNIT ATTENTION 2Ah/06h, 3Fh/0Eh), or the port group is
    /// transitioning, in standby or unavailable (NOT READY 04h/0Ah, 0Bh, 0Ch): read the states
    /// again, then retry (the command was not performed).
    Reread,
    /// Another UNIT ATTENTION (reset, parameters changed…): retry.
    Retry,
    /// ILLEGAL REQUEST.
    Illegal,
}

/// Classify raw sense data.
pub(crate) fn sense_action(sense: Option<&[u8]>) -> SenseAction {
    let Some(s) = sense.and_then(|s| Sense::parse(s).ok()) else { return SenseAction::None };
    match (s.key, s.asc) {
        (SenseKey::UNIT_ATTENTION, AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED | AscAscq::REPORTED_LUNS_DATA_CHANGED) => SenseAction::Reread,
        (SenseKey::UNIT_ATTENTION, _) => SenseAction::Retry,
        (
            SenseKey::NOT_READY,
            AscAscq::LUN_NOT_ACCESSIBLE_TRANSITIONING | AscAscq::LUN_NOT_ACCESSIBLE_STANDBY | AscAscq::LUN_NOT_ACCESSIBLE_UNAVAILABLE,
        ) => SenseAction::Reread,
        (SenseKey::ILLEGAL_REQUEST, _) => SenseAction::Illegal,
        _ => SenseAction::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cdb_is_maintenance_in_with_service_action_0a() {
        let c = rtpg_cdb(0x1234, true);
        assert_eq!(c, [0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0, 0]);
        assert_eq!(rtpg_cdb(8, false)[1], 0x0a);
    }

    #[test]
    fn sense_codes_that_ask_for_a_new_look() {
        let fixed = |key: u8, asc: u8, ascq: u8| {
            let mut s = vec![0u8; 18];
            s[0] = 0x70;
            s[2] = key;
            s[7] = 10;
            s[12] = asc;
            s[13] = ascq;
            s
        };
        assert_eq!(sense_action(Some(&fixed(6, 0x2a, 0x06))), SenseAction::Reread);
        assert_eq!(sense_action(Some(&fixed(6, 0x3f, 0x0e))), SenseAction::Reread);
        assert_eq!(sense_action(Some(&fixed(2, 0x04, 0x0a))), SenseAction::Reread);
        assert_eq!(sense_action(Some(&fixed(6, 0x29, 0x00))), SenseAction::Retry);
        assert_eq!(sense_action(Some(&fixed(5, 0x20, 0x00))), SenseAction::Illegal);
        assert_eq!(sense_action(Some(&fixed(2, 0x04, 0x00))), SenseAction::None);
        assert_eq!(sense_action(Some(&[1, 2, 3])), SenseAction::None);
        assert_eq!(sense_action(None), SenseAction::None);
    }
}
