//! Multipath against two in-process riser gateways that export one shared store (one
//! `RamBackend` behind two `LogicalUnit`s of one identity) under one target name, each its own
//! portal group, relative port and ALUA target port group. A gateway is killed mid-I/O (its
//! runtime shut down, so its connections die at once), I/O goes on through the other, every
//! acknowledged write reads back, and the gateway's path comes back when it is started again.
#![cfg(feature = "tcp")]

mod common;

use bytes::Bytes;
use common::relay_refusing;
use riser_initiator::{Lun, Multipath, MultipathConfig, MultipathError, PathSpec, SessionConfig};
use riser_target::backend::{BlockBackend, RamBackend};
use riser_target::lu::{AccessState, LogicalUnit, LuIdentity, TargetPortGroup};
use riser_target::server::{Node, Portal, PortalGroup, Target, TargetConfig};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

const TARGET: &str = "iqn.2026-11.io.riser:mpath";
const INITIATOR: &str = "iqn.2026-11.io.riser:mpath-host";
const BLOCK: u32 = 512;
const BLOCKS: u64 = 16 * 1024;
const DEPTH: usize = 16;
/// Blocks each worker owns (workers never write each other's blocks).
const REGION: u64 = BLOCKS / DEPTH as u64;

/// One gateway: a target in a runtime of its own, reached through a relay on its public
/// address that stands for the gateway's network stack. Killing the gateway shuts its runtime
/// down and drops every connection of the relay at once, as a crash would: what the gateway had
/// not answered yet is never answered. (The relay is what makes "commands in flight at the
/// crash" certain: a runtime shut down finishes what its worker is doing first.)
struct Gateway {
    rt: Option<tokio::runtime::Runtime>,
    target: Arc<Target>,
    /// The gateway's unit over the shared backend.
    lu: Arc<LogicalUnit>,
    /// The public address (the relay's).
    addr: SocketAddr,
    relay: tokio::task::JoinHandle<()>,
    frozen: Arc<AtomicBool>,
    /// Set: new connections are closed at once (logins fail), those up go on.
    refusing: Arc<AtomicBool>,
}

impl Gateway {
    /// Serve the shared `backend` as LUN 0 of [`TARGET`] in portal group `group` (also its relative
    /// port and target port group), publicly on `addr` (a fresh port if `None`).
    async fn start(backend: &Arc<RamBackend>, identity: &LuIdentity, group: u16, addr: Option<SocketAddr>) -> Self {
        Self::start_on(backend.clone(), identity, group, addr).await
    }

    /// [`start`](Self::start) over any store.
    async fn start_on(backend: Arc<dyn BlockBackend>, identity: &LuIdentity, group: u16, addr: Option<SocketAddr>) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let inner = listener.local_addr().unwrap();
        let lu = Arc::new(LogicalUnit::new(backend, identity.clone()));
        // Both gateways' groups, both active/optimized until a test says otherwise.
        lu.set_port_groups(vec![
            TargetPortGroup::new(1, [1], AccessState::ActiveOptimized),
            TargetPortGroup::new(2, [2], AccessState::ActiveOptimized),
        ])
        .unwrap();
        let node = Node::new(TARGET)
            .lun(lu.clone())
            .portal_group(PortalGroup::new(group).relative_port(group).port_group(group).portal(Portal::tcp(inner)));
        let target = Target::new(TargetConfig::default().node(node));
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let t = target.clone();
        rt.spawn(async move {
            let l = tokio::net::TcpListener::from_std(listener).unwrap();
            t.serve(l).await
        });
        let public = tokio::net::TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap())).await.unwrap();
        let addr = public.local_addr().unwrap();
        let (frozen, refusing) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicBool::new(false)));
        let relay = tokio::spawn(relay_refusing(public, inner, frozen.clone(), refusing.clone()));
        Self { rt: Some(rt), target, lu, addr, relay, frozen, refusing }
    }

    /// Hang: nothing more goes either way, so commands sent stay unanswered.
    fn freeze(&self) {
        self.frozen.store(true, Ordering::Release);
    }

    /// Crash: the gateway's runtime shut down, every connection dropped.
    fn kill(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.relay.abort();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }

    fn commands(&self) -> u64 {
        self.target.stats().luns.values().map(|l| l.total_commands()).sum()
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.stop();
    }
}

fn config(failover: Duration) -> MultipathConfig {
    MultipathConfig::new(SessionConfig::new(INITIATOR, TARGET).timeout(Duration::from_secs(5)))
        .failover_timeout(failover)
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200))
}

fn paths(a: &Gateway, b: &Gateway) -> Vec<PathSpec> {
    vec![PathSpec::new(a.addr.to_string(), TARGET, Lun::ZERO), PathSpec::new(b.addr.to_string(), TARGET, Lun::ZERO)]
}

/// xorshift64*: random data and offsets without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// What the workers know of the store: each block's content as last acknowledged (blocks of
/// failed writes are dropped: their content is unknown).
type Expected = Arc<Mutex<HashMap<u64, Vec<u8>>>>;

#[derive(Default)]
struct Tally {
    ops: AtomicU64,
    errors: Mutex<Vec<String>>,
    in_doubt: AtomicU64,
    mismatches: AtomicU64,
}

/// Worker `w`: write random data to its own blocks, read them back and compare, until `stop`.
/// With `verify` off it only writes.
async fn worker(mp: Multipath, w: usize, expected: Expected, tally: Arc<Tally>, stop: Arc<AtomicBool>, verify: bool) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (w as u64 + 1).wrapping_mul(0x1234_5678_9abc_def1));
    let base = w as u64 * REGION;
    while !stop.load(Ordering::Relaxed) {
        let blocks = 1 + rng.next() % 8;
        let lba = base + rng.next() % (REGION - blocks);
        let data = rng.bytes((blocks * u64::from(BLOCK)) as usize);
        match mp.write(lba, Bytes::from(data.clone()), BLOCK).await {
            Ok(()) => {
                let mut e = expected.lock().unwrap();
                for (i, chunk) in data.chunks(BLOCK as usize).enumerate() {
                    e.insert(lba + i as u64, chunk.to_vec());
                }
            }
            Err(err) => {
                if matches!(err, MultipathError::WriteInDoubt { .. }) {
                    tally.in_doubt.fetch_add(1, Ordering::Relaxed);
                }
                tally.errors.lock().unwrap().push(format!("write {lba}+{blocks}: {err}"));
                let mut e = expected.lock().unwrap();
                for i in 0..blocks {
                    e.remove(&(lba + i));
                }
                continue;
            }
        }
        if verify {
            match mp.read(lba, blocks as u32, BLOCK).await {
                Ok(d) if d[..] == data[..] => {}
                Ok(_) => {
                    tally.mismatches.fetch_add(1, Ordering::Relaxed);
                    tally.errors.lock().unwrap().push(format!("read {lba}+{blocks}: data differs from the write acknowledged"));
                }
                Err(err) => tally.errors.lock().unwrap().push(format!("read {lba}+{blocks}: {err}")),
            }
        }
        tally.ops.fetch_add(1, Ordering::Relaxed);
    }
}

fn spawn_workers(
    mp: &Multipath,
    expected: &Expected,
    tally: &Arc<Tally>,
    stop: &Arc<AtomicBool>,
    verify: bool,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..DEPTH).map(|w| tokio::spawn(worker(mp.clone(), w, expected.clone(), tally.clone(), stop.clone(), verify))).collect()
}

/// Freeze gateway `a` (path 0) and wait until at least 4 commands sent on it are certain to stay
/// unanswered. A command counts as in flight until its task has taken its answer, so right after
/// the freeze some counted ones were answered already; they are let through first.
async fn hang(a: &Gateway, mp: &Multipath) {
    a.freeze();
    tokio::time::sleep(Duration::from_millis(300)).await;
    until(Duration::from_secs(10), "commands in flight on A", || mp.paths()[0].in_flight >= 4).await;
}

/// Wait until `cond` holds (at most `within`).
async fn until(within: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let end = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Read every block whose content is known through the handle and compare.
async fn check_all(mp: &Multipath, expected: &Expected) -> usize {
    let e = expected.lock().unwrap().clone();
    for (lba, data) in &e {
        let got = mp.read(*lba, 1, BLOCK).await.unwrap();
        assert_eq!(&got[..], &data[..], "block {lba} does not hold its last acknowledged write");
    }
    e.len()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn io_goes_on_through_the_other_gateway_and_the_path_comes_back() {
    let backend = Arc::new(RamBackend::new(BLOCKS * u64::from(BLOCK), BLOCK));
    let identity = LuIdentity::random();
    let a = Gateway::start(&backend, &identity, 1, None).await;
    let b = Gateway::start(&backend, &identity, 2, None).await;
    let a_addr = a.addr;
    let mp = Multipath::connect(paths(&a, &b), config(Duration::from_secs(20))).await.unwrap();

    // Both groups active/optimized: active/active.
    assert_eq!(mp.alua_supported(), Some(true));
    let ps = mp.paths();
    assert!(ps.iter().all(|p| p.up && p.state == Some(AccessState::ActiveOptimized)), "{ps:?}");
    assert_eq!(ps.iter().map(|p| p.relative_port).collect::<Vec<_>>(), [Some(1), Some(2)]);
    assert_eq!(mp.read_capacity().await.unwrap(), (BLOCKS, BLOCK));

    let expected: Expected = Arc::default();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let workers = spawn_workers(&mp, &expected, &tally, &stop, true);

    // Both paths carry I/O.
    until(Duration::from_secs(10), "I/O on both gateways", || a.commands() > 50 && b.commands() > 50).await;
    // Kill A with commands in flight on it: it hangs first, so they stay in flight.
    hang(&a, &mp).await;
    a.kill();
    until(Duration::from_secs(10), "path A marked down", || !mp.paths()[0].up).await;

    // I/O goes on through B alone.
    let at_kill = tally.ops.load(Ordering::Relaxed);
    until(Duration::from_secs(10), "I/O through B while A is down", || tally.ops.load(Ordering::Relaxed) > at_kill + 200).await;
    assert!(!mp.paths()[0].up, "A is still dead");
    let b_before = b.commands();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(b.commands() > b_before);

    // A comes back (same address, same store and identity): its path is used again.
    let a2 = Gateway::start(&backend, &identity, 1, Some(a_addr)).await;
    until(Duration::from_secs(10), "path A back up", || mp.paths()[0].up).await;
    until(Duration::from_secs(10), "I/O through A again", || a2.commands() > 50).await;

    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let errors = tally.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "A came back within the failover timeout, so nothing may fail: {errors:?}");
    assert_eq!(tally.mismatches.load(Ordering::Relaxed), 0);
    let checked = check_all(&mp, &expected).await;
    assert!(checked > 1000, "{checked} blocks checked");

    let s = mp.stats();
    assert!(s.path_failures >= 1 && s.paths_restored >= 1, "{s:?}");
    // The commands in flight on A when it died were sent again: reads at once, writes once A's
    // path logged in again (active/active gives no other proof that A's tasks are over).
    assert!(s.reissued_reads + s.reissued_writes >= 4, "{s:?}");
    assert_eq!(s.writes_in_doubt, 0);
    mp.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_in_flight_on_a_dead_gateway_fail_clearly_when_nothing_proves_them_over() {
    let backend = Arc::new(RamBackend::new(BLOCKS * u64::from(BLOCK), BLOCK));
    let identity = LuIdentity::random();
    let a = Gateway::start(&backend, &identity, 1, None).await;
    let b = Gateway::start(&backend, &identity, 2, None).await;
    let failover = Duration::from_millis(800);
    let mp = Multipath::connect(paths(&a, &b), config(failover)).await.unwrap();

    let expected: Expected = Arc::default();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    // Writes only, so what is in flight on A when it dies is writes.
    let workers = spawn_workers(&mp, &expected, &tally, &stop, false);
    until(Duration::from_secs(10), "I/O on both gateways", || a.commands() > 50 && b.commands() > 50).await;
    hang(&a, &mp).await;
    let killed = Instant::now();
    a.kill();
    // A never comes back and the target gives no access states: the writes that were in flight
    // on A may neither be sent again nor silently dropped.
    until(Duration::from_secs(10), "a write in doubt", || tally.in_doubt.load(Ordering::Relaxed) >= 1).await;
    assert!(killed.elapsed() >= failover, "a write in doubt is reported only after the failover timeout");
    let at = tally.ops.load(Ordering::Relaxed);
    until(Duration::from_secs(10), "I/O through B", || tally.ops.load(Ordering::Relaxed) > at + 200).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let errors = tally.errors.lock().unwrap().clone();
    assert_eq!(errors.len() as u64, tally.in_doubt.load(Ordering::Relaxed), "only writes in doubt fail: {errors:?}");
    assert!(errors.iter().all(|e| e.contains("may or may not have reached the medium")), "{errors:?}");
    assert_eq!(mp.stats().writes_in_doubt, tally.in_doubt.load(Ordering::Relaxed));
    assert!(!mp.paths()[0].up);
    // Every acknowledged write is there (read through B).
    assert!(check_all(&mp, &expected).await > 1000);
    mp.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paths_to_different_units_are_refused() {
    let a = Gateway::start(&Arc::new(RamBackend::new(1 << 20, BLOCK)), &LuIdentity::random(), 1, None).await;
    let b = Gateway::start(&Arc::new(RamBackend::new(1 << 20, BLOCK)), &LuIdentity::random(), 2, None).await;
    let r = Multipath::connect(paths(&a, &b), config(Duration::from_secs(5))).await;
    let Err(e @ MultipathError::DifferentUnits { .. }) = r else { panic!("two units taken for one: {r:?}") };
    assert!(e.to_string().contains("different units"), "{e}");
    assert!(matches!(Multipath::connect(vec![], config(Duration::from_secs(5))).await, Err(MultipathError::NoPaths)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_down_at_connect_is_brought_up_later() {
    let backend = Arc::new(RamBackend::new(1 << 20, BLOCK));
    let identity = LuIdentity::random();
    let b = Gateway::start(&backend, &identity, 2, None).await;
    // A's port, with nothing listening yet.
    let a_addr = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let specs = vec![PathSpec::new(a_addr.to_string(), TARGET, Lun::ZERO), PathSpec::new(b.addr.to_string(), TARGET, Lun::ZERO)];
    let mp = Multipath::connect(specs, config(Duration::from_secs(5))).await.unwrap();
    assert_eq!(mp.paths().iter().map(|p| p.up).collect::<Vec<_>>(), [false, true]);
    mp.write(0, Bytes::from(vec![5u8; 512]), BLOCK).await.unwrap();
    let a = Gateway::start(&backend, &identity, 1, Some(a_addr)).await;
    until(Duration::from_secs(10), "path A up", || mp.paths()[0].up).await;
    let a_before = a.commands();
    for _ in 0..8 {
        assert_eq!(&mp.read(0, 1, BLOCK).await.unwrap()[..], &[5u8; 512][..]);
    }
    assert!(a.commands() > a_before, "A takes I/O once up");
    mp.close().await;
}

/// ALUA mode: the gateways report their groups' access states. Needs REPORT TARGET PORT GROUPS
/// in the target and a way to set a group's state on a gateway (see `set_state`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alua_optimized_first_and_writes_fail_over_once_the_other_group_owns_the_unit() {
    use riser_initiator::alua::AccessState::{ActiveNonOptimized, ActiveOptimized, Unavailable};
    let backend = Arc::new(RamBackend::new(BLOCKS * u64::from(BLOCK), BLOCK));
    let identity = LuIdentity::random();
    let a = Gateway::start(&backend, &identity, 1, None).await;
    let b = Gateway::start(&backend, &identity, 2, None).await;
    // A owns the unit: group 1 optimized, group 2 non-optimized, as both gateways report it.
    set_state(&a, &b, ActiveOptimized, ActiveNonOptimized);
    let mp = Multipath::connect(paths(&a, &b), config(Duration::from_secs(20))).await.unwrap();
    assert_eq!(mp.alua_supported(), Some(true));
    let ps = mp.paths();
    assert_eq!(ps.iter().map(|p| p.group).collect::<Vec<_>>(), [Some(1), Some(2)], "VPD 0x83 target port group designators");
    assert_eq!(ps.iter().map(|p| p.state).collect::<Vec<_>>(), [Some(ActiveOptimized), Some(ActiveNonOptimized)]);

    // All I/O goes to the optimized path.
    let b_before = b.commands();
    for lba in 0..64 {
        mp.write(lba, Bytes::from(vec![lba as u8; 512]), BLOCK).await.unwrap();
    }
    assert!(b.commands() - b_before < 8, "the non-optimized path took I/O while the optimized one was up");

    let expected: Expected = Arc::default();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let workers = spawn_workers(&mp, &expected, &tally, &stop, true);
    hang(&a, &mp).await;
    a.kill();
    // B takes the unit over (having fenced A): it reports itself optimized, A unavailable. The
    // writes that were in flight on A go through B after a fresh REPORT TARGET PORT GROUPS,
    // without A coming back.
    set_state_on(&b, Unavailable, ActiveOptimized);
    let at = tally.ops.load(Ordering::Relaxed);
    until(Duration::from_secs(10), "I/O through B", || tally.ops.load(Ordering::Relaxed) > at + 200).await;
    assert!(mp.stats().reissued_writes >= 1, "{:?}", mp.stats());
    assert_eq!(mp.paths()[1].state, Some(ActiveOptimized));
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.await.unwrap();
    }
    let errors = tally.errors.lock().unwrap().clone();
    assert!(errors.is_empty(), "{errors:?}");
    check_all(&mp, &expected).await;
    mp.close().await;
}

/// Set the access states of groups 1 and 2 as both gateways report them.
fn set_state(a: &Gateway, b: &Gateway, group1: AccessState, group2: AccessState) {
    set_state_on(a, group1, group2);
    set_state_on(b, group1, group2);
}

/// Set the access states of groups 1 and 2 as gateway `g` reports them (the target's states
/// and the initiator's are riser-scsi's one type).
fn set_state_on(g: &Gateway, group1: AccessState, group2: AccessState) {
    g.lu.set_port_groups(vec![TargetPortGroup::new(1, [1], group1), TargetPortGroup::new(2, [2], group2)]).unwrap();
}

/// A store whose writes can be held: each waits in the store until let go (on the target's
/// blocking pool), then lands in the shared store.
#[derive(Debug)]
struct Holding {
    inner: Arc<RamBackend>,
    /// (holding, writes waiting)
    state: Mutex<(bool, usize)>,
    let_go: Condvar,
}

impl Holding {
    fn new(inner: Arc<RamBackend>) -> Self {
        Self { inner, state: Mutex::new((false, 0)), let_go: Condvar::new() }
    }

    fn hold(&self, on: bool) {
        self.state.lock().unwrap().0 = on;
        self.let_go.notify_all();
    }

    fn waiting(&self) -> usize {
        self.state.lock().unwrap().1
    }
}

impl BlockBackend for Holding {
    fn block_size(&self) -> u32 {
        self.inner.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.inner.num_blocks()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.inner.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        let mut s = self.state.lock().unwrap();
        s.1 += 1;
        while s.0 {
            s = self.let_go.wait(s).unwrap();
        }
        s.1 -= 1;
        drop(s);
        self.inner.write(offset, buf)
    }
    fn flush(&self) -> std::io::Result<()> {
        self.inner.flush()
    }
    fn unmap(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.inner.unmap(offset, len)
    }
    fn is_mapped(&self, offset: u64) -> bool {
        self.inner.is_mapped(offset)
    }
    fn thin(&self) -> bool {
        self.inner.thin()
    }
}

/// A write whose time runs out on a path that still answers is aborted by its session, which
/// reports the timeout only once the target has ended the command: it is sent again through
/// the other path at once, although nothing else proves the failed path's tasks over (that path
/// cannot log in again, and its group stays active/optimized). Before, it waited for such a
/// proof and failed as a write in doubt after the failover timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_aborted_after_its_timeout_is_sent_again_at_once() {
    let backend = Arc::new(RamBackend::new(BLOCKS * u64::from(BLOCK), BLOCK));
    let identity = LuIdentity::random();
    let held = Arc::new(Holding::new(backend.clone()));
    let a = Gateway::start_on(held.clone(), &identity, 1, None).await;
    let b = Gateway::start(&backend, &identity, 2, None).await;
    // A's group owns the unit: I/O goes through A.
    set_state(&a, &b, AccessState::ActiveOptimized, AccessState::ActiveNonOptimized);
    let timeout = Duration::from_secs(2);
    let failover = Duration::from_secs(30);
    let cfg = MultipathConfig::new(SessionConfig::new(INITIATOR, TARGET).timeout(timeout))
        .failover_timeout(failover)
        .reconnect_backoff(Duration::from_millis(20), Duration::from_millis(200));
    let mp = Multipath::connect(paths(&a, &b), cfg).await.unwrap();
    assert_eq!(mp.paths()[0].state, Some(AccessState::ActiveOptimized));

    // A's path, once down, cannot come back (new connections refused); its session stays.
    a.refusing.store(true, Ordering::Release);
    held.hold(true);
    let data = Bytes::from(vec![0x5a; BLOCK as usize]);
    let write = tokio::spawn({
        let (mp, data) = (mp.clone(), data.clone());
        async move { mp.write(7, data, BLOCK).await }
    });
    until(Duration::from_secs(5), "the write held in A's store", || held.waiting() == 1).await;
    // Past the timeout (a reaper's tick at most later) the session aborts the write; A answers
    // the abort once the write is let go, which must be within the abort's own timeout.
    tokio::time::sleep(timeout * 8 / 5).await;
    assert!(!write.is_finished(), "the write ended while A still held it");
    held.hold(false);
    let let_go = Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(10), write).await.expect("the aborted write was not sent again in time").unwrap();
    r.unwrap();
    assert!(let_go.elapsed() < failover / 3, "{:?}", let_go.elapsed());
    let s = mp.stats();
    assert_eq!((s.reissued_writes, s.writes_in_doubt), (1, 0), "{s:?}");
    assert!(!mp.paths()[0].up, "A's path is down (and cannot log in again)");
    assert!(b.commands() >= 1);
    assert_eq!(mp.read(7, 1, BLOCK).await.unwrap(), data);
    mp.close().await;
}
