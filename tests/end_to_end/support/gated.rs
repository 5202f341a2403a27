//! A RAM disk whose I/O the test controls: a command the target is still executing.

use riser::target::aio::{AsyncBackend, Io};
use riser::target::backend::{BlockBackend, RamBackend};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// A 64 MiB RAM disk on the blocking pool (not in memory, as a file would be) whose writes can
/// be held at a gate, and which counts writes waiting and done, and reads running at once (each
/// read takes 150 ms).
#[derive(Debug)]
pub(crate) struct Gated {
    ram: RamBackend,
    hold: Mutex<bool>,
    moved: Condvar,
    pub(crate) writes_waiting: AtomicUsize,
    pub(crate) writes_done: AtomicUsize,
    reads_now: AtomicUsize,
    pub(crate) reads_max: AtomicUsize,
    read_pause: Duration,
    /// Reads held at a gate of their own (see [`Gated::hold_reads`]), and how many wait there.
    reads_held: Mutex<bool>,
    reads_moved: Condvar,
    reads_waiting: AtomicUsize,
    /// Says it is in memory: its commands then run in their tasks, not on the blocking pool.
    memory: bool,
}

impl Gated {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self {
            ram: RamBackend::new(64 << 20, 512),
            hold: Mutex::new(false),
            moved: Condvar::new(),
            writes_waiting: AtomicUsize::new(0),
            writes_done: AtomicUsize::new(0),
            reads_now: AtomicUsize::new(0),
            reads_max: AtomicUsize::new(0),
            read_pause: Duration::from_millis(150),
            reads_held: Mutex::new(false),
            reads_moved: Condvar::new(),
            reads_waiting: AtomicUsize::new(0),
            memory: false,
        })
    }

    /// The same, saying it is in memory (commands run its calls in their own tasks, as they do
    /// a RAM disk's): a held write stands for a long one, a WRITE SAME over many blocks.
    pub(crate) fn in_memory() -> Arc<Self> {
        let mut g = Arc::into_inner(Self::new()).expect("just made");
        g.memory = true;
        Arc::new(g)
    }

    /// Hold writes at the gate (`true`) or let them through.
    pub(crate) fn hold(&self, on: bool) {
        *self.hold.lock().unwrap() = on;
        self.moved.notify_all();
    }

    /// Hold reads (after their pause) at their gate (`true`) or let them through. Only for a
    /// store off memory (`new`): a read runs on the blocking pool there.
    pub(crate) fn hold_reads(&self, on: bool) {
        *self.reads_held.lock().unwrap() = on;
        self.reads_moved.notify_all();
    }

    /// Reads waiting at their gate.
    pub(crate) fn reads_waiting(&self) -> usize {
        self.reads_waiting.load(Ordering::SeqCst)
    }

    pub(crate) fn waiting(&self) -> usize {
        self.writes_waiting.load(Ordering::SeqCst)
    }

    pub(crate) fn done(&self) -> usize {
        self.writes_done.load(Ordering::SeqCst)
    }
}

impl BlockBackend for Gated {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        let now = self.reads_now.fetch_add(1, Ordering::SeqCst) + 1;
        self.reads_max.fetch_max(now, Ordering::SeqCst);
        std::thread::sleep(self.read_pause);
        {
            self.reads_waiting.fetch_add(1, Ordering::SeqCst);
            let mut held = self.reads_held.lock().unwrap();
            while *held {
                held = self.reads_moved.wait(held).unwrap();
            }
            self.reads_waiting.fetch_sub(1, Ordering::SeqCst);
        }
        self.reads_now.fetch_sub(1, Ordering::SeqCst);
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.writes_waiting.fetch_add(1, Ordering::SeqCst);
        let wait = || {
            let mut held = self.hold.lock().unwrap();
            while *held {
                held = self.moved.wait(held).unwrap();
            }
        };
        // A store in memory is called on a runtime worker, and never blocks for long; held, this
        // one would keep its worker, and the runtime's I/O and timer driver with it if that
        // worker had it last: the test's own timers and sockets would wait for the write they
        // are to release. Blocking in place hands the worker's other work to another thread,
        // while the command's task stays inside its poll, as it does in a long write.
        let multi_thread =
            tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
        if self.memory && multi_thread {
            tokio::task::block_in_place(wait);
        } else {
            wait();
        }
        self.writes_waiting.fetch_sub(1, Ordering::SeqCst);
        let r = self.ram.write(offset, buf);
        self.writes_done.fetch_add(1, Ordering::SeqCst);
        r
    }
    fn flush(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.ram.unmap(offset, len)
    }
    fn is_mapped(&self, offset: u64) -> bool {
        self.ram.is_mapped(offset)
    }
    fn thin(&self) -> bool {
        false
    }
    fn in_memory(&self) -> bool {
        self.memory
    }
}

/// [`Gated`] as an asynchronous store: each operation completes on a thread of its own, as a
/// cluster's completions do, and the command's future is woken from there.
#[derive(Debug, Clone)]
pub(crate) struct AsyncGated(pub(crate) Arc<Gated>);

impl AsyncGated {
    fn later<T: Send + 'static>(&self, f: impl FnOnce(&Gated) -> std::io::Result<T> + Send + 'static) -> Io<T> {
        let (g, (tx, rx)) = (self.0.clone(), tokio::sync::oneshot::channel());
        std::thread::spawn(move || {
            let _ = tx.send(f(&g));
        });
        Io::pending(async move { rx.await.unwrap_or_else(|_| Err(std::io::Error::other("completion lost"))) })
    }
}

impl AsyncBackend for AsyncGated {
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.0.num_blocks()
    }
    fn read(&self, offset: u64, len: usize, mut buf: Vec<u8>) -> Io<Vec<u8>> {
        self.later(move |g| {
            buf.resize(len, 0);
            g.ram.read(offset, &mut buf).map(|()| buf)
        })
    }
    fn write(&self, offset: u64, data: bytes::Bytes, _fua: bool) -> Io<()> {
        self.later(move |g| g.write(offset, &data))
    }
    fn flush(&self) -> Io<()> {
        Io::ready(Ok(()))
    }
    fn unmap(&self, offset: u64, len: u64) -> Io<()> {
        self.later(move |g| g.unmap(offset, len))
    }
}
