//! Completion queues: each with its completion channel, polled in batches and waited for on the
//! channel's descriptor (tokio's `AsyncFd`, or `poll(2)` for blocking waits).

use super::queue::RcQp;
use super::{Device, Ptr, errno, lock, set_nonblocking, wait_readable};
use crate::{BoxFuture, CompletionQueue, Error, Result, Wc};
use rdma_mummy_sys as sys;
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::{Duration, Instant};

/// Completions taken from the device per `ibv_poll_cq` call.
const POLL_BATCH: usize = 32;
/// Completion events acknowledged in batches of this many (acknowledging takes a lock).
const ACK_BATCH: u32 = 64;

/// A file descriptor tokio may watch (the completion channel's; owned by the channel).
#[derive(Debug)]
struct ChannelFd(RawFd);

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0
    }
}

struct CqState {
    ready: VecDeque<Wc>,
    unacked: u32,
}

/// A completion queue with its completion channel.
pub struct RcCq {
    pub(super) dev: Arc<Device>,
    channel: Ptr<sys::ibv_comp_channel>,
    pub(super) cq: Ptr<sys::ibv_cq>,
    st: Mutex<CqState>,
    afd: OnceLock<Option<tokio::io::unix::AsyncFd<ChannelFd>>>,
    /// Queue pairs completing here, by number (to tell their requests apart).
    qps: Mutex<HashMap<u32, Weak<RcQp>>>,
}

impl std::fmt::Debug for RcCq {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcCq").field("device", &self.dev.name).finish_non_exhaustive()
    }
}

impl RcCq {
    pub(super) fn new(dev: &Arc<Device>, depth: u32) -> Result<Arc<Self>> {
        // SAFETY: the device's context is open while `dev` lives.
        let channel = unsafe { sys::ibv_create_comp_channel(dev.ctx.0) };
        if channel.is_null() {
            return Err(Error::Io(std::io::Error::new(errno().kind(), format!("ibv_create_comp_channel: {}", errno()))));
        }
        let depth = depth.clamp(1, dev.attr.max_cqe.max(1) as u32) as i32;
        // SAFETY: context and channel are valid; no cq_context is used.
        let cq = unsafe { sys::ibv_create_cq(dev.ctx.0, depth, std::ptr::null_mut(), channel, 0) };
        if cq.is_null() {
            let e = errno();
            // SAFETY: created above, not used elsewhere.
            unsafe { sys::ibv_destroy_comp_channel(channel) };
            return Err(Error::Io(std::io::Error::new(e.kind(), format!("ibv_create_cq of {depth}: {e}"))));
        }
        let me = Arc::new(Self {
            dev: dev.clone(),
            channel: Ptr(channel),
            cq: Ptr(cq),
            st: Mutex::new(CqState { ready: VecDeque::new(), unacked: 0 }),
            afd: OnceLock::new(),
            qps: Mutex::new(HashMap::new()),
        });
        // SAFETY: the channel is valid; its fd lives as long as the channel.
        set_nonblocking(unsafe { (*channel).fd })?;
        Ok(me)
    }

    fn fd(&self) -> RawFd {
        // SAFETY: the channel lives as long as self.
        unsafe { (*self.channel.0).fd }
    }

    pub(super) fn add_qp(&self, num: u32, qp: &Arc<RcQp>) {
        lock(&self.qps).insert(num, Arc::downgrade(qp));
    }

    pub(super) fn remove_qp(&self, num: u32) {
        lock(&self.qps).remove(&num);
    }

    /// Take what the device has into `st.ready` (the provider's own completions are handled
    /// here and not passed on).
    fn drain(&self, st: &mut CqState) {
        // SAFETY: zeroed ibv_wc is plain data.
        let mut buf: [sys::ibv_wc; POLL_BATCH] = unsafe { std::mem::zeroed() };
        loop {
            // SAFETY: cq is valid; buf holds POLL_BATCH entries.
            let n = unsafe { sys::ibv_poll_cq(self.cq.0, POLL_BATCH as i32, buf.as_mut_ptr()) };
            if n <= 0 {
                return;
            }
            for raw in &buf[..n as usize] {
                let qp = lock(&self.qps).get(&raw.qp_num).and_then(Weak::upgrade);
                if let Some(wc) = qp.and_then(|qp| qp.complete(raw)) {
                    st.ready.push_back(wc);
                }
            }
            if (n as usize) < POLL_BATCH {
                return;
            }
        }
    }

    /// Arm the channel, then look once more (a completion may have come before the arming):
    /// true if completions are ready.
    fn arm_and_check(&self) -> bool {
        let mut st = lock(&self.st);
        if !st.ready.is_empty() {
            return true;
        }
        // SAFETY: cq is valid.
        unsafe { sys::ibv_req_notify_cq(self.cq.0, 0) };
        self.drain(&mut st);
        !st.ready.is_empty()
    }

    /// Consume one completion event if there is one (never blocks).
    fn take_event(&self) -> bool {
        let mut cq = std::ptr::null_mut();
        let mut ctx = std::ptr::null_mut();
        // SAFETY: the channel's fd is non-blocking, so this returns at once; the out-pointers
        // are valid.
        let rc = unsafe { sys::ibv_get_cq_event(self.channel.0, &mut cq, &mut ctx) };
        if rc != 0 {
            return false;
        }
        let mut st = lock(&self.st);
        st.unacked += 1;
        if st.unacked >= ACK_BATCH {
            // SAFETY: acknowledges events taken from this CQ's channel.
            unsafe { sys::ibv_ack_cq_events(self.cq.0, st.unacked) };
            st.unacked = 0;
        }
        true
    }

    fn async_fd(&self) -> Option<&tokio::io::unix::AsyncFd<ChannelFd>> {
        self.afd
            .get_or_init(|| {
                // SAFETY: the descriptor is the completion channel's, open until the channel is
                // destroyed in `drop`, which deregisters this AsyncFd first; nothing replaces it.
                unsafe { tokio::io::unix::AsyncFd::register_with_interest(ChannelFd(self.fd()), tokio::io::Interest::READABLE) }.ok()
            })
            .as_ref()
    }
}

impl Drop for RcCq {
    fn drop(&mut self) {
        // Stop watching the descriptor before the channel closes it.
        drop(self.afd.take());
        let st = self.st.get_mut().unwrap_or_else(|e| e.into_inner());
        // SAFETY: every queue pair using this CQ holds an Arc of it, so none is left; all
        // events taken are acknowledged before the CQ is destroyed (verbs requires it), and the
        // channel is destroyed after its CQ.
        unsafe {
            if st.unacked > 0 {
                sys::ibv_ack_cq_events(self.cq.0, st.unacked);
            }
            sys::ibv_destroy_cq(self.cq.0);
            sys::ibv_destroy_comp_channel(self.channel.0);
        }
    }
}

impl CompletionQueue for RcCq {
    fn poll(&self, max: usize) -> Vec<Wc> {
        let mut out = Vec::new();
        self.poll_into(max, &mut out);
        out
    }

    fn poll_into(&self, max: usize, out: &mut Vec<Wc>) -> usize {
        let mut st = lock(&self.st);
        if st.ready.len() < max {
            self.drain(&mut st);
        }
        let n = max.min(st.ready.len());
        out.extend(st.ready.drain(..n));
        n
    }

    fn wait_blocking(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.arm_and_check() {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            if wait_readable(&[self.fd()], Some(left))[0] {
                self.take_event();
            }
        }
    }

    fn ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                if self.arm_and_check() {
                    return;
                }
                let Some(afd) = self.async_fd() else {
                    // Not inside a tokio runtime with I/O enabled: wait briefly on this thread
                    // instead (a degraded mode; riser always runs with I/O enabled).
                    self.wait_blocking(Duration::from_millis(10));
                    continue;
                };
                match afd.readable().await {
                    Ok(mut guard) => {
                        if !self.take_event() {
                            guard.clear_ready();
                        }
                    }
                    Err(_) => return,
                }
            }
        })
    }
}
