//! The rdma-core provider: real RDMA devices (RNICs, and the kernel's soft-RoCE `rxe` and
//! soft-iWARP `siw`) through libibverbs and librdmacm.
//!
//! The libraries are loaded at run time (rdma-mummy-sys), so a binary built with this module
//! starts on a machine without rdma-core or without RDMA devices, and [`RdmaCore::open`] then
//! answers [`Error::NoDevice`].
//!
//! This is the one module of riser that holds `unsafe` code; every block says why it is sound.
//! The rules it keeps:
//!
//! * **Lifetimes.** Objects are destroyed in the order verbs requires — memory windows, queue
//!   pair, connection id, completion queue, memory regions, protection domain — because each
//!   holds an `Arc` of what it was created from. A region owns its memory (or a chunk of a
//!   registered pool) and outlives the work requests that use it: the consumer keeps a handle
//!   until their completion or flush.
//! * **Events, not polling.** Completions are waited for on the completion channel's file
//!   descriptor (a tokio `AsyncFd`, or `poll(2)` for blocking waits); connection manager events
//!   on the event channel's descriptor, by one thread per connection that sleeps in `poll(2)`.
//! * **Keys.** Remotely accessible memory gets a fresh key per registration ([`KeyMode`]): memory
//!   windows bound over a pre-registered pool where the device has them (rxe, most RoCE and
//!   InfiniBand HCAs), `ibv_reg_mr` per registration where it has not (siw), or — only when asked
//!   for — a pre-registered pool with one fixed key per connection.
//! * **Driver traps** measured on rxe and siw (`shared/spec/RDMA-CORE-NOTES.md`) are guarded
//!   where they bite: at most `max_sge_rd` elements per RDMA Read (siw silently fills only the
//!   first of two); the invalidated key of a Send with Invalidate is put in both places siw's
//!   library may take it from; rxe's report of a remote invalidation (flag bit 2, not
//!   `IBV_WC_WITH_INV`) is understood; plain registrations on rxe cannot be invalidated by the
//!   peer, which [`Provider::remote_invalidation`] tells the consumer; siw's `RLIMIT_MEMLOCK`
//!   check names `ulimit -l` in its error; padded connection private data (rxe) is passed on
//!   whole, its first bytes being what the peer sent; siw sends a request of a page or more
//!   posted unsignaled straight from its registered memory (sendpage) and counts it complete
//!   once handed to TCP, so its pages may still wait in the socket when a later completion
//!   says it is done — such requests are posted signaled on siw (siw then copies them) and
//!   their completions kept from the consumer, for whom an unsignaled request's memory is
//!   free once a later request has completed, on every device.

#![allow(unsafe_code)]

mod cm;
mod cq;
mod mem;
mod queue;

pub use cm::{RcListener, RcRequest};
pub use cq::RcCq;
pub use mem::{RcMr, RcPd};
pub use queue::RcQp;

use crate::{ConnParam, Errno, Error, Established, Invalid, NoDevice, Provider, QpCaps, Result};
use rdma_mummy_sys as sys;
use std::ffi::CStr;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// How remotely accessible memory gets its keys.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KeyMode {
    /// Memory windows where the device binds type 2 windows, else a registration per region.
    #[default]
    Auto,
    /// Type 2 memory windows bound over a pool registered once per connection, on the
    /// connection's queue pair: a fresh key per region, valid on that connection only; the
    /// peer may invalidate it (Send with Invalidate). Data is copied into and out of the pool.
    MemoryWindows,
    /// `ibv_reg_mr` of the region's own memory, `ibv_dereg_mr` when it is revoked: a fresh
    /// key per region and no copy, but a registration's cost per region; the peer may not
    /// invalidate (rxe breaks the connection if it tries), so the consumer revokes keys itself.
    PerRegion,
    /// A pool registered once per connection with remote rights: every region of the connection
    /// shares the pool's one key for the connection's lifetime (weaker isolation: a peer can
    /// reach all of the connection's pool memory, not only the command's). Like Linux's
    /// `ib_iser always_register=N`. Only when asked for.
    FixedPool,
}

/// Settings of the rdma-core provider.
#[derive(Clone, Debug)]
pub struct RdmaCoreConfig {
    /// Key management.
    pub keys: KeyMode,
    /// Time allowed for address and route resolution, and for a connection to be established.
    pub setup_timeout: Duration,
    /// Most memory a connection's pools (local and remote) may register, in bytes. siw counts it
    /// against `RLIMIT_MEMLOCK`, even for root.
    pub pool_limit: usize,
}

impl Default for RdmaCoreConfig {
    fn default() -> Self {
        Self { keys: KeyMode::Auto, setup_timeout: Duration::from_secs(30), pool_limit: 512 << 20 }
    }
}

/// A raw pointer that may cross threads: libibverbs and librdmacm objects are thread-safe for the
/// calls made on them here (posting, polling, registration; a connection id's calls are
/// serialised by its owner).
#[derive(Debug)]
struct Ptr<T>(*mut T);

// SAFETY: see the type's documentation; the pointee is only used through rdma-core calls that
// the libraries document as thread-safe, or under a lock of ours.
unsafe impl<T> Send for Ptr<T> {}
// SAFETY: as above.
unsafe impl<T> Sync for Ptr<T> {}

impl<T> Clone for Ptr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Ptr<T> {}

/// The transport a device speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// InfiniBand or RoCE (rxe).
    InfiniBand,
    /// iWARP (siw, Chelsio, Intel).
    Iwarp,
}

/// One opened device, shared by everything created from it.
struct Device {
    /// librdmacm's device list (kept, so its contexts stay open).
    list: Ptr<*mut sys::ibv_context>,
    ctx: Ptr<sys::ibv_context>,
    name: String,
    attr: sys::ibv_device_attr,
    transport: Transport,
    /// rxe reports remote invalidation in flag bit 2 (see the module documentation).
    rxe: bool,
    /// siw transmits large unsignaled requests from their memory after completing them (see
    /// the module documentation): such requests are signaled, their completions kept here.
    siw: bool,
    keys: KeyMode,
    config: RdmaCoreConfig,
}

// SAFETY: `attr` is plain data; the pointers are `Ptr`s (see there).
unsafe impl Send for Device {}
// SAFETY: as above; nothing in a `Device` changes after it is opened.
unsafe impl Sync for Device {}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Device").field("name", &self.name).field("transport", &self.transport).field("keys", &self.keys).finish()
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and is freed once; everything created on
        // its contexts holds an Arc of this device, so none is left.
        unsafe { sys::rdma_free_devices(self.list.0) };
    }
}

/// The last OS error (errno) as an `io::Error`.
fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

/// The last OS error number (errno).
fn last_errno() -> Errno {
    Errno(errno().raw_os_error().unwrap_or(0))
}

/// An rdma-core call's failure: the call's name and errno.
fn os_err(call: &'static str) -> Error {
    let e = errno();
    match e.raw_os_error() {
        Some(n @ (libc::ENODEV | libc::ENOSYS | libc::EOPNOTSUPP)) if call == "rdma_create_event_channel" => {
            Error::NoDevice(NoDevice::Unavailable { call, errno: Errno(n) })
        }
        _ => Error::Io(std::io::Error::new(e.kind(), format!("{call}: {e}"))),
    }
}

/// The error of a call that returns an errno value (positive, or negative as siw's post
/// functions do).
fn ret_err(call: &str, ret: i32) -> Error {
    let e = std::io::Error::from_raw_os_error(ret.abs());
    Error::Io(std::io::Error::new(e.kind(), format!("{call}: {e}")))
}

/// Lock `m`, taking the data also when a thread panicked holding the lock.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Make a descriptor non-blocking, so the `get_*_event` calls on it never block.
fn set_nonblocking(fd: RawFd) -> Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL take and return plain flags.
    let rc = unsafe {
        let flags = libc::fcntl(fd, libc::F_GETFL);
        if flags < 0 { flags } else { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) }
    };
    if rc < 0 { Err(Error::Io(errno())) } else { Ok(()) }
}

/// Wait until `fd` is readable or `timeout` passed (`None`: forever); true if readable.
fn wait_readable(fds: &[RawFd], timeout: Option<Duration>) -> Vec<bool> {
    let mut p: Vec<libc::pollfd> = fds.iter().map(|&fd| libc::pollfd { fd, events: libc::POLLIN, revents: 0 }).collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: p is a valid array of p.len() pollfd structures.
    let n = unsafe { libc::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, ms) };
    if n <= 0 {
        return vec![false; fds.len()];
    }
    p.iter().map(|x| x.revents & (libc::POLLIN | libc::POLLERR | libc::POLLHUP) != 0).collect()
}

/// The rdma-core provider for one device (a [`Provider`]); cheap to clone.
#[derive(Clone, Debug)]
pub struct RdmaCore {
    dev: Arc<Device>,
}

impl RdmaCore {
    /// The device named `device` (e.g. `rxe0`), or the first device when `None`.
    pub fn open(device: Option<&str>, config: RdmaCoreConfig) -> Result<Self> {
        Self::open_with(config, |ctx, name| device.is_none_or(|d| d == name) && !ctx.is_null())
    }

    /// The device that owns the local address `ip` (where a target listens).
    pub fn for_address(ip: IpAddr, config: RdmaCoreConfig) -> Result<Self> {
        let ctx = cm::device_of_local_address(ip)?;
        Self::open_with(config, |c, _| c == ctx).map_err(|e| match e {
            Error::NoDevice(_) => Error::NoDevice(NoDevice::AddressNotLocal { ip, errno: None }),
            e => e,
        })
    }

    /// The device the route to `dest` leaves through (where an initiator connects from).
    pub fn for_destination(dest: SocketAddr, config: RdmaCoreConfig) -> Result<Self> {
        let ctx = cm::device_toward(dest, config.setup_timeout)?;
        Self::open_with(config, |c, _| c == ctx)
    }

    fn open_with(config: RdmaCoreConfig, mut pick: impl FnMut(*mut sys::ibv_context, &str) -> bool) -> Result<Self> {
        let mut n = 0;
        // SAFETY: rdma_get_devices writes the count and returns a NULL-terminated array it owns
        // (or NULL); the array is released with rdma_free_devices in Device::drop, or below.
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        if list.is_null() || n <= 0 {
            let errno = list.is_null().then(last_errno);
            if !list.is_null() {
                // SAFETY: the array came from rdma_get_devices and is not used after this.
                unsafe { sys::rdma_free_devices(list) };
            }
            return Err(Error::NoDevice(NoDevice::NoneListed { errno }));
        }
        let mut chosen = None;
        let mut names = Vec::new();
        for i in 0..n as usize {
            // SAFETY: i < n, the array holds n contexts.
            let ctx = unsafe { *list.add(i) };
            if ctx.is_null() {
                continue;
            }
            // SAFETY: an open context points to its device; the name is a NUL-terminated
            // string owned by libibverbs.
            let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name((*ctx).device)) }.to_string_lossy().into_owned();
            if chosen.is_none() && pick(ctx, &name) {
                chosen = Some((ctx, name.clone()));
            }
            names.push(name);
        }
        let Some((ctx, name)) = chosen else {
            // SAFETY: not used after this.
            unsafe { sys::rdma_free_devices(list) };
            return Err(Error::NoDevice(NoDevice::NotFound { available: names }));
        };
        // SAFETY: zeroed plain data is a valid ibv_device_attr; the context is open.
        let mut attr: sys::ibv_device_attr = unsafe { std::mem::zeroed() };
        // SAFETY: ctx is an open context, attr a valid out-pointer.
        let rc = unsafe { sys::ibv_query_device(ctx, &mut attr) };
        if rc != 0 {
            // SAFETY: not used after this.
            unsafe { sys::rdma_free_devices(list) };
            return Err(ret_err("ibv_query_device", rc));
        }
        // SAFETY: the context's device is valid while the context is open.
        let transport = if unsafe { (*(*ctx).device).transport_type } == sys::ibv_transport_type::IBV_TRANSPORT_IWARP {
            Transport::Iwarp
        } else {
            Transport::InfiniBand
        };
        let rxe = attr.vendor_id == 0x00ff_ffff || name.starts_with("rxe");
        // Linux siw's vendor id is "bmt" in ASCII.
        let siw = transport == Transport::Iwarp && (attr.vendor_id == 0x0062_6d74 || name.starts_with("siw"));
        let windows = attr.device_cap_flags & sys::ibv_device_cap_flags::IBV_DEVICE_MEM_WINDOW_TYPE_2B.0 != 0 && attr.max_mw > 0;
        let keys = match config.keys {
            KeyMode::Auto if windows => KeyMode::MemoryWindows,
            KeyMode::Auto => KeyMode::PerRegion,
            KeyMode::MemoryWindows if !windows => {
                // SAFETY: not used after this.
                unsafe { sys::rdma_free_devices(list) };
                return Err(Error::Invalid(Invalid::NoMemoryWindows { device: name }));
            }
            k => k,
        };
        Ok(Self { dev: Arc::new(Device { list: Ptr(list), ctx: Ptr(ctx), name, attr, transport, rxe, siw, keys, config }) })
    }

    /// The device's name (`rxe0`, `siw0`, `mlx5_0`...).
    pub fn device_name(&self) -> &str {
        &self.dev.name
    }

    /// The transport the device speaks.
    pub fn transport(&self) -> Transport {
        self.dev.transport
    }

    /// How this provider keys remotely accessible memory (never [`KeyMode::Auto`]).
    pub fn key_mode(&self) -> KeyMode {
        self.dev.keys
    }

    /// Most scatter/gather elements one RDMA Read may place (siw: 1).
    pub fn max_sge_rd(&self) -> u32 {
        self.dev.attr.max_sge_rd.max(1) as u32
    }
}

impl Provider for RdmaCore {
    type Pd = RcPd;
    type Cq = RcCq;
    type Qp = RcQp;
    type Listener = RcListener;
    type Request = RcRequest;

    fn name(&self) -> String {
        format!("rdma-core:{}", self.dev.name)
    }

    fn alloc_pd(&self) -> Result<Arc<RcPd>> {
        RcPd::new(&self.dev)
    }

    fn create_cq(&self, depth: u32) -> Result<Arc<RcCq>> {
        RcCq::new(&self.dev, depth)
    }

    fn listen(&self, addr: SocketAddr) -> Result<RcListener> {
        RcListener::new(&self.dev, addr)
    }

    fn create_qp(&self, dest: SocketAddr, pd: &Arc<RcPd>, send_cq: &Arc<RcCq>, recv_cq: &Arc<RcCq>, caps: QpCaps) -> Result<Arc<RcQp>> {
        let conn = cm::CmConn::resolve(&self.dev, dest)?;
        RcQp::create(&self.dev, conn, pd, send_cq, recv_cq, caps, Some(dest))
    }

    fn connect(&self, qp: &Arc<RcQp>, param: &ConnParam) -> Result<Established> {
        qp.connect(param)
    }

    fn remote_invalidation(&self) -> bool {
        self.dev.keys == KeyMode::MemoryWindows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a machine without RDMA devices (the development machines: no RDMA in their kernel),
    /// opening fails with a clear "no RDMA device", never a crash. Where devices exist (the lab
    /// VM), the lab's own tests cover them.
    #[test]
    fn no_device_is_a_clear_error() {
        let have_devices = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
        match RdmaCore::open(None, RdmaCoreConfig::default()) {
            Err(e @ Error::NoDevice(_)) => {
                assert!(!have_devices, "devices exist, yet: {e}");
                assert!(e.to_string().contains("no RDMA device"), "{e}");
            }
            Err(e) => panic!("expected NoDevice, got {e}"),
            Ok(p) => assert!(have_devices, "opened {} without any device in sysfs", p.device_name()),
        }
        if !have_devices {
            let e = RdmaCore::for_address("127.0.0.1".parse().unwrap(), RdmaCoreConfig::default()).unwrap_err();
            assert!(matches!(e, Error::NoDevice(_)), "{e}");
        }
    }
}
