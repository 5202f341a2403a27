//! Changes to a running target, and what can be seen of it: target nodes, LUNs, ACL entries and
//! portals added and removed while initiators are connected; the session list; asking a session
//! to log out; draining before a stop; the statistics.
//!
//! Every change copies the node list, changes the copy and publishes it whole (see `view` for
//! how sessions pick it up). Changes are made one at a time. A change a session must feel now
//! waits for it: removing a LUN answers once no command runs there any more; removing an ACL
//! entry or a target ends the sessions it admitted first.

use super::config::{MAX_LUN, Node, Portal, PortalGroup};
use super::session::Session;
use super::session::{BUDGET_UNIT, units_of};
use super::stats::{LunStats, Stats};
use super::{Target, lock};
use crate::lu::LogicalUnit;
use riser_iscsi::keys::Transport;
use riser_iscsi::login::AclEntry;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;
use tracing::{info, warn};

/// Why a change was refused. Nothing changed.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChangeError {
    /// No target node of that name.
    #[error("no target named {0}")]
    NoSuchTarget(String),
    /// A target node of that name exists.
    #[error("a target named {0} exists already")]
    TargetExists(String),
    /// Not an iSCSI name.
    #[error("{0:?} is not an iSCSI name (iqn., eui. or naa.)")]
    BadName(String),
    /// The target has no such LUN.
    #[error("target {target} has no LUN {lun}")]
    NoSuchLun {
        /// The target.
        target: String,
        /// The LUN.
        lun: u32,
    },
    /// The target has that LUN already.
    #[error("target {target} has a LUN {lun} already")]
    LunExists {
        /// The target.
        target: String,
        /// The LUN.
        lun: u16,
    },
    /// A LUN number beyond [`MAX_LUN`].
    #[error("LUN {0} is out of range (0 to {MAX_LUN})")]
    LunOutOfRange(u32),
    /// Another unit has the same identity (the same UUID, or the same NAA designator): hosts
    /// would take the two for one disk.
    #[error("unit {new} has the identity of unit {exported}, which is exported already (same UUID or NAA)")]
    IdentityClash {
        /// The unit being added.
        new: String,
        /// The unit exported already.
        exported: String,
    },
    /// The target has no ACL entry for the initiator.
    #[error("target {target} has no ACL entry for {initiator}")]
    NoSuchAcl {
        /// The target.
        target: String,
        /// The initiator.
        initiator: String,
    },
    /// The target has that portal already.
    #[error("target {target} has portal {portal} already")]
    PortalExists {
        /// The target.
        target: String,
        /// The portal (`ADDR:PORT/transport`).
        portal: String,
    },
    /// The target has no such portal.
    #[error("target {target} has no portal {portal}")]
    NoSuchPortal {
        /// The target.
        target: String,
        /// The portal (`ADDR:PORT/transport`).
        portal: String,
    },
    /// No session with that TSIH.
    #[error("no session with TSIH {0}")]
    NoSuchSession(u16),
    /// A value out of its range.
    #[error("{0}")]
    Invalid(String),
}

/// A session as [`Target::sessions`] lists it. No secret is in it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SessionInfo {
    /// Target Session Identifying Handle.
    pub tsih: u16,
    /// The initiator's name.
    pub initiator: String,
    /// The initiator's session ID, as hexadecimal.
    pub isid: String,
    /// The target's name; `None` for a discovery session.
    pub target: Option<String>,
    /// The local address the connection came to.
    pub portal: SocketAddr,
    /// The initiator's address.
    pub peer: SocketAddr,
    /// TCP or iSER.
    pub transport: Transport,
    /// The negotiated keys and their values, as text.
    pub keys: Vec<(&'static str, String)>,
    /// Commands in flight.
    pub commands: usize,
    /// The target asked the initiator to log out.
    pub logout_requested: bool,
    /// What the session did, per LUN of the target.
    pub luns: BTreeMap<u16, LunStats>,
}

/// Whether `name` has the form of an iSCSI name.
fn iscsi_name(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    (lower.starts_with("iqn.") || lower.starts_with("eui.") || lower.starts_with("naa."))
        && name.len() <= 223
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b".-:".contains(&b))
}

fn portal_text(p: &Portal) -> String {
    format!("{}/{}", p.address, if p.transport == Transport::Iser { "iser" } else { "tcp" })
}

impl Target {
    /// The target nodes now.
    pub fn nodes(&self) -> Vec<Arc<Node>> {
        self.registry.snapshot().1.to_vec()
    }

    /// The target node named `name` (without regard to case).
    pub fn node(&self, name: &str) -> Option<Arc<Node>> {
        self.registry.snapshot().1.iter().find(|n| n.target.name.eq_ignore_ascii_case(name)).cloned()
    }

    /// Change a copy of the node list with `f` and publish it (nothing is published if `f`
    /// refuses). The caller holds `changes`.
    fn publish_with<R>(&self, f: impl FnOnce(&mut Vec<Node>) -> Result<R, ChangeError>) -> Result<R, ChangeError> {
        let (_, nodes) = self.registry.snapshot();
        let mut copy: Vec<Node> = nodes.iter().map(|n| Node::clone(n)).collect();
        let r = f(&mut copy)?;
        self.registry.publish(copy.into_iter().map(Arc::new).collect(), &self.me);
        Ok(r)
    }

    /// A unit may join the exported ones unless another unit has its identity.
    fn check_identity(nodes: &[Node], lu: &Arc<LogicalUnit>) -> Result<(), ChangeError> {
        let id = lu.identity();
        for other in nodes.iter().flat_map(|n| n.luns.values()) {
            let o = other.identity();
            if !Arc::ptr_eq(other, lu) && (o.uuid() == id.uuid() || o.naa() == id.naa()) {
                return Err(ChangeError::IdentityClash { new: id.to_string(), exported: o.to_string() });
            }
        }
        Ok(())
    }

    fn node_mut<'a>(nodes: &'a mut [Node], name: &str) -> Result<&'a mut Node, ChangeError> {
        nodes.iter_mut().find(|n| n.target.name.eq_ignore_ascii_case(name)).ok_or_else(|| ChangeError::NoSuchTarget(name.into()))
    }

    /// Serve a new target node (its LUNs, ACL and portal groups as given).
    pub async fn add_node(&self, node: Node) -> Result<(), ChangeError> {
        let _one = self.changes.lock().await;
        if !iscsi_name(&node.target.name) {
            return Err(ChangeError::BadName(node.target.name.clone()));
        }
        if let Some(&n) = node.luns.keys().find(|&&n| n > MAX_LUN) {
            return Err(ChangeError::LunOutOfRange(n.into()));
        }
        self.publish_with(|nodes| {
            if nodes.iter().any(|n| n.target.name.eq_ignore_ascii_case(&node.target.name)) {
                return Err(ChangeError::TargetExists(node.target.name.clone()));
            }
            for lu in node.luns.values() {
                Self::check_identity(nodes, lu)?;
            }
            info!(target = %node.target.name, luns = node.luns.len(), "target added");
            nodes.push(node);
            Ok(())
        })
    }

    /// Stop serving a target node: its sessions end first (their commands in flight end with
    /// them), then it is gone.
    pub async fn remove_node(&self, name: &str) -> Result<Node, ChangeError> {
        let _one = self.changes.lock().await;
        let removed = self.publish_with(|nodes| {
            let i = nodes
                .iter()
                .position(|n| n.target.name.eq_ignore_ascii_case(name))
                .ok_or_else(|| ChangeError::NoSuchTarget(name.into()))?;
            Ok(nodes.remove(i))
        })?;
        self.end_sessions(|s| !s.is_discovery() && s.target_name().eq_ignore_ascii_case(name)).await;
        info!(target = %name, "target removed");
        Ok(removed)
    }

    /// Map `lu` under LUN `lun` of `target`. Initiators that see it get REPORTED LUNS DATA HAS
    /// CHANGED at their next command.
    pub async fn add_lun(&self, target: &str, lun: u16, lu: Arc<LogicalUnit>) -> Result<(), ChangeError> {
        let _one = self.changes.lock().await;
        if lun > MAX_LUN {
            return Err(ChangeError::LunOutOfRange(lun.into()));
        }
        self.publish_with(|nodes| {
            Self::check_identity(nodes, &lu)?;
            let n = Self::node_mut(nodes, target)?;
            if n.luns.contains_key(&lun) {
                return Err(ChangeError::LunExists { target: n.target.name.clone(), lun });
            }
            info!(target = %n.target.name, lun, unit = %lu.identity(), "LUN added");
            n.luns.insert(lun, lu);
            Ok(())
        })
    }

    /// Unmap LUN `lun` of `target` (and from every initiator's LUN map there). Answers once no
    /// command runs on it any more: nothing is written through it afterwards, and later commands
    /// get LOGICAL UNIT NOT SUPPORTED. Initiators that saw it get REPORTED LUNS DATA HAS CHANGED.
    pub async fn remove_lun(&self, target: &str, lun: u16) -> Result<Arc<LogicalUnit>, ChangeError> {
        let _one = self.changes.lock().await;
        let (name, lu) = self.publish_with(|nodes| {
            let n = Self::node_mut(nodes, target)?;
            let lu = n.luns.remove(&lun).ok_or_else(|| ChangeError::NoSuchLun { target: n.target.name.clone(), lun: lun.into() })?;
            for map in n.lun_maps.values_mut() {
                map.retain(|_, l| *l != lun);
            }
            Ok((n.target.name.clone(), lu))
        })?;
        // Published: a command that enters the unit's path from now on sees the new generation
        // and finds no LUN; those that entered before are waited for.
        let sessions: Vec<Arc<Session>> =
            lock(&self.live).values().filter(|s| s.target_name().eq_ignore_ascii_case(&name)).cloned().collect();
        for s in sessions {
            for p in s.paths().into_iter().filter(|p| p.lun == lun && Arc::ptr_eq(&p.lu, &lu)) {
                p.idle().await;
            }
        }
        // Nor through EXTENDED COPY run by another unit (unless it is still exported elsewhere).
        if !self.nodes().iter().any(|n| n.luns.values().any(|l| Arc::ptr_eq(l, &lu))) {
            lu.copies_done().await;
        }
        info!(target = %name, lun, unit = %lu.identity(), "LUN removed");
        Ok(lu)
    }

    /// Admit `entry`'s initiator to `target` (replacing its entry if it has one), with its own
    /// CHAP credentials if the entry has some, and, with `luns`, only these LUNs under these
    /// numbers (its LUN → the target's; `None`: every LUN under its own number). Credentials
    /// apply from the initiator's next login; a new LUN map at once. Whether the node is open to
    /// every initiator stays as it was (change it with [`Target::update_node`]).
    pub async fn set_acl(&self, target: &str, entry: AclEntry, luns: Option<BTreeMap<u16, u16>>) -> Result<(), ChangeError> {
        let _one = self.changes.lock().await;
        if !iscsi_name(&entry.initiator) {
            return Err(ChangeError::BadName(entry.initiator.clone()));
        }
        self.publish_with(|nodes| {
            let n = Self::node_mut(nodes, target)?;
            let key = entry.initiator.to_ascii_lowercase();
            match luns {
                Some(map) => {
                    if let Some((&seen, _)) = map.iter().find(|&(&seen, _)| seen > MAX_LUN) {
                        return Err(ChangeError::LunOutOfRange(seen.into()));
                    }
                    if let Some(&lun) = map.values().find(|l| !n.luns.contains_key(l)) {
                        return Err(ChangeError::NoSuchLun { target: n.target.name.clone(), lun: lun.into() });
                    }
                    n.lun_maps.insert(key, map);
                }
                None => {
                    n.lun_maps.remove(&key);
                }
            }
            info!(target = %n.target.name, initiator = %entry.initiator, chap = entry.chap.is_some(), "ACL entry set");
            let open = n.target.open;
            n.target = n.target.clone().acl_entry(entry);
            n.target.open = open;
            Ok(())
        })
    }

    /// Remove `initiator`'s ACL entry (and LUN map) from `target` and end its sessions there, as
    /// LIO does. The node stays closed to it unless the node is open to everyone.
    pub async fn remove_acl(&self, target: &str, initiator: &str) -> Result<(), ChangeError> {
        let _one = self.changes.lock().await;
        let name = self.publish_with(|nodes| {
            let n = Self::node_mut(nodes, target)?;
            let before = n.target.acl.len();
            n.target.acl.retain(|e| !e.admits(initiator));
            if n.target.acl.len() == before {
                return Err(ChangeError::NoSuchAcl { target: n.target.name.clone(), initiator: initiator.into() });
            }
            n.lun_maps.remove(&initiator.to_ascii_lowercase());
            Ok(n.target.name.clone())
        })?;
        self.end_sessions(|s| {
            !s.is_discovery() && s.target_name().eq_ignore_ascii_case(&name) && s.initiator_name().eq_ignore_ascii_case(initiator)
        })
        .await;
        info!(target = %name, %initiator, "ACL entry removed");
        Ok(())
    }

    /// Change a node in place with `f` (alias, CHAP, whether it is open...): it applies from
    /// the next login; what sessions see (LUNs, maps) at once.
    pub async fn update_node(&self, target: &str, f: impl FnOnce(&mut Node) -> Result<(), ChangeError>) -> Result<(), ChangeError> {
        let _one = self.changes.lock().await;
        self.publish_with(|nodes| {
            let n = Self::node_mut(nodes, target)?;
            let mut copy = n.clone();
            f(&mut copy)?;
            if let Some(&l) = copy.luns.keys().find(|&&l| l > MAX_LUN) {
                return Err(ChangeError::LunOutOfRange(l.into()));
            }
            *n = copy;
            Ok(())
        })
    }

    /// Reach `target` through `portal` too, in its portal group `tag` (made if it has none).
    /// The caller listens there (the target only says who is reached through which portal).
    pub async fn add_portal(&self, target: &str, tag: u16, portal: Portal) -> Result<(), ChangeError> {
        if tag == 0 {
            return Err(ChangeError::Invalid("portal group tags are 1 to 65535".into()));
        }
        let _one = self.changes.lock().await;
        self.publish_with(|nodes| {
            let n = Self::node_mut(nodes, target)?;
            if n.portal_groups.iter().any(|g| g.portals.contains(&portal)) {
                return Err(ChangeError::PortalExists { target: n.target.name.clone(), portal: portal_text(&portal) });
            }
            match n.portal_groups.iter_mut().find(|g| g.tag == tag) {
                Some(g) => g.portals.push(portal),
                None => n.portal_groups.push(PortalGroup::new(tag).portal(portal)),
            }
            Ok(())
        })
    }

    /// Stop reaching `target` through `portal` (sessions that came in through it go on).
    pub async fn remove_portal(&self, target: &str, portal: Portal) -> Result<(), ChangeError> {
        let _one = self.changes.lock().await;
        self.publish_with(|nodes| {
            let n = Self::node_mut(nodes, target)?;
            let g = n
                .portal_groups
                .iter_mut()
                .find(|g| g.portals.contains(&portal))
                .ok_or_else(|| ChangeError::NoSuchPortal { target: n.target.name.clone(), portal: portal_text(&portal) })?;
            g.portals.retain(|p| *p != portal);
            Ok(())
        })
    }

    /// End the connections of the sessions `which` picks, and wait until they are over.
    async fn end_sessions(&self, which: impl Fn(&Session) -> bool) {
        let ending: Vec<Arc<Session>> = lock(&self.live).values().filter(|s| which(s)).cloned().collect();
        for s in &ending {
            info!(tsih = s.tsih(), initiator = %s.initiator_name(), "ending the session");
            s.dm.terminate();
        }
        for s in ending {
            s.ended.wait().await;
        }
    }

    /// The sessions in full feature phase now (discovery ones too), by TSIH.
    pub fn sessions(&self) -> Vec<SessionInfo> {
        let live: Vec<Arc<Session>> = lock(&self.live).values().cloned().collect();
        let mut out: Vec<SessionInfo> = live.iter().map(|s| s.info()).collect();
        out.sort_by_key(|s| s.tsih);
        out
    }

    /// Ask session `tsih` to log out (an Asynchronous Message); its connection is dropped if it
    /// has not logged out within [`super::TargetConfig::logout_timeout`]. Answers once asked.
    pub async fn logout_session(self: &Arc<Self>, tsih: u16) -> Result<(), ChangeError> {
        let s = lock(&self.live).get(&tsih).cloned().ok_or(ChangeError::NoSuchSession(tsih))?;
        self.ask_logout(s).await;
        Ok(())
    }

    async fn ask_logout(self: &Arc<Self>, s: Arc<Session>) {
        let within = self.config.logout_timeout;
        info!(tsih = s.tsih(), initiator = %s.initiator_name(), ?within, "asking the initiator to log out");
        s.request_logout(within).await;
        tokio::spawn(async move {
            if tokio::time::timeout(within + Duration::from_millis(500), s.ended.wait()).await.is_err() {
                warn!(tsih = s.tsih(), initiator = %s.initiator_name(), "no logout in time: dropping the connection");
                s.dm.terminate();
            }
        });
    }

    /// Before a stop (the caller has stopped accepting connections): ask every session to log
    /// out, wait up to `within` for them to go (their commands in flight end first), then drop
    /// the connections left and wait for their backend I/O. Returns how many had to be dropped.
    pub async fn drain(self: &Arc<Self>, within: Duration) -> usize {
        let sessions: Vec<Arc<Session>> = lock(&self.live).values().cloned().collect();
        for s in &sessions {
            s.request_logout(within).await;
        }
        let gone = async {
            for s in &sessions {
                s.ended.wait().await;
            }
        };
        if tokio::time::timeout(within, gone).await.is_ok() {
            return 0;
        }
        let left: Vec<Arc<Session>> = sessions.into_iter().filter(|s| lock(&self.live).contains_key(&s.tsih())).collect();
        for s in &left {
            warn!(tsih = s.tsih(), initiator = %s.initiator_name(), "no logout before the stop: dropping the connection");
            s.dm.terminate();
        }
        for s in &left {
            s.ended.wait().await;
        }
        left.len()
    }

    /// Every statistic, summed now.
    pub fn stats(&self) -> Stats {
        // Lock order: sessions, totals, then each session's paths (as sessions retire).
        let live = lock(&self.live);
        let mut luns = lock(&self.retired).clone();
        let mut sessions = BTreeMap::new();
        let mut discovery_sessions = 0;
        for s in live.values() {
            if s.is_discovery() {
                discovery_sessions += 1;
                continue;
            }
            *sessions.entry(s.target_name().to_string()).or_insert(0) += 1;
            for p in s.paths() {
                luns.entry((s.target_name().to_string(), p.lun)).or_default().add(&p.counters.snapshot());
            }
        }
        drop(live);
        let limit = u64::from(units_of(self.config.max_target_bytes));
        let held = limit.saturating_sub(self.budget.available_permits() as u64);
        Stats {
            luns,
            sessions,
            discovery_sessions,
            tcp_connections: self.counters.connections[0].load(Relaxed),
            iser_connections: self.counters.connections[1].load(Relaxed),
            logins: self.counters.logins.load(Relaxed),
            login_failures: std::array::from_fn(|i| self.counters.login_failures[i].load(Relaxed)),
            data_bytes: held * BUDGET_UNIT,
            data_limit_bytes: limit * BUDGET_UNIT,
        }
    }
}

impl Session {
    /// What [`Target::sessions`] shows of the session.
    pub(super) fn info(&self) -> SessionInfo {
        let p = self.params();
        let yes = |b: bool| if b { "Yes" } else { "No" }.to_string();
        let mut keys = vec![
            ("HeaderDigest", p.header_digest.as_str().to_string()),
            ("DataDigest", p.data_digest.as_str().to_string()),
            ("InitialR2T", yes(p.initial_r2t)),
            ("ImmediateData", yes(p.immediate_data)),
            ("MaxBurstLength", p.max_burst_length.to_string()),
            ("FirstBurstLength", p.first_burst_length.to_string()),
            ("MaxOutstandingR2T", p.max_outstanding_r2t.to_string()),
            ("DataPDUInOrder", yes(p.data_pdu_in_order)),
            ("DataSequenceInOrder", yes(p.data_sequence_in_order)),
            ("ErrorRecoveryLevel", p.error_recovery_level.to_string()),
            ("DefaultTime2Wait", p.default_time2wait.to_string()),
            ("DefaultTime2Retain", p.default_time2retain.to_string()),
            ("MaxConnections", p.max_connections.to_string()),
        ];
        if p.rdma_extensions {
            keys.push(("RDMAExtensions", "Yes".into()));
            keys.push(("InitiatorRecvDataSegmentLength", p.initiator_recv_data_segment_length.to_string()));
            keys.push(("TargetRecvDataSegmentLength", p.target_recv_data_segment_length.to_string()));
        } else {
            // Each side's MaxRecvDataSegmentLength: what it receives.
            keys.push(("MaxRecvDataSegmentLength (initiator)", p.initiator_recv_data_segment_length.to_string()));
            keys.push(("MaxRecvDataSegmentLength (target)", p.target_recv_data_segment_length.to_string()));
        }
        let mut luns = BTreeMap::<u16, LunStats>::new();
        for path in self.paths() {
            luns.entry(path.lun).or_default().add(&path.counters.snapshot());
        }
        let core = lock(&self.core);
        SessionInfo {
            tsih: self.tsih(),
            initiator: self.initiator_name().to_string(),
            isid: self.isid().0.iter().map(|b| format!("{b:02x}")).collect(),
            target: (!self.is_discovery()).then(|| self.target_name().to_string()),
            portal: self.at.local,
            peer: self.at.peer,
            transport: self.at.transport,
            keys,
            commands: core.tasks(),
            logout_requested: core.logout_requested(),
            luns,
        }
    }

    /// Ask the initiator to log out within `within` (the Asynchronous Message leaves now).
    pub(super) async fn request_logout(&self, within: Duration) {
        let now = self.now();
        lock(&self.core).request_logout(now, within);
        self.flush().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iscsi_names_are_checked_for_form() {
        for good in ["iqn.2026-11.io.riser:t0", "eui.0123456789ABCDEF", "naa.52004567BA64678D", "IQN.2026-11.io.riser:T-0.a"] {
            assert!(iscsi_name(good), "{good}");
        }
        for bad in ["", "target0", "iqn.2026-11.io.riser:t 0", "iqn.x/y", &format!("iqn.{}", "a".repeat(230))] {
            assert!(!iscsi_name(bad), "{bad}");
        }
    }
}
