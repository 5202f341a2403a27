//! Completion queues: a locked queue of completions with a condition variable for blocking
//! pollers and a notifier for async ones.

use super::lock;
use riser_verbs::{BoxFuture, CompletionQueue, Wc};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// A completion queue.
#[derive(Debug)]
pub struct SoftCq {
    q: Mutex<VecDeque<Wc>>,
    cv: Condvar,
    /// Threads blocked in `wait_blocking` (changed under `q`'s lock): a notify of the condition
    /// variable is a system call even with nobody waiting, so it is only made for them.
    sleepers: AtomicUsize,
    notify: tokio::sync::Notify,
}

impl SoftCq {
    /// An empty completion queue.
    pub(super) fn new() -> Self {
        Self { q: Mutex::new(VecDeque::new()), cv: Condvar::new(), sleepers: AtomicUsize::new(0), notify: tokio::sync::Notify::new() }
    }

    pub(super) fn push(&self, wc: Wc) {
        let mut q = lock(&self.q);
        q.push_back(wc);
        let sleepers = self.sleepers.load(Ordering::Relaxed);
        drop(q);
        if sleepers > 0 {
            self.cv.notify_all();
        }
        self.notify.notify_waiters();
    }
}

impl CompletionQueue for SoftCq {
    fn poll(&self, max: usize) -> Vec<Wc> {
        let mut q = lock(&self.q);
        let n = max.min(q.len());
        q.drain(..n).collect()
    }

    fn wait_blocking(&self, timeout: Duration) -> bool {
        let q = lock(&self.q);
        self.sleepers.fetch_add(1, Ordering::Relaxed);
        let (q, _) = self.cv.wait_timeout_while(q, timeout, |q| q.is_empty()).unwrap_or_else(|e| e.into_inner());
        self.sleepers.fetch_sub(1, Ordering::Relaxed);
        !q.is_empty()
    }

    fn ready(&self) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            loop {
                let mut n = std::pin::pin!(self.notify.notified());
                n.as_mut().enable();
                if !lock(&self.q).is_empty() {
                    return;
                }
                n.await;
            }
        })
    }
}
