//! What a target serves and how: the target nodes (their LUNs, ACL views and portal groups) and
//! the server's settings and limits.

use crate::lu::LogicalUnit;
use riser_iscsi::keys::Transport;
use riser_iscsi::login::{TargetLoginConfig, TargetNode};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// Largest LUN number a target maps (SAM's single-level flat addressing, as `Lun` encodes it).
pub const MAX_LUN: u16 = 16383;

/// A network portal: an address and the transport spoken there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Portal {
    /// The address (an unspecified IP, `0.0.0.0` or `::`, stands for every local address).
    pub address: SocketAddr,
    /// iSCSI/TCP or iSER.
    pub transport: Transport,
}

impl Portal {
    /// A portal of `transport` at `address`.
    pub fn new(address: SocketAddr, transport: Transport) -> Self {
        Self { address, transport }
    }

    /// An iSCSI/TCP portal.
    pub fn tcp(address: SocketAddr) -> Self {
        Self::new(address, Transport::Tcp)
    }

    /// An iSER portal.
    pub fn iser(address: SocketAddr) -> Self {
        Self::new(address, Transport::Iser)
    }

    /// Whether a connection of `transport` to local address `local` came in through this
    /// portal.
    pub fn accepts(&self, local: SocketAddr, transport: Transport) -> bool {
        self.transport == transport
            && self.address.port() == local.port()
            && (self.address.ip() == local.ip() || self.address.ip().is_unspecified())
    }

    /// The `TargetAddress` a connection to `local` is told for this portal (`ADDR:PORT`; an
    /// unspecified IP is answered with the one the connection came to).
    pub fn target_address(&self, local: SocketAddr) -> String {
        let ip = if self.address.ip().is_unspecified() { local.ip() } else { self.address.ip() };
        SocketAddr::new(ip, self.address.port()).to_string()
    }
}

/// A portal group of a target node: its iSCSI target portal group (TargetPortalGroupTag), which
/// is one SCSI target port (with its relative port identifier), in an ALUA target port group,
/// reached through its network portals.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortalGroup {
    /// TargetPortalGroupTag (1 to 65535).
    pub tag: u16,
    /// Relative target port identifier of the SCSI target port (1 to 65535; VPD page 0x83).
    /// Gateways exporting one target must give their ports different ones.
    pub relative_port: u16,
    /// The ALUA target port group the port belongs to.
    pub port_group: u16,
    /// Its network portals.
    pub portals: Vec<Portal>,
}

impl PortalGroup {
    /// Group `tag`, whose relative port identifier and target port group are `tag` too.
    pub fn new(tag: u16) -> Self {
        Self { tag, relative_port: tag, port_group: tag, portals: Vec::new() }
    }

    /// With this portal.
    #[must_use]
    pub fn portal(mut self, portal: Portal) -> Self {
        self.portals.push(portal);
        self
    }

    /// With this relative target port identifier.
    #[must_use]
    pub fn relative_port(mut self, id: u16) -> Self {
        self.relative_port = id;
        self
    }

    /// In this ALUA target port group.
    #[must_use]
    pub fn port_group(mut self, id: u16) -> Self {
        self.port_group = id;
        self
    }
}

/// A target node: what login knows of it, its logical units by LUN, what each initiator sees of
/// them, and its portal groups.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Node {
    /// What login knows of the node: name, alias, the ACL (initiators admitted, with CHAP
    /// credentials of their own), CHAP.
    pub target: TargetNode,
    /// Logical units by LUN number (0 to [`MAX_LUN`]). One unit may sit under several numbers,
    /// and in several targets.
    pub luns: BTreeMap<u16, Arc<LogicalUnit>>,
    /// What an initiator sees, by initiator name in lower case: its LUN number → the target's
    /// LUN number. An initiator named here sees only these (as LIO's mapped LUNs); the others see
    /// every LUN under its own number.
    pub lun_maps: BTreeMap<String, BTreeMap<u16, u16>>,
    /// Portal groups. Empty: one group, TargetPortalGroupTag `TargetConfig::login`'s
    /// `portal_group_tag`, relative port and target port group 1, reached through every portal
    /// the target serves.
    pub portal_groups: Vec<PortalGroup>,
}

impl Node {
    /// A node named `name`, open to every initiator, without authentication, logical units or
    /// portal groups of its own.
    pub fn new(name: impl Into<String>) -> Self {
        Self::from(TargetNode::open(name))
    }

    /// Add a logical unit under the LUN after the highest in use (0 for the first).
    #[must_use]
    pub fn lun(mut self, lu: Arc<LogicalUnit>) -> Self {
        let next = self.luns.keys().next_back().map_or(0, |n| n + 1);
        self.luns.insert(next, lu);
        self
    }

    /// Add a logical unit under LUN `lun` (replacing the one there).
    #[must_use]
    pub fn lun_at(mut self, lun: u16, lu: Arc<LogicalUnit>) -> Self {
        self.luns.insert(lun, lu);
        self
    }

    /// These logical units, under LUNs 0, 1, 2, ...
    #[must_use]
    pub fn luns(mut self, luns: Vec<Arc<LogicalUnit>>) -> Self {
        self.luns = luns.into_iter().enumerate().map(|(i, lu)| (i as u16, lu)).collect();
        self
    }

    /// Show `initiator` only these LUNs, under these numbers (its LUN → the target's).
    #[must_use]
    pub fn lun_map(mut self, initiator: &str, map: impl IntoIterator<Item = (u16, u16)>) -> Self {
        self.lun_maps.insert(initiator.to_ascii_lowercase(), map.into_iter().collect());
        self
    }

    /// With this portal group.
    #[must_use]
    pub fn portal_group(mut self, group: PortalGroup) -> Self {
        self.portal_groups.push(group);
        self
    }

    /// What `initiator` sees: (its LUN number, the target's, the unit), ascending.
    pub fn view_of(&self, initiator: &str) -> Vec<(u16, u16, Arc<LogicalUnit>)> {
        match self.lun_maps.get(&initiator.to_ascii_lowercase()) {
            Some(map) => map.iter().filter_map(|(&seen, &lun)| self.luns.get(&lun).map(|lu| (seen, lun, lu.clone()))).collect(),
            None => self.luns.iter().map(|(&lun, lu)| (lun, lun, lu.clone())).collect(),
        }
    }
}

impl From<TargetNode> for Node {
    /// This target node, without logical units or portal groups of its own.
    fn from(target: TargetNode) -> Self {
        Self { target, luns: BTreeMap::new(), lun_maps: BTreeMap::new(), portal_groups: Vec::new() }
    }
}

/// Server configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TargetConfig {
    /// The target nodes the server starts with (changed live with the methods of
    /// [`super::Target`]).
    pub nodes: Vec<Node>,
    /// The portals' login settings: operational limits offered to initiators, the
    /// TargetPortalGroupTag of nodes without portal groups, login timeout, discovery CHAP, CHAP
    /// algorithms. Its `targets` and `transport` are filled per connection (from the nodes
    /// reached through the portal and the portal's transport): what is put there is ignored.
    pub login: TargetLoginConfig,
    /// Commands per session the CmdSN window admits.
    pub queue_depth: u32,
    /// After this long without a PDU from the initiator the target pings it with a NOP-In;
    /// `None` disables the keepalive.
    pub nop_interval: Option<Duration>,
    /// A ping unanswered for this long drops the connection.
    pub nop_timeout: Duration,
    /// Connections (and so sessions: one connection each) the target serves at once, over all
    /// portals. Past it a new connection is closed at once (TCP) or refused (iSER).
    pub max_connections: usize,
    /// Immediate SCSI commands (outside the CmdSN window) a session may have in flight; past it
    /// they get a Reject (Immediate Command Reject, RFC 7143 §11.17.1).
    pub max_immediate_commands: u32,
    /// Bytes of command data (write data collected, read data produced) a session may hold at
    /// once; further commands wait for room before their memory is taken.
    pub max_session_bytes: u64,
    /// Bytes of command data all sessions together may hold at once; a command waits for room
    /// in its session's budget, then in this one. Bounds the memory of the whole target where
    /// `max_connections × max_session_bytes` would not.
    pub max_target_bytes: u64,
    /// A response or data the transport has not taken within this long (a peer that stopped
    /// reading) ends the connection.
    pub send_timeout: Duration,
    /// Write data the target asked for (or the initiator announced) must arrive within this long,
    /// or the command ends with CHECK CONDITION; a PDU's data segment must arrive within it once
    /// its header has, or the connection ends.
    pub data_timeout: Duration,
    /// iSER: accept unsolicited Data-Out (InitialR2T=No as negotiated by `login.operational`).
    /// Every Send needs a receive posted in advance, and an initiator may send FirstBurstLength of
    /// unsolicited data per command in receive-sized pieces (Linux: 256 KiB in 8 KiB Sends, 33
    /// receives per command), so allowing it costs `queue_depth × (1 + FirstBurstLength / receive
    /// size)` receives per connection. Off by default: iSER connections answer InitialR2T=Yes, as
    /// LIO does, and the target RDMA Reads everything beyond the immediate data (one receive per
    /// command).
    pub iser_unsolicited_data: bool,
    /// iSER: threads kept to run the connections, each a single-threaded runtime of its own; a
    /// new connection goes to one that has none, else to a thread of its own that ends with it
    /// (at most [`TargetConfig::max_connections`] such at once; beyond, the kept thread with
    /// the fewest), and all of its tasks (the software RNIC's engines, the datamover's
    /// driver, the session, its commands) stay there. `0` (the default): connections run on
    /// the runtime [`super::Target::serve_iser`] runs on.
    ///
    /// Spread over a work-stealing runtime's workers, a connection's tasks hand every message
    /// across threads. On the development VM (2 cores, software RNIC, QD 8) two threads took
    /// four sessions' 256 KiB writes from 2,013 to 2,429 MiB/s (medians of 3 interleaved runs)
    /// and iSER from 0.76–0.79× TCP's throughput to 0.88–0.92× there. Large reads moved to the
    /// runtime `serve_iser` runs on (to copy on another core) cost four sessions' 256 KiB reads
    /// about a fifth of their rate (3,865–4,495 against 4,670–5,242 MiB/s) and gained one
    /// session nothing measurable; large writes moved there cost the target CPU and four
    /// sessions' 256 KiB writes 8 %: nothing moves. Two
    /// connections sharing a thread queue each hand-off behind the other's tasks: a thread
    /// each for four sessions on two kept threads took their 4 KiB reads 1.10× as fast
    /// (eight sessions 1.16×, four sessions' 256 KiB reads 1.09×; 64 KiB writes unchanged;
    /// medians of interleaved runs). The kept threads start with the first iSER portal; all
    /// stop when the [`super::Target`] is dropped.
    #[cfg(feature = "iser")]
    #[cfg_attr(docsrs, doc(cfg(feature = "iser")))]
    pub iser_threads: usize,
    /// TCP: busy polling ([`riser_tcp::SocketOptions::busy_poll`]): a connection whose socket
    /// runs dry keeps looking for the next PDU this long before it sleeps. Lower latency at low
    /// queue depth, for CPU while waiting (up to this much per time a connection goes idle);
    /// `None` (the default): sleep at once.
    #[cfg(feature = "tcp")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tcp")))]
    pub busy_poll: Option<Duration>,
    /// Which targets SendTargets lists on a discovery session.
    pub discovery_scope: DiscoveryScope,
    /// The time an initiator asked to log out (by [`super::Target::logout_session`] or
    /// [`super::Target::drain`]) is given before its connection is dropped.
    pub logout_timeout: Duration,
}

/// Which targets a discovery session's SendTargets lists.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DiscoveryScope {
    /// Only the targets whose ACL admits the initiator's name (as tgt, and LIO with
    /// `demo_mode_discovery=0`). The name is the one the initiator claims: require discovery
    /// CHAP where that matters.
    #[default]
    Permitted,
    /// Every target, including those the initiator may not log in to (LIO's default,
    /// `demo_mode_discovery=1`).
    All,
}

/// Default of [`TargetConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

impl Default for TargetConfig {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            login: TargetLoginConfig::default(),
            queue_depth: 128,
            nop_interval: Some(Duration::from_secs(10)),
            nop_timeout: Duration::from_secs(15),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_immediate_commands: 16,
            max_session_bytes: 256 << 20,
            max_target_bytes: 2 << 30,
            send_timeout: Duration::from_secs(30),
            data_timeout: Duration::from_secs(30),
            iser_unsolicited_data: false,
            #[cfg(feature = "iser")]
            iser_threads: 0,
            #[cfg(feature = "tcp")]
            busy_poll: None,
            discovery_scope: DiscoveryScope::Permitted,
            logout_timeout: Duration::from_secs(10),
        }
    }
}

impl TargetConfig {
    /// Add a target node.
    #[must_use]
    pub fn node(mut self, node: Node) -> Self {
        self.nodes.push(node);
        self
    }

    /// These login settings (their `targets` and `transport` are ignored: see the field).
    #[must_use]
    pub fn login(mut self, login: TargetLoginConfig) -> Self {
        self.login = login;
        self
    }

    /// Commands per session the CmdSN window admits.
    #[must_use]
    pub fn queue_depth(mut self, depth: u32) -> Self {
        self.queue_depth = depth;
        self
    }

    /// Keepalive interval (`None`: no keepalive).
    #[must_use]
    pub fn nop_interval(mut self, interval: Option<Duration>) -> Self {
        self.nop_interval = interval;
        self
    }

    /// Connections served at once.
    #[must_use]
    pub fn max_connections(mut self, n: usize) -> Self {
        self.max_connections = n;
        self
    }

    /// Bytes of command data a session may hold at once.
    #[must_use]
    pub fn max_session_bytes(mut self, bytes: u64) -> Self {
        self.max_session_bytes = bytes;
        self
    }

    /// Bytes of command data all sessions together may hold at once.
    #[must_use]
    pub fn max_target_bytes(mut self, bytes: u64) -> Self {
        self.max_target_bytes = bytes;
        self
    }

    /// Time allowed for write data and data segments to arrive.
    #[must_use]
    pub fn data_timeout(mut self, timeout: Duration) -> Self {
        self.data_timeout = timeout;
        self
    }

    /// iSER: accept unsolicited Data-Out (see the field).
    #[must_use]
    pub fn iser_unsolicited_data(mut self, yes: bool) -> Self {
        self.iser_unsolicited_data = yes;
        self
    }

    /// iSER: the threads kept for connections to run on (see the field; `0`: the portal's
    /// runtime).
    #[cfg(feature = "iser")]
    #[cfg_attr(docsrs, doc(cfg(feature = "iser")))]
    #[must_use]
    pub fn iser_threads(mut self, threads: usize) -> Self {
        self.iser_threads = threads;
        self
    }

    /// TCP: busy polling (see the field).
    #[cfg(feature = "tcp")]
    #[cfg_attr(docsrs, doc(cfg(feature = "tcp")))]
    #[must_use]
    pub fn busy_poll(mut self, budget: Option<Duration>) -> Self {
        self.busy_poll = budget;
        self
    }

    /// Which targets SendTargets lists on a discovery session.
    #[must_use]
    pub fn discovery_scope(mut self, scope: DiscoveryScope) -> Self {
        self.discovery_scope = scope;
        self
    }

    /// Time given to an initiator asked to log out.
    #[must_use]
    pub fn logout_timeout(mut self, timeout: Duration) -> Self {
        self.logout_timeout = timeout;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RamBackend;
    use crate::lu::LuIdentity;

    #[test]
    fn portals_match_their_own_and_wildcard_addresses() {
        let p = Portal::tcp("10.0.0.1:3260".parse().unwrap());
        assert!(p.accepts("10.0.0.1:3260".parse().unwrap(), Transport::Tcp));
        assert!(!p.accepts("10.0.0.2:3260".parse().unwrap(), Transport::Tcp));
        assert!(!p.accepts("10.0.0.1:3260".parse().unwrap(), Transport::Iser));
        let any = Portal::iser("0.0.0.0:3262".parse().unwrap());
        assert!(any.accepts("192.0.2.7:3262".parse().unwrap(), Transport::Iser));
        assert!(!any.accepts("192.0.2.7:3260".parse().unwrap(), Transport::Iser));
        assert_eq!(any.target_address("192.0.2.7:3262".parse().unwrap()), "192.0.2.7:3262");
        assert_eq!(Portal::tcp("[::1]:3260".parse().unwrap()).target_address("[::1]:3260".parse().unwrap()), "[::1]:3260");
    }

    #[test]
    fn an_initiator_with_a_map_sees_only_its_luns_under_its_numbers() {
        let lu = |_| Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random()));
        let (a, b, c) = (lu(0), lu(1), lu(2));
        let n = Node::new("iqn.2026-11.io.riser:t")
            .lun(a.clone())
            .lun(b.clone())
            .lun_at(7, c.clone())
            .lun_map("IQN.2026-11.io.riser:I", [(0, 7), (1, 0), (2, 5)]);
        let all: Vec<_> = n.view_of("iqn.2026-11.io.riser:other").into_iter().map(|(s, l, _)| (s, l)).collect();
        assert_eq!(all, vec![(0, 0), (1, 1), (7, 7)]);
        let mine = n.view_of("iqn.2026-11.io.riser:i");
        assert_eq!(
            mine.iter().map(|(s, l, _)| (*s, *l)).collect::<Vec<_>>(),
            vec![(0, 7), (1, 0)],
            "a mapped LUN the target lacks is not shown"
        );
        assert!(Arc::ptr_eq(&mine[0].2, &c) && Arc::ptr_eq(&mine[1].2, &a));
        assert_eq!(Node::new("t").luns(vec![a, b]).luns.keys().copied().collect::<Vec<_>>(), vec![0, 1]);
    }
}
