//! Memory: registered regions ([`SoftMr`]) and the protection domains that register them
//! ([`SoftPd`]), with the STag, domain, access and bounds checks every access passes.

use super::{IndexHasher, RnicShared, lock};
use riser_verbs::{Access, Error, MemoryRegion, ProtectionDomain, RegistrationError, Result};
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// A registered memory region; it owns its buffer, and dropping it deregisters.
#[derive(Debug)]
pub struct SoftMr {
    index: u32,
    key: AtomicU32,
    valid: AtomicBool,
    pd: u64,
    access: Access,
    pub(super) addr: u64,
    len: usize,
    pub(super) mem: Mutex<Storage>,
    /// Its protection domain's table, which it leaves when dropped (kept alive by its regions,
    /// like the domain itself).
    table: Arc<Regions>,
}

/// A protection domain's regions by STag index. Each domain has its own (a connection's
/// registrations and lookups do not meet another's); indexes come from the RNIC's counter.
#[derive(Debug)]
pub(super) struct Regions {
    pub(super) pd: u64,
    map: Mutex<HashMap<u32, Weak<SoftMr>, BuildHasherDefault<IndexHasher>>>,
}

impl Regions {
    pub(super) fn new(pd: u64) -> Self {
        Self { pd, map: Mutex::new(HashMap::default()) }
    }

    /// The live region of this domain with the index of `stag` (its key is checked by
    /// [`SoftMr::check`]).
    pub(super) fn lookup(&self, stag: u32) -> Option<Arc<SoftMr>> {
        lock(&self.map).get(&(stag >> 8)).and_then(Weak::upgrade)
    }

    /// Regions registered and not yet dropped.
    pub(super) fn live(&self) -> usize {
        lock(&self.map).values().filter(|w| w.strong_count() > 0).count()
    }
}

/// A region's memory: owned (any access), or shared read-only bytes (no write access at all,
/// so nothing can place into them).
#[derive(Debug)]
pub(super) enum Storage {
    Owned(Vec<u8>),
    Shared(bytes::Bytes),
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned(v) => v,
            Self::Shared(b) => b,
        }
    }
}

impl Storage {
    pub(super) fn writable(&mut self) -> &mut [u8] {
        match self {
            Self::Owned(v) => v,
            // Registered without write rights: the access checks never get here.
            Self::Shared(_) => &mut [],
        }
    }
}

impl SoftMr {
    fn stag(&self) -> u32 {
        (self.index << 8) | self.key.load(Ordering::Acquire)
    }

    /// Whether the region holds shared, immutable bytes (`register_shared`).
    pub(super) fn is_shared(&self) -> bool {
        matches!(*lock(&self.mem), Storage::Shared(_))
    }

    /// The buffer back (deregistering).
    pub fn into_inner(self: Arc<Self>) -> std::result::Result<Vec<u8>, Arc<Self>> {
        let mut m = Arc::try_unwrap(self)?;
        Ok(match std::mem::replace(m.mem.get_mut().unwrap_or_else(|e| e.into_inner()), Storage::Owned(Vec::new())) {
            Storage::Owned(v) => v,
            Storage::Shared(b) => b.to_vec(),
        })
    }

    /// Check an access of `len` bytes at virtual address `to` with STag `stag` from domain
    /// `pd` needing `need`; on failure, which check failed.
    pub(super) fn check(&self, stag: u32, pd: u64, need: Access, to: u64, len: u64) -> std::result::Result<usize, Denied> {
        if stag != self.stag() || !self.valid.load(Ordering::Acquire) {
            return Err(Denied::Stag);
        }
        if pd != self.pd {
            return Err(Denied::Pd);
        }
        if !self.access.contains(need) {
            return Err(Denied::Access);
        }
        let end = to.checked_add(len).ok_or(Denied::Bounds)?;
        if to < self.addr || end > self.addr + self.len as u64 {
            return Err(Denied::Bounds);
        }
        Ok((to - self.addr) as usize)
    }

    /// Invalidate at the peer's request (a Send with Invalidate). Only a key the peer can have
    /// been given qualifies: the full current STag (index and key byte: a stale key of a
    /// re-keyed region must not revoke the new one) of a region of the stream's protection
    /// domain registered for remote access (a local-only region's key was never advertised;
    /// letting the peer revoke it would let it break our own receive and send buffers). A region
    /// already invalid may be invalidated again, as the verbs allow.
    pub(super) fn invalidate_remote(&self, stag: u32, pd: u64) -> std::result::Result<(), Denied> {
        if stag != self.stag() {
            return Err(Denied::Stag);
        }
        if pd != self.pd {
            return Err(Denied::Pd);
        }
        if !self.access.intersects(Access::REMOTE_READ | Access::REMOTE_WRITE) {
            return Err(Denied::Access);
        }
        self.invalidate();
        Ok(())
    }
}

impl Drop for SoftMr {
    fn drop(&mut self) {
        let mut t = lock(&self.table.map);
        if t.get(&self.index).is_some_and(|w| w.strong_count() == 0) {
            t.remove(&self.index);
        }
    }
}

/// Which check an access failed (the receiver maps it to the RFC's Terminate).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Denied {
    Stag,
    Pd,
    Access,
    Bounds,
}

impl MemoryRegion for SoftMr {
    fn lkey(&self) -> u32 {
        self.stag()
    }
    fn rkey(&self) -> u32 {
        self.stag()
    }
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn access(&self) -> Access {
        self.access
    }
    fn read(&self, f: &mut dyn FnMut(&[u8])) {
        f(&lock(&self.mem))
    }
    fn write(&self, f: &mut dyn FnMut(&mut [u8])) {
        f(lock(&self.mem).writable())
    }
    fn invalidate(&self) {
        self.valid.store(false, Ordering::Release);
    }
    fn rekey(&self) -> Result<u32> {
        let k = self.key.load(Ordering::Acquire);
        self.key.store(k.wrapping_add(1) & 0xff, Ordering::Release);
        self.valid.store(true, Ordering::Release);
        Ok(self.stag())
    }
    fn is_valid(&self) -> bool {
        self.valid.load(Ordering::Acquire)
    }
    fn into_buffer(self: Arc<Self>) -> std::result::Result<Vec<u8>, Arc<Self>> {
        self.into_inner()
    }
}

/// A protection domain.
#[derive(Debug)]
pub struct SoftPd {
    /// Its regions, and its id (`Regions::pd`).
    pub(super) regions: Arc<Regions>,
    pub(super) rnic: Arc<RnicShared>,
}

impl ProtectionDomain for SoftPd {
    type Mr = SoftMr;

    fn register(&self, buf: Vec<u8>, access: Access) -> Result<Arc<SoftMr>> {
        let addr = buf.as_ptr() as u64;
        // Read Responses are placed by this RNIC's own read bookkeeping (the sink's STag is
        // checked for local write), so a read sink needs no remote rights here.
        let access = if access.contains(Access::READ_SINK) { (access - Access::READ_SINK) | Access::LOCAL_WRITE } else { access };
        self.insert(Storage::Owned(buf), addr, access)
    }

    fn register_shared(&self, buf: bytes::Bytes, access: Access) -> Result<Arc<SoftMr>> {
        if access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::READ_SINK) {
            return Err(Error::Registration(RegistrationError::SharedWritable));
        }
        let addr = buf.as_ptr() as u64;
        self.insert(Storage::Shared(buf), addr, access)
    }
}

impl SoftPd {
    fn insert(&self, mem: Storage, addr: u64, access: Access) -> Result<Arc<SoftMr>> {
        let mut t = lock(&self.regions.map);
        if t.len() >= 0x00ff_fff0 {
            return Err(Error::Registration(RegistrationError::NoFreeStag));
        }
        let index = loop {
            let i = self.rnic.next_index.fetch_add(1, Ordering::Relaxed) & 0x00ff_ffff;
            if i != 0 && t.get(&i).is_none_or(|w| w.strong_count() == 0) {
                break i;
            }
        };
        let mr = Arc::new(SoftMr {
            index,
            key: AtomicU32::new(u32::from(rand::random::<u8>())),
            valid: AtomicBool::new(true),
            pd: self.regions.pd,
            access,
            addr,
            len: mem.len(),
            mem: Mutex::new(mem),
            table: self.regions.clone(),
        });
        t.insert(index, Arc::downgrade(&mr));
        Ok(mr)
    }
}
