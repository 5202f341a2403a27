//! Memory: registered regions ([`SoftMr`]) and the protection domains that register them
//! ([`SoftPd`]), with the STag, domain, access and bounds checks every access passes.

use super::{IndexHasher, RnicShared, lock};
use riser_verbs::{Access, Error, MemoryRegion, ProtectionDomain, RegistrationError, Result};
use std::collections::{HashMap, VecDeque};
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
/// registrations and lookups do not meet another's). Indexes are unique in the RNIC (a key of
/// another domain is told from an unknown one): a domain takes [`INDEX_CHUNK`] at a time from
/// the RNIC's counter and reuses its own, so that registering writes nothing another connection
/// writes once a connection has as many indexes as it keeps regions.
#[derive(Debug)]
pub(super) struct Regions {
    pub(super) pd: u64,
    map: Mutex<Table>,
}

/// STag indexes a protection domain takes from the RNIC's counter at a time.
const INDEX_CHUNK: u32 = 64;

#[derive(Debug, Default)]
struct Table {
    live: HashMap<u32, Weak<SoftMr>, BuildHasherDefault<IndexHasher>>,
    /// Indexes of this domain no region holds, each with the key its next region gets: the
    /// oldest first, so an index comes back only after the others (and its key byte goes
    /// round only after 256 registrations on it: an STag kept after its region was dropped
    /// names no later region until then).
    free: VecDeque<(u32, u8)>,
}

impl Regions {
    pub(super) fn new(pd: u64) -> Self {
        Self { pd, map: Mutex::new(Table::default()) }
    }

    /// The live region of this domain with the index of `stag` (its key is checked by
    /// [`SoftMr::check`]).
    pub(super) fn lookup(&self, stag: u32) -> Option<Arc<SoftMr>> {
        lock(&self.map).live.get(&(stag >> 8)).and_then(Weak::upgrade)
    }

    /// Regions registered and not yet dropped.
    pub(super) fn live(&self) -> usize {
        lock(&self.map).live.values().filter(|w| w.strong_count() > 0).count()
    }
}

/// A region's memory: owned (any access), owned with bytes nobody has written yet
/// (`register_for_peer_writes`), or shared read-only bytes (no write access at all, so nothing
/// can place into them).
pub(super) enum Storage {
    Owned(Vec<u8>),
    /// Registered as it was: `buf[high..]` holds whatever it held, and is cleared before anyone
    /// local sees it ([`SoftMr::locked`]); a placement starting beyond `high` clears the gap
    /// first ([`Storage::placing`]), so every byte is either placed data or zero.
    Unwritten {
        buf: Vec<u8>,
        high: usize,
    },
    Shared(bytes::Bytes),
}

/// Lengths only: the bytes may be a pooled buffer's earlier contents (`Unwritten`) or anyone's data.
impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Owned(v) => write!(f, "Owned({} bytes)", v.len()),
            Self::Unwritten { buf, high } => write!(f, "Unwritten({} bytes, {high} written)", buf.len()),
            Self::Shared(b) => write!(f, "Shared({} bytes)", b.len()),
        }
    }
}

impl std::ops::Deref for Storage {
    type Target = [u8];
    /// The bytes; of an `Unwritten` region only once settled (see [`SoftMr::locked`]).
    fn deref(&self) -> &[u8] {
        match self {
            Self::Owned(v) | Self::Unwritten { buf: v, .. } => v,
            Self::Shared(b) => b,
        }
    }
}

impl Storage {
    /// For a local write: everything counts as written from now on.
    pub(super) fn writable(&mut self) -> &mut [u8] {
        self.settle();
        match self {
            Self::Owned(v) | Self::Unwritten { buf: v, .. } => v,
            // Registered without write rights: the access checks never get here.
            Self::Shared(_) => &mut [],
        }
    }

    /// For a peer's write of `range`: the bytes between what was written so far and its start
    /// cleared first; `None` when the range is outside the region or the region is read-only.
    /// The caller reports what it placed with [`Storage::placed`].
    pub(super) fn placing(&mut self, range: std::ops::Range<usize>) -> Option<&mut [u8]> {
        match self {
            Self::Owned(v) => v.get_mut(range),
            Self::Unwritten { buf, high } => {
                if range.end > buf.len() || range.start > range.end {
                    return None;
                }
                if range.start > *high {
                    buf[*high..range.start].fill(0);
                    *high = range.start;
                }
                buf.get_mut(range)
            }
            Self::Shared(_) => None,
        }
    }

    /// Whether bytes put in it stay as they are until something is placed over them: not an
    /// `Unwritten` region's past what was written (cleared when it is read or written locally).
    pub(super) fn keeps_bytes(&self) -> bool {
        matches!(self, Self::Owned(_))
    }

    /// The bytes at `range` as they are, written or not: stream bytes a read put there ahead
    /// of their header's checks (see rx's `Ahead`). `None` when outside or shared.
    pub(super) fn unchecked(&self, range: std::ops::Range<usize>) -> Option<&[u8]> {
        match self {
            Self::Owned(v) | Self::Unwritten { buf: v, .. } => v.get(range),
            Self::Shared(_) => None,
        }
    }

    /// A peer's write placed bytes up to `end`.
    pub(super) fn placed(&mut self, end: usize) {
        if let Self::Unwritten { high, .. } = self {
            *high = (*high).max(end);
        }
    }

    /// The bytes as a local reader sees them (what no write reached cleared; shared bytes
    /// copied), `next` in their place.
    fn take(&mut self, next: Self) -> Vec<u8> {
        self.settle();
        match std::mem::replace(self, next) {
            Self::Owned(v) | Self::Unwritten { buf: v, .. } => v,
            Self::Shared(b) => b.to_vec(),
        }
    }

    /// Clear what no write reached: an `Unwritten` region becomes an owned one.
    fn settle(&mut self) {
        if let Self::Unwritten { buf, high } = self {
            buf[*high..].fill(0);
            *self = Self::Owned(std::mem::take(buf));
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

    /// The memory, locked for a local access: bytes no peer's write reached read as zeros.
    pub(super) fn locked(&self) -> std::sync::MutexGuard<'_, Storage> {
        let mut m = lock(&self.mem);
        m.settle();
        m
    }

    /// The buffer back (deregistering).
    pub fn into_inner(self: Arc<Self>) -> std::result::Result<Vec<u8>, Arc<Self>> {
        let mut m = Arc::try_unwrap(self)?;
        Ok(m.mem.get_mut().unwrap_or_else(|e| e.into_inner()).take(Storage::Owned(Vec::new())))
    }

    /// Check an access of `len` bytes at virtual address `to` with STag `stag` from domain
    /// `pd` needing `need`; on failure, which check failed.
    pub(super) fn check(&self, stag: u32, pd: u64, need: Access, to: u64, len: u64) -> std::result::Result<usize, Denied> {
        // Validity before the key: `rekey` stores the key before it makes the region valid,
        // so a region seen valid is seen with its new key (a region swapped for a later read
        // never takes bytes under the key it had).
        if !self.valid.load(Ordering::Acquire) || stag != self.stag() {
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
        if t.live.get(&self.index).is_some_and(|w| w.strong_count() == 0) {
            t.live.remove(&self.index);
            let next_key = (self.key.load(Ordering::Acquire) as u8).wrapping_add(1);
            t.free.push_back((self.index, next_key));
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
        f(&self.locked())
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

/// The rights an owned region is registered with: Read Responses are placed by this RNIC's own
/// read bookkeeping (the sink's STag is checked for local write), so a read sink needs no remote
/// rights here.
fn owned_access(access: Access) -> Access {
    if access.contains(Access::READ_SINK) { (access - Access::READ_SINK) | Access::LOCAL_WRITE } else { access }
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
        self.insert(Storage::Owned(buf), addr, owned_access(access))
    }

    /// Registered as it is: the bytes no write places are cleared when the region is first
    /// read locally (`Storage::Unwritten`), not before.
    fn register_for_peer_writes(&self, buf: Vec<u8>, access: Access) -> Result<Arc<SoftMr>> {
        let addr = buf.as_ptr() as u64;
        self.insert(Storage::Unwritten { buf, high: 0 }, addr, owned_access(access))
    }

    fn register_shared(&self, buf: bytes::Bytes, access: Access) -> Result<Arc<SoftMr>> {
        if access.intersects(Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::READ_SINK) {
            return Err(Error::Registration(RegistrationError::SharedWritable));
        }
        let addr = buf.as_ptr() as u64;
        self.insert(Storage::Shared(buf), addr, access)
    }

    fn registers_in_place(&self) -> bool {
        true
    }

    /// The region invalid first, under the domain's table lock, where the receiver finds a
    /// region by its STag: with no other handle, no placement is under way in it, and one
    /// looked up from now on fails its key check; only then is its memory swapped.
    fn swap_for_peer_writes(&self, mr: &Arc<SoftMr>, buf: Vec<u8>) -> std::result::Result<Vec<u8>, Vec<u8>> {
        let peer_writable = mr.access.contains(Access::REMOTE_WRITE) && !mr.is_shared();
        if buf.len() != mr.len || !Arc::ptr_eq(&mr.table, &self.regions) || !peer_writable {
            return Err(buf);
        }
        {
            let _table = lock(&self.regions.map);
            if Arc::strong_count(mr) != 1 {
                return Err(buf);
            }
            mr.valid.store(false, Ordering::Release);
        }
        Ok(lock(&mr.mem).take(Storage::Unwritten { buf, high: 0 }))
    }
}

impl SoftMr {
    /// A request's unregistered payload as a region of its own for the transmitter's general
    /// path: in no table (index 0 names no region), so no key reaches it; only the request
    /// that carries it reads it.
    pub(super) fn detached(bytes: bytes::Bytes, table: &Arc<Regions>) -> Arc<Self> {
        Arc::new(Self {
            index: 0,
            key: AtomicU32::new(0),
            valid: AtomicBool::new(true),
            pd: table.pd,
            access: Access::empty(),
            addr: bytes.as_ptr() as u64,
            len: bytes.len(),
            mem: Mutex::new(Storage::Shared(bytes)),
            table: table.clone(),
        })
    }
}

impl SoftPd {
    fn insert(&self, mem: Storage, addr: u64, access: Access) -> Result<Arc<SoftMr>> {
        let mut t = lock(&self.regions.map);
        if t.live.len() >= 0x00ff_fff0 {
            return Err(Error::Registration(RegistrationError::NoFreeStag));
        }
        let (index, key) = loop {
            match t.free.pop_front() {
                // One another domain of this RNIC's could share only once the counter has gone
                // round: skipped (it is its domain's, not this one's).
                Some((i, key)) if t.live.get(&i).is_none_or(|w| w.strong_count() == 0) => break (i, key),
                Some(_) => {}
                None => {
                    let first = self.rnic.next_index.fetch_add(INDEX_CHUNK, Ordering::Relaxed);
                    let keys: [u8; INDEX_CHUNK as usize] = std::array::from_fn(|_| rand::random());
                    let fresh = (0..INDEX_CHUNK).map(|j| first.wrapping_add(j) & 0x00ff_ffff).zip(keys).filter(|&(i, _)| i != 0);
                    t.free.extend(fresh);
                }
            }
        };
        let mr = Arc::new(SoftMr {
            index,
            key: AtomicU32::new(u32::from(key)),
            valid: AtomicBool::new(true),
            pd: self.regions.pd,
            access,
            addr,
            len: mem.len(),
            mem: Mutex::new(mem),
            table: self.regions.clone(),
        });
        t.live.insert(index, Arc::downgrade(&mr));
        Ok(mr)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::SoftRnic;
    use riser_verbs::Provider;

    /// A domain registering and dropping regions one after another takes STag indexes from the
    /// RNIC's shared counter once, reuses its own, and gives a reused index the next key: an
    /// STag of a dropped region names no region registered after it.
    #[test]
    fn a_domain_reuses_its_own_stag_indexes_with_the_next_key() {
        let rnic = SoftRnic::default();
        let pd = rnic.alloc_pd().unwrap();
        let counter = || rnic.shared.next_index.load(Ordering::Relaxed);
        let before = counter();
        let first = pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
        let stag = first.lkey();
        drop(first);
        let mut seen = HashMap::new();
        for _ in 0..1000 {
            let mr = pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
            assert_ne!(mr.lkey(), stag, "a dropped region's STag came back");
            *seen.entry(mr.lkey() >> 8).or_insert(0) += 1;
            assert!(pd.regions.lookup(stag).is_none_or(|m| m.check(stag, m.pd, Access::empty(), m.addr, 1).is_err()));
        }
        assert_eq!(counter().wrapping_sub(before), INDEX_CHUNK, "one chunk of indexes for the domain");
        // The oldest free index first: every index of the chunk serves in turn (index 0, never
        // an STag's, is left out should the chunk straddle it).
        assert!(seen.len() as u32 >= INDEX_CHUNK - 1, "{} indexes in turn", seen.len());
        // A domain with more regions at once takes more chunks; they stay unique in the RNIC.
        let other = rnic.alloc_pd().unwrap();
        let held: Vec<_> = (0..100).map(|_| other.register(vec![0u8; 8], Access::LOCAL_WRITE).unwrap()).collect();
        let mut indexes: Vec<u32> = held.iter().map(|m| m.lkey() >> 8).collect();
        indexes.sort_unstable();
        indexes.dedup();
        assert_eq!(indexes.len(), 100);
        assert!(indexes.iter().all(|i| !seen.contains_key(i)), "another domain's indexes are its own");
    }

    /// A region for peer writes swaps its buffer for another: the one taken back shows only
    /// what was placed (zeros elsewhere, never what the buffer held before it was registered);
    /// no access succeeds until the region is re-keyed, none with the old STag after; the new
    /// buffer's earlier contents never show either. Refused while another handle is alive, for
    /// another length or a region without peer write rights.
    #[test]
    fn a_region_for_peer_writes_swaps_its_buffer_and_takes_a_new_key() {
        let rnic = SoftRnic::default();
        let pd = rnic.alloc_pd().unwrap();
        let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let mr = pd.register_for_peer_writes(vec![0xaa; 64], rw).unwrap();
        let old = mr.rkey();
        // A peer's write of bytes 8..16.
        {
            let mut m = lock(&mr.mem);
            m.placing(8..16).unwrap().fill(0x11);
            m.placed(16);
        }
        let extra = mr.clone();
        assert_eq!(pd.swap_for_peer_writes(&mr, vec![0xbb; 64]), Err(vec![0xbb; 64]), "another handle is alive");
        drop(extra);
        assert_eq!(pd.swap_for_peer_writes(&mr, vec![0xbb; 32]), Err(vec![0xbb; 32]), "another length");
        let back = pd.swap_for_peer_writes(&mr, vec![0xbb; 64]).unwrap();
        let mut want = vec![0u8; 64];
        want[8..16].fill(0x11);
        assert_eq!(back, want, "what was placed, zeros elsewhere");
        let checked = |stag: u32| pd.regions.lookup(stag).is_some_and(|m| m.check(stag, m.pd, Access::REMOTE_WRITE, m.addr, 1).is_ok());
        assert!(!mr.is_valid() && !checked(old), "invalid until re-keyed");
        let new = mr.rekey().unwrap();
        assert_ne!(new, old);
        assert!(checked(new) && !checked(old), "the new key works, the old one no more");
        let mut seen = Vec::new();
        mr.read(&mut |b| seen.extend_from_slice(b));
        assert_eq!(seen, vec![0u8; 64], "the new buffer's earlier bytes never show");
        let local = pd.register(vec![0u8; 64], Access::LOCAL_WRITE).unwrap();
        assert_eq!(pd.swap_for_peer_writes(&local, vec![0; 64]), Err(vec![0; 64]), "no peer write rights");
    }
}
