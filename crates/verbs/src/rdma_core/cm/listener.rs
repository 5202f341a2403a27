//! The passive side of the connection manager: a listening id, and the connection requests it
//! takes (each on a channel and event thread of its own once taken).

use super::{Channel, CmConn, Id, State, sockaddr, socket_addr};
use crate::rdma_core::mem::RcPd;
use crate::rdma_core::queue::RcQp;
use crate::rdma_core::{Device, Ptr, RcCq, Transport, errno, lock, os_err, wait_readable};
use crate::{ConnParam, ConnectionRequest, Error, Invalid, Listener, QpCaps, Result};
use rdma_mummy_sys as sys;
use std::net::SocketAddr;
use std::sync::Arc;

/// Connection requests queued by the kernel before the listener takes them.
const BACKLOG: i32 = 128;

/// A listening endpoint.
pub struct RcListener {
    dev: Arc<Device>,
    id: Id,
    addr: SocketAddr,
    /// [`Listener::close`] was called: `get_request` returns an error.
    closed: std::sync::atomic::AtomicBool,
}

/// How often a waiting `get_request` looks whether the listener was closed.
const CLOSE_CHECK: std::time::Duration = std::time::Duration::from_millis(200);

impl std::fmt::Debug for RcListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcListener").field("device", &self.dev.name).field("addr", &self.addr).finish()
    }
}

impl RcListener {
    pub(in crate::rdma_core) fn new(dev: &Arc<Device>, addr: SocketAddr) -> Result<Self> {
        let id = Id::new()?;
        let mut ss = sockaddr(addr);
        // SAFETY: the id is valid; ss a valid sockaddr.
        if unsafe { sys::rdma_bind_addr(id.id.0, (&mut ss as *mut libc::sockaddr_storage).cast()) } != 0 {
            let e = errno();
            let hint = match e.raw_os_error() {
                Some(libc::EADDRINUSE) if dev.transport == Transport::Iwarp => {
                    " (on iWARP an RDMA CM listen is a kernel TCP listen: is a TCP portal on the same address and port?)"
                }
                Some(libc::EADDRINUSE) => " (another RDMA CM listener has it)",
                Some(libc::EADDRNOTAVAIL) | Some(libc::ENODEV) => " (no RDMA device has this address)",
                _ => "",
            };
            return Err(Error::Io(std::io::Error::new(e.kind(), format!("rdma_bind_addr({addr}): {e}{hint}"))));
        }
        let ctx = id.verbs();
        if !ctx.is_null() && ctx != dev.ctx.0 {
            return Err(Error::Invalid(Invalid::AddressOnOtherDevice { addr, device: dev.name.clone() }));
        }
        // SAFETY: a bound id.
        if unsafe { sys::rdma_listen(id.id.0, BACKLOG) } != 0 {
            let e = errno();
            let hint = if e.raw_os_error() == Some(libc::EADDRINUSE) && dev.transport == Transport::Iwarp {
                " (on iWARP an RDMA CM listen is a kernel TCP listen: is a TCP portal on the same address and port?)"
            } else {
                ""
            };
            return Err(Error::Io(std::io::Error::new(e.kind(), format!("rdma_listen({addr}): {e}{hint}"))));
        }
        // SAFETY: the id is bound; its route holds the local address.
        let bound = socket_addr(unsafe { sys::rdma_get_local_addr(&*id.id.0) }).unwrap_or(addr);
        Ok(Self { dev: dev.clone(), id, addr: bound, closed: std::sync::atomic::AtomicBool::new(false) })
    }
}

impl Listener for RcListener {
    type Request = RcRequest;

    fn get_request(&self) -> Result<RcRequest> {
        use sys::rdma_cm_event_type as t;
        loop {
            wait_readable(&[self.id.channel.fd()], Some(CLOSE_CHECK));
            if self.closed.load(std::sync::atomic::Ordering::Acquire) {
                return Err(Error::Io(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "the listener was closed")));
            }
            while let Some(ev) = self.id.channel.next() {
                // SAFETY: a valid event until acknowledged; for a connection request the
                // connection parameters are valid and the id is the new connection's.
                let (kind, child, pd, rr, idp) = unsafe {
                    let conn = (*ev).param.conn;
                    let pd = if conn.private_data.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(conn.private_data.cast::<u8>(), usize::from(conn.private_data_len)).to_vec()
                    };
                    ((*ev).event, (*ev).id, pd, conn.responder_resources, conn.initiator_depth)
                };
                // SAFETY: acknowledged once, after the copies above.
                unsafe { sys::rdma_ack_cm_event(ev) };
                if kind != t::RDMA_CM_EVENT_CONNECT_REQUEST {
                    continue;
                }
                match self.request(child, pd, rr, idp) {
                    Ok(r) => return Ok(r),
                    Err(_) => continue,
                }
            }
        }
    }

    fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.addr)
    }

    fn close(&self) {
        // Requests that come meanwhile stay queued until the listener (its id) is dropped, which
        // rejects them.
        self.closed.store(true, std::sync::atomic::Ordering::Release);
    }
}

impl RcListener {
    fn request(&self, child: *mut sys::rdma_cm_id, private_data: Vec<u8>, ird: u8, ord: u8) -> Result<RcRequest> {
        // The request's id gets a channel of its own (its later events go there, to its
        // connection's thread).
        let channel = match Channel::new() {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: the request id is ours to refuse and destroy.
                unsafe {
                    sys::rdma_reject(child, std::ptr::null(), 0);
                    sys::rdma_destroy_id(child);
                }
                return Err(e);
            }
        };
        // SAFETY: the request's event was acknowledged; the channel is valid.
        if unsafe { sys::rdma_migrate_id(child, channel.0.0) } != 0 {
            // SAFETY: as above.
            unsafe {
                sys::rdma_reject(child, std::ptr::null(), 0);
                sys::rdma_destroy_id(child);
            }
            return Err(os_err("rdma_migrate_id"));
        }
        let id = Id { id: Ptr(child), channel };
        // SAFETY: the request id's route holds the peer's address.
        let peer = socket_addr(unsafe { sys::rdma_get_peer_addr(&*child) }).unwrap_or(SocketAddr::from(([0, 0, 0, 0], 0)));
        if id.verbs() != self.dev.ctx.0 {
            // SAFETY: a request id; refused (then destroyed with `id`).
            unsafe { sys::rdma_reject(child, std::ptr::null(), 0) };
            return Err(Error::Invalid(Invalid::RequestOnOtherDevice { peer, device: self.dev.name.clone() }));
        }
        let conn = CmConn::new(&self.dev, id)?;
        Ok(RcRequest { dev: self.dev.clone(), conn: Some(conn), private_data, ird, ord, peer, qp: None })
    }
}

/// A connection request waiting for accept or reject.
pub struct RcRequest {
    dev: Arc<Device>,
    conn: Option<Arc<CmConn>>,
    private_data: Vec<u8>,
    ird: u8,
    ord: u8,
    peer: SocketAddr,
    qp: Option<Arc<RcQp>>,
}

impl std::fmt::Debug for RcRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcRequest").field("peer", &self.peer).field("ird", &self.ird).field("ord", &self.ord).finish_non_exhaustive()
    }
}

impl ConnectionRequest for RcRequest {
    type Qp = RcQp;
    type Pd = RcPd;
    type Cq = RcCq;

    fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    fn ird_ord(&self) -> (u8, u8) {
        (self.ird, self.ord)
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn create_qp(&mut self, pd: &Arc<RcPd>, send_cq: &Arc<RcCq>, recv_cq: &Arc<RcCq>, caps: QpCaps) -> Result<Arc<RcQp>> {
        let conn = self.conn.clone().ok_or(Error::NotConnected)?;
        let qp = RcQp::create(&self.dev, conn, pd, send_cq, recv_cq, caps, None)?;
        self.qp = Some(qp.clone());
        Ok(qp)
    }

    fn accept(mut self, param: &ConnParam) -> Result<Arc<RcQp>> {
        let qp = self.qp.take().ok_or(Error::Invalid(Invalid::AcceptBeforeCreateQp))?;
        self.conn = None;
        qp.accept(param, self.ird, self.peer, std::mem::take(&mut self.private_data))?;
        Ok(qp)
    }

    fn reject(mut self, private_data: &[u8]) {
        if let Some(c) = self.conn.take() {
            c.reject(private_data);
        }
    }
}

impl Drop for RcRequest {
    fn drop(&mut self) {
        // Neither accepted nor rejected: refuse, so the peer is not left waiting.
        if let Some(c) = self.conn.take()
            && matches!(*lock(&c.state), State::Idle)
        {
            c.reject(&[]);
        }
    }
}
