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

    /// Add a completion. Only one that finds the queue empty tells the pollers: a poller
    /// waits only after seeing it empty under the lock (`wait_blocking`, `ready`), so the next
    /// completion after that finds it empty too (notifying costs a lock even with nobody
    /// waiting).
    pub(super) fn push(&self, wc: Wc) {
        let mut q = lock(&self.q);
        let was_empty = q.is_empty();
        q.push_back(wc);
        let sleepers = self.sleepers.load(Ordering::Relaxed);
        drop(q);
        if !was_empty {
            return;
        }
        if sleepers > 0 {
            self.cv.notify_all();
        }
        self.notify.notify_waiters();
    }
}

impl CompletionQueue for SoftCq {
    fn poll(&self, max: usize) -> Vec<Wc> {
        let mut out = Vec::new();
        self.poll_into(max, &mut out);
        out
    }

    fn poll_into(&self, max: usize, out: &mut Vec<Wc>) -> usize {
        let mut q = lock(&self.q);
        let n = max.min(q.len());
        out.extend(q.drain(..n));
        n
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

#[cfg(test)]
mod tests {
    use super::*;
    use riser_verbs::{WcOpcode, WcStatus};
    use std::sync::Arc;

    fn wc(wr_id: u64) -> Wc {
        Wc { wr_id, status: WcStatus::Success, opcode: WcOpcode::Recv, byte_len: 0, invalidated_rkey: None, solicited: false }
    }

    /// Only a completion that finds the queue empty notifies; a poller that drained it and
    /// waits, blocking or async, is woken by the next one all the same, and one that left
    /// completions behind finds them without waiting.
    #[test]
    fn a_poller_that_emptied_the_queue_is_woken_by_the_next_completion() {
        let cq = Arc::new(SoftCq::new());
        cq.push(wc(1));
        cq.push(wc(2));
        assert_eq!(cq.poll(1).len(), 1);
        assert!(cq.wait_blocking(Duration::ZERO), "a completion left behind is there");
        assert_eq!(cq.poll(8).len(), 1);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        for round in 0..3u64 {
            let blocked = {
                let cq = cq.clone();
                std::thread::spawn(move || cq.wait_blocking(Duration::from_secs(10)))
            };
            while cq.sleepers.load(Ordering::Relaxed) == 0 {
                std::thread::yield_now();
            }
            let pusher = {
                let cq = cq.clone();
                std::thread::spawn(move || {
                    std::thread::sleep(Duration::from_millis(20));
                    cq.push(wc(10 + round));
                    cq.push(wc(20 + round));
                })
            };
            rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), cq.ready()).await }).expect("the async poller woke");
            assert!(blocked.join().unwrap(), "the blocked poller woke");
            pusher.join().unwrap();
            assert_eq!(cq.poll(8).iter().map(|w| w.wr_id).collect::<Vec<_>>(), [10 + round, 20 + round]);
        }
        // Polling into a vector the poller keeps: appended, at most `max`, the count returned.
        cq.push(wc(30));
        cq.push(wc(31));
        let mut into = vec![wc(29)];
        assert_eq!((cq.poll_into(1, &mut into), cq.poll_into(8, &mut into), cq.poll_into(8, &mut into)), (1, 1, 0));
        assert_eq!(into.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [29, 30, 31]);
    }
}
