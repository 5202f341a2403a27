//! Who a logical unit is, and who talks to it: the unit's identity (its UUID, and the serial
//! number and designators derived from it) and the I_T nexus a command comes through.

use sha2::{Digest, Sha256};
use std::fmt;
use uuid::Uuid;

/// A logical unit's identity: a UUID, and what INQUIRY derives from it — the unit serial number
/// (VPD page 0x80), a locally assigned NAA designator and a T10 vendor ID designator (VPD page
/// 0x83). Hosts merge paths to one device by these (dm-multipath, VMware): two units with one
/// identity are taken for one disk, so a UUID must name one store, and the same store exported
/// by two gateways must carry the same UUID.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LuIdentity {
    uuid: Uuid,
    naa: u64,
}

impl LuIdentity {
    /// The identity of the store with this UUID.
    pub fn new(uuid: Uuid) -> Self {
        // 60 bits of a hash of the UUID, not bits of the UUID itself: UUIDs an operator writes
        // by hand may differ only in a few places, which a hash spreads over every bit.
        let h = Sha256::digest(uuid.as_bytes());
        let naa = u64::from_be_bytes([h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]]) & NAA_VALUE_MASK;
        Self { uuid, naa }
    }

    /// A fresh random identity (for a store that lives only as long as the process, such as a
    /// RAM disk).
    pub fn random() -> Self {
        Self::new(Uuid::new_v4())
    }

    /// The UUID.
    pub fn uuid(&self) -> Uuid {
        self.uuid
    }

    /// The unit serial number (VPD 0x80): the UUID, hyphenated, in lower case.
    pub fn serial(&self) -> String {
        self.uuid.hyphenated().to_string()
    }

    /// The 60-bit value of the locally assigned NAA designator (NAA 3, VPD 0x83). Two
    /// identities of different UUIDs share it with odds of 2^-60; a server checks
    /// ([`crate::server::Target`] refuses a unit whose NAA another unit has).
    pub fn naa(&self) -> u64 {
        self.naa
    }
}

/// The bits of an NAA 3 designator's locally administered value.
const NAA_VALUE_MASK: u64 = 0x0fff_ffff_ffff_ffff;

impl fmt::Display for LuIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.uuid.hyphenated().fmt(f)
    }
}

/// An I_T nexus as a logical unit sees it: the initiator port and the target port a command
/// comes through (its reservations, unit attentions and RESERVE belong to this pair), the
/// relative port identifier of that target port (reported in VPD 0x83 and PERSISTENT RESERVE
/// IN's full status) and the ALUA target port group the port is in (VPD 0x83; its asymmetric
/// access state decides what the unit serves through it).
/// Two nexuses are the same when their ports are (the relative port identifier and the target
/// port group follow from the target port).
#[derive(Clone, Debug)]
pub struct Nexus {
    key: String,
    /// Length of the initiator port name at the start of `key`.
    initiator_port: usize,
    relative_port: u16,
    port_group: u16,
}

impl Nexus {
    /// The nexus of `initiator_port` (iSCSI: `NAME,i,0xISID`) and `target_port` (iSCSI:
    /// `NAME,t,0xTPGT`), whose relative port identifier is `relative_port`, in target port
    /// group 1 (see [`with_port_group`](Self::with_port_group)).
    pub fn new(initiator_port: &str, target_port: &str, relative_port: u16) -> Self {
        Self { key: format!("{initiator_port}|{target_port}"), initiator_port: initiator_port.len(), relative_port, port_group: 1 }
    }

    /// The same nexus, its target port in ALUA target port group `group`.
    #[must_use]
    pub fn with_port_group(mut self, group: u16) -> Self {
        self.port_group = group;
        self
    }

    /// The iSCSI nexus of an initiator (name and ISID) and a target (name and portal group
    /// tag). Names compare without regard to case, so they are kept in lower case.
    pub fn iscsi(initiator: &str, isid: [u8; 6], target: &str, tpgt: u16, relative_port: u16) -> Self {
        let isid: String = isid.iter().map(|b| format!("{b:02x}")).collect();
        let i = format!("{},i,0x{isid}", initiator.to_ascii_lowercase());
        let t = format!("{},t,0x{tpgt:04x}", target.to_ascii_lowercase());
        Self::new(&i, &t, relative_port)
    }

    /// The key the unit's state is kept under: both ports.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The initiator port (`NAME,i,0xISID` for iSCSI).
    pub fn initiator_port(&self) -> &str {
        &self.key[..self.initiator_port]
    }

    /// The initiator's name: the initiator port up to its `,i,` separator.
    pub fn initiator_name(&self) -> &str {
        let p = self.initiator_port();
        p.split(",i,").next().unwrap_or(p)
    }

    /// The target port (`NAME,t,0xTPGT` for iSCSI).
    pub fn target_port(&self) -> &str {
        self.key.get(self.initiator_port + 1..).unwrap_or_default()
    }

    /// The relative port identifier of the target port.
    pub fn relative_port(&self) -> u16 {
        self.relative_port
    }

    /// The ALUA target port group of the target port.
    pub fn port_group(&self) -> u16 {
        self.port_group
    }
}

impl PartialEq for Nexus {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}

impl Eq for Nexus {}

impl std::hash::Hash for Nexus {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.key.hash(state);
    }
}

impl fmt::Display for Nexus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_derives_from_the_uuid_alone() {
        let u = Uuid::parse_str("6f1c2d3e-4a5b-4c6d-8e7f-0123456789ab").unwrap();
        let (a, b) = (LuIdentity::new(u), LuIdentity::new(u));
        assert_eq!(a, b, "two gateways given one UUID present one identity");
        assert_eq!(a.serial(), "6f1c2d3e-4a5b-4c6d-8e7f-0123456789ab");
        assert_eq!(a.naa() >> 60, 0, "60 bits");
        // UUIDs one bit apart get unrelated NAAs.
        let v = Uuid::from_u128(u.as_u128() ^ (1 << 127));
        assert_ne!(LuIdentity::new(v).naa() & 0xffff_ffff, a.naa() & 0xffff_ffff);
        assert_ne!(LuIdentity::random(), LuIdentity::random());
    }

    #[test]
    fn nexus_names_both_ports() {
        let n = Nexus::iscsi("IQN.2026-11.io.riser:Host", [0x80, 0, 0, 0, 0, 1], "iqn.2026-11.io.riser:t0", 2, 3);
        assert_eq!(n.initiator_port(), "iqn.2026-11.io.riser:host,i,0x800000000001");
        assert_eq!(n.initiator_name(), "iqn.2026-11.io.riser:host");
        assert_eq!(n.target_port(), "iqn.2026-11.io.riser:t0,t,0x0002");
        assert_eq!(n.relative_port(), 3);
        assert_eq!(n.port_group(), 1, "group 1 unless told");
        let in_group_2 = n.clone().with_port_group(2);
        assert_eq!((in_group_2.port_group(), in_group_2.relative_port()), (2, 3));
        assert_eq!(in_group_2, n, "the group follows from the port: the same nexus");
        let other_port = Nexus::iscsi("iqn.2026-11.io.riser:host", [0x80, 0, 0, 0, 0, 1], "iqn.2026-11.io.riser:t1", 2, 3);
        assert_ne!(n.key(), other_port.key(), "one initiator port through two targets is two nexuses");
    }
}
