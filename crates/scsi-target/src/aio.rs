//! Asynchronous backing stores: the [`AsyncBackend`] trait, for stores whose I/O completes
//! elsewhere (a cluster such as Ceph RBD, a storage product's own engine), so that no thread
//! waits per command.
//!
//! A unit over an asynchronous store ([`LogicalUnit::with_async`](crate::lu::LogicalUnit::with_async))
//! runs the medium data path — READ, WRITE (with FUA), SYNCHRONIZE CACHE, UNMAP, WRITE SAME and
//! COMPARE AND WRITE — as futures on the server's runtime: a command's future is polled until the
//! store's completion wakes it. The rare commands that need several dependent accesses (VERIFY,
//! ORWRITE, SANITIZE, GET LBA STATUS, ...) run on the blocking pool through the same store, each
//! access waited for there ([`BlockOn`]).
//!
//! RAM, file and block-device stores stay [`BlockBackend`]s: a RAM
//! command completes inline (no thread hop, no allocation for a future), a file or device command
//! runs on the blocking pool as one call (see the README's note on why not io_uring).

use crate::backend::BlockBackend;
use bytes::Bytes;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

/// A store operation: finished already ([`Io::ready`]: no allocation, nothing to wait for) or
/// in flight ([`Io::pending`]).
///
/// Dropping an `Io` in flight does not cancel the operation: it goes on to its end in the
/// store (a store must keep every buffer it was given alive until then). The unit never
/// reports a command's end before its operation has ended, whether the command's task was
/// aborted or not.
#[must_use = "an operation does nothing observable until it is awaited"]
pub enum Io<T> {
    /// Completed.
    Ready(Option<io::Result<T>>),
    /// In flight.
    Pending(Pin<Box<dyn Future<Output = io::Result<T>> + Send + 'static>>),
}

impl<T> Io<T> {
    /// A completed operation.
    pub fn ready(result: io::Result<T>) -> Self {
        Self::Ready(Some(result))
    }

    /// An operation in flight.
    pub fn pending(f: impl Future<Output = io::Result<T>> + Send + 'static) -> Self {
        Self::Pending(Box::pin(f))
    }

    /// An operation this store does not offer (`ErrorKind::Unsupported`).
    pub fn unsupported(what: &str) -> Self {
        Self::ready(Err(io::Error::new(io::ErrorKind::Unsupported, format!("this store does not offer {what}"))))
    }
}

impl<T> fmt::Debug for Io<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Ready(_) => "Io::Ready",
            Self::Pending(_) => "Io::Pending",
        })
    }
}

impl<T: Unpin> Future for Io<T> {
    type Output = io::Result<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Self::Ready(r) => Poll::Ready(r.take().unwrap_or_else(|| Err(io::Error::other("operation polled after it completed")))),
            Self::Pending(f) => f.as_mut().poll(cx),
        }
    }
}

/// What COMPARE AND WRITE found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compared {
    /// The data matched and the new data is written.
    Written,
    /// The data differed, first at this byte offset within the compared range; nothing is
    /// written.
    Mismatch(u64),
}

/// A backing store whose operations complete as futures. Offsets and lengths are in bytes and
/// always lie within the store in whole blocks (the unit checks ranges first).
///
/// This is what a storage product embedding riser implements for its own store. Every method
/// returns at once: the work completes in the returned [`Io`], whose future must be `Send` and
/// own what it needs (`'static`). A store that keeps a volatile cache reports it
/// ([`write_back`](Self::write_back)); a store shared with other writers (other gateways) says so
/// ([`shared`](Self::shared)), and the unit then never emulates an atomic operation on it.
pub trait AsyncBackend: Send + Sync + fmt::Debug {
    /// Logical block size in bytes.
    fn block_size(&self) -> u32;
    /// Number of logical blocks (the store's capacity now: it may grow while the unit runs).
    fn num_blocks(&self) -> u64;
    /// Read `len` bytes at `offset`, into `buf` (cleared and resized; a buffer of the
    /// transport's pool, handed back with the data).
    fn read(&self, offset: u64, len: usize, buf: Vec<u8>) -> Io<Vec<u8>>;
    /// Write `data` at `offset`; with `fua`, the data is durable when the write completes.
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> Io<()>;
    /// Make every completed write durable.
    fn flush(&self) -> Io<()>;
    /// Deallocate `len` bytes at `offset` (thin stores; they read back as zeros afterwards).
    /// Only called when [`thin`](Self::thin) is true.
    fn unmap(&self, offset: u64, len: u64) -> Io<()>;
    /// Write the one-block `block` repeatedly over `len` bytes at `offset`. The default says
    /// `Unsupported`, and the unit then writes the blocks itself.
    fn write_same(&self, offset: u64, len: u64, block: Bytes) -> Io<()> {
        let _ = (offset, len, block);
        Io::unsupported("WRITE SAME")
    }
    /// Compare the store's bytes at `offset` with `compare` and, only if they are equal, write
    /// `data` (as long as `compare`) there, atomically against every other writer of the store.
    /// Called only for lengths of at most [`compare_and_write_blocks`](Self::compare_and_write_blocks)
    /// blocks.
    fn compare_and_write(&self, offset: u64, compare: Bytes, data: Bytes) -> Io<Compared> {
        let _ = (offset, compare, data);
        Io::unsupported("COMPARE AND WRITE")
    }
    /// Most blocks one atomic [`compare_and_write`](Self::compare_and_write) takes: 0 (the
    /// default) when the store offers none, and the unit then refuses COMPARE AND WRITE (it is
    /// never emulated with a read and a write, which other writers could interleave).
    fn compare_and_write_blocks(&self) -> u8 {
        0
    }
    /// Whether UNMAP deallocates (thin provisioning).
    fn thin(&self) -> bool {
        false
    }
    /// The deallocation granularity in blocks (1 when every block is deallocated on its own).
    fn unmap_granularity(&self) -> u32 {
        1
    }
    /// Whether a completed write may sit in a volatile cache until [`flush`](Self::flush): the
    /// unit then reports a write cache (WCE=1). False (the default) means every completed write
    /// is durable, and the unit reports WCE=0 and does not let it be changed.
    fn write_back(&self) -> bool {
        false
    }
    /// Whether other processes write the store too (another gateway of one image). The unit
    /// then never emulates an atomic read-modify-write with its own locks.
    fn shared(&self) -> bool {
        false
    }
    /// Grow to `size` bytes (whole blocks). The default says `Unsupported`.
    fn resize(&self, size: u64) -> Io<()> {
        let _ = size;
        Io::unsupported("resizing")
    }
}

/// Wait for `f` on this thread (a blocking-pool thread: never a runtime worker). The future is
/// woken from wherever its operation completes.
pub fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

/// An [`AsyncBackend`] seen as a [`BlockBackend`] for the rare commands that run on the
/// blocking pool: each call waits for its operation there ([`block_on`]). Provisioning state
/// is not asked of the store: every block reports mapped (SBC-4: "mapped or unknown").
#[derive(Debug, Clone)]
pub struct BlockOn(pub Arc<dyn AsyncBackend>);

impl BlockBackend for BlockOn {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.0.num_blocks()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        let data = block_on(self.0.read(offset, buf.len(), Vec::new()))?;
        if data.len() != buf.len() {
            return Err(io::Error::other(format!("the store read {} bytes of {}", data.len(), buf.len())));
        }
        buf.copy_from_slice(&data);
        Ok(())
    }
    fn read_into(&self, offset: u64, len: usize, out: &mut Vec<u8>) -> io::Result<()> {
        let data = block_on(self.0.read(offset, len, std::mem::take(out)))?;
        if data.len() != len {
            return Err(io::Error::other(format!("the store read {} bytes of {len}", data.len())));
        }
        *out = data;
        Ok(())
    }
    fn write(&self, offset: u64, buf: &[u8]) -> io::Result<()> {
        block_on(self.0.write(offset, Bytes::copy_from_slice(buf), false))
    }
    fn flush(&self) -> io::Result<()> {
        block_on(self.0.flush())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        block_on(self.0.unmap(offset, len))
    }
    fn is_mapped(&self, _offset: u64) -> bool {
        true
    }
    fn mapping(&self, _offset: u64, len: u64) -> io::Result<(bool, u64)> {
        Ok((true, len))
    }
    fn thin(&self) -> bool {
        self.0.thin()
    }
    fn unmap_granularity(&self) -> u32 {
        self.0.unmap_granularity()
    }
    fn resize(&self, size: u64) -> io::Result<()> {
        block_on(self.0.resize(size))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_on_waits_for_a_completion_from_another_thread() {
        let (tx, rx) = tokio::sync::oneshot::channel::<u32>();
        std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(20));
            let _ = tx.send(7);
        });
        assert_eq!(block_on(rx).ok(), Some(7));
    }

    #[test]
    fn a_ready_operation_completes_once() {
        let mut io = Io::ready(Ok(5u8));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(matches!(Pin::new(&mut io).poll(&mut cx), Poll::Ready(Ok(5))));
        // Polled again (a caller's bug): an error, never a panic.
        assert!(matches!(Pin::new(&mut io).poll(&mut cx), Poll::Ready(Err(_))));
    }
}
