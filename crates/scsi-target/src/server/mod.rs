//! The iSCSI target server: portals, login, discovery, and the full feature phase of each
//! session (command window, data transfer through the datamover, task management, logout),
//! changed live while it serves.
//!
//! `mod.rs`: the running [`Target`], login and session registration; `config`: what it
//! serves ([`TargetConfig`], [`Node`], [`PortalGroup`], [`Portal`]); `control`: changes made
//! while it runs, the session list, logout requests and draining; `view`: what one I_T nexus
//! sees of its target; `session`: the driver of a session's full feature phase around
//! riser-iscsi's `TargetSession`; `command`: the SCSI command path; `stats`: the counters.

mod command;
mod config;
mod control;
#[cfg(feature = "iser")]
mod iser;
mod session;
pub mod stats;
#[cfg(feature = "tcp")]
mod tcp;
#[cfg(feature = "iser")]
mod threads;
mod view;

pub use config::{DEFAULT_MAX_CONNECTIONS, DiscoveryScope, MAX_LUN, Node, Portal, PortalGroup, TargetConfig};
pub use control::{ChangeError, SessionInfo};
use session::{Session, units_of};
pub use stats::Stats;

use riser_datamover::{ConnectionResources, ControlPdu, DmEvent, SharedDatamover};
use riser_iscsi::keys::{SessionType, Transport};
pub use riser_iscsi::login::{AclEntry, TargetLoginConfig, TargetNode};
use riser_iscsi::login::{TargetLogin, TargetLoginEvent, TargetLoginParams};
use riser_iscsi::wire::*;
use stats::{ConnectionCount, LoginFailure, TargetCounters};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::{info, warn};

type SessionKey = (String, Isid, String);

/// Set once a session has ended and no I/O of its commands runs any more.
#[derive(Debug, Default)]
pub(crate) struct Quiesce {
    done: std::sync::atomic::AtomicBool,
    notify: tokio::sync::Notify,
}

impl Quiesce {
    fn set(&self) {
        self.done.store(true, Ordering::Release);
        self.notify.notify_waiters();
    }
    pub(crate) async fn wait(&self) {
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

/// The target nodes as of one change: a new snapshot replaces the whole list, and its
/// generation number tells sessions to look again.
#[derive(Debug, Default)]
struct Registry {
    nodes: Mutex<Arc<Vec<Arc<Node>>>>,
    /// Bumped after each new snapshot is in place (sequentially consistent: see `view`).
    generation: AtomicU64,
    /// The units EXTENDED COPY may reach, kept in step with `nodes`.
    copy_directory: Arc<crate::lu::UnitDirectory>,
}

impl Registry {
    /// The nodes now, and their generation.
    fn snapshot(&self) -> (u64, Arc<Vec<Arc<Node>>>) {
        let nodes = lock(&self.nodes);
        (self.generation.load(Ordering::SeqCst), nodes.clone())
    }

    /// Put `nodes` in place; `server` runs commands on their units from now on (told to end
    /// them when another gateway resets one: [`LogicalUnit::remote_reset`]).
    fn publish(&self, nodes: Vec<Arc<Node>>, server: &std::sync::Weak<Target>) {
        let server: std::sync::Weak<dyn crate::lu::TaskSets> = server.clone();
        for lu in nodes.iter().flat_map(|n| n.luns.values()) {
            lu.serve_tasks(server.clone());
        }
        let mut cur = lock(&self.nodes);
        self.copy_directory.replace(nodes.iter().map(|n| {
            let mapped = n.lun_maps.iter().map(|(i, m)| (i.as_str(), m.values().filter_map(|l| n.luns.get(l)).collect())).collect();
            (n.target.name.as_str(), n.luns.values().collect(), mapped)
        }));
        *cur = Arc::new(nodes);
        self.generation.fetch_add(1, Ordering::SeqCst);
    }
}

/// A running target.
///
/// Its target nodes, their LUNs, ACLs and portal groups change while it serves (the methods in
/// `control`): each change is published whole, sessions pick it up at their next PDU, and
/// no command reads a lock another session takes to find its LUN.
#[derive(Debug)]
pub struct Target {
    config: TargetConfig,
    registry: Registry,
    /// Changes are made one at a time.
    changes: tokio::sync::Mutex<()>,
    next_tsih: AtomicU16,
    /// Normal sessions by I_T nexus (initiator, ISID, target), for reinstatement.
    sessions: Mutex<HashMap<SessionKey, Arc<Session>>>,
    /// Every session in full feature phase (discovery ones too), by TSIH.
    live: Mutex<HashMap<u16, Arc<Session>>>,
    /// The portals the target accepts connections on ([`Target::serve`], `serve_iser`), for nodes
    /// without portal groups of their own.
    serving: Mutex<Vec<Portal>>,
    #[cfg_attr(not(any(feature = "tcp", feature = "iser")), allow(dead_code))]
    connections: Arc<tokio::sync::Semaphore>,
    /// The target-wide memory budget for command data, in [`BUDGET_UNIT`]s.
    budget: Arc<tokio::sync::Semaphore>,
    counters: TargetCounters,
    /// Counters of ended sessions, per (target, LUN): see `stats`.
    retired: Mutex<std::collections::BTreeMap<(String, u16), stats::LunStats>>,
    /// The threads iSER connections run on ([`TargetConfig::iser_threads`]), started with the
    /// first iSER portal; `None`: on the runtime of `serve_iser`.
    #[cfg(feature = "iser")]
    iser_threads: std::sync::OnceLock<Option<threads::ConnectionThreads>>,
    /// Itself, as its units know it ([`Registry::publish`]).
    me: std::sync::Weak<Self>,
}

/// A portal in [`Target`]'s list of the ones it serves, until dropped.
#[cfg_attr(not(any(feature = "tcp", feature = "iser")), allow(dead_code))]
pub(crate) struct Serving {
    target: Arc<Target>,
    portal: Portal,
}

impl Drop for Serving {
    fn drop(&mut self) {
        let mut s = lock(&self.target.serving);
        if let Some(i) = s.iter().position(|p| *p == self.portal) {
            s.remove(i);
        }
    }
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

/// Another gateway of a unit's store reset it: every session here that sees the unit ends its
/// tasks there in its own loop, as for a reset through another session of this target
/// (`Session::ask_to_end_tasks`), and the reset is acknowledged once their I/O is over.
impl crate::lu::TaskSets for Target {
    fn end_tasks(&self, lu: &crate::lu::LogicalUnit) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        let sessions: Vec<Arc<Session>> = lock(&self.live).values().cloned().collect();
        let asks: Vec<_> = sessions
            .iter()
            .filter_map(|s| s.paths().into_iter().find(|p| std::ptr::eq(Arc::as_ptr(&p.lu), lu)).map(|p| s.ask_to_end_tasks(&p.lu)))
            .collect();
        Box::pin(async move {
            for ask in asks {
                // A dropped ask: the session is gone, and its tasks with it.
                for gate in ask.await.unwrap_or_default() {
                    gate.wait_idle().await;
                }
            }
        })
    }
}

impl Target {
    /// A target with this configuration (its nodes are the ones it starts with).
    pub fn new(mut config: TargetConfig) -> Arc<Self> {
        let connections = Arc::new(tokio::sync::Semaphore::new(config.max_connections.max(1)));
        let budget = Arc::new(tokio::sync::Semaphore::new(units_of(config.max_target_bytes) as usize));
        let nodes = std::mem::take(&mut config.nodes);
        let target = Arc::new_cyclic(|me| Self {
            config,
            registry: Registry::default(),
            changes: tokio::sync::Mutex::new(()),
            next_tsih: AtomicU16::new(first_tsih()),
            sessions: Mutex::new(HashMap::new()),
            live: Mutex::new(HashMap::new()),
            serving: Mutex::new(Vec::new()),
            connections,
            budget,
            counters: TargetCounters::default(),
            retired: Mutex::new(Default::default()),
            #[cfg(feature = "iser")]
            iser_threads: std::sync::OnceLock::new(),
            me: me.clone(),
        });
        // Published once the target exists: its units then hold a reference that upgrades
        // (one made inside `new_cyclic` would look dropped to a unit pruning its list).
        target.registry.publish(nodes.into_iter().map(Arc::new).collect(), &target.me);
        target
    }

    /// The server's settings (the nodes it started with are not kept here: see
    /// [`Target::nodes`]).
    pub fn config(&self) -> &TargetConfig {
        &self.config
    }

    /// Accept connections on `portal` from now until the guard is dropped (nodes without portal
    /// groups of their own are reached through every such portal, and list them in
    /// SendTargets).
    #[cfg_attr(not(any(feature = "tcp", feature = "iser")), allow(dead_code))]
    pub(crate) fn serving(self: &Arc<Self>, portal: Portal) -> Serving {
        lock(&self.serving).push(portal);
        Serving { target: self.clone(), portal }
    }

    /// The portal group of `node` a connection of `transport` to `local` came in through:
    /// (TargetPortalGroupTag, relative target port identifier, ALUA target port group). `None`:
    /// the node is not reached through that portal.
    fn port_of(&self, node: &Node, local: SocketAddr, transport: Transport) -> Option<(u16, u16, u16)> {
        if node.portal_groups.is_empty() {
            return Some((self.config.login.portal_group_tag, 1, 1));
        }
        node.portal_groups
            .iter()
            .find(|g| g.portals.iter().any(|p| p.accepts(local, transport)))
            .map(|g| (g.tag, g.relative_port, g.port_group))
    }

    /// The portals `node` is reached through, each with its TargetPortalGroupTag.
    fn portals_of(&self, node: &Node) -> Vec<(Portal, u16)> {
        if node.portal_groups.is_empty() {
            let tag = self.config.login.portal_group_tag;
            return lock(&self.serving).iter().map(|p| (*p, tag)).collect();
        }
        node.portal_groups.iter().flat_map(|g| g.portals.iter().map(move |p| (*p, g.tag))).collect()
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

    /// The login settings of one connection of `transport` to local address `local`: the nodes
    /// reached through that portal, each declaring its portal group's tag.
    fn login_config(&self, transport: Transport, local: SocketAddr) -> TargetLoginConfig {
        let mut config = self.config.login.clone().transport(transport);
        let (_, nodes) = self.registry.snapshot();
        config.targets = nodes
            .iter()
            .filter_map(|n| {
                let (tag, ..) = self.port_of(n, local, transport)?;
                let mut t = n.target.clone();
                t.portal_group_tag = Some(tag);
                Some(t)
            })
            .collect();
        if transport == Transport::Iser && !self.config.iser_unsolicited_data {
            // No unsolicited Data-Out over iSER (see `TargetConfig::iser_unsolicited_data`).
            config.operational.initial_r2t = true;
        }
        config
    }

    /// Serve one connection on a datamover: login (with the key set of `transport`), then the
    /// session. The datamover may be TCP or iSER: nothing below depends on which. `local` is the
    /// address the connection came to (which portal, and so which portal group). Returns when the
    /// connection has ended and its commands' I/O is over.
    ///
    /// This is where a datamover of one's own comes in (the RFC 5047 seam): an accept loop of the
    /// embedder's makes each connection's datamover — its own, or riser-tcp's or riser-iser's
    /// wrapped — and runs this for it (the repository's `examples/embed_custom_datamover.rs`).
    /// What `serve` (feature `tcp`) does around it is then the caller's: this call counts no
    /// connection against [`TargetConfig::max_connections`], lists no portal in SendTargets (nodes
    /// with portal groups of their own list theirs), and leaves the datamover's settings (the TCP
    /// datamover's segment timeout, [`TargetConfig::data_timeout`]) as they are.
    pub async fn connection(self: Arc<Self>, dm: SharedDatamover, transport: Transport, peer: SocketAddr, local: SocketAddr) {
        let _open = ConnectionCount::open(&self.counters, transport);
        let Some(outcome) = self.login(&dm, transport, peer, local).await else {
            dm.terminate();
            return;
        };
        let mut outcome = outcome;
        let p = outcome.params.clone();
        dm.enable();
        info!(%peer, initiator = %p.initiator_name, target = %p.target_name, session = ?p.session_type, "login complete");
        // A discovery session belongs to no target, whatever TargetName it declared: it must
        // neither reinstate a normal session with the same names and ISID nor become that I_T
        // nexus on a node (its end would release the nexus's RESERVE and unit attentions), so
        // it gets no port and no entry in the session table.
        let normal = p.session_type == SessionType::Normal;
        let port = if normal {
            let (_, nodes) = self.registry.snapshot();
            let node = nodes.iter().find(|n| n.target.name.eq_ignore_ascii_case(&p.target_name));
            match node.and_then(|n| self.port_of(n, local, transport).map(|port| (n, port))) {
                Some((n, port)) => {
                    // The session, its I_T nexus and its statistics name the target as configured,
                    // not as the initiator spelled it (names compare without case, RFC 3722): one
                    // initiator logging in with each spelling was that many I_T nexuses, and each
                    // spelling a statistics entry kept for good.
                    outcome.params.target_name.clone_from(&n.target.name);
                    Some(port)
                }
                None => {
                    // Removed (or moved off this portal) while the login ran.
                    info!(%peer, target = %p.target_name, "the target went away during login");
                    dm.terminate();
                    return;
                }
            }
        } else {
            None
        };
        let at = session::Endpoint { peer, local, transport };
        let session = Arc::new(Session::new(dm.clone(), outcome, port, at, &self.config, self.budget.clone()));
        let key = (p.initiator_name.to_ascii_lowercase(), session.isid(), p.target_name.to_ascii_lowercase());
        if normal {
            let old = lock(&self.sessions).insert(key.clone(), session.clone());
            if let Some(old) = old {
                // Session reinstatement (ERL 0): the old session ends now, and nothing of the new
                // one runs before the old one's backend I/O is over (a write it had in flight
                // must not land after the new session's writes to the same blocks).
                info!(%peer, "reinstating session: closing the previous connection");
                old.dm.terminate();
                let waited = Instant::now();
                while tokio::time::timeout(Duration::from_secs(10), old.ended.wait()).await.is_err() {
                    warn!(%peer, waited = ?waited.elapsed(), "reinstatement waits for the previous session's backend I/O");
                }
            }
        }
        // Listed before it looks at its LUNs (see `view`), and before it looks whether it is
        // still admitted: a change that ends sessions publishes, then ends what is listed, so
        // either it sees this session or this session sees the change.
        lock(&self.live).insert(session.tsih(), session.clone());
        if normal && !self.still_admits(&p.target_name, &p.initiator_name) {
            info!(%peer, initiator = %p.initiator_name, target = %p.target_name, "admission withdrawn during login: ending the session");
            dm.terminate();
        }
        session.run(&self).await;
        session.quiesce().await;
        self.retire(&session);
        session.ended.set();
        // Unregister, unless a reinstatement already replaced this connection.
        let mut sessions = lock(&self.sessions);
        if normal && sessions.get(&key).is_some_and(|cur| Arc::ptr_eq(cur, &session)) {
            sessions.remove(&key);
        }
    }

    /// Whether `target` (still there) admits `initiator` now.
    fn still_admits(&self, target: &str, initiator: &str) -> bool {
        let (_, nodes) = self.registry.snapshot();
        nodes.iter().any(|n| n.target.name.eq_ignore_ascii_case(target) && n.target.admits(initiator))
    }

    /// Fold an ended session's counters into the target's totals and forget it (in one step
    /// under the lock readers take, so no total ever goes down).
    fn retire(&self, session: &Session) {
        let mut live = lock(&self.live);
        let mut retired = lock(&self.retired);
        for path in session.paths() {
            retired.entry((session.target_name().to_string(), path.lun)).or_default().add(&path.counters.snapshot());
        }
        live.remove(&session.tsih());
    }

    /// Run the login of a connection: the session's outcome, or `None` (the reason logged and
    /// counted; the caller ends the connection).
    async fn login(
        &self,
        dm: &SharedDatamover,
        transport: Transport,
        peer: SocketAddr,
        local: SocketAddr,
    ) -> Option<riser_iscsi::login::LoginOutcome> {
        let start = Instant::now();
        let mut tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed);
        if tsih == 0 {
            tsih = self.next_tsih.fetch_add(1, Ordering::Relaxed);
        }
        let (seed, stat_sn) = match login_randomness() {
            Ok(r) => r,
            Err(e) => {
                warn!(%peer, "login refused: no OS random generator for the CHAP challenge ({e})");
                self.counters.login_failed(LoginFailure::Resources);
                return None;
            }
        };
        let mut config = self.login_config(transport, local);
        if let Some(m) = dm.max_recv_data_segment_length() {
            config.operational.max_recv_data_segment_length = config.operational.max_recv_data_segment_length.min(m);
        }
        let mut login = TargetLogin::new(
            config,
            TargetLoginParams { new_tsih: tsih, initial_stat_sn: stat_sn, cmd_window: self.config.queue_depth, entropy: seed },
        );
        loop {
            let deadline = login.poll_timeout().map(|d| d.saturating_sub(start.elapsed())).unwrap_or(self.config.login.login_timeout);
            let Ok(ev) = tokio::time::timeout(deadline, dm.next_event()).await else {
                login.handle_timeout(start.elapsed());
                info!(%peer, "login timed out");
                self.counters.login_failed(LoginFailure::Timeout);
                return None;
            };
            match ev {
                DmEvent::Control(pdu) => login.handle_pdu(start.elapsed(), &pdu.header, &pdu.data),
                _ => {
                    self.counters.login_failed(LoginFailure::Disconnected);
                    return None;
                }
            }
            // The end of login is explicit (RFC 5047 §7): the full feature phase's resources and
            // the negotiated values before the final Login Response leaves, Enable_Datamover
            // once it has.
            let event = login.poll_event();
            if let Some(TargetLoginEvent::Complete(o)) = &event {
                // The commands it may hold: its CmdSN window and the immediate commands allowed
                // beside it (which the window does not count).
                let commands = self.config.queue_depth.saturating_add(self.config.max_immediate_commands);
                if let Err(e) = dm.allocate_connection_resources(ConnectionResources { commands }) {
                    warn!(%peer, %e, "login refused: no resources for the connection");
                    self.counters.login_failed(LoginFailure::Resources);
                    return None;
                }
                dm.notice_key_values(&o.params);
            }
            // A failure is counted before its Login Response leaves: an initiator told of it
            // finds it in the statistics (counted after, it could be missing for a moment).
            let failed = match &event {
                Some(TargetLoginEvent::Failed { status, reason }) => {
                    info!(%peer, %status, reason, "login failed");
                    self.counters.login_failed(LoginFailure::of(*status));
                    true
                }
                _ => false,
            };
            while let Some(p) = login.poll_transmit() {
                let sent = tokio::time::timeout(
                    self.config.send_timeout,
                    dm.send_control(ControlPdu::new(Header::LoginResponse(p.header), p.data.into())),
                );
                if !matches!(sent.await, Ok(Ok(()))) {
                    if !failed {
                        self.counters.login_failed(LoginFailure::Disconnected);
                    }
                    return None;
                }
            }
            match event {
                Some(TargetLoginEvent::Complete(o)) => {
                    self.counters.logins.fetch_add(1, Ordering::Relaxed);
                    return Some(o);
                }
                Some(TargetLoginEvent::Failed { .. }) => return None,
                _ => {}
            }
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
        let local = "127.0.0.1:3260".parse().unwrap();
        let tcp = t.login_config(Transport::Tcp, local);
        let mut declared = node.target.clone();
        declared.portal_group_tag = Some(7);
        assert_eq!((tcp.portal_group_tag, tcp.transport, tcp.targets), (7, Transport::Tcp, vec![declared]));
        assert!(!tcp.operational.initial_r2t);
        let iser = t.login_config(Transport::Iser, local);
        assert_eq!(iser.transport, Transport::Iser);
        assert!(iser.operational.initial_r2t, "no unsolicited Data-Out over iSER unless asked for");
    }

    #[test]
    fn a_portal_reaches_only_the_nodes_of_its_portal_groups_each_with_its_tag() {
        let a =
            Node::new("iqn.2026-11.io.riser:a").portal_group(PortalGroup::new(3).portal(Portal::tcp("127.0.0.1:3260".parse().unwrap())));
        let b = Node::new("iqn.2026-11.io.riser:b")
            .portal_group(PortalGroup::new(5).relative_port(9).portal(Portal::tcp("0.0.0.0:3261".parse().unwrap())))
            .portal_group(PortalGroup::new(6).portal(Portal::iser("127.0.0.1:3262".parse().unwrap())));
        let open = Node::new("iqn.2026-11.io.riser:everywhere");
        let t = Target::new(TargetConfig::default().node(a.clone()).node(b.clone()).node(open));
        let reached = |addr: &str, tr| {
            t.login_config(tr, addr.parse().unwrap())
                .targets
                .iter()
                .map(|n| (n.name.clone(), n.portal_group_tag.unwrap()))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            reached("127.0.0.1:3260", Transport::Tcp),
            vec![("iqn.2026-11.io.riser:a".into(), 3), ("iqn.2026-11.io.riser:everywhere".into(), 1)]
        );
        assert_eq!(
            reached("10.1.1.1:3261", Transport::Tcp),
            vec![("iqn.2026-11.io.riser:b".into(), 5), ("iqn.2026-11.io.riser:everywhere".into(), 1)]
        );
        assert_eq!(reached("127.0.0.1:3262", Transport::Iser)[0], ("iqn.2026-11.io.riser:b".into(), 6));
        assert_eq!(t.port_of(&b, "10.1.1.1:3261".parse().unwrap(), Transport::Tcp), Some((5, 9, 5)));
        assert_eq!(t.port_of(&a, "127.0.0.1:3260".parse().unwrap(), Transport::Iser), None);
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
