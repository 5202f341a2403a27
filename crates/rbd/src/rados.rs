//! librados: the cluster connection, pool I/O contexts, object watch/notify.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use crate::ffi;
use crate::{ClusterOptions, Error, Notify, NotifyReplies};

/// A C string from a Rust one; `what` names the argument in the error.
pub(crate) fn cstring(s: &str, what: &'static str) -> Result<CString, Error> {
    CString::new(s).map_err(|_| Error::InvalidName(what))
}

fn cpath(p: &Path, what: &'static str) -> Result<CString, Error> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| Error::InvalidName(what))
}

/// A connection to a Ceph cluster (`rados_t`). Shared through `Arc`: every [`Ioctx`] and image
/// keeps it alive; `rados_shutdown` runs when the last one goes.
pub struct Cluster {
    handle: ffi::rados_t,
    /// Images opened through it start librbd's threads as batch threads
    /// ([`ClusterOptions::batch_threads`]).
    pub(crate) batch_threads: bool,
}

// SAFETY: a connected rados_t is documented thread-safe (librados' RadosClient serializes its
// state internally); the binding never hands out the raw pointer.
unsafe impl Send for Cluster {}
// SAFETY: as above; all methods take &self and librados synchronizes concurrent calls.
unsafe impl Sync for Cluster {}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("instance_id", &self.instance_id()).finish()
    }
}

/// Defaults set before the caller's options (which override them): connecting must not hang
/// for ever when the monitors are gone.
const DEFAULT_OPTIONS: &[(&str, &str)] = &[("client_mount_timeout", "10"), ("rados_mon_op_timeout", "30")];

impl Cluster {
    /// Connects: `rados_create2` (cluster "ceph", `client.<client_id>`), reads the configuration,
    /// sets the keyring, the binding's timeouts and `opts.options`, then `rados_connect`.
    /// Blocks for up to `client_mount_timeout` (10 s unless overridden).
    pub fn connect(opts: &ClusterOptions) -> Result<Arc<Self>, Error> {
        let name = cstring(&format!("client.{}", opts.client_id()), "client_id")?;
        let conf = opts.conf.as_deref().map(|p| cpath(p, "conf")).transpose()?;
        let keyring = opts.keyring.as_deref().map(|p| cpath(p, "keyring")).transpose()?;
        let mut settings: Vec<(CString, CString)> = Vec::new();
        for (k, v) in DEFAULT_OPTIONS {
            settings.push((cstring(k, "option")?, cstring(v, "option")?));
        }
        if let Some(k) = keyring {
            settings.push((cstring("keyring", "option")?, k));
        }
        for (k, v) in &opts.options {
            settings.push((cstring(k, "option")?, cstring(v, "option value")?));
        }

        // librados starts its threads in rados_create2 and rados_connect, from this thread.
        let _batch = opts.batch_threads.then(crate::sched::BatchScope::enter);
        let mut handle: ffi::rados_t = ptr::null_mut();
        // SAFETY: out-pointer to a local; the strings are NUL-terminated and outlive the call.
        let r = unsafe { ffi::rados_create2(&mut handle, c"ceph".as_ptr(), name.as_ptr(), 0) };
        Error::check("rados_create2", r.into())?;
        // From here on `cluster`'s Drop (rados_shutdown) frees the handle on every error path;
        // librados allows shutting down a handle that never connected.
        let cluster = Self { handle, batch_threads: opts.batch_threads };
        let conf_ptr = conf.as_ref().map_or(ptr::null(), |c| c.as_ptr());
        // SAFETY: valid handle; the path is NUL-terminated or NULL (default search).
        let r = unsafe { ffi::rados_conf_read_file(cluster.handle, conf_ptr) };
        // Without an explicit file a missing default configuration is not fatal: options may
        // carry `mon_host` and `key`.
        if conf.is_some() || r != -crate::error::ENOENT {
            Error::check("rados_conf_read_file", r.into())?;
        }
        for (k, v) in &settings {
            // SAFETY: valid handle; both strings NUL-terminated and alive for the call.
            let r = unsafe { ffi::rados_conf_set(cluster.handle, k.as_ptr(), v.as_ptr()) };
            Error::check("rados_conf_set", r.into())?;
        }
        // SAFETY: valid, configured handle.
        let r = unsafe { ffi::rados_connect(cluster.handle) };
        Error::check("rados_connect", r.into())?;
        Ok(Arc::new(cluster))
    }

    /// A configuration value as this client sees it (`rados_conf_get`), e.g. `"rbd_cache"`.
    pub fn conf_get(&self, key: &str) -> Result<String, Error> {
        let key = cstring(key, "option")?;
        let mut cap = 256usize;
        loop {
            let mut buf = vec![0u8; cap];
            // SAFETY: valid handle; key NUL-terminated; buf writable for cap bytes.
            let r = unsafe { ffi::rados_conf_get(self.handle, key.as_ptr(), buf.as_mut_ptr().cast(), cap) };
            if r == -36 /* ENAMETOOLONG: buffer too small */ && cap < 1 << 20 {
                cap *= 4;
                continue;
            }
            Error::check("rados_conf_get", r.into())?;
            let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
            return Ok(String::from_utf8_lossy(&buf[..end]).into_owned());
        }
    }

    /// This client's global id (`client.<id>`); also the `notifier_id` watchers see.
    pub fn instance_id(&self) -> u64 {
        // SAFETY: connected handle.
        unsafe { ffi::rados_get_instance_id(self.handle) }
    }

    /// This client's messenger address(es) as librados prints them (`rados_getaddrs`), e.g.
    /// `127.0.0.1:0/3245012345`, or an address vector `[v2:…,v1:…]` on some setups. What
    /// [`Cluster::blocklist_add`] of another client wants: pass [`Cluster::blocklist_address`].
    pub fn address(&self) -> Result<String, Error> {
        let mut out: *mut c_char = ptr::null_mut();
        // SAFETY: connected handle; out-pointer to a local.
        let r = unsafe { ffi::rados_getaddrs(self.handle, &mut out) };
        Error::check("rados_getaddrs", r.into())?;
        if out.is_null() {
            return Err(Error::Malformed("rados_getaddrs"));
        }
        // SAFETY: librados returned a NUL-terminated string (strdup) that we own.
        let s = unsafe { CStr::from_ptr(out) }.to_string_lossy().into_owned();
        // SAFETY: librados allocated it with strdup (malloc): ours to free, exactly once.
        unsafe { libc::free(out.cast()) };
        Ok(s)
    }

    /// The address to blocklist this client with: the first entry of [`Cluster::address`]
    /// without its `v1:`/`v2:` tag and brackets (`IP:port/nonce`).
    pub fn blocklist_address(&self) -> Result<String, Error> {
        Ok(strip_addrvec(&self.address()?))
    }

    /// Blocklists a client address for `expire_secs` seconds (0: the OSDs' default, one hour),
    /// `rados_blocklist_add`. A blocklisted client's OSD operations fail with `-EBLOCKLISTED`
    /// (`-ESHUTDOWN`) from then on. Needs `osd blocklist` capability (admin has it).
    pub fn blocklist_add(&self, addr: &str, expire_secs: u32) -> Result<(), Error> {
        // librados declares the argument `char *` (not const): hand it a private copy.
        let mut bytes = cstring(addr, "addr")?.into_bytes_with_nul();
        // SAFETY: connected handle; a NUL-terminated buffer we own, alive for the call.
        let r = unsafe { ffi::rados_blocklist_add(self.handle, bytes.as_mut_ptr().cast(), expire_secs) };
        Error::check("rados_blocklist_add", r.into()).map(drop)
    }

    /// Opens an I/O context on a pool (`rados_ioctx_create`).
    pub fn ioctx(self: &Arc<Self>, pool: &str) -> Result<Ioctx, Error> {
        self.ioctx_in(pool, "")
    }

    /// Opens an I/O context on a pool, in one of its RADOS namespaces (`""`: the default one).
    /// The namespace is set before the context is shared, so every clone stays in it.
    pub fn ioctx_in(self: &Arc<Self>, pool: &str, namespace: &str) -> Result<Ioctx, Error> {
        let name = cstring(pool, "pool")?;
        let ns = cstring(namespace, "namespace")?;
        let mut io: ffi::rados_ioctx_t = ptr::null_mut();
        // SAFETY: connected handle, NUL-terminated name, out-pointer to a local.
        let r = unsafe { ffi::rados_ioctx_create(self.handle, name.as_ptr(), &mut io) };
        Error::check("rados_ioctx_create", r.into())?;
        let inner = IoctxInner { handle: io, cluster: Arc::clone(self) };
        if !namespace.is_empty() {
            // SAFETY: the context was just created and is not shared yet; librados copies the
            // NUL-terminated name.
            unsafe { ffi::rados_ioctx_set_namespace(inner.handle, ns.as_ptr()) };
        }
        Ok(Ioctx { inner: Arc::new(inner) })
    }

    /// The cluster's fsid (`rados_cluster_fsid`): the same for every client of the cluster.
    pub fn fsid(&self) -> Result<String, Error> {
        // 36 characters and the NUL.
        let mut buf = [0u8; 64];
        // SAFETY: connected handle; buf writable for its length.
        let r = unsafe { ffi::rados_cluster_fsid(self.handle, buf.as_mut_ptr().cast(), buf.len()) };
        Error::check("rados_cluster_fsid", r.into())?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
    }
}

/// `[v2:127.0.0.1:0/123,v1:127.0.0.1:0/123]` → `127.0.0.1:0/123`; plain addresses unchanged.
fn strip_addrvec(s: &str) -> String {
    let s = s.trim().trim_start_matches('[').trim_end_matches(']');
    let first = s.split(',').next().unwrap_or(s);
    first.strip_prefix("v2:").or_else(|| first.strip_prefix("v1:")).or_else(|| first.strip_prefix("any:")).unwrap_or(first).to_string()
}

impl Drop for Cluster {
    fn drop(&mut self) {
        // SAFETY: the handle came from rados_create2 and every Ioctx/Image/Watch holding it
        // is gone (they keep an Arc). rados_shutdown also flushes watch callbacks.
        unsafe { ffi::rados_shutdown(self.handle) };
    }
}

pub(crate) struct IoctxInner {
    pub(crate) handle: ffi::rados_ioctx_t,
    pub(crate) cluster: Arc<Cluster>,
}

// SAFETY: librados I/O contexts may be used from several threads at once (IoCtxImpl locks its
// own state); the pointer is never handed out.
unsafe impl Send for IoctxInner {}
// SAFETY: as above.
unsafe impl Sync for IoctxInner {}

impl Drop for IoctxInner {
    fn drop(&mut self) {
        // SAFETY: created by rados_ioctx_create; every Watch/Image using it holds an Arc to
        // this, so none is left; Watch's Drop already unwatched and flushed.
        unsafe { ffi::rados_ioctx_destroy(self.handle) };
    }
}

/// An I/O context on one pool. Cheap to clone (shared).
#[derive(Clone)]
pub struct Ioctx {
    pub(crate) inner: Arc<IoctxInner>,
}

impl std::fmt::Debug for Ioctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ioctx").finish_non_exhaustive()
    }
}

impl Ioctx {
    /// The cluster this context belongs to.
    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.inner.cluster
    }

    /// Replaces an object's content (creating it), `rados_write_full`. With an empty `data`
    /// this just makes sure the object exists (e.g. before watching it).
    pub fn write_full(&self, oid: &str, data: &[u8]) -> Result<(), Error> {
        let oid = cstring(oid, "oid")?;
        // SAFETY: valid ioctx; oid NUL-terminated; data valid for data.len() bytes.
        let r = unsafe { ffi::rados_write_full(self.inner.handle, oid.as_ptr(), data.as_ptr().cast(), data.len()) };
        Error::check("rados_write_full", r.into()).map(drop)
    }

    /// An object's content, up to `max` bytes (`rados_read`); `None` if the object does not
    /// exist.
    pub fn read(&self, oid: &str, max: usize) -> Result<Option<Vec<u8>>, Error> {
        let oid = cstring(oid, "oid")?;
        let mut buf = vec![0u8; max];
        // SAFETY: valid ioctx; oid NUL-terminated; buf writable for its length.
        let r = unsafe { ffi::rados_read(self.inner.handle, oid.as_ptr(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if r == -crate::ENOENT {
            return Ok(None);
        }
        let n = Error::check("rados_read", r.into())? as usize;
        buf.truncate(n.min(max));
        Ok(Some(buf))
    }

    /// Takes the exclusive advisory lock `name` on an object for `cookie`
    /// (`rados_lock_exclusive`), for at most `duration` (it expires then if its holder is gone).
    /// `-EBUSY` while another holds it, `-EEXIST` if this client holds it with this cookie.
    pub fn lock_exclusive(&self, oid: &str, name: &str, cookie: &str, duration: Duration) -> Result<(), Error> {
        let (oid, name, cookie, desc) =
            (cstring(oid, "oid")?, cstring(name, "name")?, cstring(cookie, "cookie")?, cstring("riser", "desc")?);
        let mut tv =
            libc::timeval { tv_sec: duration.as_secs() as libc::time_t, tv_usec: libc::suseconds_t::from(duration.subsec_micros() as i32) };
        // SAFETY: valid ioctx; every string NUL-terminated and alive for the call; tv a local.
        let r = unsafe {
            ffi::rados_lock_exclusive(self.inner.handle, oid.as_ptr(), name.as_ptr(), cookie.as_ptr(), desc.as_ptr(), &mut tv, 0)
        };
        Error::check("rados_lock_exclusive", r.into()).map(drop)
    }

    /// Releases a lock taken with [`Ioctx::lock_exclusive`] (`rados_unlock`).
    pub fn unlock(&self, oid: &str, name: &str, cookie: &str) -> Result<(), Error> {
        let (oid, name, cookie) = (cstring(oid, "oid")?, cstring(name, "name")?, cstring(cookie, "cookie")?);
        // SAFETY: valid ioctx; every string NUL-terminated and alive for the call.
        let r = unsafe { ffi::rados_unlock(self.inner.handle, oid.as_ptr(), name.as_ptr(), cookie.as_ptr()) };
        Error::check("rados_unlock", r.into()).map(drop)
    }

    /// Watches an object (which must exist, see [`Ioctx::write_full`]) with the OSDs' default
    /// watch timeout (`osd_client_watch_timeout`, 30 s). See [`Ioctx::watch_with_timeout`].
    pub fn watch(&self, oid: &str, callback: impl Fn(Notify) -> Vec<u8> + Send + Sync + 'static) -> Result<Watch, Error> {
        self.watch_with_timeout(oid, 0, callback)
    }

    /// Watches an object (`rados_watch3`). Every notification calls `callback` on a librados
    /// thread (one at a time per client: a slow callback delays the others); what it returns
    /// is the acknowledgement payload (`rados_notify_ack`), which the notifier sees in
    /// [`NotifyReplies::acks`]. `timeout_secs`: how long the OSD keeps the watch after losing
    /// this client (0: the OSD default, 30 s) — how quickly a notifier sees a dead watcher as
    /// a timeout instead of waiting on it.
    ///
    /// Dropping the [`Watch`] unwatches and waits for running callbacks (`rados_watch_flush`),
    /// so the callback never runs after the drop; do not drop a `Watch` inside its own
    /// callback (that would wait for itself).
    pub fn watch_with_timeout(
        &self,
        oid: &str,
        timeout_secs: u32,
        callback: impl Fn(Notify) -> Vec<u8> + Send + Sync + 'static,
    ) -> Result<Watch, Error> {
        self.register_watch(oid, timeout_secs, WatchFn::Reply(Box::new(callback)))
    }

    /// Watches an object as [`Ioctx::watch_with_timeout`] does, for a watcher that answers a
    /// notification later: `callback` gets it with the [`PendingAck`] to give (from any thread,
    /// once its work is done; the notifier waits for it until its own timeout). The callback
    /// itself should return quickly: librados delivers this client's notifications one at a
    /// time on its thread.
    pub fn watch_acking_later(
        &self,
        oid: &str,
        timeout_secs: u32,
        callback: impl Fn(Notify, PendingAck) + Send + Sync + 'static,
    ) -> Result<Watch, Error> {
        self.register_watch(oid, timeout_secs, WatchFn::Later(Box::new(callback)))
    }

    fn register_watch(&self, oid: &str, timeout_secs: u32, callback: WatchFn) -> Result<Watch, Error> {
        let oid_c = cstring(oid, "oid")?;
        let ctx = Box::new(WatchCtx { callback, ioctx: Arc::clone(&self.inner), oid: oid_c, error: AtomicI32::new(0) });
        let arg = Box::into_raw(ctx);
        let mut cookie = 0u64;
        // SAFETY: valid ioctx; `arg` points to a WatchCtx that stays alive (owned by the
        // returned Watch) until after rados_unwatch2 + rados_watch_flush; the callbacks match
        // the C typedefs.
        let r = unsafe {
            ffi::rados_watch3(self.inner.handle, (*arg).oid.as_ptr(), &mut cookie, watch_cb, watch_err_cb, timeout_secs, arg.cast())
        };
        if r < 0 {
            // SAFETY: the watch was not registered, so librados holds no pointer to arg;
            // reclaim the box we leaked above.
            drop(unsafe { Box::from_raw(arg) });
            return Err(Error::Rados { op: "rados_watch3", errno: r });
        }
        Ok(Watch { ioctx: Arc::clone(&self.inner), cookie, ctx: arg })
    }

    /// Notifies every watcher of an object (`rados_notify2`) and waits — blocking the calling
    /// thread — until all have acknowledged or the timeout has passed. A timeout is not an
    /// error here: watchers that did not answer are listed in [`NotifyReplies::timeouts`]
    /// (librados returns `-ETIMEDOUT` with a filled reply buffer).
    ///
    /// The OSD counts the timeout in whole seconds (librados divides `timeout_ms` by 1000, and
    /// 0 means the OSD default `osd_default_notify_timeout`, 30 s; measured: 500 ms waited
    /// for a 1.5 s watcher). The binding therefore rounds `timeout_ms` up to whole seconds;
    /// `0` still means the OSD default.
    pub fn notify(&self, oid: &str, payload: &[u8], timeout_ms: u64) -> Result<NotifyReplies, Error> {
        let timeout_ms = timeout_ms.div_ceil(1000).saturating_mul(1000);
        let oid = cstring(oid, "oid")?;
        let len = c_int::try_from(payload.len()).map_err(|_| Error::InvalidArgument("notify payload longer than i32::MAX"))?;
        let mut reply: *mut c_char = ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: valid ioctx, oid NUL-terminated, payload valid for len bytes, out-pointers
        // to locals.
        let r = unsafe {
            ffi::rados_notify2(self.inner.handle, oid.as_ptr(), payload.as_ptr().cast(), len, timeout_ms, &mut reply, &mut reply_len)
        };
        let parsed = if reply.is_null() {
            None
        } else {
            // SAFETY: librados returned a buffer of reply_len bytes that we own until freed.
            let bytes = unsafe { std::slice::from_raw_parts(reply.cast::<u8>(), reply_len) };
            let parsed = NotifyReplies::parse(bytes);
            // SAFETY: the reply buffer is freed exactly once, with the function librados.h names.
            unsafe { ffi::rados_buffer_free(reply) };
            parsed
        };
        if r < 0 && !(r == -crate::error::ETIMEDOUT && parsed.is_some()) {
            return Err(Error::Rados { op: "rados_notify2", errno: r });
        }
        parsed.ok_or(Error::Malformed("rados_notify2"))
    }
}

/// A watch's callback: one that answers at once, or one that acknowledges later.
enum WatchFn {
    Reply(Box<dyn Fn(Notify) -> Vec<u8> + Send + Sync>),
    Later(Box<dyn Fn(Notify, PendingAck) + Send + Sync>),
}

struct WatchCtx {
    callback: WatchFn,
    ioctx: Arc<IoctxInner>,
    oid: CString,
    error: AtomicI32,
}

/// The acknowledgement of a notification a watcher owes ([`Ioctx::watch_acking_later`]): sent
/// with [`PendingAck::ack`], from any thread; dropped unsent, it acknowledges with an empty
/// payload (a notifier never waits on a watcher that forgot).
pub struct PendingAck {
    ioctx: Arc<IoctxInner>,
    oid: CString,
    notify_id: u64,
    cookie: u64,
    sent: bool,
}

impl std::fmt::Debug for PendingAck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingAck").field("notify_id", &self.notify_id).field("cookie", &self.cookie).finish_non_exhaustive()
    }
}

impl PendingAck {
    /// Acknowledge the notification with `payload` (what the notifier sees in
    /// [`NotifyReplies::acks`]).
    pub fn ack(mut self, payload: &[u8]) {
        self.send(payload);
    }

    fn send(&mut self, payload: &[u8]) {
        if std::mem::replace(&mut self.sent, true) {
            return;
        }
        let len = c_int::try_from(payload.len()).unwrap_or(0);
        // SAFETY: the ioctx is alive (this holds its Arc, whether or not the watch still is);
        // oid NUL-terminated; the payload valid for len bytes during the call. A lost ack
        // shows up at the notifier as a timeout, so its result is not reported.
        unsafe { ffi::rados_notify_ack(self.ioctx.handle, self.oid.as_ptr(), self.notify_id, self.cookie, payload.as_ptr().cast(), len) };
    }
}

impl Drop for PendingAck {
    fn drop(&mut self) {
        self.send(&[]);
    }
}

extern "C" fn watch_cb(arg: *mut c_void, notify_id: u64, cookie: u64, notifier_id: u64, data: *mut c_void, len: usize) {
    // SAFETY: arg is the WatchCtx registered with rados_watch3; Watch keeps it alive until
    // after rados_unwatch2 and rados_watch_flush, after which librados calls no callback.
    let ctx = unsafe { &*arg.cast::<WatchCtx>() };
    let payload = if data.is_null() || len == 0 {
        Vec::new()
    } else {
        // SAFETY: librados passes a payload of `len` bytes valid for the callback's duration.
        unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) }.to_vec()
    };
    let notify = Notify { notify_id, cookie, notifier_id, payload };
    let ack = PendingAck { ioctx: Arc::clone(&ctx.ioctx), oid: ctx.oid.clone(), notify_id, cookie, sent: false };
    // A panicking callback must not unwind into C; it acknowledges with an empty payload
    // (the `PendingAck` dropped unsent).
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match &ctx.callback {
        WatchFn::Reply(f) => ack.ack(&f(notify)),
        WatchFn::Later(f) => f(notify, ack),
    }));
}

extern "C" fn watch_err_cb(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in watch_cb, the context is alive while callbacks can run.
    let ctx = unsafe { &*arg.cast::<WatchCtx>() };
    ctx.error.store(err, Ordering::Release);
}

/// A registered watch on a RADOS object; unwatches on drop (see [`Ioctx::watch_with_timeout`]).
pub struct Watch {
    ioctx: Arc<IoctxInner>,
    cookie: u64,
    ctx: *mut WatchCtx,
}

// SAFETY: the context is only read (callback is Send + Sync, the error an atomic); the ioctx
// is thread-safe; Drop's unwatch may run on any thread.
unsafe impl Send for Watch {}
// SAFETY: as above; &Watch only reads the atomic error and calls thread-safe librados.
unsafe impl Sync for Watch {}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watch").field("cookie", &self.cookie).finish_non_exhaustive()
    }
}

impl Watch {
    /// The watch's cookie (handle), which notifications and [`NotifyReplies`] carry.
    pub fn cookie(&self) -> u64 {
        self.cookie
    }

    /// Whether the watch is still registered (`rados_watch_check`): the time since the OSD
    /// last confirmed it, or the error that broke it (then re-watch with a new `Watch`).
    pub fn check(&self) -> Result<Duration, Error> {
        let last = self.ctx_ref().error.load(Ordering::Acquire);
        if last < 0 {
            return Err(Error::Rados { op: "rados_watch (error callback)", errno: last });
        }
        // SAFETY: valid ioctx and a cookie it registered.
        let r = unsafe { ffi::rados_watch_check(self.ioctx.handle, self.cookie) };
        Error::check("rados_watch_check", r.into()).map(Duration::from_millis)
    }

    fn ctx_ref(&self) -> &WatchCtx {
        // SAFETY: ctx came from Box::into_raw and is freed only in Drop.
        unsafe { &*self.ctx }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        // SAFETY: valid ioctx and cookie. Errors (e.g. blocklisted) still leave the watch
        // unregistered locally.
        unsafe { ffi::rados_unwatch2(self.ioctx.handle, self.cookie) };
        // SAFETY: valid cluster handle. Waits until no callback for this (now unregistered)
        // watch is queued or running, so freeing the context below is safe.
        unsafe { ffi::rados_watch_flush(self.ioctx.cluster.handle) };
        // SAFETY: from Box::into_raw in watch_with_timeout; no callback can use it any more.
        drop(unsafe { Box::from_raw(self.ctx) });
    }
}

#[cfg(test)]
mod tests {
    use super::strip_addrvec;

    #[test]
    fn addrvec_is_stripped() {
        assert_eq!(strip_addrvec("127.0.0.1:0/123"), "127.0.0.1:0/123");
        assert_eq!(strip_addrvec("[v2:127.0.0.1:0/123,v1:127.0.0.1:0/123]"), "127.0.0.1:0/123");
        assert_eq!(strip_addrvec("any:10.0.0.1:0/9"), "10.0.0.1:0/9");
    }
}
