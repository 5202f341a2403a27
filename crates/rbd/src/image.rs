//! librbd images: open, inspect, asynchronous I/O, update watch, exclusive lock, metadata.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::ptr;
use std::sync::Arc;

use bytes::Bytes;

use crate::aio::{self, IoFuture, Keep};
use crate::error::ENOENT;
use crate::ffi;
use crate::rados::{IoctxInner, cstring};
use crate::{CompareError, Error, Ioctx};

/// `-ERANGE`: librbd's "buffer too small, the needed size is filled in".
const ERANGE: i32 = 34;

pub(crate) struct ImageInner {
    pub(crate) handle: ffi::rbd_image_t,
    _ioctx: Arc<IoctxInner>,
}

// SAFETY: librbd documents rbd_image_t as usable from several threads at once (ImageCtx
// guards its state with its own locks); the pointer is never handed out.
unsafe impl Send for ImageInner {}
// SAFETY: as above.
unsafe impl Sync for ImageInner {}

impl Drop for ImageInner {
    fn drop(&mut self) {
        // SAFETY: opened by rbd_open; no request is in flight (each holds an Arc to this) and
        // no update watch is registered (UpdateWatch holds one too). Never runs on a librbd
        // thread (aio moves a last drop there to a fresh thread).
        unsafe { ffi::rbd_close(self.handle) };
    }
}

/// Size and layout of an image (`rbd_stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageInfo {
    /// Size in bytes.
    pub size: u64,
    /// Object size in bytes (`1 << order`).
    pub obj_size: u64,
    /// Number of objects the image spans.
    pub num_objs: u64,
    /// log2 of the object size.
    pub order: i32,
}

/// Image feature bits (`rbd/features.h`), as [`Image::features`] returns them.
pub mod features {
    /// Clones (layering).
    pub const LAYERING: u64 = 1 << 0;
    /// Fancy striping.
    pub const STRIPINGV2: u64 = 1 << 1;
    /// Exclusive lock: one client writes at a time (needed by [`super::Image::lock_acquire`]).
    pub const EXCLUSIVE_LOCK: u64 = 1 << 2;
    /// Object map.
    pub const OBJECT_MAP: u64 = 1 << 3;
    /// Fast diff.
    pub const FAST_DIFF: u64 = 1 << 4;
    /// Deep flatten.
    pub const DEEP_FLATTEN: u64 = 1 << 5;
    /// Journaling.
    pub const JOURNALING: u64 = 1 << 6;
    /// Separate data pool.
    pub const DATA_POOL: u64 = 1 << 7;
}

/// An open RBD image (`rbd_image_t`). `Send + Sync`: librbd's image calls are thread-safe, so
/// one `Image` serves many concurrent requests. Cloning shares the handle; it is closed
/// (`rbd_close`) when the last clone, request and [`UpdateWatch`] are gone.
#[derive(Clone)]
pub struct Image {
    inner: Arc<ImageInner>,
}

impl std::fmt::Debug for Image {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Image").finish_non_exhaustive()
    }
}

impl Image {
    /// Opens an image read-write at its head (`rbd_open`). Blocks while librbd reads the header.
    pub fn open(ioctx: &Ioctx, name: &str) -> Result<Self, Error> {
        let name = cstring(name, "image name")?;
        // librbd starts its thread pool at an image's first open, from this thread.
        let _batch = ioctx.inner.cluster.batch_threads.then(crate::sched::BatchScope::enter);
        let mut handle: ffi::rbd_image_t = ptr::null_mut();
        // SAFETY: valid ioctx; name NUL-terminated; out-pointer to a local; no snapshot.
        let r = unsafe { ffi::rbd_open(ioctx.inner.handle, name.as_ptr(), &mut handle, ptr::null()) };
        Error::check("rbd_open", r.into())?;
        Ok(Self { inner: Arc::new(ImageInner { handle, _ioctx: Arc::clone(&ioctx.inner) }) })
    }

    /// Creates an image of `size` bytes with the cluster's default features and object size
    /// (`rbd_create`, format 2; `rbd_default_features` decides, normally including
    /// exclusive-lock). Mostly for tests and tools.
    pub fn create(ioctx: &Ioctx, name: &str, size: u64) -> Result<(), Error> {
        let name = cstring(name, "image name")?;
        let mut order: c_int = 0;
        // SAFETY: valid ioctx; name NUL-terminated; order 0 means "default".
        let r = unsafe { ffi::rbd_create(ioctx.inner.handle, name.as_ptr(), size, &mut order) };
        Error::check("rbd_create", r.into()).map(drop)
    }

    /// Removes an image (`rbd_remove`); it must not be open anywhere.
    pub fn remove(ioctx: &Ioctx, name: &str) -> Result<(), Error> {
        let name = cstring(name, "image name")?;
        // SAFETY: valid ioctx; name NUL-terminated.
        let r = unsafe { ffi::rbd_remove(ioctx.inner.handle, name.as_ptr()) };
        Error::check("rbd_remove", r.into()).map(drop)
    }

    fn h(&self) -> ffi::rbd_image_t {
        self.inner.handle
    }

    /// The image's size in bytes (`rbd_get_size`; librbd refreshes it when the header changes).
    pub fn size(&self) -> Result<u64, Error> {
        let mut size = 0u64;
        // SAFETY: open image; out-pointer to a local.
        let r = unsafe { ffi::rbd_get_size(self.h(), &mut size) };
        Error::check("rbd_get_size", r.into())?;
        Ok(size)
    }

    /// Size and object layout (`rbd_stat`).
    pub fn stat(&self) -> Result<ImageInfo, Error> {
        // SAFETY: rbd_image_info_t is plain data (integers and char arrays): all-zero is valid.
        let mut info: ffi::rbd_image_info_t = unsafe { std::mem::zeroed() };
        // SAFETY: open image; info is a properly sized out-struct.
        let r = unsafe { ffi::rbd_stat(self.h(), &mut info, size_of::<ffi::rbd_image_info_t>()) };
        Error::check("rbd_stat", r.into())?;
        Ok(ImageInfo { size: info.size, obj_size: info.obj_size, num_objs: info.num_objs, order: info.order })
    }

    /// The image's id (`rbd_get_id`; format-2 images), stable across renames.
    pub fn id(&self) -> Result<String, Error> {
        let mut len = 32usize;
        loop {
            let mut buf = vec![0u8; len];
            // SAFETY: open image; buf is writable for len bytes.
            let r = unsafe { ffi::rbd_get_id(self.h(), buf.as_mut_ptr().cast(), len) };
            if r == -ERANGE && len < 4096 {
                len *= 4;
                continue;
            }
            Error::check("rbd_get_id", r.into())?;
            return Ok(c_buf_to_string(&buf));
        }
    }

    /// The image's feature bits (see [`features`]).
    pub fn features(&self) -> Result<u64, Error> {
        let mut f = 0u64;
        // SAFETY: open image; out-pointer to a local.
        let r = unsafe { ffi::rbd_get_features(self.h(), &mut f) };
        Error::check("rbd_get_features", r.into())?;
        Ok(f)
    }

    /// Resizes the image (`rbd_resize`, shrinking allowed). Other clients with the image open
    /// see it through their [`Image::watch_updates`] callbacks.
    pub fn resize(&self, size: u64) -> Result<(), Error> {
        // SAFETY: open image.
        let r = unsafe { ffi::rbd_resize(self.h(), size) };
        Error::check("rbd_resize", r.into()).map(drop)
    }

    /// Reads `len` bytes at `offset` into `buf` (resized to `len`; its allocation is reused)
    /// with `rbd_aio_read`. Unwritten areas read as zeros; the result is shorter than `len`
    /// only if the read ran past the end of the image.
    pub fn read(&self, offset: u64, len: usize, mut buf: Vec<u8>) -> IoFuture<Result<Vec<u8>, Error>> {
        // Room for `len` bytes, not zeroed: librbd writes them (a zero-fill cost ~7 % of the
        // gateway's CPU on 1 MiB reads); the length is set to what it wrote (`finish_read`).
        buf.clear();
        buf.reserve(len);
        let keep = Keep::Read(std::sync::Mutex::new(Some(buf)));
        aio::submit(&self.inner, "rbd_aio_read", (offset, len as u64), keep, aio::finish_read, |h, c, op| {
            let p = aio::read_ptr(op);
            // SAFETY: open image; `p` points to the spare capacity (at least `len` bytes) of a
            // Vec owned by `op`, which lives until the completion has fired (librbd only writes
            // there); `c` is a fresh completion.
            unsafe { ffi::rbd_aio_read(h, offset, len, p, c) as isize }
        })
    }

    /// Writes `data` at `offset` (`rbd_aio_write2`); with `fua`, with
    /// `LIBRADOS_OP_FLAG_FADVISE_FUA` (forced unit access). Without librbd's cache (see
    /// [`ClusterOptions`](crate::ClusterOptions)) every completed write is already on the OSDs.
    pub fn write(&self, offset: u64, data: Bytes, fua: bool) -> IoFuture<Result<(), Error>> {
        let (ptr, len) = (data.as_ptr(), data.len());
        let flags = if fua { ffi::LIBRADOS_OP_FLAG_FADVISE_FUA } else { 0 };
        aio::submit(&self.inner, "rbd_aio_write2", (offset, len as u64), Keep::One(data), aio::finish_unit, |h, c, _| {
            // SAFETY: open image; `ptr` is `len` bytes of the Bytes kept in the op (immutable,
            // alive until completion); `c` is a fresh completion.
            unsafe { ffi::rbd_aio_write2(h, offset, len, ptr.cast(), c, flags) as isize }
        })
    }

    /// Flushes (`rbd_aio_flush`): completes when every write completed before it is durable.
    pub fn flush(&self) -> IoFuture<Result<(), Error>> {
        aio::submit(&self.inner, "rbd_aio_flush", (0, 0), Keep::None, aio::finish_unit, |h, c, _| {
            // SAFETY: open image; fresh completion.
            unsafe { ffi::rbd_aio_flush(h, c) as isize }
        })
    }

    /// Discards (unmaps) `len` bytes at `offset` (`rbd_aio_discard`). Whole objects are
    /// removed and read back as zeros; smaller ranges may be left as they were (librbd's
    /// `rbd_skip_partial_discard`, default true: measured, a 64 KiB discard inside a 4 MiB
    /// object left the old data). So a LUN must not promise zeros after UNMAP (LBPRZ = 0),
    /// or must use [`Image::write_zeroes`] where zeros are required.
    pub fn discard(&self, offset: u64, len: u64) -> IoFuture<Result<(), Error>> {
        aio::submit(&self.inner, "rbd_aio_discard", (offset, len), Keep::None, aio::finish_unit, |h, c, _| {
            // SAFETY: open image; fresh completion.
            unsafe { ffi::rbd_aio_discard(h, offset, len, c) as isize }
        })
    }

    /// Writes `pattern` repeatedly over `len` bytes at `offset` (`rbd_aio_writesame`); `len`
    /// must be a multiple of the pattern's length.
    pub fn write_same(&self, offset: u64, len: usize, pattern: Bytes) -> IoFuture<Result<(), Error>> {
        let (ptr, plen) = (pattern.as_ptr(), pattern.len());
        aio::submit(&self.inner, "rbd_aio_writesame", (offset, len as u64), Keep::One(pattern), aio::finish_unit, |h, c, _| {
            // SAFETY: open image; the pattern is kept alive in the op until completion.
            unsafe { ffi::rbd_aio_writesame(h, offset, len, ptr.cast(), plen, c, 0) as isize }
        })
    }

    /// Writes zeros over `len` bytes at `offset` (`rbd_aio_write_zeroes`; may deallocate).
    pub fn write_zeroes(&self, offset: u64, len: usize) -> IoFuture<Result<(), Error>> {
        aio::submit(&self.inner, "rbd_aio_write_zeroes", (offset, len as u64), Keep::None, aio::finish_unit, |h, c, _| {
            // SAFETY: open image; fresh completion.
            unsafe { ffi::rbd_aio_write_zeroes(h, offset, len, c, 0, 0) as isize }
        })
    }

    /// Atomically compares the image at `offset` with `compare` and, if equal, writes `write`
    /// there (`rbd_aio_compare_and_write`). A difference gives
    /// [`CompareError::Mismatch`] with the first differing byte relative to `offset` (librbd
    /// 16.2 reports it that way; an image-absolute `mismatch_off` is converted).
    ///
    /// librbd (16.2) accepts only requests inside one 512-byte-aligned sector (512 bytes at a
    /// multiple of 512); anything else, e.g. 4096 bytes, fails with `-EINVAL`
    /// ([`CompareError::Io`]).
    pub fn compare_and_write(&self, offset: u64, compare: Bytes, write: Bytes) -> IoFuture<Result<(), CompareError>> {
        if compare.len() != write.len() {
            let e = Error::InvalidArgument("compare and write buffers differ in length");
            return IoFuture::ready(Err(CompareError::Io(e)));
        }
        let (cp, wp, len) = (compare.as_ptr(), write.as_ptr(), write.len());
        let keep = Keep::Two(compare, write);
        aio::submit(&self.inner, "rbd_aio_compare_and_write", (offset, len as u64), keep, aio::finish_compare, |h, c, op| {
            let mismatch = aio::mismatch_ptr(op);
            // SAFETY: open image; both buffers (`len` bytes each) and the mismatch slot live in
            // the op until the completion has fired; fresh completion.
            unsafe { ffi::rbd_aio_compare_and_write(h, offset, len, cp.cast(), wp.cast(), c, mismatch, 0) }
        })
    }

    /// Calls `callback` (on a librbd thread) whenever the image header changes — a resize by
    /// another client, a snapshot, a lock change (`rbd_update_watch`). The callback should be
    /// quick: re-read what matters ([`Image::size`]) or signal a task — the client that
    /// changed the header waits for it (measured: a resize on another client took 505 ms with
    /// a 500 ms callback here, since librbd acknowledges the header notification only after
    /// the callbacks ran). Dropping the
    /// [`UpdateWatch`] unregisters it (`rbd_update_unwatch`, which waits for a running
    /// callback); do not drop it inside its own callback.
    pub fn watch_updates(&self, callback: impl Fn() + Send + Sync + 'static) -> Result<UpdateWatch, Error> {
        let ctx: UpdateFn = Box::new(callback);
        let arg = Box::into_raw(Box::new(ctx));
        let mut handle = 0u64;
        // SAFETY: open image; `arg` points to a boxed callback that lives until after
        // rbd_update_unwatch (owned by the returned UpdateWatch); out-pointer to a local.
        let r = unsafe { ffi::rbd_update_watch(self.h(), &mut handle, update_cb, arg.cast()) };
        if r < 0 {
            // SAFETY: not registered, librbd holds no pointer to arg: reclaim it.
            drop(unsafe { Box::from_raw(arg) });
            return Err(Error::Rados { op: "rbd_update_watch", errno: r });
        }
        Ok(UpdateWatch { image: Arc::clone(&self.inner), handle, ctx: arg })
    }

    /// Takes the exclusive lock (`rbd_lock_acquire`, `RBD_LOCK_MODE_EXCLUSIVE`; image feature
    /// `exclusive-lock`). Blocks while librbd asks a current owner to release it; fails
    /// (`-EROFS`/`-EBUSY`) if the owner refuses.
    ///
    /// What librbd does by itself: without explicit locking, any client that writes asks the
    /// current owner (through the header object's watch) to hand the lock over, and an
    /// owner that has not locked explicitly gives it up (cooperative transfer, librbd's
    /// automatic lock policy). Once a client has called `lock_acquire`, librbd switches that
    /// image to its standard policy: it no longer requests the lock on its own and refuses
    /// others' requests, so another client's writes fail with `-EROFS` until the lock is
    /// released or broken. A dead owner is detected when a request goes unanswered and its
    /// watch has expired; librbd then breaks the lock and, with `rbd_blocklist_on_break_lock`
    /// (default true), blocklists the old owner for `rbd_blocklist_expire_seconds` (0: the
    /// OSD default, one hour). [`Image::lock_break`] does the same on demand.
    pub fn lock_acquire(&self) -> Result<(), Error> {
        // SAFETY: open image.
        let r = unsafe { ffi::rbd_lock_acquire(self.h(), ffi::RBD_LOCK_MODE_EXCLUSIVE) };
        Error::check("rbd_lock_acquire", r.into()).map(drop)
    }

    /// Releases the exclusive lock (`rbd_lock_release`).
    pub fn lock_release(&self) -> Result<(), Error> {
        // SAFETY: open image.
        let r = unsafe { ffi::rbd_lock_release(self.h()) };
        Error::check("rbd_lock_release", r.into()).map(drop)
    }

    /// Whether this handle owns the exclusive lock (`rbd_is_exclusive_lock_owner`).
    pub fn is_lock_owner(&self) -> Result<bool, Error> {
        let mut owner: c_int = 0;
        // SAFETY: open image; out-pointer to a local.
        let r = unsafe { ffi::rbd_is_exclusive_lock_owner(self.h(), &mut owner) };
        Error::check("rbd_is_exclusive_lock_owner", r.into())?;
        Ok(owner != 0)
    }

    /// The current exclusive-lock owners (`rbd_lock_get_owners`), as librbd names them: the
    /// owner's messenger address (`127.0.0.1:0/525727296`, what
    /// [`Cluster::blocklist_address`](crate::Cluster::blocklist_address) gives, measured with
    /// librbd 16.2), not `client.<gid>`. Empty when nobody holds the lock.
    pub fn lock_get_owners(&self) -> Result<Vec<String>, Error> {
        let mut cap = 4usize;
        loop {
            let mut owners: Vec<*mut c_char> = vec![ptr::null_mut(); cap];
            let mut n = cap;
            let mut mode: c_int = 0;
            // SAFETY: open image; `owners` has room for `n` pointers; out-pointers to locals.
            let r = unsafe { ffi::rbd_lock_get_owners(self.h(), &mut mode, owners.as_mut_ptr(), &mut n) };
            if r == -ENOENT {
                return Ok(Vec::new());
            }
            if r == -ERANGE && n > cap && n <= 1 << 16 {
                cap = n;
                continue;
            }
            Error::check("rbd_lock_get_owners", r.into())?;
            let n = n.min(cap);
            let names = owners[..n]
                .iter()
                .filter(|p| !p.is_null())
                // SAFETY: librbd filled the first n entries with NUL-terminated strings.
                .map(|&p| unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
                .collect();
            // SAFETY: frees exactly the n strings librbd allocated, once.
            unsafe { ffi::rbd_lock_get_owners_cleanup(owners.as_mut_ptr(), n) };
            return Ok(names);
        }
    }

    /// Breaks another client's exclusive lock (`rbd_lock_break`); `owner` as returned by
    /// [`Image::lock_get_owners`]. With `rbd_blocklist_on_break_lock` (default true) librbd
    /// also blocklists the old owner, so its in-flight and later writes fail with
    /// `-EBLOCKLISTED` (it must reconnect with a new `Cluster` to do I/O again).
    pub fn lock_break(&self, owner: &str) -> Result<(), Error> {
        let owner = cstring(owner, "lock owner")?;
        // SAFETY: open image; owner NUL-terminated.
        let r = unsafe { ffi::rbd_lock_break(self.h(), ffi::RBD_LOCK_MODE_EXCLUSIVE, owner.as_ptr()) };
        Error::check("rbd_lock_break", r.into()).map(drop)
    }

    /// An image metadata value (`rbd_metadata_get`); `None` when the key is not set.
    pub fn metadata_get(&self, key: &str) -> Result<Option<String>, Error> {
        let key = cstring(key, "metadata key")?;
        let mut cap = 256usize;
        loop {
            let mut buf = vec![0u8; cap];
            let mut len = cap;
            // SAFETY: open image; key NUL-terminated; buf writable for `len` bytes.
            let r = unsafe { ffi::rbd_metadata_get(self.h(), key.as_ptr(), buf.as_mut_ptr().cast(), &mut len) };
            if r == -ENOENT {
                return Ok(None);
            }
            if r == -ERANGE && len > cap {
                cap = len;
                continue;
            }
            Error::check("rbd_metadata_get", r.into())?;
            buf.truncate(len.min(cap));
            return Ok(Some(c_buf_to_string(&buf)));
        }
    }

    /// Sets an image metadata value (`rbd_metadata_set`).
    pub fn metadata_set(&self, key: &str, value: &str) -> Result<(), Error> {
        let key = cstring(key, "metadata key")?;
        let value = cstring(value, "metadata value")?;
        // SAFETY: open image; both strings NUL-terminated.
        let r = unsafe { ffi::rbd_metadata_set(self.h(), key.as_ptr(), value.as_ptr()) };
        Error::check("rbd_metadata_set", r.into()).map(drop)
    }
}

/// Text up to the first NUL.
fn c_buf_to_string(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

type UpdateFn = Box<dyn Fn() + Send + Sync>;

extern "C" fn update_cb(arg: *mut c_void) {
    // SAFETY: arg is the boxed callback registered with rbd_update_watch, alive until after
    // rbd_update_unwatch returned.
    let f = unsafe { &*arg.cast::<UpdateFn>() };
    // Never unwind into librbd.
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
}

/// A registered image update watch; unregistered on drop (see [`Image::watch_updates`]).
pub struct UpdateWatch {
    image: Arc<ImageInner>,
    handle: u64,
    ctx: *mut UpdateFn,
}

// SAFETY: the context is an immutable `Fn + Send + Sync`; the image handle is thread-safe.
unsafe impl Send for UpdateWatch {}
// SAFETY: &UpdateWatch gives access to nothing.
unsafe impl Sync for UpdateWatch {}

impl std::fmt::Debug for UpdateWatch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UpdateWatch").field("handle", &self.handle).finish_non_exhaustive()
    }
}

impl Drop for UpdateWatch {
    fn drop(&mut self) {
        // SAFETY: open image (we hold an Arc) and a handle it registered. librbd's unwatch
        // waits for in-flight notifications of this watcher before returning.
        unsafe { ffi::rbd_update_unwatch(self.image.handle, self.handle) };
        // SAFETY: from Box::into_raw in watch_updates; librbd no longer calls it.
        drop(unsafe { Box::from_raw(self.ctx) });
    }
}
