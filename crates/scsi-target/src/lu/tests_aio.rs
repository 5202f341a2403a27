//! A unit over an asynchronous store: the data path runs as futures completed from another
//! thread, with the checks and sense of the synchronous path; what the store cannot do
//! atomically is refused, and its write cache is reported as it is.

use super::SharedReservations;
use super::tests::{n, run, run_as, sense_of};
use super::*;
use crate::aio::{AsyncBackend, Compared, Io};
use riser_scsi::cdb::op;
use riser_scsi::mode::{self, Caching, ModeHeader};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

/// An in-memory store whose operations complete on a thread of their own after a delay, like
/// a cluster's completions; it records what it was asked.
#[derive(Debug)]
struct Remote {
    data: Arc<Mutex<Vec<u8>>>,
    block: u32,
    caw_blocks: u8,
    write_back: bool,
    shared: bool,
    same: bool,
    fail_flush: AtomicBool,
    flushes: Arc<AtomicU32>,
    fua_writes: Arc<AtomicU32>,
    write_sames: Arc<AtomicU32>,
}

impl Remote {
    fn new(size: usize, block: u32) -> Self {
        Self {
            data: Arc::new(Mutex::new(vec![0; size])),
            block,
            caw_blocks: 1,
            write_back: false,
            shared: true,
            same: true,
            fail_flush: AtomicBool::new(false),
            flushes: Arc::default(),
            fua_writes: Arc::default(),
            write_sames: Arc::default(),
        }
    }

    /// Complete `f` on another thread after a few milliseconds.
    fn later<T: Send + 'static>(f: impl FnOnce() -> std::io::Result<T> + Send + 'static) -> Io<T> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(3));
            let _ = tx.send(f());
        });
        Io::pending(async move { rx.await.unwrap_or_else(|_| Err(std::io::Error::other("lost"))) })
    }
}

impl AsyncBackend for Remote {
    fn block_size(&self) -> u32 {
        self.block
    }
    fn num_blocks(&self) -> u64 {
        self.data.lock().unwrap().len() as u64 / u64::from(self.block)
    }
    fn read(&self, offset: u64, len: usize, mut buf: Vec<u8>) -> Io<Vec<u8>> {
        let data = self.data.clone();
        Self::later(move || {
            buf.clear();
            buf.extend_from_slice(&data.lock().unwrap()[offset as usize..offset as usize + len]);
            Ok(buf)
        })
    }
    fn write(&self, offset: u64, bytes: Bytes, fua: bool) -> Io<()> {
        if fua {
            self.fua_writes.fetch_add(1, Ordering::Relaxed);
        }
        let data = self.data.clone();
        Self::later(move || {
            data.lock().unwrap()[offset as usize..offset as usize + bytes.len()].copy_from_slice(&bytes);
            Ok(())
        })
    }
    fn flush(&self) -> Io<()> {
        self.flushes.fetch_add(1, Ordering::Relaxed);
        let fail = self.fail_flush.load(Ordering::Relaxed);
        Self::later(move || if fail { Err(std::io::Error::other("injected flush")) } else { Ok(()) })
    }
    fn unmap(&self, offset: u64, len: u64) -> Io<()> {
        let data = self.data.clone();
        Self::later(move || {
            data.lock().unwrap()[offset as usize..(offset + len) as usize].fill(0);
            Ok(())
        })
    }
    fn write_same(&self, offset: u64, len: u64, block: Bytes) -> Io<()> {
        if !self.same {
            return Io::unsupported("WRITE SAME");
        }
        self.write_sames.fetch_add(1, Ordering::Relaxed);
        let data = self.data.clone();
        Self::later(move || {
            let mut d = data.lock().unwrap();
            d[offset as usize..(offset + len) as usize].chunks_mut(block.len()).for_each(|c| c.copy_from_slice(&block));
            Ok(())
        })
    }
    fn compare_and_write(&self, offset: u64, compare: Bytes, write: Bytes) -> Io<Compared> {
        let data = self.data.clone();
        Self::later(move || {
            let mut d = data.lock().unwrap();
            let at = offset as usize;
            if let Some(p) = d[at..at + compare.len()].iter().zip(&compare).position(|(a, b)| a != b) {
                return Ok(Compared::Mismatch(p as u64));
            }
            d[at..at + write.len()].copy_from_slice(&write);
            Ok(Compared::Written)
        })
    }
    fn compare_and_write_blocks(&self) -> u8 {
        self.caw_blocks
    }
    fn thin(&self) -> bool {
        true
    }
    fn write_back(&self) -> bool {
        self.write_back
    }
    fn shared(&self) -> bool {
        self.shared
    }
}

fn unit(store: Remote) -> Arc<LogicalUnit> {
    Arc::new(LogicalUnit::with_async(Arc::new(store), LuIdentity::random()))
}

/// Plan and run a command through the asynchronous path, on a runtime.
fn run_async(lu: &Arc<LogicalUnit>, cdb: &[u8], out: &[u8]) -> Outcome {
    let plan = match lu.plan(cdb, &n()) {
        Ok(p) => Plan { edtl: if out.is_empty() { p.edtl } else { out.len() as u32 }, ..p },
        Err(o) => return o,
    };
    let running = lu.execute_async(&plan, Bytes::copy_from_slice(out), &n(), Vec::new()).expect("an asynchronous command");
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(running)
}

fn rw16(opcode: u8, flags: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    c[1] = flags;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

fn caw(lba: u64, blocks: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::COMPARE_AND_WRITE;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

#[test]
fn reads_and_writes_complete_from_the_store_thread() {
    let lu = unit(Remote::new(1 << 20, 512));
    let data: Vec<u8> = (0..4096u32).map(|i| (i * 7 + 3) as u8).collect();
    assert_eq!(run_async(&lu, &rw16(op::WRITE_16, 0, 10, 8), &data).status, Status::GOOD);
    let o = run_async(&lu, &rw16(op::READ_16, 0, 10, 8), &[]);
    assert_eq!((o.status, &o.data[..]), (Status::GOOD, &data[..]));
    // Out of range: the synchronous path's sense, no store access.
    let s = sense_of(&run_async(&lu, &rw16(op::READ_16, 0, 2047, 2), &[]));
    assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::LBA_OUT_OF_RANGE));
    // Commands outside the data path are not the asynchronous path's.
    let plan = lu.plan(&[0, 0, 0, 0, 0, 0], &n()).unwrap();
    assert!(lu.execute_async(&plan, Bytes::new(), &n(), Vec::new()).is_none());
}

#[test]
fn a_store_without_a_write_cache_reports_wce_0_and_keeps_it() {
    let store = Remote::new(1 << 20, 512);
    let (flushes, fua) = (store.flushes.clone(), store.fua_writes.clone());
    let lu = unit(store);
    // MODE SENSE(10), Caching page: WCE=0, and not changeable.
    let sense10 = |pc: u8| [0x5a, 0x08, (pc << 6) | 0x08, 0, 0, 0, 0, 0x01, 0, 0];
    let current = run(&lu, &sense10(0), &[]);
    assert_eq!(current.data[8 + 2] & 0x04, 0, "WCE reported clear");
    let changeable = run(&lu, &sense10(1), &[]);
    assert_eq!(changeable.data[8 + 2] & 0x04, 0, "WCE not changeable");
    let params = mode::mode_sense_data(true, &ModeHeader::default(), &[Caching { wce: true, rcd: false }.to_page()]);
    let cdb = [0x55, 0x10, 0, 0, 0, 0, 0, 0, params.len() as u8, 0];
    let s = sense_of(&run(&lu, &cdb, &params));
    assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_PARAMETER_LIST));
    // Every write is durable when the store completes it: nothing to flush, FUA forced through.
    assert_eq!(run_async(&lu, &rw16(op::WRITE_16, 0, 0, 1), &[1; 512]).status, Status::GOOD);
    assert_eq!((flushes.load(Ordering::Relaxed), fua.load(Ordering::Relaxed)), (0, 1));
}

#[test]
fn a_write_back_store_is_flushed_and_a_failed_flush_sticks() {
    let mut store = Remote::new(1 << 20, 512);
    store.write_back = true;
    let store = Arc::new(store);
    let lu = Arc::new(LogicalUnit::with_async(store.clone(), LuIdentity::random()));
    assert_eq!(run_async(&lu, &rw16(op::WRITE_16, 0, 0, 1), &[1; 512]).status, Status::GOOD);
    assert_eq!(store.fua_writes.load(Ordering::Relaxed), 0, "WCE=1: a plain write is not forced");
    assert_eq!(run_async(&lu, &rw16(op::WRITE_16, 0x08, 0, 1), &[1; 512]).status, Status::GOOD);
    assert_eq!(store.fua_writes.load(Ordering::Relaxed), 1, "FUA goes to the store");
    let sync = [0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0];
    assert_eq!(run_async(&lu, &sync, &[]).status, Status::GOOD);
    store.fail_flush.store(true, Ordering::Relaxed);
    let s = sense_of(&run_async(&lu, &sync, &[]));
    assert_eq!((s.key, s.asc), (SenseKey::MEDIUM_ERROR, AscAscq::WRITE_ERROR));
    store.fail_flush.store(false, Ordering::Relaxed);
    let s = sense_of(&run_async(&lu, &sync, &[]));
    assert_eq!(s.key, SenseKey::MEDIUM_ERROR, "a failed flush is reported until a reset");
    lu.reset();
    let _ua = run_async(&lu, &sync, &[]);
    assert_eq!(run_async(&lu, &sync, &[]).status, Status::GOOD);
}

#[test]
fn compare_and_write_is_the_store_s_and_reports_the_mismatch_offset() {
    let lu = unit(Remote::new(1 << 20, 512));
    let mut out = vec![0u8; 1024];
    out[512..].fill(0xab);
    assert_eq!(run_async(&lu, &caw(3, 1), &out).status, Status::GOOD);
    let o = run_async(&lu, &rw16(op::READ_16, 0, 3, 1), &[]);
    assert_eq!(&o.data[..], &[0xab; 512][..]);
    // Compare data differing at byte 100: MISCOMPARE with that offset, nothing written.
    let mut out = vec![0xabu8; 1024];
    out[100] = 0;
    out[512..].fill(0xcd);
    let s = sense_of(&run_async(&lu, &caw(3, 1), &out));
    assert_eq!((s.key, s.asc, s.information), (SenseKey::MISCOMPARE, AscAscq::MISCOMPARE_DURING_VERIFY, Some(100)));
    assert_eq!(&run_async(&lu, &rw16(op::READ_16, 0, 3, 1), &[]).data[..], &[0xab; 512][..]);
    // More blocks than the store compares atomically: refused.
    let s = sense_of(&run_async(&lu, &caw(3, 2), &[0; 2048]));
    assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_CDB));
}

#[test]
fn compare_and_write_is_refused_where_the_store_cannot_do_it_atomically() {
    // A shared store with 4 KiB blocks and no atomic compare-and-write (RBD's is 512 bytes).
    let mut store = Remote::new(1 << 20, 4096);
    store.caw_blocks = 0;
    let lu = unit(store);
    let mut out = vec![0u8; 8192];
    out[4096..].fill(1);
    let s = sense_of(&run_async(&lu, &caw(0, 1), &out));
    assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_COMMAND_OPERATION_CODE));
    // The synchronous entry point refuses it too (never a read and a write under local locks).
    let s = sense_of(&run(&lu, &caw(0, 1), &out));
    assert_eq!(s.asc, AscAscq::INVALID_COMMAND_OPERATION_CODE);
    assert!(run_async(&lu, &rw16(op::READ_16, 0, 0, 1), &[]).data.iter().all(|&b| b == 0), "nothing written");
    // Not announced: Block Limits says 0, REPORT SUPPORTED OPERATION CODES leaves it (and
    // ORWRITE, on a shared store) out.
    let limits = run(&lu, &[0x12, 1, 0xb0, 0, 64, 0], &[]);
    assert_eq!(limits.data[5], 0, "MAXIMUM COMPARE AND WRITE LENGTH");
    // No WRITE ATOMIC either: every atomic field of the page zero, and the command not listed.
    assert_eq!(&limits.data[44..56], &[0; 12], "MAXIMUM ATOMIC TRANSFER LENGTH, ATOMIC ALIGNMENT, ATOMIC TRANSFER LENGTH GRANULARITY");
    assert_eq!(run(&lu, &[0xa3, 0x0c, 0x01, op::WRITE_ATOMIC_16, 0, 0, 0, 0, 0, 64, 0, 0], &[]).data[1] & 0x07, 1);
    let one = |opcode: u8| run(&lu, &[0xa3, 0x0c, 0x01, opcode, 0, 0, 0, 0, 0, 64, 0, 0], &[]).data[1] & 0x07;
    assert_eq!(one(op::COMPARE_AND_WRITE), 1, "not supported");
    assert_eq!(one(op::ORWRITE_16), 1, "not supported");
    assert_eq!(one(op::WRITE_16), 3, "supported");
}

#[test]
fn write_same_uses_the_store_s_or_writes_the_pattern_itself() {
    let store = Remote::new(1 << 20, 512);
    let sames = store.write_sames.clone();
    let lu = unit(store);
    let mut c = rw16(op::WRITE_SAME_16, 0, 4, 9);
    assert_eq!(run_async(&lu, &c, &[0x5a; 512]).status, Status::GOOD);
    assert_eq!(sames.load(Ordering::Relaxed), 1);
    assert!(run_async(&lu, &rw16(op::READ_16, 0, 4, 9), &[]).data.iter().all(|&b| b == 0x5a));

    let mut store = Remote::new(1 << 20, 512);
    store.same = false;
    let lu = unit(store);
    c[1] = 0;
    assert_eq!(run_async(&lu, &c, &[0x6b; 512]).status, Status::GOOD);
    assert!(run_async(&lu, &rw16(op::READ_16, 0, 4, 9), &[]).data.iter().all(|&b| b == 0x6b));
    assert!(run_async(&lu, &rw16(op::READ_16, 0, 13, 1), &[]).data.iter().all(|&b| b == 0), "no further");
    // UNMAP bit on a thin store: deallocated, reads zeros.
    c[1] = 0x08;
    assert_eq!(run_async(&lu, &c, &[0x6b; 512]).status, Status::GOOD);
    assert!(run_async(&lu, &rw16(op::READ_16, 0, 4, 9), &[]).data.iter().all(|&b| b == 0));
}

#[test]
fn the_rare_commands_wait_for_the_store_on_their_thread() {
    let lu = unit(Remote::new(1 << 20, 512));
    assert_eq!(run_async(&lu, &rw16(op::WRITE_16, 0, 7, 1), &[0x11; 512]).status, Status::GOOD);
    // VERIFY(16) with BYTCHK=1 reads through the store from this (non-runtime) thread.
    let verify = rw16(op::VERIFY_16, 0x02, 7, 1);
    assert_eq!(run(&lu, &verify, &[0x11; 512]).status, Status::GOOD);
    let s = sense_of(&run(&lu, &verify, &[0x12; 512]));
    assert_eq!(s.key, SenseKey::MISCOMPARE);
    // So does the data path when an embedder calls the synchronous entry point.
    assert_eq!(&run(&lu, &rw16(op::READ_16, 0, 7, 1), &[]).data[..], &[0x11; 512][..]);
}

#[test]
fn a_capacity_change_outside_the_unit_is_a_unit_attention() {
    let lu = unit(Remote::new(1 << 20, 512));
    lu.nexus_seen(&n());
    lu.capacity_changed();
    let s = sense_of(&run(&lu, &[0, 0, 0, 0, 0, 0], &[]));
    assert_eq!((s.key, s.asc), (SenseKey::UNIT_ATTENTION, AscAscq::CAPACITY_DATA_CHANGED));
    assert_eq!(run(&lu, &[0, 0, 0, 0, 0, 0], &[]).status, Status::GOOD);
}

#[test]
fn reservations_are_refused_while_other_gateways_export_the_store() {
    let lu = unit(Remote::new(1 << 20, 512));
    // PERSISTENT RESERVE OUT, REGISTER key 1; RESERVE(6); PERSISTENT RESERVE IN, READ KEYS.
    let mut params = [0u8; 24];
    params[15] = 1;
    let register = [0x5f, 0x00, 0, 0, 0, 0, 0, 0, 24, 0];
    let reserve6 = [0x16, 0, 0, 0, 0, 0];
    let read_keys = [0x5e, 0x00, 0, 0, 0, 0, 0, 0, 64, 0];
    assert_eq!(run(&lu, &register, &params).status, Status::GOOD, "kept by the unit while it is the only gateway");
    lu.set_gateways(true);
    for (cdb, out) in [(&register[..], &params[..]), (&reserve6[..], &[][..]), (&read_keys[..], &[][..])] {
        let s = sense_of(&run(&lu, cdb, out));
        assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_COMMAND_OPERATION_CODE), "{cdb:02x?}");
    }
    let one = |opcode: u8| run(&lu, &[0xa3, 0x0c, 0x01, opcode, 0, 0, 0, 0, 0, 64, 0, 0], &[]).data[1] & 0x07;
    assert_eq!(one(0x16), 1, "RESERVE(6) not listed");
    assert_eq!(run(&lu, &[0xa3, 0x0c, 0x02, 0x5f, 0, 0x00, 0, 0, 0, 64, 0, 0], &[]).data[1] & 0x07, 1, "PR OUT REGISTER not listed");
    lu.set_gateways(false);
    assert_eq!(run(&lu, &read_keys, &[]).status, Status::GOOD);
}

/// Reservations two gateways share through something like a cluster: a text under a lock,
/// published to the other unit before the turn ends.
#[derive(Debug, Default)]
struct Cluster {
    state: Mutex<Option<String>>,
    units: Mutex<Vec<std::sync::Weak<LogicalUnit>>>,
}

#[derive(Debug)]
struct Shared(Arc<Cluster>);

impl SharedReservations for Shared {
    fn update(&self, f: &mut dyn FnMut(Option<&str>) -> Option<String>) -> std::io::Result<()> {
        let mut state = self.0.state.lock().unwrap();
        if let Some(next) = f(state.as_deref()) {
            *state = Some(next);
            for u in self.0.units.lock().unwrap().iter().filter_map(std::sync::Weak::upgrade) {
                u.load_shared_reservations(state.as_deref()).unwrap();
            }
        }
        Ok(())
    }
}

#[test]
fn persistent_reservations_shared_by_two_gateways_hold_at_both() {
    let cluster = Arc::new(Cluster::default());
    let gateways: Vec<Arc<LogicalUnit>> = (0..2).map(|_| unit(Remote::new(1 << 20, 512))).collect();
    for g in &gateways {
        g.set_gateways(true);
        assert!(g.set_shared_reservations(Arc::new(Shared(cluster.clone()))));
        cluster.units.lock().unwrap().push(Arc::downgrade(g));
    }
    // Host A through gateway 0, host B through gateway 1 (different target ports).
    let a = Nexus::new("iqn.2026-11.io.riser:a,i,0x1", "iqn.2026-11.io.riser:t,t,0x1", 1);
    let b = Nexus::new("iqn.2026-11.io.riser:b,i,0x1", "iqn.2026-11.io.riser:t,t,0x2", 2);
    let pr_out = |sa: u8, ty: u8, key: u64, sa_key: u64, aptpl: bool| {
        let mut p = [0u8; 24];
        p[0..8].copy_from_slice(&key.to_be_bytes());
        p[8..16].copy_from_slice(&sa_key.to_be_bytes());
        p[20] = u8::from(aptpl);
        ([0x5f, sa, ty, 0, 0, 0, 0, 0, 24, 0], p)
    };
    let run_on = |g: usize, n: &Nexus, cdb: &[u8], out: &[u8]| run_as(&gateways[g], cdb, out, n);
    // A registers and takes a Write Exclusive reservation through gateway 0, with APTPL (the
    // cluster keeps it).
    let (c, p) = pr_out(0x00, 0, 0, 0xa, true);
    assert_eq!(run_on(0, &a, &c, &p).status, Status::GOOD);
    let (c, p) = pr_out(0x01, 0x01, 0xa, 0, false);
    assert_eq!(run_on(0, &a, &c, &p).status, Status::GOOD);
    // Gateway 1 enforces it: B's write conflicts; READ KEYS and READ RESERVATION there show A's.
    let write = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    assert_eq!(run_on(1, &b, &write, &[0; 512]).status, Status::RESERVATION_CONFLICT);
    let keys = run_on(1, &b, &[0x5e, 0x00, 0, 0, 0, 0, 0, 0, 64, 0], &[]);
    assert_eq!((&keys.data[4..8], &keys.data[8..16]), (&[0, 0, 0, 8][..], &0xau64.to_be_bytes()[..]));
    let res = run_on(1, &b, &[0x5e, 0x01, 0, 0, 0, 0, 0, 0, 64, 0], &[]);
    assert_eq!((&res.data[8..16], res.data[21] & 0x0f), (&0xau64.to_be_bytes()[..], 1));
    // B registers through gateway 1 and preempts A: gateway 0 now refuses A's write.
    let (c, p) = pr_out(0x00, 0, 0, 0xb, false);
    assert_eq!(run_on(1, &b, &c, &p).status, Status::GOOD);
    let (c, p) = pr_out(0x04, 0x01, 0xb, 0xa, false);
    assert_eq!(run_on(1, &b, &c, &p).status, Status::GOOD);
    assert_eq!(run_on(0, &a, &write, &[0; 512]).status, Status::RESERVATION_CONFLICT);
    assert_eq!(run_on(1, &b, &write, &[0; 512]).status, Status::GOOD);
    // One generation over both, and the capability to persist (PTPL_C) on both.
    let gen_at = |g: usize| u32::from_be_bytes(run_on(g, &a, &[0x5e, 0x00, 0, 0, 0, 0, 0, 0, 64, 0], &[]).data[0..4].try_into().unwrap());
    assert_eq!(gen_at(0), gen_at(1));
    let caps = run_on(0, &a, &[0x5e, 0x02, 0, 0, 0, 0, 0, 0, 8, 0], &[]);
    assert_ne!(caps.data[2] & 0x01, 0, "PTPL_C");
    // RESERVE(6) is still refused (to the holder: anyone else meets the conflict first): it
    // would be one gateway's.
    let s = sense_of(&run_on(1, &b, &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(s.asc, AscAscq::INVALID_COMMAND_OPERATION_CODE);
}
