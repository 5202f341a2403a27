//! Integration tests against a real Ceph cluster (see `common` for how one is found).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::*;
use riser_rbd::{Cluster, ClusterOptions, CompareError, Error, Image, features};

const MIB: u64 = 1 << 20;

#[test]
fn cache_off_and_identity() {
    let Some(conf) = ceph_conf("cache_off_and_identity") else { return };
    let cluster = connect(&conf);
    assert_eq!(cluster.conf_get("rbd_cache").unwrap(), "false");
    let cached = Cluster::connect(&ClusterOptions { conf: Some(conf.clone()), ..Default::default() }).unwrap();
    assert_eq!(cached.conf_get("rbd_cache").unwrap(), "true", "librbd's default");
    assert_ne!(cluster.instance_id(), cached.instance_id());
    let addr = cluster.address().unwrap();
    let bl = cluster.blocklist_address().unwrap();
    eprintln!("address {addr:?} -> blocklist address {bl:?}, instance {}", cluster.instance_id());
    assert!(bl.contains('/') && !bl.starts_with('['), "{bl}");

    let io = cluster.ioctx(POOL).unwrap();
    assert!(cluster.ioctx("no-such-pool").is_err());
    let (name, img) = fresh_image(&io, "ident", 64 * MIB);
    assert_eq!(img.size().unwrap(), 64 * MIB);
    let st = img.stat().unwrap();
    assert_eq!(st.size, 64 * MIB);
    assert_eq!(st.obj_size, 1 << st.order);
    assert_eq!(st.num_objs, 64 * MIB / st.obj_size);
    let id = img.id().unwrap();
    assert!(!id.is_empty(), "format 2 images have an id");
    let f = img.features().unwrap();
    eprintln!("image {name}: id {id}, features {f:#x}, order {}", st.order);
    assert_ne!(f & features::EXCLUSIVE_LOCK, 0);

    assert_eq!(img.metadata_get("riser.missing").unwrap(), None);
    let long = "x".repeat(1000);
    img.metadata_set("riser.key", &long).unwrap();
    assert_eq!(img.metadata_get("riser.key").unwrap().as_deref(), Some(long.as_str()));
    assert!(matches!(img.metadata_set("bad\0key", "v"), Err(Error::InvalidName(_))));
    assert!(matches!(Image::open(&io, "no-such-image"), Err(Error::Rados { op: "rbd_open", errno: -2 })));
    drop(img);
    Image::remove(&io, &name).unwrap();
}

#[test]
fn write_read_round_trip() {
    let Some(conf) = ceph_conf("write_read_round_trip") else { return };
    let cluster = connect(&conf);
    let io = cluster.ioctx(POOL).unwrap();
    let (_, img) = fresh_image(&io, "rw", 64 * MIB);
    // Unwritten areas read as zeros.
    let zeros = block_on(img.read(5 * MIB, 8192, Vec::new())).unwrap();
    assert_eq!(zeros, vec![0u8; 8192]);

    let cases: &[(u64, usize)] = &[(0, 4096), (4096 * 7, 65536), (4 * MIB - 512, 1024), (10 * MIB + 123, 777), (63 * MIB, MIB as usize)];
    let t = Instant::now();
    // All writes in flight at once, then all reads.
    let writes: Vec<_> =
        cases.iter().enumerate().map(|(i, &(off, len))| img.write(off, Bytes::from(random_bytes(i as u64 + 1, len)), i % 2 == 0)).collect();
    for w in writes {
        block_on(w).unwrap();
    }
    block_on(img.flush()).unwrap();
    let mut buf = Vec::with_capacity(MIB as usize);
    for (i, &(off, len)) in cases.iter().enumerate() {
        buf = block_on(img.read(off, len, buf)).unwrap();
        assert_eq!(buf, random_bytes(i as u64 + 1, len), "case {i} at {off}");
    }
    eprintln!("{} writes + flush + reads in {:?}", cases.len(), t.elapsed());

    // A read past the end is short or refused, never a panic.
    match block_on(img.read(64 * MIB - 512, 4096, Vec::new())) {
        Ok(v) => assert!(v.len() <= 4096),
        Err(e) => eprintln!("read past the end: {e}"),
    }
    // The futures are Send + 'static: run one on another thread.
    let f = img.read(0, 4096, Vec::new());
    let got = std::thread::spawn(move || block_on(f)).join().unwrap().unwrap();
    assert_eq!(got, random_bytes(1, 4096));
}

#[test]
fn discard_write_same_write_zeroes() {
    let Some(conf) = ceph_conf("discard_write_same_write_zeroes") else { return };
    let cluster = connect(&conf);
    let io = cluster.ioctx(POOL).unwrap();
    let (_, img) = fresh_image(&io, "zero", 64 * MIB);
    let obj = img.stat().unwrap().obj_size;
    let fill = random_bytes(42, (2 * obj) as usize);
    block_on(img.write(0, Bytes::from(fill.clone()), false)).unwrap();

    // Discard one whole object: reads back zeros.
    block_on(img.discard(0, obj)).unwrap();
    let v = block_on(img.read(0, obj as usize, Vec::new())).unwrap();
    assert!(v.iter().all(|&b| b == 0), "discarded object reads zeros");
    // A small discard inside the second object: measure what librbd does.
    block_on(img.discard(obj + 4096, 65536)).unwrap();
    let v = block_on(img.read(obj + 4096, 65536, Vec::new())).unwrap();
    let zeroed = v.iter().all(|&b| b == 0);
    eprintln!("64 KiB discard inside an object: zeroed = {zeroed}");
    let v = block_on(img.read(obj, 4096, Vec::new())).unwrap();
    assert_eq!(&v[..], &fill[obj as usize..obj as usize + 4096], "data before the discard kept");

    // write_same: a 512-byte pattern over 64 KiB at an unaligned-to-object offset.
    let pattern = random_bytes(7, 512);
    block_on(img.write_same(3 * MIB, 65536, Bytes::from(pattern.clone()))).unwrap();
    let v = block_on(img.read(3 * MIB, 65536, Vec::new())).unwrap();
    for chunk in v.chunks(512) {
        assert_eq!(chunk, &pattern[..]);
    }
    // len not a multiple of the pattern: an error, not a panic.
    let r = block_on(img.write_same(3 * MIB, 1000, Bytes::from(pattern.clone())));
    assert!(r.is_err(), "write_same with a partial pattern: {r:?}");

    // write_zeroes over part of the pattern.
    block_on(img.write_zeroes(3 * MIB + 512, 1024)).unwrap();
    let v = block_on(img.read(3 * MIB, 2048, Vec::new())).unwrap();
    assert_eq!(&v[..512], &pattern[..]);
    assert!(v[512..1536].iter().all(|&b| b == 0));
    assert_eq!(&v[1536..], &pattern[..512]);
}

#[test]
fn compare_and_write() {
    let Some(conf) = ceph_conf("compare_and_write") else { return };
    let cluster = connect(&conf);
    let io = cluster.ioctx(POOL).unwrap();
    let (_, img) = fresh_image(&io, "caw", 64 * MIB);
    let off = 8192 + 512;
    let old = random_bytes(1, 512);
    let new = random_bytes(2, 512);
    block_on(img.write(off, Bytes::from(old.clone()), false)).unwrap();

    // Match: written.
    block_on(img.compare_and_write(off, Bytes::from(old.clone()), Bytes::from(new.clone()))).unwrap();
    assert_eq!(block_on(img.read(off, 512, Vec::new())).unwrap(), new);

    // Mismatch at byte 100 of the sector: reported relative to the request, nothing written.
    let mut wrong = new.clone();
    wrong[100] ^= 0xff;
    let r = block_on(img.compare_and_write(off, Bytes::from(wrong), Bytes::from(old.clone())));
    assert_eq!(r, Err(CompareError::Mismatch { offset: 100 }));
    assert_eq!(block_on(img.read(off, 512, Vec::new())).unwrap(), new, "unchanged after a miscompare");

    // 4096 bytes: refused with an error (librbd 16: one 512-byte sector only), never a panic.
    let r = block_on(img.compare_and_write(0, Bytes::from(vec![0; 4096]), Bytes::from(vec![1; 4096])));
    eprintln!("compare_and_write of 4096 bytes: {r:?}");
    assert!(matches!(r, Err(CompareError::Io(_))), "{r:?}");
    // Unequal lengths: refused before librbd.
    let r = block_on(img.compare_and_write(0, Bytes::from(vec![0; 512]), Bytes::from(vec![1; 256])));
    assert!(matches!(r, Err(CompareError::Io(Error::InvalidArgument(_)))), "{r:?}");
}

#[test]
fn dropped_futures_are_harmless() {
    let Some(conf) = ceph_conf("dropped_futures_are_harmless") else { return };
    let cluster = connect(&conf);
    let io = cluster.ioctx(POOL).unwrap();
    let (_, img) = fresh_image(&io, "drop", 64 * MIB);
    let data = random_bytes(9, MIB as usize);
    block_on(img.write(0, Bytes::from(data.clone()), false)).unwrap();

    // Many reads dropped in flight (some polled once first), and writes of other ranges.
    let waker = std::task::Waker::noop();
    let mut cx = std::task::Context::from_waker(waker);
    for i in 0..300u64 {
        let mut f = img.read((i % 16) * 65536, 65536, Vec::with_capacity(65536));
        if i % 3 == 0 {
            let _ = std::pin::Pin::new(&mut f).poll(&mut cx);
        }
        drop(f);
        if i % 10 == 0 {
            drop(img.write(32 * MIB + i * 4096, Bytes::from(vec![i as u8; 4096]), false));
        }
    }
    // Dropping the last Image handle with requests still in flight: librbd closes it later,
    // off its own threads.
    let img2 = Image::open(&io, &unique("none")).err();
    assert!(img2.is_some());
    let extra = img.clone();
    for _ in 0..50 {
        drop(extra.read(0, 65536, Vec::new()));
    }
    drop(extra);

    // Later I/O sees consistent data.
    block_on(img.flush()).unwrap();
    let v = block_on(img.read(0, MIB as usize, Vec::new())).unwrap();
    assert_eq!(v, data);
    for i in (0..300u64).step_by(10) {
        let v = block_on(img.read(32 * MIB + i * 4096, 4096, Vec::new())).unwrap();
        assert_eq!(v, vec![i as u8; 4096], "dropped write {i} still landed");
    }
}

use std::future::Future;

#[test]
fn update_watch_sees_resize() {
    let Some(conf) = ceph_conf("update_watch_sees_resize") else { return };
    let a = connect(&conf);
    let b = connect(&conf);
    let io_a = a.ioctx(POOL).unwrap();
    let io_b = b.ioctx(POOL).unwrap();
    let (name, img_a) = fresh_image(&io_a, "resize", 64 * MIB);
    let img_b = Image::open(&io_b, &name).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let s = Arc::clone(&seen);
    let watch = img_a
        .watch_updates(move || {
            s.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    let t = Instant::now();
    img_b.resize(96 * MIB).unwrap();
    assert!(wait_until(Duration::from_secs(10), || seen.load(Ordering::SeqCst) > 0), "no update callback");
    eprintln!("update callback {:?} after the resize call started", t.elapsed());
    assert!(wait_until(Duration::from_secs(5), || img_a.size().unwrap() == 96 * MIB));
    drop(watch);
    let before = seen.load(Ordering::SeqCst);
    img_b.resize(80 * MIB).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(seen.load(Ordering::SeqCst), before, "no callback after the watch was dropped");

    // Dropping an UpdateWatch while its callback runs waits for the callback to return.
    let state = Arc::new(AtomicUsize::new(0)); // 1: running, 2: returned
    let s = Arc::clone(&state);
    let watch = img_a
        .watch_updates(move || {
            if s.compare_exchange(0, 1, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                std::thread::sleep(Duration::from_millis(500));
                s.store(2, Ordering::SeqCst);
            }
        })
        .unwrap();
    // Resize from another thread: the resize itself waits for the watchers' acknowledgement.
    let resizer = {
        let img_b = img_b.clone();
        std::thread::spawn(move || {
            let t = Instant::now();
            img_b.resize(72 * MIB).unwrap();
            t.elapsed()
        })
    };
    assert!(wait_until(Duration::from_secs(10), || state.load(Ordering::SeqCst) >= 1));
    assert_eq!(state.load(Ordering::SeqCst), 1, "callback still running");
    let t = Instant::now();
    drop(watch);
    eprintln!("UpdateWatch drop during a running callback took {:?}", t.elapsed());
    assert_eq!(state.load(Ordering::SeqCst), 2, "rbd_update_unwatch returned while the callback ran");
    eprintln!("resize with a 500 ms update callback on the other client took {:?}", resizer.join().unwrap());
}

#[test]
fn queue_depth_throughput() {
    let Some(conf) = ceph_conf("queue_depth_throughput") else { return };
    let cluster = connect(&conf);
    let io = cluster.ioctx(POOL).unwrap();
    let (_, img) = fresh_image(&io, "qd", 64 * MIB);
    let n = 2000u64;
    let qd = 32;
    let block = 4096usize;
    let offset = |i: u64| (i.wrapping_mul(2_654_435_761) % (64 * MIB / block as u64)) * block as u64;
    let data = Bytes::from(random_bytes(5, block));
    for (what, write) in [("4 KiB random writes", true), ("4 KiB random reads", false)] {
        let t = Instant::now();
        let mut inflight: std::collections::VecDeque<Box<dyn Future<Output = Result<(), Error>> + Send + Unpin>> = Default::default();
        for i in 0..n {
            if inflight.len() == qd {
                block_on(inflight.pop_front().unwrap()).unwrap();
            }
            let f: Box<dyn Future<Output = Result<(), Error>> + Send + Unpin> = if write {
                Box::new(img.write(offset(i), data.clone(), false))
            } else {
                let f = img.read(offset(i), block, Vec::new());
                Box::new(FutMap(f))
            };
            inflight.push_back(f);
        }
        for f in inflight {
            block_on(f).unwrap();
        }
        let secs = t.elapsed().as_secs_f64();
        eprintln!("{what}, queue depth {qd}: {n} in {secs:.2} s = {:.0} IOPS", n as f64 / secs);
    }
}

/// Maps a read's buffer away (for a queue of mixed futures).
struct FutMap(riser_rbd::IoFuture<Result<Vec<u8>, Error>>);

impl Future for FutMap {
    type Output = Result<(), Error>;
    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        std::pin::Pin::new(&mut self.0).poll(cx).map(|r| r.map(drop))
    }
}

#[test]
fn exclusive_lock_acquire_release() {
    let Some(conf) = ceph_conf("exclusive_lock_acquire_release") else { return };
    let cluster = connect(&conf);
    let io = cluster.ioctx(POOL).unwrap();
    let (_, img) = fresh_image(&io, "lock", 64 * MIB);
    assert!(!img.is_lock_owner().unwrap());
    assert_eq!(img.lock_get_owners().unwrap(), Vec::<String>::new());
    img.lock_acquire().unwrap();
    assert!(img.is_lock_owner().unwrap());
    let owners = img.lock_get_owners().unwrap();
    eprintln!("lock owners: {owners:?} (instance {})", cluster.instance_id());
    assert_eq!(owners.len(), 1);
    // librbd names owners by messenger address, not client id.
    assert_eq!(owners[0], cluster.blocklist_address().unwrap(), "{owners:?}");
    block_on(img.write(0, Bytes::from_static(&[1; 512]), true)).unwrap();
    img.lock_release().unwrap();
    assert!(!img.is_lock_owner().unwrap());
    assert_eq!(img.lock_get_owners().unwrap(), Vec::<String>::new());
}

#[test]
fn watch_notify_ack_and_timeout() {
    let Some(conf) = ceph_conf("watch_notify_ack_and_timeout") else { return };
    let a = connect(&conf);
    let b = connect(&conf);
    let notifier = connect(&conf);
    let io_a = a.ioctx(POOL).unwrap();
    let io_b = b.ioctx(POOL).unwrap();
    let io_n = notifier.ioctx(POOL).unwrap();
    let oid = unique("riser-rbd-notify");
    io_n.write_full(&oid, &[]).unwrap();

    let got = Arc::new(std::sync::Mutex::new(Vec::new()));
    let g = Arc::clone(&got);
    let fast = io_a
        .watch(&oid, move |n| {
            let mut reply = b"pong:".to_vec();
            reply.extend_from_slice(&n.payload);
            g.lock().unwrap().push(n);
            reply
        })
        .unwrap();
    let t = Instant::now();
    let replies = io_n.notify(&oid, b"ping", 5000).unwrap();
    eprintln!("notify round trip with one watcher: {:?}", t.elapsed());
    assert_eq!(replies.timeouts, vec![]);
    assert_eq!(replies.acks.len(), 1);
    assert_eq!(replies.acks[0].gid, a.instance_id());
    assert_eq!(replies.acks[0].cookie, fast.cookie());
    assert_eq!(replies.acks[0].payload, b"pong:ping");
    let n = got.lock().unwrap()[0].clone();
    assert_eq!(n.notifier_id, notifier.instance_id());
    assert_eq!(n.cookie, fast.cookie());
    assert_eq!(n.payload, b"ping");
    assert!(fast.check().is_ok());

    // A watcher that sleeps past the notifier's timeout shows up as a timeout.
    let slow = io_b
        .watch(&oid, |_| {
            std::thread::sleep(Duration::from_millis(2500));
            b"late".to_vec()
        })
        .unwrap();
    let t = Instant::now();
    // 400 ms is rounded up to the OSD's one-second granularity.
    let replies = io_n.notify(&oid, b"ping2", 400).unwrap();
    let took = t.elapsed();
    eprintln!("notify with a slow watcher: {took:?}, {replies:?}");
    assert_eq!(replies.acks.len(), 1);
    assert_eq!(replies.acks[0].gid, a.instance_id());
    assert_eq!(replies.timeouts.len(), 1);
    assert_eq!(replies.timeouts[0].gid, b.instance_id());
    assert_eq!(replies.timeouts[0].cookie, slow.cookie());
    assert!(took < Duration::from_millis(2400), "notify waited for the slow watcher: {took:?}");

    // Drop waits for the slow callback; afterwards no watcher is left.
    let t = Instant::now();
    drop(slow);
    drop(fast);
    eprintln!("dropping the watches took {:?}", t.elapsed());
    let replies = io_n.notify(&oid, b"nobody", 1000).unwrap();
    assert_eq!(replies.acks, vec![]);
    assert_eq!(replies.timeouts, vec![]);
    // Watching a missing object fails cleanly.
    assert!(io_a.watch(&unique("missing"), |_| Vec::new()).is_err());
}

/// A watcher that acknowledges later: its callback returns at once (the next notification is
/// delivered meanwhile), and the notifier waits for the ack given afterwards from another
/// thread, with its payload; an ack dropped unsent still answers (empty).
#[test]
fn a_notification_acknowledged_later_from_another_thread() {
    let Some(conf) = ceph_conf("a_notification_acknowledged_later_from_another_thread") else { return };
    let a = connect(&conf);
    let notifier = connect(&conf);
    let io_a = a.ioctx(POOL).unwrap();
    let io_n = notifier.ioctx(POOL).unwrap();
    let oid = unique("riser-rbd-ack-later");
    io_n.write_full(&oid, &[]).unwrap();
    let watch = io_a
        .watch_acking_later(&oid, 0, |n, ack| {
            if n.payload == b"drop" {
                drop(ack);
                return;
            }
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(1500));
                let mut reply = b"later:".to_vec();
                reply.extend_from_slice(&n.payload);
                ack.ack(&reply);
            });
        })
        .unwrap();
    let t = Instant::now();
    let replies = io_n.notify(&oid, b"reset", 5000).unwrap();
    let took = t.elapsed();
    assert_eq!(replies.timeouts, vec![]);
    assert_eq!(replies.acks.len(), 1);
    assert_eq!((replies.acks[0].gid, replies.acks[0].cookie), (a.instance_id(), watch.cookie()));
    assert_eq!(replies.acks[0].payload, b"later:reset");
    assert!(took >= Duration::from_millis(1400), "the notifier did not wait for the later ack: {took:?}");
    // Two at once: the callback returned, so the second is delivered while the first's ack is
    // owed, and both are answered in about one delay.
    let (io_n2, oid2) = (notifier.ioctx(POOL).unwrap(), oid.clone());
    let t = Instant::now();
    let other = std::thread::spawn(move || io_n2.notify(&oid2, b"one", 5000).unwrap());
    let second = io_n.notify(&oid, b"two", 5000).unwrap();
    let first = other.join().unwrap();
    let took = t.elapsed();
    assert_eq!(first.acks[0].payload, b"later:one");
    assert_eq!(second.acks[0].payload, b"later:two");
    assert!(took < Duration::from_millis(2900), "the notifications were answered one after the other: {took:?}");
    let replies = io_n.notify(&oid, b"drop", 5000).unwrap();
    assert_eq!((replies.acks.len(), replies.timeouts.len()), (1, 0), "{replies:?}");
    assert_eq!(replies.acks[0].payload, b"");
    drop(watch);
}

#[test]
fn lock_break_blocklists_the_old_owner() {
    let Some(conf) = ceph_conf("lock_break_blocklists_the_old_owner") else { return };
    let a = connect(&conf);
    let b = connect(&conf);
    let io_a = a.ioctx(POOL).unwrap();
    let io_b = b.ioctx(POOL).unwrap();
    let (name, img_a) = fresh_image(&io_a, "break", 64 * MIB);
    img_a.lock_acquire().unwrap();
    block_on(img_a.write(0, Bytes::from_static(&[0xaa; 4096]), false)).unwrap();

    let img_b = Image::open(&io_b, &name).unwrap();
    // B writing while A holds the lock explicitly: A refuses to hand it over.
    let t = Instant::now();
    let r = block_on_timeout(img_b.write(4096, Bytes::from_static(&[0xbb; 4096]), false), Duration::from_secs(20));
    eprintln!("non-owner write while the owner locked explicitly: {r:?} after {:?}", t.elapsed());
    assert!(matches!(r, Some(Err(_))), "{r:?}");

    let owners = img_b.lock_get_owners().unwrap();
    assert_eq!(owners.len(), 1, "{owners:?}");
    let t = Instant::now();
    img_b.lock_break(&owners[0]).unwrap();
    eprintln!("lock_break took {:?}", t.elapsed());
    img_b.lock_acquire().unwrap();
    assert!(img_b.is_lock_owner().unwrap());
    block_on(img_b.write(4096, Bytes::from_static(&[0xbb; 4096]), true)).unwrap();

    // A is blocklisted: its writes fail (and never land).
    let t = Instant::now();
    let r = block_on_timeout(img_a.write(0, Bytes::from_static(&[0xcc; 4096]), false), Duration::from_secs(30));
    eprintln!("old owner's write after the break: {r:?} after {:?}", t.elapsed());
    let Some(Err(e)) = r else { panic!("old owner's write did not fail: {r:?}") };
    eprintln!("old owner's error: {e}, blocklisted = {}", e.is_blocklisted());
    let v = block_on(img_b.read(0, 8192, Vec::new())).unwrap();
    assert!(v[..4096].iter().all(|&x| x == 0xaa));
    assert!(v[4096..].iter().all(|&x| x == 0xbb));
    // A's plain RADOS writes fail too.
    let r = io_a.write_full(&unique("after-blocklist"), b"x");
    assert!(r.as_ref().is_err_and(Error::is_blocklisted), "{r:?}");
}

#[test]
fn explicit_blocklist_stops_a_client() {
    let Some(conf) = ceph_conf("explicit_blocklist_stops_a_client") else { return };
    let victim = connect(&conf);
    let admin = connect(&conf);
    let io_v = victim.ioctx(POOL).unwrap();
    let oid = unique("bl");
    io_v.write_full(&oid, b"before").unwrap();
    admin.blocklist_add(&victim.blocklist_address().unwrap(), 600).unwrap();
    let t = Instant::now();
    let r = io_v.write_full(&oid, b"after");
    eprintln!("write after blocklist_add: {r:?} after {:?}", t.elapsed());
    assert!(r.as_ref().is_err_and(Error::is_blocklisted), "{r:?}");
    assert!(matches!(admin.blocklist_add("not an address", 1), Err(Error::Rados { .. })));
}
