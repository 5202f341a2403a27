//! Backing stores for logical units: the [`BlockBackend`] trait and RAM, file and block-device
//! implementations.

use rustix::fs::{FallocateFlags, SeekFrom};
use rustix::io::Errno;
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::Range;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// What a logical unit stores its blocks in. Offsets and lengths are in bytes and always lie
/// within the device (the SCSI core checks ranges first).
pub trait BlockBackend: Send + Sync + std::fmt::Debug {
    /// Logical block size in bytes.
    fn block_size(&self) -> u32;
    /// Number of logical blocks.
    fn num_blocks(&self) -> u64;
    /// Read `buf.len()` bytes at `offset`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()>;
    /// Read `len` bytes at `offset` into `out` (cleared first). Backends that can copy straight
    /// into spare capacity override this to skip zero-filling the buffer.
    fn read_into(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> io::Result<()> {
        out.clear();
        out.resize(len, 0);
        self.read(offset, out)
    }
    /// Write `buf` at `offset`.
    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()>;
    /// Make everything written so far durable (SYNCHRONIZE CACHE, FUA).
    fn flush(&self) -> io::Result<()>;
    /// Deallocate `len` bytes at `offset`; they read back as zeros afterwards.
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Whether the block containing `offset` is mapped (holds data).
    fn is_mapped(&self, offset: u64) -> bool;
    /// The provisioning state of the run of blocks from the block at `offset`: whether that
    /// block is mapped, and how many bytes from `offset` (whole blocks, at least one block and
    /// at most `len`) share its state. `offset` is a block's start and `len` whole blocks, at
    /// least one. A run may be reported shorter than it is (the caller asks again from its end);
    /// "mapped" is always a safe answer (SBC-4: mapped or of unknown state).
    ///
    /// The default asks [`is_mapped`](Self::is_mapped) block by block, for at most 65536 blocks.
    fn mapping(&self, offset: u64, len: u64) -> io::Result<(bool, u64)> {
        let bs = u64::from(self.block_size());
        let limit = len.min(DEFAULT_MAPPING_SCAN_BLOCKS * bs);
        let mapped = self.is_mapped(offset);
        let mut n = bs;
        while n + bs <= limit && self.is_mapped(offset + n) == mapped {
            n += bs;
        }
        Ok((mapped, n))
    }
    /// Whether UNMAP deallocates (thin provisioning); deallocated blocks read as zeros.
    fn thin(&self) -> bool;
    /// The deallocation granularity in blocks (OPTIMAL UNMAP GRANULARITY in the Block Limits
    /// VPD page): UNMAP of a smaller or unaligned range zeroes the blocks but may leave them
    /// allocated. 1 (the default) when every block is deallocated on its own.
    fn unmap_granularity(&self) -> u32 {
        1
    }
    /// Whether every call completes at memory speed without blocking on a device (commands then
    /// run inline instead of on the blocking thread pool).
    fn in_memory(&self) -> bool {
        false
    }
    /// Whether one `write` call is atomic with respect to concurrent reads and writes
    /// (WRITE ATOMIC is offered only then).
    fn atomic_writes(&self) -> bool {
        false
    }
    /// Grow to `size` bytes (rounded down to whole blocks), keeping every block written. A
    /// smaller size is refused (`InvalidInput`: shrinking would drop data an initiator wrote);
    /// stores that cannot grow say `Unsupported` (the default).
    fn resize(&self, size: u64) -> io::Result<()> {
        let _ = size;
        Err(io::Error::new(io::ErrorKind::Unsupported, "this store cannot be resized"))
    }
}

/// How many blocks the default [`BlockBackend::mapping`] looks at in one call.
const DEFAULT_MAPPING_SCAN_BLOCKS: u64 = 65536;

/// The check every growing store makes: `size` in whole blocks, not below `blocks`.
fn grown_blocks(size: u64, block_size: u32, blocks: u64) -> io::Result<u64> {
    let want = size / u64::from(block_size);
    if want < blocks {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{size} bytes is smaller than the store ({} bytes): stores only grow", blocks * u64::from(block_size)),
        ));
    }
    Ok(want)
}

/// The size a RAM disk's segment aims at: the unit of locking and of allocation. 1 MiB keeps
/// the per-segment overhead (a padded lock, 128 bytes) near 0.01 % of the disk, makes a command
/// of up to 1 MiB (the usual largest burst) take one or two locks, and still spreads the I/O of
/// a disk of a few hundred MiB over hundreds of locks, so concurrent commands seldom meet on one.
const SEGMENT_BYTES: u64 = 1 << 20;

/// How many buckets of segments a RAM disk can have; bucket `k` holds `base << k` segments, so
/// 48 of them are more than any memory.
const BUCKETS: usize = 48;

/// A RAM disk. It is cut into segments of about 1 MiB (whole words of 64 blocks),
/// each with a lock of its own, so commands on different segments share no lock and no cache
/// line written per command (a bitmap word is written only when a block's state changes, not
/// when a block is written again). A segment's memory is allocated when it is first written (zeroed
/// lazily by the kernel) and freed when it is unmapped whole; unmapped blocks are tracked so GET
/// LBA STATUS can report them.
///
/// Atomicity ([`BlockBackend::atomic_writes`]): a command takes the locks of every segment it
/// covers, in ascending order (so commands never deadlock), and holds them all until it is done;
/// a write (or an unmap) is therefore all-or-nothing to concurrent reads and writes even when it
/// spans segments.
///
/// Growth ([`BlockBackend::resize`]) never moves a segment: segments live in buckets of doubling
/// size, each created once (a [`OnceLock`]), so finding a segment is two loads and commands never
/// take a lock shared by the whole disk. The size is an atomic published after the new segments
/// exist.
#[derive(Debug)]
pub struct RamBackend {
    block_size: u32,
    /// Blocks per segment: a multiple of 64, so a bitmap word never spans segments.
    segment_blocks: u64,
    /// Bytes per segment.
    segment_bytes: u64,
    /// log2 of the number of segments in bucket 0.
    base_shift: u32,
    blocks: AtomicU64,
    buckets: [OnceLock<Box<[Segment]>>; BUCKETS],
    /// Held by `resize` only.
    growing: Mutex<()>,
}

/// One segment of a [`RamBackend`], alone on its cache lines (128 bytes: the adjacent-line
/// prefetcher fetches lines in pairs).
#[derive(Debug)]
#[repr(align(128))]
struct Segment {
    /// The segment's bytes, `None` until first written (and after it is unmapped whole): it then
    /// reads as zeros.
    data: RwLock<Option<Box<[u8]>>>,
    /// Which blocks hold data, a bit per block. Changed only under the write lock of `data` (so
    /// a load and a store suffice), read without it.
    mapped: Box<[AtomicU64]>,
}

impl Segment {
    fn new(blocks: u64) -> Self {
        Self { data: RwLock::new(None), mapped: (0..blocks / 64).map(|_| AtomicU64::new(0)).collect() }
    }

    /// Set (`on`) or clear the bits of blocks `first..end` (of this segment). The caller holds
    /// the write lock of `data`: no one else changes the bits, so a word already as wanted (a
    /// block written again) is left alone and the others are stored, without a read-modify-write.
    fn mark(&self, first: u64, end: u64, on: bool) {
        let mut b = first;
        while b < end {
            let (w, bit) = ((b / 64) as usize, b % 64);
            let n = (64 - bit).min(end - b);
            let mask = if n == 64 { u64::MAX } else { ((1u64 << n) - 1) << bit };
            let old = self.mapped[w].load(Ordering::Relaxed);
            let new = if on { old | mask } else { old & !mask };
            if new != old {
                self.mapped[w].store(new, Ordering::Release);
            }
            b += n;
        }
    }
}

/// A part of a command that falls in one segment.
struct Piece<'a> {
    segment: &'a Segment,
    /// Byte range in the segment.
    at: Range<usize>,
    /// Byte range in the command's buffer.
    buf: Range<usize>,
}

/// Locks held on every segment a command covers, taken in ascending order. The first is kept
/// apart so a command within one segment (the common case) allocates nothing.
struct Held<'a, G> {
    first: (G, Piece<'a>),
    rest: Vec<(G, Piece<'a>)>,
}

impl<'a, G> Held<'a, G> {
    fn all(&mut self) -> impl Iterator<Item = &mut (G, Piece<'a>)> {
        std::iter::once(&mut self.first).chain(self.rest.iter_mut())
    }
}

impl RamBackend {
    /// A RAM disk of `size` bytes (rounded down to whole blocks) with `block_size`-byte blocks.
    pub fn new(size: u64, block_size: u32) -> Self {
        let bs = u64::from(block_size);
        let blocks = size / bs;
        let segment_blocks = (SEGMENT_BYTES / bs / 64).max(1) * 64;
        let base = blocks.div_ceil(segment_blocks).max(1).next_power_of_two();
        let r = Self {
            block_size,
            segment_blocks,
            segment_bytes: segment_blocks * bs,
            base_shift: base.trailing_zeros(),
            blocks: AtomicU64::new(blocks),
            buckets: std::array::from_fn(|_| OnceLock::new()),
            growing: Mutex::new(()),
        };
        r.buckets[0].get_or_init(|| (0..base).map(|_| Segment::new(segment_blocks)).collect());
        r
    }

    /// Bucket and index in it of segment `i`: bucket `k` holds segments `base * (2^k - 1)` up to
    /// `base * (2^(k+1) - 1)`.
    fn locate(&self, i: u64) -> (usize, usize) {
        let q = (i >> self.base_shift) + 1;
        let k = 63 - q.leading_zeros();
        (k as usize, (i - (((1u64 << k) - 1) << self.base_shift)) as usize)
    }

    fn segment(&self, i: u64) -> Option<&Segment> {
        let (k, j) = self.locate(i);
        self.buckets.get(k)?.get()?.get(j)
    }

    /// The piece of segment `i` from byte `at` of the disk, `offset` being where the command's
    /// buffer starts and `end` where it ends.
    fn piece(&self, i: u64, at: u64, offset: u64, end: u64) -> io::Result<Piece<'_>> {
        let start = at - i * self.segment_bytes;
        let n = (self.segment_bytes - start).min(end - at);
        // Every segment below the size exists (it is created before the size is published).
        let segment = self.segment(i).ok_or_else(|| io::Error::other(format!("RAM disk segment {i} missing")))?;
        Ok(Piece { segment, at: start as usize..(start + n) as usize, buf: (at - offset) as usize..(at - offset + n) as usize })
    }

    /// Take `lock` on the segments of the `len` bytes at `offset`, in ascending order, once the
    /// range is known to lie within the disk.
    fn hold<'a, G>(&'a self, offset: u64, len: usize, what: &str, lock: impl Fn(&'a Segment) -> G) -> io::Result<Held<'a, G>> {
        let beyond = || io::Error::other(format!("{what} beyond the end"));
        let end = offset.checked_add(len as u64).ok_or_else(beyond)?;
        if end > self.num_blocks() * u64::from(self.block_size) {
            return Err(beyond());
        }
        let (first, last) = (offset / self.segment_bytes, end.saturating_sub(1) / self.segment_bytes);
        // Nothing to do when `len` is 0: the lock taken on that segment (which exists, the first
        // one when the disk is empty) is moot.
        let first = first.min(last);
        let p = self.piece(first, offset, offset, end)?;
        let mut at = offset + p.at.len() as u64;
        let mut held = Held { first: (lock(p.segment), p), rest: Vec::new() };
        for i in first + 1..=last {
            let p = self.piece(i, at, offset, end)?;
            at += p.at.len() as u64;
            held.rest.push((lock(p.segment), p));
        }
        Ok(held)
    }

    fn read_lock(s: &Segment) -> RwLockReadGuard<'_, Option<Box<[u8]>>> {
        s.data.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write_lock(s: &Segment) -> RwLockWriteGuard<'_, Option<Box<[u8]>>> {
        s.data.write().unwrap_or_else(|e| e.into_inner())
    }

    /// The bitmap word holding block `b` (0 beyond the disk).
    fn word(&self, b: u64) -> u64 {
        self.segment(b / self.segment_blocks)
            .and_then(|s| s.mapped.get(((b % self.segment_blocks) / 64) as usize))
            .map_or(0, |w| w.load(Ordering::Acquire))
    }
}

impl BlockBackend for RamBackend {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.blocks.load(Ordering::Acquire)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let mut held = self.hold(offset, buf.len(), "read", Self::read_lock)?;
        for (g, p) in held.all() {
            match g.as_deref() {
                Some(d) => buf[p.buf.clone()].copy_from_slice(&d[p.at.clone()]),
                None => buf[p.buf.clone()].fill(0),
            }
        }
        Ok(())
    }
    fn read_into(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> io::Result<()> {
        let mut held = self.hold(offset, len, "read", Self::read_lock)?;
        out.clear();
        out.reserve(len);
        for (g, p) in held.all() {
            match g.as_deref() {
                Some(d) => out.extend_from_slice(&d[p.at.clone()]),
                None => out.resize(out.len() + p.at.len(), 0),
            }
        }
        Ok(())
    }
    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        let (sb, bs) = (self.segment_bytes as usize, u64::from(self.block_size));
        let mut held = self.hold(offset, buf.len(), "write", Self::write_lock)?;
        for (g, p) in held.all() {
            // Allocation is zeroed lazily by the kernel (a fresh mapping): only what is
            // written is touched.
            let d = g.get_or_insert_with(|| vec![0; sb].into_boxed_slice());
            d[p.at.clone()].copy_from_slice(&buf[p.buf.clone()]);
            let (start, end) = (p.at.start as u64, p.at.end as u64);
            p.segment.mark(start / bs, end.div_ceil(bs), true);
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        let len = usize::try_from(len).map_err(|_| io::Error::other("unmap beyond the end"))?;
        let (sb, bs) = (self.segment_bytes as usize, u64::from(self.block_size));
        let mut held = self.hold(offset, len, "unmap", Self::write_lock)?;
        for (g, p) in held.all() {
            if p.at.len() == sb {
                // The whole segment: give its memory back.
                **g = None;
            } else if let Some(d) = g.as_deref_mut() {
                d[p.at.clone()].fill(0);
            }
            let (start, end) = (p.at.start as u64, p.at.end as u64);
            p.segment.mark(start / bs, end.div_ceil(bs), false);
        }
        Ok(())
    }
    fn is_mapped(&self, offset: u64) -> bool {
        let b = offset / u64::from(self.block_size);
        b < self.num_blocks() && self.word(b) & (1 << (b % 64)) != 0
    }
    fn mapping(&self, offset: u64, len: u64) -> io::Result<(bool, u64)> {
        let bs = u64::from(self.block_size);
        let (first, count) = (offset / bs, (len / bs).max(1));
        let mapped = self.word(first) & (1 << (first % 64)) != 0;
        let same = if mapped { u64::MAX } else { 0 };
        let mut n = 1;
        while n < count {
            let b = first + n;
            // Whole words in the state of the run are skipped at once.
            if b % 64 == 0 && count - n >= 64 && self.word(b) == same {
                n += 64;
            } else if (self.word(b) & (1 << (b % 64)) != 0) == mapped {
                n += 1;
            } else {
                break;
            }
        }
        Ok((mapped, n * bs))
    }
    fn thin(&self) -> bool {
        true
    }
    fn atomic_writes(&self) -> bool {
        // Each command holds the locks of all the segments it covers for its whole range.
        true
    }
    fn in_memory(&self) -> bool {
        true
    }
    fn resize(&self, size: u64) -> io::Result<()> {
        let _growing = self.growing.lock().unwrap_or_else(|e| e.into_inner());
        let bs = u64::from(self.block_size);
        let blocks = grown_blocks(size, self.block_size, self.num_blocks())?;
        let too_large = || io::Error::new(io::ErrorKind::InvalidInput, "too large");
        usize::try_from(blocks.checked_mul(bs).ok_or_else(too_large)?).map_err(|_| too_large())?;
        // New blocks are zero and unmapped, as unmapped blocks read: nothing ever wrote past the
        // old end (commands are checked against the size), not even in the old last segment.
        // Commands go on meanwhile; they see the new size once its segments exist.
        let segments = blocks.div_ceil(self.segment_blocks);
        if segments > 0 {
            let (last, _) = self.locate(segments - 1);
            for k in 0..=last {
                let slot = self.buckets.get(k).ok_or_else(too_large)?;
                if slot.get().is_none() {
                    let n = (1usize << self.base_shift).checked_shl(k as u32).ok_or_else(too_large)?;
                    let mut v = Vec::new();
                    v.try_reserve_exact(n).map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, "no memory to grow the RAM disk"))?;
                    v.extend((0..n).map(|_| Segment::new(self.segment_blocks)));
                    let _ = slot.set(v.into_boxed_slice());
                }
            }
        }
        self.blocks.store(blocks, Ordering::Release);
        Ok(())
    }
}

/// How to open a [`FileBackend`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct FileOptions {
    /// Thin provisioning. `None` (the default): as the store allows — a regular file when its
    /// file system can punch holes, a block device when it can write zeroes by unmapping.
    /// `Some(false)`: never deallocate (UNMAP writes zeros and the unit reports itself fully
    /// provisioned). `Some(true)`: required, opening fails (`Unsupported`) if the store cannot.
    pub thin: Option<bool>,
}

impl FileOptions {
    /// These options with [`thin`](Self::thin) set.
    pub fn with_thin(mut self, thin: Option<bool>) -> Self {
        self.thin = thin;
        self
    }
}

/// A regular file or a block device, accessed with positioned reads and writes; `flush` is
/// `fsync`.
///
/// Thin provisioning (see [`FileOptions::thin`]): on a regular file UNMAP punches holes
/// (`fallocate(PUNCH_HOLE | KEEP_SIZE)`, holes read as zeros) and GET LBA STATUS reports the
/// file's real extents (`lseek(SEEK_DATA / SEEK_HOLE)`). On a block device UNMAP is the same
/// `fallocate`, which the kernel turns into a WRITE ZEROES that may unmap (block/fops.c
/// `blkdev_fallocate`, `BLKDEV_ZERO_NOFALLBACK`): the blocks read as zeros afterwards, so
/// LBPRZ holds. The `BLKDISCARD` ioctl is not used: a discard does not promise zeros (LBPRZ
/// would lie), and an ioctl needs `unsafe`, which this crate forbids. A device cannot tell
/// which blocks it holds, so GET LBA STATUS reports every block of a device mapped.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    block_size: u32,
    blocks: AtomicU64,
    device: bool,
    /// UNMAP deallocates (else it writes zeros).
    thin: bool,
    /// The alignment in bytes a deallocation needs (a device's logical block size; 1 for a
    /// file): the unaligned head and tail of a range are written as zeros instead.
    punch_align: u64,
    /// The store's allocation unit in bytes (the file system's block, the device's logical
    /// block): the granularity at which deallocation frees space.
    alloc_unit: u64,
}

/// What a store can do about deallocation, found at open.
struct Provisioning {
    /// Why it cannot deallocate (`Ok` when it can).
    can: Result<(), String>,
    punch_align: u64,
    alloc_unit: u64,
}

impl FileBackend {
    /// Open (creating a file of `size` bytes if it does not exist and a size is given), thin
    /// as the store allows ([`FileOptions::default`]).
    pub fn open(path: &Path, size: Option<u64>, block_size: u32) -> io::Result<Self> {
        Self::open_with(path, size, block_size, FileOptions::default())
    }

    /// [`open`](Self::open) with options: whether the unit is thin ([`FileOptions::thin`]).
    pub fn open_with(path: &Path, size: Option<u64>, block_size: u32, options: FileOptions) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).create(size.is_some()).truncate(false).open(path)?;
        let mut len = file.metadata()?.len();
        if let Some(s) = size
            && len < s
        {
            file.set_len(s)?;
            len = s;
        }
        let meta = file.metadata()?;
        let device = meta.file_type().is_block_device();
        if device {
            // Block devices report 0 in metadata: ask the device itself.
            len = device_size(&file)?;
        }
        let bs = u64::from(block_size);
        let p = if device {
            device_provisioning(Path::new(SYS_DEV_BLOCK), meta.rdev())
        } else if meta.is_file() {
            file_provisioning(&file, len, bs)
        } else {
            Provisioning { can: Err("neither a regular file nor a block device".into()), punch_align: 1, alloc_unit: bs }
        };
        let thin = match (options.thin, &p.can) {
            (Some(false), _) => false,
            (_, Ok(())) => true,
            (None, Err(why)) => {
                tracing::debug!(path = %path.display(), "not thin: {why}");
                false
            }
            (Some(true), Err(why)) => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!("{}: thin provisioning required, but {why}", path.display()),
                ));
            }
        };
        Ok(Self { file, block_size, blocks: AtomicU64::new(len / bs), device, thin, punch_align: p.punch_align, alloc_unit: p.alloc_unit })
    }

    /// Whether this is a block device (else a regular file).
    pub fn is_device(&self) -> bool {
        self.device
    }

    /// Write zeros over `len` bytes at `offset` (a non-thin UNMAP, and the parts of a thin one
    /// the store cannot deallocate).
    fn write_zeros(&self, offset: u64, len: u64) -> io::Result<()> {
        let zeros = vec![0u8; len.min(1 << 20) as usize];
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }

    /// Deallocate `len` bytes at `offset`; they read as zeros afterwards.
    fn deallocate(&self, offset: u64, len: u64) -> io::Result<()> {
        let end = offset + len;
        let (start, stop) = (offset.next_multiple_of(self.punch_align), end / self.punch_align * self.punch_align);
        if start >= stop {
            return self.write_zeros(offset, len);
        }
        self.write_zeros(offset, start - offset)?;
        self.write_zeros(stop, end - stop)?;
        match rustix::fs::fallocate(&self.file, PUNCH, start, stop - start) {
            Ok(()) => Ok(()),
            // The store stopped deallocating since open (a disk whose WRITE SAME failed loses
            // write zeroes): zeros are still zeros.
            Err(e) if e == Errno::OPNOTSUPP => {
                tracing::debug!("deallocation not supported any more ({e}): writing zeros");
                self.write_zeros(start, stop - start)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// Deallocate and keep the size: a hole in a file; on a block device, a WRITE ZEROES that may
/// unmap and never falls back to writing (the kernel answers `EOPNOTSUPP` instead).
const PUNCH: FallocateFlags = FallocateFlags::PUNCH_HOLE.union(FallocateFlags::KEEP_SIZE);

/// Where sysfs lists block devices by number.
const SYS_DEV_BLOCK: &str = "/sys/dev/block";

fn device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::End(0))
}

/// A regular file deallocates when its file system punches holes. The probe punches a range
/// wholly past the end with KEEP_SIZE, which changes nothing; a file system that cannot punch
/// says `EOPNOTSUPP` (before looking at the range).
fn file_provisioning(file: &File, len: u64, bs: u64) -> Provisioning {
    let past = len.next_multiple_of(bs).saturating_add(bs);
    let can = rustix::fs::fallocate(file, PUNCH, past, bs).map_err(|e| format!("the file system cannot punch holes ({e})"));
    // The file system block is what a hole frees at least.
    let alloc_unit =
        rustix::fs::fstatfs(file).ok().and_then(|s| u64::try_from(s.f_bsize).ok()).filter(|b| b.is_power_of_two()).unwrap_or(bs);
    Provisioning { can, punch_align: 1, alloc_unit }
}

/// A block device deallocates when it can write zeroes (sysfs `write_zeroes_max_bytes` > 0):
/// `fallocate(PUNCH_HOLE)` is refused on the others.
fn device_provisioning(sys_dev_block: &Path, rdev: u64) -> Provisioning {
    let (major, minor) = (rustix::fs::major(rdev), rustix::fs::minor(rdev));
    match DeviceQueue::read(sys_dev_block, major, minor) {
        Ok(q) => Provisioning {
            can: if q.write_zeroes_max_bytes > 0 {
                Ok(())
            } else {
                Err(format!("device {major}:{minor} cannot write zeroes (write_zeroes_max_bytes is 0)"))
            },
            punch_align: q.logical_block_size,
            alloc_unit: q.logical_block_size,
        },
        Err(e) => {
            Provisioning { can: Err(format!("device {major}:{minor}: no queue limits in sysfs ({e})")), punch_align: 512, alloc_unit: 512 }
        }
    }
}

/// What sysfs says of a block device's request queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct DeviceQueue {
    /// The largest WRITE ZEROES the device takes; 0 when it takes none.
    write_zeroes_max_bytes: u64,
    /// The device's logical block size (what `fallocate` ranges must be aligned to).
    logical_block_size: u64,
}

impl DeviceQueue {
    /// Read `MAJ:MIN/queue/` under `sys_dev_block` (`/sys/dev/block`), or for a partition
    /// (which has a `partition` file and no queue of its own) its disk's, the directory above.
    fn read(sys_dev_block: &Path, major: u32, minor: u32) -> io::Result<Self> {
        let dev = sys_dev_block.join(format!("{major}:{minor}"));
        // `MAJ:MIN` is a symbolic link into /sys/devices: `..` is taken from where it leads.
        let queue = if dev.join("partition").exists() { dev.join("..").join("queue") } else { dev.join("queue") };
        let read = |name: &str| -> io::Result<u64> {
            let path = queue.join(name);
            let text = std::fs::read_to_string(&path)?;
            text.trim().parse().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display())))
        };
        Ok(Self { write_zeroes_max_bytes: read("write_zeroes_max_bytes")?, logical_block_size: read("logical_block_size")?.max(1) })
    }
}

/// `lseek(SEEK_DATA)` from `at`: the next byte of data, `None` when there is none (`ENXIO`).
fn seek_data(file: &File, at: u64) -> io::Result<Option<u64>> {
    match rustix::fs::seek(file, SeekFrom::Data(at)) {
        Ok(p) => Ok(Some(p)),
        Err(e) if e == Errno::NXIO => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// `lseek(SEEK_HOLE)` from `at` (data): where the hole after it starts (the end of the file
/// counts as one).
fn seek_hole(file: &File, at: u64) -> io::Result<u64> {
    match rustix::fs::seek(file, SeekFrom::Hole(at)) {
        Ok(p) => Ok(p),
        // Past the end: a hole right there.
        Err(e) if e == Errno::NXIO => Ok(at),
        Err(e) => Err(e.into()),
    }
}

/// [`BlockBackend::mapping`] from a file's extents: a block holding any data is mapped, one
/// wholly in a hole is not. (The seeks move the file offset, which no I/O here uses: every
/// read and write is positioned.)
fn file_mapping(file: &File, offset: u64, len: u64, bs: u64) -> io::Result<(bool, u64)> {
    let end = offset + len;
    let Some(data) = seek_data(file, offset)? else {
        return Ok((false, len));
    };
    let data_block = data / bs * bs;
    if data_block > offset {
        // Holes up to the block where the data starts.
        return Ok((false, (data_block - offset).min(len)));
    }
    // Mapped: on over every block that holds some data.
    let mut at = data;
    loop {
        // Past `at` whatever the file system says, so the loop always moves on.
        let next = seek_hole(file, at)?.max(at + 1).next_multiple_of(bs);
        if next >= end {
            return Ok((true, len));
        }
        match seek_data(file, next)? {
            Some(d) if (next..next + bs).contains(&d) => at = d,
            _ => return Ok((true, next - offset)),
        }
    }
}

impl BlockBackend for FileBackend {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.blocks.load(Ordering::Relaxed)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        if self.thin { self.deallocate(offset, len) } else { self.write_zeros(offset, len) }
    }
    fn is_mapped(&self, offset: u64) -> bool {
        let bs = u64::from(self.block_size);
        self.mapping(offset / bs * bs, bs).map_or(true, |(mapped, _)| mapped)
    }
    fn mapping(&self, offset: u64, len: u64) -> io::Result<(bool, u64)> {
        // A unit that is not thin has every block mapped (LBPME=0), whatever holes its file
        // has; a device cannot say which blocks it holds.
        if !self.thin || self.device {
            return Ok((true, len));
        }
        file_mapping(&self.file, offset, len, u64::from(self.block_size))
    }
    fn thin(&self) -> bool {
        self.thin
    }
    fn unmap_granularity(&self) -> u32 {
        let g = self.alloc_unit / u64::from(self.block_size);
        if self.thin { u32::try_from(g).unwrap_or(u32::MAX).max(1) } else { 1 }
    }
    fn resize(&self, size: u64) -> io::Result<()> {
        let blocks = grown_blocks(size, self.block_size, self.num_blocks())?;
        if self.device {
            // A device's size is the device's: it must have grown to this size already.
            let have = device_size(&self.file)? / u64::from(self.block_size);
            if have < blocks {
                return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("the device holds only {have} blocks")));
            }
        } else {
            self.file.set_len(blocks * u64::from(self.block_size))?;
        }
        self.blocks.store(blocks, Ordering::Relaxed);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ram_round_trip_and_unmap() {
        let r = RamBackend::new(1 << 20, 512);
        assert_eq!(r.num_blocks(), 2048);
        r.write(1024, &[7; 1024]).unwrap();
        assert!(r.is_mapped(1024) && r.is_mapped(2047) && !r.is_mapped(0));
        let mut b = [0; 512];
        r.read(1536, &mut b).unwrap();
        assert_eq!(b, [7; 512]);
        r.unmap(1024, 512).unwrap();
        assert!(!r.is_mapped(1024) && r.is_mapped(1536));
        r.read(1024, &mut b).unwrap();
        assert_eq!(b, [0; 512]);
        assert!(r.read((1 << 20) - 10, &mut b).is_err());
    }

    #[test]
    fn stores_grow_and_never_shrink() {
        let r = RamBackend::new(1 << 20, 512);
        r.write(4096, &[9; 512]).unwrap();
        assert_eq!(r.resize(1 << 19).unwrap_err().kind(), io::ErrorKind::InvalidInput);
        r.resize((2 << 20) + 100).unwrap();
        assert_eq!(r.num_blocks(), 4096, "whole blocks");
        let mut b = [1; 512];
        r.read((2 << 20) - 512, &mut b).unwrap();
        assert_eq!(b, [0; 512], "new blocks read as zeros");
        assert!(!r.is_mapped((2 << 20) - 512));
        r.read(4096, &mut b).unwrap();
        assert_eq!(b, [9; 512], "old data kept");

        let path = std::env::temp_dir().join(format!("riser-grow-{}", std::process::id()));
        let f = FileBackend::open(&path, Some(1 << 16), 512).unwrap();
        f.write(512, &[3; 512]).unwrap();
        assert!(f.resize(1 << 15).is_err());
        f.resize(1 << 17).unwrap();
        assert_eq!((f.num_blocks(), std::fs::metadata(&path).unwrap().len()), (256, 1 << 17));
        f.read(512, &mut b).unwrap();
        assert_eq!(b, [3; 512]);
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn ram_writes_spanning_segments_are_never_torn() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        const SEG: u64 = SEGMENT_BYTES;
        let r = Arc::new(RamBackend::new(4 * SEG, 512));
        assert_eq!(r.segment_bytes, SEG);
        // Across one boundary (8 KiB), and across three segments (one of them whole).
        let ranges = [(SEG - 4096, 8192usize), (2 * SEG - 4096, (SEG + 8192) as usize)];
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (1..=2u8)
            .map(|w| {
                let (r, stop) = (r.clone(), stop.clone());
                std::thread::spawn(move || {
                    for i in 0..400usize {
                        let (offset, len) = ranges[i % 2];
                        // Writers race each other too; every fourth turn unmaps (zeros).
                        if i % 4 == 3 {
                            r.unmap(offset, len as u64).unwrap();
                        } else {
                            r.write(offset, &vec![w * 100 + (i % 50) as u8 + 1; len]).unwrap();
                        }
                    }
                    stop.store(true, Ordering::Relaxed);
                })
            })
            .collect();
        let readers: Vec<_> = (0..2)
            .map(|t| {
                let (r, stop) = (r.clone(), stop.clone());
                std::thread::spawn(move || {
                    let mut out = Vec::new();
                    let mut reads = 0;
                    while !stop.load(Ordering::Relaxed) || reads < 50 {
                        let (offset, len) = ranges[reads % 2];
                        if t == 0 {
                            out.resize(len, 0xff);
                            r.read(offset, &mut out).unwrap();
                        } else {
                            r.read_into(offset, len, &mut out).unwrap();
                        }
                        assert_eq!(out.len(), len);
                        let first = out[0];
                        assert!(out.iter().all(|&b| b == first), "a torn write seen at {offset} + {len}");
                        reads += 1;
                    }
                })
            })
            .collect();
        for h in writers.into_iter().chain(readers) {
            h.join().unwrap();
        }
        // The last state of each range is uniform too, and the mapping agrees with it.
        let mut out = Vec::new();
        for (offset, len) in ranges {
            r.read_into(offset, len, &mut out).unwrap();
            assert!(out.iter().all(|&b| b == out[0]));
            assert_eq!(r.mapping(offset, len as u64).unwrap(), (out[0] != 0, len as u64));
        }
    }

    #[test]
    fn ram_segments_hold_through_growth_and_whole_unmaps() {
        for bs in [512u32, 4096, 65536] {
            let bsl = u64::from(bs);
            let r = RamBackend::new(3 * bsl, bs);
            let sb = r.segment_bytes;
            assert_eq!((sb % (64 * bsl), r.num_blocks()), (0, 3));
            r.write(bsl, &[5; 512]).unwrap();
            assert!(r.write(3 * bsl - 256, &[0; 512]).is_err(), "beyond the end");
            assert!(r.read(u64::MAX - 10, &mut [0; 512]).is_err(), "overflowing");
            assert!(r.read(3 * bsl, &mut []).is_ok(), "nothing at the end");
            // Grow over several buckets; the old last segment is reused.
            let mut size = 3 * bsl;
            for grow in [sb, 3 * sb + 7 * bsl, 10 * sb, 33 * sb] {
                let old = size;
                size += grow;
                r.resize(size).unwrap();
                assert_eq!(r.num_blocks(), size / bsl, "block size {bs}");
                let mut b = vec![1; 2 * bs as usize];
                r.read(old - bsl, &mut b).unwrap();
                assert!(b[bs as usize..].iter().all(|&x| x == 0), "the grown part reads zeros");
                assert!(!r.is_mapped(old));
                // A write straddling the old end, and one at the very end.
                r.write(old - bsl, &vec![7; 2 * bs as usize]).unwrap();
                r.write(size - bsl, &vec![8; bs as usize]).unwrap();
                r.read(old - bsl, &mut b).unwrap();
                assert!(b.iter().all(|&x| x == 7));
                assert!(r.is_mapped(old) && r.is_mapped(size - bsl) && !r.is_mapped(size));
            }
            let mut b = [0; 512];
            r.read(bsl, &mut b).unwrap();
            assert_eq!(b, [5; 512], "old data kept");
            // Unmapping a whole segment and a piece of the next.
            r.write(sb, &vec![9; 2 * sb as usize]).unwrap();
            r.unmap(sb, sb + bsl).unwrap();
            assert_eq!(r.mapping(sb, 2 * sb).unwrap(), (false, sb + bsl));
            let mut out = Vec::new();
            r.read_into(sb, 2 * sb as usize, &mut out).unwrap();
            assert!(out[..(sb + bsl) as usize].iter().all(|&x| x == 0) && out[(sb + bsl) as usize..].iter().all(|&x| x == 9));
            r.write(sb + 3 * bsl, &vec![4; bs as usize]).unwrap();
            r.read(sb + 3 * bsl, &mut b).unwrap();
            assert_eq!(b, [4; 512], "an unmapped segment is written again");
            assert_eq!(r.mapping(sb, 2 * sb).unwrap(), (false, 3 * bsl));
        }
    }

    #[test]
    fn ram_resize_while_commands_run() {
        use std::sync::Arc;
        use std::sync::atomic::AtomicBool;
        let r = Arc::new(RamBackend::new(1 << 20, 512));
        let (stop, done) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicU64::new(0)));
        let io = {
            let (r, stop, done) = (r.clone(), stop.clone(), done.clone());
            std::thread::spawn(move || {
                let mut out = Vec::new();
                for i in 0u64.. {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    // Anywhere in the disk as it is now, the new end included.
                    let blocks = r.num_blocks();
                    let at = (i * 7919 % (blocks - 8)) * 512;
                    r.write(at, &[i as u8; 4096]).unwrap();
                    r.read_into(at, 4096, &mut out).unwrap();
                    assert!(out.iter().all(|&b| b == i as u8));
                    done.store(i + 1, Ordering::Relaxed);
                }
            })
        };
        for mib in 2..40u64 {
            // Commands run between every two resizes.
            let seen = done.load(Ordering::Relaxed);
            while done.load(Ordering::Relaxed) < seen + 2 && !io.is_finished() {
                std::thread::yield_now();
            }
            r.resize(mib << 20).unwrap();
            assert_eq!(r.num_blocks(), mib << 11);
        }
        stop.store(true, Ordering::Relaxed);
        io.join().unwrap();
    }

    #[test]
    fn file_backend() {
        let dir = std::env::temp_dir().join(format!("riser-fb-{}", std::process::id()));
        let f = FileBackend::open(&dir, Some(1 << 16), 512).unwrap();
        assert_eq!(f.num_blocks(), 128);
        f.write(512, &[1; 512]).unwrap();
        f.flush().unwrap();
        let mut b = [0; 512];
        f.read(512, &mut b).unwrap();
        assert_eq!(b, [1; 512]);
        std::fs::remove_file(&dir).unwrap();
    }

    /// A RAM disk that answers [`BlockBackend::mapping`] with the trait's default.
    #[derive(Debug)]
    struct ByBlock(RamBackend);

    impl BlockBackend for ByBlock {
        fn block_size(&self) -> u32 {
            self.0.block_size()
        }
        fn num_blocks(&self) -> u64 {
            self.0.num_blocks()
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
            self.0.read(offset, buf)
        }
        fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
            self.0.write(offset, buf)
        }
        fn flush(&self) -> io::Result<()> {
            Ok(())
        }
        fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
            self.0.unmap(offset, len)
        }
        fn is_mapped(&self, offset: u64) -> bool {
            self.0.is_mapped(offset)
        }
        fn thin(&self) -> bool {
            true
        }
    }

    /// The run from `block` as `is_mapped` tells it, at most `max` blocks.
    fn run_by_is_mapped(b: &dyn BlockBackend, block: u64, max: u64) -> (bool, u64) {
        let bs = u64::from(b.block_size());
        let m = b.is_mapped(block * bs);
        let n = (1..max).find(|&i| b.is_mapped((block + i) * bs) != m).unwrap_or(max);
        (m, n)
    }

    #[test]
    fn ram_mapping_runs_agree_with_is_mapped() {
        let r = RamBackend::new(4096 * 512, 512);
        // Runs across word boundaries, whole words, a single block and the very end.
        for (lba, blocks) in [(0, 3), (60, 140), (255, 1), (1000, 1), (2048, 2048)] {
            r.write(lba * 512, &vec![1; blocks as usize * 512]).unwrap();
        }
        r.unmap(2100 * 512, 64 * 512).unwrap();
        let by_block = ByBlock(RamBackend::new(4096 * 512, 512));
        for (lba, blocks) in [(0, 3), (60, 140), (255, 1), (1000, 1), (2048, 52), (2164, 1932)] {
            by_block.write(lba * 512, &vec![1; blocks as usize * 512]).unwrap();
        }
        for block in [0, 2, 3, 59, 60, 63, 64, 127, 128, 199, 200, 254, 255, 256, 999, 1000, 1001, 2047, 2048, 2099, 2100, 2163, 2164, 4095]
        {
            for max in [1, 5, 64, 4096 - block] {
                let want = run_by_is_mapped(&r, block, max);
                let (m, bytes) = r.mapping(block * 512, max * 512).unwrap();
                assert_eq!((m, bytes / 512), want, "RAM from block {block}, at most {max}");
                let (m, bytes) = by_block.mapping(block * 512, max * 512).unwrap();
                assert_eq!((m, bytes / 512), want, "default from block {block}, at most {max}");
            }
        }
        assert_eq!(r.mapping(2100 * 512, 1 << 20).unwrap(), (false, 64 * 512));
        assert_eq!(r.mapping(2164 * 512, 1932 * 512).unwrap(), (true, 1932 * 512));
    }

    /// A scratch file in the temporary directory, removed when dropped.
    struct Scratch(std::path::PathBuf);

    impl Scratch {
        fn new(name: &str) -> Self {
            let p = std::env::temp_dir().join(format!("riser-{name}-{}", std::process::id()));
            let _ = std::fs::remove_file(&p);
            Self(p)
        }
    }

    impl Drop for Scratch {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.0);
        }
    }

    /// Whether the file system holding `dir` is one known to punch holes (ext4, XFS, btrfs,
    /// tmpfs): there a file must be thin.
    pub(crate) fn known_to_punch(dir: &Path) -> bool {
        const MAGICS: [u64; 4] = [0xef53, 0x5846_5342, 0x9123_683e, 0x0102_1994];
        rustix::fs::statfs(dir).ok().and_then(|s| u64::try_from(s.f_type).ok()).is_some_and(|t| MAGICS.contains(&t))
    }

    #[test]
    fn file_mapping_follows_the_extents() {
        let s = Scratch::new("extents");
        let f = FileBackend::open(&s.0, Some(1 << 20), 512).unwrap();
        if known_to_punch(&std::env::temp_dir()) {
            assert!(f.thin(), "a file system that punches holes gives a thin file");
        }
        if !f.thin() {
            // Not thin: every block is mapped, whatever holes the file has.
            assert_eq!(f.mapping(0, 1 << 20).unwrap(), (true, 1 << 20));
            return;
        }
        let fs_block = rustix::fs::statfs(std::env::temp_dir().as_path()).unwrap().f_bsize as u64;
        assert_eq!(f.unmap_granularity() as u64, (fs_block / 512).max(1));
        assert_eq!(f.mapping(0, 1 << 20).unwrap(), (false, 1 << 20), "a new file is one hole");
        // One 512-byte block: its file system block holds data, so all the unit's blocks in it
        // are mapped.
        let at = 3 * fs_block + 512;
        f.write(at, &[7; 512]).unwrap();
        assert_eq!(f.mapping(0, 1 << 20).unwrap(), (false, 3 * fs_block));
        assert_eq!(f.mapping(0, 512).unwrap(), (false, 512), "at most len");
        assert_eq!(f.mapping(3 * fs_block, (1 << 20) - 3 * fs_block).unwrap(), (true, fs_block));
        assert_eq!(f.mapping(4 * fs_block, (1 << 20) - 4 * fs_block).unwrap(), (false, (1 << 20) - 4 * fs_block));
        assert!(f.is_mapped(at) && f.is_mapped(3 * fs_block) && !f.is_mapped(0) && !f.is_mapped(4 * fs_block));
        // Adjacent data extends the run; data at the very end of the file too.
        f.write(4 * fs_block, &vec![8; fs_block as usize]).unwrap();
        f.write((1 << 20) - 512, &[9; 512]).unwrap();
        assert_eq!(f.mapping(3 * fs_block, (1 << 20) - 3 * fs_block).unwrap(), (true, 2 * fs_block));
        assert_eq!(f.mapping(5 * fs_block, (1 << 20) - 5 * fs_block).unwrap(), (false, (1 << 20) - 6 * fs_block));
        assert_eq!(f.mapping((1 << 20) - fs_block, fs_block).unwrap(), (true, fs_block));
        // A punched hole reads as zeros and is a hole again.
        f.unmap(3 * fs_block, 2 * fs_block).unwrap();
        let mut b = vec![1; 2 * fs_block as usize];
        f.read(3 * fs_block, &mut b).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(f.mapping(0, 1 << 20).unwrap(), (false, (1 << 20) - fs_block));
    }

    #[test]
    fn thin_provisioning_follows_the_options() {
        let s = Scratch::new("options");
        let punch = known_to_punch(&std::env::temp_dir());
        let off = FileBackend::open_with(&s.0, Some(1 << 16), 512, FileOptions::default().with_thin(Some(false))).unwrap();
        assert!(!off.thin() && off.is_mapped(0) && off.unmap_granularity() == 1);
        drop(off);
        if punch {
            assert!(FileBackend::open_with(&s.0, None, 512, FileOptions { thin: Some(true) }).unwrap().thin());
        }
        // Neither a regular file nor a block device: never thin, and refused when required.
        assert!(!FileBackend::open(Path::new("/dev/null"), None, 512).unwrap().thin());
        let e = FileBackend::open_with(Path::new("/dev/null"), None, 512, FileOptions { thin: Some(true) }).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::Unsupported, "{e}");
    }

    #[test]
    fn a_device_is_thin_when_sysfs_says_it_writes_zeroes() {
        let s = Scratch::new("sysfs");
        let root = &s.0;
        let _ = std::fs::remove_dir_all(root);
        let put = |rel: &str, text: &str| {
            let p = root.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        };
        // Laid out as /sys is: dev/block/MAJ:MIN are links into devices/, a partition is a
        // directory inside its disk's, with a `partition` file and no queue.
        put("devices/vda/queue/write_zeroes_max_bytes", "2199023255040\n");
        put("devices/vda/queue/logical_block_size", "4096\n");
        put("devices/vda/vda1/partition", "1\n");
        put("devices/zram0/queue/write_zeroes_max_bytes", "0\n");
        put("devices/zram0/queue/logical_block_size", "512\n");
        put("devices/odd/queue/write_zeroes_max_bytes", "lots\n");
        put("devices/odd/queue/logical_block_size", "512\n");
        std::fs::create_dir_all(root.join("dev/block")).unwrap();
        for (link, to) in [("253:0", "vda"), ("253:1", "vda/vda1"), ("254:0", "zram0"), ("1:1", "odd")] {
            std::os::unix::fs::symlink(format!("../../devices/{to}"), root.join("dev/block").join(link)).unwrap();
        }
        let sys = root.join("dev/block");
        let disk = DeviceQueue { write_zeroes_max_bytes: 2_199_023_255_040, logical_block_size: 4096 };
        assert_eq!(DeviceQueue::read(&sys, 253, 0).unwrap(), disk);
        assert_eq!(DeviceQueue::read(&sys, 253, 1).unwrap(), disk, "a partition has its disk's queue");
        assert_eq!(DeviceQueue::read(&sys, 254, 0).unwrap(), DeviceQueue { write_zeroes_max_bytes: 0, logical_block_size: 512 });
        assert_eq!(DeviceQueue::read(&sys, 1, 1).unwrap_err().kind(), io::ErrorKind::InvalidData);
        assert_eq!(DeviceQueue::read(&sys, 9, 9).unwrap_err().kind(), io::ErrorKind::NotFound);

        let p = device_provisioning(&sys, rustix::fs::makedev(253, 1));
        assert_eq!((p.can.is_ok(), p.punch_align, p.alloc_unit), (true, 4096, 4096));
        for (major, minor) in [(254, 0), (1, 1), (9, 9)] {
            let p = device_provisioning(&sys, rustix::fs::makedev(major, minor));
            assert!(p.can.is_err(), "{major}:{minor} is not thin");
        }
        std::fs::remove_dir_all(root).unwrap();
    }

    /// A loop device over a sparse file on a file system that punches holes: thin, UNMAP
    /// reads back as zeros, and the backing file shrinks. Needs root and a free loop device:
    /// `cargo test -p riser-target -- --ignored a_loop_device`.
    #[test]
    #[ignore = "needs root and a free loop device"]
    fn a_loop_device_deallocates_through_write_zeroes() {
        use std::process::Command;
        let s = Scratch::new("loop-backing");
        File::create(&s.0).unwrap().set_len(64 << 20).unwrap();
        let out = Command::new("losetup").args(["--find", "--show"]).arg(&s.0).output().unwrap();
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        let dev = String::from_utf8(out.stdout).unwrap().trim().to_string();
        let detach = || Command::new("losetup").args(["-d", &dev]).status();
        let result = std::panic::catch_unwind(|| {
            let f = FileBackend::open(Path::new(&dev), None, 512).unwrap();
            assert!(f.is_device() && f.num_blocks() == (64 << 20) / 512);
            let rdev = std::fs::metadata(&dev).unwrap().rdev();
            let q = DeviceQueue::read(Path::new(SYS_DEV_BLOCK), rustix::fs::major(rdev), rustix::fs::minor(rdev)).unwrap();
            assert_eq!(f.thin(), q.write_zeroes_max_bytes > 0, "{q:?}");
            f.write(0, &vec![0x5a; 8 << 20]).unwrap();
            f.flush().unwrap();
            let before = std::fs::metadata(&s.0).unwrap().blocks();
            f.unmap(1 << 20, 4 << 20).unwrap();
            f.flush().unwrap();
            let mut b = vec![1; 4 << 20];
            f.read(1 << 20, &mut b).unwrap();
            assert!(b.iter().all(|&x| x == 0), "UNMAP reads back as zeros");
            assert_eq!(f.mapping(0, 64 << 20).unwrap(), (true, 64 << 20), "a device: every block mapped");
            let after = std::fs::metadata(&s.0).unwrap().blocks();
            if f.thin() {
                assert!(before - after >= (4 << 20) / 512, "the backing file shrank: {before} -> {after} sectors");
            }
            eprintln!("{dev}: thin {}, {q:?}, backing file {before} -> {after} sectors", f.thin());
        });
        detach().unwrap();
        result.unwrap();
    }
}
