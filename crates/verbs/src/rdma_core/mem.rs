//! Protection domains, pools and memory regions.

use super::queue::RcQp;
use super::{Device, KeyMode, Ptr, Transport, errno, last_errno, lock};
use crate::{Access, Error, Invalid, MemoryRegion, ProtectionDomain, RegistrationError, Result};
use rdma_mummy_sys as sys;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Regions smaller than this that need no remote key are copied into the connection's local pool
/// (one registration for all); larger ones are registered where they lie (no copy).
const IN_PLACE_MIN: usize = 64 << 10;
/// Growth step of the local pool (receive and send buffers).
const LOCAL_SLAB: usize = 4 << 20;
/// Growth step of the remote pool (memory windows or fixed keys).
const REMOTE_SLAB: usize = 16 << 20;
/// Chunks are aligned to this.
const ALIGN: usize = 64;

fn ibv_access(a: Access) -> i32 {
    let mut f = 0u32;
    if a.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE) {
        // Verbs requires local write with remote write.
        f |= sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if a.contains(Access::REMOTE_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if a.contains(Access::REMOTE_READ) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    f as i32
}

/// `ibv_reg_mr`, with the error a user can act on.
fn reg_mr(pd: *mut sys::ibv_pd, addr: *mut u8, len: usize, access: i32) -> Result<*mut sys::ibv_mr> {
    // SAFETY: pd is an allocated protection domain; [addr, addr + len) is memory the caller
    // keeps alive (and does not move) until it deregisters the region.
    let mr = unsafe { sys::ibv_reg_mr(pd, addr.cast(), len, access) };
    if !mr.is_null() {
        return Ok(mr);
    }
    let errno = last_errno();
    let mut memlock_kib = None;
    if matches!(errno.0, libc::ENOMEM | libc::EFAULT | libc::EPERM) {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        // SAFETY: a valid out-pointer.
        if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut lim) } == 0 && lim.rlim_cur != libc::RLIM_INFINITY {
            memlock_kib = Some(lim.rlim_cur / 1024);
        }
    }
    Err(Error::Registration(RegistrationError::RegMr { len, errno, memlock_kib }))
}

/// Memory registered once, handed out in chunks.
struct Slab {
    mem: Box<[u8]>,
    mr: Ptr<sys::ibv_mr>,
    /// Free ranges (offset, length), sorted by offset, never adjacent.
    free: Vec<(usize, usize)>,
}

/// A pool of slabs of one kind of access.
struct Pool {
    access: i32,
    step: usize,
    slabs: Vec<Slab>,
}

impl Pool {
    fn new(access: i32, step: usize) -> Self {
        Self { access, step, slabs: Vec::new() }
    }

    fn registered(&self) -> usize {
        self.slabs.iter().map(|s| s.mem.len()).sum()
    }

    /// A chunk of `len` bytes: (slab, offset, rounded length).
    fn take(&mut self, pd: *mut sys::ibv_pd, len: usize, budget: usize) -> Result<(usize, usize, usize)> {
        let len = len.max(1).div_ceil(ALIGN) * ALIGN;
        for (i, s) in self.slabs.iter_mut().enumerate() {
            if let Some(j) = s.free.iter().position(|&(_, l)| l >= len) {
                let (off, l) = s.free[j];
                if l == len {
                    s.free.remove(j);
                } else {
                    s.free[j] = (off + len, l - len);
                }
                return Ok((i, off, len));
            }
        }
        let size = len.max(self.step).div_ceil(4096) * 4096;
        if budget < size {
            return Err(Error::Registration(RegistrationError::PoolsFull { registered: self.registered() }));
        }
        // Touched before registration: registering never-touched memory costs 5-20x more.
        let mut mem = vec![0u8; size].into_boxed_slice();
        mem.iter_mut().step_by(4096).for_each(|b| *b = 0);
        let mr = reg_mr(pd, mem.as_mut_ptr(), size, self.access)?;
        let free = if len < size { vec![(len, size - len)] } else { Vec::new() };
        self.slabs.push(Slab { mem, mr: Ptr(mr), free });
        Ok((self.slabs.len() - 1, 0, len))
    }

    fn give(&mut self, slab: usize, off: usize, len: usize) {
        let Some(s) = self.slabs.get_mut(slab) else { return };
        let at = s.free.partition_point(|&(o, _)| o < off);
        s.free.insert(at, (off, len));
        // Coalesce with the neighbours.
        if at + 1 < s.free.len() && s.free[at].0 + s.free[at].1 == s.free[at + 1].0 {
            s.free[at].1 += s.free[at + 1].1;
            s.free.remove(at + 1);
        }
        if at > 0 && s.free[at - 1].0 + s.free[at - 1].1 == s.free[at].0 {
            s.free[at - 1].1 += s.free[at].1;
            s.free.remove(at);
        }
    }

    fn release_all(&mut self) {
        for s in self.slabs.drain(..) {
            // SAFETY: registered by `take`; no chunk of it is in use (chunks hold the PD).
            unsafe { sys::ibv_dereg_mr(s.mr.0) };
        }
    }
}

/// Which pool a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PoolKind {
    Local,
    Remote,
}

/// A protection domain (one per connection in riser's iSER), with its pools.
pub struct RcPd {
    pub(super) inner: Arc<PdInner>,
}

impl std::fmt::Debug for RcPd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcPd").field("device", &self.inner.dev.name).finish_non_exhaustive()
    }
}

/// What a protection domain's regions and queue pairs hold on to.
pub(super) struct PdInner {
    dev: Arc<Device>,
    pd: Ptr<sys::ibv_pd>,
    local: Mutex<Pool>,
    remote: Mutex<Pool>,
    /// Memory windows not bound, for reuse.
    spare_windows: Mutex<Vec<Ptr<sys::ibv_mw>>>,
    /// The queue pair memory windows are bound on (the domain's one connection).
    qp: Mutex<(Weak<RcQp>, usize)>,
}

impl RcPd {
    pub(super) fn new(dev: &Arc<Device>) -> Result<Arc<Self>> {
        // SAFETY: the device's context is open while `dev` lives.
        let pd = unsafe { sys::ibv_alloc_pd(dev.ctx.0) };
        if pd.is_null() {
            return Err(Error::Io(std::io::Error::new(errno().kind(), format!("ibv_alloc_pd: {}", errno()))));
        }
        let remote_access = match dev.keys {
            KeyMode::FixedPool => ibv_access(Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE),
            // Windows grant the remote rights; the pool itself has none a peer could use.
            _ => ibv_access(Access::LOCAL_WRITE) | sys::ibv_access_flags::IBV_ACCESS_MW_BIND.0 as i32,
        };
        Ok(Arc::new(Self {
            inner: Arc::new(PdInner {
                dev: dev.clone(),
                pd: Ptr(pd),
                local: Mutex::new(Pool::new(ibv_access(Access::LOCAL_WRITE), LOCAL_SLAB)),
                remote: Mutex::new(Pool::new(remote_access, REMOTE_SLAB)),
                spare_windows: Mutex::new(Vec::new()),
                qp: Mutex::new((Weak::new(), 0)),
            }),
        }))
    }
}

impl PdInner {
    pub(super) fn raw(&self) -> *mut sys::ibv_pd {
        self.pd.0
    }

    pub(super) fn device(&self) -> &Arc<Device> {
        &self.dev
    }

    /// A queue pair was created in this domain.
    pub(super) fn attach(&self, qp: &Arc<RcQp>) {
        let mut q = lock(&self.qp);
        q.0 = Arc::downgrade(qp);
        q.1 += 1;
    }

    fn budget(&self) -> usize {
        let used = lock(&self.local).registered() + lock(&self.remote).registered();
        self.dev.config.pool_limit.saturating_sub(used)
    }

    fn chunk(self: &Arc<Self>, kind: PoolKind, len: usize) -> Result<Chunk> {
        let budget = self.budget();
        let mut pool = lock(match kind {
            PoolKind::Local => &self.local,
            PoolKind::Remote => &self.remote,
        });
        let (slab, off, rounded) = pool.take(self.pd.0, len, budget)?;
        let s = &mut pool.slabs[slab];
        // SAFETY: off + rounded <= the slab's length (the free list only holds ranges inside it).
        let ptr = unsafe { s.mem.as_mut_ptr().add(off) };
        // SAFETY: the slab's region is registered until the PD is dropped, which this chunk's
        // Arc prevents.
        let (lkey, rkey) = unsafe { ((*s.mr.0).lkey, (*s.mr.0).rkey) };
        Ok(Chunk { pd: self.clone(), kind, slab, off, len, rounded, ptr: Ptr(ptr), mr: s.mr, lkey, rkey })
    }

    fn window(&self) -> Result<Ptr<sys::ibv_mw>> {
        if let Some(w) = lock(&self.spare_windows).pop() {
            return Ok(w);
        }
        // SAFETY: the PD is allocated; ibv_alloc_mw returns NULL (errno set) when it cannot.
        let mw = unsafe { sys::ibv_alloc_mw(self.pd.0, sys::ibv_mw_type::IBV_MW_TYPE_2) };
        if mw.is_null() {
            return Err(Error::Registration(RegistrationError::AllocMw { errno: last_errno() }));
        }
        Ok(Ptr(mw))
    }

    /// A window no longer bound (invalidated locally or by the peer, or never bound).
    pub(super) fn spare_window(&self, mw: Ptr<sys::ibv_mw>) {
        lock(&self.spare_windows).push(mw);
    }

    fn bind_qp(&self) -> Result<Arc<RcQp>> {
        let q = lock(&self.qp);
        match (q.0.upgrade(), q.1) {
            (Some(qp), 1) => Ok(qp),
            (_, 0) | (None, _) => Err(Error::Invalid(Invalid::NoQueuePairForWindows)),
            _ => Err(Error::Invalid(Invalid::WindowsNeedOneQpPerPd)),
        }
    }

    fn register_any(self: &Arc<Self>, mem: Storage, access: Access) -> Result<Arc<RcMr>> {
        let len = mem.len();
        if len == 0 {
            return Err(Error::Invalid(Invalid::EmptyBuffer));
        }
        let remote = access.intersects(Access::REMOTE_READ | Access::REMOTE_WRITE);
        let iwarp_sink = access.contains(Access::READ_SINK) && self.dev.transport == Transport::Iwarp;
        if iwarp_sink {
            // An iWARP Read Response is a tagged write to the sink's STag (RFC 5040): the sink
            // needs remote write rights, on a registration of its own, dropped with the region.
            let rights = (access - Access::READ_SINK) | Access::LOCAL_WRITE | Access::REMOTE_WRITE;
            return RcMr::in_place(self, mem, rights, access);
        }
        let access = if access.contains(Access::READ_SINK) { (access - Access::READ_SINK) | Access::LOCAL_WRITE } else { access };
        if !remote {
            if len < IN_PLACE_MIN {
                return RcMr::pooled(self, PoolKind::Local, mem, access, None);
            }
            return RcMr::in_place(self, mem, access, access);
        }
        match self.dev.keys {
            KeyMode::PerRegion | KeyMode::Auto => RcMr::in_place(self, mem, access, access),
            KeyMode::FixedPool => RcMr::pooled(self, PoolKind::Remote, mem, access, None),
            KeyMode::MemoryWindows => {
                let qp = self.bind_qp()?;
                RcMr::pooled(self, PoolKind::Remote, mem, access, Some(qp))
            }
        }
    }
}

impl Drop for PdInner {
    fn drop(&mut self) {
        for w in lock(&self.spare_windows).drain(..) {
            // SAFETY: an allocated, unbound window of this PD, not used after this.
            unsafe { sys::ibv_dealloc_mw(w.0) };
        }
        lock(&self.local).release_all();
        lock(&self.remote).release_all();
        // SAFETY: every region, window and queue pair of this PD holds an Arc of it, so none is
        // left; the pools were deregistered above.
        unsafe { sys::ibv_dealloc_pd(self.pd.0) };
    }
}

impl ProtectionDomain for RcPd {
    type Mr = RcMr;

    fn register(&self, buf: Vec<u8>, access: Access) -> Result<Arc<RcMr>> {
        self.inner.register_any(Storage::Owned(buf), access)
    }

    fn register_shared(&self, buf: bytes::Bytes, access: Access) -> Result<Arc<RcMr>> {
        if access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::READ_SINK) {
            return Err(Error::Registration(RegistrationError::SharedWritable));
        }
        self.inner.register_any(Storage::Shared(buf), access)
    }
}

/// What a region's bytes are.
enum Storage {
    Owned(Vec<u8>),
    Shared(bytes::Bytes),
}

impl Storage {
    fn len(&self) -> usize {
        match self {
            Self::Owned(v) => v.len(),
            Self::Shared(b) => b.len(),
        }
    }
    fn as_slice(&self) -> &[u8] {
        match self {
            Self::Owned(v) => v,
            Self::Shared(b) => b,
        }
    }
}

/// A chunk of a pool, back in the pool when dropped.
pub(super) struct Chunk {
    pd: Arc<PdInner>,
    kind: PoolKind,
    slab: usize,
    off: usize,
    len: usize,
    rounded: usize,
    ptr: Ptr<u8>,
    mr: Ptr<sys::ibv_mr>,
    lkey: u32,
    rkey: u32,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        let pool = match self.kind {
            PoolKind::Local => &self.pd.local,
            PoolKind::Remote => &self.pd.remote,
        };
        lock(pool).give(self.slab, self.off, self.rounded);
    }
}

impl Chunk {
    /// SAFETY (callers): the chunk's bytes are this chunk's alone; the device writes them only
    /// for work requests the consumer posted, and the consumer reads only after their
    /// completion (see `RcMr::read`).
    fn bytes(&self) -> &[u8] {
        // SAFETY: [ptr, ptr + len) lies inside a live slab (the chunk holds the PD that owns
        // it) and no other chunk overlaps it.
        unsafe { std::slice::from_raw_parts(self.ptr.0, self.len) }
    }
    #[allow(clippy::mut_from_ref)]
    fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: as `bytes`; the region's lock serialises writers (see `RcMr::write`).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.0, self.len) }
    }
}

/// A bound memory window: the remote key of a pooled region.
pub(super) struct Window {
    pub(super) mw: Ptr<sys::ibv_mw>,
    pub(super) rkey: u32,
    pub(super) qp: Arc<RcQp>,
}

/// How a region is backed.
enum Backing {
    /// Registered where it lies; `mr` is null once revoked.
    InPlace { mem: Mutex<Option<Storage>>, ptr: Ptr<u8>, mr: Mutex<Ptr<sys::ibv_mr>>, ibv_access: i32 },
    /// Copied into a pool chunk; with a memory window for remote access in window mode. The
    /// chunk is shared with a retiring window until its invalidation completed; `io` serialises
    /// the region's own reads and writes.
    Pooled { chunk: Arc<Chunk>, window: Mutex<Option<Window>>, addr: u64, io: Mutex<()> },
}

/// A memory region of the rdma-core provider.
pub struct RcMr {
    pd: Arc<PdInner>,
    backing: Backing,
    len: usize,
    access: Access,
    lkey: AtomicU32,
    rkey: AtomicU32,
    valid: AtomicBool,
}

impl std::fmt::Debug for RcMr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.backing {
            Backing::InPlace { .. } => "in place",
            Backing::Pooled { .. } => "pooled",
        };
        f.debug_struct("RcMr")
            .field("len", &self.len)
            .field("access", &self.access)
            .field("kind", &kind)
            .field("rkey", &format_args!("{:#010x}", self.rkey.load(Ordering::Relaxed)))
            .finish()
    }
}

impl RcMr {
    fn in_place(pd: &Arc<PdInner>, mem: Storage, rights: Access, access: Access) -> Result<Arc<Self>> {
        let len = mem.len();
        let ptr = mem.as_slice().as_ptr().cast_mut();
        let ibv = ibv_access(rights);
        let mr = reg_mr(pd.pd.0, ptr, len, ibv)?;
        // SAFETY: just registered.
        let (lkey, rkey) = unsafe { ((*mr).lkey, (*mr).rkey) };
        Ok(Arc::new(Self {
            pd: pd.clone(),
            backing: Backing::InPlace { mem: Mutex::new(Some(mem)), ptr: Ptr(ptr), mr: Mutex::new(Ptr(mr)), ibv_access: ibv },
            len,
            access,
            lkey: AtomicU32::new(lkey),
            rkey: AtomicU32::new(rkey),
            valid: AtomicBool::new(true),
        }))
    }

    fn pooled(pd: &Arc<PdInner>, kind: PoolKind, mem: Storage, access: Access, bind: Option<Arc<RcQp>>) -> Result<Arc<Self>> {
        let chunk = pd.chunk(kind, mem.len())?;
        chunk.bytes_mut().copy_from_slice(mem.as_slice());
        let addr = chunk.ptr.0 as u64;
        let (lkey, mut rkey) = (chunk.lkey, chunk.rkey);
        let mut window = None;
        if let Some(qp) = bind {
            let mw = pd.window()?;
            match qp.bind_window(mw, chunk.mr, addr, mem.len(), access) {
                Ok(k) => {
                    rkey = k;
                    window = Some(Window { mw, rkey: k, qp });
                }
                Err(e) => {
                    pd.spare_window(mw);
                    return Err(e);
                }
            }
        } else if kind == PoolKind::Local {
            // Local-only memory has no remote key to give.
            rkey = 0;
        }
        Ok(Arc::new(Self {
            pd: pd.clone(),
            backing: Backing::Pooled { chunk: Arc::new(chunk), window: Mutex::new(window), addr, io: Mutex::new(()) },
            len: mem.len(),
            access,
            lkey: AtomicU32::new(lkey),
            rkey: AtomicU32::new(rkey),
            valid: AtomicBool::new(true),
        }))
    }

    /// Revoke the remote key (and, in place, the registration).
    fn revoke(&self) {
        self.valid.store(false, Ordering::Release);
        match &self.backing {
            Backing::InPlace { mr, .. } => {
                let mut mr = lock(mr);
                if !mr.0.is_null() {
                    // SAFETY: registered by `in_place`/`rekey`, deregistered once (nulled here).
                    unsafe { sys::ibv_dereg_mr(mr.0) };
                    mr.0 = std::ptr::null_mut();
                }
            }
            Backing::Pooled { chunk, window, .. } => {
                if let Some(w) = lock(window).take() {
                    // The chunk stays reserved until the window is known dead: after the local
                    // invalidation completes (or the queue pair is gone), never before, even if
                    // this region is dropped sooner.
                    w.qp.clone().retire_window(w, Some(chunk.clone()));
                }
            }
        }
    }
}

impl Drop for RcMr {
    fn drop(&mut self) {
        self.revoke();
    }
}

impl MemoryRegion for RcMr {
    fn lkey(&self) -> u32 {
        self.lkey.load(Ordering::Acquire)
    }
    fn rkey(&self) -> u32 {
        self.rkey.load(Ordering::Acquire)
    }
    fn addr(&self) -> u64 {
        match &self.backing {
            Backing::InPlace { ptr, .. } => ptr.0 as u64,
            Backing::Pooled { addr, .. } => *addr,
        }
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> Access {
        self.access
    }
    fn read(&self, f: &mut dyn FnMut(&[u8])) {
        match &self.backing {
            Backing::InPlace { mem, .. } => {
                if let Some(m) = lock(mem).as_ref() {
                    f(m.as_slice());
                }
            }
            Backing::Pooled { chunk, io, .. } => {
                let _io = lock(io);
                f(chunk.bytes());
            }
        }
    }
    fn write(&self, f: &mut dyn FnMut(&mut [u8])) {
        match &self.backing {
            Backing::InPlace { mem, .. } => {
                if let Some(Storage::Owned(v)) = lock(mem).as_mut() {
                    f(v);
                }
            }
            Backing::Pooled { chunk, io, .. } => {
                let _io = lock(io);
                f(chunk.bytes_mut());
            }
        }
    }
    fn invalidate(&self) {
        self.revoke();
    }
    fn rekey(&self) -> Result<u32> {
        match &self.backing {
            Backing::InPlace { ptr, mr, ibv_access, .. } => {
                let mut m = lock(mr);
                if !m.0.is_null() {
                    // SAFETY: as in `revoke`.
                    unsafe { sys::ibv_dereg_mr(m.0) };
                    m.0 = std::ptr::null_mut();
                }
                let new = reg_mr(self.pd.pd.0, ptr.0, self.len, *ibv_access)?;
                m.0 = new;
                // SAFETY: just registered.
                let (lkey, rkey) = unsafe { ((*new).lkey, (*new).rkey) };
                self.lkey.store(lkey, Ordering::Release);
                self.rkey.store(rkey, Ordering::Release);
            }
            Backing::Pooled { chunk, window, addr, .. } => {
                let mut w = lock(window);
                let Some(old) = w.take() else {
                    // A fixed-key or local chunk: its key is the pool's and cannot change.
                    return Err(Error::Invalid(match self.pd.dev.keys {
                        KeyMode::FixedPool => Invalid::FixedKeyRekey,
                        _ => Invalid::RevokedWindowRekey,
                    }));
                };
                let qp = old.qp.clone();
                // Invalidate the old key (the chunk stays ours), then bind a fresh window.
                let (mr, len) = (chunk.mr, self.len);
                qp.clone().retire_window(old, Some(chunk.clone()));
                let mw = self.pd.window()?;
                let k = qp.bind_window(mw, mr, *addr, len, self.access)?;
                *w = Some(Window { mw, rkey: k, qp });
                self.rkey.store(k, Ordering::Release);
            }
        }
        self.valid.store(true, Ordering::Release);
        Ok(self.rkey())
    }
    fn is_valid(&self) -> bool {
        self.valid.load(Ordering::Acquire)
    }
    fn into_buffer(self: Arc<Self>) -> std::result::Result<Vec<u8>, Arc<Self>> {
        let me = Arc::try_unwrap(self)?;
        me.revoke();
        let mut out = Vec::new();
        match &me.backing {
            Backing::InPlace { mem, .. } => match lock(mem).take() {
                Some(Storage::Owned(v)) => out = v,
                Some(Storage::Shared(b)) => out = b.to_vec(),
                None => {}
            },
            // A window's chunk stays readable after its key is revoked (the queue pair holds it
            // until the invalidation completed).
            Backing::Pooled { .. } => me.read(&mut |b| out = b.to_vec()),
        }
        Ok(out)
    }
}
