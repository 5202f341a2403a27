//! The RDMA connection manager: event channels and ids, address and route resolution, each
//! connection's state and the event thread that follows it, and the active side's connect. The
//! passive side (listener, connection requests) is in `listener.rs`.

mod listener;

pub use listener::{RcListener, RcRequest};

use super::{Device, Ptr, Transport, errno, last_errno, lock, os_err, set_nonblocking, wait_readable};
use crate::{ConnParam, Error, Established, Invalid, NoDevice, Resolution, Result, Unreachable};
use rdma_mummy_sys as sys;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Retries of a lost packet, and of a receiver-not-ready NAK (7: forever, as Linux's isert; the
/// iSCSI window keeps the peer's receives posted).
const RETRY_COUNT: u8 = 7;
const RNR_RETRY_COUNT: u8 = 7;

/// A socket address as the C API wants it.
fn sockaddr(a: SocketAddr) -> libc::sockaddr_storage {
    // SAFETY: zeroed sockaddr_storage is valid; the family-specific view is written below.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sin = unsafe { &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr = libc::in_addr { s_addr: u32::from(*v4.ip()).to_be() };
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut ss as *mut libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_addr = libc::in6_addr { s6_addr: v6.ip().octets() };
            sin6.sin6_scope_id = v6.scope_id();
            sin6.sin6_flowinfo = v6.flowinfo();
        }
    }
    ss
}

/// The address at `p` (an AF_INET or AF_INET6 sockaddr), if any.
fn socket_addr(p: *const libc::sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: p points to a sockaddr whose family says which layout it has.
    unsafe {
        match i32::from((*p).sa_family) {
            libc::AF_INET => {
                let sin = &*p.cast::<libc::sockaddr_in>();
                Some(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)), u16::from_be(sin.sin_port))))
            }
            libc::AF_INET6 => {
                let s = &*p.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

fn event_name(e: sys::rdma_cm_event_type::Type) -> &'static str {
    use sys::rdma_cm_event_type as t;
    match e {
        t::RDMA_CM_EVENT_ADDR_RESOLVED => "address resolved",
        t::RDMA_CM_EVENT_ADDR_ERROR => "address resolution failed",
        t::RDMA_CM_EVENT_ROUTE_RESOLVED => "route resolved",
        t::RDMA_CM_EVENT_ROUTE_ERROR => "route resolution failed",
        t::RDMA_CM_EVENT_CONNECT_REQUEST => "connection request",
        t::RDMA_CM_EVENT_CONNECT_RESPONSE => "connection response",
        t::RDMA_CM_EVENT_CONNECT_ERROR => "connection error",
        t::RDMA_CM_EVENT_UNREACHABLE => "peer unreachable",
        t::RDMA_CM_EVENT_REJECTED => "rejected",
        t::RDMA_CM_EVENT_ESTABLISHED => "established",
        t::RDMA_CM_EVENT_DISCONNECTED => "disconnected",
        t::RDMA_CM_EVENT_DEVICE_REMOVAL => "device removed",
        t::RDMA_CM_EVENT_TIMEWAIT_EXIT => "time-wait exit",
        t::RDMA_CM_EVENT_ADDR_CHANGE => "address changed",
        _ => "other event",
    }
}

/// An event channel with non-blocking reads.
struct Channel(Ptr<sys::rdma_event_channel>);

impl Channel {
    fn new() -> Result<Self> {
        // SAFETY: no arguments; NULL (errno set) on failure.
        let ch = unsafe { sys::rdma_create_event_channel() };
        if ch.is_null() {
            return Err(os_err("rdma_create_event_channel"));
        }
        let me = Self(Ptr(ch));
        set_nonblocking(me.fd())?;
        Ok(me)
    }
    fn fd(&self) -> RawFd {
        // SAFETY: the channel is valid while self lives.
        unsafe { (*self.0.0).fd }
    }
    /// One event if there is one (the caller acknowledges it).
    fn next(&self) -> Option<*mut sys::rdma_cm_event> {
        let mut ev = std::ptr::null_mut();
        // SAFETY: the fd is non-blocking; ev is a valid out-pointer.
        (unsafe { sys::rdma_get_cm_event(self.0.0, &mut ev) } == 0).then_some(ev)
    }
    /// Wait for `want` on `id` for at most `timeout` (the `what` resolution toward `dest`);
    /// other events of `id` are errors.
    fn expect(
        &self,
        id: *mut sys::rdma_cm_id,
        want: sys::rdma_cm_event_type::Type,
        timeout: Duration,
        what: Resolution,
        dest: SocketAddr,
    ) -> Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            while let Some(ev) = self.next() {
                // SAFETY: a valid event until acknowledged below.
                let (kind, status, eid) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
                // SAFETY: acknowledged once.
                unsafe { sys::rdma_ack_cm_event(ev) };
                if eid != id {
                    continue;
                }
                if kind == want {
                    return Ok(());
                }
                return Err(Error::Unreachable(Unreachable::ResolveEvent { what, dest, event: event_name(kind), status }));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Unreachable(Unreachable::ResolveTimeout { what, dest, timeout }));
            }
            wait_readable(&[self.fd()], Some(left));
        }
    }
}

impl Drop for Channel {
    fn drop(&mut self) {
        // SAFETY: every id on the channel was destroyed before (ids are dropped first).
        unsafe { sys::rdma_destroy_event_channel(self.0.0) };
    }
}

/// An id on a channel of its own (destroyed with it).
struct Id {
    id: Ptr<sys::rdma_cm_id>,
    channel: Channel,
}

impl Id {
    fn new() -> Result<Self> {
        let channel = Channel::new()?;
        let mut id = std::ptr::null_mut();
        // SAFETY: a valid channel and out-pointer; no context.
        let rc = unsafe { sys::rdma_create_id(channel.0.0, &mut id, std::ptr::null_mut(), sys::rdma_port_space::RDMA_PS_TCP) };
        if rc != 0 {
            return Err(os_err("rdma_create_id"));
        }
        Ok(Self { id: Ptr(id), channel })
    }
    fn verbs(&self) -> *mut sys::ibv_context {
        // SAFETY: the id is valid while self lives.
        unsafe { (*self.id.0).verbs }
    }
    fn resolve_addr(&self, dest: SocketAddr, timeout: Duration) -> Result<()> {
        let mut ss = sockaddr(dest);
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: the id is valid; ss holds a valid sockaddr for dest's family.
        let rc = unsafe { sys::rdma_resolve_addr(self.id.0, std::ptr::null_mut(), (&mut ss as *mut libc::sockaddr_storage).cast(), ms) };
        if rc != 0 {
            return Err(Error::Unreachable(Unreachable::ResolveCall { call: "rdma_resolve_addr", dest, errno: last_errno() }));
        }
        self.channel.expect(self.id.0, sys::rdma_cm_event_type::RDMA_CM_EVENT_ADDR_RESOLVED, timeout, Resolution::Address, dest)
    }
}

impl Drop for Id {
    fn drop(&mut self) {
        // SAFETY: the id's QP (if any) was destroyed before; events are all acknowledged.
        unsafe { sys::rdma_destroy_id(self.id.0) };
    }
}

/// The device context an id bound to `ip` lands on.
pub(super) fn device_of_local_address(ip: IpAddr) -> Result<*mut sys::ibv_context> {
    let id = Id::new()?;
    let mut ss = sockaddr(SocketAddr::new(ip, 0));
    // SAFETY: the id is valid; ss a valid sockaddr.
    let rc = unsafe { sys::rdma_bind_addr(id.id.0, (&mut ss as *mut libc::sockaddr_storage).cast()) };
    if rc != 0 || id.verbs().is_null() {
        return Err(Error::NoDevice(if rc != 0 {
            NoDevice::AddressNotLocal { ip, errno: Some(last_errno()) }
        } else {
            NoDevice::WildcardAddress(ip)
        }));
    }
    Ok(id.verbs())
}

/// The device context the route to `dest` leaves through.
pub(super) fn device_toward(dest: SocketAddr, timeout: Duration) -> Result<*mut sys::ibv_context> {
    let id = Id::new()?;
    id.resolve_addr(dest, timeout).map_err(|e| match e {
        Error::Unreachable(reason) => Error::NoDevice(NoDevice::NoRoute { dest, reason }),
        e => e,
    })?;
    Ok(id.verbs())
}

/// Where a connection stands.
#[derive(Clone, Debug)]
enum State {
    /// Created (resolved, or requested), not yet asked to connect.
    Idle,
    Connecting,
    Connected(Established),
    Ended(Unreachable),
    Rejected(Vec<u8>),
}

/// One connection's id and event channel, and the thread that handles its events.
pub(super) struct CmConn {
    dev: Arc<Device>,
    id: Id,
    state: Mutex<State>,
    changed: Condvar,
    ended: tokio::sync::Notify,
    /// What the connection negotiated, known before ESTABLISHED on the passive side.
    passive: Mutex<Option<Established>>,
    /// Our side of an active connection: (IRD, ORD) asked for.
    asked: Mutex<(u8, u8)>,
    disconnect_called: AtomicBool,
    wake: OwnedFd,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl std::fmt::Debug for CmConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmConn").field("state", &*lock(&self.state)).finish_non_exhaustive()
    }
}

fn eventfd() -> Result<OwnedFd> {
    // SAFETY: plain syscall; a new descriptor or -1.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(Error::Io(errno()));
    }
    // SAFETY: fd is a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

impl CmConn {
    fn new(dev: &Arc<Device>, id: Id) -> Result<Arc<Self>> {
        Ok(Arc::new(Self {
            dev: dev.clone(),
            id,
            state: Mutex::new(State::Idle),
            changed: Condvar::new(),
            ended: tokio::sync::Notify::new(),
            passive: Mutex::new(None),
            asked: Mutex::new((0, 0)),
            disconnect_called: AtomicBool::new(false),
            wake: eventfd()?,
            thread: Mutex::new(None),
        }))
    }

    /// Active side: an id whose address and route to `dest` are resolved, on `dev`.
    pub(super) fn resolve(dev: &Arc<Device>, dest: SocketAddr) -> Result<Arc<Self>> {
        let timeout = dev.config.setup_timeout;
        let id = Id::new()?;
        id.resolve_addr(dest, timeout)?;
        if id.verbs() != dev.ctx.0 {
            return Err(Error::Invalid(Invalid::RouteThroughOtherDevice { dest, device: dev.name.clone() }));
        }
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: a valid id with a resolved address.
        if unsafe { sys::rdma_resolve_route(id.id.0, ms) } != 0 {
            return Err(Error::Unreachable(Unreachable::ResolveCall { call: "rdma_resolve_route", dest, errno: last_errno() }));
        }
        id.channel.expect(id.id.0, sys::rdma_cm_event_type::RDMA_CM_EVENT_ROUTE_RESOLVED, timeout, Resolution::Route, dest)?;
        Self::new(dev, id)
    }

    pub(super) fn id(&self) -> *mut sys::rdma_cm_id {
        self.id.id.0
    }

    pub(super) fn context(&self) -> *mut sys::ibv_context {
        self.id.verbs()
    }

    pub(super) fn qp(&self) -> *mut sys::ibv_qp {
        // SAFETY: the id is valid while self lives.
        unsafe { (*self.id.id.0).qp }
    }

    fn set(&self, s: State) {
        let ended = matches!(s, State::Ended(_) | State::Rejected(_));
        *lock(&self.state) = s;
        self.changed.notify_all();
        if ended {
            self.ended.notify_waiters();
        }
    }

    pub(super) fn ended(&self) -> bool {
        matches!(*lock(&self.state), State::Ended(_) | State::Rejected(_))
    }

    pub(super) fn connected(&self) -> bool {
        matches!(*lock(&self.state), State::Connected(_))
    }

    pub(super) fn established(&self) -> Option<Established> {
        match &*lock(&self.state) {
            State::Connected(e) => Some(e.clone()),
            _ => None,
        }
    }

    pub(super) async fn wait_ended(&self) {
        loop {
            let n = self.ended.notified();
            tokio::pin!(n);
            n.as_mut().enable();
            if self.ended() {
                return;
            }
            n.await;
        }
    }

    /// End the connection on a provider-detected error (the queue pair is in error already).
    pub(super) fn fail(&self, why: Unreachable) {
        self.end(why);
    }

    pub(super) fn disconnect(&self) {
        self.end(Unreachable::DisconnectedLocally);
    }

    /// The connection is over, for `why` (kept if it ended before): say so, then disconnect.
    fn end(&self, why: Unreachable) {
        let mut st = lock(&self.state);
        if !matches!(*st, State::Ended(_) | State::Rejected(_)) {
            *st = State::Ended(why);
            drop(st);
            self.changed.notify_all();
            self.ended.notify_waiters();
        } else {
            drop(st);
        }
        if !self.disconnect_called.swap(true, Ordering::AcqRel) {
            // SAFETY: a valid id; on InfiniBand/RoCE this moves the QP to the error state, so
            // outstanding work is flushed; on iWARP it starts the close.
            unsafe { sys::rdma_disconnect(self.id.id.0) };
        }
    }

    fn description(&self, ird: u8, ord: u8) -> String {
        let t = match self.dev.transport {
            Transport::Iwarp => "iWARP",
            Transport::InfiniBand if self.dev.rxe => "RoCE (soft-RoCE)",
            Transport::InfiniBand => "InfiniBand/RoCE",
        };
        format!("rdma-core {} ({t}), IRD {ird}, ORD {ord}, keys {:?}", self.dev.name, self.dev.keys)
    }

    fn start_thread(self: &Arc<Self>) -> Result<()> {
        let me = self.clone();
        let t = std::thread::Builder::new().name("rdma-cm".into()).spawn(move || me.event_loop())?;
        *lock(&self.thread) = Some(t);
        Ok(())
    }

    /// Stop the event thread (the queue pair is gone).
    pub(super) fn stop(&self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.wake.as_raw_fd(), one.as_ptr().cast(), 8) };
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
    }

    fn event_loop(self: Arc<Self>) {
        loop {
            let r = wait_readable(&[self.id.channel.fd(), self.wake.as_raw_fd()], None);
            if r.get(1).copied().unwrap_or(true) {
                return;
            }
            while let Some(ev) = self.id.channel.next() {
                self.handle(ev);
            }
        }
    }

    fn handle(&self, ev: *mut sys::rdma_cm_event) {
        use sys::rdma_cm_event_type as t;
        // SAFETY: a valid event until acknowledged at the end; the connection parameters are
        // what the event type says they are; private data is copied before the ack.
        let (kind, status, pd, rr) = unsafe {
            let conn = (*ev).param.conn;
            let pd = if conn.private_data.is_null() {
                Vec::new()
            } else {
                std::slice::from_raw_parts(conn.private_data.cast::<u8>(), usize::from(conn.private_data_len)).to_vec()
            };
            ((*ev).event, (*ev).status, pd, conn.responder_resources)
        };
        // SAFETY: acknowledged once, after everything needed was copied.
        unsafe { sys::rdma_ack_cm_event(ev) };
        match kind {
            t::RDMA_CM_EVENT_ESTABLISHED => {
                let est = lock(&self.passive).clone().unwrap_or_else(|| {
                    let (ird, ord) = *lock(&self.asked);
                    // The reply's responder resources are the peer's IRD, which caps our ORD.
                    let ord = if rr > 0 { ord.min(rr) } else { ord };
                    // SAFETY: the id is valid; its route holds the peer's address.
                    let peer = socket_addr(unsafe { sys::rdma_get_peer_addr(&*self.id.id.0) });
                    Established { private_data: pd, ird, ord, peer, description: self.description(ird, ord) }
                });
                self.set(State::Connected(est));
            }
            t::RDMA_CM_EVENT_REJECTED => self.set(State::Rejected(pd)),
            t::RDMA_CM_EVENT_UNREACHABLE | t::RDMA_CM_EVENT_CONNECT_ERROR | t::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                self.end(Unreachable::ConnectionEvent { event: event_name(kind), status });
            }
            // Our half too: on InfiniBand/RoCE this moves the QP to error, so everything
            // outstanding is flushed to the consumer.
            t::RDMA_CM_EVENT_DISCONNECTED => self.end(Unreachable::DisconnectedByPeer),
            _ => {}
        }
    }

    /// Wait until the connection is up, or ended, or `timeout` passed.
    fn wait_up(&self, timeout: Duration) -> Result<Established> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.state);
        loop {
            match &*st {
                State::Connected(e) => return Ok(e.clone()),
                State::Rejected(pd) => return Err(Error::Rejected { private_data: pd.clone() }),
                State::Ended(why) => return Err(Error::Unreachable(why.clone())),
                _ => {}
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                drop(st);
                let why = Unreachable::NotEstablished { timeout };
                self.end(why.clone());
                return Err(Error::Unreachable(why));
            }
            st = self.changed.wait_timeout(st, left).unwrap_or_else(|e| e.into_inner()).0;
        }
    }

    fn conn_param(&self, param: &ConnParam, peer_ird: Option<u8>) -> Result<(sys::rdma_conn_param, u8, u8)> {
        let a = &self.dev.attr;
        if param.private_data.len() > usize::from(u8::MAX) {
            return Err(Error::Invalid(Invalid::PrivateDataTooLong { len: param.private_data.len(), max: usize::from(u8::MAX) }));
        }
        let ird = param.responder_resources.min(a.max_qp_rd_atom.clamp(0, 255) as u8);
        let mut ord = param.initiator_depth.min(a.max_qp_init_rd_atom.clamp(0, 255) as u8);
        if let Some(p) = peer_ird {
            ord = ord.min(p);
        }
        // SAFETY: zeroed plain data; the fields are set below.
        let mut cp: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
        cp.private_data = if param.private_data.is_empty() { std::ptr::null() } else { param.private_data.as_ptr().cast() };
        cp.private_data_len = param.private_data.len() as u8;
        cp.responder_resources = ird;
        cp.initiator_depth = ord;
        cp.retry_count = RETRY_COUNT;
        cp.rnr_retry_count = RNR_RETRY_COUNT;
        Ok((cp, ird, ord))
    }

    /// Active side: connect (the queue pair exists, receives are posted).
    pub(super) fn connect(self: &Arc<Self>, param: &ConnParam, dest: Option<SocketAddr>) -> Result<Established> {
        if dest.is_none() {
            return Err(Error::Invalid(Invalid::NotActiveSide));
        }
        if !matches!(*lock(&self.state), State::Idle) {
            return Err(Error::Invalid(Invalid::AlreadyConnected));
        }
        let (mut cp, ird, ord) = self.conn_param(param, None)?;
        *lock(&self.asked) = (ird, ord);
        self.set(State::Connecting);
        self.start_thread()?;
        // SAFETY: a route-resolved id with its QP; cp and its private data live across the
        // call (librdmacm copies them).
        if unsafe { sys::rdma_connect(self.id.id.0, &mut cp) } != 0 {
            let n = last_errno();
            self.set(State::Ended(Unreachable::ConnectCall { call: "rdma_connect", errno: n }));
            let e = n.to_io_error();
            return Err(Error::Io(std::io::Error::new(e.kind(), format!("rdma_connect: {e}"))));
        }
        self.wait_up(self.dev.config.setup_timeout)
    }

    /// Passive side: accept (the queue pair exists, receives are posted).
    pub(super) fn accept(self: &Arc<Self>, param: &ConnParam, peer_ird: u8, peer: SocketAddr, private_data: Vec<u8>) -> Result<()> {
        if !matches!(*lock(&self.state), State::Idle) {
            return Err(Error::Invalid(Invalid::RequestAnswered));
        }
        let (mut cp, ird, ord) = self.conn_param(param, Some(peer_ird))?;
        *lock(&self.passive) = Some(Established { private_data, ird, ord, peer: Some(peer), description: self.description(ird, ord) });
        self.set(State::Connecting);
        self.start_thread()?;
        // SAFETY: a connection request id with its QP; cp lives across the call.
        if unsafe { sys::rdma_accept(self.id.id.0, &mut cp) } != 0 {
            let n = last_errno();
            self.set(State::Ended(Unreachable::ConnectCall { call: "rdma_accept", errno: n }));
            let e = n.to_io_error();
            return Err(Error::Io(std::io::Error::new(e.kind(), format!("rdma_accept: {e}"))));
        }
        self.wait_up(self.dev.config.setup_timeout).map(|_| ())
    }

    fn reject(&self, private_data: &[u8]) {
        let n = private_data.len().min(usize::from(u8::MAX));
        // SAFETY: a connection request id; the data lives across the call.
        unsafe { sys::rdma_reject(self.id.id.0, private_data.as_ptr().cast(), n as u8) };
        self.set(State::Ended(Unreachable::RejectedLocally));
    }
}

impl Drop for CmConn {
    fn drop(&mut self) {
        // The event thread holds an Arc: it has ended when this runs. The id (then its channel)
        // is destroyed by `Id`'s drop, after its QP (destroyed by `RcQp`'s drop).
        if let Some(t) = self.thread.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            drop(t);
        }
    }
}
