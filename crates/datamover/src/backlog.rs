//! How far a datamover's receiving side may run ahead of its iSCSI layer.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

/// Events a [`Backlog`] allows beyond the command window: PDUs delivered immediately (NOP-Out,
/// task management, Text, Logout, SNACK), which the CmdSN window does not bound, and PDUs the
/// session rejects. A well-behaved initiator has a few of those outstanding at most (Linux's
/// iSER target reserves receives for six).
pub const BACKLOG_SLACK: usize = 64;

/// A [`Backlog`]'s bound before the iSCSI layer names its command window
/// ([`ConnectionResources::commands`](crate::ConnectionResources::commands) 0, or
/// Allocate_Connection_Resources not called: the initiator's side).
pub const BACKLOG_DEFAULT: usize = 1024;

/// The events a datamover has received and queued for its iSCSI layer that the layer has not
/// yet taken ([`Datamover::next_event`](crate::Datamover::next_event)), counted against a
/// bound. The iSCSI layer takes events in turns, and between turns it may wait a while (a task
/// management function waiting for a backend write, a send the peer does not take): a
/// receiving side that read on meanwhile would queue whatever the peer sends, and every write
/// command's data with it, without limit.
///
/// The bound is the commands the connection may hold (its CmdSN window and, on a target, the
/// immediate commands it allows) plus [`BACKLOG_SLACK`] ([`set_window`](Self::set_window);
/// [`BACKLOG_DEFAULT`] until then). The target's window counts every command it holds until
/// that command ends, so an initiator that keeps to it never has more commands waiting than the
/// window. The bound counts PDUs, not bytes: what each holds is bounded by the negotiated
/// segment lengths. A datamover [`add`](Self::add)s each event it queues and [`take`](Self::take)s each one
/// handed out; at the bound a byte-stream datamover stops reading
/// ([`poll_room`](Self::poll_room): the peer waits, as TCP makes it), and one whose peer
/// cannot be made to wait (iSER: every Send needs a posted receive) ends the connection. (An
/// initiator's events answer its own requests: riser-iser's initiator names its receives as
/// its window, since it keeps no more requests outstanding than they hold answers for.)
#[derive(Debug)]
pub struct Backlog {
    queued: AtomicUsize,
    limit: AtomicUsize,
    /// The receiving side, waiting for room.
    waiter: Mutex<Option<Waker>>,
}

impl Default for Backlog {
    fn default() -> Self {
        Self { queued: AtomicUsize::new(0), limit: AtomicUsize::new(BACKLOG_DEFAULT), waiter: Mutex::new(None) }
    }
}

impl Backlog {
    /// The iSCSI layer's command window (`commands` outstanding at most): the bound becomes
    /// `commands` + [`BACKLOG_SLACK`]. 0 leaves it as it is.
    pub fn set_window(&self, commands: u32) {
        if commands > 0 {
            self.limit.store((commands as usize).saturating_add(BACKLOG_SLACK), Ordering::Release);
            self.wake();
        }
    }

    /// The bound: events queued and not taken at most.
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Acquire)
    }

    /// Events queued and not yet taken.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }

    /// Whether another event may be queued.
    pub fn has_room(&self) -> bool {
        self.queued() < self.limit()
    }

    /// An event was queued.
    pub fn add(&self) {
        self.queued.fetch_add(1, Ordering::AcqRel);
    }

    /// Queue an event by `send` (`false`: the receiving end is gone), counted before it can be
    /// taken (counted after, a fast taker would count it down first).
    pub fn queue(&self, send: impl FnOnce() -> bool) {
        self.add();
        if !send() {
            self.take();
        }
    }

    /// An event was taken by the iSCSI layer: a receiving side waiting at the bound goes on.
    pub fn take(&self) {
        let before = self.queued.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "an event taken that was never added");
        if before >= self.limit() {
            self.wake();
        }
    }

    /// `Ready` once another event may be queued; else the task is woken when one is taken.
    /// One task waits at a time (the receiving side).
    pub fn poll_room(&self, cx: &mut Context<'_>) -> Poll<()> {
        if self.has_room() {
            return Poll::Ready(());
        }
        *self.waiter.lock().unwrap_or_else(|e| e.into_inner()) = Some(cx.waker().clone());
        // Checked again after the waker is in place: a `take` since the first check either
        // shows here or finds the waker.
        if self.has_room() { Poll::Ready(()) } else { Poll::Pending }
    }

    fn wake(&self) {
        if let Some(w) = self.waiter.lock().unwrap_or_else(|e| e.into_inner()).take() {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;
    use std::task::Wake;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    #[test]
    fn the_receiving_side_waits_at_the_bound_and_goes_on_when_an_event_is_taken() {
        let b = Backlog::default();
        assert_eq!(b.limit(), BACKLOG_DEFAULT);
        b.set_window(0);
        assert_eq!(b.limit(), BACKLOG_DEFAULT, "no window named: the default stays");
        b.set_window(2);
        assert_eq!(b.limit(), 2 + BACKLOG_SLACK);
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        for _ in 0..b.limit() {
            assert_eq!(b.poll_room(&mut cx), Poll::Ready(()));
            b.add();
        }
        assert_eq!(b.poll_room(&mut cx), Poll::Pending, "at the bound");
        assert!(!flag.0.load(Ordering::SeqCst));
        b.take();
        assert!(flag.0.load(Ordering::SeqCst), "woken by the take that made room");
        assert_eq!(b.poll_room(&mut cx), Poll::Ready(()));
        // A wider window makes room too, and wakes the waiter.
        b.add();
        flag.0.store(false, Ordering::SeqCst);
        assert_eq!(b.poll_room(&mut cx), Poll::Pending);
        b.set_window(3);
        assert!(flag.0.load(Ordering::SeqCst));
        assert!(b.has_room());
        assert_eq!(b.queued(), 2 + BACKLOG_SLACK);
        // Queued through a send: counted while it waits, not at all if the send failed.
        b.queue(|| true);
        b.queue(|| false);
        assert_eq!(b.queued(), 3 + BACKLOG_SLACK);
    }
}
