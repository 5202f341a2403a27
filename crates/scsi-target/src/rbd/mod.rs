//! Ceph RBD images as asynchronous stores (feature `rbd`): [`RbdStore`] implements
//! [`AsyncBackend`] over a librbd image through riser-rbd, every operation an `rbd_aio_*`
//! completion that wakes the command's future (nothing blocks a thread per command).
//!
//! librbd's cache is off for every image opened here (`rbd_cache=false`): a write is
//! acknowledged once it is in the cluster, so the unit reports no write cache (WCE=0) and FUA
//! has nothing more to do. COMPARE AND WRITE is the cluster's atomic compare-and-write, which
//! librbd offers for one 512-byte sector only: it is offered on 512-byte-block images and
//! refused on others (never emulated with a read and a write another gateway could split).
//! A resize made in the cluster (by `rbd resize`, or another gateway) is seen through the
//! image's update watch and reported to every nexus as CAPACITY DATA HAS CHANGED.

mod gateway;

pub use gateway::{Gateway, GatewayConfig, GatewayStatus};

use crate::aio::{AsyncBackend, Compared, Io};
use crate::lu::LogicalUnit;
use bytes::Bytes;
use riser_rbd::{Cluster, ClusterOptions, CompareError, Image};
use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// How to reach a cluster: one connection per distinct (configuration, client id, keyring) is
/// shared by every image of the process.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct ClusterSpec {
    /// The Ceph configuration file (none: librados' own search).
    pub conf: Option<PathBuf>,
    /// The client id (none: `admin`).
    pub id: Option<String>,
    /// The keyring file (none: the configuration's).
    pub keyring: Option<PathBuf>,
}

/// The process's cluster connections, by how they were made.
fn clusters() -> &'static Mutex<HashMap<ClusterSpec, Weak<Cluster>>> {
    static CLUSTERS: OnceLock<Mutex<HashMap<ClusterSpec, Weak<Cluster>>>> = OnceLock::new();
    CLUSTERS.get_or_init(Mutex::default)
}

/// A connection to the cluster `spec` names: the process's existing one, or a new one.
pub fn connect(spec: &ClusterSpec) -> io::Result<Arc<Cluster>> {
    let mut all = clusters().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(c) = all.get(spec).and_then(Weak::upgrade) {
        return Ok(c);
    }
    let opts = ClusterOptions {
        conf: spec.conf.clone(),
        client_id: spec.id.clone(),
        keyring: spec.keyring.clone(),
        // No write-back cache: an acknowledged write is in the cluster. Partial discards zero what
        // they cannot deallocate (librbd skips them by default, leaving the old data), so
        // unmapped blocks read as zeros (LBPRZ=1).
        options: vec![("rbd_cache".into(), "false".into()), ("rbd_skip_partial_discard".into(), "false".into())],
        // librbd's threads do not preempt the gateway's on every request and completion.
        batch_threads: true,
    };
    let c = Cluster::connect(&opts).map_err(to_io)?;
    all.retain(|_, w| w.strong_count() > 0);
    all.insert(spec.clone(), Arc::downgrade(&c));
    Ok(c)
}

fn to_io(e: riser_rbd::Error) -> io::Error {
    match e.errno() {
        Some(errno) => io::Error::from_raw_os_error(errno.abs()),
        None => io::Error::other(e.to_string()),
    }
}

/// An RBD image as a unit's store.
#[derive(Debug)]
pub struct RbdStore {
    cluster: Arc<Cluster>,
    /// The I/O context of the image's pool (and namespace).
    ioctx: riser_rbd::Ioctx,
    image: Arc<Image>,
    block_size: u32,
    /// The image's size in bytes, as last seen (refreshed by the update watch).
    size: AtomicU64,
    /// Where a size change is told (the unit over the store).
    unit: OnceLock<Weak<LogicalUnit>>,
    /// The cluster refused an operation because this client is blocklisted (fenced by another
    /// gateway): nothing this process sends reaches the image again.
    fenced: Arc<AtomicBool>,
    _updates: Mutex<Option<riser_rbd::UpdateWatch>>,
}

impl RbdStore {
    /// Open `pool[/namespace]/image` on `cluster` with `block_size`-byte blocks.
    pub fn open(cluster: &Arc<Cluster>, pool: &str, namespace: &str, image: &str, block_size: u32) -> io::Result<Arc<Self>> {
        let ioctx = cluster.ioctx_in(pool, namespace).map_err(to_io)?;
        let image = Arc::new(Image::open(&ioctx, image).map_err(to_io)?);
        let size = image.size().map_err(to_io)?;
        let store = Arc::new(Self {
            cluster: cluster.clone(),
            ioctx: ioctx.clone(),
            image: image.clone(),
            block_size,
            size: AtomicU64::new(size),
            unit: OnceLock::new(),
            fenced: Arc::default(),
            _updates: Mutex::new(None),
        });
        let weak = Arc::downgrade(&store);
        let watch = image
            .watch_updates(move || {
                if let Some(s) = weak.upgrade() {
                    s.refresh();
                }
            })
            .map_err(to_io)?;
        *store._updates.lock().unwrap_or_else(|e| e.into_inner()) = Some(watch);
        Ok(store)
    }

    /// Tell `unit` of size changes made in the cluster (CAPACITY DATA HAS CHANGED).
    pub fn report_to(&self, unit: &Arc<LogicalUnit>) {
        let _ = self.unit.set(Arc::downgrade(unit));
    }

    /// The librbd image.
    pub fn image(&self) -> &Arc<Image> {
        &self.image
    }

    /// The I/O context of the image's pool and namespace.
    pub fn ioctx(&self) -> &riser_rbd::Ioctx {
        &self.ioctx
    }

    /// The cluster this store's image is reached through.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.cluster
    }

    /// Whether the cluster has refused this client (blocklisted: fenced by another gateway).
    pub fn fenced(&self) -> bool {
        self.fenced.load(Ordering::Acquire)
    }

    /// `f`'s result as an `io::Error`, noting a blocklisted client.
    fn done<T: Send + 'static>(&self, f: impl Future<Output = Result<T, riser_rbd::Error>> + Send + 'static) -> Io<T> {
        let fenced = self.fenced.clone();
        Io::pending(async move {
            f.await.map_err(|e| {
                if e.is_blocklisted() && !fenced.swap(true, Ordering::AcqRel) {
                    tracing::error!("this gateway's Ceph client is blocklisted (fenced by another gateway): its I/O fails from now on");
                }
                to_io(e)
            })
        })
    }

    /// Read the image's size again; a change is a unit attention.
    fn refresh(&self) {
        let Ok(now) = self.image.size() else { return };
        let before = self.size.swap(now, Ordering::AcqRel);
        if before / u64::from(self.block_size) != now / u64::from(self.block_size) {
            tracing::info!(before, now, "an RBD image changed size in the cluster");
            if let Some(unit) = self.unit.get().and_then(Weak::upgrade) {
                unit.capacity_changed();
            }
        }
    }
}

impl AsyncBackend for RbdStore {
    fn block_size(&self) -> u32 {
        self.block_size
    }
    fn num_blocks(&self) -> u64 {
        self.size.load(Ordering::Acquire) / u64::from(self.block_size)
    }
    fn read(&self, offset: u64, len: usize, buf: Vec<u8>) -> Io<Vec<u8>> {
        self.done(self.image.read(offset, len, buf))
    }
    fn write(&self, offset: u64, data: Bytes, fua: bool) -> Io<()> {
        self.done(self.image.write(offset, data, fua))
    }
    fn flush(&self) -> Io<()> {
        self.done(self.image.flush())
    }
    fn unmap(&self, offset: u64, len: u64) -> Io<()> {
        self.done(self.image.discard(offset, len))
    }
    fn write_same(&self, offset: u64, len: u64, block: Bytes) -> Io<()> {
        if block.iter().all(|&b| b == 0) {
            return self.done(self.image.write_zeroes(offset, len as usize));
        }
        self.done(self.image.write_same(offset, len as usize, block))
    }
    fn compare_and_write(&self, offset: u64, compare: Bytes, data: Bytes) -> Io<Compared> {
        let f = self.image.compare_and_write(offset, compare, data);
        Io::pending(async move {
            match f.await {
                Ok(()) => Ok(Compared::Written),
                // riser-rbd reports the mismatch's offset within the compared range.
                Err(CompareError::Mismatch { offset: at }) => Ok(Compared::Mismatch(at)),
                Err(CompareError::Io(e)) => Err(to_io(e)),
            }
        })
    }
    fn compare_and_write_blocks(&self) -> u8 {
        // librbd compares and writes atomically only 512 bytes inside one 512-byte sector.
        u8::from(self.block_size == 512)
    }
    fn thin(&self) -> bool {
        true
    }
    fn shared(&self) -> bool {
        true
    }
    fn resize(&self, size: u64) -> Io<()> {
        let bs = u64::from(self.block_size);
        let cur = self.size.load(Ordering::Acquire);
        if size / bs * bs < cur {
            return Io::ready(Err(io::Error::new(io::ErrorKind::InvalidInput, "stores only grow")));
        }
        let r = self.image.resize(size / bs * bs).map_err(to_io);
        if r.is_ok() {
            // The unit that asked reports the change itself: the update watch then finds none.
            self.size.fetch_max(size / bs * bs, Ordering::AcqRel);
        }
        Io::ready(r)
    }
}
