//! librbd asynchronous I/O as std futures.
//!
//! Each request owns an `Arc<Op>` shared by the future and by librbd's completion callback
//! (which holds one reference, handed to librbd as the callback argument). The `Op` owns every
//! buffer librbd reads or writes, so buffers stay alive and in place until the completion has
//! fired even if the future is dropped first. The callback stores the result, releases the
//! completion (`rbd_aio_release`, exactly once: there, or at submission when librbd refused
//! the request and never took the completion), and wakes the future's waker.
//!
//! An `Op` also keeps the image open: if the last reference to the image would be dropped on
//! a librbd thread (the future and the `Image` were dropped while the request was in flight),
//! the close (`rbd_close`, which waits for librbd's own threads) is moved to a new thread.

use std::ffi::{c_char, c_void};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;

use crate::error::EILSEQ;
use crate::ffi;
use crate::image::ImageInner;
use crate::{CompareError, Error};

/// What an `Op` keeps alive for librbd.
pub(crate) enum Keep {
    None,
    /// Data librbd reads from (write, write_same); held, never read here.
    One(#[allow(dead_code)] Bytes),
    /// Compare and write buffers; held, never read here.
    Two(#[allow(dead_code)] Bytes, #[allow(dead_code)] Bytes),
    /// A read's destination; librbd writes into its heap buffer through a raw pointer taken
    /// before submission. Nobody touches it until the result is in; the finisher takes it.
    Read(Mutex<Option<Vec<u8>>>),
}

#[derive(Default)]
struct Slot {
    ret: Option<isize>,
    waker: Option<Waker>,
}

pub(crate) struct Op {
    slot: Mutex<Slot>,
    keep: Keep,
    /// librbd's `mismatch_off` (compare and write); written by librbd before the completion.
    mismatch: AtomicU64,
    image: Mutex<Option<Arc<ImageInner>>>,
    name: &'static str,
    /// The request's image offset and length (to read librbd's `mismatch_off`).
    offset: u64,
    len: u64,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Nothing under these locks can panic half-way; a poisoned lock's data is still whole.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Op {
    fn finish(&self, ret: isize) {
        let waker = {
            let mut slot = lock(&self.slot);
            slot.ret = Some(ret);
            slot.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

extern "C" fn aio_callback(c: ffi::rbd_completion_t, arg: *mut c_void) {
    // SAFETY: `arg` is the `Arc::into_raw` reference made for this completion at submission;
    // librbd calls the callback exactly once per completion, so it is reclaimed exactly once.
    let op = unsafe { Arc::from_raw(arg.cast_const().cast::<Op>()) };
    // SAFETY: `c` is the live completion this callback is for.
    let ret = unsafe { ffi::rbd_aio_get_return_value(c) };
    // SAFETY: released exactly once, here: submission succeeded (else no callback), and
    // librbd keeps its own reference until the callback returns.
    unsafe { ffi::rbd_aio_release(c) };
    let image = lock(&op.image).take();
    op.finish(ret);
    drop(op);
    release_image_off_thread(image);
}

/// Drops an image reference held by a request without ever running `rbd_close` on a librbd
/// thread (which would wait for that very thread).
fn release_image_off_thread(image: Option<Arc<ImageInner>>) {
    let Some(image) = image else { return };
    // `Arc::into_inner` hands the value to exactly one of the last droppers; only then is a
    // close due, and it goes to a fresh thread.
    if let Some(last) = Arc::into_inner(image) {
        let spawned = std::thread::Builder::new().name("riser-rbd-close".into()).spawn(move || drop(last));
        if let Err(e) = spawned {
            // Cannot spawn: leak the image handle rather than deadlock librbd's thread.
            std::mem::forget(e);
        }
    }
}

/// A pending librbd request. Resolves to `T`; dropping it early is safe (the request still
/// completes in librbd, its buffers are kept until then, and the result is discarded).
#[must_use = "a request does nothing useful unless awaited"]
pub struct IoFuture<T> {
    state: State<T>,
}

enum State<T> {
    Op {
        op: Arc<Op>,
        finisher: fn(isize, &Op) -> T,
    },
    /// Refused before submission (or already resolved: `None`).
    Ready(Option<T>),
}

impl<T> IoFuture<T> {
    /// A future that resolves at once to `value` (an argument the binding refused).
    pub(crate) fn ready(value: T) -> Self {
        Self { state: State::Ready(Some(value)) }
    }
}

impl<T> std::fmt::Debug for IoFuture<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match &self.state {
            State::Op { op, .. } => op.name,
            State::Ready(_) => "ready",
        };
        f.debug_struct("IoFuture").field("op", &name).finish_non_exhaustive()
    }
}

impl<T: Unpin> Future for IoFuture<T> {
    type Output = T;

    /// # Panics
    /// If polled again after it returned `Ready` (like most futures).
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        let this = self.get_mut();
        match &mut this.state {
            State::Ready(v) => Poll::Ready(v.take().expect("IoFuture polled after completion")),
            State::Op { op, finisher } => {
                let mut slot = lock(&op.slot);
                if let Some(ret) = slot.ret {
                    drop(slot);
                    return Poll::Ready(finisher(ret, op));
                }
                match &slot.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => slot.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
        }
    }
}

/// Submits one request: makes the completion, calls `submit(image, completion, op)`.
pub(crate) fn submit<T>(
    image: &Arc<ImageInner>,
    name: &'static str,
    (offset, len): (u64, u64),
    keep: Keep,
    finisher: fn(isize, &Op) -> T,
    submit: impl FnOnce(ffi::rbd_image_t, ffi::rbd_completion_t, &Op) -> isize,
) -> IoFuture<T> {
    let op = Arc::new(Op {
        slot: Mutex::new(Slot::default()),
        keep,
        mismatch: AtomicU64::new(0),
        image: Mutex::new(Some(Arc::clone(image))),
        name,
        offset,
        len,
    });
    let arg = Arc::into_raw(Arc::clone(&op));
    let mut c: ffi::rbd_completion_t = std::ptr::null_mut();
    // SAFETY: `arg` stays valid until the callback reclaims it; the callback matches
    // rbd_callback_t; out-pointer to a local.
    let r = unsafe { ffi::rbd_aio_create_completion(arg.cast_mut().cast(), aio_callback, &mut c) };
    if r < 0 {
        // SAFETY: no completion exists, so no callback will reclaim the reference: do it here.
        drop(unsafe { Arc::from_raw(arg) });
        return failed(op, finisher, r as isize);
    }
    let r = submit(image.handle, c, &op);
    if r < 0 {
        // librbd's submit functions validate their arguments before taking the completion;
        // a negative return means the request was not queued and the callback will not run.
        // SAFETY: the completion was never handed over; release it and reclaim the callback's
        // reference, each exactly once.
        unsafe { ffi::rbd_aio_release(c) };
        // SAFETY: as above, the callback will not run for this completion.
        drop(unsafe { Arc::from_raw(arg) });
        return failed(op, finisher, r);
    }
    IoFuture { state: State::Op { op, finisher } }
}

fn failed<T>(op: Arc<Op>, finisher: fn(isize, &Op) -> T, ret: isize) -> IoFuture<T> {
    lock(&op.image).take();
    IoFuture::ready(finisher(ret, &op))
}

fn err(op: &Op, ret: isize) -> Error {
    Error::Rados { op: op.name, errno: i32::try_from(ret).unwrap_or(i32::MIN) }
}

pub(crate) fn finish_unit(ret: isize, op: &Op) -> Result<(), Error> {
    if ret < 0 { Err(err(op, ret)) } else { Ok(()) }
}

pub(crate) fn finish_read(ret: isize, op: &Op) -> Result<Vec<u8>, Error> {
    if ret < 0 {
        return Err(err(op, ret));
    }
    let Keep::Read(buf) = &op.keep else { return Err(Error::Malformed("read buffer")) };
    // The future resolves once, so the buffer is still there.
    let mut buf = lock(buf).take().unwrap_or_default();
    // librbd returns how many bytes it read into the buffer from its start: at most the
    // request's length, for which `Image::read` reserved room.
    let n = (ret as usize).min(op.len as usize);
    if n > buf.capacity() {
        return Err(Error::Malformed("read length"));
    }
    // SAFETY: librbd wrote `n` bytes from the start of the buffer's allocation (the completion
    // has fired: `ret` is its result), so its first `n` bytes are initialised, and `n` is
    // within its capacity.
    unsafe { buf.set_len(n) };
    Ok(buf)
}

pub(crate) fn finish_compare(ret: isize, op: &Op) -> Result<(), CompareError> {
    if ret == -(EILSEQ as isize) {
        // librbd 16 reports the offset relative to the request (measured). Should a version
        // report it as an image offset, it is at least the request's length (requests are
        // 512-byte sectors at multiples of 512, or offset 0 where both readings agree).
        let raw = op.mismatch.load(Ordering::Acquire);
        let offset = if raw >= op.len && raw >= op.offset { raw - op.offset } else { raw };
        return Err(CompareError::Mismatch { offset });
    }
    finish_unit(ret, op).map_err(CompareError::Io)
}

/// The read destination's data pointer (the Vec is inside the Op, which outlives the request).
pub(crate) fn read_ptr(op: &Op) -> *mut c_char {
    match &op.keep {
        Keep::Read(m) => lock(m).as_mut().map_or(std::ptr::null_mut(), |v| v.as_mut_ptr().cast()),
        _ => std::ptr::null_mut(),
    }
}

pub(crate) fn mismatch_ptr(op: &Op) -> *mut u64 {
    op.mismatch.as_ptr()
}
