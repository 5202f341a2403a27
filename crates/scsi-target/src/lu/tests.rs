//! Tests of the logical unit through its task-facing entry points (`plan`, `execute`), over a
//! RAM backend with fault injection.

use super::*;
use crate::backend::RamBackend;
use riser_scsi::cdb::op;
use riser_scsi::mode::{self, Caching, ModeHeader};
use std::sync::Condvar;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A RAM backend for fault injection: writes and flushes can be made to fail, flushes are
/// counted, and I/O touching one chosen byte can be made to hang like a stuck disk.
#[derive(Debug)]
struct Flaky {
    ram: RamBackend,
    fail: AtomicBool,
    fail_flush: AtomicBool,
    flushes: AtomicU64,
    stall: Stall,
}

/// A hung disk on demand: while armed at a byte offset, every read or write covering it
/// parks until the stall moves elsewhere or is released.
#[derive(Debug, Default)]
struct Stall {
    /// (the armed offset, how many calls have parked so far)
    state: Mutex<(Option<u64>, usize)>,
    changed: Condvar,
}

impl Stall {
    /// Stall I/O covering `offset` (and release what is parked elsewhere).
    fn arm(&self, offset: u64) {
        self.state.lock().unwrap().0 = Some(offset);
        self.changed.notify_all();
    }
    fn release(&self) {
        self.state.lock().unwrap().0 = None;
        self.changed.notify_all();
    }
    fn parks(&self) -> usize {
        self.state.lock().unwrap().1
    }
    /// Wait (up to ten seconds) until `n` calls have parked in all.
    fn wait_parks(&self, n: usize) {
        let g = self.state.lock().unwrap();
        let (g, t) = self.changed.wait_timeout_while(g, Duration::from_secs(10), |s| s.1 < n).unwrap();
        assert!(!t.timed_out(), "{} calls parked, expected {n}", g.1);
    }
    fn gate(&self, offset: u64, len: usize) {
        let covers = |s: &mut (Option<u64>, usize)| s.0.is_some_and(|at| offset <= at && at < offset + len as u64);
        let mut g = self.state.lock().unwrap();
        if covers(&mut g) {
            g.1 += 1;
            self.changed.notify_all();
            drop(self.changed.wait_while(g, covers).unwrap());
        }
    }
}

impl BlockBackend for Flaky {
    fn block_size(&self) -> u32 {
        self.ram.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.ram.num_blocks()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> std::io::Result<()> {
        self.stall.gate(offset, buf.len());
        self.ram.read(offset, buf)
    }
    fn write(&self, offset: u64, buf: &[u8]) -> std::io::Result<()> {
        self.stall.gate(offset, buf.len());
        if self.fail.load(Ordering::Relaxed) { Err(std::io::Error::other("injected")) } else { self.ram.write(offset, buf) }
    }
    fn flush(&self) -> std::io::Result<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        if self.fail_flush.load(Ordering::Relaxed) { Err(std::io::Error::other("injected flush")) } else { Ok(()) }
    }
    fn unmap(&self, offset: u64, len: u64) -> std::io::Result<()> {
        self.ram.unmap(offset, len)
    }
    fn is_mapped(&self, offset: u64) -> bool {
        self.ram.is_mapped(offset)
    }
    fn thin(&self) -> bool {
        true
    }
    fn in_memory(&self) -> bool {
        true
    }
    fn atomic_writes(&self) -> bool {
        self.ram.atomic_writes()
    }
}

/// The nexus the tests' commands come through.
pub(super) fn n() -> Nexus {
    Nexus::new("iqn.test,i,0x1", "iqn.target,t,0x1", 1)
}

fn lu(size: u64, rate: Option<u64>) -> (Arc<Flaky>, LogicalUnit) {
    let b = Arc::new(Flaky {
        ram: RamBackend::new(size, 512),
        fail: AtomicBool::new(false),
        fail_flush: AtomicBool::new(false),
        flushes: AtomicU64::new(0),
        stall: Stall::default(),
    });
    (b.clone(), LogicalUnit::new(b, LuIdentity::random()).with_sanitize_rate(rate))
}

pub(super) fn run(lu: &LogicalUnit, cdb: &[u8], out: &[u8]) -> Outcome {
    run_as(lu, cdb, out, &n())
}

/// Plan and run a command through nexus `n`: its outcome (or the plan's refusal).
pub(super) fn run_as(lu: &LogicalUnit, cdb: &[u8], out: &[u8], n: &Nexus) -> Outcome {
    match lu.plan(cdb, n) {
        Ok(p) => lu.execute(&p, out, n),
        Err(o) => o,
    }
}

pub(super) fn sense_of(o: &Outcome) -> Sense {
    assert_eq!(o.status, Status::CHECK_CONDITION, "{o:?}");
    Sense::parse(o.sense.as_ref().unwrap()).unwrap()
}

fn sanitize_cdb(immed: bool, param_len: u16) -> [u8; 10] {
    let [hi, lo] = param_len.to_be_bytes();
    [op::SANITIZE, if immed { 0x81 } else { 0x01 }, 0, 0, 0, 0, 0, hi, lo, 0]
}

/// OVERWRITE parameter list: one pass (or `passes`) of `pattern`.
fn overwrite_params(passes: u8, invert: bool, pattern: &[u8]) -> Vec<u8> {
    let mut v = vec![passes | if invert { 0x80 } else { 0 }, 0];
    v.extend_from_slice(&(pattern.len() as u16).to_be_bytes());
    v.extend_from_slice(pattern);
    v
}

const TUR: [u8; 6] = [0; 6];
const INQUIRY: [u8; 6] = [0x12, 0, 0, 0, 36, 0];
const REQUEST_SENSE: [u8; 6] = [0x03, 0, 0, 0, 18, 0];
const READ10: [u8; 10] = [0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0];

#[test]
fn immediate_sanitize_runs_in_the_background_and_fences_the_medium() {
    // 4 MiB, written in 1 MiB chunks: the second chunk's write hangs until the stall moves.
    let (b, lu) = lu(4 << 20, None);
    b.write(0, &[0x55; 512]).unwrap();
    b.stall.arm(1 << 20);
    let params = overwrite_params(1, false, &[0xa5, 0x5a]);
    let o = run(&lu, &sanitize_cdb(true, params.len() as u16), &params);
    assert_eq!(o.status, Status::GOOD, "IMMED returns once the sanitize has started");

    let s = sense_of(&run(&lu, &TUR, &[]));
    assert_eq!((s.key, s.asc), (SenseKey::NOT_READY, AscAscq::SANITIZE_IN_PROGRESS));
    let s = sense_of(&run(&lu, &READ10, &[]));
    assert_eq!((s.key, s.asc), (SenseKey::NOT_READY, AscAscq::SANITIZE_IN_PROGRESS));
    let s = sense_of(&run(&lu, &sanitize_cdb(true, params.len() as u16), &params));
    assert_eq!(s.asc, AscAscq::SANITIZE_IN_PROGRESS, "a second SANITIZE waits its turn");
    assert_eq!(run(&lu, &INQUIRY, &[]).status, Status::GOOD, "INQUIRY stays allowed");

    // REQUEST SENSE reports the progress: a quarter done, then (the stall moved to the last
    // chunk) three quarters.
    let progress = |o: Outcome| {
        assert_eq!(o.status, Status::GOOD);
        let s = Sense::parse(&o.data).unwrap();
        assert_eq!(s.asc, AscAscq::SANITIZE_IN_PROGRESS);
        u16::from_be_bytes([s.key_specific.unwrap()[1], s.key_specific.unwrap()[2]])
    };
    b.stall.wait_parks(1);
    assert_eq!(progress(run(&lu, &REQUEST_SENSE, &[])), 0x4000);
    b.stall.arm(3 << 20);
    b.stall.wait_parks(2);
    assert_eq!(progress(run(&lu, &REQUEST_SENSE, &[])), 0xc000);
    b.stall.release();

    let t0 = Instant::now();
    while run(&lu, &TUR, &[]).status != Status::GOOD {
        assert!(t0.elapsed() < Duration::from_secs(10), "the sanitize never ended");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut all = vec![0u8; 4 << 20];
    b.read(0, &mut all).unwrap();
    assert!(all.chunks(2).all(|c| c == [0xa5, 0x5a]), "every byte overwritten with the pattern");
    let s = Sense::parse(&run(&lu, &REQUEST_SENSE, &[]).data).unwrap();
    assert_eq!(s.key, SenseKey::NO_SENSE);
}

#[test]
fn sanitize_without_immed_reports_at_the_end_with_inverted_passes() {
    let (b, lu) = lu(1 << 20, None);
    let params = overwrite_params(2, true, &[0x0f]);
    let o = run(&lu, &sanitize_cdb(false, params.len() as u16), &params);
    assert_eq!(o.status, Status::GOOD);
    assert_eq!(run(&lu, &TUR, &[]).status, Status::GOOD, "done by the time the status came");
    let mut all = vec![0u8; 1 << 20];
    b.read(0, &mut all).unwrap();
    assert!(all.iter().all(|&x| x == 0xf0), "the second pass writes the inverted pattern");
    assert!(lu.may_block(&lu.plan(&sanitize_cdb(false, 5), &n()).unwrap()));
    assert!(!lu.may_block(&lu.plan(&sanitize_cdb(true, 5), &n()).unwrap()));
}

#[test]
fn a_failed_sanitize_leaves_the_medium_fenced_until_a_good_one() {
    let (b, lu) = lu(1 << 20, None);
    let params = overwrite_params(1, false, &[0]);
    b.fail.store(true, Ordering::Relaxed);
    let s = sense_of(&run(&lu, &sanitize_cdb(false, params.len() as u16), &params));
    assert_eq!((s.key, s.asc), (SenseKey::MEDIUM_ERROR, AscAscq::SANITIZE_COMMAND_FAILED));
    let s = sense_of(&run(&lu, &READ10, &[]));
    assert_eq!((s.key, s.asc), (SenseKey::MEDIUM_ERROR, AscAscq::SANITIZE_COMMAND_FAILED));
    assert_eq!(run(&lu, &INQUIRY, &[]).status, Status::GOOD);
    b.fail.store(false, Ordering::Relaxed);
    assert_eq!(run(&lu, &sanitize_cdb(false, params.len() as u16), &params).status, Status::GOOD);
    assert_eq!(run(&lu, &READ10, &[]).status, Status::GOOD);
}

/// A 16-byte CDB with the LBA in bytes 2-9 and `len` in bytes 10-13. For COMPARE AND WRITE
/// (NUMBER OF LOGICAL BLOCKS in byte 13) and WRITE ATOMIC (TRANSFER LENGTH in bytes 12-13)
/// a small `len` lands in the right field too.
pub(super) fn cdb16(opcode: u8, flags: u8, lba: u64, len: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&len.to_be_bytes());
    c
}

fn cdb10(opcode: u8, flags: u8, lba: u32, len: u16) -> [u8; 10] {
    let mut c = [0u8; 10];
    c[0] = opcode;
    c[1] = flags;
    c[2..6].copy_from_slice(&lba.to_be_bytes());
    c[7..9].copy_from_slice(&len.to_be_bytes());
    c
}

/// MODE SELECT(10) of a Caching page with WCE as given.
fn set_wce(lu: &LogicalUnit, wce: bool) {
    let params = mode::mode_sense_data(true, &ModeHeader::default(), &[Caching { wce, rcd: false }.to_page()]);
    let o = run(lu, &cdb10(op::MODE_SELECT_10, 0x10, 0, params.len() as u16), &params);
    assert_eq!(o.status, Status::GOOD, "{o:?}");
}

const FUA: u8 = rw_flags::FUA;

/// Every command that modifies the medium, as (name, CDB, data-out), with FUA set where the
/// command has the bit. COMPARE AND WRITE compares and writes zeros so it can run again.
fn medium_writes(fua: bool) -> Vec<(&'static str, Vec<u8>, Vec<u8>)> {
    let f = if fua { FUA } else { 0 };
    let unmap = riser_scsi::unmap::to_bytes(&[riser_scsi::unmap::UnmapDescriptor { lba: 40, blocks: 4 }]);
    let mut v = vec![
        ("WRITE(10)", cdb10(op::WRITE_10, f, 1, 1).to_vec(), vec![1; 512]),
        ("COMPARE AND WRITE", cdb16(op::COMPARE_AND_WRITE, f, 2, 1).to_vec(), vec![0; 1024]),
        ("ORWRITE", cdb16(op::ORWRITE_16, f, 3, 2).to_vec(), vec![2; 1024]),
        ("WRITE ATOMIC", cdb16(op::WRITE_ATOMIC_16, f, 5, 1).to_vec(), vec![3; 512]),
    ];
    if !fua {
        // WRITE SAME and UNMAP have no FUA bit (byte 1 bit 3 of WRITE SAME is UNMAP).
        v.extend([
            ("WRITE SAME(10)", cdb10(op::WRITE_SAME_10, 0, 8, 8).to_vec(), vec![4; 512]),
            ("WRITE SAME(16)", cdb16(op::WRITE_SAME_16, 0, 16, 8).to_vec(), vec![5; 512]),
            ("WRITE SAME(16) UNMAP", cdb16(op::WRITE_SAME_16, rw_flags::UNMAP, 24, 8).to_vec(), vec![0; 512]),
            ("WRITE SAME(16) NDOB", cdb16(op::WRITE_SAME_16, rw_flags::NDOB, 32, 8).to_vec(), Vec::new()),
            ("UNMAP", cdb10(op::UNMAP, 0, 0, unmap.len() as u16).to_vec(), unmap),
        ]);
    }
    v
}

/// Run each command; the names of those that did not flush exactly once.
fn flushes_missing(b: &Flaky, lu: &LogicalUnit, cmds: Vec<(&'static str, Vec<u8>, Vec<u8>)>) -> Vec<&'static str> {
    let mut missing = Vec::new();
    for (name, cdb, out) in cmds {
        let before = b.flushes.load(Ordering::Relaxed);
        let o = run(lu, &cdb, &out);
        assert_eq!(o.status, Status::GOOD, "{name}: {o:?}");
        if b.flushes.load(Ordering::Relaxed) != before + 1 {
            missing.push(name);
        }
    }
    missing
}

#[test]
fn medium_writes_flush_only_when_asked() {
    let (b, lu) = lu(1 << 20, None);
    for (name, cdb, out) in medium_writes(false) {
        let o = run(&lu, &cdb, &out);
        assert_eq!(o.status, Status::GOOD, "{name}: {o:?}");
        assert_eq!(b.flushes.load(Ordering::Relaxed), 0, "{name} with WCE=1 and no FUA flushed");
    }
}

#[test]
fn medium_writes_with_fua_are_durable_before_good() {
    let (b, lu) = lu(1 << 20, None);
    let unflushed = flushes_missing(&b, &lu, medium_writes(true));
    assert!(unflushed.is_empty(), "with FUA, no flush before GOOD: {unflushed:?}");
}

#[test]
fn medium_writes_with_the_write_cache_off_are_durable_before_good() {
    let (b, lu) = lu(1 << 20, None);
    set_wce(&lu, false);
    let unflushed = flushes_missing(&b, &lu, medium_writes(false));
    assert!(unflushed.is_empty(), "with WCE=0, no flush before GOOD: {unflushed:?}");
    set_wce(&lu, true);
    let before = b.flushes.load(Ordering::Relaxed);
    assert_eq!(run(&lu, &cdb16(op::ORWRITE_16, 0, 3, 1), &[1; 512]).status, Status::GOOD);
    assert_eq!(b.flushes.load(Ordering::Relaxed), before, "WCE=1 again: back to the cache");
}

#[test]
fn a_miscompare_writes_and_flushes_nothing() {
    let (b, lu) = lu(1 << 20, None);
    let mut out = vec![9u8; 512];
    out.extend_from_slice(&[7; 512]);
    let s = sense_of(&run(&lu, &cdb16(op::COMPARE_AND_WRITE, FUA, 2, 1), &out));
    assert_eq!(s.key, SenseKey::MISCOMPARE);
    assert_eq!(b.flushes.load(Ordering::Relaxed), 0);
}

const SYNC_CACHE_10: [u8; 10] = [op::SYNCHRONIZE_CACHE_10, 0, 0, 0, 0, 0, 0, 0, 0, 0];
const WRITE_ERROR: (SenseKey, AscAscq) = (SenseKey::MEDIUM_ERROR, AscAscq::WRITE_ERROR);

/// The sense keys and codes of the commands that failed, by name.
fn failures(lu: &LogicalUnit, cmds: Vec<(&'static str, Vec<u8>, Vec<u8>)>) -> Vec<(&'static str, Option<(SenseKey, AscAscq)>)> {
    cmds.into_iter()
        .map(|(name, cdb, out)| {
            let o = run(lu, &cdb, &out);
            (name, (o.status != Status::GOOD).then(|| sense_of(&o)).map(|s| (s.key, s.asc)))
        })
        .collect()
}

#[test]
fn a_failed_flush_fails_every_later_flush_until_a_reset() {
    let (b, lu) = lu(1 << 20, None);
    lu.nexus_seen(&n());
    b.fail_flush.store(true, Ordering::Relaxed);
    let s = sense_of(&run(&lu, &SYNC_CACHE_10, &[]));
    assert_eq!((s.key, s.asc), WRITE_ERROR);

    // The device flushes again, but what the failed flush held is lost: no GOOD for a flush
    // (SYNCHRONIZE CACHE, FUA, WCE=0) until the reset.
    b.fail_flush.store(false, Ordering::Relaxed);
    let s = sense_of(&run(&lu, &SYNC_CACHE_10, &[]));
    assert_eq!((s.key, s.asc), WRITE_ERROR, "the second SYNCHRONIZE CACHE");
    for (name, failed) in failures(&lu, medium_writes(true)) {
        assert_eq!(failed, Some(WRITE_ERROR), "{name} with FUA");
    }
    set_wce(&lu, false);
    for (name, failed) in failures(&lu, medium_writes(false)) {
        assert_eq!(failed, Some(WRITE_ERROR), "{name} with WCE=0");
    }
    set_wce(&lu, true);
    // Writes into the cache and reads promise nothing about durability: they go on.
    for (name, failed) in failures(&lu, medium_writes(false)) {
        assert_eq!(failed, None, "{name} with WCE=1");
    }
    assert_eq!(run(&lu, &READ10, &[]).status, Status::GOOD);

    // LOGICAL UNIT RESET (and target resets) reach the LU as reset(): its unit attention
    // tells every initiator that cached data may be gone, and flushes work again.
    lu.reset();
    let s = sense_of(&run(&lu, &TUR, &[]));
    assert_eq!((s.key, s.asc), (SenseKey::UNIT_ATTENTION, AscAscq::POWER_ON_RESET));
    assert_eq!(run(&lu, &SYNC_CACHE_10, &[]).status, Status::GOOD);
    for (name, failed) in failures(&lu, medium_writes(true)) {
        assert_eq!(failed, None, "{name} with FUA after the reset");
    }
}

#[test]
fn a_fua_write_whose_flush_fails_reports_a_write_error() {
    let (b, lu) = lu(1 << 20, None);
    b.fail_flush.store(true, Ordering::Relaxed);
    let s = sense_of(&run(&lu, &cdb16(op::ORWRITE_16, FUA, 0, 1), &[1; 512]));
    assert_eq!((s.key, s.asc), WRITE_ERROR);
    b.fail_flush.store(false, Ordering::Relaxed);
    let s = sense_of(&run(&lu, &cdb10(op::WRITE_10, FUA, 0, 1), &[1; 512]));
    assert_eq!((s.key, s.asc), WRITE_ERROR, "sticky after a FUA write's flush failed too");
}

#[test]
fn a_hung_read_modify_write_holds_up_nothing_else() {
    // COMPARE AND WRITE or ORWRITE of block 8 hangs in the backend (a stuck disk).
    let stuck: [(&str, Vec<u8>, Vec<u8>); 2] = [
        ("COMPARE AND WRITE", cdb16(op::COMPARE_AND_WRITE, 0, 8, 1).to_vec(), vec![0; 1024]),
        ("ORWRITE", cdb16(op::ORWRITE_16, 0, 8, 1).to_vec(), vec![1; 512]),
    ];
    for (what, cdb, out) in stuck {
        let (b, lu) = lu(1 << 20, None);
        b.stall.arm(8 * 512);
        let others: Vec<(&str, Vec<u8>, Vec<u8>)> = vec![
            ("TEST UNIT READY", TUR.to_vec(), Vec::new()),
            ("READ(10) of block 0", READ10.to_vec(), Vec::new()),
            ("WRITE(10) of block 1", cdb10(op::WRITE_10, 0, 1, 1).to_vec(), vec![1; 512]),
            ("COMPARE AND WRITE of block 9", cdb16(op::COMPARE_AND_WRITE, 0, 9, 1).to_vec(), vec![0; 1024]),
            ("ORWRITE of blocks 6-7", cdb16(op::ORWRITE_16, 0, 6, 2).to_vec(), vec![2; 1024]),
            ("MODE SENSE(10)", vec![op::MODE_SENSE_10, 0, 0x3f, 0, 0, 0, 0, 0x10, 0, 0], Vec::new()),
        ];
        let n = others.len();
        std::thread::scope(|sc| {
            let hung = sc.spawn(|| run(&lu, &cdb, &out));
            b.stall.wait_parks(1);
            let (tx, rx) = std::sync::mpsc::channel();
            let lu = &lu;
            sc.spawn(move || {
                for (name, cdb, out) in others {
                    let _ = tx.send((name, run(lu, &cdb, &out).status));
                }
            });
            let done: Vec<_> = (0..n).map_while(|_| rx.recv_timeout(Duration::from_secs(5)).ok()).collect();
            // Unstick the disk before judging, so that every thread can end.
            b.stall.release();
            assert_eq!(done.len(), n, "while {what} hung only these completed: {done:?}");
            assert!(done.iter().all(|(_, s)| *s == Status::GOOD), "{done:?}");
            assert_eq!(hung.join().unwrap().status, Status::GOOD, "{what}");
        });
    }
}

#[test]
fn overlapping_read_modify_writes_stay_atomic() {
    let (b, lu) = lu(1 << 20, None);
    // They may wait for one another, so the server keeps them off its async workers even
    // on a memory-speed backend.
    assert!(lu.may_block(&lu.plan(&cdb16(op::COMPARE_AND_WRITE, 0, 8, 1), &n()).unwrap()));
    assert!(lu.may_block(&lu.plan(&cdb16(op::ORWRITE_16, 0, 8, 1), &n()).unwrap()));
    assert!(!lu.may_block(&lu.plan(&READ10, &n()).unwrap()));
    b.stall.arm(8 * 512);
    let caw = |write: u8| {
        let mut out = vec![0u8; 512];
        out.extend_from_slice(&[write; 512]);
        out
    };
    std::thread::scope(|sc| {
        let first = sc.spawn(|| run(&lu, &cdb16(op::COMPARE_AND_WRITE, 0, 8, 1), &caw(0x11)));
        b.stall.wait_parks(1);
        // Both want block 8 while the first COMPARE AND WRITE holds it.
        let second = sc.spawn(|| run(&lu, &cdb16(op::COMPARE_AND_WRITE, 0, 8, 1), &caw(0x22)));
        let third = sc.spawn(|| run(&lu, &cdb16(op::ORWRITE_16, 0, 7, 2), &[0x40; 1024]));
        std::thread::sleep(Duration::from_millis(200));
        let parks = b.stall.parks();
        b.stall.release();
        assert_eq!(parks, 1, "a command reached block 8 while a COMPARE AND WRITE held it");
        assert_eq!(first.join().unwrap().status, Status::GOOD);
        // The second compared against the first one's data, not the zeros it read before.
        assert_eq!(sense_of(&second.join().unwrap()).key, SenseKey::MISCOMPARE);
        assert_eq!(third.join().unwrap().status, Status::GOOD);
    });
    let mut blocks = [0u8; 1024];
    b.read(7 * 512, &mut blocks).unwrap();
    assert!(blocks[..512].iter().all(|&x| x == 0x40) && blocks[512..].iter().all(|&x| x == 0x51), "ORWRITE lost an update");
}

#[test]
fn sanitize_rate_paces_the_overwrite() {
    // 2 MiB at 8 MiB/s: the second 1 MiB chunk waits until 125 ms, the end until 250 ms.
    let (_, lu) = lu(2 << 20, Some(8 << 20));
    let params = overwrite_params(1, false, &[0x3c]);
    let t0 = Instant::now();
    assert_eq!(run(&lu, &sanitize_cdb(false, params.len() as u16), &params).status, Status::GOOD);
    assert!(t0.elapsed() >= Duration::from_millis(240), "paced sanitize took {:?}", t0.elapsed());
}

#[test]
fn progress_indication_scales_to_65536() {
    let s = Sense::not_ready_in_progress(AscAscq::SANITIZE_IN_PROGRESS, 1, 2);
    assert_eq!(s.key_specific, Some([0, 0x80, 0]));
    let fixed = s.to_fixed();
    assert_eq!(fixed[15] & 0x80, 0x80, "SKSV");
    assert_eq!(&fixed[16..18], &[0x80, 0]);
    assert_eq!(Sense::not_ready_in_progress(AscAscq::SANITIZE_IN_PROGRESS, 5, 5).key_specific, Some([0, 0xff, 0xff]));
}

fn inquiry_vpd(lu: &LogicalUnit, page: u8, nexus: &Nexus) -> Vec<u8> {
    let cdb = [op::INQUIRY, 1, page, 0x10, 0, 0];
    let p = lu.plan(&cdb, nexus).unwrap();
    let o = lu.execute(&p, &[], nexus);
    assert_eq!(o.status, Status::GOOD);
    o.data.to_vec()
}

#[test]
fn the_identity_pages_derive_from_the_uuid_and_the_port_from_the_nexus() {
    use riser_scsi::inquiry::{designator_type, parse_device_identification, parse_vpd};
    let uuid = uuid::Uuid::parse_str("0b7f3c52-9a7e-4d0e-8f35-2c6a1d9e4b10").unwrap();
    let unit = |_| LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::new(uuid));
    let (a, b) = (unit(0), unit(1));
    let port5 = Nexus::new("iqn.test,i,0x1", "iqn.target,t,0x5", 5);
    let serial = inquiry_vpd(&a, 0x80, &port5);
    assert_eq!(&serial[4..], b"0b7f3c52-9a7e-4d0e-8f35-2c6a1d9e4b10");
    let ids = inquiry_vpd(&a, 0x83, &port5);
    let ds = parse_device_identification(parse_vpd(&ids).unwrap().1).unwrap();
    assert_eq!(ds[0].kind, designator_type::NAA);
    assert_eq!((ds[0].value.len(), ds[0].value[0] >> 4), (8, 3), "NAA 3, locally assigned: no borrowed IEEE company ID");
    assert_eq!(u64::from_be_bytes(ds[0].value[..8].try_into().unwrap()) & 0x0fff_ffff_ffff_ffff, a.identity().naa());
    assert_eq!(ds[1].kind, designator_type::T10_VENDOR_ID);
    assert_eq!(&ds[1].value[..], b"RISER   0b7f3c52-9a7e-4d0e-8f35-2c6a1d9e4b10");
    assert_eq!((ds[2].kind, &ds[2].value[..]), (designator_type::RELATIVE_TARGET_PORT, &[0u8, 0, 0, 5][..]));
    // Another unit (another gateway) with the same UUID presents byte-identical pages.
    assert_eq!(inquiry_vpd(&b, 0x80, &port5), serial);
    assert_eq!(inquiry_vpd(&b, 0x83, &port5), ids);
    // A unit of another UUID presents another identity.
    let c = LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random());
    assert_ne!(inquiry_vpd(&c, 0x83, &port5), ids);
}

#[test]
fn a_resize_shows_in_read_capacity_after_capacity_data_has_changed() {
    let lu = LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random());
    lu.nexus_seen(&n());
    let rc16 = [op::SERVICE_ACTION_IN_16, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];
    let last_lba = |o: &Outcome| u64::from_be_bytes(o.data[..8].try_into().unwrap());
    assert_eq!(last_lba(&run(&lu, &rc16, &[])), 2047);
    assert_eq!(lu.resize(1 << 19).unwrap_err().kind(), std::io::ErrorKind::InvalidInput, "no shrinking");
    assert_eq!(lu.resize(4 << 20).unwrap(), 8192);
    let s = sense_of(&run(&lu, &rc16, &[]));
    assert_eq!((s.key, s.asc), (SenseKey::UNIT_ATTENTION, AscAscq::CAPACITY_DATA_CHANGED));
    assert_eq!(last_lba(&run(&lu, &rc16, &[])), 8191);
    // The same size again changes nothing and says nothing.
    lu.resize(4 << 20).unwrap();
    assert_eq!(run(&lu, &rc16, &[]).status, Status::GOOD);
}
