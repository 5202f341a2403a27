//! The iSER datamover: RFC 5047's primitives as RDMA operations over a riser-verbs provider.
//!
//! This module holds the connection's shared state, [`IserDatamover`] with its
//! [`Datamover`] dispatch, and connection setup ([`accept`], [`connect`]). The rooms:
//! `driver` (posting work requests, the completion driver, the receive path), `target`
//! (Put_Data as RDMA Write, Get_Data as RDMA Read, unsolicited Data-Out), `initiator`
//! (commands with their registrations, read data, remote invalidation) and `unexpected`
//! (the target's count of PDUs the initiator did not ask for).

mod driver;
mod initiator;
mod target;
mod unexpected;

pub use driver::fuzz_receive;

use crate::header::{CmPrivateData, ISER_HEADERS_LEN, IserHeader, RemoteBuf};
use bytes::{Bytes, BytesMut};
use riser_datamover::{
    Attempt, BoxFuture, CommandArgs, ConnectionResources, ControlPdu, DataInDesc, Datamover, DmError, DmEvent, PutDataDone, R2tPlan,
    TaskBuffer, Terminated,
};
use riser_iscsi::keys::{DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH, NegotiatedParams, Role};
use riser_iscsi::session::transfer::TransferLimits;
use riser_iscsi::wire::{Header, ScsiCommand};
use riser_verbs::{ConnParam, ConnectionRequest, MemoryRegion, ProtectionDomain, Provider, QpCaps, QueuePair, WcStatus};
// hashbrown with its default hasher (foldhash, seeded per process): SipHash cost ~900
// instructions per 4 KiB command on these maps, keyed by our request ids and by ITTs.
use hashbrown::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;
use tokio::sync::{Notify, mpsc, oneshot};
use tracing::{debug, warn};
use unexpected::Unexpected;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sizing and options of an iSER connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct IserConfig {
    /// Largest data segment this side receives: what it declares as
    /// InitiatorRecvDataSegmentLength / TargetRecvDataSegmentLength (login PDUs need 8192).
    /// Every posted receive is this large. On a target it also bounds a write's immediate data:
    /// riser's target service uses 256 KiB on the software RNIC, where receive memory is plain
    /// memory (writes up to FirstBurstLength then need no RDMA Read), and the default 8 KiB on
    /// rdma-core, as LIO, where it is pinned.
    pub recv_dsl: u32,
    /// Receives kept posted in full-feature phase: at least the CmdSN window plus room for
    /// unsolicited Data-Out, NOP-Out and task management. An initiator keeps its SCSI commands
    /// outstanding to this less [`ANSWERS_RESERVED`] (112 at the default 128), whatever window
    /// the target grants: every answer needs a receive.
    pub recv_depth: u32,
    /// Allow Send with Invalidate (the CM private data says so unless this is off).
    pub send_invalidate: bool,
    /// Initiator: with InitialR2T=No, send the unsolicited part of a write (up to
    /// FirstBurstLength) as Data-Out Sends after the immediate data, as the Linux initiator
    /// does; otherwise only immediate data is sent and the target RDMA Reads the rest. Each
    /// write then posts up to 1 + FirstBurstLength / the target's receive segment Sends (32
    /// with 256 KiB and 8 KiB): `send_depth` must hold what is in flight, or a post beyond the
    /// send queue ends the connection (the software RNIC refuses it as hardware does).
    pub unsolicited_data_out: bool,
    /// Inbound RDMA Reads this side accepts outstanding (responder resources).
    pub ird: u8,
    /// RDMA Reads this side issues outstanding (initiator depth).
    pub ord: u8,
    /// Send queue entries; `None`: four per posted receive plus 16 (every command may need a
    /// Send, an RDMA Write or Read and a response in flight at once). Never fewer than two per
    /// posted receive plus 16: smaller values are raised to that.
    pub send_depth: Option<u32>,
    /// At most this many routine requests (commands, responses, Data-Out, RDMA Writes) in a
    /// row go unsignaled, and at most 1 MiB of their payload; 1 signals every request. Fewer completions mean fewer wake-ups of
    /// the completion driver, but unsignaled requests hold their send queue entries and memory
    /// until a later one completes: it is lowered to a quarter of the send queue if larger.
    pub signal_every: u32,
    /// Target: read data posted in RDMA Writes that have not completed, at most (default
    /// [`DEFAULT_READ_DATA_IN_FLIGHT`], 64 MiB; at least twice what unsignaled requests may
    /// hold with no signaled one behind them: 1 MiB and 4 KiB per request of `signal_every`,
    /// 2.125 MiB at the default). Beyond it, Put_Data waits, in turn, for earlier writes to
    /// complete (riser's target gives up on the connection after its `send_timeout`): an
    /// initiator that reads nothing while it keeps sending READs cannot make the target hold
    /// more. A write within that much of this, or larger, goes once at most that much is held.
    pub read_data_in_flight: u64,
}

/// The default of [`IserConfig::read_data_in_flight`].
pub const DEFAULT_READ_DATA_IN_FLIGHT: u64 = 64 << 20;

impl Default for IserConfig {
    fn default() -> Self {
        Self {
            recv_dsl: DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH,
            recv_depth: 128,
            send_invalidate: true,
            unsolicited_data_out: false,
            ird: 16,
            ord: 16,
            send_depth: None,
            signal_every: DEFAULT_SIGNAL_EVERY,
            read_data_in_flight: DEFAULT_READ_DATA_IN_FLIGHT,
        }
    }
}

impl IserConfig {
    /// The largest data segment received, in login or full feature: `recv_dsl`, but never
    /// below the RFC default (what a peer may send before the values are negotiated).
    pub(crate) fn recv_segment(&self) -> u32 {
        self.recv_dsl.max(DEFAULT_MAX_RECV_DATA_SEGMENT_LENGTH)
    }

    /// Largest data segment this side receives.
    #[must_use]
    pub fn recv_dsl(mut self, bytes: u32) -> Self {
        self.recv_dsl = bytes;
        self
    }

    /// Receives kept posted in full-feature phase.
    #[must_use]
    pub fn recv_depth(mut self, n: u32) -> Self {
        self.recv_depth = n;
        self
    }

    /// Allow Send with Invalidate.
    #[must_use]
    pub fn send_invalidate(mut self, yes: bool) -> Self {
        self.send_invalidate = yes;
        self
    }

    /// Initiator: send unsolicited Data-Out where InitialR2T=No allows it.
    #[must_use]
    pub fn unsolicited_data_out(mut self, yes: bool) -> Self {
        self.unsolicited_data_out = yes;
        self
    }

    /// Target: read data posted in RDMA Writes and not yet completed, at most.
    #[must_use]
    pub fn read_data_in_flight(mut self, bytes: u64) -> Self {
        self.read_data_in_flight = bytes;
        self
    }

    /// Inbound RDMA Reads accepted outstanding.
    #[must_use]
    pub fn ird(mut self, n: u8) -> Self {
        self.ird = n;
        self
    }

    /// RDMA Reads issued outstanding.
    #[must_use]
    pub fn ord(mut self, n: u8) -> Self {
        self.ord = n;
        self
    }

    /// Send queue entries (`None`: derived from the receive depth).
    #[must_use]
    pub fn send_depth(mut self, n: Option<u32>) -> Self {
        self.send_depth = n;
        self
    }
}

/// Receives posted while logging in.
const LOGIN_RECVS: u32 = 4;

/// Initiator: receives of the `recv_depth` posted kept for what comes besides the answers to
/// SCSI commands — the answers to immediate requests (riser-iscsi's `IMMEDIATE_BEYOND_LIMIT`,
/// 8) and the target's own NOP-In pings and asynchronous messages: the commands outstanding
/// at once are the rest. Below 32 receives the commands still get half of them, and the
/// reserve shrinks with the other half: so few receives leave little room for pings.
pub const ANSWERS_RESERVED: u32 = 16;

/// The SCSI commands an initiator posting `recv_depth` receives may have outstanding.
fn commands_for(recv_depth: u32) -> u32 {
    recv_depth.saturating_sub(ANSWERS_RESERVED).max(recv_depth / 2).max(1)
}

type Mr<P> = <<P as Provider>::Pd as ProtectionDomain>::Mr;

/// What the target learned from a command's iSER header.
#[derive(Clone, Copy, Debug, Default)]
struct Remote {
    write: Option<RemoteBuf>,
    read: Option<RemoteBuf>,
}

/// Write data arriving before Get_Data (immediate data, unsolicited Data-Out).
struct WriteTask {
    buf: Vec<u8>,
    /// All of the write's data, when it came with the command in a receive buffer of its own
    /// (see `Recv`): that buffer itself, handed on without a copy (`buf` is then empty).
    whole: Option<Bytes>,
    /// Its sequences (riser-iscsi's rules, as over TCP): the unsolicited part received, and
    /// whether the data broke them (Get_Data then fails it: CHECK CONDITION, the connection
    /// stays). Its solicited data comes by RDMA Read: no R2Ts.
    write: riser_iscsi::session::WriteIn,
}

/// The initiator's registrations for one command.
struct InitTask<P: Provider> {
    read: Option<Arc<Mr<P>>>,
    write: Option<Arc<Mr<P>>>,
    /// Reads the read region served before this one (a kept region, see `READ_REGION_USES`).
    read_uses: u8,
}

/// Memory of unsignaled requests, released in order as later requests complete; and the
/// requests gathered between `hold_sends` and `release_sends` (posted together, in order).
/// Request ids are drawn under this lock, and one thread at a time posts (`posting`): what
/// another takes for posting meanwhile waits in `ready` and the posting thread posts it after
/// its own, in order — so ids increase in posting order, a slow post (the software RNIC
/// writes to its socket) holds up nobody gathering, and no poster waits for another (a
/// runtime's worker blocked on a lock while the other wrote 320 KiB cost the initiator's
/// 64 KiB writes a contended lock's futex sleep per few commands).
struct Unsignaled<P: Provider> {
    held: std::collections::VecDeque<(u64, Keep<P>)>,
    since_signal: u32,
    /// Payload of the requests posted since the last signaled one (see [`SIGNAL_BYTES`]).
    bytes_since_signal: u64,
    gathering: Option<Vec<riser_verbs::SendWr>>,
    /// Payload bytes in `gathering`.
    gathered_bytes: u64,
    /// A posted list's memory, for the next (`post_send_list` empties a list and keeps it).
    spare: Vec<riser_verbs::SendWr>,
    /// Whether a thread is posting; it posts `ready` before it stops.
    posting: bool,
    /// Taken for posting while another thread posted, in id order, each as it was to be posted.
    ready: std::collections::VecDeque<Post>,
}

/// Requests to post, as they are posted (see `Shared::post_in_turn`).
enum Post {
    /// One request: as a list of one when someone waits for it (a provider may transmit a list
    /// on the spot), else alone (the software RNIC's transmitter gathers those of a turn).
    One { wr: riser_verbs::SendWr, awaited: bool },
    /// Requests gathered, together.
    List(Vec<riser_verbs::SendWr>),
}

impl<P: Provider> Unsignaled<P> {
    /// Gather from now on (into the spare list's memory).
    fn start_gathering(&mut self) {
        if self.gathering.is_none() {
            self.gathering = Some(std::mem::take(&mut self.spare));
        }
    }

    /// The gathered list, replaced by the spare one.
    fn take_gathered(&mut self) -> Vec<riser_verbs::SendWr> {
        match self.gathering.as_mut() {
            Some(list) => std::mem::replace(list, std::mem::take(&mut self.spare)),
            None => Vec::new(),
        }
    }

    /// A list posted (and so emptied): its memory kept for the next.
    fn give_back(&mut self, mut list: Vec<riser_verbs::SendWr>) {
        list.clear();
        if list.capacity() > self.spare.capacity() {
            self.spare = list;
        }
    }
}

/// Payload gathered between `hold_sends` and `release_sends` at most before it is posted: the
/// software RNIC writes a list of up to this much on the poster's thread, a larger one through
/// its transmitter task (a hand-off per list). 320 KiB: room for 256 KiB, riser-tcp's gathering
/// limit, and one 64 KiB request more (riser-tcp writes the PDU that crosses its limit with what
/// it gathered), so four 64 KiB reads with their responses (256 KiB and 304 bytes) leave in one
/// write, as four Data-In PDUs with status do over TCP (at 256 KiB only three did: a third more
/// writes, each waking the initiator's receiver).
const GATHER_BYTES_MAX: u64 = 320 << 10;

/// Initiator: commands (with their Data-Out) gathered at most before they are posted at once,
/// without waiting for the flusher. Commands the caller's tasks issue in one turn of the
/// executor are posted together, after it (the software RNIC writes them in one system call);
/// from this many on they leave at once, so the target starts on them while the next are made.
/// (Commands with more than 64 KiB of data leave at once too: `GATHERED_DATA_MAX`.)
const COMMANDS_GATHERED_MAX: usize = 8;

/// Payload posted unsignaled at most before a request is signaled, whatever
/// [`IserConfig::signal_every`] says: an unsignaled request's memory (a read's data, sent from
/// where it lies, registered or as unregistered bytes) goes back to the pool only when a later
/// request completes, and the pool keeps 8 MiB (`riser_datamover::POOL_MAX_BYTES`). Sixteen 1 MiB reads held that way left the pool
/// empty: each read then took fresh memory (page faults, the kernel's zeroing) and dropped it.
const SIGNAL_BYTES: u64 = 1 << 20;

/// The default of [`IserConfig::signal_every`].
pub const DEFAULT_SIGNAL_EVERY: u32 = 16;

struct Waiter<P: Provider> {
    done: oneshot::Sender<WcStatus>,
    keep: Option<Keep<P>>,
}

/// What a posted request keeps alive until it has completed: the region it reads or writes,
/// and, for read data sent from where it lay (registered, or as the request's unregistered
/// bytes), those bytes, given back to the connection's pool once nothing else holds them (the
/// caller's own give-back fails while the request is in flight).
struct Keep<P: Provider> {
    /// None for bytes the request carries unregistered (see `SendWr::unregistered`).
    mr: Option<Arc<Mr<P>>>,
    recycle: Option<Bytes>,
    /// A second region the request reads (a command's immediate data sent from where it lies,
    /// behind its headers).
    also: Option<Arc<Mr<P>>>,
    /// Room an RDMA Write's read data takes in [`WritesInFlight`], given back with it.
    counted: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl<P: Provider> Keep<P> {
    fn region(mr: Arc<Mr<P>>) -> Self {
        Self { mr: Some(mr), recycle: None, also: None, counted: None }
    }

    /// The request has completed: the regions go, then its bytes back to `pool` if they are
    /// now nobody else's; the room its read data took is added to `room`, which the caller
    /// gives back (once for many requests: the semaphore's lock taken once).
    fn release_into(self, pool: &riser_datamover::BufferPool, room: &mut Option<tokio::sync::OwnedSemaphorePermit>) {
        drop(self.mr);
        drop(self.also);
        if let Some(Ok(buf)) = self.recycle.map(Bytes::try_into_mut) {
            pool.give(buf);
        }
        // Room for more read data once its buffer is back.
        if let Some(p) = self.counted {
            match room {
                Some(r) => r.merge(p),
                None => *room = Some(p),
            }
        }
    }
}

/// Target: read data in RDMA Writes posted and not yet completed (see
/// [`IserConfig::read_data_in_flight`]), per connection: a fair semaphore of [`WRITE_UNIT`]s.
/// A write takes its permits before it is posted (and registered, if it is) and keeps them in
/// its [`Keep`] until its memory is let go (completed, flushed, or its post failed); waiting
/// writes go in order, so small ones do not starve a large one.
struct WritesInFlight {
    room: Arc<tokio::sync::Semaphore>,
    /// All the room, in units (tests).
    #[cfg(test)]
    units: u32,
    /// The most a write takes: all the room but what unsignaled writes with no signaled request
    /// behind them may hold (their completion may never come).
    most: u32,
}

/// The unit [`WritesInFlight`] counts in.
const WRITE_UNIT: u64 = 4096;

impl WritesInFlight {
    /// Room for `cap` bytes, at least twice what unsignaled writes with no signaled request
    /// behind them may hold: under [`SIGNAL_BYTES`] of payload in fewer than `interval`
    /// requests (see `signal_interval`), each rounded up to a whole [`WRITE_UNIT`].
    fn new(cap: u64, interval: u32) -> Self {
        let trailing = (SIGNAL_BYTES / WRITE_UNIT) as u32 + interval;
        let units = (cap / WRITE_UNIT).min(tokio::sync::Semaphore::MAX_PERMITS as u64).min(u64::from(u32::MAX)) as u32;
        let units = units.max(2 * trailing);
        Self {
            room: Arc::new(tokio::sync::Semaphore::new(units as usize)),
            #[cfg(test)]
            units,
            most: units - trailing,
        }
    }

    /// The permits a write of `len` bytes takes: its size, but never more than the room left
    /// while unsignaled requests with no signaled one behind them hold all they may (whose
    /// completion may never come): a write larger than that goes alone. So a write waiting for
    /// room always gets it from completions that come.
    fn units_for(&self, len: u64) -> u32 {
        len.div_ceil(WRITE_UNIT).min(u64::from(self.most)) as u32
    }

    /// Room for a write of `len` bytes now, if there is (none needed for no data).
    fn try_take(&self, len: u64) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, tokio::sync::TryAcquireError> {
        if len == 0 {
            return Ok(None);
        }
        self.room.clone().try_acquire_many_owned(self.units_for(len)).map(Some)
    }

    /// Bytes held now (tests).
    #[cfg(test)]
    fn held(&self) -> u64 {
        (u64::from(self.units) - self.room.available_permits() as u64) * WRITE_UNIT
    }
}

/// A posted receive: one buffer for the whole message, or (`Shared::split_recv`) one for the
/// iSER header and BHS and one for what follows, so that a command's immediate data lands at
/// the start of a buffer of its own, which can become the task's buffer as it is.
pub(super) struct Recv<M> {
    head: Arc<M>,
    data: Option<Arc<M>>,
}

struct Shared<P: Provider> {
    role: Role,
    cfg: IserConfig,
    pd: Arc<P::Pd>,
    cq: Arc<P::Cq>,
    qp: Arc<P::Qp>,
    send_inv: AtomicBool,
    recv_size: usize,
    recvs: Mutex<HashMap<u64, Recv<Mr<P>>>>,
    /// Target, on a provider whose regions are the buffers themselves
    /// ([`riser_verbs::ProtectionDomain::registers_in_place`]): receives in two elements (see
    /// [`Recv`]), so that immediate data needs no copy.
    split_recv: bool,
    next_wr: AtomicU64,
    waiting: Mutex<HashMap<u64, Waiter<P>>>,
    unsignaled: Mutex<Unsignaled<P>>,
    events_tx: mpsc::UnboundedSender<DmEvent>,
    events_rx: tokio::sync::Mutex<mpsc::UnboundedReceiver<DmEvent>>,
    /// Events queued and not yet taken: a peer that sends beyond its bound loses the connection.
    backlog: riser_datamover::Backlog,
    remote: Mutex<HashMap<u32, Remote>>,
    /// Target: commands that reused a live task's tag (see `receive_duplicate_command`).
    duplicates: riser_datamover::DuplicateCommands,
    writes: Mutex<HashMap<u32, WriteTask>>,
    /// Task buffers (target: write data; initiator: read data), reused: see
    /// [`Datamover::release_task_buffer`].
    pool: riser_datamover::BufferPool,
    /// Target, split receives: data buffers that were handed on with their data, back whole
    /// (see `driver::Lent`); posted again before anything is allocated.
    recv_spares: Arc<Mutex<Vec<Vec<u8>>>>,
    writes_changed: Notify,
    /// Target: read data in RDMA Writes not yet completed.
    writes_in_flight: WritesInFlight,
    tasks: Mutex<HashMap<u32, InitTask<P>>>,
    limits: Mutex<TransferLimits>,
    unexpected: Mutex<Unexpected>,
    ff_posted: AtomicBool,
    closed: AtomicBool,
    /// Registered send buffers of each size of `driver::SEND_BUFFERS`, reused once free (see
    /// `registered_send_buffer`), and where the next look for a free one starts.
    send_bufs: [Mutex<SendBuffers<P>>; 2],
    /// Initiator, on a provider whose regions are the buffers themselves: regions of ended
    /// reads, each holding a fresh buffer and invalid until a read re-keys it, with how many
    /// reads each served (see `READ_REGIONS_KEPT`); the oldest of a length is taken first.
    read_regions: Mutex<std::collections::VecDeque<(Arc<Mr<P>>, u8)>>,
    /// Where small Sends' bytes are put together (see `Shared::small_send`).
    small_sends: Mutex<BytesMut>,
    /// Initiator: commands were gathered; the flusher posts them once the executor's ready
    /// tasks have run (see `flush_when_due`).
    flush_due: Notify,
}

/// Registered send buffers of one size, and where the next look for a free one starts.
type SendBuffers<P> = (Vec<Arc<Mr<P>>>, usize);

/// The iSER datamover of one connection (initiator or target).
pub struct IserDatamover<P: Provider> {
    s: Arc<Shared<P>>,
}

impl<P: Provider> std::fmt::Debug for IserDatamover<P> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IserDatamover").field("role", &self.s.role).field("qp", &self.s.qp).finish_non_exhaustive()
    }
}

/// A verbs failure while doing `what`, as the seam reports it (the verbs error is logged here,
/// where its detail is known).
fn rdma(what: &'static str) -> impl Fn(riser_verbs::Error) -> DmError {
    move |e| match e {
        riser_verbs::Error::NotConnected => DmError::Closed,
        riser_verbs::Error::Io(e) => DmError::Io(e.kind()),
        e => {
            warn!("iSER: {what}: {e}");
            DmError::Resources { what }
        }
    }
}

impl<P: Provider + 'static> IserDatamover<P> {
    fn new(role: Role, cfg: IserConfig, pd: Arc<P::Pd>, cq: Arc<P::Cq>, qp: Arc<P::Qp>) -> Result<Self, riser_verbs::Error> {
        let split_recv = role == Role::Target && pd.registers_in_place();
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let s = Arc::new(Shared {
            role,
            cfg,
            pd,
            cq,
            qp,
            send_inv: AtomicBool::new(false),
            recv_size: ISER_HEADERS_LEN + cfg.recv_segment() as usize,
            recvs: Mutex::new(HashMap::new()),
            split_recv,
            next_wr: AtomicU64::new(1),
            waiting: Mutex::new(HashMap::new()),
            unsignaled: Mutex::new(Unsignaled {
                held: Default::default(),
                since_signal: 0,
                bytes_since_signal: 0,
                gathering: None,
                gathered_bytes: 0,
                spare: Vec::new(),
                posting: false,
                ready: std::collections::VecDeque::new(),
            }),
            events_tx,
            events_rx: tokio::sync::Mutex::new(events_rx),
            backlog: Default::default(),
            remote: Mutex::new(HashMap::new()),
            duplicates: Default::default(),
            writes: Mutex::new(HashMap::new()),
            pool: riser_datamover::BufferPool::default(),
            recv_spares: Arc::default(),
            writes_changed: Notify::new(),
            writes_in_flight: WritesInFlight::new(cfg.read_data_in_flight, signal_interval(&cfg)),
            tasks: Mutex::new(HashMap::new()),
            limits: Mutex::new(TransferLimits::default()),
            unexpected: Mutex::new(Unexpected::default()),
            ff_posted: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            send_bufs: Default::default(),
            read_regions: Mutex::default(),
            small_sends: Mutex::default(),
            flush_due: Notify::new(),
        });
        // Every received message goes through the driver. Handling them on the software
        // RNIC's receive task instead (tried: a receive handler the completion queue called)
        // saved instructions but no throughput with four sessions and cost 12-15 % with one
        // session writing 16-64 KiB (the copy of the immediate data then no longer runs beside
        // the next receive); and one context must handle them all to keep their order.
        // Every receive is the same size and found by its request id: a Send may take any.
        // On the software RNIC it takes the one posted last, whose buffers are warm in the
        // cache; taking the oldest of the 144 posted (at the defaults) walked through all of
        // them, 36 MiB per connection (4 sessions' 64 KiB writes: 2,492 → 2,813 MiB/s, target
        // CPU 1.58 → 1.33 s per 4 GiB).
        QueuePair::receives_interchangeable(&*s.qp);
        // Login is carried by Sends from the very first PDU: receives are posted before the
        // connection is established.
        for _ in 0..LOGIN_RECVS {
            s.post_recv(None)?;
        }
        Ok(Self { s })
    }

    /// The completion driver: spawn it (tokio). It ends when the connection has. On an
    /// initiator it also posts the commands gathered by `send_command`: those the caller's
    /// tasks issue in one turn of the executor leave together, after it (up to eight, then at
    /// once).
    pub fn driver(&self) -> impl Future<Output = ()> + Send + 'static {
        let s = self.s.clone();
        async move {
            tokio::select! {
                _ = s.clone().drive() => {}
                _ = s.flush_when_due() => {}
            }
        }
    }

    /// Whether Send with Invalidate is in use on this connection.
    pub fn remote_invalidation(&self) -> bool {
        self.s.send_inv.load(Ordering::Acquire)
    }
}

impl<P: Provider + 'static> Shared<P> {
    /// The key a command's SCSI Response invalidates, given what the command's iSER header
    /// named (taken out of `remote`: the command's STags end with its response): with remote
    /// invalidation negotiated, the one key the initiator gave (read, else write).
    fn response_invalidates(&self, remote: Option<Remote>) -> Option<u32> {
        let rm = remote.filter(|_| self.send_inv.load(Ordering::Acquire))?;
        rm.read.or(rm.write).map(|b| b.stag).filter(|&k| k != 0)
    }
}

impl<P: Provider + 'static> IserDatamover<P> {
    /// Send_Control: a Send, posted (nothing here waits: the send queue is sized for the window).
    fn post_control(&self, pdu: ControlPdu) -> Result<(), DmError> {
        let s = &self.s;
        let mut invalidate = None;
        match &pdu.header {
            Header::NopIn(_) | Header::AsyncMessage(_) if s.role == Role::Target => lock(&s.unexpected).sending(&pdu.header)?,
            Header::ScsiResponse(r) => {
                let remote = lock(&s.remote).remove(&r.itt);
                invalidate = s.response_invalidates(remote);
            }
            _ => {}
        }
        s.send_pdu_from(IserHeader::CONTROL, &pdu.header, &pdu.ahs, &[&pdu.data], None, invalidate)
    }
}

impl<P: Provider + 'static> Datamover for IserDatamover<P> {
    fn send_control(&self, pdu: ControlPdu) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(async move { self.post_control(pdu) })
    }

    fn try_send_control(&self, pdu: ControlPdu) -> Attempt<Result<(), DmError>, ControlPdu> {
        Attempt::Done(self.post_control(pdu))
    }

    fn try_put_data(&self, desc: DataInDesc, data: Bytes) -> Attempt<Result<PutDataDone, DmError>, (DataInDesc, Bytes)> {
        match self.s.writes_in_flight.try_take(data.len() as u64) {
            Ok(room) => Attempt::Done(self.put_data_by_write(desc, data, room)),
            Err(tokio::sync::TryAcquireError::NoPermits) => Attempt::WouldWait((desc, data)),
            Err(tokio::sync::TryAcquireError::Closed) => Attempt::Done(Err(DmError::Closed)),
        }
    }

    fn try_release_sends(&self) -> Attempt<Result<(), DmError>, ()> {
        Attempt::Done(self.s.release_sends())
    }

    fn put_data(&self, desc: DataInDesc, data: Bytes) -> BoxFuture<'_, Result<PutDataDone, DmError>> {
        Box::pin(async move {
            let room = self.room_for_read_data(data.len() as u64).await?;
            self.put_data_by_write(desc, data, room)
        })
    }

    fn get_data(&self, plan: R2tPlan) -> BoxFuture<'_, Result<TaskBuffer, DmError>> {
        Box::pin(self.get_data_by_read(plan))
    }

    fn try_get_data(&self, plan: R2tPlan) -> Attempt<Result<Bytes, DmError>, R2tPlan> {
        self.lent_write_data(plan)
    }

    fn notice_key_values(&self, p: &NegotiatedParams) {
        *lock(&self.s.limits) = p.transfer_limits(self.s.role);
    }

    fn allocate_connection_resources(&self, res: ConnectionResources) -> Result<(), DmError> {
        // An initiator has no more requests outstanding than its receives hold answers for
        // (`max_outstanding_commands`): what a target sends beyond them and a few PDUs of its
        // own, while the session is busy, is more than an honest target sends.
        let window = if self.s.role == Role::Initiator && res.commands == 0 { self.s.cfg.recv_depth } else { res.commands };
        self.s.backlog.set_window(window);
        self.s.post_ff_recvs()
    }

    fn deallocate_connection_resources(&self) {
        lock(&self.s.writes).clear();
        lock(&self.s.remote).clear();
        lock(&self.s.tasks).clear();
        self.s.drop_read_regions();
    }

    fn enable(&self) {
        // The receives went up in allocate_connection_resources, before the final login PDU.
        // A consumer that skipped that step gets them now (late: a burst may already have
        // overrun the login receives), rather than a connection that runs on four.
        if let Err(why) = self.s.post_ff_recvs() {
            self.s.fail(why);
        }
    }

    fn release_task_buffer(&self, buf: TaskBuffer) {
        self.s.pool.give(buf.data);
    }

    fn take_buffer(&self, len: usize) -> Vec<u8> {
        self.s.pool.take_room(len)
    }

    fn discard_command(&self, itt: u32) {
        if self.s.duplicates.take(itt) {
            // A discarded command that reused a running task's tag: what is held is not its.
            return;
        }
        self.deallocate_task_resources(itt);
    }

    fn deallocate_task_resources(&self, itt: u32) {
        self.s.duplicates.forget(itt);
        lock(&self.s.writes).remove(&itt);
        lock(&self.s.remote).remove(&itt);
        if let Some(t) = lock(&self.s.tasks).remove(&itt) {
            // No response will invalidate these: revoke them here.
            [t.read, t.write].into_iter().flatten().for_each(|mr| mr.invalidate());
        }
    }

    fn terminate(&self) {
        // The user of this datamover learns of the end as of any other (the event is what
        // ends an initiator's receiver and so fails its commands in flight).
        if !self.s.closed.swap(true, Ordering::AcqRel) {
            self.s.queue_event(DmEvent::Terminated(Terminated::Local));
        }
        self.s.writes_changed.notify_waiters();
        // Whatever was gathered leaves before the end.
        let _ = self.s.release_sends();
        // Read data waiting for room learns of the end.
        self.s.writes_in_flight.room.close();
        self.s.drop_read_regions();
        // Sends return once queued: let the signaled ones (a Logout Response, a Reject, a
        // failed Login Response) and with them all posted before leave, then disconnect. What
        // was left to a thread still posting (see `Unsignaled`) is posted first: that thread
        // never waits, so it is soon done.
        let s = self.s.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(h) => {
                h.spawn(async move {
                    for _ in 0..200 {
                        if (lock(&s.waiting).is_empty() && !lock(&s.unsignaled).posting) || !s.qp.is_connected() {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    s.qp.disconnect();
                });
            }
            Err(_) => {
                for _ in 0..10_000 {
                    if !lock(&s.unsignaled).posting {
                        break;
                    }
                    std::thread::yield_now();
                }
                s.qp.disconnect();
            }
        }
    }

    /// Routine requests nobody waits for (commands' responses, small RDMA Writes, …) are
    /// gathered and posted as one list at `release_sends`: the software RNIC writes them in
    /// one system call. A request someone waits for takes what was gathered with it.
    fn hold_sends(&self) {
        lock(&self.s.unsignaled).start_gathering();
    }

    fn release_sends(&self) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(async move { self.s.release_sends() })
    }

    fn try_next_event(&self) -> Option<DmEvent> {
        let e = self.s.events_rx.try_lock().ok()?.try_recv().ok()?;
        self.s.backlog.take();
        Some(e)
    }

    fn next_event(&self) -> BoxFuture<'_, DmEvent> {
        Box::pin(async move {
            match self.s.events_rx.lock().await.recv().await {
                Some(e) => {
                    self.s.backlog.take();
                    e
                }
                None => DmEvent::Terminated(Terminated::Local),
            }
        })
    }

    fn send_command(&self, cmd: ScsiCommand, ahs: Bytes, read_len: u32, write: Option<Bytes>) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(async move { self.send_command_with_buffers(cmd, ahs, read_len, write) })
    }

    fn try_send_command(
        &self,
        cmd: ScsiCommand,
        ahs: Bytes,
        read_len: u32,
        write: Option<Bytes>,
    ) -> Attempt<Result<(), DmError>, CommandArgs> {
        Attempt::Done(self.send_command_with_buffers(cmd, ahs, read_len, write))
    }

    fn max_recv_data_segment_length(&self) -> Option<u32> {
        Some(self.s.cfg.recv_segment())
    }

    /// Initiator: `recv_depth` less [`ANSWERS_RESERVED`] — each command's answer takes one of
    /// the receives posted, which must also hold the target's own PDUs and the answers to
    /// immediate requests.
    fn max_outstanding_commands(&self) -> Option<u32> {
        (self.s.role == Role::Initiator).then(|| commands_for(self.s.cfg.recv_depth))
    }

    /// A read's GOOD status goes as the SCSI Response Send posted behind its data (see
    /// `put_data_by_write`): no Data-In, the same messages as Send_Control would post.
    fn collapses_status(&self) -> bool {
        true
    }

    fn can_put_data(&self, itt: u32) -> bool {
        lock(&self.s.remote).get(&itt).is_some_and(|r| r.read.is_some_and(|b| b.stag != 0))
    }

    fn take_read_data(&self, itt: u32) -> Option<BytesMut> {
        self.take_read_buffer(itt)
    }
}

/// A region's bytes: its buffer back (no copy) when this is the last handle, else a copy —
/// never nothing (a count checked before an unwrap could race with a handle taken or dropped
/// in between, and an empty buffer would have been written as the command's data).
fn copy_out<M: MemoryRegion>(mr: Arc<M>) -> BytesMut {
    match mr.into_buffer() {
        Ok(whole) => riser_datamover::into_bytes_mut(whole),
        Err(shared) => {
            let mut copy = BytesMut::new();
            shared.read(&mut |b| copy.extend_from_slice(b));
            copy
        }
    }
}

fn caps(cfg: &IserConfig) -> QpCaps {
    let max_send_wr = cfg.send_depth.unwrap_or(cfg.recv_depth * 4 + 16).max(cfg.recv_depth * 2 + 16);
    QpCaps { max_send_wr, max_recv_wr: cfg.recv_depth + LOGIN_RECVS, max_sge: 2 }
}

/// How many routine requests in a row may go unsignaled: [`IserConfig::signal_every`], at most
/// a quarter of the send queue (unsignaled requests keep their entries until a later one
/// completes).
fn signal_interval(cfg: &IserConfig) -> u32 {
    cfg.signal_every.clamp(1, (caps(cfg).max_send_wr / 4).max(1))
}

/// Target: accept an iSER connection request (blocking: run it off the async threads). The
/// returned datamover's [`IserDatamover::driver`] must be spawned. Every connection has a
/// protection domain of its own, so a peer's keys can never reach another connection's memory.
pub fn accept<P: Provider + 'static>(
    provider: &P,
    mut req: P::Request,
    cfg: IserConfig,
) -> Result<(IserDatamover<P>, SocketAddr), riser_verbs::Error> {
    let theirs = CmPrivateData::parse(req.private_data());
    let send_inv = cfg.send_invalidate && !theirs.send_inv_not_supported;
    let peer = req.peer();
    let pd = provider.alloc_pd()?;
    let cq = provider.create_cq(caps(&cfg).max_send_wr + caps(&cfg).max_recv_wr)?;
    let qp = req.create_qp(&pd, &cq, &cq, caps(&cfg))?;
    let dm = IserDatamover::new(Role::Target, cfg, pd, cq, qp)?;
    dm.s.send_inv.store(send_inv, Ordering::Release);
    let (peer_ird, _peer_ord) = req.ird_ord();
    let ours = CmPrivateData { zbva_not_supported: true, send_inv_not_supported: !send_inv };
    req.accept(&ConnParam { private_data: ours.emit().to_vec(), responder_resources: cfg.ird, initiator_depth: cfg.ord.min(peer_ird) })?;
    debug!(%peer, send_inv, "iSER connection accepted");
    Ok((dm, peer))
}

/// Initiator: connect to an iSER target (blocking). Spawn the returned datamover's driver. The
/// connection has a protection domain of its own.
pub fn connect<P: Provider + 'static>(provider: &P, addr: SocketAddr, cfg: IserConfig) -> Result<IserDatamover<P>, riser_verbs::Error> {
    let pd = provider.alloc_pd()?;
    let cq = provider.create_cq(caps(&cfg).max_send_wr + caps(&cfg).max_recv_wr)?;
    let qp = provider.create_qp(addr, &pd, &cq, &cq, caps(&cfg))?;
    let dm = IserDatamover::new(Role::Initiator, cfg, pd, cq, qp)?;
    // Offer remote invalidation only where the provider's keys can be invalidated by the peer
    // (not with plain registrations on rxe, nor with a fixed-key pool).
    let offer_inv = cfg.send_invalidate && provider.remote_invalidation();
    let ours = CmPrivateData { zbva_not_supported: true, send_inv_not_supported: !offer_inv };
    let est = provider
        .connect(&dm.s.qp, &ConnParam { private_data: ours.emit().to_vec(), responder_resources: cfg.ird, initiator_depth: cfg.ord })?;
    // As Linux: remote invalidation is on iff the reply's 0x40 bit is clear (and we offered it).
    let theirs = CmPrivateData::parse(&est.private_data);
    dm.s.send_inv.store(offer_inv && !est.private_data.is_empty() && !theirs.send_inv_not_supported, Ordering::Release);
    debug!(%addr, transport = %est.description, "iSER connection established");
    Ok(dm)
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_verbs::Access;

    #[test]
    fn the_send_queue_holds_what_the_settings_can_leave_in_it() {
        let d = IserConfig::default();
        assert_eq!((caps(&d).max_send_wr, signal_interval(&d)), (528, DEFAULT_SIGNAL_EVERY));
        // Too shallow a queue is raised to two entries per receive plus 16; an interval longer
        // than a quarter of the queue is shortened (unsignaled requests keep their entries).
        let c = IserConfig { send_depth: Some(16), signal_every: 1000, ..d };
        assert_eq!((caps(&c).max_send_wr, signal_interval(&c)), (272, 68));
        let c = IserConfig { send_depth: Some(4096), signal_every: 0, ..d };
        assert_eq!((caps(&c).max_send_wr, signal_interval(&c)), (4096, 1));
    }

    /// A region whose buffer cannot be taken back even though the caller holds the only strong
    /// handle: the software RNIC's receive path upgrades its weak handle for a moment whenever
    /// a tagged message names the region's STag, so `Arc::try_unwrap` may fail at any time.
    #[derive(Debug)]
    struct Held(Vec<u8>);

    impl MemoryRegion for Held {
        fn lkey(&self) -> u32 {
            1
        }
        fn rkey(&self) -> u32 {
            1
        }
        fn addr(&self) -> u64 {
            self.0.as_ptr() as u64
        }
        fn len(&self) -> usize {
            self.0.len()
        }
        fn access(&self) -> Access {
            Access::LOCAL_WRITE
        }
        fn read(&self, f: &mut dyn FnMut(&[u8])) {
            f(&self.0)
        }
        fn write(&self, _: &mut dyn FnMut(&mut [u8])) {
            unreachable!("copy_out only reads")
        }
        fn invalidate(&self) {}
        fn rekey(&self) -> riser_verbs::Result<u32> {
            Ok(1)
        }
        fn is_valid(&self) -> bool {
            true
        }
        fn into_buffer(self: Arc<Self>) -> Result<Vec<u8>, Arc<Self>> {
            Err(self)
        }
    }

    /// The bytes of a region that cannot be unwrapped are copied, never lost: the last strong
    /// handle used to be unwrapped without a fallback, and a region held for a moment by the
    /// RNIC came out empty, to be written as the command's data with GOOD status.
    #[test]
    fn a_region_that_cannot_be_unwrapped_is_copied() {
        let data: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
        let mr = Arc::new(Held(data.clone()));
        assert_eq!(Arc::strong_count(&mr), 1);
        assert_eq!(&copy_out(mr)[..], &data[..]);
    }
}
