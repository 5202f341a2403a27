//! Reusable task buffers.

use bytes::{Bytes, BytesMut};
use std::sync::Mutex;

/// Buffers kept for reuse, and the largest one kept.
const POOL_BUFFERS: usize = 32;
const POOL_MAX_BUFFER: usize = 8 << 20;
/// Bytes kept for reuse, in all (see [`BufferPool`]).
pub const POOL_MAX_BYTES: usize = 8 << 20;

/// Bytes the process keeps for reuse in large buffers, beside every connection's own
/// [`POOL_MAX_BYTES`] (see [`BufferPool`]).
pub const SHARED_POOL_MAX_BYTES: usize = 64 << 20;
/// The smallest buffer the shared tier keeps or is asked for: smaller ones are a connection's
/// own, so a small command never touches memory other connections write.
const SHARED_MIN_BUFFER: usize = 1 << 20;
/// Buffers the shared tier keeps.
const SHARED_BUFFERS: usize = 16;

/// The process-wide tier (see [`BufferPool`]).
static SHARED: Mutex<Free> = Mutex::new(Free { buffers: Vec::new(), bytes: 0 });

/// A small pool of data buffers. Large buffers from the allocator are fresh mappings, page-
/// faulted in on first touch; for a write-heavy stream of large commands that costs more than
/// the copy itself, so datamovers take their task buffers from here and get them back through
/// [`Datamover::release_task_buffer`](crate::Datamover::release_task_buffer).
///
/// A pool keeps at most 32 buffers and [`POOL_MAX_BYTES`] in all: enough for 32 commands of
/// 256 KiB or 8 of 1 MiB in flight. The memory budgets of a target count command data while
/// commands run; what a connection keeps afterwards is bounded by this (it used to be 32
/// buffers of up to 8 MiB each: 256 MiB per connection, 64 GiB at 256 connections).
///
/// Behind every connection's pool is one tier shared by the whole process, for buffers of
/// 1 MiB and more that a connection's pool has no room for (larger than 8 MiB, or the pool
/// full): at most 16 buffers and [`SHARED_POOL_MAX_BYTES`] in all. Without it, every write or
/// read above 8 MiB had fresh memory: on the development VM a 16 MiB write page-faulted about
/// 900 times at the target, and one session's 16 MiB writes were about 1.3x as fast with it.
/// Only takes of 1 MiB or more look there, so a small command never locks it. A buffer from
/// it may hold another connection's earlier data: the dirty takes hand it only to callers
/// that overwrite every byte before use (as for a connection's own pool), and a zeroed take
/// zeroes it.
#[derive(Debug, Default)]
pub struct BufferPool {
    free: Mutex<Free>,
}

#[derive(Debug, Default)]
struct Free {
    buffers: Vec<Vec<u8>>,
    /// Their capacities, summed.
    bytes: usize,
}

impl Free {
    /// A buffer with room for `len` bytes, if there is one: the smallest that fits, or as
    /// `fit` asks, one already that long first (a dirty take then zeroes nothing: a buffer
    /// shortened by an earlier take would have its tail zeroed again) or only such a one.
    fn take(&mut self, len: usize, fit: Fit) -> Option<Vec<u8>> {
        // The best so far: (needs zeroing, capacity, index). An exact fit ends the search.
        let mut best: Option<(bool, usize, usize)> = None;
        for (i, b) in self.buffers.iter().enumerate() {
            let short = b.len() < len;
            if b.capacity() < len || (short && fit == Fit::Filled) {
                continue;
            }
            let key = (short && fit == Fit::PreferFilled, b.capacity(), i);
            if best.is_none_or(|k| (key.0, key.1) < (k.0, k.1)) {
                best = Some(key);
                if !key.0 && key.1 == len {
                    break;
                }
            }
        }
        let b = self.buffers.swap_remove(best?.2);
        self.bytes -= b.capacity();
        Some(b)
    }

    /// Keep `buf` if that leaves at most `buffers` buffers and `bytes` bytes; else give it back.
    fn keep(&mut self, buf: Vec<u8>, buffers: usize, bytes: usize) -> Option<Vec<u8>> {
        let cap = buf.capacity();
        if self.buffers.len() < buffers && self.bytes + cap <= bytes {
            self.bytes += cap;
            self.buffers.push(buf);
            None
        } else {
            Some(buf)
        }
    }
}

/// Which pooled buffers a take may have (see `BufferPool::pooled`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Fit {
    /// Any with room enough.
    Room,
    /// Any with room enough, those already holding the bytes first.
    PreferFilled,
    /// Only those already holding the bytes.
    Filled,
}

impl BufferPool {
    /// A pooled buffer with room for `len` bytes, if there is one: the connection's own, else
    /// (1 MiB or more, and `shared`) the shared tier's (see [`Free::take`]).
    fn pooled(&self, len: usize, fit: Fit, shared: bool) -> Option<Vec<u8>> {
        let own = self.free.lock().unwrap_or_else(|e| e.into_inner()).take(len, fit);
        if own.is_some() || !shared || len < SHARED_MIN_BUFFER {
            return own;
        }
        SHARED.lock().unwrap_or_else(|e| e.into_inner()).take(len, fit)
    }

    /// A zeroed buffer of `len` bytes, from the pool when one is large enough.
    pub fn take_vec(&self, len: usize) -> Vec<u8> {
        let Some(mut b) = self.pooled(len, Fit::Room, true) else { return vec![0; len] };
        b.clear();
        b.resize(len, 0);
        b
    }

    /// A buffer of `len` bytes whose contents are unspecified: zeros, or earlier data given to
    /// this pool. Only for a caller that overwrites every byte before the buffer is used (a
    /// write task buffer whose data-in-order checks guarantee full coverage); spares a memset
    /// of the whole buffer per command.
    pub fn take_dirty_vec(&self, len: usize) -> Vec<u8> {
        let Some(mut b) = self.pooled(len, Fit::PreferFilled, true) else { return vec![0; len] };
        b.truncate(len);
        b.resize(len, 0);
        b
    }

    /// [`take_dirty_vec`](Self::take_dirty_vec) only from a buffer of the connection's own
    /// pool holding `len` bytes already (nothing allocated, nothing zeroed), else `None`. For
    /// memory a caller may take ahead of its budget: what the connection's pool holds is
    /// bounded and already allocated (the shared tier is not looked in: a connection's commands
    /// waiting for their budget could empty it).
    pub fn take_dirty_pooled(&self, len: usize) -> Option<Vec<u8>> {
        let mut b = self.pooled(len, Fit::Filled, false)?;
        b.truncate(len);
        Some(b)
    }

    /// An empty buffer with room for at least `len` bytes, from the pool when one is large
    /// enough: for a caller that appends what it fills it with (a READ's data, which every
    /// store writes after clearing the buffer). Nothing is zeroed, whatever the buffer held.
    pub fn take_room(&self, len: usize) -> Vec<u8> {
        match self.pooled(len, Fit::Room, true) {
            Some(mut b) => {
                b.clear();
                b
            }
            None => Vec::with_capacity(len),
        }
    }

    /// [`take_dirty_vec`](Self::take_dirty_vec) as a `BytesMut` (no copy).
    pub fn take_dirty(&self, len: usize) -> BytesMut {
        into_bytes_mut(self.take_dirty_vec(len))
    }

    /// Keep `buf` for a later take: in the connection's pool if it has room (in buffers and
    /// bytes) and `buf` is at most 8 MiB, else in the shared tier if it is 1 MiB or more and
    /// that has room; else it is freed.
    pub fn give_vec(&self, buf: Vec<u8>) {
        let cap = buf.capacity();
        let buf = if cap <= POOL_MAX_BUFFER {
            let refused = self.free.lock().unwrap_or_else(|e| e.into_inner()).keep(buf, POOL_BUFFERS, POOL_MAX_BYTES);
            match refused {
                None => return,
                Some(b) => b,
            }
        } else {
            buf
        };
        if cap >= SHARED_MIN_BUFFER {
            let refused = SHARED.lock().unwrap_or_else(|e| e.into_inner()).keep(buf, SHARED_BUFFERS, SHARED_POOL_MAX_BYTES);
            // Freed outside the lock.
            drop(refused);
        }
    }

    /// [`take_vec`](Self::take_vec) as a `BytesMut` (no copy).
    pub fn take(&self, len: usize) -> BytesMut {
        into_bytes_mut(self.take_vec(len))
    }

    /// [`give_vec`](Self::give_vec) for a `BytesMut` (no copy when it owns its whole buffer).
    pub fn give(&self, buf: BytesMut) {
        self.give_vec(Vec::from(buf));
    }
}

/// A vector as `BytesMut`, without a copy.
pub fn into_bytes_mut(v: Vec<u8>) -> BytesMut {
    Bytes::from(v).try_into_mut().unwrap_or_else(|b| BytesMut::from(&b[..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Held by the tests that put buffers in the shared tier or look at it (the tests of this
    /// binary run in parallel, and the tier is the process's).
    static SHARED_TESTS: Mutex<()> = Mutex::new(());

    fn shared_tests() -> std::sync::MutexGuard<'static, ()> {
        SHARED_TESTS.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[test]
    fn room_is_empty_and_reused_without_zeroing() {
        let pool = BufferPool::default();
        let fresh = pool.take_room(4096);
        assert!(fresh.is_empty() && fresh.capacity() >= 4096);
        let mut b = pool.take_dirty_vec(8192);
        b.fill(0xaa);
        let ptr = b.as_ptr();
        pool.give_vec(b);
        let again = pool.take_room(4096);
        assert_eq!(again.as_ptr(), ptr, "the pooled buffer is reused");
        assert!(again.is_empty() && again.capacity() >= 8192);
        assert!(pool.take_room(4096).capacity() >= 4096, "an empty pool makes a new one");
    }

    #[test]
    fn reused_buffers_come_back_zeroed_and_sized() {
        let _shared = shared_tests();
        let pool = BufferPool::default();
        let mut b = pool.take(4096);
        b.fill(0xaa);
        let ptr = b.as_ptr();
        pool.give(b);
        let again = pool.take(1000);
        assert_eq!(again.as_ptr(), ptr, "the pooled buffer is reused");
        assert_eq!(again.len(), 1000);
        assert!(again.iter().all(|&x| x == 0));
        // Too large for the connection's pool: not kept there.
        pool.give(BytesMut::zeroed(POOL_MAX_BUFFER + 1));
        assert!(pool.free.lock().unwrap().buffers.is_empty());
        // Vec and BytesMut share the pool.
        let v = pool.take_vec(100);
        let vp = v.as_ptr();
        pool.give_vec(v);
        let b = pool.take(50);
        assert_eq!(b.as_ptr(), vp);
        // A dirty take keeps what was there (and zero-extends).
        let mut b = b;
        b.fill(7);
        pool.give(b);
        let d = pool.take_dirty_vec(60);
        assert_eq!(d.as_ptr(), vp);
        assert_eq!(&d[..50], &[7; 50]);
        assert_eq!(&d[50..], &[0; 10]);
    }

    /// A dirty take prefers a buffer already holding the bytes it needs: a write's buffer
    /// taken for its first burst (shortened) and then for the whole transfer used to be
    /// zero-filled back to length on every command.
    #[test]
    fn a_dirty_take_prefers_a_buffer_already_that_long() {
        let pool = BufferPool::default();
        let short = pool.take_dirty_vec(256 << 10);
        let long = pool.take_dirty_vec(256 << 10);
        let (sp, lp) = (short.as_ptr(), long.as_ptr());
        let mut short = short;
        short.truncate(64 << 10);
        pool.give_vec(short);
        pool.give_vec(long);
        let whole = pool.take_dirty_vec(256 << 10);
        assert_eq!(whole.as_ptr(), lp, "the full-length buffer, not the shortened one");
        // Only a buffer that long is taken ahead of a budget; nothing is allocated for it.
        assert_eq!(pool.take_dirty_pooled(128 << 10), None);
        let first = pool.take_dirty_pooled(64 << 10).expect("the shortened buffer");
        assert_eq!((first.as_ptr(), first.len()), (sp, 64 << 10));
        assert_eq!(pool.take_dirty_pooled(1), None, "the pool is empty");
        // A zeroed take picks the smallest that fits, whatever it holds.
        pool.give_vec(vec![1; 8192]);
        pool.give_vec(whole);
        assert_eq!(pool.take_vec(4096).capacity(), 8192);
    }

    /// What a connection keeps once its commands end is bounded in bytes, not only in buffers
    /// (32 buffers of 8 MiB used to stay: 256 MiB per connection, outside every budget).
    #[test]
    fn the_pool_keeps_at_most_its_byte_bound() {
        let _shared = shared_tests();
        let pool = BufferPool::default();
        let kept = |p: &BufferPool| {
            let f = p.free.lock().unwrap();
            (f.buffers.len(), f.bytes, f.buffers.iter().map(Vec::capacity).sum::<usize>())
        };
        let mib = 1 << 20;
        for _ in 0..12 {
            pool.give_vec(vec![0u8; mib]);
        }
        let n = POOL_MAX_BYTES / mib;
        assert_eq!(kept(&pool), (n, POOL_MAX_BYTES, POOL_MAX_BYTES));
        // A take makes room for one more.
        let b = pool.take_vec(4096);
        assert_eq!(b.capacity(), mib);
        assert_eq!(kept(&pool), (n - 1, POOL_MAX_BYTES - mib, POOL_MAX_BYTES - mib));
        pool.give_vec(vec![0u8; 2 * mib]);
        assert_eq!(kept(&pool).0, n - 1, "no room for 2 MiB");
        pool.give_vec(b);
        assert_eq!(kept(&pool), (n, POOL_MAX_BYTES, POOL_MAX_BYTES));
    }

    /// Buffers above what a connection keeps go to the process-wide tier, where another
    /// connection's large take finds them (a 16 MiB write used to page-fault its whole buffer
    /// in at the target, every time); small takes never look there.
    #[test]
    fn large_buffers_are_shared_by_connections_within_a_bound() {
        let _shared = shared_tests();
        // A size no other test here uses, so the shared tier's other buffers do not interfere.
        let len = POOL_MAX_BUFFER + 12_345;
        let (a, b) = (BufferPool::default(), BufferPool::default());
        let mut big = a.take_dirty_vec(len);
        big.fill(0x5a);
        let ptr = big.as_ptr();
        a.give_vec(big);
        assert!(a.free.lock().unwrap().buffers.is_empty(), "too large for the connection's pool");
        assert!(SHARED.lock().unwrap().buffers.iter().any(|b| b.as_ptr() == ptr), "kept for the process");
        // Not for memory taken ahead of a budget: that comes from the connection's own pool.
        assert_eq!(b.take_dirty_pooled(len), None);
        let again = b.take_dirty_vec(len);
        assert_eq!(again.as_ptr(), ptr, "another connection reuses it");
        assert!(again.iter().all(|&x| x == 0x5a), "a dirty take spares the memset");
        b.give_vec(again);
        let zeroed = a.take_vec(len);
        assert_eq!(zeroed.as_ptr(), ptr);
        assert!(zeroed.iter().all(|&x| x == 0), "a zeroed take from the shared tier is zeroed");
        a.give_vec(zeroed);
        // A take below 1 MiB does not look there: whatever the tier holds stays.
        let before: Vec<_> = SHARED.lock().unwrap().buffers.iter().map(|b| b.as_ptr()).collect();
        let small = b.take_room(SHARED_MIN_BUFFER - 1);
        let zeroed_small = b.take_vec(SHARED_MIN_BUFFER - 1);
        let after: Vec<_> = SHARED.lock().unwrap().buffers.iter().map(|b| b.as_ptr()).collect();
        assert_eq!(before, after, "the shared tier untouched by small takes");
        drop((small, zeroed_small));
        // A connection's pool overflows into the shared tier only with buffers of 1 MiB or more.
        let full = BufferPool::default();
        for _ in 0..POOL_BUFFERS {
            full.give_vec(vec![0; 4096]);
        }
        full.give_vec(vec![0u8; 8192]);
        full.give_vec(vec![0u8; SHARED_MIN_BUFFER - 1]);
        assert!(SHARED.lock().unwrap().buffers.iter().all(|b| b.capacity() >= SHARED_MIN_BUFFER));
        let last = b.take_vec(len);
        assert_eq!(last.as_ptr(), ptr, "still there");
    }

    /// The shared tier's bounds, as `Free::keep` applies them.
    #[test]
    fn a_tier_keeps_at_most_its_buffers_and_bytes() {
        let mut tier = Free::default();
        let mib = 1 << 20;
        for _ in 0..SHARED_BUFFERS {
            assert_eq!(tier.keep(vec![0; mib], SHARED_BUFFERS, SHARED_POOL_MAX_BYTES), None);
        }
        assert!(tier.keep(vec![0; mib], SHARED_BUFFERS, SHARED_POOL_MAX_BYTES).is_some(), "16 buffers at most");
        let mut tier = Free::default();
        for _ in 0..SHARED_POOL_MAX_BYTES / (16 * mib) {
            assert_eq!(tier.keep(vec![0; 16 * mib], SHARED_BUFFERS, SHARED_POOL_MAX_BYTES), None);
        }
        assert_eq!(tier.bytes, SHARED_POOL_MAX_BYTES);
        assert!(tier.keep(vec![0; mib], SHARED_BUFFERS, SHARED_POOL_MAX_BYTES).is_some(), "64 MiB at most");
        assert_eq!(tier.take(16 * mib, Fit::Room).map(|b| b.capacity()), Some(16 * mib));
        assert_eq!(tier.bytes, SHARED_POOL_MAX_BYTES - 16 * mib);
    }
}
