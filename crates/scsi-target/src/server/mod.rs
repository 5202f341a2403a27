//! The iSCSI target server: portals, login, discovery, and the full feature phase of each
//! session (command window, data transfer through the datamover, task management, logout).
//!
//! `mod.rs`: configuration, portals, login and session registration; [`session`]: the
//! driver of a session's full feature phase around riser-iscsi's `TargetSession`; `command`:
//! the SCSI command path.

mod command;
#[cfg(feature = "iser")]
mod iser;
mod session;
#[cfg(feature = "tcp")]
mod tcp;

use session::{Session, units_of};

use crate::lu::LogicalUnit;
use riser_datamover::{ConnectionResources, ControlPdu, DmEvent, SharedDatamover};
use riser_iscsi::keys::{SessionType, Transport};
use riser_iscsi::login::{TargetLogin, TargetLoginEvent, TargetLoginParams};
pub use riser_iscsi::login::{TargetLoginConfig, TargetNode};
use riser_iscsi::wire::*;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};

/// A target node served by the portal.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Node {
    /// What login knows of the node: name, alias, initiators allowed, CHAP.
    pub target: TargetNode,
    /// Logical units, in LUN order.
    pub luns: Vec<Arc<LogicalUnit>>,
}

/// Server configuration.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct TargetConfig {
    /// Target nodes.
    pub nodes: Vec<Node>,
    /// The portals' login settings: operational limits offered to initiators,
    /// TargetPortalGroupTag, login timeout, discovery CHAP, CHAP algorithms. Its `targets` and
    /// `transport` are filled per connection (from `nodes` and the portal's transport): what is
    /// put there is ignored.
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
    /// Which targets SendTargets lists on a discovery session.
    pub discovery_scope: DiscoveryScope,
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
            discovery_scope: DiscoveryScope::Permitted,
        }
    }
}

impl Node {
    /// A node named `name`, open to every initiator, without authentication and without
    /// logical units.
    pub fn new(name: impl Into<String>) -> Self {
        Self::from(TargetNode::open(name))
    }

    /// Add a logical unit (it takes the next LUN).
    #[must_use]
    pub fn lun(mut self, lu: Arc<LogicalUnit>) -> Self {
        self.luns.push(lu);
        self
    }

    /// These logical units, in LUN order.
    #[must_use]
    pub fn luns(mut self, luns: Vec<Arc<LogicalUnit>>) -> Self {
        self.luns = luns;
        self
    }
}

impl From<TargetNode> for Node {
    /// This target node, without logical units.
    fn from(target: TargetNode) -> Self {
        Self { target, luns: Vec::new() }
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

    /// Which targets SendTargets lists on a discovery session.
    #[must_use]
    pub fn discovery_scope(mut self, scope: DiscoveryScope) -> Self {
        self.discovery_scope = scope;
        self
    }
}

/// Default of [`TargetConfig::max_connections`].
pub const DEFAULT_MAX_CONNECTIONS: usize = 256;

type SessionKey = (String, Isid, String);

/// A registered session: its connection, and what tells when its commands' backend I/O is over.
#[derive(Clone)]
struct Registered {
    dm: SharedDatamover,
    quiet: Arc<Quiesce>,
}

impl std::fmt::Debug for Registered {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registered").finish_non_exhaustive()
    }
}

/// Set once a session has ended and no I/O of its commands runs any more.
#[derive(Debug, Default)]
struct Quiesce {
    done: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Quiesce {
    fn set(&self) {
        self.done.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
    async fn wait(&self) {
        loop {
            let n = self.notify.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.done.load(Ordering::Acquire) {
                return;
            }
            n.await;
        }
    }
}

/// A running target.
#[derive(Debug)]
pub struct Target {
    config: TargetConfig,
    next_tsih: AtomicU16,
    sessions: Mutex<HashMap<SessionKey, Registered>>,
    #[cfg_attr(not(any(feature = "tcp", feature = "iser")), allow(dead_code))]
    connections: Arc<tokio::sync::Semaphore>,
    /// The target-wide memory budget for command data, in [`BUDGET_UNIT`]s.
    budget: Arc<tokio::sync::Semaphore>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Fresh randomness for one login, from the operating system's generator: the seed of the CHAP
/// identifiers and challenges, and the initial StatSN drawn apart from it (the StatSN travels in
/// clear, so it must not be a part of the seed). Without the OS generator there is no login:
/// a predictable challenge would let a recorded CHAP response be replayed.
fn login_randomness() -> Result<([u8; 32], u32), riser_iscsi::entropy::EntropyError> {
    let seed = riser_iscsi::entropy::entropy()?;
    // The 28-bit range the initial StatSN has always had.
    Ok((seed, u32::from_le_bytes(riser_iscsi::entropy::entropy()?) & 0x0fff_ffff))
}

/// Where TSIHs start: random, so the TSIHs a target hands out say nothing about how many
/// sessions it has had (sessions then count up from there, which keeps them unique). The
/// starting point is not a secret, so without the OS generator it is 1.
fn first_tsih() -> u16 {
    match riser_iscsi::entropy::entropy() {
        Ok(b) => u16::from_le_bytes(b).max(1),
        Err(e) => {
            warn!("{e}: TSIHs start at 1");
            1
        }
    }
}

impl Target {
    /// A target with this configuration.
    pub fn new(config: TargetConfig) -> Arc<Self> {
        let connections = Arc::new(tokio::sync::Semaphore::new(config.max_connections.max(1)));
        let budget = Arc::new(tokio::sync::Semaphore::new(units_of(config.max_target_bytes) as usize));
        Arc::new(Self { config, next_tsih: AtomicU16::new(first_tsih()), sessions: Mutex::new(HashMap::new()), connections, budget })
    }

    /// A place for one more connection, if the target has room (else it says why once in a
    /// while).
    #[cfg_attr(not(any(feature = "tcp", feature = "iser")), allow(dead_code))]
    fn admit(&self, peer: SocketAddr) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let p = self.connections.clone().try_acquire_owned().ok();
        if p.is_none() {
            warn!(%peer, limit = self.config.max_connections, "connection refused: the target serves its maximum of connections");
        }
        p
    }

    /// The login settings of one connection on a portal of `transport`.
    fn login_config(&self, transport: Transport) -> TargetLoginConfig {
        let mut config = self.config.login.clone().transport(transport);
        config.targets = self.config.nodes.iter().map(|n| n.target.clone()).collect();
        if transport == Transport::Iser && !self.config.iser_unsolicited_data {
            // No unsolicited Data-Out over iSER (see `TargetConfig::iser_unsolicited_data`).
            config.operational.initial_r2t = true;
        }
        config
    }

    /// Serve one connection on a datamover: login (with the key set of `transport`), then the
    /// session. The datamover may be TCP or iSER: nothing below depends on which.
    pub async fn connection(self: Arc<Self>, dm: SharedDatamover, transport: Transport, peer: SocketAddr, portal: SocketAddr) {
        let start = Instant::now();
        let mut tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed);
        if tsih == 0 {
            tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed);
        }
        let (seed, stat_sn) = match login_randomness() {
            Ok(r) => r,
            Err(e) => {
                warn!(%peer, "login refused: no OS random generator for the CHAP challenge ({e})");
                dm.terminate();
                return;
            }
        };
        let mut config = self.login_config(transport);
        if let Some(m) = dm.max_recv_data_segment_length() {
            config.operational.max_recv_data_segment_length = config.operational.max_recv_data_segment_length.min(m);
        }
        let mut login = TargetLogin::new(
            config,
            TargetLoginParams { new_tsih: tsih, initial_stat_sn: stat_sn, cmd_window: self.config.queue_depth, entropy: seed },
        );
        let outcome = loop {
            let deadline = login.poll_timeout().map(|d| d.saturating_sub(start.elapsed())).unwrap_or(self.config.login.login_timeout);
            let ev = match tokio::time::timeout(deadline, dm.next_event()).await {
                Ok(ev) => ev,
                Err(_) => {
                    login.handle_timeout(start.elapsed());
                    DmEvent::Terminated(riser_datamover::Terminated::Local)
                }
            };
            match ev {
                DmEvent::Control(pdu) => login.handle_pdu(start.elapsed(), &pdu.header, &pdu.data),
                _ => {
                    dm.terminate();
                    return;
                }
            }
            // The end of login is explicit (RFC 5047 §7): the full feature phase's resources and
            // the negotiated values before the final Login Response leaves, Enable_Datamover
            // once it has.
            let event = login.poll_event();
            if let Some(TargetLoginEvent::Complete(o)) = &event {
                if let Err(e) = dm.allocate_connection_resources(ConnectionResources { commands: self.config.queue_depth }) {
                    warn!(%peer, %e, "login refused: no resources for the connection");
                    dm.terminate();
                    return;
                }
                dm.notice_key_values(&o.params);
            }
            while let Some(p) = login.poll_transmit() {
                let sent = tokio::time::timeout(
                    self.config.send_timeout,
                    dm.send_control(ControlPdu::new(Header::LoginResponse(p.header), p.data.into())),
                );
                if !matches!(sent.await, Ok(Ok(()))) {
                    dm.terminate();
                    return;
                }
            }
            match event {
                Some(TargetLoginEvent::Complete(o)) => break o,
                Some(TargetLoginEvent::Failed { status, reason }) => {
                    info!(%peer, %status, reason, "login failed");
                    dm.terminate();
                    return;
                }
                _ => {}
            }
        };
        let p = outcome.params.clone();
        dm.enable();
        info!(%peer, initiator = %p.initiator_name, target = %p.target_name, session = ?p.session_type, "login complete");
        let key = (p.initiator_name.to_ascii_lowercase(), outcome.isid, p.target_name.to_ascii_lowercase());
        let quiet = Arc::new(Quiesce::default());
        // A discovery session belongs to no target, whatever TargetName it declared: it must
        // neither reinstate a normal session with the same names and ISID nor become that I_T
        // nexus on a node (its end would release the nexus's RESERVE and unit attentions), so
        // it gets no node and no entry in the session table.
        let normal = p.session_type == SessionType::Normal;
        if normal {
            let old = lock(&self.sessions).insert(key.clone(), Registered { dm: dm.clone(), quiet: quiet.clone() });
            if let Some(old) = old {
                // Session reinstatement (ERL 0): the old session ends now, and nothing of the new
                // one runs before the old one's backend I/O is over (a write it had in flight
                // must not land after the new session's writes to the same blocks).
                info!(%peer, "reinstating session: closing the previous connection");
                old.dm.terminate();
                let waited = Instant::now();
                while tokio::time::timeout(Duration::from_secs(10), old.quiet.wait()).await.is_err() {
                    warn!(%peer, waited = ?waited.elapsed(), "reinstatement waits for the previous session's backend I/O");
                }
            }
        }
        let node =
            if normal { self.config.nodes.iter().find(|n| n.target.name.eq_ignore_ascii_case(&p.target_name)).cloned() } else { None };
        let session = Arc::new(Session::new(dm.clone(), outcome, node, &self.config, self.budget.clone()));
        session.run(&self, portal).await;
        session.quiesce().await;
        quiet.set();
        // Unregister, unless a reinstatement already replaced this connection.
        let mut sessions = lock(&self.sessions);
        if normal && sessions.get(&key).is_some_and(|cur| Arc::ptr_eq(&cur.dm, &dm)) {
            sessions.remove(&key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn initial_stat_sn_is_drawn_apart_from_the_chap_seed() {
        // The initial StatSN used to be the first 28 bits of the CHAP seed, disclosed in every
        // Login Response. Drawn apart, the two coincide by chance only (2^-28 per login). This
        // shows the StatSN no longer carries seed bits; the seeds' unpredictability rests on the
        // OS generator, which no test here can show.
        let mut seeds = std::collections::HashSet::new();
        for _ in 0..16 {
            let (seed, stat_sn) = login_randomness().unwrap();
            assert_ne!(u32::from_le_bytes([seed[0], seed[1], seed[2], seed[3]]) & 0x0fff_ffff, stat_sn);
            assert!(seeds.insert(seed), "a seed repeated");
        }
    }

    #[test]
    fn login_settings_come_from_login_the_targets_from_the_nodes() {
        let mut login = TargetLoginConfig::default().portal_group_tag(7).target(TargetNode::open("iqn.2026-11.io.riser:ignored"));
        login.operational.initial_r2t = false;
        let node = Node::from(TargetNode::open("iqn.2026-11.io.riser:t").allow("iqn.2026-11.io.riser:i"));
        let t = Target::new(TargetConfig::default().login(login).node(node.clone()));
        let tcp = t.login_config(Transport::Tcp);
        assert_eq!((tcp.portal_group_tag, tcp.transport, tcp.targets), (7, Transport::Tcp, vec![node.target]));
        assert!(!tcp.operational.initial_r2t);
        let iser = t.login_config(Transport::Iser);
        assert_eq!(iser.transport, Transport::Iser);
        assert!(iser.operational.initial_r2t, "no unsolicited Data-Out over iSER unless asked for");
    }

    #[test]
    fn tsihs_start_somewhere_random() {
        // Every target used to start at TSIH 1. Four targets all starting at the same point
        // now has odds of 2^-48.
        let starts: Vec<u16> = (0..4).map(|_| Target::new(TargetConfig::default()).next_tsih.load(Ordering::Relaxed)).collect();
        assert!(starts.iter().all(|&t| t != 0));
        assert!(starts.iter().any(|&t| t != starts[0]), "TSIHs start at {starts:?}");
    }
}
