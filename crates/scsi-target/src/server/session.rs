//! The driver of one session's full feature phase: it feeds the datamover's events to the
//! sans-IO [`TargetSession`] (riser-iscsi), sends what the machine queues, and does what the
//! machine asks — run commands on the logical units, abort tasks and wait for their backend
//! I/O, reset units, answer text and logout. The protocol decisions (window, StatSN, tags,
//! task management outcomes, keepalive, rejects) are the machine's.

use super::{DiscoveryScope, Node, Target, TargetConfig, lock};
use crate::lu::LogicalUnit;
use bytes::Bytes;
use riser_datamover::{ControlPdu, DmEvent, SharedDatamover};
use riser_iscsi::login::LoginOutcome;
use riser_iscsi::session::{Reset, TargetEvent, TargetSession, TargetSessionConfig, TaskId};
use riser_iscsi::text::{TextBuilder, parse_pairs};
use riser_iscsi::wire::{Header, LogoutRequest};
use riser_scsi::lun::Lun;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

/// Whether a task's backend I/O runs (on the blocking pool, where aborting the task's future
/// does not stop it).
#[derive(Debug, Default)]
pub(super) struct IoGate {
    pub(super) busy: AtomicBool,
    pub(super) idle: tokio::sync::Notify,
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

/// Backend I/O operations of a session running on the blocking pool.
#[derive(Debug, Default)]
pub(super) struct IoCount {
    running: AtomicUsize,
    idle: tokio::sync::Notify,
}

impl IoCount {
    pub(super) fn enter(&self) {
        self.running.fetch_add(1, Ordering::AcqRel);
    }
    pub(super) fn leave(&self) {
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

/// A command's hold on its task: ended by its status ([`Slot::take`]), or, if the command's
/// future is dropped first (aborted, connection lost), by the drop.
pub(super) struct Slot {
    session: Arc<Session>,
    task: TaskId,
    held: AtomicBool,
}

impl Slot {
    /// The task, once: whoever takes it ends it.
    pub(super) fn take(&self) -> Option<TaskId> {
        self.held.swap(false, Ordering::AcqRel).then_some(self.task)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(t) = self.take() {
            lock(&self.session.core).drop_task(t);
        }
    }
}

/// The least size of the running-command table at which ended commands are swept out.
const SWEEP_MIN: usize = 64;

/// Granularity of the memory budgets.
pub(super) const BUDGET_UNIT: u64 = 64 << 10;

/// A memory budget of `bytes`, in [`BUDGET_UNIT`]s (at least one).
pub(super) fn units_of(bytes: u64) -> u32 {
    (bytes / BUDGET_UNIT).clamp(1, u64::from(u32::MAX >> 4)) as u32
}

pub(super) struct Session {
    pub(super) dm: SharedDatamover,
    /// The protocol state: window, StatSN, tasks, tags, keepalive.
    pub(super) core: Mutex<TargetSession>,
    /// The clock's origin for the machine.
    epoch: Instant,
    pub(super) node: Option<Node>,
    pub(super) nexus: String,
    discovery: bool,
    initiator_name: String,
    target_name: String,
    /// Serialises sending: PDUs leave in the order the machine stamped them.
    pub(super) tx: tokio::sync::Mutex<()>,
    /// The running commands: the handle to abort each, and its backend I/O's gate (ended ones
    /// linger until the next sweep).
    running: Mutex<HashMap<TaskId, (AbortHandle, Arc<IoGate>)>>,
    /// Size of `running` at which ended commands are swept out.
    sweep_at: AtomicUsize,
    /// The session's memory budget for command data, in [`BUDGET_UNIT`]s.
    pub(super) budget: Arc<tokio::sync::Semaphore>,
    pub(super) budget_units: u32,
    /// The target's budget (shared by all sessions), and its size.
    pub(super) target_budget: Arc<tokio::sync::Semaphore>,
    pub(super) target_budget_units: u32,
    /// Backend I/O of this session's commands running on the blocking pool.
    pub(super) io: Arc<IoCount>,
    pub(super) send_timeout: Duration,
    pub(super) data_timeout: Duration,
    /// A send timed out: the connection is being dropped.
    dead: AtomicBool,
}

impl Session {
    pub(super) fn new(
        dm: SharedDatamover,
        o: LoginOutcome,
        node: Option<Node>,
        c: &TargetConfig,
        target_budget: Arc<tokio::sync::Semaphore>,
    ) -> Self {
        let nexus = format!("{},i,0x{}", o.params.initiator_name, o.isid.0.iter().map(|b| format!("{b:02x}")).collect::<String>());
        let budget_units = units_of(c.max_session_bytes);
        let luns = node.as_ref().map(|n| n.luns.iter().map(|l| l.lun()).collect::<Vec<_>>()).unwrap_or_default();
        let cfg = TargetSessionConfig::new(c.queue_depth)
            .max_immediate_commands(c.max_immediate_commands)
            .keepalive(c.nop_interval, c.nop_timeout)
            .luns(luns);
        let core = TargetSession::new(cfg, &o, Duration::ZERO);
        Self {
            dm,
            core: Mutex::new(core),
            epoch: Instant::now(),
            nexus,
            node,
            discovery: o.params.session_type == riser_iscsi::keys::SessionType::Discovery,
            initiator_name: o.params.initiator_name,
            target_name: o.params.target_name,
            tx: tokio::sync::Mutex::new(()),
            running: Mutex::new(HashMap::new()),
            sweep_at: AtomicUsize::new(SWEEP_MIN),
            budget: Arc::new(tokio::sync::Semaphore::new(budget_units as usize)),
            budget_units,
            target_budget,
            target_budget_units: units_of(c.max_target_bytes),
            io: Arc::new(IoCount::default()),
            send_timeout: c.send_timeout,
            data_timeout: c.data_timeout,
            dead: AtomicBool::new(false),
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// Wait until no backend I/O of the session's commands runs any more.
    pub(super) async fn quiesce(&self) {
        self.io.wait_idle().await;
    }

    /// A response or data could not be handed to the transport in time: the initiator stopped
    /// reading. The connection is dropped (everything it waits for is ended with it).
    pub(super) fn send_failed(&self, what: &str) {
        if !self.dead.swap(true, Ordering::AcqRel) {
            warn!(nexus = %self.nexus, what, timeout = ?self.send_timeout, "the initiator takes nothing: dropping the connection");
            self.dm.terminate();
        }
    }

    /// Send what the machine queued, in order; the caller holds `tx`.
    pub(super) async fn flush_locked(&self) {
        loop {
            let next = lock(&self.core).poll_transmit();
            let Some(t) = next else { return };
            let _ = self.dm.send_control(ControlPdu::new(t.header, t.data)).await;
        }
    }

    /// Send what the machine queued. A transport that takes nothing for `send_timeout` ends
    /// the connection.
    pub(super) async fn flush(&self) {
        let sent = tokio::time::timeout(self.send_timeout, async {
            let _order = self.tx.lock().await;
            self.flush_locked().await;
        })
        .await;
        if sent.is_err() {
            self.send_failed("response");
        }
    }

    pub(super) fn lu(&self, lun: Lun) -> Option<Arc<LogicalUnit>> {
        let n = lun.number()?;
        self.node.as_ref()?.luns.iter().find(|l| l.lun().number() == Some(n)).cloned()
    }

    pub(super) async fn run(self: &Arc<Self>, target: &Arc<Target>, portal: SocketAddr) {
        if let Some(n) = &self.node {
            for lu in &n.luns {
                lu.nexus_seen(&self.nexus);
            }
        }
        // One timer for the connection, re-armed only when the machine wants to be woken
        // earlier than it is set for. Its deadline moves later with every PDU (keepalive counts
        // from the last one heard); arming a timer per PDU cost ~500 instructions. Woken early,
        // `handle_timeout` finds nothing due and the timer is armed anew.
        let timer = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(timer);
        let mut armed: Option<Instant> = None;
        loop {
            let deadline = lock(&self.core).poll_timeout().and_then(|at| self.epoch.checked_add(at));
            match (deadline, armed) {
                (Some(d), Some(a)) if d >= a => {}
                (Some(d), _) => {
                    timer.as_mut().reset(d.into());
                    armed = Some(d);
                }
                (None, _) => armed = None,
            }
            let event = if armed.is_some() {
                tokio::select! {
                    biased;
                    e = self.dm.next_event() => Some(e),
                    () = &mut timer => {
                        armed = None;
                        None
                    }
                }
            } else {
                Some(self.dm.next_event().await)
            };
            // The one clock reading per PDU.
            let now = self.now();
            match event {
                None => lock(&self.core).handle_timeout(now),
                Some(DmEvent::Control(p)) => lock(&self.core).handle_pdu(now, &p.header, p.ahs, p.data, p.immediate),
                Some(DmEvent::Malformed { bhs, error }) => {
                    info!(nexus = %self.nexus, %error, "malformed PDU");
                    lock(&self.core).handle_malformed(now, bhs, error);
                }
                Some(DmEvent::Terminated(why)) => {
                    debug!(nexus = %self.nexus, ?why, "connection ended");
                    break;
                }
                Some(_) => continue,
            }
            if !self.drive(target, portal).await {
                break;
            }
        }
        let tasks: Vec<TaskId> = lock(&self.running).iter().filter(|(_, (h, _))| !h.is_finished()).map(|(t, _)| *t).collect();
        self.abort(&tasks);
        for t in tasks {
            self.dm.deallocate_task_resources(t.itt);
        }
        self.nexus_lost();
    }

    /// Do what the machine asks, and send what it queued; `false` once the connection ends.
    async fn drive(self: &Arc<Self>, target: &Arc<Target>, portal: SocketAddr) -> bool {
        loop {
            let event = lock(&self.core).poll_event();
            let Some(event) = event else { break };
            match event {
                TargetEvent::Command { task, cmd, ahs, split } => self.spawn_command(task, cmd, ahs, split),
                TargetEvent::Discard { itt } => self.dm.deallocate_task_resources(itt),
                TargetEvent::TaskManagement { itt, aborted, reset } => {
                    // Answered only once no aborted task's backend write can still land.
                    for g in self.abort_tags(&aborted) {
                        g.wait_idle().await;
                    }
                    match reset {
                        Reset::None => {}
                        Reset::Unit(lun) => {
                            if let Some(lu) = self.lu(lun) {
                                lu.reset();
                            }
                        }
                        Reset::Target => {
                            if let Some(n) = &self.node {
                                for lu in &n.luns {
                                    lu.reset();
                                }
                            }
                        }
                    }
                    lock(&self.core).complete_task_management(itt);
                }
                TargetEvent::Text { req, data } => {
                    let text = self.text_answer(&data, target, portal);
                    lock(&self.core).answer_text(req, text);
                }
                TargetEvent::Logout { req, aborted } => self.logout(req, &aborted).await,
                TargetEvent::Close(why) => {
                    self.flush().await;
                    info!(nexus = %self.nexus, ?why, "closing the connection");
                    self.dm.terminate();
                    return false;
                }
                _ => {}
            }
        }
        // Most PDUs (commands, Data-Out) queue nothing to send: the receive loop must not then
        // wait for the send order lock, which a command may hold while its data goes out.
        if lock(&self.core).has_transmit() {
            self.flush().await;
        }
        true
    }

    fn spawn_command(
        self: &Arc<Self>,
        task: TaskId,
        cmd: riser_iscsi::wire::ScsiCommand,
        ahs: Bytes,
        split: riser_iscsi::session::WriteSplit,
    ) {
        let slot = Slot { session: self.clone(), task, held: AtomicBool::new(true) };
        let me = self.clone();
        let full_cdb = riser_iscsi::wire::Pdu::new(Header::ScsiCommand(cmd), ahs, Bytes::new()).full_cdb().unwrap_or_default();
        let gate = Arc::new(IoGate::default());
        let g = gate.clone();
        // The command is spawned before its registration, and does not unregister itself: a
        // lock held across the spawn, and one more at its end, cost a cross-thread wake-up per
        // command. Ended commands are swept out as the table grows (a stale entry is harmless:
        // its TaskId is never reused, aborting it does nothing and its gate is idle).
        //
        // The command's future is large (its every await point's state): boxed, it is written
        // once into its allocation; spawned by value, the runtime moved it about ten times
        // (~1 700 instructions of memcpy per command).
        let handle = tokio::spawn(Box::pin(async move {
            me.command(cmd, full_cdb, split, &slot, &g).await;
        }));
        let mut running = lock(&self.running);
        if running.len() >= self.sweep_at.load(Ordering::Relaxed) {
            running.retain(|_, (h, _)| !h.is_finished());
            self.sweep_at.store((2 * running.len()).max(SWEEP_MIN), Ordering::Relaxed);
        }
        running.insert(task, (handle.abort_handle(), gate));
    }

    /// Abort the running commands the machine ended; returns their I/O gates.
    /// (Their datamover resources go too.)
    fn abort_tags(&self, itts: &[u32]) -> Vec<Arc<IoGate>> {
        let tasks: Vec<TaskId> = lock(&self.running).keys().filter(|t| itts.contains(&t.itt)).copied().collect();
        let gates = self.abort(&tasks);
        for itt in itts {
            self.dm.deallocate_task_resources(*itt);
        }
        gates
    }

    /// Stop these commands' futures (backend I/O on the blocking pool runs on; the gates
    /// tell when it is over).
    fn abort(&self, tasks: &[TaskId]) -> Vec<Arc<IoGate>> {
        let mut running = lock(&self.running);
        tasks
            .iter()
            .filter_map(|t| running.remove(t))
            .map(|(h, g)| {
                h.abort();
                g
            })
            .collect()
    }

    async fn logout(&self, req: LogoutRequest, aborted: &[u32]) {
        self.abort_tags(aborted);
        // The nexus ends before the initiator hears so: what it held (a RESERVE(6)) is free
        // by the time it can send anything else.
        self.nexus_lost();
        // The logout is answered once no write of the session can still land.
        self.quiesce().await;
        lock(&self.core).answer_logout(&req);
    }

    /// Release what this I_T nexus holds on every LU (idempotent).
    fn nexus_lost(&self) {
        if let Some(n) = &self.node {
            for lu in &n.luns {
                lu.nexus_lost(&self.nexus);
            }
        }
    }

    /// The answer to a text request: SendTargets (RFC 7143 §12.3); every other key is not
    /// understood.
    fn text_answer(&self, data: &[u8], target: &Arc<Target>, portal: SocketAddr) -> Vec<u8> {
        let pairs = parse_pairs(data).unwrap_or_default();
        let mut out = TextBuilder::new();
        for (k, v) in pairs {
            if k != "SendTargets" {
                out.push(k, "NotUnderstood");
                continue;
            }
            for n in target.config.nodes.iter().map(|n| &n.target) {
                let wanted = if self.discovery {
                    v == "All" || n.name.eq_ignore_ascii_case(v)
                } else {
                    // A normal session learns only about its own target.
                    n.name.eq_ignore_ascii_case(&self.target_name) && (v.is_empty() || v == "All" || n.name.eq_ignore_ascii_case(v))
                };
                let acl = &n.allowed_initiators;
                let permitted = acl.is_empty() || acl.iter().any(|a| a.eq_ignore_ascii_case(&self.initiator_name));
                let listed = permitted || (self.discovery && target.config.discovery_scope == DiscoveryScope::All);
                if wanted && listed {
                    out.push("TargetName", &n.name);
                    let addr = match portal {
                        SocketAddr::V4(a) => format!("{}:{}", a.ip(), a.port()),
                        SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
                    };
                    out.push("TargetAddress", &format!("{addr},{}", target.config.login.portal_group_tag));
                }
            }
        }
        out.into_bytes()
    }
}
