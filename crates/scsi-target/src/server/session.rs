//! The driver of one session's full feature phase: it feeds the datamover's events to the
//! sans-IO [`TargetSession`] (riser-iscsi), sends what the machine queues, and does what the
//! machine asks — run commands on the logical units, abort tasks and wait for their backend
//! I/O, reset units, answer text and logout. The protocol decisions (window, StatSN, tags,
//! task management outcomes, keepalive, rejects) are the machine's.

use super::command::Command;
use super::stats::Op;
use super::view::{LunPath, PathGuard, View};
use super::{DiscoveryScope, Quiesce, Target, TargetConfig, lock};
use crate::lu::{LogicalUnit, Nexus};
use bytes::Bytes;
use futures_util::future::Either;
use riser_datamover::{Attempt, ControlPdu, DataInDesc, DmError, DmEvent, PutDataDone, SharedDatamover};
use riser_iscsi::keys::{NegotiatedParams, Transport};
use riser_iscsi::login::LoginOutcome;
use riser_iscsi::session::{Reset, TargetEvent, TargetSession, TargetSessionConfig, TaskId};
use riser_iscsi::text::{TextBuilder, parse_pairs};
use riser_iscsi::wire::{Isid, LogoutRequest};
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::AbortHandle;
use tracing::{debug, info, warn};

/// Whether a task's backend I/O runs (on the blocking pool, where aborting the task's future
/// does not stop it).
///
/// Aborting a task on another thread takes effect only at its next yield: a command polled
/// meanwhile could still start its I/O after the aborter found the gate idle. So the aborter
/// sets `aborted` and then looks at `busy`, and a command sets `busy` and then looks at
/// `aborted` (both sequentially consistent): either the aborter sees the I/O and waits for
/// it, or the command sees the abort and does not start it ([`IoGate::enter`]).
#[derive(Debug, Default)]
pub(super) struct IoGate {
    pub(super) busy: AtomicBool,
    aborted: AtomicBool,
    pub(super) idle: tokio::sync::Notify,
    /// The unit the task's I/O goes to, by address (0: none); an identity only, so a command
    /// touches no shared reference count for it.
    unit: usize,
    /// The LUN the task was sent to (which may name another unit by the time it is reset).
    lun: Lun,
}

/// A unit's identity as [`IoGate`] keeps it.
fn unit_id(lu: &LogicalUnit) -> usize {
    std::ptr::from_ref(lu) as usize
}

/// The gates of the tasks on `lu` among `gates`.
fn gates_of(gates: &[Arc<IoGate>], lu: &LogicalUnit) -> Vec<Arc<IoGate>> {
    gates.iter().filter(|g| g.unit == unit_id(lu)).cloned().collect()
}

impl IoGate {
    /// The task's I/O is about to start: `false` (and the gate left idle) if the task was
    /// aborted already.
    pub(super) fn enter(&self) -> bool {
        self.busy.store(true, Ordering::SeqCst);
        if self.aborted.load(Ordering::SeqCst) {
            self.leave();
            return false;
        }
        true
    }

    /// The task's I/O is over.
    pub(super) fn leave(&self) {
        self.busy.store(false, Ordering::SeqCst);
        self.idle.notify_waiters();
    }

    /// Whether the task has been aborted.
    pub(super) fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// The task is being aborted: no I/O of it starts from now on.
    pub(super) fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
    }

    pub(super) async fn wait_idle(&self) {
        loop {
            let n = self.idle.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if !self.busy.load(Ordering::SeqCst) {
                return;
            }
            n.await;
        }
    }
}

/// How long a reset waits for the unit's other gateways to have it before it is answered
/// anyway (a gateway that does not answer is taken over and fenced by the others). The RBD
/// gateway says so once the others acknowledged or its notification timed out (4 s:
/// `RESET_NOTIFY_TIMEOUT_MS`), after what its thread was doing when the reset was queued;
/// this bound is for a thread stuck longer in the cluster.
const RESET_TOLD_TIMEOUT: Duration = Duration::from_secs(15);

/// Another session reset a unit this one sees: its tasks there are to end (SAM-5 §6.3.3), in
/// its own connection's loop (the only place its machine and its running commands change
/// together); the gates of their backend I/O go back to the resetting session, which answers
/// once that I/O is over.
struct ResetElsewhere {
    lu: Arc<LogicalUnit>,
    done: tokio::sync::oneshot::Sender<Vec<Arc<IoGate>>>,
}

/// Other sessions' asks to end this session's tasks on units they reset.
#[derive(Default)]
struct ResetAsks {
    /// Not yet seen to.
    waiting: Vec<ResetElsewhere>,
    /// While this session answers task management of its own: the gates of the tasks it
    /// ended (a concurrent reset of their unit by another session or gateway finds them gone
    /// from the machine and must wait for their I/O all the same). Given, those of the asked
    /// unit, with every answer meanwhile.
    own: Vec<Arc<IoGate>>,
    /// Once the session's loop has ended: the gates of the tasks it ended then (their I/O may
    /// run on), given as the answer to every ask.
    ended: Option<Vec<Arc<IoGate>>>,
    /// The gates of the tasks this session ended for other sessions' resets, while their I/O
    /// may still run: those tasks are gone from its machine, so every task management request
    /// of its own waits for them too (an ABORT TASK of one finds no task, and must not be
    /// answered while its write can still land), and every answer to an ask carries them.
    handed: Vec<Arc<IoGate>>,
}

impl ResetAsks {
    /// The gates handed out whose I/O may still run.
    fn handed(&mut self) -> Vec<Arc<IoGate>> {
        // The aborter's half of `IoGate`'s handshake (each gate here was aborted first).
        self.handed.retain(|g| g.busy.load(Ordering::SeqCst));
        self.handed.clone()
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
    #[cfg(test)]
    pub(super) fn running(&self) -> usize {
        self.running.load(Ordering::Acquire)
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
/// future is dropped first (aborted, connection lost), by the drop. It also holds the command's
/// path to its logical unit (none for an unknown LUN or REPORT LUNS), where the command is
/// counted.
pub(super) struct Slot {
    session: Arc<Session>,
    task: TaskId,
    held: AtomicBool,
    path: Option<PathGuard>,
    op: Op,
    /// When the command arrived (the session's clock).
    start: Duration,
}

impl Slot {
    /// The task, once: whoever takes it ends it.
    pub(super) fn take(&self) -> Option<TaskId> {
        self.held.swap(false, Ordering::AcqRel).then_some(self.task)
    }

    /// The command's path to its logical unit.
    pub(super) fn path(&self) -> Option<&Arc<LunPath>> {
        self.path.as_ref().map(PathGuard::path)
    }

    /// The command ends with `status` (and `sense`): count it.
    pub(super) fn count(&self, status: Status, sense: Option<&[u8]>) {
        if let Some(p) = self.path() {
            p.counters.command(self.op, status, sense, self.session.now().saturating_sub(self.start));
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if let Some(t) = self.take() {
            lock(&self.session.core).drop_task(t);
        }
    }
}

/// REPORT LUNS's operation code.
const REPORT_LUNS: u8 = 0xa0;

/// The largest transfer of a command run in the session's receiving task.
const INLINE_MAX: u32 = 64 << 10;

/// PDUs a turn handles before what they produced leaves (then again every as many, and at the
/// turn's end). The answers to the first commands of a burst then reach the initiator while
/// the rest are handled, and both sides work at once instead of in turn. With the initiator's
/// own slices (riser-tcp's `FLUSH_EVERY`), riser initiator to riser target, 4 KiB random
/// reads at QD 32, each side on its own core of a 2-core machine, went from 136–150k to
/// 282–364k IOPS (interleaved runs); before, each side was idle about half the time.
const TURN_SLICE: u32 = 8;

/// Whether a command runs in the session's receiving task: it moves at most [`INLINE_MAX`]
/// bytes, needs no write data beyond what came with it (nothing to wait for from the
/// initiator) and it ends at memory speed — REPORT
/// LUNS, a LUN the nexus does not see, or one of the common commands on a unit whose store is in
/// memory ([`LogicalUnit::at_memory_speed`]). Everything else (Data-Out to collect, a store that
/// blocks or completes later, a rare command that may take long) gets a task of its own.
fn runs_inline(
    cmd: &riser_iscsi::wire::ScsiCommand,
    opcode: u8,
    split: riser_iscsi::session::WriteSplit,
    lu: Option<&LogicalUnit>,
) -> bool {
    // A large transfer gets a task of its own: its copy and its writes would hold up the
    // session's other commands, which other cores may serve meanwhile (a session's 128 KiB reads
    // at QD 32 lost a third of their throughput inline).
    if cmd.expected_data_len > INLINE_MAX || (cmd.write && split.immediate < cmd.expected_data_len) {
        return false;
    }
    let Some(lu) = lu else { return true };
    lu.at_memory_speed()
        && matches!(
            opcode,
            // TEST UNIT READY, REQUEST SENSE, INQUIRY, MODE SENSE(6/10), READ CAPACITY(10),
            // SERVICE ACTION IN(16), SYNCHRONIZE CACHE(10/16)
            0x00 | 0x03 | 0x12 | 0x1a | 0x5a | 0x25 | 0x9e | 0x35 | 0x91
            // READ and WRITE (6, 10, 12, 16)
            | 0x08 | 0x28 | 0xa8 | 0x88 | 0x0a | 0x2a | 0xaa | 0x8a
        )
}

/// The least size of the running-command table at which ended commands are swept out.
const SWEEP_MIN: usize = 64;

/// Granularity of the memory budgets.
pub(super) const BUDGET_UNIT: u64 = 64 << 10;

/// [`tokio::time::timeout`], the timer armed only if `fut` is not done at its first poll: most
/// sends are done at once, and arming a timer costs a clock reading and a hold on the runtime.
/// (The limit then counts from the first poll that found it not done.)
///
/// `fut` is pinned by the caller, where it lies: taken by value it would be stored twice in this
/// future (as the argument and pinned), and every future awaiting it would grow by as much —
/// futures are moved (copied) whole each time one is made, once per command per level.
pub(super) async fn within<F: Future + ?Sized>(
    limit: Duration,
    mut fut: std::pin::Pin<&mut F>,
) -> Result<F::Output, tokio::time::error::Elapsed> {
    match riser_datamover::poll_once(fut.as_mut()).await {
        Some(v) => Ok(v),
        None => tokio::time::timeout(limit, fut).await,
    }
}

/// What is left to do with an event fed to the session's machine.
enum Fed {
    /// The connection has ended.
    Ended,
    /// Nothing more.
    Handled,
    /// What the machine asks done ([`Session::drive`]), at this time.
    Drive(Duration),
}

/// What [`Session::send_control`] and [`Session::put_data`] return: the result of an operation
/// done at once, or the datamover's future.
pub(super) type Sent<'a, T> = Either<std::future::Ready<T>, riser_datamover::BoxFuture<'a, T>>;

/// A memory budget of `bytes`, in [`BUDGET_UNIT`]s (at least one).
pub(super) fn units_of(bytes: u64) -> u32 {
    (bytes / BUDGET_UNIT).clamp(1, u64::from(u32::MAX >> 4)) as u32
}

/// Where a connection runs: its peer, the local address it came to, its transport.
#[derive(Clone, Copy, Debug)]
pub(super) struct Endpoint {
    pub(super) peer: SocketAddr,
    pub(super) local: SocketAddr,
    pub(super) transport: Transport,
}

pub(super) struct Session {
    pub(super) dm: SharedDatamover,
    /// The protocol state: window, StatSN, tasks, tags, keepalive.
    pub(super) core: Mutex<TargetSession>,
    /// The clock's origin for the machine.
    epoch: Instant,
    /// The I_T nexus (a discovery session's names no target port: it reaches no unit).
    pub(super) nexus: Nexus,
    discovery: bool,
    initiator_name: String,
    target_name: String,
    tsih: u16,
    isid: Isid,
    params: NegotiatedParams,
    pub(super) at: Endpoint,
    /// The paths of the session's views (and of earlier views while commands ran there).
    paths: Mutex<Vec<Arc<LunPath>>>,
    /// REPORTED LUNS DATA HAS CHANGED is pending for the nexus (reported once, to the next
    /// command but INQUIRY, REPORT LUNS and REQUEST SENSE; REPORT LUNS clears it).
    pub(super) luns_changed: AtomicBool,
    /// Set once the session has ended and no I/O of its commands runs any more.
    pub(super) ended: Quiesce,
    /// Serialises sending: PDUs leave in the order the machine stamped them. Taken once per
    /// command: futures-util's lock is two atomic operations when nobody waits (tokio's locks
    /// and unlocks its waiter list's mutex at every release).
    pub(super) tx: futures_util::lock::Mutex<()>,
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
    /// Other sessions' resets of units this one sees, for its loop to end its tasks there
    /// ([`Session::end_tasks_reset_elsewhere`]). At most one ask per unit and resetting request.
    reset_asks: Mutex<ResetAsks>,
    /// An ask waits: looked at between turns and every [`TURN_SLICE`] PDUs of a turn (a
    /// session under steady load may never wait for its next PDU).
    reset_asked: AtomicBool,
    /// Wakes the loop for an ask while it waits for its next PDU.
    reset_elsewhere_added: tokio::sync::Notify,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session").field("tsih", &self.tsih).field("nexus", &self.nexus).finish_non_exhaustive()
    }
}

impl Session {
    /// The session a login opened; `port` is its target port (TargetPortalGroupTag, relative
    /// port identifier, ALUA target port group), `None` for a discovery session.
    pub(super) fn new(
        dm: SharedDatamover,
        o: LoginOutcome,
        port: Option<(u16, u16, u16)>,
        at: Endpoint,
        c: &TargetConfig,
        target_budget: Arc<tokio::sync::Semaphore>,
    ) -> Self {
        let (tpgt, relative_port, port_group) = port.unwrap_or((0, 0, 0));
        let nexus =
            Nexus::iscsi(&o.params.initiator_name, o.isid.0, &o.params.target_name, tpgt, relative_port).with_port_group(port_group);
        let budget_units = units_of(c.max_session_bytes);
        let cfg = TargetSessionConfig::new(c.queue_depth)
            .max_immediate_commands(c.max_immediate_commands)
            .keepalive(c.nop_interval, c.nop_timeout);
        let core = TargetSession::new(cfg, &o, Duration::ZERO);
        Self {
            dm,
            core: Mutex::new(core),
            epoch: Instant::now(),
            nexus,
            discovery: o.params.session_type == riser_iscsi::keys::SessionType::Discovery,
            initiator_name: o.params.initiator_name.clone(),
            target_name: o.params.target_name.clone(),
            tsih: o.tsih,
            isid: o.isid,
            params: o.params,
            at,
            paths: Mutex::new(Vec::new()),
            luns_changed: AtomicBool::new(false),
            ended: Quiesce::default(),
            tx: futures_util::lock::Mutex::new(()),
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
            reset_asks: Mutex::new(ResetAsks::default()),
            reset_asked: AtomicBool::new(false),
            reset_elsewhere_added: tokio::sync::Notify::new(),
        }
    }

    pub(super) fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    pub(super) fn tsih(&self) -> u16 {
        self.tsih
    }

    pub(super) fn isid(&self) -> Isid {
        self.isid
    }

    pub(super) fn target_name(&self) -> &str {
        &self.target_name
    }

    pub(super) fn initiator_name(&self) -> &str {
        &self.initiator_name
    }

    pub(super) fn is_discovery(&self) -> bool {
        self.discovery
    }

    pub(super) fn params(&self) -> &NegotiatedParams {
        &self.params
    }

    /// Every path of the session (for its counters, and for waiting on a unit).
    pub(super) fn paths(&self) -> Vec<Arc<LunPath>> {
        lock(&self.paths).clone()
    }

    /// Build the view of the target's configuration now (`first`: the session's first, which
    /// raises no unit attention). The nexus is registered with the units it now sees and leaves
    /// those it no longer does; paths no longer seen are dropped once idle, their counters
    /// folded into the target's.
    pub(super) fn refresh(&self, target: &Target, view: &mut View, first: bool) {
        let (generation, nodes) = target.registry.snapshot();
        let luns = match nodes.iter().find(|n| !self.discovery && n.target.name.eq_ignore_ascii_case(&self.target_name)) {
            Some(n) => n.view_of(&self.initiator_name),
            None => Vec::new(),
        };
        let new = View::new(generation, luns, view);
        if !new.same_luns(view) {
            if !first {
                info!(nexus = %self.nexus, luns = ?new.luns().iter().filter_map(|l| l.number()).collect::<Vec<_>>(), "the LUNs seen changed");
                self.luns_changed.store(true, Ordering::Release);
            }
            let has = |v: &View, lu: &Arc<LogicalUnit>| v.paths().any(|p| Arc::ptr_eq(&p.lu, lu));
            for p in view.paths().filter(|p| !has(&new, &p.lu)) {
                p.lu.nexus_lost(&self.nexus);
            }
            for p in new.paths().filter(|p| !has(view, &p.lu)) {
                p.lu.nexus_seen(&self.nexus);
            }
            lock(&self.core).set_luns(new.luns());
            // Lock order: the target's session list, its totals, then the session's paths (as
            // `Target::stats` takes them).
            let _live = lock(&target.live);
            let mut retired = lock(&target.retired);
            let mut paths = lock(&self.paths);
            paths.retain(|p| {
                let keep = new.paths().any(|q| Arc::ptr_eq(p, q)) || p.busy();
                if !keep {
                    retired.entry((self.target_name.clone(), p.lun)).or_default().add(&p.counters.snapshot());
                }
                keep
            });
            for p in new.paths() {
                if !paths.iter().any(|q| Arc::ptr_eq(p, q)) {
                    paths.push(p.clone());
                }
            }
        }
        *view = new;
    }

    /// A command on LUN `lun` enters its path, unless the nexus sees no such LUN. The entry is
    /// made before the generation is checked (see `view`): a command that started on a LUN
    /// being removed is waited for, one that starts later finds no LUN.
    fn enter(&self, target: &Target, view: &mut View, lun: Lun) -> Option<PathGuard> {
        loop {
            let guard = view.find(lun)?.enter();
            if target.registry.generation.load(Ordering::SeqCst) == view.generation {
                return Some(guard);
            }
            drop(guard);
            self.refresh(target, view, false);
        }
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
            let _ = self.send_control(ControlPdu::new(t.header, t.data)).await;
        }
    }

    /// Send_Control, without a future when the datamover takes the PDU at once (the common
    /// case while a turn gathers). Tried when called, not when first polled: the future holds
    /// no PDU, so the futures awaiting it stay small (each is copied whole when made).
    pub(super) fn send_control(&self, pdu: ControlPdu) -> Sent<'_, Result<(), DmError>> {
        match self.dm.try_send_control(pdu) {
            Attempt::Done(r) => Either::Left(std::future::ready(r)),
            Attempt::WouldWait(pdu) => Either::Right(self.dm.send_control(pdu)),
        }
    }

    /// Put_Data, without a future when the datamover takes the data at once (tried when
    /// called, as [`send_control`](Self::send_control)).
    pub(super) fn put_data(&self, desc: DataInDesc, data: Bytes) -> Sent<'_, Result<PutDataDone, DmError>> {
        match self.dm.try_put_data(desc, data) {
            Attempt::Done(r) => Either::Left(std::future::ready(r)),
            Attempt::WouldWait((desc, data)) => Either::Right(self.dm.put_data(desc, data)),
        }
    }

    /// Send what the machine queued. A transport that takes nothing for `send_timeout` ends
    /// the connection.
    pub(super) async fn flush(&self) {
        let send = std::pin::pin!(async {
            let _order = self.tx.lock().await;
            self.flush_locked().await;
        });
        let sent = within(self.send_timeout, send).await;
        if sent.is_err() {
            self.send_failed("response");
        }
    }

    pub(super) async fn run(self: &Arc<Self>, target: &Arc<Target>) {
        let mut view = View::default();
        self.refresh(target, &mut view, true);
        // One timer for the connection, re-armed only when the machine wants to be woken
        // earlier than it is set for. Its deadline moves later with every PDU (keepalive counts
        // from the last one heard); arming a timer per PDU cost ~500 instructions. Woken early,
        // `handle_timeout` finds nothing due and the timer is armed anew.
        let timer = tokio::time::sleep_until(tokio::time::Instant::now());
        tokio::pin!(timer);
        let mut armed: Option<Instant> = None;
        loop {
            if self.reset_asked.load(Ordering::Acquire) {
                self.end_tasks_reset_elsewhere(&view);
            }
            let deadline = lock(&self.core).poll_timeout().and_then(|at| self.epoch.checked_add(at));
            match (deadline, armed) {
                (Some(d), Some(a)) if d >= a => {}
                (Some(d), _) => {
                    timer.as_mut().reset(d.into());
                    armed = Some(d);
                }
                (None, _) => armed = None,
            }
            let mut event = if armed.is_some() {
                tokio::select! {
                    biased;
                    e = self.dm.next_event() => Some(e),
                    () = &mut timer => {
                        armed = None;
                        None
                    }
                    () = self.reset_elsewhere_added.notified() => {
                        self.end_tasks_reset_elsewhere(&view);
                        continue;
                    }
                }
            } else {
                tokio::select! {
                    biased;
                    e = self.dm.next_event() => Some(e),
                    () = self.reset_elsewhere_added.notified() => {
                        self.end_tasks_reset_elsewhere(&view);
                        continue;
                    }
                }
            };
            // One turn: every PDU that has arrived is handled (memory-speed commands run to
            // their end in it), and what they produced leaves together, every
            // [`TURN_SLICE`] PDUs and at the turn's end.
            self.dm.hold_sends();
            let mut handled = 0;
            let go_on = loop {
                // Fed, then driven here: a future per level would be copied whole per PDU.
                let go_on = match self.feed(target, &mut view, event) {
                    Fed::Ended => false,
                    Fed::Handled => true,
                    Fed::Drive(now) => self.drive(target, &mut view, now).await,
                };
                if !go_on {
                    break false;
                }
                handled += 1;
                if handled % TURN_SLICE == 0 {
                    self.release_sends().await;
                    self.dm.hold_sends();
                    if self.reset_asked.load(Ordering::Acquire) {
                        self.end_tasks_reset_elsewhere(&view);
                    }
                }
                match self.dm.try_next_event() {
                    Some(e) => event = Some(e),
                    None => break true,
                }
            };
            self.release_sends().await;
            if !go_on {
                break;
            }
        }
        let tasks: Vec<TaskId> = lock(&self.running).iter().filter(|(_, (h, _))| !h.is_finished()).map(|(t, _)| *t).collect();
        let mut gates = self.abort(&tasks);
        // Another session's reset asks from now on (and those not seen to) are answered with
        // these tasks' gates, and those handed out before: their I/O may run on after the loop.
        {
            let mut asks = lock(&self.reset_asks);
            gates.extend(asks.handed());
            for r in std::mem::take(&mut asks.waiting) {
                let _ = r.done.send(gates_of(&gates, &r.lu));
            }
            asks.ended = Some(gates);
        }
        for t in tasks {
            self.dm.deallocate_task_resources(t.itt);
        }
        self.nexus_lost(&view);
    }

    /// One event (`None`: the timer) fed to the machine; what it asks done is left to
    /// [`drive`](Self::drive).
    fn feed(&self, target: &Arc<Target>, view: &mut View, event: Option<DmEvent>) -> Fed {
        // The one clock reading per PDU.
        let now = self.now();
        // A change of the target's configuration shows at the next PDU.
        if target.registry.generation.load(Ordering::SeqCst) != view.generation {
            self.refresh(target, view, false);
        }
        match event {
            None => lock(&self.core).handle_timeout(now),
            Some(DmEvent::Control(p)) => lock(&self.core).handle_pdu(now, &p.header, p.ahs, p.data, p.immediate),
            Some(DmEvent::Malformed { bhs, error }) => {
                info!(nexus = %self.nexus, %error, "malformed PDU");
                lock(&self.core).handle_malformed(now, bhs, error);
            }
            Some(DmEvent::Terminated(why)) => {
                debug!(nexus = %self.nexus, ?why, "connection ended");
                return Fed::Ended;
            }
            Some(_) => return Fed::Handled,
        }
        Fed::Drive(now)
    }

    /// Let what the turn gathered leave. A transport that takes nothing for `send_timeout`
    /// ends the connection.
    pub(super) async fn release_sends(&self) {
        if let Attempt::Done(_) = self.dm.try_release_sends() {
            return;
        }
        match tokio::time::timeout(self.send_timeout, self.dm.release_sends()).await {
            Ok(_) => {}
            Err(_) => self.send_failed("responses"),
        }
    }

    /// Do what the machine asks, and send what it queued; `false` once the connection ends.
    async fn drive(self: &Arc<Self>, target: &Arc<Target>, view: &mut View, now: Duration) -> bool {
        loop {
            let event = lock(&self.core).poll_event();
            let Some(event) = event else { break };
            match event {
                TargetEvent::Command { task, cmd, ahs, split } => {
                    if let Some((run, slot)) = self.start_command(target, view, task, cmd, ahs, split, now) {
                        self.command(run, &slot).await;
                    }
                }
                TargetEvent::Discard { itt } => self.dm.discard_command(itt),
                TargetEvent::TaskManagement { itt, aborted, reset } => {
                    // Nothing gathered waits on what follows (it may take a while).
                    self.release_sends().await;
                    let mut gates = self.abort_tags(&aborted);
                    // The tasks other sessions' resets ended here may still be writing: no
                    // answer of this session's before they are over.
                    gates.extend(lock(&self.reset_asks).handed());
                    // A reset ends the unit's tasks of every nexus (SAM-5 §6.3.3), each
                    // session's in its own loop.
                    let units: Vec<Arc<LogicalUnit>> = match reset {
                        Reset::None => Vec::new(),
                        Reset::Unit(lun) => view.find(lun).map(|p| p.lu.clone()).into_iter().collect(),
                        Reset::Target => view.paths().map(|p| p.lu.clone()).collect(),
                    };
                    // The unit reset under this LUN may be this nexus's under other LUNs too:
                    // its tasks there end as well (SAM-5 §6.3.3 names the unit, not the
                    // number), without a response, as another nexus's do.
                    if let Reset::Unit(lun) = reset
                        && let Some(lu) = view.find(lun).map(|p| p.lu.clone())
                    {
                        let itts: Vec<u32> = {
                            let mut core = lock(&self.core);
                            let same =
                                view.luns().into_iter().filter(|l| *l != lun && view.find(*l).is_some_and(|p| Arc::ptr_eq(&p.lu, &lu)));
                            same.flat_map(|l| core.end_tasks_reset_elsewhere(l)).collect()
                        };
                        gates.extend(self.abort_tags(&itts));
                    }
                    // And its tasks on the units under LUNs that no longer name them.
                    for lu in &units {
                        gates.extend(self.end_tasks_off_view(view, lu));
                    }
                    // Asks answered meanwhile (another session's or gateway's reset) wait for
                    // what this request ended too: those tasks are gone from the machine.
                    lock(&self.reset_asks).own.clone_from(&gates);
                    // Copies write to the units from other tasks (EXTENDED COPY through another
                    // unit, or on the blocking pool past their own task's end): they stop.
                    let copies: Vec<_> = units.iter().map(|lu| lu.copies_fenced()).collect();
                    if !units.is_empty() {
                        gates.extend(self.reset_elsewhere(target, view, &units).await);
                    }
                    // Answered only once no aborted task's backend write can still land.
                    self.serving_resets(view, async {
                        for g in &gates {
                            g.wait_idle().await;
                        }
                        for c in copies {
                            c.await;
                        }
                    })
                    .await;
                    lock(&self.reset_asks).own.clear();
                    // A reset reaches the unit's other gateways (another process exporting its
                    // store) before it is answered, so the host finds its unit attention there.
                    let told: Vec<_> = match reset {
                        Reset::None => Vec::new(),
                        Reset::Unit(lun) => view.find(lun).and_then(|p| p.lu.reset_told()).into_iter().collect(),
                        Reset::Target => view.paths().filter_map(|p| p.lu.reset_told()).collect(),
                    };
                    for t in told {
                        let _ = self.serving_resets(view, tokio::time::timeout(RESET_TOLD_TIMEOUT, t)).await;
                    }
                    lock(&self.core).complete_task_management(itt);
                }
                TargetEvent::Text { req, data } => {
                    let text = self.text_answer(&data, target);
                    lock(&self.core).answer_text(req, text);
                }
                TargetEvent::Logout { req, aborted } => {
                    self.release_sends().await;
                    self.logout(req, &aborted, view).await;
                }
                TargetEvent::Close(why) => {
                    self.flush().await;
                    self.release_sends().await;
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

    /// Start a command: returned, to be run in this task, when it ends at memory speed without
    /// waiting for the initiator (see [`runs_inline`]), else spawned as a task of its own.
    #[allow(clippy::too_many_arguments)]
    fn start_command(
        self: &Arc<Self>,
        target: &Target,
        view: &mut View,
        task: TaskId,
        cmd: riser_iscsi::wire::ScsiCommand,
        ahs: Bytes,
        split: riser_iscsi::session::WriteSplit,
        now: Duration,
    ) -> Option<(Command, Slot)> {
        // Without an AHS (nearly every command) the CDB is the BHS's 16 bytes: no allocation.
        let full_cdb: smallvec::SmallVec<[u8; 16]> = if ahs.is_empty() { cmd.cdb.into() } else { cmd.full_cdb(&ahs).into() };
        let opcode = full_cdb.first().copied().unwrap_or(0);
        // REPORT LUNS answers from the nexus's LUN inventory, whichever LUN it is sent to.
        let (path, report) = if opcode == REPORT_LUNS { (None, Some(view.luns())) } else { (self.enter(target, view, cmd.lun), None) };
        let inline = runs_inline(&cmd, opcode, split, path.as_ref().map(|p| &*p.path().lu));
        let unit = path.as_ref().map_or(0, |p| unit_id(&p.path().lu));
        let slot = Slot { session: self.clone(), task, held: AtomicBool::new(true), path, op: Op::of(opcode), start: now };
        // Taken in the session's loop, in order with its task management: a reset of a unit
        // the copy uses made from here on stops it, even one made before the copy runs.
        let since = if opcode == riser_scsi::cdb::op::EXTENDED_COPY { crate::lu::resets_so_far() } else { 0 };
        let mut run = Command { cmd, cdb: full_cdb, split, report, gate: None, since };
        if inline {
            // Nothing to abort meanwhile (task management is handled after it, in this task):
            // no I/O gate.
            return Some((run, slot));
        }
        let me = self.clone();
        let gate = Arc::new(IoGate { unit, lun: cmd.lun, ..IoGate::default() });
        run.gate = Some(gate.clone());
        // The command is spawned before its registration, and does not unregister itself: a
        // lock held across the spawn, and one more at its end, cost a cross-thread wake-up per
        // command. Ended commands are swept out as the table grows (a stale entry is harmless:
        // its TaskId is never reused, aborting it does nothing and its gate is idle).
        //
        // The command's future is large (its every await point's state): boxed, it is written
        // once into its allocation; spawned by value, the runtime moved it about ten times
        // (~1 700 instructions of memcpy per command).
        // On the session's runtime: an iSER connection's thread runs all of its commands (its
        // large reads on the portal's work-stealing runtime instead cost a cross-thread wake-up
        // each way and, with as many connections as cores, about a fifth of four sessions' 256 KiB
        // reads; with one session they gained nothing measurable).
        let handle = tokio::spawn(Box::pin(async move {
            me.command(run, &slot).await;
        }));
        let mut running = lock(&self.running);
        if running.len() >= self.sweep_at.load(Ordering::Relaxed) {
            running.retain(|_, (h, _)| !h.is_finished());
            self.sweep_at.store((2 * running.len()).max(SWEEP_MIN), Ordering::Relaxed);
        }
        running.insert(task, (handle.abort_handle(), gate));
        None
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

    /// Have every other session that sees one of `units` end its tasks there (this session
    /// reset them); the gates of those tasks' backend I/O. Asks of this session made meanwhile
    /// (another session resetting at the same time) are seen to while it waits.
    async fn reset_elsewhere(self: &Arc<Self>, target: &Target, view: &View, units: &[Arc<LogicalUnit>]) -> Vec<Arc<IoGate>> {
        let others: Vec<Arc<Self>> = lock(&target.live).values().filter(|s| !Arc::ptr_eq(s, self)).cloned().collect();
        let mut asked = Vec::new();
        for s in &others {
            let paths = s.paths();
            for lu in units.iter().filter(|lu| paths.iter().any(|p| Arc::ptr_eq(&p.lu, lu))) {
                asked.push(s.ask_to_end_tasks(lu));
            }
        }
        let mut gates = Vec::new();
        for answer in asked {
            gates.extend(self.serving_resets(view, answer).await.unwrap_or_default());
        }
        gates
    }

    /// Wait for `f`, meanwhile ending this session's tasks on the units other sessions or
    /// other gateways reset ([`Self::end_tasks_reset_elsewhere`]): their resets wait on this
    /// session, which must not wait on them in turn (two resets at once, or one here waiting
    /// for the other gateways while one of theirs waits for this session's tasks).
    async fn serving_resets<F: Future>(&self, view: &View, f: F) -> F::Output {
        tokio::pin!(f);
        loop {
            tokio::select! {
                r = &mut f => return r,
                () = self.reset_elsewhere_added.notified() => self.end_tasks_reset_elsewhere(view),
            }
        }
    }

    /// Ask this session to end its tasks on `lu` (another session reset it): the answer is
    /// the gates of their backend I/O, those of the unit's tasks only (a session whose loop has
    /// ended answers at once with those of the tasks on the unit it ended then).
    pub(super) fn ask_to_end_tasks(&self, lu: &Arc<LogicalUnit>) -> tokio::sync::oneshot::Receiver<Vec<Arc<IoGate>>> {
        let (done, answer) = tokio::sync::oneshot::channel();
        let mut asks = lock(&self.reset_asks);
        match &asks.ended {
            Some(gates) => {
                let _ = done.send(gates_of(gates, lu));
            }
            None => {
                asks.waiting.push(ResetElsewhere { lu: lu.clone(), done });
                self.reset_asked.store(true, Ordering::Release);
                self.reset_elsewhere_added.notify_one();
            }
        }
        answer
    }

    /// End this session's tasks on the units other sessions reset (in its loop, between
    /// turns or PDUs: no command of it is being started or answered): without a response (TAS
    /// is 0), their futures stopped, their datamover state released; the gates of their
    /// backend I/O go back to the resetting sessions, with those of the unit's tasks a reset of
    /// this session's own, being answered meanwhile, ended ([`ResetAsks::own`]), and those
    /// handed out before whose I/O still runs ([`ResetAsks::handed`]).
    fn end_tasks_reset_elsewhere(&self, view: &View) {
        self.reset_asked.store(false, Ordering::Release);
        let (asked, own) = {
            let mut asks = lock(&self.reset_asks);
            (std::mem::take(&mut asks.waiting), asks.own.clone())
        };
        for r in asked {
            let itts: Vec<u32> = {
                let mut core = lock(&self.core);
                let luns = view.luns().into_iter().filter(|l| view.find(*l).is_some_and(|p| Arc::ptr_eq(&p.lu, &r.lu)));
                luns.flat_map(|l| core.end_tasks_reset_elsewhere(l)).collect()
            };
            if !itts.is_empty() {
                info!(nexus = %self.nexus, tasks = itts.len(), "tasks ended by another nexus's reset of their unit");
            }
            let mut ended = self.abort_tags(&itts);
            ended.extend(self.end_tasks_off_view(view, &r.lu));
            // Kept: this session answers nothing before their I/O is over either.
            let handed = {
                let mut asks = lock(&self.reset_asks);
                asks.handed.extend(ended);
                asks.handed()
            };
            // Only the unit's: a reset of another unit, here or elsewhere, is not this one's
            // to wait for.
            let mut gates = gates_of(&own, &r.lu);
            gates.extend(gates_of(&handed, &r.lu));
            let _ = r.done.send(gates);
        }
    }

    /// End, without a response, this session's tasks running on `lu` under a LUN its view no
    /// longer maps there (unmapped, or mapped to another unit since they started: the machine
    /// knows tasks by LUN number only, and ends those of the LUNs that name the unit now); the
    /// gates of their backend I/O. In the session's loop.
    fn end_tasks_off_view(&self, view: &View, lu: &Arc<LogicalUnit>) -> Vec<Arc<IoGate>> {
        let unit = unit_id(lu);
        let off_view = |g: &IoGate| g.unit == unit && view.find(g.lun).is_none_or(|p| !Arc::ptr_eq(&p.lu, lu));
        let tasks: Vec<TaskId> =
            lock(&self.running).iter().filter(|(_, (h, g))| off_view(g) && !h.is_finished()).map(|(t, _)| *t).collect();
        if tasks.is_empty() {
            return Vec::new();
        }
        // Only those the machine still held: a command that has taken its status (and may be
        // sending it) is left to finish.
        let tasks: Vec<TaskId> = {
            let mut core = lock(&self.core);
            tasks.into_iter().filter(|t| core.drop_task(*t)).collect()
        };
        if tasks.is_empty() {
            return Vec::new();
        }
        info!(nexus = %self.nexus, tasks = tasks.len(), "tasks on a reset unit no longer mapped to their LUN ended");
        let gates = self.abort(&tasks);
        for t in &tasks {
            self.dm.deallocate_task_resources(t.itt);
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
                g.abort();
                h.abort();
                g
            })
            .collect()
    }

    async fn logout(&self, req: LogoutRequest, aborted: &[u32], view: &View) {
        self.abort_tags(aborted);
        // The nexus ends before the initiator hears so: what it held (a RESERVE(6)) is free
        // by the time it can send anything else.
        self.nexus_lost(view);
        // The logout is answered once no write of the session can still land.
        self.quiesce().await;
        lock(&self.core).answer_logout(&req);
    }

    /// Release what this I_T nexus holds on every LU it sees (idempotent).
    fn nexus_lost(&self, view: &View) {
        view.paths().for_each(|p| p.lu.nexus_lost(&self.nexus));
    }

    /// The answer to a text request: SendTargets (RFC 7143 §12.3), every portal of each target
    /// listed (TCP and iSER, each with its TargetPortalGroupTag); every other key is not
    /// understood.
    fn text_answer(&self, data: &[u8], target: &Arc<Target>) -> Vec<u8> {
        let pairs = parse_pairs(data).unwrap_or_default();
        let mut out = TextBuilder::new();
        let (_, nodes) = target.registry.snapshot();
        let mut listed_once = false;
        for (k, v) in pairs {
            if k != "SendTargets" {
                out.push(k, "NotUnderstood");
                continue;
            }
            // One listing per request: a request repeating the key would otherwise have it
            // answered as often (a 256 KiB request of `SendTargets=All` made a listing of every
            // target and portal 16,384 times over, held until the initiator fetched it).
            if std::mem::replace(&mut listed_once, true) {
                continue;
            }
            for n in nodes.iter() {
                let name = &n.target.name;
                let wanted = if self.discovery {
                    v == "All" || name.eq_ignore_ascii_case(v)
                } else {
                    // A normal session learns only about its own target.
                    name.eq_ignore_ascii_case(&self.target_name) && (v.is_empty() || v == "All" || name.eq_ignore_ascii_case(v))
                };
                let permitted = n.target.admits(&self.initiator_name);
                let listed = permitted || (self.discovery && target.config.discovery_scope == DiscoveryScope::All);
                if wanted && listed {
                    out.push("TargetName", name);
                    let mut seen = Vec::new();
                    for (portal, tag) in target.portals_of(n) {
                        let addr = format!("{},{tag}", portal.target_address(self.at.local));
                        if !seen.contains(&addr) {
                            out.push("TargetAddress", &addr);
                            seen.push(addr);
                        }
                    }
                }
            }
        }
        out.into_bytes()
    }
}
