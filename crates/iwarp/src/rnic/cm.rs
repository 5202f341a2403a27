//! Connection setup: the MPA request/reply exchange (RFC 5044 §7, RFC 6581) on both sides, the
//! listener with its acceptor and handshake threads, and the deadlines that bound them.

use super::qp::{QpState, SoftQp};
use super::{MAX_IRD_ORD, RnicShared, SoftCq, SoftPd, lock};
use crate::wire::{
    IrdOrd, MPA_FLAG_CRC, MPA_FLAG_ENHANCED, MPA_FLAG_MARKERS, MPA_FLAG_REJECT, MPA_HEADER_LEN, MPA_MAX_PRIVATE_DATA, MpaFrame, WireError,
};
use riser_verbs::{
    ConnParam, ConnectionRequest, Error, Established, Invalid, Listener, MAX_PRIVATE_DATA, QpCaps, Result, SetupError, Unreachable,
};
use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tracing::{debug, warn};

fn setup_err(e: io::Error) -> Error {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Error::Unreachable(Unreachable::MpaTimeout),
        _ => Error::Io(e),
    }
}

/// A malformed MPA header or IRD/ORD block.
fn mpa_err(e: WireError) -> Error {
    Error::Setup(match e {
        WireError::BadKey => SetupError::BadMpaKey,
        WireError::BadRevision(rev) => SetupError::MpaRevision(rev),
        WireError::PrivateDataTooLong(len) => SetupError::MpaPrivateDataTooLong { len, max: MPA_MAX_PRIVATE_DATA },
        WireError::MissingIrdOrd => SetupError::MpaMissingIrdOrd,
        // Not returned by the header and private data parsers.
        _ => SetupError::MalformedMpa,
    })
}

/// The time left until `deadline`, or a timeout error once it passed.
fn left(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() { Err(io::ErrorKind::TimedOut.into()) } else { Ok(left) }
}

/// Fill `buf` by `deadline`: one deadline for the whole exchange, not a timeout per read that
/// a peer sending a byte at a time could renew for ever.
fn read_exact_by(stream: &mut TcpStream, mut buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    while !buf.is_empty() {
        stream.set_read_timeout(Some(left(deadline)?))?;
        match stream.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_frame(stream: &mut TcpStream, deadline: Instant) -> Result<MpaFrame> {
    let mut h = [0u8; MPA_HEADER_LEN];
    read_exact_by(stream, &mut h, deadline).map_err(setup_err)?;
    let (reply, flags, rev, pd_len) = MpaFrame::parse_header(&h).map_err(mpa_err)?;
    let mut pd = vec![0u8; pd_len];
    read_exact_by(stream, &mut pd, deadline).map_err(setup_err)?;
    MpaFrame::with_private_data(reply, flags, rev, &pd).map_err(mpa_err)
}

fn describe(rev: u8, crc: bool, ird: u8, ord: u8, p2p: bool) -> String {
    let crc = if crc { "on" } else { "off" };
    let p2p = if p2p { ", peer-to-peer (zero-length Write RTR)" } else { "" };
    format!("MPA rev {rev}, CRC {crc}, markers off, IRD {ird}, ORD {ord}{p2p}")
}

fn clamp(v: u16) -> u8 {
    v.min(u16::from(MAX_IRD_ORD)) as u8
}

/// A connection request read from a new TCP connection.
#[derive(Debug)]
pub struct SoftRequest {
    rnic: Arc<RnicShared>,
    stream: TcpStream,
    frame: MpaFrame,
    peer: SocketAddr,
    qp: Option<Arc<SoftQp>>,
}

/// Read the MPA request of a new connection by `deadline` (refusing what this RNIC cannot
/// serve).
pub(super) fn read_request(rnic: &Arc<RnicShared>, mut stream: TcpStream, deadline: Instant) -> Result<SoftRequest> {
    stream.set_nodelay(true)?;
    let peer = stream.peer_addr()?;
    let frame = read_frame(&mut stream, deadline)?;
    let mut refuse = |why: SetupError| {
        // The reject fits any fresh socket's buffer; the timeout only guards the deadline.
        let _ = left(deadline).and_then(|t| stream.set_write_timeout(Some(t)));
        // A protocol reject: R set, no consumer data.
        let reply = MpaFrame {
            reply: true,
            flags: MPA_FLAG_REJECT,
            rev: frame.rev.max(1),
            ird_ord: frame.ird_ord.map(|_| IrdOrd::default()),
            private_data: vec![],
        };
        let _ = stream.write_all(&reply.emit());
        Err(Error::Setup(why))
    };
    if frame.reply {
        return refuse(SetupError::ReplyInsteadOfRequest);
    }
    if frame.markers() {
        return refuse(SetupError::MarkersRequested);
    }
    Ok(SoftRequest { rnic: rnic.clone(), stream, frame, peer, qp: None })
}

impl ConnectionRequest for SoftRequest {
    type Qp = SoftQp;
    type Pd = SoftPd;
    type Cq = SoftCq;

    fn private_data(&self) -> &[u8] {
        &self.frame.private_data
    }

    fn ird_ord(&self) -> (u8, u8) {
        self.frame.ird_ord.map(|io| (clamp(io.ird), clamp(io.ord))).unwrap_or((1, 1))
    }

    fn peer(&self) -> SocketAddr {
        self.peer
    }

    fn create_qp(&mut self, pd: &Arc<SoftPd>, send_cq: &Arc<SoftCq>, recv_cq: &Arc<SoftCq>, caps: QpCaps) -> Result<Arc<SoftQp>> {
        let qp = SoftQp::new(&self.rnic, pd, send_cq, recv_cq, caps)?;
        self.qp = Some(qp.clone());
        Ok(qp)
    }

    fn accept(mut self, param: &ConnParam) -> Result<Arc<SoftQp>> {
        let qp = self.qp.take().ok_or(Error::Invalid(Invalid::AcceptBeforeCreateQp))?;
        if param.private_data.len() > MAX_PRIVATE_DATA {
            return Err(Error::Invalid(Invalid::PrivateDataTooLong { len: param.private_data.len(), max: MAX_PRIVATE_DATA }));
        }
        let (peer_ird, peer_ord) = self.ird_ord();
        // Our ORD may not exceed the requester's IRD; our IRD covers what it will issue.
        let ord = param.initiator_depth.min(peer_ird);
        let ird = param.responder_resources.max(peer_ord).min(MAX_IRD_ORD);
        let crc = self.frame.crc() || self.rnic.config.crc;
        let ird_ord = self.frame.ird_ord.map(|req| {
            let (write_rtr, read_rtr) =
                if req.p2p { if req.write_rtr || !req.read_rtr { (true, false) } else { (false, true) } } else { (false, false) };
            IrdOrd { ird: u16::from(ird), ord: u16::from(ord), p2p: req.p2p, write_rtr, read_rtr }
        });
        let flags = (self.frame.flags & !(MPA_FLAG_REJECT | MPA_FLAG_MARKERS | MPA_FLAG_ENHANCED)) | if crc { MPA_FLAG_CRC } else { 0 };
        let reply = MpaFrame { reply: true, flags, rev: self.frame.rev, ird_ord, private_data: param.private_data.clone() };
        let est = Established {
            private_data: self.frame.private_data.clone(),
            ird,
            ord,
            peer: Some(self.peer),
            description: describe(self.frame.rev, crc, ird, ord, ird_ord.is_some_and(|io| io.p2p)),
        };
        // The reply goes out on the blocking socket, then the engines start (the socket turns
        // non-blocking); an FPDU arriving meanwhile waits in the socket. The transmitter holds
        // back until the initiator's first FPDU arrived.
        self.stream.write_all(&reply.emit())?;
        if let Err(e) = qp.start(self.stream.try_clone()?, crc, true, est, false) {
            let _ = self.stream.shutdown(Shutdown::Both);
            return Err(e);
        }
        Ok(qp)
    }

    fn reject(mut self, private_data: &[u8]) {
        let reply = MpaFrame {
            reply: true,
            flags: MPA_FLAG_REJECT,
            rev: self.frame.rev.max(1),
            ird_ord: self.frame.ird_ord.map(|_| IrdOrd::default()),
            private_data: private_data[..private_data.len().min(MAX_PRIVATE_DATA)].to_vec(),
        };
        let _ = self.stream.write_all(&reply.emit());
        let _ = self.stream.shutdown(Shutdown::Both);
    }
}

/// A listening endpoint. A thread of its own accepts connections and hands each to a
/// handshake thread that reads its MPA request (by one deadline, see
/// [`RnicConfig::setup_timeout`](crate::RnicConfig::setup_timeout)); [`Listener::get_request`]
/// takes the requests read, in the order they completed. So a client that connects and sends
/// nothing, or a byte at a time, delays nobody else; at most
/// [`RnicConfig::max_handshakes`](crate::RnicConfig::max_handshakes) are in progress at once.
#[derive(Debug)]
pub struct SoftListener {
    local: SocketAddr,
    listener: Arc<TcpListener>,
    handshakes: Arc<Handshakes>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

impl SoftListener {
    /// Listen on `addr`, [`Provider::listen`](riser_verbs::Provider::listen) of
    /// [`SoftRnic`](super::SoftRnic): bind, and start the acceptor.
    pub(super) fn bind(rnic: &Arc<RnicShared>, addr: SocketAddr) -> Result<Self> {
        let listener = Arc::new(TcpListener::bind(addr)?);
        let local = listener.local_addr()?;
        let handshakes = Arc::new(Handshakes::default());
        let (rnic, l, hs) = (rnic.clone(), listener.clone(), handshakes.clone());
        let acceptor =
            std::thread::Builder::new().name("iwarp-listen".into()).spawn(move || accept_loop(&rnic, &l, &hs)).map_err(Error::Io)?;
        Ok(Self { local, listener, handshakes, acceptor: Some(acceptor) })
    }
}

/// The requests of a listener, read and being read.
#[derive(Debug, Default)]
struct Handshakes {
    state: Mutex<HandshakeState>,
    /// Signals every change of `state` (a slot freed, a request ready, the end).
    cv: Condvar,
}

#[derive(Debug, Default)]
struct HandshakeState {
    /// Requests read, waiting for `get_request`.
    ready: VecDeque<SoftRequest>,
    /// Handshakes in progress, by number: their connections, to end them with the listener.
    running: HashMap<u64, TcpStream>,
    next: u64,
    /// The listener was dropped.
    closed: bool,
    /// The listening socket failed for good: what `get_request` reports.
    failed: Option<(io::ErrorKind, String)>,
}

/// Stack of a handshake thread: it reads at most a few hundred bytes.
const HANDSHAKE_STACK: usize = 256 << 10;

/// Pause after an accept error that may pass (out of descriptors or memory), so the acceptor
/// does not spin while it lasts.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// Accept connections while there is room for their handshakes.
fn accept_loop(rnic: &Arc<RnicShared>, listener: &TcpListener, hs: &Arc<Handshakes>) {
    let max = rnic.config.max_handshakes.max(1);
    loop {
        {
            let st = lock(&hs.state);
            let st = hs.cv.wait_while(st, |st| !st.closed && st.running.len() + st.ready.len() >= max).unwrap_or_else(|e| e.into_inner());
            if st.closed {
                return;
            }
        }
        let (stream, peer) = match listener.accept() {
            Ok(a) => a,
            Err(_) if lock(&hs.state).closed => return,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EBADF | libc::EINVAL | libc::ENOTSOCK | libc::EOPNOTSUPP)) => {
                warn!("iwarp: the listening socket failed: {e}");
                lock(&hs.state).failed = Some((e.kind(), e.to_string()));
                hs.cv.notify_all();
                return;
            }
            Err(e) => {
                // A connection that was reset before its accept, or a shortage that may pass.
                debug!("iwarp: accept: {e}");
                if e.kind() != io::ErrorKind::ConnectionAborted {
                    std::thread::sleep(ACCEPT_BACKOFF);
                }
                continue;
            }
        };
        let deadline = Instant::now() + rnic.config.handshake_time();
        let watch = match stream.try_clone() {
            Ok(w) => w,
            Err(e) => {
                debug!(%peer, "iwarp: connection dropped: {e}");
                continue;
            }
        };
        let id = {
            let mut st = lock(&hs.state);
            let id = st.next;
            st.next += 1;
            st.running.insert(id, watch);
            id
        };
        let (r, h) = (rnic.clone(), hs.clone());
        let spawned = std::thread::Builder::new().name("iwarp-mpa".into()).stack_size(HANDSHAKE_STACK).spawn(move || {
            let result = read_request(&r, stream, deadline);
            let unclaimed = {
                let mut st = lock(&h.state);
                st.running.remove(&id);
                match result {
                    Ok(req) if !st.closed => {
                        st.ready.push_back(req);
                        None
                    }
                    // The listener is gone: dropping the request closes its connection.
                    Ok(req) => Some(req),
                    Err(e) => {
                        debug!(%peer, "iwarp: connection request dropped: {e}");
                        None
                    }
                }
            };
            h.cv.notify_all();
            drop(unclaimed);
        });
        if let Err(e) = spawned {
            // The stream went with the closure: the connection is closed.
            warn!(%peer, "iwarp: no thread for an MPA handshake ({e}): connection dropped");
            lock(&hs.state).running.remove(&id);
            hs.cv.notify_all();
        }
    }
}

impl Listener for SoftListener {
    type Request = SoftRequest;

    fn get_request(&self) -> Result<SoftRequest> {
        let st = lock(&self.handshakes.state);
        let mut st = self
            .handshakes
            .cv
            .wait_while(st, |st| st.ready.is_empty() && st.failed.is_none() && !st.closed)
            .unwrap_or_else(|e| e.into_inner());
        if st.closed {
            return Err(Error::Io(io::Error::new(io::ErrorKind::ConnectionAborted, "the listener was closed")));
        }
        if let Some(req) = st.ready.pop_front() {
            drop(st);
            // A slot is free.
            self.handshakes.cv.notify_all();
            return Ok(req);
        }
        let (kind, what) = st.failed.clone().unwrap_or((io::ErrorKind::Other, "listener failed".into()));
        Err(Error::Io(io::Error::new(kind, what)))
    }

    fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.local)
    }

    fn close(&self) {
        self.stop();
    }
}

impl SoftListener {
    /// Stop accepting: the handshakes in progress and the requests nobody took end, the
    /// acceptor wakes from accept() and returns, `get_request` reports the listener closed.
    fn stop(&self) {
        let unclaimed = {
            let mut st = lock(&self.handshakes.state);
            st.closed = true;
            // Handshakes in progress end at once (their reads fail) and find the listener closed.
            for s in st.running.values() {
                let _ = s.shutdown(Shutdown::Both);
            }
            std::mem::take(&mut st.ready)
        };
        self.handshakes.cv.notify_all();
        // Requests nobody will take: their connections close.
        drop(unclaimed);
        // Shutting a listening socket down wakes the acceptor from accept().
        let _ = socket2::SockRef::from(&*self.listener).shutdown(Shutdown::Both);
    }
}

impl Drop for SoftListener {
    fn drop(&mut self) {
        self.stop();
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

/// The active side's connection setup, [`Provider::connect`](riser_verbs::Provider::connect)
/// of [`SoftRnic`](super::SoftRnic): TCP connect, send the MPA request, read and check the
/// reply, start the engines.
pub(super) fn connect(rnic: &RnicShared, qp: &Arc<SoftQp>, param: &ConnParam) -> Result<Established> {
    let addr = lock(&qp.s.dest).ok_or(Error::Invalid(Invalid::NotActiveSide))?;
    if param.private_data.len() > MAX_PRIVATE_DATA {
        return Err(Error::Invalid(Invalid::PrivateDataTooLong { len: param.private_data.len(), max: MAX_PRIVATE_DATA }));
    }
    if qp.s.state() != QpState::Idle {
        return Err(Error::Invalid(Invalid::AlreadyConnected));
    }
    let cfg = &rnic.config;
    let mut stream = TcpStream::connect_timeout(&addr, cfg.setup_timeout).map_err(|e| match e.kind() {
        io::ErrorKind::TimedOut => Error::Unreachable(Unreachable::TcpConnectTimeout(addr)),
        _ => Error::Io(e),
    })?;
    stream.set_nodelay(true)?;
    let deadline = Instant::now() + cfg.setup_timeout;
    let enhanced = cfg.mpa_rev >= 2;
    let request = MpaFrame {
        reply: false,
        flags: if cfg.crc { MPA_FLAG_CRC } else { 0 },
        rev: if enhanced { 2 } else { 1 },
        ird_ord: enhanced.then_some(IrdOrd {
            ird: u16::from(param.responder_resources.min(MAX_IRD_ORD)),
            ord: u16::from(param.initiator_depth.min(MAX_IRD_ORD)),
            p2p: cfg.p2p,
            write_rtr: cfg.p2p,
            read_rtr: false,
        }),
        private_data: param.private_data.clone(),
    };
    stream.write_all(&request.emit())?;
    let reply = read_frame(&mut stream, deadline)?;
    if !reply.reply {
        return Err(Error::Setup(SetupError::RequestInsteadOfReply));
    }
    if reply.rejected() {
        return Err(Error::Rejected { private_data: reply.private_data });
    }
    if reply.markers() {
        return Err(Error::Setup(SetupError::MarkersRequested));
    }
    if enhanced && reply.ird_ord.is_none() {
        return Err(Error::Setup(SetupError::ReplyWithoutIrdOrd));
    }
    let (ird, ord) = match reply.ird_ord {
        Some(io) => (param.responder_resources.max(clamp(io.ord)).min(MAX_IRD_ORD), param.initiator_depth.min(clamp(io.ird))),
        None => (param.responder_resources, param.initiator_depth),
    };
    let rtr_write = reply.ird_ord.is_some_and(|io| io.p2p && io.write_rtr) && cfg.p2p;
    if reply.ird_ord.is_some_and(|io| io.p2p && !io.write_rtr) && cfg.p2p {
        return Err(Error::Setup(SetupError::UnofferedRtr));
    }
    let est = Established {
        private_data: reply.private_data.clone(),
        ird,
        ord,
        peer: Some(addr),
        description: describe(reply.rev, reply.crc(), ird, ord, rtr_write),
    };
    qp.start(stream, reply.crc(), false, est.clone(), rtr_write)?;
    Ok(est)
}
