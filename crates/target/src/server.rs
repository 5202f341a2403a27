//! The iSCSI target server: portals, login, discovery, and the full feature phase of each
//! session (command window, data transfer through the datamover, task management, logout).

use crate::lu::{LogicalUnit, Outcome, Plan};
use bytes::Bytes;
use riser_datamover::{ConnectionResources, ControlPdu, DmEvent, SequenceError, SharedDatamover};
use riser_iscsi::chap::ChapCredentials;
use riser_iscsi::keys::{DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH, NegotiatedParams, OperationalConfig, Role, SessionType, Transport};
use riser_iscsi::login::{LoginOutcome, TargetLogin, TargetLoginConfig, TargetLoginEvent, TargetLoginParams, TargetNode};
use riser_iscsi::serial::SerialNumber;
use riser_iscsi::session::TransferLimits;
use riser_iscsi::text::{TextBuilder, parse_pairs};
use riser_iscsi::wire::*;
use riser_scsi::lun::Lun;
use riser_scsi::sense::{AscAscq, Sense, SenseKey, Status, with_length_prefix};
use std::collections::{BTreeSet, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

/// A target node served by the portal.
#[derive(Debug, Clone)]
pub struct Node {
    /// iSCSI name.
    pub name: String,
    /// Alias.
    pub alias: Option<String>,
    /// Logical units, in LUN order.
    pub luns: Vec<Arc<LogicalUnit>>,
    /// Initiators allowed (empty: all).
    pub acl: Vec<String>,
    /// CHAP required from initiators.
    pub chap: Option<ChapCredentials>,
    /// Mutual CHAP credentials of the target.
    pub mutual_chap: Option<ChapCredentials>,
}

/// Server configuration.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    /// Target nodes.
    pub nodes: Vec<Node>,
    /// Operational limits offered to initiators.
    pub operational: OperationalConfig,
    /// TargetPortalGroupTag.
    pub portal_group_tag: u16,
    /// Commands per session the CmdSN window admits.
    pub queue_depth: u32,
    /// Login timeout.
    pub login_timeout: Duration,
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
    /// iSER: accept unsolicited Data-Out (InitialR2T=No as negotiated by `operational`). Every
    /// Send needs a receive posted in advance, and an initiator may send FirstBurstLength of
    /// unsolicited data per command in receive-sized pieces (Linux: 256 KiB in 8 KiB Sends, 33
    /// receives per command), so allowing it costs `queue_depth × (1 + FirstBurstLength /
    /// receive size)` receives per connection. Off by default: iSER connections answer
    /// InitialR2T=Yes, as LIO does, and the target RDMA Reads everything beyond the immediate
    /// data (one receive per command).
    pub iser_unsolicited_data: bool,
    /// CHAP a discovery session must pass, if any (`None`: discovery is open, the default of LIO
    /// (`enforce_discovery_auth=0`) and of tgt (no account bound to discovery)). Independent
    /// of the nodes' CHAP: a normal session authenticates with its target's credentials.
    pub discovery_chap: Option<ChapCredentials>,
    /// Credentials the target answers mutual CHAP with on discovery sessions; when set, mutual
    /// CHAP is required there (needs `discovery_chap`).
    pub discovery_mutual_chap: Option<ChapCredentials>,
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
            operational: OperationalConfig::default(),
            portal_group_tag: 1,
            queue_depth: 128,
            nop_interval: Some(Duration::from_secs(10)),
            nop_timeout: Duration::from_secs(15),
            login_timeout: Duration::from_secs(15),
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_immediate_commands: 16,
            max_session_bytes: 256 << 20,
            max_target_bytes: 2 << 30,
            send_timeout: Duration::from_secs(30),
            data_timeout: Duration::from_secs(30),
            iser_unsolicited_data: false,
            discovery_chap: None,
            discovery_mutual_chap: None,
            discovery_scope: DiscoveryScope::Permitted,
        }
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
fn login_randomness() -> Result<([u8; 32], u32), rand::rand_core::OsError> {
    use rand::TryRngCore as _;
    let mut seed = [0u8; 32];
    let mut sn = [0u8; 4];
    rand::rngs::OsRng.try_fill_bytes(&mut seed)?;
    rand::rngs::OsRng.try_fill_bytes(&mut sn)?;
    // The 28-bit range the initial StatSN has always had.
    Ok((seed, u32::from_le_bytes(sn) & 0x0fff_ffff))
}

/// Where TSIHs start: random, so the TSIHs a target hands out say nothing about how many
/// sessions it has had (sessions then count up from there, which keeps them unique). The
/// starting point is not a secret, so without the OS generator it is 1.
fn first_tsih() -> u16 {
    use rand::TryRngCore as _;
    let mut b = [0u8; 2];
    match rand::rngs::OsRng.try_fill_bytes(&mut b) {
        Ok(()) => u16::from_le_bytes(b).max(1),
        Err(e) => {
            warn!("no OS random generator ({e}): TSIHs start at 1");
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
    fn admit(&self, peer: SocketAddr) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let p = self.connections.clone().try_acquire_owned().ok();
        if p.is_none() {
            warn!(%peer, limit = self.config.max_connections, "connection refused: the target serves its maximum of connections");
        }
        p
    }

    /// Accept connections on `listener` until the task is dropped. Accept errors (out of file
    /// descriptors, a connection reset before it was accepted) are logged and retried after a
    /// pause that grows to a second; they never end the portal.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) -> std::io::Result<()> {
        let mut pause = Duration::from_millis(10);
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(c) => {
                    pause = Duration::from_millis(10);
                    c
                }
                Err(e) => {
                    warn!(error = %e, retry_in = ?pause, "accept failed");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(1));
                    continue;
                }
            };
            let Some(permit) = self.admit(peer) else { continue };
            let portal = stream.local_addr().unwrap_or(peer);
            let me = self.clone();
            tokio::spawn(async move {
                let (dm, driver) = riser_tcp::datamover(stream, Role::Target);
                dm.set_segment_timeout(me.config.data_timeout);
                tokio::spawn(driver);
                me.connection(Arc::new(dm), Transport::Tcp, peer, portal).await;
                drop(permit);
            });
        }
    }

    /// Accept iSER connections on `listener` (an RDMA provider's listener) until the task is
    /// dropped: each connection request becomes an iSER datamover, then a session exactly as
    /// over TCP. `cfg.recv_depth` is raised above the CmdSN window so MaxCmdSN never opens
    /// beyond posted receives.
    pub async fn serve_iser<P: riser_verbs::Provider + Clone + 'static>(
        self: Arc<Self>,
        provider: P,
        listener: P::Listener,
        mut cfg: riser_iser::IserConfig,
    ) -> std::io::Result<()> {
        use riser_verbs::Listener as _;
        // A receive per command in the window, and per unsolicited Data-Out Send when those are
        // allowed, plus room for immediate PDUs (NOP-Out, task management, text, logout).
        let per_command = if self.config.iser_unsolicited_data {
            1 + self.config.operational.first_burst_length.div_ceil(cfg.recv_dsl.max(DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH))
        } else {
            1
        };
        cfg.recv_depth = cfg.recv_depth.max(self.config.queue_depth.saturating_mul(per_command).saturating_add(16));
        let portal = listener.local_addr().map_err(std::io::Error::other)?;
        // The provider's listener blocks: it runs on a thread of its own (not the blocking pool,
        // which a runtime waits for at shutdown) and hands requests over; it stops at the next
        // request after this future is dropped.
        let (tx, mut rx) = tokio::sync::mpsc::channel(4);
        std::thread::Builder::new().name("iser-listen".into()).spawn(move || {
            loop {
                let r = listener.get_request();
                if tx.blocking_send(r).is_err() {
                    break;
                }
            }
        })?;
        while let Some(req) = rx.recv().await {
            let req = match req {
                Ok(r) => r,
                Err(e) => {
                    warn!("iSER connection request failed: {e}");
                    continue;
                }
            };
            use riser_verbs::ConnectionRequest as _;
            let Some(permit) = self.admit(req.peer()) else {
                req.reject(&[]);
                continue;
            };
            let (p, me) = (provider.clone(), self.clone());
            tokio::spawn(async move {
                match tokio::task::spawn_blocking(move || riser_iser::accept(&p, req, cfg)).await {
                    Ok(Ok((dm, peer))) => {
                        tokio::spawn(dm.driver());
                        me.connection(Arc::new(dm), Transport::Iser, peer, portal).await;
                        drop(permit);
                    }
                    Ok(Err(e)) => warn!("iSER accept failed: {e}"),
                    Err(e) => warn!("iSER accept failed: {e}"),
                }
            });
        }
        Ok(())
    }

    fn login_config(&self, transport: Transport) -> TargetLoginConfig {
        let mut operational = self.config.operational.clone();
        if transport == Transport::Iser && !self.config.iser_unsolicited_data {
            // No unsolicited Data-Out over iSER (see `TargetConfig::iser_unsolicited_data`).
            operational.initial_r2t = true;
        }
        TargetLoginConfig {
            targets: self
                .config
                .nodes
                .iter()
                .map(|n| TargetNode {
                    name: n.name.clone(),
                    alias: n.alias.clone(),
                    allowed_initiators: n.acl.clone(),
                    chap: n.chap.clone(),
                    mutual_chap: n.mutual_chap.clone(),
                })
                .collect(),
            discovery_chap: self.config.discovery_chap.clone(),
            discovery_mutual_chap: self.config.discovery_mutual_chap.clone(),
            portal_group_tag: self.config.portal_group_tag,
            operational,
            transport,
            login_timeout: self.config.login_timeout,
            ..TargetLoginConfig::default()
        }
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
            let deadline = login.poll_timeout().map(|d| d.saturating_sub(start.elapsed())).unwrap_or(self.config.login_timeout);
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
            // The end of login is explicit (RFC 5047 §7): the full feature phase's resources
            // before the final Login Response leaves, the negotiated values and
            // Enable_Datamover once it has.
            let event = login.poll_event();
            if matches!(event, Some(TargetLoginEvent::Complete(_)))
                && let Err(e) = dm.allocate_connection_resources(ConnectionResources { commands: self.config.queue_depth })
            {
                warn!(%peer, %e, "login refused: no resources for the connection");
                dm.terminate();
                return;
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
        dm.notice_key_values(&p);
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
        let node = if normal { self.config.nodes.iter().find(|n| n.name.eq_ignore_ascii_case(&p.target_name)).cloned() } else { None };
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

/// Sequence numbers of the session (one connection per session).
#[derive(Debug)]
struct Seq {
    stat_sn: u32,
    exp_cmd_sn: SerialNumber,
    /// The window's upper end. It moves up by one as a command *ends* (not when it arrives), so
    /// `queue_depth` bounds the commands the session holds at once.
    max_cmd_sn: SerialNumber,
    ahead: BTreeSet<u32>,
}

/// Whether a task's backend I/O runs (on the blocking pool, where aborting the task's future
/// does not stop it).
#[derive(Debug, Default)]
struct IoGate {
    busy: std::sync::atomic::AtomicBool,
    idle: tokio::sync::Notify,
}

impl IoGate {
    async fn wait_idle(&self) {
        loop {
            let n = self.idle.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if !self.busy.load(Ordering::Acquire) {
                return;
            }
            n.await;
        }
    }
}

/// A running command: its LUN, the handle to abort it, and its backend I/O's gate.
type Task = (Lun, AbortHandle, Arc<IoGate>);

/// Backend I/O operations of a session running on the blocking pool.
#[derive(Debug, Default)]
struct IoCount {
    running: std::sync::atomic::AtomicUsize,
    idle: tokio::sync::Notify,
}

impl IoCount {
    fn enter(&self) {
        self.running.fetch_add(1, Ordering::AcqRel);
    }
    fn leave(&self) {
        if self.running.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.idle.notify_waiters();
        }
    }
    async fn wait_idle(&self) {
        loop {
            let n = self.idle.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.running.load(Ordering::Acquire) == 0 {
                return;
            }
            n.await;
        }
    }
}

/// A command's place in the session: a slot of the CmdSN window (or of the immediate
/// commands' allowance), given back when the command ends — before its response goes out, or
/// when its task is dropped (aborted, connection lost).
struct Slot {
    session: Arc<Session>,
    immediate: bool,
    held: std::sync::atomic::AtomicBool,
}

impl Slot {
    fn release(&self) {
        if self.held.swap(false, Ordering::AcqRel) {
            if self.immediate {
                self.session.immediate.fetch_sub(1, Ordering::AcqRel);
            } else {
                let mut s = lock(&self.session.seq);
                s.max_cmd_sn = s.max_cmd_sn.add(1);
            }
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.release();
    }
}

/// Sense for write data that broke its sequence or did not come.
fn data_phase_error(lu: &LogicalUnit) -> Outcome {
    let s = Sense::new(SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR);
    Outcome { status: Status::CHECK_CONDITION, sense: Some(lu.encode_sense(&s)), data: Bytes::new() }
}

struct Session {
    dm: SharedDatamover,
    /// The data-transfer limits negotiated (whose segment limit applies, the write split).
    limits: TransferLimits,
    params: NegotiatedParams,
    node: Option<Node>,
    nexus: String,
    seq: Mutex<Seq>,
    /// Serialises StatSN assignment with sending, so StatSNs go out in order.
    tx: tokio::sync::Mutex<()>,
    tasks: Mutex<HashMap<u32, Task>>,
    /// Immediate SCSI commands in flight, and their limit.
    immediate: AtomicU32,
    max_immediate: u32,
    /// The session's memory budget for command data, in [`BUDGET_UNIT`]s.
    budget: Arc<tokio::sync::Semaphore>,
    budget_units: u32,
    /// The target's budget (shared by all sessions), and its size.
    target_budget: Arc<tokio::sync::Semaphore>,
    target_budget_units: u32,
    /// Backend I/O of this session's commands running on the blocking pool.
    io: Arc<IoCount>,
    send_timeout: Duration,
    data_timeout: Duration,
    /// A send timed out: the connection is being dropped.
    dead: std::sync::atomic::AtomicBool,
    next_ttt: AtomicU32,
    keepalive: (Option<Duration>, Duration),
    /// The TTT and send time of our outstanding ping.
    ping: Mutex<Option<(u32, Instant)>>,
    /// The rest of a Text Response awaiting continuation requests, with its TTT.
    text_rest: Mutex<Option<(u32, Vec<u8>)>>,
}

/// Granularity of the memory budgets.
const BUDGET_UNIT: u64 = 64 << 10;

/// A memory budget of `bytes`, in [`BUDGET_UNIT`]s (at least one).
fn units_of(bytes: u64) -> u32 {
    (bytes / BUDGET_UNIT).clamp(1, u64::from(u32::MAX >> 4)) as u32
}

impl Session {
    fn new(dm: SharedDatamover, o: LoginOutcome, node: Option<Node>, c: &TargetConfig, target_budget: Arc<tokio::sync::Semaphore>) -> Self {
        let nexus = format!("{},i,0x{}", o.params.initiator_name, o.isid.0.iter().map(|b| format!("{b:02x}")).collect::<String>());
        let exp = SerialNumber(o.exp_cmd_sn);
        let budget_units = units_of(c.max_session_bytes);
        Self {
            dm,
            nexus,
            node,
            // The login announced MaxCmdSN = ExpCmdSN + queue_depth − 1.
            seq: Mutex::new(Seq {
                stat_sn: o.stat_sn,
                exp_cmd_sn: exp,
                max_cmd_sn: exp.add(c.queue_depth.max(1) - 1),
                ahead: BTreeSet::new(),
            }),
            limits: o.params.transfer_limits(Role::Target),
            params: o.params,
            tx: tokio::sync::Mutex::new(()),
            tasks: Mutex::new(HashMap::new()),
            immediate: AtomicU32::new(0),
            max_immediate: c.max_immediate_commands,
            budget: Arc::new(tokio::sync::Semaphore::new(budget_units as usize)),
            budget_units,
            target_budget,
            target_budget_units: units_of(c.max_target_bytes),
            io: Arc::new(IoCount::default()),
            send_timeout: c.send_timeout,
            data_timeout: c.data_timeout,
            dead: std::sync::atomic::AtomicBool::new(false),
            next_ttt: AtomicU32::new(1),
            keepalive: (c.nop_interval, c.nop_timeout),
            ping: Mutex::new(None),
            text_rest: Mutex::new(None),
        }
    }

    fn window(&self) -> (u32, u32) {
        let s = lock(&self.seq);
        (s.exp_cmd_sn.0, s.max_cmd_sn.0)
    }

    /// Wait until no backend I/O of the session's commands runs any more.
    async fn quiesce(&self) {
        self.io.wait_idle().await;
    }

    /// A response or data could not be handed to the transport in time: the initiator stopped
    /// reading. The connection is dropped (everything it waits for is ended with it).
    fn send_failed(&self, what: &str) {
        if !self.dead.swap(true, Ordering::AcqRel) {
            warn!(nexus = %self.nexus, what, timeout = ?self.send_timeout, "the initiator takes nothing: dropping the connection");
            self.dm.terminate();
        }
    }

    /// Check and account a non-immediate command's CmdSN (RFC 7143 §4.2.2.1): outside the
    /// window it is silently ignored.
    fn accept_cmd_sn(&self, cmd_sn: u32) -> bool {
        let mut s = lock(&self.seq);
        let max = s.max_cmd_sn;
        let sn = SerialNumber(cmd_sn);
        if !sn.in_window(s.exp_cmd_sn, max) || s.ahead.contains(&cmd_sn) {
            return false;
        }
        if sn == s.exp_cmd_sn {
            s.exp_cmd_sn = s.exp_cmd_sn.add(1);
            loop {
                let next = s.exp_cmd_sn.0;
                if !s.ahead.remove(&next) {
                    break;
                }
                s.exp_cmd_sn = s.exp_cmd_sn.add(1);
            }
        } else {
            s.ahead.insert(cmd_sn);
        }
        true
    }

    fn not_yet_received(&self, cmd_sn: u32) -> bool {
        let s = lock(&self.seq);
        SerialNumber(cmd_sn).in_window(s.exp_cmd_sn, s.max_cmd_sn) && !s.ahead.contains(&cmd_sn)
    }

    /// Send a response PDU, stamping StatSN (advanced when `advance`), ExpCmdSN and MaxCmdSN.
    /// A transport that takes nothing for `send_timeout` ends the connection.
    async fn respond(&self, header: Header, data: Bytes, advance: bool) {
        if tokio::time::timeout(self.send_timeout, self.respond_now(header, data, advance)).await.is_err() {
            self.send_failed("response");
        }
    }

    async fn respond_now(&self, mut header: Header, data: Bytes, advance: bool) {
        let _order = self.tx.lock().await;
        let (exp, max) = self.window();
        let stat_sn = {
            let mut s = lock(&self.seq);
            let v = s.stat_sn;
            if advance {
                s.stat_sn = s.stat_sn.wrapping_add(1);
            }
            v
        };
        match &mut header {
            Header::ScsiResponse(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn) = (stat_sn, exp, max),
            Header::NopIn(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn) = (stat_sn, exp, max),
            Header::TextResponse(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn) = (stat_sn, exp, max),
            Header::TaskMgmtResponse(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn) = (stat_sn, exp, max),
            Header::LogoutResponse(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn) = (stat_sn, exp, max),
            Header::Reject(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn) = (stat_sn, exp, max),
            Header::AsyncMessage(h) => (h.stat_sn, h.exp_cmd_sn, h.max_cmd_sn) = (stat_sn, exp, max),
            _ => {}
        }
        let _ = self.dm.send_control(ControlPdu::new(header, data)).await;
    }

    async fn reject(&self, reason: RejectReason, bad: &Header) {
        let mut bhs = [0u8; BHS_LEN];
        bad.emit(&mut bhs, 0, 0);
        self.reject_raw(reason, bhs).await;
    }

    /// A Reject carrying the offending header as received (RFC 7143 §11.17).
    async fn reject_raw(&self, reason: RejectReason, bhs: [u8; BHS_LEN]) {
        self.respond(Header::Reject(Reject { reason, itt: RESERVED_TAG, ..Reject::default() }), Bytes::copy_from_slice(&bhs), true).await;
    }

    async fn run(self: &Arc<Self>, target: &Arc<Target>, portal: SocketAddr) {
        if let Some(n) = &self.node {
            for lu in &n.luns {
                lu.nexus_seen(&self.nexus);
            }
        }
        loop {
            let event = match self.keepalive.0 {
                Some(idle) => match tokio::time::timeout(idle.min(self.keepalive.1), self.dm.next_event()).await {
                    Ok(ev) => ev,
                    Err(_) => {
                        if !self.keepalive_tick(idle).await {
                            info!(nexus = %self.nexus, "NOP-In ping unanswered: dropping the connection");
                            self.dm.terminate();
                            break;
                        }
                        continue;
                    }
                },
                None => self.dm.next_event().await,
            };
            let pdu = match event {
                DmEvent::Control(p) => p,
                DmEvent::Terminated(why) => {
                    debug!(nexus = %self.nexus, ?why, "connection ended");
                    break;
                }
                DmEvent::Malformed { bhs, error } => {
                    // The datamover kept the framing; the RFC's reaction decides (§7.9).
                    match error.reaction() {
                        Reaction::Reject(reason) => {
                            info!(nexus = %self.nexus, %error, "rejecting a malformed PDU");
                            self.reject_raw(reason, bhs).await;
                        }
                        Reaction::DropConnection => {
                            info!(nexus = %self.nexus, %error, "malformed PDU: dropping the connection");
                            self.dm.terminate();
                            break;
                        }
                    }
                    continue;
                }
                _ => continue,
            };
            // Any PDU shows the initiator is alive.
            if let Header::NopOut(n) = &pdu.header
                && n.itt == RESERVED_TAG
            {
                let mut p = lock(&self.ping);
                if p.is_some_and(|(ttt, _)| ttt == n.ttt) {
                    *p = None;
                }
            } else {
                *lock(&self.ping) = None;
            }
            let discovery = self.params.session_type == SessionType::Discovery;
            match pdu.header {
                Header::ScsiCommand(c) if !discovery => {
                    if c.immediate {
                        // Immediate commands stand outside the window: their own allowance.
                        if self.immediate.fetch_add(1, Ordering::AcqRel) >= self.max_immediate {
                            self.immediate.fetch_sub(1, Ordering::AcqRel);
                            self.dm.deallocate_task_resources(c.itt);
                            self.reject(RejectReason::IMMEDIATE_COMMAND_REJECTED, &pdu.header).await;
                            continue;
                        }
                    } else if !self.accept_cmd_sn(c.cmd_sn) {
                        debug!(cmd_sn = c.cmd_sn, "command outside the CmdSN window ignored");
                        self.dm.deallocate_task_resources(c.itt);
                        continue;
                    }
                    let slot = Slot { session: self.clone(), immediate: c.immediate, held: std::sync::atomic::AtomicBool::new(true) };
                    let me = self.clone();
                    let full_cdb = Pdu::new(pdu.header, pdu.ahs.clone(), Bytes::new()).full_cdb().unwrap_or_default();
                    let imm = pdu.immediate;
                    let gate = Arc::new(IoGate::default());
                    let g = gate.clone();
                    let handle = tokio::spawn(async move {
                        me.command(c, full_cdb, imm, &slot, &g).await;
                        drop(slot);
                        lock(&me.tasks).remove(&c.itt);
                    });
                    lock(&self.tasks).insert(c.itt, (c.lun, handle.abort_handle(), gate));
                }
                Header::NopOut(n) => {
                    if !n.immediate && !self.accept_cmd_sn(n.cmd_sn) {
                        continue;
                    }
                    if n.itt != RESERVED_TAG {
                        let h = Header::NopIn(NopIn { lun: n.lun, itt: n.itt, ttt: RESERVED_TAG, ..NopIn::default() });
                        self.respond(h, pdu.data.clone(), true).await;
                    }
                }
                Header::TextRequest(t) => {
                    if !t.immediate && !self.accept_cmd_sn(t.cmd_sn) {
                        continue;
                    }
                    self.text(t, &pdu.data, target, portal).await;
                }
                Header::TaskMgmtRequest(t) if !discovery => {
                    if !t.immediate && !self.accept_cmd_sn(t.cmd_sn) {
                        continue;
                    }
                    self.task_management(t).await;
                }
                Header::LogoutRequest(l) => {
                    if !l.immediate {
                        self.accept_cmd_sn(l.cmd_sn);
                    }
                    self.abort_all(None);
                    // The nexus ends before the initiator hears so: what it held (a RESERVE(6))
                    // is free by the time it can send anything else.
                    self.nexus_lost();
                    let h = Header::LogoutResponse(LogoutResponse {
                        response: LogoutResponseCode::SUCCESS,
                        itt: l.itt,
                        time2wait: 0,
                        time2retain: 0,
                        ..LogoutResponse::default()
                    });
                    // The logout is answered once no write of the session can still land.
                    self.quiesce().await;
                    self.respond(h, Bytes::new(), true).await;
                    self.dm.terminate();
                    break;
                }
                Header::Snack(_) => self.reject(RejectReason::PROTOCOL_ERROR, &pdu.header).await,
                Header::LoginRequest(_) => self.reject(RejectReason::PROTOCOL_ERROR, &pdu.header).await,
                other => self.reject(RejectReason::COMMAND_NOT_SUPPORTED, &other).await,
            }
        }
        self.abort_all(None);
        self.nexus_lost();
    }

    /// Release what this I_T nexus holds on every LU (idempotent).
    fn nexus_lost(&self) {
        if let Some(n) = &self.node {
            for lu in &n.luns {
                lu.nexus_lost(&self.nexus);
            }
        }
    }

    /// The connection was idle: send a ping (one at a time, so at most one unexpected NOP-In is
    /// outstanding) or, if the last one went unanswered too long, report the connection dead.
    async fn keepalive_tick(&self, _idle: Duration) -> bool {
        let now = Instant::now();
        let outstanding = *lock(&self.ping);
        match outstanding {
            Some((_, sent)) => now.duration_since(sent) < self.keepalive.1,
            None => {
                let ttt = self.next_ttt.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff;
                *lock(&self.ping) = Some((ttt, now));
                let h = Header::NopIn(NopIn { lun: Lun::ZERO, itt: RESERVED_TAG, ttt, ..NopIn::default() });
                // An unsolicited NOP-In carries the next StatSN without advancing it.
                self.respond(h, Bytes::new(), false).await;
                true
            }
        }
    }

    fn lu(&self, lun: Lun) -> Option<Arc<LogicalUnit>> {
        let n = lun.number()?;
        self.node.as_ref()?.luns.iter().find(|l| l.lun().number() == Some(n)).cloned()
    }

    /// Abort the tasks of `lun` (all with `None`); returns their I/O gates: task management
    /// answers only once those are idle (a write on the blocking pool cannot be stopped, and
    /// must not land after the abort is answered).
    fn abort_all(&self, lun: Option<Lun>) -> Vec<Arc<IoGate>> {
        let mut tasks = lock(&self.tasks);
        let victims: Vec<u32> = tasks.iter().filter(|(_, (l, _, _))| lun.is_none_or(|x| *l == x)).map(|(i, _)| *i).collect();
        let mut gates = Vec::new();
        for itt in &victims {
            if let Some((_, h, g)) = tasks.remove(itt) {
                h.abort();
                gates.push(g);
            }
            self.dm.deallocate_task_resources(*itt);
        }
        gates
    }

    async fn task_management(&self, t: TaskMgmtRequest) {
        let mut gates = Vec::new();
        let response = match t.function {
            TmfFunction::ABORT_TASK => {
                let found = lock(&self.tasks).remove(&t.ref_task_tag);
                match found {
                    Some((_, h, g)) => {
                        h.abort();
                        gates.push(g);
                        self.dm.deallocate_task_resources(t.ref_task_tag);
                        TmfResponse::COMPLETE
                    }
                    // RFC 7143 §11.5.1: a task whose command has not arrived yet (RefCmdSN in
                    // the window, not received) counts as aborted; one that already
                    // completed does not exist.
                    None if self.not_yet_received(t.ref_cmd_sn) => TmfResponse::COMPLETE,
                    None => TmfResponse::TASK_DOES_NOT_EXIST,
                }
            }
            TmfFunction::ABORT_TASK_SET | TmfFunction::CLEAR_TASK_SET => {
                if self.lu(t.lun).is_none() {
                    TmfResponse::LUN_DOES_NOT_EXIST
                } else {
                    gates = self.abort_all(Some(t.lun));
                    TmfResponse::COMPLETE
                }
            }
            TmfFunction::LOGICAL_UNIT_RESET => match self.lu(t.lun) {
                None => TmfResponse::LUN_DOES_NOT_EXIST,
                Some(lu) => {
                    for g in self.abort_all(Some(t.lun)) {
                        g.wait_idle().await;
                    }
                    lu.reset();
                    TmfResponse::COMPLETE
                }
            },
            TmfFunction::TARGET_WARM_RESET | TmfFunction::TARGET_COLD_RESET => {
                for g in self.abort_all(None) {
                    g.wait_idle().await;
                }
                if let Some(n) = &self.node {
                    for lu in &n.luns {
                        lu.reset();
                    }
                }
                TmfResponse::COMPLETE
            }
            TmfFunction::TASK_REASSIGN => TmfResponse::REASSIGNMENT_NOT_SUPPORTED,
            TmfFunction::CLEAR_ACA => TmfResponse::NOT_SUPPORTED,
            _ => TmfResponse::REJECTED,
        };
        // No aborted task's backend write may land after this answer.
        for g in gates {
            g.wait_idle().await;
        }
        let h = Header::TaskMgmtResponse(TaskMgmtResponse { response, itt: t.itt, ..TaskMgmtResponse::default() });
        self.respond(h, Bytes::new(), true).await;
        if t.function == TmfFunction::TARGET_COLD_RESET {
            self.dm.terminate();
        }
    }

    async fn text(&self, t: TextRequest, data: &[u8], target: &Arc<Target>, portal: SocketAddr) {
        if t.ttt != RESERVED_TAG {
            // The initiator fetching the next piece of a long answer.
            let pending = lock(&self.text_rest).take();
            match pending {
                Some((ttt, rest)) if ttt == t.ttt => self.send_text(t, rest).await,
                other => {
                    *lock(&self.text_rest) = other;
                    self.reject(RejectReason::INVALID_PDU_FIELD, &Header::TextRequest(t)).await;
                }
            }
            return;
        }
        let pairs = parse_pairs(data).unwrap_or_default();
        let mut out = TextBuilder::new();
        for (k, v) in pairs {
            if k == "SendTargets" {
                let discovery = self.params.session_type == SessionType::Discovery;
                for n in &target.config.nodes {
                    let wanted = if discovery {
                        v == "All" || n.name.eq_ignore_ascii_case(v)
                    } else {
                        // A normal session learns only about its own target.
                        n.name.eq_ignore_ascii_case(&self.params.target_name)
                            && (v.is_empty() || v == "All" || n.name.eq_ignore_ascii_case(v))
                    };
                    let permitted = n.acl.is_empty() || n.acl.iter().any(|a| a.eq_ignore_ascii_case(&self.params.initiator_name));
                    let listed = permitted || (discovery && target.config.discovery_scope == DiscoveryScope::All);
                    if wanted && listed {
                        out.push("TargetName", &n.name);
                        let addr = match portal {
                            SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
                            SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
                        };
                        out.push("TargetAddress", &format!("{addr},{}", target.config.portal_group_tag));
                    }
                }
            } else {
                out.push(k, "NotUnderstood");
            }
        }
        self.send_text(t, out.into_bytes()).await;
    }

    /// Send text as one Text Response, or the first piece of a C-bit sequence when it exceeds
    /// what the initiator receives in one PDU (RFC 7143 §11.10.2); the rest waits for the
    /// initiator's continuation requests (same ITT, our TTT).
    async fn send_text(&self, t: TextRequest, mut text: Vec<u8>) {
        let max = self.limits.send_segment();
        let (piece, more) = if text.len() > max {
            let rest = text.split_off(max);
            (text, Some(rest))
        } else {
            (text, None)
        };
        let ttt = match more {
            Some(rest) => {
                let ttt = self.next_ttt.fetch_add(1, Ordering::Relaxed) & 0x7fff_ffff;
                *lock(&self.text_rest) = Some((ttt, rest));
                ttt
            }
            None => RESERVED_TAG,
        };
        let last = ttt == RESERVED_TAG;
        let h = Header::TextResponse(TextResponse { final_: last, cont: !last, lun: t.lun, itt: t.itt, ttt, ..TextResponse::default() });
        self.respond(h, piece.into(), true).await;
    }

    /// The command's SCSI Response; its window slot is given back first, so the response
    /// already announces the room it leaves.
    async fn scsi_response(&self, c: &ScsiCommand, o: &Outcome, residual: (bool, bool, u32), exp_data_sn: u32, slot: &Slot) {
        slot.release();
        let data = o.sense.as_ref().map(|s| Bytes::from(with_length_prefix(s))).unwrap_or_default();
        let (underflow, overflow, residual) = residual;
        let h = Header::ScsiResponse(ScsiResponse {
            overflow,
            underflow,
            response: 0,
            status: o.status,
            itt: c.itt,
            exp_data_sn,
            residual,
            ..ScsiResponse::default()
        });
        self.respond(h, data, true).await;
    }

    /// CHECK CONDITION with ILLEGAL REQUEST / `asc` for a command refused before it ran (its
    /// write data, if any, is dropped by the datamover).
    async fn refuse(&self, c: &ScsiCommand, lu: &LogicalUnit, asc: AscAscq, slot: &Slot) {
        self.dm.deallocate_task_resources(c.itt);
        let o = Outcome {
            status: Status::CHECK_CONDITION,
            sense: Some(lu.encode_sense(&Sense::new(SenseKey::ILLEGAL_REQUEST, asc))),
            data: Bytes::new(),
        };
        let edtl = c.expected_data_len;
        self.scsi_response(c, &o, if edtl > 0 { (true, false, edtl) } else { (false, false, 0) }, 0, slot).await;
    }

    /// Take `bytes` of the session's memory budget, then of the target's (waiting for room in
    /// each, always in that order), for a command's data.
    async fn reserve(&self, bytes: u64) -> Option<(tokio::sync::OwnedSemaphorePermit, tokio::sync::OwnedSemaphorePermit)> {
        if bytes == 0 {
            return None;
        }
        let units = bytes.div_ceil(BUDGET_UNIT);
        let mine = self.budget.clone().acquire_many_owned(units.min(u64::from(self.budget_units)) as u32).await.ok()?;
        let all = self.target_budget.clone().acquire_many_owned(units.min(u64::from(self.target_budget_units)) as u32).await.ok()?;
        Some((mine, all))
    }

    async fn command(&self, c: ScsiCommand, cdb: Vec<u8>, immediate: u32, slot: &Slot, gate: &Arc<IoGate>) {
        let edtl = c.expected_data_len;
        let Some(lu) = self.lu(c.lun) else {
            self.dm.deallocate_task_resources(c.itt);
            return self.no_such_lun(&c, &cdb, slot).await;
        };
        // What no CDB can justify is refused before anything is planned or allocated: more
        // data than a task buffer holds, immediate data beyond the expected length.
        if c.write && edtl > crate::MAX_DATA_OUT {
            return self.refuse(&c, &lu, AscAscq::INVALID_FIELD_IN_CDB, slot).await;
        }
        if c.write && immediate > edtl {
            self.dm.deallocate_task_resources(c.itt);
            return self.scsi_response(&c, &data_phase_error(&lu), (false, false, 0), 0, slot).await;
        }
        let plan = match lu.plan(&cdb, &self.nexus) {
            Ok(p) => Plan { edtl, ..p },
            Err(o) => {
                self.dm.deallocate_task_resources(c.itt);
                let r = if edtl > 0 { (true, false, edtl) } else { (false, false, 0) };
                return self.scsi_response(&c, &o, r, 0, slot).await;
            }
        };
        let out_len = plan.data_out;
        if c.read && edtl > 0 && out_len == 0 && !self.dm.can_put_data(c.itt) {
            // Read data with nowhere to go (an iSER command without a read STag): the command
            // ends here, before the medium is read, and the connection goes on.
            debug!(itt = c.itt, "read data expected but the datamover cannot deliver it");
            self.dm.deallocate_task_resources(c.itt);
            return self.scsi_response(&c, &data_phase_error(&lu), (true, false, edtl), 0, slot).await;
        }
        if !c.write && out_len > 0 {
            // The CDB wants data the initiator did not announce.
            self.dm.deallocate_task_resources(c.itt);
            let o = Outcome {
                status: Status::CHECK_CONDITION,
                sense: Some(lu.encode_sense(&Sense::new(SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_CDB))),
                data: Bytes::new(),
            };
            return self.scsi_response(&c, &o, (false, true, out_len), 0, slot).await;
        }
        // The command's memory: its write data, or the read data it may produce.
        let _budget = self.reserve(u64::from(edtl)).await;
        let mut data_out = Bytes::new();
        if c.write && edtl > 0 {
            match tokio::time::timeout(self.data_timeout, self.fetch_write_data(&c, immediate, out_len)).await {
                Ok(Ok(b)) => data_out = b,
                Ok(Err(riser_datamover::DmError::Closed | riser_datamover::DmError::Io(_))) => return,
                Ok(Err(e)) => {
                    debug!(itt = c.itt, %e, "write data out of sequence");
                    return self.scsi_response(&c, &data_phase_error(&lu), (false, false, 0), 0, slot).await;
                }
                Err(_) => {
                    warn!(itt = c.itt, timeout = ?self.data_timeout, "write data did not arrive");
                    self.dm.deallocate_task_resources(c.itt);
                    return self.scsi_response(&c, &data_phase_error(&lu), (false, false, 0), 0, slot).await;
                }
            }
        }
        let usable = out_len.min(edtl) as usize;
        if data_out.len() < usable {
            // Never write what was not received (a buffer short of the data the CDB uses).
            warn!(itt = c.itt, got = data_out.len(), usable, "write data incomplete");
            return self.scsi_response(&c, &data_phase_error(&lu), (false, false, 0), 0, slot).await;
        }
        let (o, data_out) = if !lu.may_block(&plan) {
            // Memory-speed backends run inline; a thread hand-off would cost more than the I/O.
            (lu.execute(&plan, &data_out[..usable], &self.nexus), data_out)
        } else {
            // The blocking pool runs the I/O to its end even if this task is aborted meanwhile:
            // the gate tells task management (and the session's end) when it is over.
            let lu2 = lu.clone();
            let nexus = self.nexus.clone();
            let plan2: Plan = plan.clone();
            // A SANITIZE is not waited for: it goes on across task management and reinstatement
            // by design, and the LU fences the medium while it runs.
            let gated = !lu.outlives_its_task(&plan);
            if gated {
                gate.busy.store(true, Ordering::Release);
                self.io.enter();
            }
            let (g, io) = (gate.clone(), self.io.clone());
            let Ok(r) = tokio::task::spawn_blocking(move || {
                let r = (lu2.execute(&plan2, &data_out[..usable], &nexus), data_out);
                if gated {
                    g.busy.store(false, Ordering::Release);
                    g.idle.notify_waiters();
                    io.leave();
                }
                r
            })
            .await
            else {
                return;
            };
            r
        };
        // The write data is consumed: let the datamover reuse its buffer.
        if let Ok(buf) = data_out.try_into_mut() {
            self.dm.release_task_buffer(riser_datamover::TaskBuffer { data: buf });
        }
        let mut residual = (false, false, 0u32);
        let mut pdus = 0;
        if c.write || out_len > 0 {
            if edtl < out_len {
                residual = (false, true, out_len - edtl);
            } else if edtl > out_len {
                residual = (true, false, edtl - out_len);
            }
        } else {
            let produced = o.data.len() as u32;
            let send = produced.min(edtl);
            if produced > edtl {
                residual = (false, true, produced - edtl);
            } else if produced < edtl {
                residual = (true, false, edtl - produced);
            }
            if send > 0 && c.read && o.status == Status::GOOD && o.sense.is_none() && self.dm.collapses_status() {
                // Phase collapse (RFC 7143 §11.7.4): GOOD status rides in the last Data-In, which
                // then takes the next StatSN; the response order lock keeps StatSNs in order.
                let sent = tokio::time::timeout(self.send_timeout, async {
                    let _order = self.tx.lock().await;
                    slot.release();
                    let (exp, max) = self.window();
                    let stat_sn = {
                        let mut s = lock(&self.seq);
                        let v = s.stat_sn;
                        s.stat_sn = s.stat_sn.wrapping_add(1);
                        v
                    };
                    let (underflow, overflow, count) = residual;
                    let collapse = riser_datamover::CollapsedStatus {
                        status: o.status,
                        underflow,
                        overflow,
                        residual: count,
                        stat_sn,
                        exp_cmd_sn: exp,
                        max_cmd_sn: max,
                    };
                    let desc =
                        riser_datamover::DataInDesc { itt: c.itt, lun: c.lun, offset: 0, data_sn: 0, collapse_status: Some(collapse) };
                    self.dm.put_data(desc, o.data.slice(..send as usize)).await
                })
                .await;
                match sent {
                    Ok(Ok(d)) if d.status_sent => {
                        lu.recycle(o.data);
                        return;
                    }
                    Ok(Ok(d)) => pdus = d.pdus,
                    Ok(Err(_)) => return,
                    Err(_) => return self.send_failed("Data-In"),
                }
            } else if send > 0 && c.read {
                let desc = riser_datamover::DataInDesc { itt: c.itt, lun: c.lun, offset: 0, data_sn: 0, collapse_status: None };
                match tokio::time::timeout(self.send_timeout, self.dm.put_data(desc, o.data.slice(..send as usize))).await {
                    Ok(Ok(d)) => pdus = d.pdus,
                    Ok(Err(_)) => return,
                    Err(_) => return self.send_failed("Data-In"),
                }
            } else if send > 0 {
                residual = (true, false, edtl);
            }
        }
        self.scsi_response(&c, &o, residual, pdus, slot).await;
        lu.recycle(o.data);
    }

    /// Collect a write's data: the unsolicited part the initiator announced (immediate data,
    /// then Data-Out up to FirstBurstLength unless InitialR2T=Yes or F=1), then solicited up to
    /// what the CDB uses (`out_len`, at most the expected length) — never more, so the R2Ts a
    /// command costs are bounded by its CDB, not by its expected length.
    async fn fetch_write_data(&self, c: &ScsiCommand, immediate: u32, out_len: u32) -> Result<Bytes, riser_datamover::DmError> {
        let edtl = c.expected_data_len;
        let unsolicited_end = self.limits.incoming_write(edtl, immediate, c.final_).unsolicited_end;
        let end = out_len.min(edtl).max(unsolicited_end);
        let (exp, max) = self.window();
        let mut plan = riser_datamover::R2tPlan {
            itt: c.itt,
            lun: c.lun,
            start: unsolicited_end,
            end,
            max_burst: self.limits.burst() as u32,
            first_ttt: 0,
            stat_sn: lock(&self.seq).stat_sn,
            exp_cmd_sn: exp,
            max_cmd_sn: max,
        };
        plan.first_ttt = self.next_ttt.fetch_add(plan.count().max(1), Ordering::Relaxed) & 0x7fff_ffff;
        match self.dm.get_data(plan).await {
            Ok(b) if b.data.len() == end as usize => Ok(b.data.freeze()),
            Ok(b) => Err(SequenceError::WrongLength { got: b.data.len() as u32, due: end }.into()),
            Err(e) => {
                warn!(itt = c.itt, %e, "write data not received");
                Err(e)
            }
        }
    }

    async fn no_such_lun(&self, c: &ScsiCommand, cdb: &[u8], slot: &Slot) {
        // INQUIRY and REPORT LUNS work on any LUN; everything else: LOGICAL UNIT NOT SUPPORTED.
        let first = self.node.as_ref().and_then(|n| n.luns.first().cloned());
        match (cdb.first(), first) {
            (Some(&0x12), _) => {
                let mut data = riser_scsi::inquiry::StandardInquiry::disk("RISER", "RISER DISK", "0001");
                data.peripheral = riser_scsi::inquiry::NOT_PRESENT;
                let alloc = cdb.get(3..5).map(|b| u16::from_be_bytes([b[0], b[1]])).unwrap_or(0);
                let mut bytes = data.to_bytes();
                bytes.truncate(usize::from(alloc).min(c.expected_data_len as usize));
                let n = bytes.len() as u32;
                let desc = riser_datamover::DataInDesc { itt: c.itt, lun: c.lun, offset: 0, data_sn: 0, collapse_status: None };
                let pdus = if n > 0 { self.dm.put_data(desc, bytes.into()).await.map(|d| d.pdus).unwrap_or(0) } else { 0 };
                let o = Outcome { status: Status::GOOD, sense: None, data: Bytes::new() };
                let r = if c.expected_data_len > n { (true, false, c.expected_data_len - n) } else { (false, false, 0) };
                self.scsi_response(c, &o, r, pdus, slot).await;
            }
            (_, Some(lu)) if cdb.first() == Some(&0xa0) => {
                let nexus = self.nexus.clone();
                if let Ok(plan) = lu.plan(cdb, &nexus) {
                    let o = lu.execute(&plan, &[], &nexus);
                    let n = (o.data.len() as u32).min(c.expected_data_len);
                    let desc = riser_datamover::DataInDesc { itt: c.itt, lun: c.lun, offset: 0, data_sn: 0, collapse_status: None };
                    let pdus =
                        if n > 0 { self.dm.put_data(desc, o.data.slice(..n as usize)).await.map(|d| d.pdus).unwrap_or(0) } else { 0 };
                    let r = if c.expected_data_len > n { (true, false, c.expected_data_len - n) } else { (false, false, 0) };
                    self.scsi_response(c, &o, r, pdus, slot).await;
                }
            }
            _ => {
                let s = Sense::new(SenseKey::ILLEGAL_REQUEST, AscAscq::LOGICAL_UNIT_NOT_SUPPORTED);
                let o = Outcome { status: Status::CHECK_CONDITION, sense: Some(s.to_fixed().to_vec().into()), data: Bytes::new() };
                self.scsi_response(
                    c,
                    &o,
                    if c.expected_data_len > 0 { (true, false, c.expected_data_len) } else { (false, false, 0) },
                    0,
                    slot,
                )
                .await;
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
    fn tsihs_start_somewhere_random() {
        // Every target used to start at TSIH 1. Four targets all starting at the same point
        // now has odds of 2^-48.
        let starts: Vec<u16> = (0..4).map(|_| Target::new(TargetConfig::default()).next_tsih.load(Ordering::Relaxed)).collect();
        assert!(starts.iter().all(|&t| t != 0));
        assert!(starts.iter().any(|&t| t != starts[0]), "TSIHs start at {starts:?}");
    }
}
