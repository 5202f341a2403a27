//! Implicit asymmetric logical unit access (ALUA, SPC-5 §5.16): the unit's target port groups,
//! their access states, REPORT TARGET PORT GROUPS, and what a port in a state that is not active
//! refuses.
//!
//! The unit holds its ALUA model: every target port group that reaches it — those of this
//! process and those of a peer gateway exporting the same store under the same identity, which
//! this process does not serve but reports, so that a host sees every path's state whichever
//! gateway it asks. The owner of the model (the service, from its configuration) sets it; a
//! change of a group's state queues ASYMMETRIC ACCESS STATE CHANGED for every nexus. The target
//! is implicit-only (TPGS 01b): SET TARGET PORT GROUPS is not implemented.
//!
//! Until a model is set a unit has one implicit group: the port group of the nexus that asks,
//! active/optimized, with its port.

use super::{LogicalUnit, Nexus, Outcome, R, State, bad_field, truncate};
use riser_scsi::alua::{PortGroupDescriptor, TargetPortGroups, format, status, supported};
use riser_scsi::cdb::Cdb;
use riser_scsi::sense::AscAscq;

pub use riser_scsi::alua::AccessState;
use riser_scsi::alua::MAX_PORTS_PER_GROUP;

/// The access states a unit can put a group in, and so reports as supported (T_SUP, U_SUP,
/// S_SUP, AN_SUP, AO_SUP): active groups serve every command; standby, unavailable and
/// transitioning groups refuse what SPC-5 §5.16.2.4 has them refuse. Offline and logical block
/// dependent are not implemented.
pub const SUPPORTED_STATES: u8 = supported::T | supported::U | supported::S | supported::AN | supported::AO;

/// A target port group of a unit's ALUA model: its identifier, the relative target port
/// identifiers of its ports, and its asymmetric access state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TargetPortGroup {
    /// TARGET PORT GROUP (what VPD page 0x83's target port group designator of its ports says).
    pub id: u16,
    /// Relative target port identifiers of its ports (1 to 65535, at most
    /// [`MAX_PORTS_PER_GROUP`]).
    pub relative_ports: Vec<u16>,
    /// Its asymmetric access state.
    pub state: AccessState,
}

impl TargetPortGroup {
    /// Group `id` of these ports, in `state`.
    pub fn new(id: u16, relative_ports: impl IntoIterator<Item = u16>, state: AccessState) -> Self {
        Self { id, relative_ports: relative_ports.into_iter().collect(), state }
    }
}

/// Why a unit refused an ALUA model or a state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AluaError {
    /// The unit has no such target port group.
    #[error("no target port group {0}")]
    UnknownGroup(u16),
    /// Two groups have this identifier.
    #[error("target port group {0} is given twice")]
    DuplicateGroup(u16),
    /// A relative port identifier is 0, or belongs to two groups.
    #[error("relative target port {0} is 0 or in two target port groups")]
    BadPort(u16),
    /// A group has more ports than REPORT TARGET PORT GROUPS can list.
    #[error("target port group {0} has more than 255 ports")]
    TooManyPorts(u16),
    /// The unit does not implement this state (offline, logical block dependent).
    #[error("asymmetric access state {0:?} is not supported")]
    Unsupported(AccessState),
}

/// A group of the model, with the STATUS CODE REPORT TARGET PORT GROUPS gives it.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Group {
    group: TargetPortGroup,
    status: u8,
}

/// A unit's ALUA model.
#[derive(Debug, Default)]
pub(super) struct Alua {
    /// Ascending by identifier; empty: the implicit model (see the module).
    groups: Vec<Group>,
    /// Some group is in a state that refuses commands: only then does a command look its
    /// group's state up.
    restricts: bool,
}

impl Alua {
    fn state_of(&self, group: u16) -> AccessState {
        self.groups.iter().find(|g| g.group.id == group).map_or(AccessState::ActiveOptimized, |g| g.group.state)
    }

    fn settle(&mut self) {
        self.restricts = self.groups.iter().any(|g| !g.group.state.is_active());
    }

    /// The ports of every group: two relative target ports or more make a multi-port device.
    pub(super) fn ports(&self) -> usize {
        self.groups.iter().map(|g| g.group.relative_ports.len()).sum()
    }

    /// What refuses a command `c` through a port of `group`: the additional sense code of NOT
    /// READY, or `None` when it is served. Cheap while every group is active.
    /// Whether some group's access state refuses commands.
    pub(super) fn restricts(&self) -> bool {
        self.restricts
    }

    pub(super) fn refusal(&self, group: u16, c: &Cdb) -> Option<AscAscq> {
        if !self.restricts {
            return None;
        }
        // INQUIRY, REPORT LUNS and REQUEST SENSE are served in every state and never get here.
        let always =
            matches!(c, Cdb::Inquiry { .. } | Cdb::ReportLuns { .. } | Cdb::RequestSense { .. } | Cdb::ReportTargetPortGroups { .. });
        match self.state_of(group) {
            AccessState::Standby
                if !(always
                    || matches!(
                        c,
                        Cdb::ModeSense(_) | Cdb::ModeSelect(_) | Cdb::PersistentReserveIn { .. } | Cdb::PersistentReserveOut { .. }
                    )) =>
            {
                Some(AscAscq::LUN_NOT_ACCESSIBLE_STANDBY)
            }
            AccessState::Unavailable if !always => Some(AscAscq::LUN_NOT_ACCESSIBLE_UNAVAILABLE),
            AccessState::Transitioning if !always => Some(AscAscq::LUN_NOT_ACCESSIBLE_TRANSITIONING),
            _ => None,
        }
    }
}

fn check_state(state: AccessState) -> Result<(), AluaError> {
    if state.supported_bit() & SUPPORTED_STATES == 0 { Err(AluaError::Unsupported(state)) } else { Ok(()) }
}

/// Queue ASYMMETRIC ACCESS STATE CHANGED for every nexus.
fn state_changed(s: &mut State) {
    s.unit_attention.values_mut().for_each(|v| v.push(AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED));
    s.ua_queued += s.unit_attention.len();
}

impl LogicalUnit {
    /// Set the unit's ALUA model: every target port group that reaches it (those of this
    /// process and those of peer gateways), each with its ports and state. A group whose state
    /// changes (or that comes or goes) is reported with the status "altered by implicit
    /// behaviour", and every nexus gets ASYMMETRIC ACCESS STATE CHANGED; setting the model it
    /// has changes nothing. An empty list restores the implicit model. Returns whether the
    /// model changed.
    pub fn set_port_groups(&self, groups: Vec<TargetPortGroup>) -> Result<bool, AluaError> {
        let mut groups = groups;
        groups.sort_by_key(|g| g.id);
        let mut ports = Vec::new();
        for (i, g) in groups.iter().enumerate() {
            if i > 0 && groups[i - 1].id == g.id {
                return Err(AluaError::DuplicateGroup(g.id));
            }
            if g.relative_ports.len() > MAX_PORTS_PER_GROUP {
                return Err(AluaError::TooManyPorts(g.id));
            }
            check_state(g.state)?;
            ports.extend(g.relative_ports.iter().copied());
        }
        ports.sort_unstable();
        if let Some(p) = ports.iter().find(|&&p| p == 0).or_else(|| ports.windows(2).find(|w| w[0] == w[1]).map(|w| &w[0])) {
            return Err(AluaError::BadPort(*p));
        }
        let mut s = self.st();
        let old = &s.alua.groups;
        if old.len() == groups.len() && old.iter().zip(&groups).all(|(o, n)| o.group == *n) {
            return Ok(false);
        }
        // The implicit model has every group active/optimized.
        let ao = |g: &TargetPortGroup| g.state == AccessState::ActiveOptimized;
        let state_change = match (old.is_empty(), groups.is_empty()) {
            (true, _) => !groups.iter().all(ao),
            (false, true) => !old.iter().all(|o| ao(&o.group)),
            (false, false) => old.iter().map(|o| (o.group.id, o.group.state)).ne(groups.iter().map(|g| (g.id, g.state))),
        };
        let new: Vec<Group> = groups
            .into_iter()
            .map(|g| {
                let status = match old.iter().find(|o| o.group.id == g.id) {
                    Some(o) if o.group.state == g.state => o.status,
                    Some(_) => status::IMPLICIT,
                    // A group new to the model has no history to tell.
                    None => status::NONE,
                };
                Group { group: g, status }
            })
            .collect();
        s.alua.groups = new;
        s.alua.settle();
        if state_change {
            state_changed(&mut s);
        }
        Ok(true)
    }

    /// The unit's ALUA model (empty: the implicit one).
    pub fn port_groups(&self) -> Vec<TargetPortGroup> {
        self.st().alua.groups.iter().map(|g| g.group.clone()).collect()
    }

    /// The access state of target port group `group` (active/optimized for a group the model
    /// does not know: the implicit model's).
    pub fn access_state(&self, group: u16) -> AccessState {
        self.st().alua.state_of(group)
    }

    /// Put target port group `group` in `state`: when that changes it, every nexus gets
    /// ASYMMETRIC ACCESS STATE CHANGED. Returns whether it changed.
    pub fn set_access_state(&self, group: u16, state: AccessState) -> Result<bool, AluaError> {
        check_state(state)?;
        let mut s = self.st();
        let g = s.alua.groups.iter_mut().find(|g| g.group.id == group).ok_or(AluaError::UnknownGroup(group))?;
        if g.group.state == state {
            return Ok(false);
        }
        g.group.state = state;
        g.status = status::IMPLICIT;
        s.alua.settle();
        state_changed(&mut s);
        Ok(true)
    }

    /// Make target port group `group` the optimized one: active/optimized, and every other
    /// active/optimized group active/non-optimized (groups in other states stay as they are).
    /// When that changes a state, every nexus gets ASYMMETRIC ACCESS STATE CHANGED. Returns
    /// whether it did.
    pub fn set_optimized(&self, group: u16) -> Result<bool, AluaError> {
        let mut s = self.st();
        if !s.alua.groups.iter().any(|g| g.group.id == group) {
            return Err(AluaError::UnknownGroup(group));
        }
        let mut changed = false;
        for g in &mut s.alua.groups {
            let want = if g.group.id == group {
                AccessState::ActiveOptimized
            } else if g.group.state == AccessState::ActiveOptimized {
                AccessState::ActiveNonOptimized
            } else {
                continue;
            };
            if g.group.state != want {
                g.group.state = want;
                g.status = status::IMPLICIT;
                changed = true;
            }
        }
        s.alua.settle();
        if changed {
            state_changed(&mut s);
        }
        Ok(changed)
    }

    /// REPORT TARGET PORT GROUPS: every group of the model (or the implicit one), in the
    /// format asked for (length only, or with the extended header), cut to `alloc` bytes.
    pub(super) fn report_target_port_groups(&self, fmt: u8, alloc: u32, nexus: &Nexus) -> R {
        let implicit_transition_time = match fmt {
            format::LENGTH_ONLY => None,
            // Implicit transitions here are immediate: no time to announce (0: unspecified).
            format::EXTENDED => Some(0),
            _ => return Err(bad_field(1, Some(7))),
        };
        let descriptor = |g: &TargetPortGroup, status| PortGroupDescriptor {
            pref: false,
            state: g.state,
            supported: SUPPORTED_STATES,
            id: g.id,
            status,
            vendor: 0,
            relative_ports: g.relative_ports.clone(),
        };
        let s = self.st();
        let mut groups: Vec<PortGroupDescriptor> = s.alua.groups.iter().map(|g| descriptor(&g.group, g.status)).collect();
        drop(s);
        // The group the command came through is always reported, if only as the implicit one.
        if !groups.iter().any(|g| g.id == nexus.port_group()) {
            let own = TargetPortGroup::new(nexus.port_group(), [nexus.relative_port()], AccessState::ActiveOptimized);
            groups.push(descriptor(&own, status::NONE));
            groups.sort_by_key(|g| g.id);
        }
        Ok(Outcome::good(truncate(TargetPortGroups { implicit_transition_time, groups }.to_bytes(), alloc)))
    }
}
