//! The SCSI block target core: one [`LogicalUnit`] emulates an SBC-4 / SPC-5 direct-access
//! device over a [`BlockBackend`]. It knows nothing of iSCSI: the server hands it CDBs and
//! data-out bytes and gets back status, sense and data-in bytes.
//!
//! This file holds the unit itself: its state, the task-facing entry points `plan` and
//! `execute`, and the dispatch that routes each CDB to its command family. The families live in
//! the submodules: `rw` (the medium data path), `medium` (capacity, LBA status, start/stop),
//! `inquiry`, `mode`, `pr` (reservations), `sanitize`, `rsoc`, `report` (REQUEST SENSE,
//! REPORT LUNS), `alua` (target port groups, REPORT TARGET PORT GROUPS), `copy` (EXTENDED
//! COPY, RECEIVE COPY RESULTS) and `aio` (the data path over an asynchronous store).

mod aio;
mod alua;
mod copy;
mod identity;
mod inquiry;
mod medium;
mod mode;
mod pr;
mod pr_store;
mod report;
mod rsoc;
mod rw;
mod sanitize;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_aio;
#[cfg(test)]
mod tests_alua;
#[cfg(test)]
mod tests_copy;
#[cfg(test)]
mod tests_pr;
#[cfg(test)]
mod tests_thin;

use crate::backend::BlockBackend;
use bytes::Bytes;
use pr_store::Pr;
use riser_scsi::cdb::{Cdb, CdbSize, rw_flags};
use riser_scsi::sense::{AscAscq, Sense, SenseKey, Status};
use rw::RangeLocks;
use sanitize::{SanitizeJob, SanitizeState};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};

pub use aio::Running;
pub use alua::{AccessState, AluaError, SUPPORTED_STATES, TargetPortGroup};
pub(crate) use copy::{Accepted, resets_so_far};
pub use copy::{
    COPY_CHUNK, MAX_CONCURRENT_COPIES, MAX_CSCDS, MAX_DESCRIPTOR_LIST_LEN, MAX_HELD_RESULTS, MAX_SEGMENT_BYTES, MAX_SEGMENTS, UnitDirectory,
};
pub use identity::{LuIdentity, Nexus};
pub use pr::MAX_REGISTRATIONS;
pub use report::report_luns;

/// Most blocks one WRITE ATOMIC may write.
pub const MAX_ATOMIC_BLOCKS: u32 = 2048;

/// Most blocks one command may move (reported in the Block Limits VPD page).
pub const MAX_TRANSFER_BLOCKS: u32 = 65536;

/// What a command needs before it can run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The decoded CDB.
    pub cdb: Cdb,
    /// Data-out bytes the command needs.
    pub data_out: u32,
    /// The transport's expected data transfer length (set by the server; some commands must
    /// match it exactly).
    pub edtl: u32,
}

/// A command's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// SCSI status.
    pub status: Status,
    /// Sense data (encoded) for CHECK CONDITION.
    pub sense: Option<Bytes>,
    /// Data-in.
    pub data: Bytes,
}

impl Outcome {
    fn good(data: impl Into<Bytes>) -> Self {
        Self { status: Status::GOOD, sense: None, data: data.into() }
    }
    /// RESERVATION CONFLICT.
    pub fn conflict() -> Self {
        Self { status: Status::RESERVATION_CONFLICT, sense: None, data: Bytes::new() }
    }
}

#[derive(Debug, Default)]
struct State {
    wce: bool,
    d_sense: bool,
    swp: bool,
    /// The RESERVE(6/10) holder's nexus key.
    reserved_by: Option<String>,
    pr: Pr,
    /// Pending unit attentions by nexus key (a nexus is here once it has seen the unit).
    unit_attention: HashMap<String, Vec<AscAscq>>,
    /// Unit attentions queued in `unit_attention`, over all nexuses: while none is, a command
    /// does not look its nexus up (hashing its key cost ~90 instructions per command).
    ua_queued: usize,
    prevent: bool,
    stopped: bool,
    sanitize: Option<Arc<SanitizeJob>>,
    sanitize_failed: bool,
    /// A flush failed since the last reset: every flush fails ([`LogicalUnit::flush`]).
    flush_failed: bool,
    /// Target port groups and their access states.
    alua: alua::Alua,
}

/// Flags of a unit's [`State`] that the common commands read without taking its lock: a
/// READ or WRITE on a quiet unit (nothing pending, reserved, sanitizing or refused by an
/// access state) writes nothing that other connections' commands write too.
///
/// A command that finds the unit quiet is ordered before a change that is being made meanwhile
/// — as it would be had it taken the lock just before the change: the check was never atomic
/// with the command's execution.
struct Fast;

impl Fast {
    /// No unit attention queued, no RESERVE or persistent reservation held, no sanitize
    /// running or failed, no access state that refuses commands.
    const QUIET: u8 = 1;
    /// The Caching mode page's WCE.
    const WCE: u8 = 2;
    /// The Control mode page's SWP.
    const SWP: u8 = 4;
}

/// A value on a cache line of its own.
#[derive(Debug, Default)]
#[repr(align(128))]
struct Padded<T>(T);

/// The locked [`State`]; letting it go updates the unit's [`Fast`] flags.
struct StateGuard<'a> {
    g: std::sync::MutexGuard<'a, State>,
    fast: &'a AtomicU8,
}

impl std::ops::Deref for StateGuard<'_> {
    type Target = State;
    fn deref(&self) -> &State {
        &self.g
    }
}

impl std::ops::DerefMut for StateGuard<'_> {
    fn deref_mut(&mut self) -> &mut State {
        &mut self.g
    }
}

impl Drop for StateGuard<'_> {
    fn drop(&mut self) {
        let s = &mut *self.g;
        let quiet = s.ua_queued == 0
            && s.reserved_by.is_none()
            && s.pr.holder.is_none()
            && !s.alua.restricts()
            && matches!(s.sanitize_state(), SanitizeState::Idle);
        let f = if quiet { Fast::QUIET } else { 0 } | if s.wce { Fast::WCE } else { 0 } | if s.swp { Fast::SWP } else { 0 };
        // Written only when it changes: the line stays shared by the cores that read it.
        if self.fast.load(Ordering::Relaxed) != f {
            self.fast.store(f, Ordering::Release);
        }
    }
}

/// What a unit tells the other gateways exporting its store (a storage cluster's image seen
/// through several riser processes): each call returns at once (the telling is the receiver's
/// to do, off the command path), and the other gateways apply it with
/// [`LogicalUnit::remote_reset`] and [`LogicalUnit::remote_unit_attention`].
pub trait UnitEvents: Send + Sync + std::fmt::Debug {
    /// The unit was reset here (LOGICAL UNIT RESET, a target reset): what completes once the
    /// other gateways have reset theirs (or given up on them), if anything.
    fn reset(&self) -> Option<tokio::sync::oneshot::Receiver<()>>;
    /// A unit attention was queued here for every nexus.
    fn unit_attention(&self, asc: AscAscq);
}

/// A server that runs commands on units (a target): what a reset made by another gateway of a
/// unit's store asks of it ([`LogicalUnit::remote_reset`]).
pub(crate) trait TaskSets: Send + Sync + std::fmt::Debug {
    /// End every task on `lu` of every session without a response; the future resolves once
    /// no backend I/O of theirs can still run.
    fn end_tasks(&self, lu: &LogicalUnit) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// What [`LogicalUnit::remote_reset`] returns: resolves once the tasks the reset ended here
/// can no longer write (their backend I/O is over). Await it, or [`TasksEnded::wait`] on a
/// thread that may block.
pub struct TasksEnded(std::pin::Pin<Box<dyn Future<Output = ()> + Send>>);

impl std::fmt::Debug for TasksEnded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TasksEnded")
    }
}

impl Future for TasksEnded {
    type Output = ();
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<()> {
        self.0.as_mut().poll(cx)
    }
}

impl TasksEnded {
    /// Block this thread until the tasks have ended, for at most `timeout`: whether they did.
    /// For threads that may block (a storage cluster's notification thread hands it to one of
    /// its own); never call it on an asynchronous runtime's thread.
    pub fn wait(mut self, timeout: std::time::Duration) -> bool {
        struct Unpark(std::thread::Thread);
        impl std::task::Wake for Unpark {
            fn wake(self: Arc<Self>) {
                self.0.unpark();
            }
        }
        let waker = std::task::Waker::from(Arc::new(Unpark(std::thread::current())));
        let mut cx = std::task::Context::from_waker(&waker);
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if self.0.as_mut().poll(&mut cx).is_ready() {
                return true;
            }
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return false;
            }
            std::thread::park_timeout(left);
        }
    }
}

/// Where the persistent reservations of a unit whose store several gateways export are kept
/// (the cluster the store lives in): one PERSISTENT RESERVE OUT at a time over every gateway, on
/// the state read fresh, and the new state known to every gateway before the command's GOOD.
pub trait SharedReservations: Send + Sync + std::fmt::Debug {
    /// Take the turn, give `f` the state's text as it is now (`None`: none yet), and publish
    /// what `f` returns (`None`: unchanged) — kept, and every other gateway's unit given it —
    /// before the turn is let go. Blocks: called on the blocking pool.
    fn update(&self, f: &mut dyn FnMut(Option<&str>) -> Option<String>) -> std::io::Result<()>;
}

/// One logical unit.
#[derive(Debug)]
pub struct LogicalUnit {
    /// The store as the synchronous commands see it (over an asynchronous store, a
    /// [`BlockOn`](crate::aio::BlockOn) that waits for each operation on the blocking pool).
    backend: Arc<dyn BlockBackend>,
    /// An asynchronous store ([`LogicalUnit::with_async`]): the medium data path runs on it as
    /// futures ([`LogicalUnit::execute_async`]).
    aio: Option<Arc<dyn crate::aio::AsyncBackend>>,
    identity: LuIdentity,
    state: Mutex<State>,
    /// [`Fast`] flags of `state`, read by every command without the lock; on a cache line of
    /// its own (the lock's word is written by every command that takes it).
    fast: Padded<AtomicU8>,
    read_modify_write: RangeLocks,
    sanitize_rate: Option<u64>,
    /// Where persistent reservations are kept while APTPL is active
    /// ([`LogicalUnit::with_persistent_reservation_file`]); none: APTPL is refused.
    pr_store: Option<pr_store::PrStore>,
    /// EXTENDED COPY: running copies, held results, the units a copy may reach.
    copy: copy::CopyManager,
    /// Where resets and unit attentions are told to the store's other gateways.
    events: std::sync::OnceLock<Arc<dyn UnitEvents>>,
    /// Other gateways export the unit's store ([`LogicalUnit::set_gateways`]).
    gateways: std::sync::atomic::AtomicBool,
    /// Where persistent reservations are shared with those gateways, if anywhere.
    shared_pr: std::sync::OnceLock<Arc<dyn SharedReservations>>,
    /// The servers that run commands on the unit ([`TaskSets`]), told to end them when
    /// another gateway resets it.
    task_sets: Mutex<Vec<std::sync::Weak<dyn TaskSets>>>,
}

type R = Result<Outcome, Sense>;

fn bad_field(byte: u16, bit: Option<u8>) -> Sense {
    Sense::invalid_field_in_cdb(byte, bit)
}
fn illegal(asc: AscAscq) -> Sense {
    Sense::new(SenseKey::ILLEGAL_REQUEST, asc)
}

fn truncate(mut v: Vec<u8>, alloc: u32) -> Bytes {
    v.truncate(alloc as usize);
    v.into()
}

impl LogicalUnit {
    /// A logical unit over `backend` with this identity (its serial number and designators).
    /// The unit knows no LUN: a target maps LUN numbers to units, and one unit may be
    /// exported under several.
    pub fn new(backend: Arc<dyn BlockBackend>, identity: LuIdentity) -> Self {
        Self {
            backend,
            aio: None,
            identity,
            state: Mutex::new(State { wce: true, ..State::default() }),
            fast: Padded(AtomicU8::new(Fast::QUIET | Fast::WCE)),
            read_modify_write: RangeLocks::default(),
            sanitize_rate: None,
            pr_store: None,
            copy: copy::CopyManager::default(),
            events: std::sync::OnceLock::new(),
            gateways: std::sync::atomic::AtomicBool::new(false),
            shared_pr: std::sync::OnceLock::new(),
            task_sets: Mutex::new(Vec::new()),
        }
    }

    /// Pace SANITIZE to at most `bytes_per_second` of backing-store writes (default: as fast as
    /// the backend goes). This bounds the load a sanitize puts on a shared backing store; it
    /// also keeps a RAM LUN's sanitize observable for conformance tests.
    pub fn with_sanitize_rate(mut self, bytes_per_second: Option<u64>) -> Self {
        self.sanitize_rate = bytes_per_second.filter(|&r| r > 0);
        self
    }

    /// Whether the command's operation goes on after its task ends (SANITIZE: task management
    /// and the loss of its I_T nexus do not stop it, SBC-4). It fences the medium itself (every
    /// medium access gets SANITIZE IN PROGRESS until it is over), so nothing that ends tasks needs
    /// to wait for it either.
    pub fn outlives_its_task(&self, plan: &Plan) -> bool {
        matches!(plan.cdb, Cdb::Sanitize { .. })
    }

    /// Whether every command of the data path completes at memory speed on this unit: its store
    /// is in memory and synchronous. The server then runs the common commands in the receiving
    /// task itself, with no task of their own.
    pub fn at_memory_speed(&self) -> bool {
        self.aio.is_none() && self.backend.in_memory()
    }

    /// Whether `plan` may block its thread for long (file I/O, a SANITIZE without IMMED that
    /// waits for the whole operation, a read-modify-write that may wait for another on the
    /// same blocks, whose disk may hang, a PERSISTENT RESERVE OUT that syncs its file, or an
    /// EXTENDED COPY, which may move gigabytes); the
    /// server runs those off its I/O threads.
    pub fn may_block(&self, plan: &Plan) -> bool {
        !self.backend.in_memory()
            || matches!(plan.cdb, Cdb::Sanitize { flags, .. } if flags & 0x80 == 0)
            || matches!(plan.cdb, Cdb::CompareAndWrite { .. } | Cdb::OrWrite(_))
            || (self.pr_store.is_some() && matches!(plan.cdb, Cdb::PersistentReserveOut { .. }))
            || matches!(plan.cdb, Cdb::ExtendedCopy { .. })
    }

    /// The unit's state, locked. Whoever changed it, the flags the data path reads without
    /// the lock ([`Fast`]) are brought up to date before the lock is let go.
    fn st(&self) -> StateGuard<'_> {
        StateGuard { g: self.state.lock().unwrap_or_else(|e| e.into_inner()), fast: &self.fast.0 }
    }

    /// The state's flags as of the last time its lock was let go.
    fn fast(&self) -> u8 {
        self.fast.0.load(Ordering::Acquire)
    }

    /// The unit's identity.
    pub fn identity(&self) -> &LuIdentity {
        &self.identity
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn BlockBackend> {
        &self.backend
    }

    /// Grow the unit's store to `size` bytes (whole blocks); every nexus that has seen the unit
    /// gets CAPACITY DATA HAS CHANGED. Returns the new number of blocks. Stores never shrink
    /// (see [`BlockBackend::resize`]).
    pub fn resize(&self, size: u64) -> std::io::Result<u64> {
        let before = self.blocks();
        self.backend.resize(size)?;
        let after = self.blocks();
        if after != before {
            self.unit_attention(AscAscq::CAPACITY_DATA_CHANGED, None);
        }
        Ok(after)
    }

    /// Make everything written so far durable (the backend's flush), as a server does before
    /// it stops.
    pub fn sync(&self) -> std::io::Result<()> {
        self.backend.flush()
    }

    /// Queue a unit attention for every nexus (or one). One already pending for a nexus is not
    /// queued twice. One for every nexus is also told to the other gateways of the unit's store
    /// ([`Self::set_events`]), except those each gateway finds itself (a capacity change, an
    /// access state change).
    pub fn unit_attention(&self, asc: AscAscq, only: Option<&Nexus>) {
        self.queue_unit_attention(asc, only);
        if only.is_none()
            && !matches!(asc, AscAscq::CAPACITY_DATA_CHANGED | AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED)
            && let Some(e) = self.events.get()
        {
            e.unit_attention(asc);
        }
    }

    fn queue_unit_attention(&self, asc: AscAscq, only: Option<&Nexus>) {
        let mut s = self.st();
        let mut queued = 0;
        match only {
            Some(n) => {
                let v = s.unit_attention.entry(n.key().into()).or_default();
                if !v.contains(&asc) {
                    v.push(asc);
                    queued = 1;
                }
            }
            None => {
                for v in s.unit_attention.values_mut().filter(|v| !v.contains(&asc)) {
                    v.push(asc);
                    queued += 1;
                }
            }
        }
        s.ua_queued += queued;
    }

    /// A unit attention for every nexus that another gateway of the store queued there (not told
    /// on again).
    pub fn remote_unit_attention(&self, asc: AscAscq) {
        self.queue_unit_attention(asc, None);
    }

    /// LOGICAL UNIT RESET / target reset: RESERVE(6/10) reservations are released, a failed
    /// flush is forgiven, and every nexus gets POWER ON, RESET OR BUS DEVICE RESET OCCURRED
    /// (persistent reservations stay), and a copy (EXTENDED COPY, run by this unit or another)
    /// accepted before writes to the unit no more. The other gateways of the unit's store are
    /// told ([`Self::set_events`]), and reset their unit too.
    pub fn reset(&self) {
        drop(self.reset_everywhere());
    }

    /// [`Self::reset`], and what says when the other gateways of the unit's store have reset
    /// theirs (their sessions hold the unit attention): a server answers the LOGICAL UNIT RESET
    /// after that, so a host that then asks through another gateway finds it there. `None`
    /// without other gateways.
    pub fn reset_everywhere(&self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.copy.fence.reset();
        self.reset_told()
    }

    /// [`Self::reset_everywhere`] but for the copies, stopped already ([`Self::copies_fenced`]).
    pub(crate) fn reset_told(&self) -> Option<tokio::sync::oneshot::Receiver<()>> {
        self.reset_state();
        self.events.get().and_then(|e| e.reset())
    }

    /// The reset another gateway of the store made: as [`Self::reset`] (not told on again),
    /// and every task on the unit, of every session of every server here that runs commands on
    /// it, ended without a response (SAM-5 §6.3.3: a logical unit reset ends the tasks of all
    /// its task sets; TAS is 0). What it returns resolves once no backend I/O of those tasks
    /// can still run: acknowledge the reset to the other gateway then, so that a write ended
    /// here can never land after the host has been told its reset is done.
    pub fn remote_reset(&self) -> TasksEnded {
        let copies = self.copies_fenced();
        self.reset_state();
        let sets: Vec<Arc<dyn TaskSets>> = {
            let mut v = self.task_sets.lock().unwrap_or_else(|e| e.into_inner());
            v.retain(|w| w.strong_count() > 0);
            v.iter().filter_map(std::sync::Weak::upgrade).collect()
        };
        let ended: Vec<_> = sets.iter().map(|t| t.end_tasks(self)).collect();
        TasksEnded(Box::pin(async move {
            for e in ended {
                e.await;
            }
            copies.await;
        }))
    }

    /// A reset of this unit begins: no copy (EXTENDED COPY, run by this unit or another)
    /// accepted before writes to it any more — each stops with COPY ABORTED at its next write.
    /// What it returns resolves once their writes to the unit under way are over: a reset is
    /// answered only then. ([`Self::reset`] stops them too, without waiting.)
    pub(crate) fn copies_fenced(&self) -> impl Future<Output = ()> + Send + 'static {
        let mark = self.copy.fence.reset();
        let fence = self.copy.fence.clone();
        async move { fence.written(mark).await }
    }

    /// A server runs commands on this unit: told to end them when another gateway resets it
    /// ([`Self::remote_reset`]). Kept weakly, once.
    pub(crate) fn serve_tasks(&self, sets: std::sync::Weak<dyn TaskSets>) {
        let mut v = self.task_sets.lock().unwrap_or_else(|e| e.into_inner());
        v.retain(|w| w.strong_count() > 0);
        if !v.iter().any(|w| w.ptr_eq(&sets)) {
            v.push(sets);
        }
    }

    /// What a reset does to the unit's state: see [`Self::reset`].
    fn reset_state(&self) {
        let mut s = self.st();
        s.reserved_by = None;
        // That unit attention tells every initiator that what sat in the write cache may be
        // gone, which is all a failed flush still had to say: flushes report afresh from here.
        s.flush_failed = false;
        // Every nexus, the issuer's included (SAM-5 §6.3.3; libiscsi's multipath test checks it).
        let mut queued = 0;
        for v in s.unit_attention.values_mut().filter(|v| !v.contains(&AscAscq::POWER_ON_RESET)) {
            v.push(AscAscq::POWER_ON_RESET);
            queued += 1;
        }
        s.ua_queued += queued;
    }

    /// Whether other gateways (other processes, other units) export this unit's store too.
    /// While they do, RESERVE/RELEASE — and PERSISTENT RESERVE IN/OUT unless the gateways share
    /// them ([`Self::set_shared_reservations`]) — are refused (ILLEGAL REQUEST, INVALID COMMAND
    /// OPERATION CODE, and not listed by REPORT SUPPORTED OPERATION CODES): a reservation kept
    /// by one unit would not stop writes through another gateway — refused rather than half
    /// kept.
    pub fn set_gateways(&self, shared: bool) {
        self.gateways.store(shared, Ordering::Relaxed);
    }

    /// Tell `events` what happens to this unit that the other gateways exporting its store must
    /// see too (resets, unit attentions for every nexus). Set once; false if already set.
    pub fn set_events(&self, events: Arc<dyn UnitEvents>) -> bool {
        self.events.set(events).is_ok()
    }

    /// Register a nexus so unit attentions can be queued for it.
    pub fn nexus_seen(&self, nexus: &Nexus) {
        self.st().unit_attention.entry(nexus.key().into()).or_default();
    }

    /// Forget a nexus (session ended): drop its RESERVE(6) reservation, pending UAs and held
    /// copy results.
    pub fn nexus_lost(&self, nexus: &Nexus) {
        self.copy.forget(nexus);
        let mut s = self.st();
        if s.reserved_by.as_deref() == Some(nexus.key()) {
            s.reserved_by = None;
        }
        if let Some(v) = s.unit_attention.remove(nexus.key()) {
            s.ua_queued -= v.len();
        }
    }

    /// Encode sense in the format the Control mode page selects.
    pub fn encode_sense(&self, s: &Sense) -> Bytes {
        if self.st().d_sense { s.to_descriptor().into() } else { s.to_fixed().to_vec().into() }
    }

    fn check(&self, s: Sense) -> Outcome {
        Outcome { status: Status::CHECK_CONDITION, sense: Some(self.encode_sense(&s)), data: Bytes::new() }
    }

    fn blocks(&self) -> u64 {
        self.backend.num_blocks()
    }
    fn bs(&self) -> u32 {
        self.backend.block_size()
    }

    /// Decode a CDB and work out how much data-out it needs. An error outcome (CHECK
    /// CONDITION) means the command must not run and no data may be solicited.
    pub fn plan(&self, cdb: &[u8], nexus: &Nexus) -> Result<Plan, Outcome> {
        let c = match Cdb::parse(cdb) {
            Ok(c) => c,
            Err(e) => return Err(self.check(e.sense(true))),
        };
        // A pending unit attention is reported once, except to INQUIRY, REPORT LUNS and
        // REQUEST SENSE (SAM-5 §5.14).
        if !matches!(c, Cdb::Inquiry { .. } | Cdb::ReportLuns { .. } | Cdb::RequestSense { .. }) && self.fast() & Fast::QUIET == 0 {
            let mut s = self.st();
            // While a sanitize runs (or after it failed) the medium is off limits (SBC-4 §4.11.2).
            match s.sanitize_state() {
                SanitizeState::Idle => {}
                SanitizeState::Running { done, total } => {
                    drop(s);
                    return Err(self.check(Sense::not_ready_in_progress(AscAscq::SANITIZE_IN_PROGRESS, done, total)));
                }
                SanitizeState::Failed if !matches!(c, Cdb::Sanitize { .. } | Cdb::ReportSupportedOpcodes { .. }) => {
                    drop(s);
                    return Err(self.check(Sense::new(SenseKey::MEDIUM_ERROR, AscAscq::SANITIZE_COMMAND_FAILED)));
                }
                SanitizeState::Failed => {}
            }
            if s.ua_queued > 0
                && let Some(v) = s.unit_attention.get_mut(nexus.key())
                && !v.is_empty()
            {
                let asc = v.remove(0);
                s.ua_queued -= 1;
                drop(s);
                return Err(self.check(Sense::new(SenseKey::UNIT_ATTENTION, asc)));
            }
            // Through a port whose group is in standby, unavailable or transitioning.
            if let Some(asc) = s.alua.refusal(nexus.port_group(), &c) {
                drop(s);
                return Err(self.check(Sense::new(SenseKey::NOT_READY, asc)));
            }
        }
        let data_out = c.data_out_len(self.bs()).unwrap_or(0);
        if data_out > u64::from(crate::MAX_DATA_OUT) {
            return Err(self.check(bad_field(7, None)));
        }
        Ok(Plan { cdb: c, data_out: data_out as u32, edtl: data_out as u32 })
    }

    /// Run a planned command with its data-out.
    pub fn execute(&self, plan: &Plan, data_out: &[u8], nexus: &Nexus) -> Outcome {
        self.execute_into(plan, data_out, nexus, Vec::new())
    }

    /// [`execute`](Self::execute), reading a READ's data into `read_buf` (a buffer from the
    /// datamover's pool, of any length: it is resized), so read data is carried in memory the
    /// datamover gets back with `release_task_buffer` once it has sent it.
    pub fn execute_into(&self, plan: &Plan, data_out: &[u8], nexus: &Nexus, read_buf: Vec<u8>) -> Outcome {
        self.execute_since(plan, data_out, nexus, read_buf, Accepted::now())
    }

    /// [`execute_into`](Self::execute_into) for a command a server took earlier
    /// ([`Accepted`]): an EXTENDED COPY stops at a reset of a unit it uses made since —
    /// even before it started running — or once its task is given up.
    pub(crate) fn execute_since(&self, plan: &Plan, data_out: &[u8], nexus: &Nexus, read_buf: Vec<u8>, accepted: Accepted<'_>) -> Outcome {
        if let Some(refused) = self.refusal(plan, nexus) {
            return refused;
        }
        match self.run(&plan.cdb, data_out, nexus, read_buf, accepted) {
            Ok(o) => o,
            Err(s) => self.check(s),
        }
    }

    /// What refuses a planned command before it runs: a reservation conflict, or a data-out
    /// length the command cannot take.
    fn refusal(&self, plan: &Plan, nexus: &Nexus) -> Option<Outcome> {
        if let Some(conflict) = self.reservation_conflict(&plan.cdb, nexus) {
            return Some(conflict);
        }
        if let Cdb::WriteSame(r) = &plan.cdb
            && !(r.size == CdbSize::Sixteen && r.flags & rw_flags::NDOB != 0)
            && plan.edtl != self.bs()
        {
            // WRITE SAME carries exactly one block.
            return Some(self.check(bad_field(if r.size == CdbSize::Sixteen { 10 } else { 7 }, None)));
        }
        if let Cdb::CompareAndWrite { blocks, .. } = plan.cdb
            && plan.edtl != 2 * u32::from(blocks) * self.bs()
        {
            // The Data-Out buffer must hold exactly the verify and write data (SBC-4 §5.3).
            return Some(self.check(bad_field(13, None)));
        }
        None
    }

    /// Route a command to the handler of its family.
    fn run(&self, c: &Cdb, out: &[u8], nexus: &Nexus, read_buf: Vec<u8>, accepted: Accepted<'_>) -> R {
        if let Some(aio) = &self.aio
            && aio::on_data_path(c)
        {
            // Called synchronously (on the blocking pool, or by an embedder) on an asynchronous
            // store: the same path as `execute_async`, waited for here.
            return crate::aio::block_on(self.run_async(aio, c, Bytes::copy_from_slice(out), read_buf));
        }
        match c {
            Cdb::TestUnitReady { .. } => Ok(Outcome::good(Bytes::new())),
            Cdb::RequestSense { desc, alloc_len, .. } => self.request_sense(*desc, *alloc_len),
            Cdb::Inquiry { evpd, page_code, alloc_len, .. } => {
                self.inquiry(*evpd, *page_code, nexus).map(|b| Outcome::good(truncate(b, u32::from(*alloc_len))))
            }
            Cdb::ReadCapacity10 { lba, pmi, .. } => self.read_capacity_10(*lba, *pmi),
            Cdb::ReadCapacity16 { alloc_len, .. } => self.read_capacity_16(*alloc_len),
            Cdb::Read(r) => self.read(r, read_buf),
            Cdb::Write(r) => self.write(r, out),
            Cdb::WriteAndVerify(r) => self.write_and_verify(r, out),
            Cdb::Verify(r) => self.verify(r, out),
            Cdb::SynchronizeCache(r) => self.synchronize_cache(r),
            Cdb::WriteSame(r) => self.write_same(r, out),
            Cdb::PreFetch(r) => self.pre_fetch(r),
            Cdb::OrWrite(r) if self.offers_or_write() => self.or_write(r, out),
            Cdb::Sanitize { flags, reserved, param_len, .. } => self.sanitize(*flags, reserved, *param_len, out),
            Cdb::WriteAtomic { lba, blocks, flags, group, control } if self.backend.atomic_writes() => {
                self.write_atomic(*lba, *blocks, *flags, *group, *control, out)
            }
            Cdb::ReadDefectData { twelve, flags, alloc_len, .. } => Ok(self.read_defect_data(*twelve, *flags, *alloc_len)),
            Cdb::Unmap { .. } => self.unmap(out),
            Cdb::CompareAndWrite { lba, blocks, flags, .. } => self.compare_and_write(*lba, *blocks, *flags, out),
            Cdb::GetLbaStatus { lba, alloc_len, .. } => self.get_lba_status(*lba, *alloc_len),
            Cdb::ModeSense(m) => self.mode_sense(m),
            Cdb::ModeSelect(m) => self.mode_select(m, out),
            // The LUN inventory is the I_T nexus's, not a unit's: the server answers REPORT LUNS.
            Cdb::ReportSupportedOpcodes { rctd, options, opcode, service_action, alloc_len, .. } => {
                self.rsoc(*rctd, *options, *opcode, *service_action, *alloc_len)
            }
            Cdb::StartStopUnit { power_condition, loej, start, .. } => self.start_stop_unit(*power_condition, *loej, *start),
            Cdb::PreventAllowMediumRemoval { prevent, .. } => Ok(self.prevent_allow_medium_removal(*prevent)),
            Cdb::Reserve6 { .. } | Cdb::Reserve10 { .. } | Cdb::Release6 { .. } | Cdb::Release10 { .. }
                if self.gateways.load(Ordering::Relaxed) =>
            {
                // RESERVE(6/10) reservations are kept per unit, and here the store is written
                // through other gateways' units too: one taken here would not hold there.
                // Refused rather than half kept (see `set_gateways`).
                Err(illegal(AscAscq::INVALID_COMMAND_OPERATION_CODE))
            }
            Cdb::PersistentReserveIn { .. } | Cdb::PersistentReserveOut { .. }
                if self.gateways.load(Ordering::Relaxed) && self.shared_pr.get().is_none() =>
            {
                // Persistent ones too, unless the gateways share them (`set_shared_reservations`).
                Err(illegal(AscAscq::INVALID_COMMAND_OPERATION_CODE))
            }
            Cdb::Reserve6 { .. } | Cdb::Reserve10 { .. } => Ok(self.reserve(nexus)),
            Cdb::Release6 { .. } | Cdb::Release10 { .. } => Ok(self.release(nexus)),
            Cdb::PersistentReserveIn { service_action, alloc_len, .. } => self.pr_in(*service_action, *alloc_len),
            Cdb::ReportTargetPortGroups { format, alloc_len, .. } => self.report_target_port_groups(*format, *alloc_len, nexus),
            Cdb::PersistentReserveOut { service_action, scope, pr_type, .. } => self.pr_out(*service_action, *scope, *pr_type, out, nexus),
            Cdb::ExtendedCopy { service_action, .. } => self.extended_copy(*service_action, out, nexus, accepted),
            Cdb::ReceiveCopyResults { service_action, list_id, alloc_len, .. } => {
                self.receive_copy_results(*service_action, *list_id, *alloc_len, nexus)
            }
            _ => Err(illegal(AscAscq::INVALID_COMMAND_OPERATION_CODE)),
        }
    }
}
