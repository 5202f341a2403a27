//! riser-verbs: the RDMA provider interface iSER is written against.
//!
//! The shape follows libibverbs and the RDMA connection manager closely enough that rdma-core
//! can implement it, and is small enough for riser's software iWARP RNIC (`riser-iwarp`) to
//! implement in full:
//!
//! * a [`Provider`] hands out protection domains, completion queues and listeners, and creates
//!   active-side queue pairs;
//! * memory is registered in a protection domain with [`Access`] rights; a [`MemoryRegion`]
//!   owns its buffer (so it cannot move or be freed while the RNIC may touch it) and has one
//!   STag used as lkey and rkey (`index << 8 | key`); [`MemoryRegion::rekey`] issues a fresh
//!   key so stale keys fail, [`MemoryRegion::invalidate`] revokes remote access;
//! * a [`QueuePair`] is reliable-connected: receives are posted before the connection is
//!   established, sends ([`SendOp`]) complete on its send [`CompletionQueue`];
//! * completions are polled, and waited for either blocking or through a future — nobody
//!   busy-polls;
//! * connection setup carries private data and IRD/ORD ([`ConnParam`]); a listener yields
//!   [`ConnectionRequest`]s that are accepted onto a fresh queue pair or rejected with private
//!   data; [`QueuePair::disconnect`] flushes outstanding work with [`WcStatus::WrFlushErr`].
//!
//! ## Where it sits
//!
//! `riser-iser` is generic over a [`Provider`]; this crate holds only the traits and the value
//! types that cross them (work requests, completions, connection parameters, errors). The
//! providers live elsewhere: `riser-iwarp`'s `SoftRnic` (iWARP in user space over TCP, any
//! machine) and, with the cargo feature `rdma-core`, `rdma_core` (real RNICs, rxe, siw through
//! libibverbs and librdmacm). Work is posted as [`SendWr`] / [`RecvWr`] whose [`Sge`]s point into
//! registered regions, and ends as a [`Wc`] on a completion queue.
//!
//! ## Example
//!
//! Code written against the traits runs on every provider. `send_message` (compiled here, not
//! run: this crate has no provider of its own — `riser-iwarp`'s crate docs run the same steps
//! on two connected software RNICs) registers a buffer, posts it as one signaled Send and waits
//! for its completion; the work requests it builds are plain values (run).
//!
//! ```rust
//! use riser_verbs::{
//!     Access, CompletionQueue, MemoryRegion, ProtectionDomain, Provider, QueuePair, SendOp, SendWr,
//!     SgList, Sge, WcOpcode, WcStatus,
//! };
//! use std::time::Duration;
//!
//! /// One scatter/gather element covering `len` bytes of `mr` from `offset`.
//! fn sge(mr: &impl MemoryRegion, offset: usize, len: usize) -> Sge {
//!     Sge { addr: mr.addr() + offset as u64, length: len as u32, lkey: mr.lkey() }
//! }
//!
//! /// Send `msg` on a connected queue pair of provider `P` and wait for its completion.
//! fn send_message<P: Provider>(pd: &P::Pd, qp: &P::Qp, send_cq: &P::Cq, msg: &[u8]) -> riser_verbs::Result<()> {
//!     // Local read is always allowed: a Send's source needs no rights at all.
//!     let mr = pd.register(msg.to_vec(), Access::empty())?;
//!     qp.post_send(SendWr { wr_id: 7, op: SendOp::Send, sg_list: SgList::from_slice(&[sge(&*mr, 0, msg.len())]), unregistered: None, signaled: true })?;
//!     loop {
//!         if let Some(wc) = send_cq.poll(1).pop() {
//!             assert_eq!((wc.wr_id, wc.opcode), (7, WcOpcode::Send));
//!             return match wc.status {
//!                 WcStatus::Success => Ok(()),
//!                 status => Err(std::io::Error::other(status.name()).into()),
//!             };
//!         }
//!         send_cq.wait_blocking(Duration::from_millis(100)); // sleeps until a completion is in
//!     }
//! }
//!
//! // Rights: what a buffer the peer RDMA Writes into (an iSER read buffer) is registered with.
//! let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
//! assert!(rights.contains(Access::REMOTE_WRITE) && !rights.contains(Access::REMOTE_READ));
//! assert_eq!(Access::from_name("REMOTE_READ"), Some(Access::REMOTE_READ));
//!
//! // An RDMA Write of 4 KiB from a region (lkey 0x0100) to the peer's advertised STag and address.
//! let write = SendWr {
//!     wr_id: 1,
//!     op: SendOp::RdmaWrite { remote_addr: 0x7f00_0000_1000, rkey: 0x0203 },
//!     sg_list: SgList::from_slice(&[Sge { addr: 0x5000, length: 4096, lkey: 0x0100 }]),
//!     unregistered: None,
//!     signaled: false, // its completion is implied by a later signaled request's
//! };
//! assert_eq!(write.sg_list.iter().map(|s| s.length).sum::<u32>(), 4096);
//! ```

#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![cfg_attr(not(feature = "rdma-core"), forbid(unsafe_code))]

mod error;
#[cfg(feature = "rdma-core")]
#[cfg_attr(docsrs, doc(cfg(feature = "rdma-core")))]
pub mod rdma_core;

pub use error::{Errno, Error, Invalid, NoDevice, RegistrationError, Resolution, SetupError, Unreachable};

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

bitflags::bitflags! {
    /// Memory access rights (local read is always allowed).
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct Access: u32 {
        /// The RNIC may write into the region for local operations (receives, RDMA Read sinks).
        const LOCAL_WRITE = 1;
        /// Peers may RDMA Write into the region.
        const REMOTE_WRITE = 2;
        /// Peers may RDMA Read from the region.
        const REMOTE_READ = 4;
        /// The region is the sink of this side's RDMA Reads. On iWARP the responder places Read
        /// Responses as tagged writes to the sink's STag (RFC 5040 §4.3), so a provider adds
        /// whatever rights its transport requires there (remote write on iWARP devices, local
        /// write everywhere) and gives the region a key of its own, revoked when it is dropped.
        const READ_SINK = 8;
    }
}

/// One scatter/gather element: `length` bytes at virtual address `addr` of the region `lkey`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sge {
    /// Virtual address (inside the region: [`MemoryRegion::addr`] + offset).
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of the region.
    pub lkey: u32,
}

/// What a send-queue work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SendOp {
    /// Send into the peer's next posted receive.
    Send,
    /// Send, and have the peer invalidate its STag `rkey` once the message arrived.
    SendWithInvalidate {
        /// The peer's STag to invalidate.
        rkey: u32,
    },
    /// Send with the Solicited Event flag.
    SendWithSolicitedEvent,
    /// Send with Solicited Event and Invalidate.
    SendWithSolicitedEventInvalidate {
        /// The peer's STag to invalidate.
        rkey: u32,
    },
    /// Write the gathered local data to the peer's memory.
    RdmaWrite {
        /// Peer virtual address (tagged offset).
        remote_addr: u64,
        /// Peer STag.
        rkey: u32,
    },
    /// Read the peer's memory into the (single) local sink element.
    RdmaRead {
        /// Peer virtual address (tagged offset).
        remote_addr: u64,
        /// Peer STag.
        rkey: u32,
    },
}

/// A work request's scatter/gather list: up to two elements inline (what requests mostly have:
/// headers in one region, data in another), so building one allocates nothing; more spill to the
/// heap. Build it with `SgList::from_slice(&[..])`, `[..].into_iter().collect()` or
/// `Vec::into()`.
pub type SgList = smallvec::SmallVec<[Sge; 2]>;

/// A send-queue work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// The operation.
    pub op: SendOp,
    /// Local data (gather list; for RDMA Read the sink, one element).
    pub sg_list: SgList,
    /// The payload of a Send or RDMA Write given as bytes rather than in registered memory
    /// (with an empty gather list): no registration, no key. Only on a queue pair whose
    /// [`QueuePair::max_unregistered_payload`] is at least its length; the provider holds the
    /// bytes (or a copy) until the request has completed and lets them go before that
    /// completion (or, unsignaled, a later request's) can be polled: a consumer seeing it owns
    /// the bytes again (`Bytes::try_into_mut` succeeds). `None` for most requests.
    pub unregistered: Option<bytes::Bytes>,
    /// Whether a successful completion is reported (errors always are). The memory of an
    /// unsignaled request is free once a later request of the queue pair has completed, on every
    /// provider (rdma-core signals some on siw to keep that promise, so a completion queue
    /// should have room for every request a queue pair may have posted, signaled or not).
    pub signaled: bool,
}

/// A receive-queue work request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecvWr {
    /// Caller's identifier, returned in the completion.
    pub wr_id: u64,
    /// Where an incoming Send is scattered.
    pub sg_list: SgList,
}

/// How a work request ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A local element was too short for the message.
    LocalLengthErr,
    /// A local key, right or bound was wrong.
    LocalProtErr,
    /// Flushed: the queue pair left the connected state before the request ran.
    WrFlushErr,
    /// The peer refused a remote access (bad STag, rights or bounds).
    RemoteAccessErr,
    /// The peer failed the operation (e.g. no receive posted, too many reads).
    RemoteOpErr,
    /// The peer's request was invalid (e.g. a Send-with-Invalidate of a key we do not own).
    RemoteInvalidRequestErr,
    /// The connection broke.
    FatalErr,
}

impl WcStatus {
    /// The status's name, for logs and errors.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Success => "success",
            Self::LocalLengthErr => "local length error",
            Self::LocalProtErr => "local protection error",
            Self::WrFlushErr => "flushed",
            Self::RemoteAccessErr => "remote access error",
            Self::RemoteOpErr => "remote operation error",
            Self::RemoteInvalidRequestErr => "remote invalid request",
            Self::FatalErr => "fatal error",
        }
    }
}

/// Which work request a completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// Any Send variant.
    Send,
    /// RDMA Write.
    RdmaWrite,
    /// RDMA Read.
    RdmaRead,
    /// A receive.
    Recv,
}

impl WcOpcode {
    /// The work request's name, for logs and errors.
    pub const fn name(self) -> &'static str {
        match self {
            Self::Send => "Send",
            Self::RdmaWrite => "RDMA Write",
            Self::RdmaRead => "RDMA Read",
            Self::Recv => "Receive",
        }
    }
}

/// A work completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Wc {
    /// The request's identifier.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// Kind of request.
    pub opcode: WcOpcode,
    /// Bytes received (receives) or moved.
    pub byte_len: u32,
    /// For receives of a Send with Invalidate: the local STag the peer invalidated.
    pub invalidated_rkey: Option<u32>,
    /// For receives: the Send carried the Solicited Event flag.
    pub solicited: bool,
}

/// Private data and RDMA Read resources of a connection (RDMA CM's conn_param).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConnParam {
    /// Consumer private data (≤ [`MAX_PRIVATE_DATA`]).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads this side accepts outstanding (IRD; CM's responder_resources).
    pub responder_resources: u8,
    /// RDMA Reads this side issues outstanding (ORD; CM's initiator_depth).
    pub initiator_depth: u8,
}

/// Most consumer private data a connection request or reply carries (iWARP toward Linux siw:
/// 256 bytes in all, 4 of them the RFC 6581 IRD/ORD block).
pub const MAX_PRIVATE_DATA: usize = 252;

/// Queue sizes of a queue pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth.
    pub max_recv_wr: u32,
    /// Scatter/gather elements per request.
    pub max_sge: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        Self { max_send_wr: 256, max_recv_wr: 256, max_sge: 4 }
    }
}

/// What an established connection negotiated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Established {
    /// The peer's private data (from its request or reply).
    pub private_data: Vec<u8>,
    /// Inbound reads accepted outstanding (IRD).
    pub ird: u8,
    /// Outbound reads issued outstanding (ORD).
    pub ord: u8,
    /// Peer address.
    pub peer: Option<SocketAddr>,
    /// What the transport negotiated, for logs (e.g. "MPA rev 2, CRC on, IRD 4, ORD 4").
    pub description: String,
}

/// Provider result.
pub type Result<T> = std::result::Result<T, Error>;

/// A boxed future, for waiting without naming the provider's future types.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A completion queue.
pub trait CompletionQueue: Send + Sync + fmt::Debug {
    /// Take up to `max` completions.
    fn poll(&self, max: usize) -> Vec<Wc>;
    /// Take up to `max` completions into `out` (appended; a poller reusing its vector allocates
    /// nothing per poll); returns how many. The default appends [`poll`](Self::poll)'s.
    fn poll_into(&self, max: usize, out: &mut Vec<Wc>) -> usize {
        let got = self.poll(max);
        let n = got.len();
        out.extend(got);
        n
    }
    /// Wait (blocking the thread) until a completion is available or `timeout` passed; true if
    /// one is.
    fn wait_blocking(&self, timeout: Duration) -> bool;
    /// A future that resolves once a completion is available.
    fn ready(&self) -> BoxFuture<'_, ()>;
}

/// A registered memory region. It owns its buffer; dropping it deregisters.
pub trait MemoryRegion: Send + Sync + fmt::Debug {
    /// Local key.
    fn lkey(&self) -> u32;
    /// Remote key (STag); the same value as the lkey on iWARP.
    fn rkey(&self) -> u32;
    /// Virtual address of the first byte (what peers use as tagged offset).
    fn addr(&self) -> u64;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Access rights.
    fn access(&self) -> Access;
    /// Run `f` on the contents.
    fn read(&self, f: &mut dyn FnMut(&[u8]));
    /// Run `f` on the contents, mutably.
    fn write(&self, f: &mut dyn FnMut(&mut [u8]));
    /// Revoke the STag: local and remote use fails until [`MemoryRegion::rekey`].
    fn invalidate(&self);
    /// A fresh key (the STag's low 8 bits change) and the region valid again; returns the new
    /// STag. Old keys no longer match.
    fn rekey(&self) -> Result<u32>;
    /// Whether the STag is currently valid.
    fn is_valid(&self) -> bool;
    /// Deregister and hand the buffer back (a copy for shared bytes), if this is the last
    /// handle (work requests that used the region have completed and dropped theirs); else the
    /// handle itself, untouched, so the caller can still copy the contents.
    fn into_buffer(self: Arc<Self>) -> std::result::Result<Vec<u8>, Arc<Self>>;
}

/// A protection domain: regions and queue pairs of one domain only work with each other.
pub trait ProtectionDomain: Send + Sync + fmt::Debug {
    /// The region type.
    type Mr: MemoryRegion + 'static;
    /// Register `buf` with `access` rights.
    fn register(&self, buf: Vec<u8>, access: Access) -> Result<Arc<Self::Mr>>;
    /// Register shared, immutable bytes (no copy) for local reads and, with
    /// [`Access::REMOTE_READ`], peer reads; write rights are refused. The region keeps the
    /// bytes alive until it is dropped.
    fn register_shared(&self, buf: bytes::Bytes, access: Access) -> Result<Arc<Self::Mr>>;
    /// Register `buf` for a peer to write into (a read's data), whatever it holds: every byte
    /// no peer's write placed reads as zero locally ([`MemoryRegion::read`],
    /// [`MemoryRegion::into_buffer`], a Send from the region), never as what the buffer held
    /// before. The default clears the buffer and registers it; the software RNIC clears only
    /// what the writes did not reach, when the region is first read locally (a pooled buffer
    /// then costs no memset per read).
    fn register_for_peer_writes(&self, mut buf: Vec<u8>, access: Access) -> Result<Arc<Self::Mr>> {
        buf.fill(0);
        self.register(buf, access)
    }
    /// Whether a region is the caller's buffer itself: `register` keeps the vector as the
    /// region's memory and [`MemoryRegion::into_buffer`] gives the same vector back, each at
    /// the cost of a table entry (the software RNIC). A consumer may then hand a received
    /// buffer on and register another rather than copy out of it. Default `false`: rdma-core's
    /// regions are chunks of slabs registered in advance, the bytes copied in and out.
    fn registers_in_place(&self) -> bool {
        false
    }
    /// Take back the buffer of `mr`, a region registered by
    /// [`register_for_peer_writes`](Self::register_for_peer_writes), and give it `buf` (of the
    /// same length) in its place, as that registration would: the region stays registered but
    /// is invalid (no access with its STag succeeds) until [`MemoryRegion::rekey`] gives it a
    /// new key. The buffer taken back is as [`MemoryRegion::into_buffer`] gives it (what no
    /// write placed reads as zero). A consumer that registers a buffer per read keeps its
    /// regions this way instead of registering and deregistering one each time.
    ///
    /// `Err(buf)` when it is not done: `mr` has another handle (a request or a placement still
    /// uses it), the lengths differ, the region is not one for peer writes, or the provider does
    /// not offer this (the default; the caller registers anew).
    fn swap_for_peer_writes(&self, mr: &Arc<Self::Mr>, buf: Vec<u8>) -> std::result::Result<Vec<u8>, Vec<u8>> {
        let _ = mr;
        Err(buf)
    }
}

/// A reliable-connected queue pair.
pub trait QueuePair: Send + Sync + fmt::Debug {
    /// Post a send-queue request.
    fn post_send(&self, wr: SendWr) -> Result<()>;
    /// Post several send-queue requests, in order, with one doorbell (as `ibv_post_send` with
    /// a chain of requests): a provider may transmit them together. The requests are taken out
    /// of `wrs`, which is empty on return whatever the outcome (its capacity kept, so a caller
    /// gathering requests reuses it). On an error the requests before the one that failed may
    /// have been posted (those after it are not). Default: one
    /// [`post_send`](Self::post_send) each.
    fn post_send_list(&self, wrs: &mut Vec<SendWr>) -> Result<()> {
        wrs.drain(..).try_for_each(|wr| self.post_send(wr))
    }
    /// The longest payload a request may carry as [`SendWr::unregistered`] bytes: unlimited on
    /// the software RNIC, which writes bytes to its stream as they are; 0 (none) by default —
    /// on rdma-core every payload is in registered memory.
    fn max_unregistered_payload(&self) -> u32 {
        0
    }
    /// Post a receive.
    fn post_recv(&self, wr: RecvWr) -> Result<()>;
    /// The consumer's receives are interchangeable (told apart by their `wr_id` alone, each
    /// large enough for any Send): an incoming Send may take any posted receive, not the oldest.
    /// A software provider then takes the one posted last, whose buffers were written and read
    /// last and are still in the CPU's caches; with many receives posted, taking the oldest
    /// walks through all of their memory. Default: nothing changes (receives are taken in the
    /// order posted, as verbs define it and hardware does).
    fn receives_interchangeable(&self) {}
    /// Close the connection: outstanding work is flushed ([`WcStatus::WrFlushErr`]).
    fn disconnect(&self);
    /// Whether the connection is up.
    fn is_connected(&self) -> bool;
    /// A future that resolves once the connection has ended (either side, or an error).
    fn disconnected(&self) -> BoxFuture<'_, ()>;
    /// Negotiated parameters once connected.
    fn established(&self) -> Option<Established>;
}

/// A connection request waiting for the consumer's decision.
pub trait ConnectionRequest: Send {
    /// The queue pair type.
    type Qp: QueuePair;
    /// The protection domain type.
    type Pd: ProtectionDomain;
    /// The completion queue type.
    type Cq: CompletionQueue;
    /// The requester's private data.
    fn private_data(&self) -> &[u8];
    /// The requester's IRD and ORD.
    fn ird_ord(&self) -> (u8, u8);
    /// The requester's address.
    fn peer(&self) -> SocketAddr;
    /// Create the queue pair the connection will use (post receives on it before accepting).
    fn create_qp(&mut self, pd: &Arc<Self::Pd>, send_cq: &Arc<Self::Cq>, recv_cq: &Arc<Self::Cq>, caps: QpCaps) -> Result<Arc<Self::Qp>>;
    /// Accept onto the queue pair from [`ConnectionRequest::create_qp`].
    fn accept(self, param: &ConnParam) -> Result<Arc<Self::Qp>>;
    /// Refuse, with private data for the requester.
    fn reject(self, private_data: &[u8]);
}

/// A passive endpoint.
pub trait Listener: Send + Sync {
    /// The request type.
    type Request: ConnectionRequest;
    /// Wait (blocking) for the next well-formed connection request.
    fn get_request(&self) -> Result<Self::Request>;
    /// The bound address.
    fn local_addr(&self) -> Result<SocketAddr>;
    /// Stop listening: new connection requests are refused, and a `get_request` waiting in
    /// another thread (or any later one) returns an error soon. The address is free once the
    /// listener is dropped.
    fn close(&self);
}

/// An RDMA provider (device).
pub trait Provider: Send + Sync + fmt::Debug {
    /// Protection domain type.
    type Pd: ProtectionDomain + 'static;
    /// Completion queue type.
    type Cq: CompletionQueue + 'static;
    /// Queue pair type.
    type Qp: QueuePair + 'static;
    /// Listener type.
    type Listener: Listener<Request = Self::Request> + 'static;
    /// Connection request type.
    type Request: ConnectionRequest<Qp = Self::Qp, Pd = Self::Pd, Cq = Self::Cq> + 'static;
    /// A short name ("soft-iwarp", "rdma-core:rxe0"...).
    fn name(&self) -> String;
    /// A new protection domain.
    fn alloc_pd(&self) -> Result<Arc<Self::Pd>>;
    /// A new completion queue of `depth` entries.
    fn create_cq(&self, depth: u32) -> Result<Arc<Self::Cq>>;
    /// Listen on `addr`.
    fn listen(&self, addr: SocketAddr) -> Result<Self::Listener>;
    /// Create an active-side queue pair for a connection to `dest` (the RDMA connection
    /// manager resolves the address and route here, so that the queue pair lives on the device
    /// the route leaves through; receives may be posted on it before [`Provider::connect`]).
    fn create_qp(
        &self,
        dest: SocketAddr,
        pd: &Arc<Self::Pd>,
        send_cq: &Arc<Self::Cq>,
        recv_cq: &Arc<Self::Cq>,
        caps: QpCaps,
    ) -> Result<Arc<Self::Qp>>;
    /// Connect `qp` to the address it was created for (blocking until established, rejected or
    /// timed out).
    fn connect(&self, qp: &Arc<Self::Qp>, param: &ConnParam) -> Result<Established>;
    /// Whether the peer may invalidate this provider's remotely accessible regions with Send
    /// with Invalidate. When it may not (keys that are plain registrations on devices that
    /// cannot invalidate them, or a pool with fixed keys), an iSER initiator says so in its
    /// connection private data and revokes its keys itself.
    fn remote_invalidation(&self) -> bool {
        true
    }
}
