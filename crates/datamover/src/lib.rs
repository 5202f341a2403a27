//! # riser-datamover — the seam between the iSCSI layer and the transports
//!
//! RFC 5047 splits iSCSI into the protocol layer (sessions, sequence numbers, login, tasks) and
//! a *datamover* that moves PDUs and data. riser's target and initiator are written against
//! the [`Datamover`] trait only; the TCP datamover turns its primitives into PDUs on a socket,
//! the iSER datamover into RDMA operations. The iSCSI layer decides **what** moves (offsets,
//! lengths, DataSN, R2TSN, TTT); the datamover decides **how**.
//!
//! | RFC 5047 primitive | here |
//! |---|---|
//! | Send_Control | [`Datamover::send_control`] |
//! | Put_Data | [`Datamover::put_data`] (target) |
//! | Get_Data | [`Datamover::get_data`] (target; [`Datamover::try_get_data`] when the data is all here) |
//! | Allocate_Connection_Resources | [`Datamover::allocate_connection_resources`] |
//! | Deallocate_Connection_Resources | [`Datamover::deallocate_connection_resources`] |
//! | Deallocate_Task_Resources | [`Datamover::deallocate_task_resources`] |
//! | Enable_Datamover | [`Datamover::enable`] |
//! | Connection_Terminate | [`Datamover::terminate`] |
//! | Notice_Key_Values | [`Datamover::notice_key_values`] |
//! | Control_Notify | [`DmEvent::Control`] |
//! | Data_Completion_Notify | the completion of the [`Datamover::put_data`] / [`Datamover::get_data`] future |
//! | Data_ACK_Notify | [`DmEvent::DataAck`] (ERL > 0 only) |
//! | Connection_Terminate_Notify | [`DmEvent::Terminated`] |
//!
//! Three calls are riser's, not RFC 5047's: they let the iSCSI layer work in turns.
//! [`Datamover::try_next_event`] hands out what has already arrived without waiting;
//! between [`Datamover::hold_sends`] and [`Datamover::release_sends`] what is sent may be
//! gathered (TCP: one `writev`; iSER: one posted list), never reordered. Their defaults do
//! nothing, so a datamover that ignores them is still correct.
//!
//! The trait is object-safe (`Box<dyn Datamover>`) and names no runtime: its futures are plain
//! boxed futures; a datamover implementation picks its runtime (riser-tcp uses tokio).
//!
//! Task buffers belong to the datamover: write data arrives in a [`TaskBuffer`] the datamover
//! allocated (registered memory on iSER) and filled — immediate, unsolicited and solicited
//! data all land in place, and the target core never copies them.
//!
//! The crate holds the seam only: the trait, its value types, the errors that cross it, and the
//! [`BufferPool`] datamovers take task buffers from. The implementations live with their
//! transports: `riser-tcp` (iSCSI/TCP data semantics over a byte stream) and `riser-iser`.
//!
//! ## Where it sits
//!
//! ```text
//!  riser-target / riser-initiator    (the iSCSI layer: what moves)
//!              │  SharedDatamover = Arc<dyn Datamover>, one per connection
//!  ────────────┼──────────────────── this crate
//!  riser-tcp   │   riser-iser ── riser-verbs ── riser-iwarp / rdma-core
//! ```
//!
//! The main types: [`Datamover`] (the trait) and [`SharedDatamover`] (how the target and the
//! initiator hold one); [`ControlPdu`] and [`DmEvent`] (what crosses the seam in each
//! direction); [`DataInDesc`] and [`R2tPlan`] (what Put_Data and Get_Data are asked to move);
//! [`TaskBuffer`] and [`BufferPool`] (where the data lives); [`DmError`] (why a connection
//! ends). A datamover of one's own — a wrapper that counts or throttles, or a new transport —
//! implements [`Datamover`] and is handed to `riser_target::server::Target::connection` on the
//! target side or through a `riser_initiator::Connector` on the initiator side (the repository's
//! `examples/embed_custom_datamover.rs` wraps riser-tcp's on both roles).
//!
//! ## Example
//!
//! Code of the iSCSI layer is written against the seam only: here, putting a READ's data
//! (compiled, not run: it needs a connected datamover), and the take/give cycle of the
//! [`BufferPool`] a datamover keeps its task buffers in (run).
//!
//! ```rust
//! use bytes::Bytes;
//! use riser_datamover::{BufferPool, DataInDesc, DmError, SharedDatamover};
//! use riser_scsi::lun::Lun;
//!
//! /// Send `data` as the read data of task `itt`, from buffer offset 0 (the datamover turns it
//! /// into Data-In PDUs on TCP, into RDMA Writes on iSER).
//! async fn put_read(dm: &SharedDatamover, itt: u32, data: Vec<u8>) -> Result<(), DmError> {
//!     let desc = DataInDesc { itt, lun: Lun::ZERO, offset: 0, data_sn: 0, collapse_status: None };
//!     dm.put_data(desc, Bytes::from(data)).await?;
//!     Ok(())
//! }
//!
//! let pool = BufferPool::default();
//! let mut buf = pool.take(4096); // zeroed, 4096 bytes
//! assert!(buf.len() == 4096 && buf.iter().all(|&b| b == 0));
//! buf[..5].copy_from_slice(b"hello");
//! let first = buf.as_ptr();
//! pool.give(buf); // kept for reuse: no fresh mapping, no page faults next time
//!
//! let again = pool.take(1024); // the same memory, zeroed again and cut to size
//! assert_eq!(again.as_ptr(), first);
//! assert!(again.len() == 1024 && again.iter().all(|&b| b == 0));
//! ```
#![warn(missing_docs)]

mod backlog;
mod duplicates;
mod pool;

pub use backlog::{BACKLOG_DEFAULT, BACKLOG_SLACK, Backlog};
pub use duplicates::{DUPLICATE_TAGS_MAX, DuplicateCommands};
pub use pool::{BufferPool, POOL_MAX_BYTES, SHARED_POOL_MAX_BYTES, into_bytes_mut};
/// Largest write buffer a datamover allocates for one command (EDTL above this is refused by
/// the target core with CHECK CONDITION before any data is solicited).
pub const MAX_TASK_BUFFER: u32 = 64 << 20;

/// The R2T arithmetic is the iSCSI layer's (it decides what moves); re-exported for datamovers.
pub use riser_iscsi::session::{R2tDesc, R2tPlan};

use bytes::{Bytes, BytesMut};
use core::future::Future;
use core::pin::Pin;
use riser_iscsi::keys::NegotiatedParams;
use riser_iscsi::wire::{DecodeError, Header, ScsiCommand};
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

/// A boxed, sendable future (keeps the trait object-safe without naming a runtime).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Poll `fut` once: its output if it is done at once, else `None` (the future stays where it is,
/// to be awaited on). For a deadline that is armed only when needed: most sends and most PDUs
/// are done at their first poll, and arming a runtime's timer costs a clock reading and a hold
/// on the runtime every time.
pub async fn poll_once<F: Future + ?Sized>(fut: Pin<&mut F>) -> Option<F::Output> {
    let mut fut = fut;
    core::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        core::task::Poll::Ready(v) => core::task::Poll::Ready(Some(v)),
        core::task::Poll::Pending => core::task::Poll::Ready(None),
    })
    .await
}

/// A control-type PDU (RFC 5047 §7): everything but Data-In, Data-Out and R2T.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ControlPdu {
    /// The header.
    pub header: Header,
    /// AHS area (rarely used).
    pub ahs: Bytes,
    /// Data segment (text, sense, ping data, rejected header…). For a SCSI Command carrying
    /// write data this is empty: immediate data went straight into the task's [`TaskBuffer`].
    pub data: Bytes,
    /// For a received SCSI Command with write data: bytes of immediate data already placed in
    /// the task buffer.
    pub immediate: u32,
}

impl ControlPdu {
    /// A PDU without AHS.
    pub fn new(header: Header, data: Bytes) -> Self {
        Self { header, ahs: Bytes::new(), data, immediate: 0 }
    }
}

/// A task's data buffer, allocated by the datamover.
#[derive(Debug, Default)]
pub struct TaskBuffer {
    /// The bytes (for a write: the data received, in buffer-offset order).
    pub data: BytesMut,
}

/// Contents of the would-be Data-In PDUs for one contiguous range of a READ (Put_Data).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DataInDesc {
    /// Task.
    pub itt: u32,
    /// LUN.
    pub lun: Lun,
    /// Buffer offset of the first byte.
    pub offset: u32,
    /// First DataSN to use.
    pub data_sn: u32,
    /// When the range ends the command and the status is GOOD without sense, a datamover
    /// that [collapses status](Datamover::collapses_status) sends the status with the data:
    /// TCP in the last Data-In (S bit), iSER as the SCSI Response Send behind the data.
    pub collapse_status: Option<CollapsedStatus>,
}

/// A status sent with a read's last data (phase collapse; see [`Datamover::collapses_status`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CollapsedStatus {
    /// SCSI status (GOOD or CONDITION MET).
    pub status: Status,
    /// Residual underflow / overflow and count.
    pub underflow: bool,
    /// Overflow.
    pub overflow: bool,
    /// Residual count.
    pub residual: u32,
    /// StatSN, ExpCmdSN, MaxCmdSN to stamp.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// What Put_Data did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PutDataDone {
    /// Data-In PDUs sent (DataSN consumed); 0 on iSER.
    pub pdus: u32,
    /// Whether the status went out with the data (TCP: in the last Data-In; iSER: its SCSI
    /// Response, posted behind the data).
    pub status_sent: bool,
}

/// Why the datamover could not do something. Structured, `Clone + PartialEq`, no allocation:
/// the session layer matches on it (a [`DmError::Decode`] carries the RFC's reaction).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DmError {
    /// The connection is gone.
    #[error("connection closed")]
    Closed,
    /// The task is unknown or was aborted.
    #[error("no such task {0:#x}")]
    NoTask(u32),
    /// A received PDU is malformed; [`DecodeError::reaction`] says whether the session answers
    /// with a Reject and goes on, or the connection ends.
    #[error("malformed PDU: {0}")]
    Decode(#[from] DecodeError),
    /// The peer broke a rule of the datamover's protocol; the connection is dropped.
    #[error("protocol error: {0}")]
    Protocol(#[from] Violation),
    /// The task's data arrived out of sequence (wrong DataSN, offset or tag); the task must
    /// end with CHECK CONDITION, the connection stays up.
    #[error("data sequence error: {0}")]
    DataSequence(#[from] SequenceError),
    /// Transport I/O error.
    #[error("I/O error: {0}")]
    Io(std::io::ErrorKind),
    /// A local resource the transport needs could not be had (memory registration, queue
    /// room, receive buffers); the reason is logged where it happened.
    #[error("out of transport resources: {what}")]
    Resources {
        /// What was being done.
        what: &'static str,
    },
    /// An RDMA work request completed in error (iSER).
    #[error("{op} completed with {status}")]
    Completion {
        /// The work request (Send, RDMA Write, RDMA Read, Receive).
        op: &'static str,
        /// Its completion status.
        status: &'static str,
    },
}

impl From<std::io::Error> for DmError {
    fn from(e: std::io::Error) -> Self {
        Self::Io(e.kind())
    }
}

/// A peer's breach of the data-transfer rules that ends the connection (RFC 7143 §7.1 at
/// ERL 0; RFC 7145 for iSER).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Violation {
    /// Initiator: the target broke the rules for a command's Data-In or R2Ts (riser-iscsi's
    /// `ReadIn` and `R2tIn`: DataSN and R2TSN in order, Data-In continuing in order, nothing
    /// beyond the expected length, a GOOD status only after the data it vouches for).
    #[error("task {itt:#x}: {error}")]
    TaskData {
        /// Task.
        itt: u32,
        /// The rule broken.
        error: DataInError,
    },
    /// A SCSI Command carried immediate data although ImmediateData=No.
    #[error("immediate data sent with ImmediateData=No")]
    ImmediateDataNotNegotiated,
    /// A new write reused the Initiator Task Tag of a write still outstanding.
    #[error("ITT {itt:#x} reused while its write is outstanding")]
    TaskTagReused {
        /// The tag.
        itt: u32,
    },
    /// The last Data-Out an R2T asked for came without the F bit.
    #[error("last Data-Out of an R2T without the F bit")]
    BurstWithoutFinal,
    /// A PDU's data segment did not follow its header in time.
    #[error("a {len}-byte data segment not received within {secs} s of its header")]
    SegmentStalled {
        /// Announced DataSegmentLength.
        len: u32,
        /// The limit, in seconds.
        secs: u64,
    },
    /// A link was asked to read a data segment of another length than its header announced
    /// (a datamover bug, reported rather than trusted).
    #[error("data segment read with the wrong length")]
    SegmentLengthMismatch,
    /// iSER: the peer sent more PDUs than the iSCSI layer has taken, beyond its command window
    /// and a few immediate ones (see [`Backlog`]): over a byte stream the datamover stops
    /// reading instead, but a Send cannot be made to wait.
    #[error("more than {limit} PDUs received that the iSCSI layer has not taken (beyond the command window)")]
    Backlog {
        /// The bound ([`Backlog::limit`]).
        limit: u32,
    },
    /// Target on iSER: more unexpected PDUs (NOP-In pings or Async Messages) than an iSER
    /// initiator has receive buffers for (RFC 7145 §6.2).
    #[error("more than {limit} unexpected PDUs of one kind outstanding on an iSER connection")]
    TooManyUnexpected {
        /// The limit.
        limit: u32,
    },
    /// Target on iSER: a command expects read data but its initiator advertised no read STag.
    #[error("task {itt:#x} has read data but no read STag was advertised")]
    NoReadStag {
        /// Task.
        itt: u32,
    },
    /// An iSER Hello or HelloReply arrived: RFC 7145 sets connections up through the
    /// connection manager, not with Hello messages.
    #[error("iSER Hello/HelloReply received: riser speaks RFC 7145 iSER, set up by the connection manager")]
    IserHello,
    /// An iSER header with an opcode RFC 7145 does not define.
    #[error("unknown iSER opcode {0:#x}")]
    IserOpcode(u8),
    /// A message shorter than the iSER header.
    #[error("iSER message shorter than its header")]
    IserTruncated,
    /// The peer frames PDUs with RFC 5046's 12-byte iSER header.
    #[error("the peer uses the 12-byte iSER header of RFC 5046; riser speaks RFC 7145 (28-byte header, as Linux)")]
    Rfc5046Header,
    /// iSER initiator: the target invalidated a key remotely although remote invalidation was
    /// not negotiated.
    #[error("unexpected remote invalidation (not negotiated)")]
    UnexpectedInvalidation,
    /// iSER initiator: the target invalidated a key that is not one of the task's.
    #[error("remote invalidation of {key:#x}, not a key of task {itt:#x}")]
    ForeignInvalidation {
        /// The invalidated key.
        key: u32,
        /// The task the response named.
        itt: u32,
    },
}

/// Why a task's write data broke sequence: riser-iscsi's, where the rules that raise it are
/// ([`riser_iscsi::session::WriteIn`], built on [`riser_iscsi::session::UnsolicitedIn`] and
/// [`riser_iscsi::session::SolicitedIn`]).
pub use riser_iscsi::session::{DataInError, SequenceError};

/// Why a connection ended (Connection_Terminate_Notify).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Terminated {
    /// The peer closed the connection.
    PeerClosed,
    /// A framing, digest, protocol or transport error dropped it.
    Error(DmError),
    /// We terminated it.
    Local,
}

/// Notifications from the datamover to the iSCSI layer.
#[derive(Debug)]
#[non_exhaustive]
pub enum DmEvent {
    /// Control_Notify: a control PDU arrived. For a SCSI Command with write data the datamover
    /// has allocated the task buffer and placed the immediate data; the buffer is handed out by
    /// [`Datamover::get_data`] later.
    Control(ControlPdu),
    /// A well-framed PDU whose header breaks a rule answered with a Reject
    /// ([`DecodeError::reaction`]): its data was discarded; the target rejects `bhs` with the
    /// reaction's reason, an initiator drops the connection.
    Malformed {
        /// The offending header, as received.
        bhs: [u8; riser_iscsi::wire::BHS_LEN],
        /// What is wrong with it.
        error: DecodeError,
    },
    /// Data_ACK_Notify (ERL > 0).
    DataAck {
        /// Task.
        itt: u32,
        /// Acknowledged DataSN.
        data_sn: u32,
    },
    /// Connection_Terminate_Notify.
    Terminated(Terminated),
}

/// What a datamover's `try_` call did: the whole of the operation, at once, or nothing, because
/// it would have had to wait (its arguments come back; the caller makes the waiting call).
///
/// The `try_` calls are the seam's hot path without a future: most sends of a target's turn
/// need no waiting (they gather in the transport), and a future returned through a trait object
/// is boxed. A datamover that offers none keeps the defaults (always [`WouldWait`](Self::WouldWait)).
#[derive(Debug)]
#[must_use]
pub enum Attempt<T, A> {
    /// Done: what the waiting call would have returned.
    Done(T),
    /// Nothing done: the call would have had to wait. The arguments, back.
    WouldWait(A),
}

/// The arguments of [`Datamover::send_command`], as [`Datamover::try_send_command`] gives them
/// back when it would have had to wait.
#[derive(Debug)]
pub struct CommandArgs {
    /// The command.
    pub cmd: ScsiCommand,
    /// Its AHS.
    pub ahs: Bytes,
    /// Bytes of read buffer.
    pub read_len: u32,
    /// Write data.
    pub write: Option<Bytes>,
}

/// Sizes the iSCSI layer asks the datamover to provision (Allocate_Connection_Resources).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ConnectionResources {
    /// Commands that may be outstanding: the CmdSN window, and on a target the immediate
    /// commands it allows beside it. With a few other immediate PDUs, also what the datamover
    /// queues at most for the iSCSI layer to take (see [`Backlog`]). 0: not named (the bound
    /// stays as it was, [`BACKLOG_DEFAULT`] at first).
    pub commands: u32,
}

/// The datamover of one connection.
pub trait Datamover: Send + Sync + core::fmt::Debug {
    /// Send_Control: send a control-type PDU. Completion means it is on its way in order with
    /// everything sent before it.
    fn send_control(&self, pdu: ControlPdu) -> BoxFuture<'_, Result<(), DmError>>;

    /// Put_Data (target): move `data` to the initiator's buffer at `desc.offset`, as Data-In
    /// PDUs (TCP) or RDMA Writes (iSER). Completes when the data is handed to the transport in
    /// order (Data_Completion_Notify).
    fn put_data(&self, desc: DataInDesc, data: Bytes) -> BoxFuture<'_, Result<PutDataDone, DmError>>;

    /// Get_Data (target): obtain the write data of a task as `plan` says — all of its
    /// unsolicited data (`[0, plan.start)`), then the solicited range (R2Ts on TCP, RDMA Reads
    /// on iSER). Returns the task's buffer of `plan.end` bytes, every one of them received; a
    /// task whose data broke sequence fails with [`DmError::DataSequence`].
    fn get_data(&self, plan: R2tPlan) -> BoxFuture<'_, Result<TaskBuffer, DmError>>;

    /// Notice_Key_Values: the negotiated keys (see [`enable`](Self::enable) for when they apply).
    fn notice_key_values(&self, params: &NegotiatedParams);

    /// Allocate_Connection_Resources: provision the full feature phase (iSER posts its receive
    /// buffers: RFC 7145 §5.1 wants them up before the final Login Response leaves).
    fn allocate_connection_resources(&self, res: ConnectionResources) -> Result<(), DmError>;

    /// Deallocate_Connection_Resources.
    fn deallocate_connection_resources(&self);

    /// Enable_Datamover: login is over; full feature phase begins. Until then the datamover
    /// reads nothing ahead: each login PDU is read when [`next_event`](Self::next_event) asks for
    /// it, so a PDU after the last login PDU is framed with the parameters of
    /// [`notice_key_values`](Self::notice_key_values), which the iSCSI layer calls first.
    ///
    /// The order at the end of login (RFC 5047 §7, RFC 7145 §5): the target calls
    /// `allocate_connection_resources` and `notice_key_values` before it sends the final Login
    /// Response — on a message transport the initiator's first command may arrive the moment
    /// that response has left, and must meet the negotiated values — and `enable` once it is
    /// sent. The initiator calls `allocate_connection_resources` before the Login Request that
    /// asks for the full feature phase, then `notice_key_values` and `enable` once the final
    /// response is in. Values noticed apply to what is received from the next PDU on, and to
    /// what is sent once enabled (the final Login Response still goes out framed as login).
    fn enable(&self);

    /// [`send_control`](Self::send_control) if it needs no waiting (it joins what is gathered,
    /// [`hold_sends`](Self::hold_sends)); else nothing is sent and the PDU comes back. Default:
    /// never.
    fn try_send_control(&self, pdu: ControlPdu) -> Attempt<Result<(), DmError>, ControlPdu> {
        Attempt::WouldWait(pdu)
    }

    /// [`put_data`](Self::put_data) if it needs no waiting; else nothing is sent and the
    /// arguments come back. Default: never.
    fn try_put_data(&self, desc: DataInDesc, data: Bytes) -> Attempt<Result<PutDataDone, DmError>, (DataInDesc, Bytes)> {
        Attempt::WouldWait((desc, data))
    }

    /// [`get_data`](Self::get_data) if the task's data is all here already (it came with the
    /// command, say): the data, exactly `plan.end` bytes. They may lie in the datamover's own
    /// memory, which goes back to it when the last of them is dropped (such bytes cannot become
    /// a `BytesMut`, and are not given back through
    /// [`release_task_buffer`](Self::release_task_buffer)); iSER hands a write's immediate data
    /// on in the receive buffer it arrived in, to be posted again whole. Else nothing is taken
    /// and the plan comes back for `get_data`, which reports any error. Default: never.
    fn try_get_data(&self, plan: R2tPlan) -> Attempt<Result<Bytes, DmError>, R2tPlan> {
        Attempt::WouldWait(plan)
    }

    /// [`release_sends`](Self::release_sends) if everything gathered leaves without waiting.
    /// `WouldWait`: not all of it has left yet; what did stays sent, and `release_sends` sends
    /// the rest (gathering has ended either way). Default: never.
    fn try_release_sends(&self) -> Attempt<Result<(), DmError>, ()> {
        Attempt::WouldWait(())
    }

    /// Deallocate_Task_Resources: forget task `itt` (aborted or finished): drop its buffer,
    /// fail a pending Get_Data, ignore its further Data-Out — whatever commands reusing its
    /// tag were counted as duplicates meanwhile ([`DuplicateCommands::forget`]).
    fn deallocate_task_resources(&self, itt: u32);

    /// A command the session did not take (`TargetEvent::Discard`): free what the datamover took
    /// for *it*. One that reused the tag of a task the datamover still holds took nothing, and
    /// what is held under `itt` is that task's and must stay ([`DuplicateCommands`] tells the
    /// two apart). Default: [`deallocate_task_resources`](Self::deallocate_task_resources), right
    /// for a datamover that keeps no state per command before the session takes it.
    ///
    /// Kept apart from Deallocate_Task_Resources because the two may meet: a task aborted while
    /// a command reusing its tag waits behind the abort (a peer that did not wait for the
    /// abort's answer) must lose its buffer at the abort, and the count taken for that command
    /// must not be spent there (it was, and the aborted write's buffer stayed until the
    /// connection ended).
    fn discard_command(&self, itt: u32) {
        self.deallocate_task_resources(itt);
    }

    /// Give a task buffer back once its data has been consumed, so the datamover can reuse the
    /// memory (registered memory on iSER; on TCP it spares the allocator and the kernel a fresh
    /// mapping and page faults per large write). On the initiator side this takes back the
    /// data of a finished read ([`take_read_data`](Self::take_read_data)) for later reads.
    fn release_task_buffer(&self, buf: TaskBuffer) {
        drop(buf);
    }

    /// Target: a buffer for data the target core produces (a READ's data), with room for at
    /// least `len` bytes, its length and contents unspecified (the core clears it before it
    /// fills it) — from the datamover's pool, the one pool of the connection
    /// ([`BufferPool::take_room`]); once the data has been put, it comes back through
    /// [`release_task_buffer`](Self::release_task_buffer).
    fn take_buffer(&self, len: usize) -> Vec<u8> {
        Vec::with_capacity(len)
    }

    /// Connection_Terminate.
    fn terminate(&self);

    /// The next notification (Control_Notify, Connection_Terminate_Notify, …).
    fn next_event(&self) -> BoxFuture<'_, DmEvent>;

    /// A notification that is already here, without waiting (`None`: none yet). The iSCSI
    /// layer handles every PDU that has arrived before it lets what they produced leave (see
    /// [`hold_sends`](Self::hold_sends)). Default: none (each event then takes its own turn).
    fn try_next_event(&self) -> Option<DmEvent> {
        None
    }

    /// Start gathering: what is sent from now on (Send_Control, Put_Data, R2Ts) may wait in the
    /// datamover, in order, until [`release_sends`](Self::release_sends), so the responses of
    /// one turn of the iSCSI layer leave together (TCP: one `writev`). A datamover may let
    /// gathered PDUs leave earlier (when a lot has gathered); it never reorders them. The
    /// caller must release before it waits for anything the peer would have to answer.
    /// Default: nothing is held.
    fn hold_sends(&self) {}

    /// Let everything gathered since [`hold_sends`](Self::hold_sends) leave, and stop gathering.
    fn release_sends(&self) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(async { Ok(()) })
    }

    /// Send_Control for a SCSI Command on the initiator, with the task's buffers (RFC 5047 §7.1:
    /// the I/O buffer descriptors travel with the command): a read buffer of `read_len` bytes and
    /// the write data. TCP sends immediate and unsolicited data and answers R2Ts; iSER registers
    /// the buffers and advertises them in the iSER header.
    fn send_command(&self, cmd: ScsiCommand, ahs: Bytes, read_len: u32, write: Option<Bytes>) -> BoxFuture<'_, Result<(), DmError>>;

    /// [`send_command`](Self::send_command) if it needs no waiting (the command joins what the
    /// datamover gathers, or is posted); else nothing is done and the arguments come back.
    /// Default: never.
    fn try_send_command(
        &self,
        cmd: ScsiCommand,
        ahs: Bytes,
        read_len: u32,
        write: Option<Bytes>,
    ) -> Attempt<Result<(), DmError>, CommandArgs> {
        Attempt::WouldWait(CommandArgs { cmd, ahs, read_len, write })
    }

    /// Initiator: the read data of a finished (or aborted) command; forgets the task's buffers
    /// (the initiator half of Deallocate_Task_Resources).
    fn take_read_data(&self, itt: u32) -> Option<BytesMut>;

    /// Initiator: the SCSI commands its connection may have outstanding at once, when the
    /// transport bounds them below the target's CmdSN window. iSER does: every answer lands in a
    /// receive posted beforehand, and one arriving with none posted ends the connection (RFC
    /// 7145 §5.1 leaves that flow control to the initiator, as Linux's ib_iser limits its
    /// commands to its receives). `None` (the default, TCP): the window is the only bound.
    fn max_outstanding_commands(&self) -> Option<u32> {
        None
    }

    /// Whether Put_Data may send the status of a read with its last data
    /// ([`DataInDesc::collapse_status`]): TCP in its last Data-In (phase collapse, RFC 7143
    /// §11.7.4); iSER, which never sends Data-In, as the SCSI Response Send posted right behind
    /// the data's RDMA Writes (the same messages as a separate Send_Control, one call instead
    /// of two; LIO's isert chains them in one post likewise). When it does not (the default),
    /// the target sends a separate SCSI Response.
    fn collapses_status(&self) -> bool {
        false
    }

    /// Target: whether read data of task `itt` can be delivered at all. iSER places it with RDMA
    /// Writes into the read buffer the initiator advertised with the command; a command that
    /// expects read data but advertised none gets CHECK CONDITION before anything is read
    /// (TCP: always, Data-In needs nothing from the initiator).
    fn can_put_data(&self, itt: u32) -> bool {
        let _ = itt;
        true
    }

    /// The largest data segment this datamover can receive (its posted receive buffers on
    /// iSER); login declares no more than this. `None`: no limit of its own.
    fn max_recv_data_segment_length(&self) -> Option<u32> {
        None
    }
}

/// A shared datamover, as the target and initiator hold it (one per connection: compare with
/// `Arc::ptr_eq`).
pub type SharedDatamover = std::sync::Arc<dyn Datamover>;
