//! Backing stores for logical units: the [`BlockBackend`] trait and RAM, file and block-device
//! implementations.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt};
use std::path::Path;
use std::sync::RwLock;
use std::sync::atomic::{AtomicU64, Ordering};

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
    /// Whether UNMAP is supported (thin provisioning).
    fn thin(&self) -> bool;
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

/// A RAM disk. Memory is touched only when written (the kernel zero-fills pages lazily), and
/// unmapped blocks are tracked so GET LBA STATUS can report them.
#[derive(Debug)]
pub struct RamBackend {
    block_size: u32,
    data: RwLock<Vec<u8>>,
    mapped: RwLock<Vec<u64>>,
}

impl RamBackend {
    /// A RAM disk of `size` bytes (rounded down to whole blocks) with `block_size`-byte blocks.
    pub fn new(size: u64, block_size: u32) -> Self {
        let blocks = size / u64::from(block_size);
        let bytes = (blocks * u64::from(block_size)) as usize;
        Self { block_size, data: RwLock::new(vec![0; bytes]), mapped: RwLock::new(vec![0; (blocks as usize).div_ceil(64)]) }
    }

    fn mark(&self, offset: u64, len: u64, on: bool) {
        let bs = u64::from(self.block_size);
        let mut m = self.mapped.write().unwrap_or_else(|e| e.into_inner());
        for b in offset / bs..(offset + len).div_ceil(bs) {
            let (w, bit) = ((b / 64) as usize, b % 64);
            if let Some(word) = m.get_mut(w) {
                if on { *word |= 1 << bit } else { *word &= !(1 << bit) }
            }
        }
    }
}

impl BlockBackend for RamBackend {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.data.read().unwrap_or_else(|e| e.into_inner()).len() as u64 / u64::from(self.block_size)
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let d = self.data.read().unwrap_or_else(|e| e.into_inner());
        let at = offset as usize;
        let src = d.get(at..at + buf.len()).ok_or_else(|| io::Error::other("read beyond the end"))?;
        buf.copy_from_slice(src);
        Ok(())
    }
    fn read_into(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> io::Result<()> {
        let d = self.data.read().unwrap_or_else(|e| e.into_inner());
        let at = offset as usize;
        let src = d.get(at..at + len).ok_or_else(|| io::Error::other("read beyond the end"))?;
        out.clear();
        out.extend_from_slice(src);
        Ok(())
    }
    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        {
            let mut d = self.data.write().unwrap_or_else(|e| e.into_inner());
            let at = offset as usize;
            d.get_mut(at..at + buf.len()).ok_or_else(|| io::Error::other("write beyond the end"))?.copy_from_slice(buf);
        }
        self.mark(offset, buf.len() as u64, true);
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        {
            let mut d = self.data.write().unwrap_or_else(|e| e.into_inner());
            let at = offset as usize;
            d.get_mut(at..at + len as usize).ok_or_else(|| io::Error::other("unmap beyond the end"))?.fill(0);
        }
        self.mark(offset, len, false);
        Ok(())
    }
    fn is_mapped(&self, offset: u64) -> bool {
        let b = offset / u64::from(self.block_size);
        let m = self.mapped.read().unwrap_or_else(|e| e.into_inner());
        m.get((b / 64) as usize).is_some_and(|w| w & (1 << (b % 64)) != 0)
    }
    fn thin(&self) -> bool {
        true
    }
    fn atomic_writes(&self) -> bool {
        // Each write holds the data lock for its whole range.
        true
    }
    fn in_memory(&self) -> bool {
        true
    }
    fn resize(&self, size: u64) -> io::Result<()> {
        let mut d = self.data.write().unwrap_or_else(|e| e.into_inner());
        let bs = u64::from(self.block_size);
        let blocks = grown_blocks(size, self.block_size, d.len() as u64 / bs)?;
        let bytes = usize::try_from(blocks * bs).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "too large"))?;
        // New memory is zero, as unmapped blocks read; reads and writes wait while it grows.
        let more = bytes - d.len();
        d.try_reserve_exact(more).map_err(|_| io::Error::new(io::ErrorKind::OutOfMemory, "no memory to grow the RAM disk"))?;
        d.resize(bytes, 0);
        let mut m = self.mapped.write().unwrap_or_else(|e| e.into_inner());
        m.resize((blocks as usize).div_ceil(64), 0);
        Ok(())
    }
}

/// A regular file or a block device, accessed with positioned reads and writes; `flush` is
/// `fsync`.
#[derive(Debug)]
pub struct FileBackend {
    file: File,
    block_size: u32,
    blocks: AtomicU64,
    device: bool,
}

impl FileBackend {
    /// Open (creating a file of `size` bytes if it does not exist and a size is given).
    pub fn open(path: &Path, size: Option<u64>, block_size: u32) -> io::Result<Self> {
        let file = OpenOptions::new().read(true).write(true).create(size.is_some()).truncate(false).open(path)?;
        let mut len = file.metadata()?.len();
        if let Some(s) = size
            && len < s
        {
            file.set_len(s)?;
            len = s;
        }
        let device = file.metadata()?.file_type().is_block_device();
        if device {
            // Block devices report 0 in metadata: ask the device itself.
            len = device_size(&file)?;
        }
        Ok(Self { file, block_size, blocks: AtomicU64::new(len / u64::from(block_size)), device })
    }

    /// Whether this is a block device (else a regular file).
    pub fn is_device(&self) -> bool {
        self.device
    }
}

fn device_size(file: &File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut f = file;
    f.seek(SeekFrom::End(0))
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
        // Without hole punching available portably, write zeros.
        let zeros = vec![0u8; len.min(1 << 20) as usize];
        let mut at = offset;
        while at < offset + len {
            let n = (offset + len - at).min(zeros.len() as u64) as usize;
            self.file.write_all_at(&zeros[..n], at)?;
            at += n as u64;
        }
        Ok(())
    }
    fn is_mapped(&self, _offset: u64) -> bool {
        true
    }
    fn thin(&self) -> bool {
        false
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
}
