//! Asymmetric logical unit access (SPC-5 §5.16): the access states of target port groups and
//! the parameter data of REPORT TARGET PORT GROUPS (§6.37), in both its formats.
//!
//! ```
//! use riser_scsi::alua::{AccessState, PortGroupDescriptor, TargetPortGroups, supported};
//! let data = TargetPortGroups {
//!     implicit_transition_time: Some(0),
//!     groups: vec![PortGroupDescriptor {
//!         state: AccessState::ActiveOptimized,
//!         supported: supported::AO | supported::AN,
//!         id: 1,
//!         relative_ports: vec![1],
//!         ..PortGroupDescriptor::default()
//!     }],
//! };
//! let bytes = data.to_bytes();
//! assert_eq!(TargetPortGroups::parse(&bytes).unwrap(), data);
//! ```

use crate::Error;
use crate::be::{need, put_u16, put_u32, u16_at, u32_at};
use alloc::vec::Vec;

/// An asymmetric access state (the 4-bit ASYMMETRIC ACCESS STATE field).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum AccessState {
    /// 0h: active/optimized.
    #[default]
    ActiveOptimized,
    /// 1h: active/non-optimized.
    ActiveNonOptimized,
    /// 2h: standby.
    Standby,
    /// 3h: unavailable.
    Unavailable,
    /// 4h: logical block dependent.
    LbaDependent,
    /// Eh: offline.
    Offline,
    /// Fh: transitioning between states.
    Transitioning,
    /// A reserved code.
    Reserved(u8),
}

impl AccessState {
    /// The field's value.
    pub const fn code(self) -> u8 {
        match self {
            Self::ActiveOptimized => 0x0,
            Self::ActiveNonOptimized => 0x1,
            Self::Standby => 0x2,
            Self::Unavailable => 0x3,
            Self::LbaDependent => 0x4,
            Self::Offline => 0xe,
            Self::Transitioning => 0xf,
            Self::Reserved(c) => c & 0x0f,
        }
    }

    /// The state of a field's value (its low four bits).
    pub const fn from_code(code: u8) -> Self {
        match code & 0x0f {
            0x0 => Self::ActiveOptimized,
            0x1 => Self::ActiveNonOptimized,
            0x2 => Self::Standby,
            0x3 => Self::Unavailable,
            0x4 => Self::LbaDependent,
            0xe => Self::Offline,
            0xf => Self::Transitioning,
            c => Self::Reserved(c),
        }
    }

    /// The state's bit among the supported states of a descriptor ([`supported`]); none for a
    /// reserved code.
    pub const fn supported_bit(self) -> u8 {
        match self {
            Self::ActiveOptimized => supported::AO,
            Self::ActiveNonOptimized => supported::AN,
            Self::Standby => supported::S,
            Self::Unavailable => supported::U,
            Self::LbaDependent => supported::LBD,
            Self::Offline => supported::O,
            Self::Transitioning => supported::T,
            Self::Reserved(_) => 0,
        }
    }

    /// Whether commands to the medium are served through a port in this state (active/optimized
    /// and active/non-optimized).
    pub const fn is_active(self) -> bool {
        matches!(self, Self::ActiveOptimized | Self::ActiveNonOptimized)
    }
}

/// The supported-states bits of a target port group descriptor's byte 1.
pub mod supported {
    /// T_SUP: transitioning.
    pub const T: u8 = 0x80;
    /// O_SUP: offline.
    pub const O: u8 = 0x40;
    /// LBD_SUP: logical block dependent.
    pub const LBD: u8 = 0x10;
    /// U_SUP: unavailable.
    pub const U: u8 = 0x08;
    /// S_SUP: standby.
    pub const S: u8 = 0x04;
    /// AN_SUP: active/non-optimized.
    pub const AN: u8 = 0x02;
    /// AO_SUP: active/optimized.
    pub const AO: u8 = 0x01;
}

/// STATUS CODE values of a target port group descriptor.
pub mod status {
    /// No status available.
    pub const NONE: u8 = 0x00;
    /// The state was altered by SET TARGET PORT GROUPS.
    pub const SET_TARGET_PORT_GROUPS: u8 = 0x01;
    /// The state was altered by implicit asymmetric logical unit access behaviour.
    pub const IMPLICIT: u8 = 0x02;
}

/// PARAMETER DATA FORMAT values of the REPORT TARGET PORT GROUPS CDB.
pub mod format {
    /// 000b: length only header.
    pub const LENGTH_ONLY: u8 = 0;
    /// 001b: extended header.
    pub const EXTENDED: u8 = 1;
}

/// Most relative ports a descriptor carries (TARGET PORT COUNT is one byte).
pub const MAX_PORTS_PER_GROUP: usize = 255;

/// One target port group descriptor.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PortGroupDescriptor {
    /// PREF: a preferred target port group.
    pub pref: bool,
    /// Its asymmetric access state.
    pub state: AccessState,
    /// The states the group supports ([`supported`] bits).
    pub supported: u8,
    /// TARGET PORT GROUP.
    pub id: u16,
    /// STATUS CODE ([`status`]).
    pub status: u8,
    /// Vendor specific byte.
    pub vendor: u8,
    /// Relative target port identifiers of its ports (at most [`MAX_PORTS_PER_GROUP`] are
    /// encoded).
    pub relative_ports: Vec<u16>,
}

/// REPORT TARGET PORT GROUPS parameter data.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TargetPortGroups {
    /// `Some(IMPLICIT TRANSITION TIME)` (seconds, 0: unspecified) for the extended header
    /// format, `None` for the length only format.
    pub implicit_transition_time: Option<u8>,
    /// The descriptors.
    pub groups: Vec<PortGroupDescriptor>,
}

impl TargetPortGroups {
    /// The access state of target port group `id`, if reported.
    pub fn state_of(&self, id: u16) -> Option<AccessState> {
        self.groups.iter().find(|g| g.id == id).map(|g| g.state)
    }

    /// The target port group the port with relative target port identifier `port` belongs to,
    /// if reported.
    pub fn group_of_port(&self, port: u16) -> Option<u16> {
        self.groups.iter().find(|g| g.relative_ports.contains(&port)).map(|g| g.id)
    }

    /// Encode. The RETURN DATA LENGTH counts every byte after the first four.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = alloc::vec![0u8; 4];
        if let Some(t) = self.implicit_transition_time {
            b.extend_from_slice(&[format::EXTENDED << 4, t, 0, 0]);
        }
        for g in &self.groups {
            let ports = &g.relative_ports[..g.relative_ports.len().min(MAX_PORTS_PER_GROUP)];
            let at = b.len();
            b.extend_from_slice(&[0u8; 8]);
            b[at] = if g.pref { 0x80 } else { 0 } | g.state.code();
            b[at + 1] = g.supported & !0x20;
            put_u16(&mut b, at + 2, g.id);
            b[at + 5] = g.status;
            b[at + 6] = g.vendor;
            b[at + 7] = ports.len() as u8;
            for p in ports {
                b.extend_from_slice(&[0, 0]);
                b.extend_from_slice(&p.to_be_bytes());
            }
        }
        let len = (b.len() - 4) as u32;
        put_u32(&mut b, 0, len);
        b
    }

    /// Bytes the whole parameter data takes, from its first four: what an allocation length
    /// must be for [`parse`](Self::parse) to see it all.
    pub fn required_len(b: &[u8]) -> Result<usize, Error> {
        need("REPORT TARGET PORT GROUPS data", b, 4)?;
        Ok((u32_at(b, 0) as usize).saturating_add(4))
    }

    /// Parse the whole parameter data; bytes beyond what its RETURN DATA LENGTH covers are
    /// ignored. The format is told by byte 4's FORMAT TYPE (bits 6-4), reserved (zero) in the
    /// first descriptor of the length only format; a reserved FORMAT TYPE is refused.
    ///
    /// [`Error::Truncated`] when the buffer holds less than the RETURN DATA LENGTH announces
    /// (ask again with the allocation length [`required_len`](Self::required_len) tells);
    /// [`Error::InvalidField`] when the data contradicts itself (a RETURN DATA LENGTH ending
    /// inside the extended header or a descriptor, a reserved FORMAT TYPE): asking again for
    /// more would not help.
    pub fn parse(b: &[u8]) -> Result<Self, Error> {
        let what = "REPORT TARGET PORT GROUPS data";
        let end = Self::required_len(b)?;
        need(what, b, end)?;
        let mut at = 4;
        let mut implicit_transition_time = None;
        if end > 4 {
            match (b[4] >> 4) & 0x7 {
                format::LENGTH_ONLY => {}
                format::EXTENDED if end >= 8 => {
                    implicit_transition_time = Some(b[5]);
                    at = 8;
                }
                // The RETURN DATA LENGTH ends inside the extended header.
                format::EXTENDED => return Err(Error::InvalidField { what, byte: 0, bit: None }),
                _ => return Err(Error::InvalidField { what, byte: 4, bit: Some(6) }),
            }
        }
        let mut groups = Vec::new();
        while at < end {
            if end - at < 8 {
                return Err(Error::InvalidField { what, byte: at as u16, bit: None });
            }
            let count = usize::from(b[at + 7]);
            let ports_at = at + 8;
            if end - ports_at < 4 * count {
                return Err(Error::InvalidField { what, byte: (at + 7) as u16, bit: None });
            }
            groups.push(PortGroupDescriptor {
                pref: b[at] & 0x80 != 0,
                state: AccessState::from_code(b[at]),
                supported: b[at + 1],
                id: u16_at(b, at + 2),
                status: b[at + 5],
                vendor: b[at + 6],
                relative_ports: (0..count).map(|i| u16_at(b, ports_at + 4 * i + 2)).collect(),
            });
            at = ports_at + 4 * count;
        }
        Ok(Self { implicit_transition_time, groups })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> TargetPortGroups {
        TargetPortGroups {
            implicit_transition_time: None,
            groups: alloc::vec![
                PortGroupDescriptor {
                    state: AccessState::ActiveOptimized,
                    supported: supported::AO | supported::AN,
                    id: 1,
                    status: status::IMPLICIT,
                    relative_ports: alloc::vec![1, 3],
                    ..Default::default()
                },
                PortGroupDescriptor {
                    pref: true,
                    state: AccessState::Transitioning,
                    supported: supported::T | supported::AO,
                    id: 0x0102,
                    relative_ports: alloc::vec![0x0203],
                    ..Default::default()
                },
            ],
        }
    }

    #[test]
    fn length_only_layout() {
        let b = two().to_bytes();
        #[rustfmt::skip]
        let want = [
            0, 0, 0, 28,
            0x00, 0x03, 0, 1, 0, 2, 0, 2,   0, 0, 0, 1,   0, 0, 0, 3,
            0x8f, 0x81, 1, 2, 0, 0, 0, 1,   0, 0, 2, 3,
        ];
        assert_eq!(b, want);
        assert_eq!(TargetPortGroups::parse(&b).unwrap(), two());
        assert_eq!(TargetPortGroups::required_len(&b[..4]).unwrap(), 32);
    }

    #[test]
    fn extended_header_layout() {
        let data = TargetPortGroups { implicit_transition_time: Some(10), ..two() };
        let b = data.to_bytes();
        assert_eq!(&b[..8], &[0, 0, 0, 32, 0x10, 10, 0, 0]);
        assert_eq!(&b[8..], &two().to_bytes()[4..]);
        assert_eq!(TargetPortGroups::parse(&b).unwrap(), data);
    }

    #[test]
    fn truncated_or_inconsistent_data_is_an_error() {
        let b = two().to_bytes();
        assert_eq!(TargetPortGroups::parse(&b[..20]), Err(Error::truncated("REPORT TARGET PORT GROUPS data", 32, 20)));
        let mut bad = b.clone();
        bad[11] = 3; // three ports announced, two present before the next descriptor
        let mut short = bad.clone();
        short.truncate(28);
        short[3] = 24;
        assert!(TargetPortGroups::parse(&short).is_err());
        assert!(TargetPortGroups::parse(&[0, 0, 0, 3, 0, 0, 0]).is_err(), "a partial descriptor");
        assert_eq!(TargetPortGroups::parse(&[0, 0, 0, 0]).unwrap(), TargetPortGroups::default());
    }

    /// A descriptor as a target might send it: state byte, group, status, ports.
    fn desc(state: u8, group: u16, status: u8, ports: &[u16]) -> Vec<u8> {
        let mut d = alloc::vec![state, 0x8f, 0, 0, 0, status, 0, ports.len() as u8];
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
    fn parses_what_a_target_sends_in_the_length_only_format() {
        let d = length_only(&[desc(0x80, 1, 0, &[1, 3]), desc(0x01, 2, 2, &[2])]);
        let r = TargetPortGroups::parse(&d).unwrap();
        assert_eq!(r.implicit_transition_time, None);
        assert_eq!(r.groups.len(), 2);
        assert_eq!(
            r.groups[0],
            PortGroupDescriptor {
                pref: true,
                state: AccessState::ActiveOptimized,
                supported: 0x8f,
                id: 1,
                status: 0,
                vendor: 0,
                relative_ports: alloc::vec![1, 3]
            }
        );
        assert_eq!(
            (r.groups[1].id, r.groups[1].state, r.groups[1].pref, r.groups[1].status),
            (2, AccessState::ActiveNonOptimized, false, status::IMPLICIT)
        );
        assert_eq!((r.group_of_port(3), r.group_of_port(2), r.group_of_port(9)), (Some(1), Some(2), None));
        assert_eq!((r.state_of(2), r.state_of(7)), (Some(AccessState::ActiveNonOptimized), None));
    }

    #[test]
    fn parses_what_a_target_sends_in_the_extended_format() {
        let d = extended(30, &[desc(0x0f, 0x0102, 0, &[]), desc(0x0e, 5, 0, &[7, 8, 9])]);
        let r = TargetPortGroups::parse(&d).unwrap();
        assert_eq!(r.implicit_transition_time, Some(30));
        assert_eq!(
            r.groups.iter().map(|g| (g.id, g.state)).collect::<Vec<_>>(),
            [(0x0102, AccessState::Transitioning), (5, AccessState::Offline)]
        );
        assert_eq!(r.groups[1].relative_ports, [7, 8, 9]);
        // No descriptors at all, either format.
        assert_eq!(TargetPortGroups::parse(&extended(0, &[])).unwrap().groups, []);
        assert_eq!(TargetPortGroups::parse(&length_only(&[])).unwrap().groups, []);
    }

    #[test]
    fn every_state_code_maps() {
        let states: Vec<_> = [0, 1, 2, 3, 4, 0xe, 0xf, 7].into_iter().map(AccessState::from_code).collect();
        assert_eq!(
            states,
            [
                AccessState::ActiveOptimized,
                AccessState::ActiveNonOptimized,
                AccessState::Standby,
                AccessState::Unavailable,
                AccessState::LbaDependent,
                AccessState::Offline,
                AccessState::Transitioning,
                AccessState::Reserved(7)
            ]
        );
    }

    #[test]
    fn bytes_beyond_the_return_data_length_are_ignored() {
        let mut d = length_only(&[desc(0, 1, 0, &[1])]);
        d.extend([0xff; 16]);
        assert_eq!(TargetPortGroups::parse(&d).unwrap().groups.len(), 1);
    }

    #[test]
    fn data_cut_short_is_refused_at_every_length() {
        for d in [length_only(&[desc(0, 1, 0, &[1, 2]), desc(1, 2, 0, &[3])]), extended(9, &[desc(0, 1, 0, &[1]), desc(1, 2, 0, &[])])] {
            assert!(TargetPortGroups::parse(&d).is_ok());
            for n in 0..d.len() {
                assert!(matches!(TargetPortGroups::parse(&d[..n]), Err(Error::Truncated { .. })), "{n} of {} bytes", d.len());
            }
        }
        // A header whose length says there is more than there is (the allocation was short).
        let mut d = length_only(&[desc(0, 1, 0, &[1])]);
        let full = TargetPortGroups::required_len(&d).unwrap();
        d.truncate(10);
        assert!(TargetPortGroups::parse(&d).is_err());
        assert_eq!(full, 16);
        // A RETURN DATA LENGTH that ends inside a descriptor, or inside the extended header:
        // the data contradicts itself (asking for more would not help).
        let mut d = length_only(&[desc(0, 1, 0, &[1])]);
        d[3] = 6;
        assert!(matches!(TargetPortGroups::parse(&d), Err(Error::InvalidField { .. })));
        assert!(matches!(TargetPortGroups::parse(&[0, 0, 0, 2, 0x10, 0]), Err(Error::InvalidField { byte: 0, .. })));
        assert_eq!(TargetPortGroups::required_len(&[0xff, 0xff, 0xff, 0xff]), Ok(0xffff_ffff + 4));
    }

    #[test]
    fn garbage_never_panics_and_reserved_formats_are_refused() {
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
            if let Ok(r) = TargetPortGroups::parse(&d) {
                parsed += 1;
                assert!(r.groups.iter().all(|g| g.relative_ports.len() <= MAX_PORTS_PER_GROUP));
            }
        }
        assert!(parsed > 0, "some well-formed inputs were generated");
        for f in 2..8u8 {
            let d = [0, 0, 0, 4, f << 4, 0, 0, 0];
            assert_eq!(
                TargetPortGroups::parse(&d),
                Err(Error::InvalidField { what: "REPORT TARGET PORT GROUPS data", byte: 4, bit: Some(6) })
            );
        }
    }

    #[test]
    fn states_round_trip_through_their_codes() {
        for c in 0..16u8 {
            assert_eq!(AccessState::from_code(c).code(), c);
        }
        assert!(AccessState::ActiveNonOptimized.is_active() && !AccessState::Standby.is_active());
        assert_eq!(AccessState::Standby.supported_bit(), supported::S);
    }
}
