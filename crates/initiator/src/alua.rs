//! Asymmetric logical unit access (ALUA, SPC-5 §5.16) as an initiator sees it: the REPORT
//! TARGET PORT GROUPS command (MAINTENANCE IN, service action 0Ah, SPC-5 §6.36), a parser of
//! its parameter data in both formats, and the sense codes that tell an initiator to look again.
//!
//! The parser takes whatever a target sends: it never panics, and it refuses (rather than
//! guesses at) data that is cut short or claims more than it holds.

use riser_scsi::sense::{Sense, SenseKey};

/// Operation code of MAINTENANCE IN.
const MAINTENANCE_IN: u8 = 0xa3;
/// Service action of REPORT TARGET PORT GROUPS.
const SA_REPORT_TARGET_PORT_GROUPS: u8 = 0x0a;
/// PARAMETER DATA FORMAT 001b (extended header), CDB byte 1 bits 7..5.
const EXTENDED_HEADER: u8 = 0x20;

/// The asymmetric access state of a target port group (SPC-5 §5.16.2.4).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AluaState {
    /// 0h: active/optimized — the preferred way to the unit.
    ActiveOptimized,
    /// 1h: active/non-optimized — works, at a cost (the unit is owned elsewhere).
    ActiveNonOptimized,
    /// 2h: standby — only a few management commands are served.
    Standby,
    /// 3h: unavailable.
    Unavailable,
    /// 4h: logical block dependent.
    LogicalBlockDependent,
    /// Eh: offline.
    Offline,
    /// Fh: transitioning between states.
    Transitioning,
    /// A reserved code.
    Reserved(u8),
}

impl AluaState {
    /// The state of a 4-bit ASYMMETRIC ACCESS STATE code.
    pub fn from_code(code: u8) -> Self {
        match code & 0x0f {
            0x0 => Self::ActiveOptimized,
            0x1 => Self::ActiveNonOptimized,
            0x2 => Self::Standby,
            0x3 => Self::Unavailable,
            0x4 => Self::LogicalBlockDependent,
            0xe => Self::Offline,
            0xf => Self::Transitioning,
            c => Self::Reserved(c),
        }
    }
}

/// One target port group descriptor of REPORT TARGET PORT GROUPS.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetPortGroup {
    /// The TARGET PORT GROUP identifier.
    pub group: u16,
    /// Its asymmetric access state.
    pub state: AluaState,
    /// PREF: a preferred target port group.
    pub preferred: bool,
    /// The supported-states bits (T_SUP, O_SUP, LBD_SUP, U_SUP, S_SUP, AN_SUP, AO_SUP), as sent.
    pub supported: u8,
    /// STATUS CODE (0: none, 1: altered by SET TARGET PORT GROUPS, 2: altered by implicit ALUA).
    pub status: u8,
    /// The relative target port identifiers of its ports.
    pub ports: Vec<u16>,
}

/// The parameter data of REPORT TARGET PORT GROUPS.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct TargetPortGroups {
    /// Sent in the extended header format (rather than the length-only one).
    pub extended: bool,
    /// IMPLICIT TRANSITION TIME in seconds (extended format only; 0: not given).
    pub implicit_transition_secs: u8,
    /// The groups, in the order sent.
    pub groups: Vec<TargetPortGroup>,
}

impl TargetPortGroups {
    /// The state of group `group`, if reported.
    pub fn state_of(&self, group: u16) -> Option<AluaState> {
        self.groups.iter().find(|g| g.group == group).map(|g| g.state)
    }

    /// The group the port with relative target port identifier `port` belongs to, if reported.
    pub fn group_of_port(&self, port: u16) -> Option<u16> {
        self.groups.iter().find(|g| g.ports.contains(&port)).map(|g| g.group)
    }
}

/// Why REPORT TARGET PORT GROUPS parameter data was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RtpgError {
    /// Shorter than its header, or than a descriptor it begins.
    #[error("REPORT TARGET PORT GROUPS data cut short: {what} needs {need} bytes, {have} there")]
    Truncated {
        /// The part that is cut short.
        what: &'static str,
        /// Bytes it needs.
        need: usize,
        /// Bytes there are.
        have: usize,
    },
    /// The extended header names a format this parser does not know.
    #[error("REPORT TARGET PORT GROUPS data in unknown format type {0}")]
    UnknownFormat(u8),
}

/// The CDB of REPORT TARGET PORT GROUPS asking for `alloc_len` bytes, in the extended header
/// format when `extended` (targets of SPC-3 may refuse that with ILLEGAL REQUEST).
pub fn report_target_port_groups_cdb(alloc_len: u32, extended: bool) -> [u8; 12] {
    let mut cdb = [0u8; 12];
    cdb[0] = MAINTENANCE_IN;
    cdb[1] = SA_REPORT_TARGET_PORT_GROUPS | if extended { EXTENDED_HEADER } else { 0 };
    cdb[6..10].copy_from_slice(&alloc_len.to_be_bytes());
    cdb
}

/// How many bytes the whole parameter data takes, from its first four bytes (RETURN DATA
/// LENGTH + 4), if there are four: to ask again with a large enough allocation.
pub fn rtpg_full_len(data: &[u8]) -> Option<usize> {
    let h: [u8; 4] = data.get(..4)?.try_into().ok()?;
    Some((u32::from_be_bytes(h) as usize).saturating_add(4))
}

/// Parse REPORT TARGET PORT GROUPS parameter data, in either format: length-only (a 4-byte
/// RETURN DATA LENGTH, then the descriptors) or extended (that, then FORMAT TYPE 001b,
/// IMPLICIT TRANSITION TIME and two reserved bytes). The format is told by byte 4's bits 6..4,
/// which are reserved (zero) in the first descriptor of the length-only format.
///
/// Data beyond what RETURN DATA LENGTH covers is ignored; data that ends before it (or inside a
/// descriptor) is refused: ask again with the allocation [`rtpg_full_len`] tells.
pub fn parse_report_target_port_groups(data: &[u8]) -> Result<TargetPortGroups, RtpgError> {
    let full = rtpg_full_len(data).ok_or(RtpgError::Truncated { what: "the header", need: 4, have: data.len() })?;
    if data.len() < full {
        return Err(RtpgError::Truncated { what: "the returned data", need: full, have: data.len() });
    }
    let data = &data[..full];
    let mut out = TargetPortGroups::default();
    let mut at = 4;
    if let Some(&b4) = data.get(4) {
        match (b4 >> 4) & 0x7 {
            0 => {}
            1 => {
                if data.len() < 8 {
                    return Err(RtpgError::Truncated { what: "the extended header", need: 8, have: data.len() });
                }
                out.extended = true;
                out.implicit_transition_secs = data[5];
                at = 8;
            }
            other => return Err(RtpgError::UnknownFormat(other)),
        }
    }
    while at < data.len() {
        let d = &data[at..];
        if d.len() < 8 {
            return Err(RtpgError::Truncated { what: "a target port group descriptor", need: 8, have: d.len() });
        }
        let count = usize::from(d[7]);
        let len = 8 + 4 * count;
        if d.len() < len {
            return Err(RtpgError::Truncated { what: "a target port group descriptor's ports", need: len, have: d.len() });
        }
        out.groups.push(TargetPortGroup {
            group: u16::from_be_bytes([d[2], d[3]]),
            state: AluaState::from_code(d[0]),
            preferred: d[0] & 0x80 != 0,
            supported: d[1],
            status: d[5],
            ports: d[8..len].chunks_exact(4).map(|p| u16::from_be_bytes([p[2], p[3]])).collect(),
        });
        at += len;
    }
    Ok(out)
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
    let (asc, ascq) = ((s.asc.0 >> 8) as u8, s.asc.0 as u8);
    match s.key {
        SenseKey::UNIT_ATTENTION if (asc, ascq) == (0x2a, 0x06) || (asc, ascq) == (0x3f, 0x0e) => SenseAction::Reread,
        SenseKey::UNIT_ATTENTION => SenseAction::Retry,
        SenseKey::NOT_READY if asc == 0x04 && matches!(ascq, 0x0a..=0x0c) => SenseAction::Reread,
        SenseKey::ILLEGAL_REQUEST => SenseAction::Illegal,
        _ => SenseAction::None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A descriptor: state byte, group, status, ports.
    fn desc(state: u8, group: u16, status: u8, ports: &[u16]) -> Vec<u8> {
        let mut d = vec![state, 0x8f, 0, 0, 0, status, 0, ports.len() as u8];
        d[2..4].copy_from_slice(&group.to_be_bytes());
        for p in ports {
            d.extend_from_slice(&[0, 0]);
            d.extend_from_slice(&p.to_be_bytes());
        }
        d
    }

    fn length_only(descs: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = descs.concat();
        let mut d = (body.len() as u32).to_be_bytes().to_vec();
        d.extend(body);
        d
    }

    fn extended(transition: u8, descs: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = descs.concat();
        let mut d = ((body.len() + 4) as u32).to_be_bytes().to_vec();
        d.extend([0x10, transition, 0, 0]);
        d.extend(body);
        d
    }

    #[test]
    fn the_cdb_is_maintenance_in_with_service_action_0a() {
        let c = report_target_port_groups_cdb(0x1234, true);
        assert_eq!(c, [0xa3, 0x2a, 0, 0, 0, 0, 0, 0, 0x12, 0x34, 0, 0]);
        assert_eq!(report_target_port_groups_cdb(8, false)[1], 0x0a);
    }

    #[test]
    fn parses_the_length_only_format() {
        let d = length_only(&[desc(0x80, 1, 0, &[1, 3]), desc(0x01, 2, 2, &[2])]);
        let r = parse_report_target_port_groups(&d).unwrap();
        assert!(!r.extended);
        assert_eq!(r.groups.len(), 2);
        assert_eq!(
            r.groups[0],
            TargetPortGroup { group: 1, state: AluaState::ActiveOptimized, preferred: true, supported: 0x8f, status: 0, ports: vec![1, 3] }
        );
        assert_eq!(
            (r.groups[1].group, r.groups[1].state, r.groups[1].preferred, r.groups[1].status),
            (2, AluaState::ActiveNonOptimized, false, 2)
        );
        assert_eq!((r.group_of_port(3), r.group_of_port(2), r.group_of_port(9)), (Some(1), Some(2), None));
        assert_eq!((r.state_of(2), r.state_of(7)), (Some(AluaState::ActiveNonOptimized), None));
    }

    #[test]
    fn parses_the_extended_format() {
        let d = extended(30, &[desc(0x0f, 0x0102, 0, &[]), desc(0x0e, 5, 0, &[7, 8, 9])]);
        let r = parse_report_target_port_groups(&d).unwrap();
        assert!(r.extended);
        assert_eq!(r.implicit_transition_secs, 30);
        assert_eq!(
            r.groups.iter().map(|g| (g.group, g.state)).collect::<Vec<_>>(),
            [(0x0102, AluaState::Transitioning), (5, AluaState::Offline)]
        );
        assert_eq!(r.groups[1].ports, [7, 8, 9]);
        // No descriptors at all, either format.
        assert_eq!(parse_report_target_port_groups(&extended(0, &[])).unwrap().groups, []);
        assert_eq!(parse_report_target_port_groups(&length_only(&[])).unwrap().groups, []);
    }

    #[test]
    fn every_state_code_maps() {
        let states: Vec<_> = [0, 1, 2, 3, 4, 0xe, 0xf, 7].into_iter().map(AluaState::from_code).collect();
        assert_eq!(
            states,
            [
                AluaState::ActiveOptimized,
                AluaState::ActiveNonOptimized,
                AluaState::Standby,
                AluaState::Unavailable,
                AluaState::LogicalBlockDependent,
                AluaState::Offline,
                AluaState::Transitioning,
                AluaState::Reserved(7)
            ]
        );
    }

    #[test]
    fn bytes_beyond_the_return_data_length_are_ignored() {
        let mut d = length_only(&[desc(0, 1, 0, &[1])]);
        d.extend([0xff; 16]);
        assert_eq!(parse_report_target_port_groups(&d).unwrap().groups.len(), 1);
    }

    #[test]
    fn truncated_data_is_refused_at_every_length() {
        for d in [length_only(&[desc(0, 1, 0, &[1, 2]), desc(1, 2, 0, &[3])]), extended(9, &[desc(0, 1, 0, &[1]), desc(1, 2, 0, &[])])] {
            assert!(parse_report_target_port_groups(&d).is_ok());
            for n in 0..d.len() {
                assert!(matches!(parse_report_target_port_groups(&d[..n]), Err(RtpgError::Truncated { .. })), "{n} of {} bytes", d.len());
            }
        }
        // A header whose length says there is more than there is (the allocation was short).
        let mut d = length_only(&[desc(0, 1, 0, &[1])]);
        let full = rtpg_full_len(&d).unwrap();
        d.truncate(10);
        assert!(parse_report_target_port_groups(&d).is_err());
        assert_eq!(full, 16);
        // A RETURN DATA LENGTH that ends inside a descriptor.
        let mut d = length_only(&[desc(0, 1, 0, &[1])]);
        d[3] = 6;
        assert!(matches!(parse_report_target_port_groups(&d), Err(RtpgError::Truncated { .. })));
        // The extended header itself cut by the return data length.
        assert!(matches!(parse_report_target_port_groups(&[0, 0, 0, 2, 0x10, 0]), Err(RtpgError::Truncated { .. })));
        assert_eq!(rtpg_full_len(&[0xff, 0xff, 0xff, 0xff]), Some(0xffff_ffff + 4));
    }

    #[test]
    fn garbage_never_panics() {
        // A small deterministic generator: every length up to 64, many contents.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut parsed = 0;
        for _ in 0..20_000 {
            let len = (next() % 64) as usize;
            let mut d: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if d.len() >= 4 && next() % 2 == 0 {
                // A plausible length, so the descriptor walk runs too.
                let l = (d.len() - 4) as u32;
                d[..4].copy_from_slice(&l.to_be_bytes());
            }
            if let Ok(r) = parse_report_target_port_groups(&d) {
                parsed += 1;
                assert!(r.groups.iter().all(|g| g.ports.len() <= 255));
            }
        }
        assert!(parsed > 0, "some well-formed inputs were generated");
        assert!(matches!(parse_report_target_port_groups(&[0, 0, 0, 4, 0x70, 0, 0, 0]), Err(RtpgError::UnknownFormat(7))));
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
