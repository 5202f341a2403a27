//! Provider errors: one [`Error`] whose variants carry structured reasons, so that callers and
//! tests can tell the cases apart without reading messages.

use crate::WcStatus;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Provider errors.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// No RDMA device (or provider library) is available.
    #[error("no RDMA device: {0}")]
    NoDevice(NoDevice),
    /// The peer refused the connection; its private data is attached.
    #[error("connection rejected by the peer ({} bytes of private data)", private_data.len())]
    Rejected {
        /// The peer's reject private data.
        private_data: Vec<u8>,
    },
    /// The peer did not answer in time, or the connection ended before it was established.
    #[error("peer unreachable or not answering: {0}")]
    Unreachable(Unreachable),
    /// The connection setup broke the protocol.
    #[error("connection setup failed: {0}")]
    Setup(SetupError),
    /// An argument is out of range (queue full, too many elements, private data too long...).
    #[error("invalid argument: {0}")]
    Invalid(Invalid),
    /// A key that names no region of this protection domain.
    #[error("unknown key {0:#010x}")]
    UnknownKey(u32),
    /// Memory registration failed.
    #[error("memory registration failed: {0}")]
    Registration(RegistrationError),
    /// The queue pair is not connected.
    #[error("queue pair not connected")]
    NotConnected,
    /// Socket / device I/O.
    #[error(transparent)]
    Io(#[from] std::io::Error),
}

// Conversions from the reasons (not `#[from]`: the reason is part of the message, not a source).
macro_rules! from_reason {
    ($($reason:ident => $variant:ident),* $(,)?) => {$(
        impl From<$reason> for Error {
            fn from(why: $reason) -> Self {
                Self::$variant(why)
            }
        }
    )*};
}

from_reason!(NoDevice => NoDevice, Unreachable => Unreachable, SetupError => Setup, Invalid => Invalid, RegistrationError => Registration);

/// An OS error number, as rdma-core's calls leave it in `errno` (or return it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// The same error as an [`std::io::Error`].
    pub fn to_io_error(self) -> std::io::Error {
        std::io::Error::from_raw_os_error(self.0)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.to_io_error().fmt(f)
    }
}

/// Why no RDMA device is available ([`Error::NoDevice`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NoDevice {
    /// An RDMA connection manager call failed in a way that means rdma-core (or the kernel's
    /// RDMA support) is missing.
    #[error("{call}: {errno} (rdma-core missing, or no RDMA device: see `rdma link show`)")]
    Unavailable {
        /// The failed call.
        call: &'static str,
        /// Its error.
        errno: Errno,
    },
    /// rdma-core lists no device at all (`errno` when the listing itself failed).
    #[error(
        "rdma-core lists no RDMA device ({}); on Linux: `rdma link show`, or create one with `rdma link add rxe0 type rxe netdev ETH` (soft-RoCE) or `... type siw ...` (soft-iWARP)",
        match errno { Some(e) => e.to_string(), None => "none found".into() }
    )]
    NoneListed {
        /// The listing's error, if it failed rather than found nothing.
        errno: Option<Errno>,
    },
    /// No listed device is the one asked for.
    #[error("no such RDMA device (have: {})", available.join(", "))]
    NotFound {
        /// The devices there are.
        available: Vec<String>,
    },
    /// No device has the local address `ip` (`errno`: why binding to it failed, if it did).
    #[error("no RDMA device has the address {ip}{}", match errno { Some(e) => format!(" ({e})"), None => String::new() })]
    AddressNotLocal {
        /// The address.
        ip: IpAddr,
        /// The bind's error.
        errno: Option<Errno>,
    },
    /// A wildcard address was given where a device's address is needed.
    #[error("no RDMA device has the address {0} (a wildcard address names no device)")]
    WildcardAddress(IpAddr),
    /// The address of `dest` does not resolve to any device.
    #[error("no RDMA device reaches {dest}: {reason}")]
    NoRoute {
        /// The destination.
        dest: SocketAddr,
        /// What the resolution answered.
        reason: Unreachable,
    },
}

/// A resolution step of the RDMA connection manager.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Resolution {
    /// Address resolution (`rdma_resolve_addr`).
    Address,
    /// Route resolution (`rdma_resolve_route`).
    Route,
}

impl fmt::Display for Resolution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Address => "address",
            Self::Route => "route",
        })
    }
}

/// Why the peer could not be reached, or a connection ended before it was established
/// ([`Error::Unreachable`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Unreachable {
    /// The TCP connection to the peer was not made in time (iWARP).
    #[error("{0}: TCP connect timed out")]
    TcpConnectTimeout(SocketAddr),
    /// The MPA request/reply exchange did not finish by its deadline (iWARP).
    #[error("MPA exchange not complete in time")]
    MpaTimeout,
    /// A resolution call failed at once.
    #[error("{call}({dest}): {errno}")]
    ResolveCall {
        /// The call.
        call: &'static str,
        /// The destination.
        dest: SocketAddr,
        /// Its error.
        errno: Errno,
    },
    /// A resolution ended with another connection manager event than success.
    #[error("{what} resolution toward {dest}: {event} (status {status})")]
    ResolveEvent {
        /// Address or route.
        what: Resolution,
        /// The destination.
        dest: SocketAddr,
        /// The event's name.
        event: &'static str,
        /// The event's status.
        status: i32,
    },
    /// A resolution got no answer in time.
    #[error("{what} resolution toward {dest}: no answer within {timeout:?}")]
    ResolveTimeout {
        /// Address or route.
        what: Resolution,
        /// The destination.
        dest: SocketAddr,
        /// The time allowed.
        timeout: Duration,
    },
    /// The connection manager reported the connection failed (unreachable, connection error,
    /// device removal).
    #[error("{event} (status {status})")]
    ConnectionEvent {
        /// The event's name.
        event: &'static str,
        /// The event's status.
        status: i32,
    },
    /// The connection was not established in time.
    #[error("connection not established within {timeout:?}")]
    NotEstablished {
        /// The time allowed.
        timeout: Duration,
    },
    /// The call that starts connecting or accepting failed.
    #[error("{call}: {errno}")]
    ConnectCall {
        /// The call.
        call: &'static str,
        /// Its error.
        errno: Errno,
    },
    /// The peer disconnected.
    #[error("disconnected by the peer")]
    DisconnectedByPeer,
    /// We disconnected.
    #[error("disconnected locally")]
    DisconnectedLocally,
    /// We rejected the connection request.
    #[error("rejected locally")]
    RejectedLocally,
    /// Binding a memory window failed, which breaks the connection.
    #[error("memory window bind failed ({status:?}, vendor error {vendor_err:#x})")]
    WindowBindFailed {
        /// The bind's completion status.
        status: WcStatus,
        /// The device's own error code.
        vendor_err: u32,
    },
    /// Invalidating a memory window failed, which breaks the connection.
    #[error("memory window invalidation failed ({status:?}, vendor error {vendor_err:#x})")]
    WindowInvalidationFailed {
        /// The invalidation's completion status.
        status: WcStatus,
        /// The device's own error code.
        vendor_err: u32,
    },
}

/// How the peer broke the connection setup protocol ([`Error::Setup`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SetupError {
    /// Not an MPA request or reply key.
    #[error("bad MPA frame key")]
    BadMpaKey,
    /// An MPA revision above 2.
    #[error("unsupported MPA revision {0}")]
    MpaRevision(u8),
    /// MPA private data longer than allowed.
    #[error("MPA private data of {len} bytes (at most {max})")]
    MpaPrivateDataTooLong {
        /// The length announced.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// An enhanced MPA frame without room for its IRD/ORD block.
    #[error("enhanced MPA frame without its IRD/ORD block")]
    MpaMissingIrdOrd,
    /// An MPA frame the wire layer refused for another reason.
    #[error("malformed MPA frame")]
    MalformedMpa,
    /// An MPA reply where a request belongs (passive side).
    #[error("an MPA Reply where a Request belongs")]
    ReplyInsteadOfRequest,
    /// The peer answered our MPA request with a request.
    #[error("the peer answered with an MPA Request")]
    RequestInsteadOfReply,
    /// The peer wants MPA markers, which are not supported.
    #[error("the peer wants MPA markers (not supported)")]
    MarkersRequested,
    /// Our enhanced MPA request was answered without IRD/ORD.
    #[error("enhanced MPA request answered without IRD/ORD")]
    ReplyWithoutIrdOrd,
    /// The peer chose a ready-to-receive message we did not offer.
    #[error("the peer chose a ready-to-receive message we did not offer")]
    UnofferedRtr,
}

/// Which argument is out of range ([`Error::Invalid`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Invalid {
    /// An object (protection domain, completion queue) of another device.
    #[error("{0} of another device")]
    ForeignObject(&'static str),
    /// The connection is on another device than the provider's.
    #[error("the connection is on another RDMA device than {device}")]
    ConnectionOnOtherDevice {
        /// The provider's device.
        device: String,
    },
    /// A listening address of another device than the provider's.
    #[error("{addr} belongs to another RDMA device than {device}")]
    AddressOnOtherDevice {
        /// The address.
        addr: SocketAddr,
        /// The provider's device.
        device: String,
    },
    /// A connection request that arrived on another device than the listener's.
    #[error("connection request from {peer} on another device than {device}")]
    RequestOnOtherDevice {
        /// The requester.
        peer: SocketAddr,
        /// The listener's device.
        device: String,
    },
    /// The route to the destination leaves through another device than the provider's.
    #[error("the route to {dest} leaves through another RDMA device than {device}")]
    RouteThroughOtherDevice {
        /// The destination.
        dest: SocketAddr,
        /// The provider's device.
        device: String,
    },
    /// More scatter/gather elements than the queue pair takes.
    #[error("{got} scatter/gather elements (at most {max})")]
    TooManySge {
        /// Elements in the request.
        got: usize,
        /// The queue pair's limit.
        max: usize,
    },
    /// A request's unregistered payload ([`SendWr::unregistered`](crate::SendWr::unregistered))
    /// that the queue pair does not take: longer than its
    /// [`max_unregistered_payload`](crate::QueuePair::max_unregistered_payload), beside a
    /// gather list, or on an RDMA Read.
    #[error("an unregistered payload of {len} bytes is not taken here (at most {max}, with no gather list, and not on an RDMA Read)")]
    UnregisteredPayload {
        /// The payload's length.
        len: usize,
        /// The queue pair's limit.
        max: u32,
    },
    /// An RDMA Read with other than one sink element.
    #[error("an RDMA Read takes exactly one sink element, not {got}")]
    ReadSinkCount {
        /// Elements in the request.
        got: usize,
    },
    /// An RDMA Read into more elements than the device places per read.
    #[error("RDMA Read into {got} elements: {device} places at most {max} per read")]
    TooManyReadSge {
        /// Elements in the request.
        got: usize,
        /// The device's limit.
        max: usize,
        /// The device.
        device: String,
    },
    /// The send queue holds as many requests as it has room for (the transmitter has not yet
    /// sent them: the peer reads slowly or not at all).
    #[error("send queue full ({depth} requests outstanding)")]
    SendQueueFull {
        /// The send queue's depth.
        depth: u32,
    },
    /// Every receive the queue pair holds is posted.
    #[error("receive queue full ({depth} receives posted)")]
    ReceiveQueueFull {
        /// The receive queue's depth.
        depth: u32,
    },
    /// `accept` before the request's queue pair was created.
    #[error("accept before create_qp")]
    AcceptBeforeCreateQp,
    /// Connection private data longer than the transport carries.
    #[error("{len} bytes of private data (at most {max})")]
    PrivateDataTooLong {
        /// The length given.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// `connect` on a queue pair not created for an active connection.
    #[error("queue pair not created for an active connection")]
    NotActiveSide,
    /// `connect` on a queue pair already connecting or connected.
    #[error("queue pair already connecting or connected")]
    AlreadyConnected,
    /// A connection request answered twice.
    #[error("connection request already answered")]
    RequestAnswered,
    /// Remote memory registered (memory windows) before the connection's queue pair exists.
    #[error("memory windows are bound on a queue pair: create the connection's queue pair first")]
    NoQueuePairForWindows,
    /// Memory windows with a protection domain shared by several queue pairs.
    #[error("memory windows need one queue pair per protection domain (one domain per connection)")]
    WindowsNeedOneQpPerPd,
    /// An empty buffer to register.
    #[error("cannot register an empty buffer")]
    EmptyBuffer,
    /// Rekeying a region of a fixed-key pool.
    #[error("a fixed-key pool region cannot be rekeyed (KeyMode::FixedPool)")]
    FixedKeyRekey,
    /// Rekeying a region whose memory window was revoked.
    #[error("a region whose window is revoked cannot be rekeyed; register anew")]
    RevokedWindowRekey,
    /// Memory windows asked for on a device that cannot bind type 2 windows.
    #[error("{device} cannot bind type 2 memory windows")]
    NoMemoryWindows {
        /// The device.
        device: String,
    },
}

/// Why memory registration failed ([`Error::Registration`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegistrationError {
    /// Shared (read-only) bytes registered with write rights.
    #[error("shared (read-only) memory cannot be registered for writing")]
    SharedWritable,
    /// Every STag index is in use.
    #[error("no free STag index")]
    NoFreeStag,
    /// `ibv_reg_mr` failed; with `memlock_kib` when a finite `RLIMIT_MEMLOCK` is the likely
    /// cause.
    #[error(
        "ibv_reg_mr of {len} bytes: {errno}{}",
        match memlock_kib {
            Some(kib) => format!(" — RLIMIT_MEMLOCK is {kib} KiB: registered memory counts against it (siw checks it even for root); raise it with `ulimit -l unlimited`"),
            None => String::new(),
        }
    )]
    RegMr {
        /// Bytes to register.
        len: usize,
        /// The error.
        errno: Errno,
        /// The soft `RLIMIT_MEMLOCK` in KiB, when the error may be that limit's.
        memlock_kib: Option<u64>,
    },
    /// The connection's registered pools reached `RdmaCoreConfig::pool_limit`.
    #[error("the connection's registered pools are full ({} MiB registered; RdmaCoreConfig::pool_limit)", registered >> 20)]
    PoolsFull {
        /// Bytes registered.
        registered: usize,
    },
    /// `ibv_alloc_mw` failed.
    #[error("ibv_alloc_mw: {errno}")]
    AllocMw {
        /// The error.
        errno: Errno,
    },
}
