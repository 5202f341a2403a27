//! The SCSI block target core: one [`LogicalUnit`] emulates an SBC-4 / SPC-5 direct-access
//! device over a [`BlockBackend`]. It knows nothing of iSCSI: the server hands it CDBs and
//! data-out bytes and gets back status, sense and data-in bytes.

use crate::backend::BlockBackend;
use bytes::Bytes;
use riser_scsi::capacity::{Capacity10, Capacity16, LbaStatusDescriptor, lba_status_to_bytes};
use riser_scsi::cdb::{Cdb, CdbSize, Rw, op, rw_flags};
use riser_scsi::inquiry::{self, BlockDeviceCharacteristics, BlockLimits, Designator, LogicalBlockProvisioning, StandardInquiry, vpd};
use riser_scsi::lun::Lun;
use riser_scsi::mode::{self, Caching, Control, InformationalExceptions, ModeHeader, ModePage};
use riser_scsi::report::{CommandDescriptor, all_commands_to_bytes, one_command_to_bytes, report_luns_to_bytes};
use riser_scsi::sense::{AscAscq, Sense, SenseKey, Status};
use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// An I_T nexus: the initiator port (name + ISID) as a string.
pub type Nexus = String;

/// Most blocks one WRITE ATOMIC may write.
pub const MAX_ATOMIC_BLOCKS: u32 = 2048;

/// Most blocks one command may move (reported in the Block Limits VPD page).
pub const MAX_TRANSFER_BLOCKS: u32 = 65536;

/// What a command needs before it can run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The decoded CDB.
    pub cdb: Cdb,
    /// Data-out bytes the command needs.
    pub data_out: u32,
    /// The transport's expected data transfer length (set by the server; some commands must
    /// match it exactly).
    pub edtl: u32,
}

/// A command's result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    /// SCSI status.
    pub status: Status,
    /// Sense data (encoded) for CHECK CONDITION.
    pub sense: Option<Bytes>,
    /// Data-in.
    pub data: Bytes,
}

impl Outcome {
    fn good(data: impl Into<Bytes>) -> Self {
        Self { status: Status::GOOD, sense: None, data: data.into() }
    }
    /// RESERVATION CONFLICT.
    pub fn conflict() -> Self {
        Self { status: Status::RESERVATION_CONFLICT, sense: None, data: Bytes::new() }
    }
}

#[derive(Debug, Default)]
struct Pr {
    generation: u32,
    registrations: Vec<(Nexus, u64)>,
    holder: Option<(Nexus, u64, u8)>,
}

#[derive(Debug, Default)]
struct State {
    wce: bool,
    d_sense: bool,
    swp: bool,
    reserved_by: Option<Nexus>,
    pr: Pr,
    unit_attention: HashMap<Nexus, Vec<AscAscq>>,
    prevent: bool,
    stopped: bool,
    sanitize: Option<Arc<SanitizeJob>>,
    sanitize_failed: bool,
    /// A flush failed since the last reset: every flush fails ([`LogicalUnit::flush`]).
    flush_failed: bool,
}

/// A SANITIZE running in the background (SBC-4 §4.11). Until it ends the LU answers NOT READY,
/// SANITIZE IN PROGRESS; it survives task management and the loss of the session that started it.
#[derive(Debug)]
struct SanitizeJob {
    total: u64,
    done: AtomicU64,
    ok: Mutex<Option<bool>>,
    ended: Condvar,
}

impl SanitizeJob {
    fn result(&self) -> Option<bool> {
        *self.ok.lock().unwrap_or_else(|e| e.into_inner())
    }
    fn finish(&self, ok: bool) {
        *self.ok.lock().unwrap_or_else(|e| e.into_inner()) = Some(ok);
        self.ended.notify_all();
    }
    fn wait(&self) -> bool {
        let mut g = self.ok.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(ok) = *g {
                return ok;
            }
            g = self.ended.wait(g).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// What a sanitize leaves the LU in.
enum SanitizeState {
    Idle,
    Running { done: u64, total: u64 },
    Failed,
}

impl State {
    fn sanitize_state(&mut self) -> SanitizeState {
        if let Some(job) = &self.sanitize {
            match job.result() {
                None => return SanitizeState::Running { done: job.done.load(Ordering::Relaxed), total: job.total },
                Some(ok) => {
                    self.sanitize_failed = !ok;
                    self.sanitize = None;
                }
            }
        }
        if self.sanitize_failed { SanitizeState::Failed } else { SanitizeState::Idle }
    }
}

/// The work of a SANITIZE OVERWRITE, done on its own thread.
struct Overwrite {
    backend: Arc<dyn BlockBackend>,
    pattern: Vec<u8>,
    passes: u8,
    invert: bool,
    rate: Option<u64>,
}

impl Overwrite {
    /// Write every pass over the whole medium, then flush; false on a backend error.
    fn run(&self, job: &SanitizeJob) -> bool {
        let bs = u64::from(self.backend.block_size());
        let total = self.backend.num_blocks() * bs;
        let chunk_len = ((1u64 << 20) / bs).max(1) * bs;
        let chunk: Vec<u8> = self.pattern.iter().copied().cycle().take(chunk_len as usize).collect();
        let inverted: Vec<u8> = chunk.iter().map(|b| !b).collect();
        let start = Instant::now();
        let mut written = 0u64;
        for pass in 0..self.passes {
            // With INVERT the pattern is inverted between consecutive passes (SBC-4 §5.30.3).
            let data = if self.invert && pass % 2 == 1 { &inverted } else { &chunk };
            let mut at = 0u64;
            while at < total {
                let n = (total - at).min(chunk_len) as usize;
                if self.backend.write(at, &data[..n]).is_err() {
                    return false;
                }
                at += n as u64;
                written += n as u64;
                job.done.store(written, Ordering::Relaxed);
                if let Some(rate) = self.rate {
                    let due = Duration::from_secs_f64(written as f64 / rate as f64);
                    if let Some(wait) = due.checked_sub(start.elapsed()) {
                        std::thread::sleep(wait);
                    }
                }
            }
        }
        self.backend.flush().is_ok()
    }
}

/// The byte ranges held by the read-modify-write commands (COMPARE AND WRITE, ORWRITE), which
/// must be atomic against each other where they overlap. Only those commands take a range,
/// and one waits only while another holds bytes it needs; READ, WRITE and every other command
/// never look here. A disk that hangs under one of them therefore holds up only the
/// read-modify-writes of the same blocks, never the LU (its state lock is not held across I/O).
#[derive(Debug, Default)]
struct RangeLocks {
    held: Mutex<Vec<Range<u64>>>,
    released: Condvar,
}

impl RangeLocks {
    /// Wait until no held range overlaps `range`, then hold it until the guard drops.
    fn lock(&self, range: Range<u64>) -> RangeGuard<'_> {
        let overlaps = |held: &mut Vec<Range<u64>>| held.iter().any(|h| h.start < range.end && range.start < h.end);
        let held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        let mut held = self.released.wait_while(held, overlaps).unwrap_or_else(|e| e.into_inner());
        held.push(range.clone());
        RangeGuard { locks: self, range }
    }
}

/// A range held in [`RangeLocks`].
struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: Range<u64>,
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        let mut held = self.locks.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = held.iter().position(|h| *h == self.range) {
            held.swap_remove(i);
        }
        drop(held);
        // Waiters for different ranges share the condvar: wake them all to recheck.
        self.locks.released.notify_all();
    }
}

/// One logical unit.
#[derive(Debug)]
pub struct LogicalUnit {
    backend: Arc<dyn BlockBackend>,
    lun: Lun,
    serial: String,
    naa: (u64, u64),
    state: Mutex<State>,
    buffers: Mutex<Vec<Vec<u8>>>,
    read_modify_write: RangeLocks,
    sanitize_rate: Option<u64>,
}

fn lock_pool(m: &Mutex<Vec<Vec<u8>>>) -> std::sync::MutexGuard<'_, Vec<Vec<u8>>> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

type R = Result<Outcome, Sense>;

fn bad_field(byte: u16, bit: Option<u8>) -> Sense {
    Sense::invalid_field_in_cdb(byte, bit)
}
fn illegal(asc: AscAscq) -> Sense {
    Sense::new(SenseKey::ILLEGAL_REQUEST, asc)
}

fn all_registrants(t: u8) -> bool {
    matches!(t, riser_scsi::pr::pr_type::WRITE_EXCLUSIVE_ALL_REGISTRANTS | riser_scsi::pr::pr_type::EXCLUSIVE_ACCESS_ALL_REGISTRANTS)
}

fn truncate(mut v: Vec<u8>, alloc: u32) -> Bytes {
    v.truncate(alloc as usize);
    v.into()
}

impl LogicalUnit {
    /// A logical unit over `backend`; `id` makes its serial number and NAA designator unique.
    pub fn new(backend: Arc<dyn BlockBackend>, lun: Lun, id: u64) -> Self {
        Self {
            backend,
            lun,
            serial: format!("RISER{id:011X}"),
            naa: (id & 0xf_ffff_ffff, 0x5249_5345_5200_0000 | id),
            state: Mutex::new(State { wce: true, ..State::default() }),
            buffers: Mutex::new(Vec::new()),
            read_modify_write: RangeLocks::default(),
            sanitize_rate: None,
        }
    }

    /// Pace SANITIZE to at most `bytes_per_second` of backing-store writes (default: as fast as
    /// the backend goes). This bounds the load a sanitize puts on a shared backing store; it
    /// also keeps a RAM LUN's sanitize observable for conformance tests.
    pub fn with_sanitize_rate(mut self, bytes_per_second: Option<u64>) -> Self {
        self.sanitize_rate = bytes_per_second.filter(|&r| r > 0);
        self
    }

    /// Whether the command's operation goes on after its task ends (SANITIZE: task management
    /// and the loss of its I_T nexus do not stop it, SBC-4). It fences the medium itself (every
    /// medium access gets SANITIZE IN PROGRESS until it is over), so nothing that ends tasks needs
    /// to wait for it either.
    pub fn outlives_its_task(&self, plan: &Plan) -> bool {
        matches!(plan.cdb, Cdb::Sanitize { .. })
    }

    /// Whether `plan` may block its thread for long (file I/O, a SANITIZE without IMMED that
    /// waits for the whole operation, or a read-modify-write that may wait for another on the
    /// same blocks, whose disk may hang); the server runs those off its I/O threads.
    pub fn may_block(&self, plan: &Plan) -> bool {
        !self.backend.in_memory()
            || matches!(plan.cdb, Cdb::Sanitize { flags, .. } if flags & 0x80 == 0)
            || matches!(plan.cdb, Cdb::CompareAndWrite { .. } | Cdb::OrWrite(_))
    }

    fn st(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The LUN.
    pub fn lun(&self) -> Lun {
        self.lun
    }

    /// The backend.
    pub fn backend(&self) -> &Arc<dyn BlockBackend> {
        &self.backend
    }

    /// Queue a unit attention for every nexus (or one).
    pub fn unit_attention(&self, asc: AscAscq, only: Option<&str>) {
        let mut s = self.st();
        match only {
            Some(n) => s.unit_attention.entry(n.into()).or_default().push(asc),
            None => s.unit_attention.values_mut().for_each(|v| v.push(asc)),
        }
    }

    /// LOGICAL UNIT RESET / target reset: RESERVE(6/10) reservations are released, a failed
    /// flush is forgiven, and every nexus gets POWER ON, RESET OR BUS DEVICE RESET OCCURRED
    /// (persistent reservations stay).
    pub fn reset(&self) {
        let mut s = self.st();
        s.reserved_by = None;
        // That unit attention tells every initiator that what sat in the write cache may be
        // gone, which is all a failed flush still had to say: flushes report afresh from here.
        s.flush_failed = false;
        // Every nexus, the issuer's included (SAM-5 §6.3.3; libiscsi's multipath test checks it).
        s.unit_attention.values_mut().for_each(|v| v.push(AscAscq::POWER_ON_RESET));
    }

    /// Register a nexus so unit attentions can be queued for it.
    pub fn nexus_seen(&self, nexus: &str) {
        self.st().unit_attention.entry(nexus.into()).or_default();
    }

    /// Forget a nexus (session ended): drop its RESERVE(6) reservation and pending UAs.
    pub fn nexus_lost(&self, nexus: &str) {
        let mut s = self.st();
        if s.reserved_by.as_deref() == Some(nexus) {
            s.reserved_by = None;
        }
        s.unit_attention.remove(nexus);
    }

    /// Encode sense in the format the Control mode page selects.
    pub fn encode_sense(&self, s: &Sense) -> Bytes {
        if self.st().d_sense { s.to_descriptor().into() } else { s.to_fixed().to_vec().into() }
    }

    fn check(&self, s: Sense) -> Outcome {
        Outcome { status: Status::CHECK_CONDITION, sense: Some(self.encode_sense(&s)), data: Bytes::new() }
    }

    fn blocks(&self) -> u64 {
        self.backend.num_blocks()
    }
    fn bs(&self) -> u32 {
        self.backend.block_size()
    }

    /// Decode a CDB and work out how much data-out it needs. An error outcome (CHECK
    /// CONDITION) means the command must not run and no data may be solicited.
    pub fn plan(&self, cdb: &[u8], nexus: &str) -> Result<Plan, Outcome> {
        let c = match Cdb::parse(cdb) {
            Ok(c) => c,
            Err(e) => return Err(self.check(e.sense(true))),
        };
        // A pending unit attention is reported once, except to INQUIRY, REPORT LUNS and
        // REQUEST SENSE (SAM-5 §5.14).
        if !matches!(c, Cdb::Inquiry { .. } | Cdb::ReportLuns { .. } | Cdb::RequestSense { .. }) {
            let mut s = self.st();
            // While a sanitize runs (or after it failed) the medium is off limits (SBC-4 §4.11.2).
            match s.sanitize_state() {
                SanitizeState::Idle => {}
                SanitizeState::Running { done, total } => {
                    drop(s);
                    return Err(self.check(Sense::not_ready_in_progress(AscAscq::SANITIZE_IN_PROGRESS, done, total)));
                }
                SanitizeState::Failed if !matches!(c, Cdb::Sanitize { .. } | Cdb::ReportSupportedOpcodes { .. }) => {
                    drop(s);
                    return Err(self.check(Sense::new(SenseKey::MEDIUM_ERROR, AscAscq::SANITIZE_COMMAND_FAILED)));
                }
                SanitizeState::Failed => {}
            }
            if let Some(v) = s.unit_attention.get_mut(nexus)
                && !v.is_empty()
            {
                let asc = v.remove(0);
                drop(s);
                return Err(self.check(Sense::new(SenseKey::UNIT_ATTENTION, asc)));
            }
        }
        let data_out = c.data_out_len(self.bs()).unwrap_or(0);
        if data_out > u64::from(crate::MAX_DATA_OUT) {
            return Err(self.check(bad_field(7, None)));
        }
        Ok(Plan { cdb: c, data_out: data_out as u32, edtl: data_out as u32 })
    }

    /// Run a planned command with its data-out.
    pub fn execute(&self, plan: &Plan, data_out: &[u8], nexus: &str) -> Outcome {
        if let Some(conflict) = self.reservation_conflict(&plan.cdb, nexus) {
            return conflict;
        }
        if let Cdb::WriteSame(r) = &plan.cdb
            && !(r.size == CdbSize::Sixteen && r.flags & rw_flags::NDOB != 0)
            && plan.edtl != self.bs()
        {
            // WRITE SAME carries exactly one block.
            return self.check(bad_field(if r.size == CdbSize::Sixteen { 10 } else { 7 }, None));
        }
        if let Cdb::CompareAndWrite { blocks, .. } = plan.cdb
            && plan.edtl != 2 * u32::from(blocks) * self.bs()
        {
            // The Data-Out buffer must hold exactly the verify and write data (SBC-4 §5.3).
            return self.check(bad_field(13, None));
        }
        match self.run(&plan.cdb, data_out, nexus) {
            Ok(o) => o,
            Err(s) => self.check(s),
        }
    }

    fn reservation_conflict(&self, c: &Cdb, nexus: &str) -> Option<Outcome> {
        let s = self.st();
        let allowed_always = matches!(
            c,
            Cdb::Inquiry { .. }
                | Cdb::ReportLuns { .. }
                | Cdb::RequestSense { .. }
                | Cdb::PersistentReserveIn { .. }
                | Cdb::PersistentReserveOut { .. }
                | Cdb::ReadCapacity10 { .. }
                | Cdb::ReadCapacity16 { .. }
                | Cdb::Release6 { .. }
                | Cdb::Release10 { .. }
        );
        if let Some(holder) = &s.reserved_by
            && holder != nexus
            && !allowed_always
        {
            return Some(Outcome::conflict());
        }
        if let Some((holder, _, ty)) = &s.pr.holder
            && holder != nexus
            && !allowed_always
        {
            let registered = s.pr.registrations.iter().any(|(n, _)| n == nexus);
            let is_write = matches!(
                c,
                Cdb::Write(_)
                    | Cdb::WriteAndVerify(_)
                    | Cdb::WriteSame(_)
                    | Cdb::Unmap { .. }
                    | Cdb::CompareAndWrite { .. }
                    | Cdb::SynchronizeCache(_)
                    | Cdb::ModeSelect(_)
                    | Cdb::Reserve6 { .. }
                    | Cdb::Reserve10 { .. }
                    | Cdb::OrWrite(_)
                    | Cdb::WriteAtomic { .. }
                    | Cdb::Sanitize { .. }
            );
            use riser_scsi::pr::pr_type::*;
            let conflict = match *ty {
                WRITE_EXCLUSIVE => is_write,
                EXCLUSIVE_ACCESS => true,
                WRITE_EXCLUSIVE_REGISTRANTS_ONLY | WRITE_EXCLUSIVE_ALL_REGISTRANTS => is_write && !registered,
                EXCLUSIVE_ACCESS_REGISTRANTS_ONLY | EXCLUSIVE_ACCESS_ALL_REGISTRANTS => !registered,
                _ => false,
            };
            if conflict {
                return Some(Outcome::conflict());
            }
        }
        None
    }

    /// Check an LBA range against the capacity.
    fn range(&self, lba: u64, blocks: u64) -> Result<(u64, usize), Sense> {
        if lba.checked_add(blocks).is_none_or(|end| end > self.blocks()) {
            return Err(illegal(AscAscq::LBA_OUT_OF_RANGE));
        }
        if blocks > u64::from(MAX_TRANSFER_BLOCKS) {
            return Err(bad_field(if blocks > 0xffff { 10 } else { 7 }, None));
        }
        Ok((lba * u64::from(self.bs()), (blocks * u64::from(self.bs())) as usize))
    }

    fn io_error(&self, read: bool) -> Sense {
        Sense::new(SenseKey::MEDIUM_ERROR, if read { AscAscq::UNRECOVERED_READ_ERROR } else { AscAscq::WRITE_ERROR })
    }

    /// Make everything written so far durable (SYNCHRONIZE CACHE, and [`Self::settle`]).
    ///
    /// A flush error is sticky: once a flush has failed, every later one fails too (MEDIUM
    /// ERROR, WRITE ERROR) until the LU is reset ([`Self::reset`]: LOGICAL UNIT RESET, target
    /// warm or cold reset). After a failed `fdatasync` the kernel marks the pages it could not
    /// write clean (and reports the error once per open file), so the next `fdatasync`
    /// succeeds although those writes are lost; a GOOD then would tell the initiator that data
    /// which is gone is on the medium. The backend is still flushed every time, so what is
    /// written afterwards is as durable as the device allows.
    fn flush(&self) -> Result<(), Sense> {
        let result = self.backend.flush();
        let mut s = self.st();
        if let Err(e) = &result
            && !s.flush_failed
        {
            tracing::error!(lun = %self.lun, "flush failed, failing every flush until a LUN reset: {e}");
            s.flush_failed = true;
        }
        if s.flush_failed { Err(self.io_error(false)) } else { Ok(()) }
    }

    /// The end of every command that modifies the medium: with FUA, or with the write cache
    /// disabled (Caching mode page WCE=0), GOOD may only be returned once the data is on the
    /// medium, so flush first. `fua` is false for commands without the bit (WRITE SAME, UNMAP:
    /// byte 1 bit 3 of WRITE SAME is UNMAP, not FUA).
    fn settle(&self, fua: bool) -> Result<Outcome, Sense> {
        if fua || !self.st().wce {
            self.flush()?;
        }
        Ok(Outcome::good(Bytes::new()))
    }

    fn write_protected(&self) -> Result<(), Sense> {
        if self.st().swp { Err(Sense::new(SenseKey::DATA_PROTECT, AscAscq::WRITE_PROTECTED)) } else { Ok(()) }
    }

    fn run(&self, c: &Cdb, out: &[u8], nexus: &str) -> R {
        match c {
            Cdb::TestUnitReady { .. } => Ok(Outcome::good(Bytes::new())),
            Cdb::RequestSense { desc, alloc_len, .. } => {
                let s = match self.st().sanitize_state() {
                    SanitizeState::Running { done, total } => Sense::not_ready_in_progress(AscAscq::SANITIZE_IN_PROGRESS, done, total),
                    SanitizeState::Failed => Sense::new(SenseKey::MEDIUM_ERROR, AscAscq::SANITIZE_COMMAND_FAILED),
                    SanitizeState::Idle => Sense::new(SenseKey::NO_SENSE, AscAscq::NO_ADDITIONAL_SENSE),
                };
                let b = if *desc { s.to_descriptor() } else { s.to_fixed().to_vec() };
                Ok(Outcome::good(truncate(b, u32::from(*alloc_len))))
            }
            Cdb::Inquiry { evpd, page_code, alloc_len, .. } => {
                self.inquiry(*evpd, *page_code).map(|b| Outcome::good(truncate(b, u32::from(*alloc_len))))
            }
            Cdb::ReadCapacity10 { lba, pmi, .. } => {
                if !pmi && *lba != 0 {
                    return Err(bad_field(2, None));
                }
                Ok(Outcome::good(Capacity10::new(self.blocks(), self.bs()).to_bytes().to_vec()))
            }
            Cdb::ReadCapacity16 { alloc_len, .. } => {
                let thin = self.backend.thin();
                let c = Capacity16 { lbpme: thin, lbprz: thin, ..Capacity16::new(self.blocks(), self.bs()) };
                Ok(Outcome::good(truncate(c.to_bytes().to_vec(), *alloc_len)))
            }
            Cdb::Read(r) => self.read(r),
            Cdb::Write(r) => self.write(r, out),
            Cdb::WriteAndVerify(r) => {
                if r.protect() != 0 {
                    return Err(bad_field(1, Some(7)));
                }
                self.write(&Rw { flags: r.flags & !0x06, ..*r }, out)
            }
            Cdb::Verify(r) => self.verify(r, out),
            Cdb::SynchronizeCache(r) => {
                self.range(r.lba, u64::from(r.blocks).min(u64::from(MAX_TRANSFER_BLOCKS)))?;
                self.flush()?;
                Ok(Outcome::good(Bytes::new()))
            }
            Cdb::WriteSame(r) => self.write_same(r, out),
            Cdb::PreFetch(r) => {
                // Everything is already in memory (or the page cache): nothing to stage.
                self.range(r.lba, u64::from(r.blocks).min(u64::from(MAX_TRANSFER_BLOCKS)))?;
                Ok(Outcome::good(Bytes::new()))
            }
            Cdb::OrWrite(r) => self.or_write(r, out),
            Cdb::Sanitize { flags, reserved, param_len, .. } => self.sanitize(*flags, reserved, *param_len, out),
            Cdb::WriteAtomic { lba, blocks, flags, group, control } if self.backend.atomic_writes() => {
                if u32::from(*blocks) > MAX_ATOMIC_BLOCKS {
                    return Err(bad_field(12, None));
                }
                let rw =
                    Rw { size: CdbSize::Sixteen, lba: *lba, blocks: u32::from(*blocks), flags: *flags, group: *group, control: *control };
                self.write(&rw, out)
            }
            Cdb::ReadDefectData { twelve, flags, alloc_len, .. } => {
                // No defects: a header with an empty list in the requested format.
                let mut v = if *twelve { vec![0u8; 8] } else { vec![0u8; 4] };
                v[1] = flags & 0x1f;
                Ok(Outcome::good(truncate(v, *alloc_len)))
            }
            Cdb::Unmap { .. } => self.unmap(out),
            Cdb::CompareAndWrite { lba, blocks, flags, .. } => self.compare_and_write(*lba, *blocks, *flags, out),
            Cdb::GetLbaStatus { lba, alloc_len, .. } => {
                if *lba >= self.blocks() {
                    return Err(illegal(AscAscq::LBA_OUT_OF_RANGE));
                }
                let bs = u64::from(self.bs());
                let mapped = self.backend.is_mapped(lba * bs);
                let mut n = 1u64;
                while lba + n < self.blocks() && n < 0xffff_ffff && self.backend.is_mapped((lba + n) * bs) == mapped && n < 65536 {
                    n += 1;
                }
                let d = LbaStatusDescriptor { lba: *lba, blocks: n as u32, status: if mapped { 0 } else { 1 } };
                Ok(Outcome::good(truncate(lba_status_to_bytes(&[d]), *alloc_len)))
            }
            Cdb::ModeSense(m) => self.mode_sense(m),
            Cdb::ModeSelect(m) => self.mode_select(m, out),
            Cdb::ReportLuns { select, alloc_len, .. } => {
                if *alloc_len < 16 {
                    return Err(bad_field(6, None));
                }
                if *select > 2 {
                    return Err(bad_field(2, None));
                }
                Ok(Outcome::good(truncate(report_luns_to_bytes(&[self.lun]), *alloc_len)))
            }
            Cdb::ReportSupportedOpcodes { rctd, options, opcode, service_action, alloc_len, .. } => {
                self.rsoc(*rctd, *options, *opcode, *service_action, *alloc_len)
            }
            Cdb::StartStopUnit { power_condition, loej, start, .. } => {
                if *power_condition != 0 {
                    return Ok(Outcome::good(Bytes::new()));
                }
                let mut s = self.st();
                if *loej && !*start && s.prevent {
                    return Err(illegal(AscAscq::new(0x53, 0x02)));
                }
                s.stopped = !*start;
                Ok(Outcome::good(Bytes::new()))
            }
            Cdb::PreventAllowMediumRemoval { prevent, .. } => {
                self.st().prevent = *prevent & 1 == 1;
                Ok(Outcome::good(Bytes::new()))
            }
            Cdb::Reserve6 { .. } | Cdb::Reserve10 { .. } => {
                let mut s = self.st();
                match &s.reserved_by {
                    Some(h) if h != nexus => Ok(Outcome::conflict()),
                    _ => {
                        s.reserved_by = Some(nexus.into());
                        Ok(Outcome::good(Bytes::new()))
                    }
                }
            }
            Cdb::Release6 { .. } | Cdb::Release10 { .. } => {
                let mut s = self.st();
                if s.reserved_by.as_deref() == Some(nexus) {
                    s.reserved_by = None;
                }
                Ok(Outcome::good(Bytes::new()))
            }
            Cdb::PersistentReserveIn { service_action, alloc_len, .. } => self.pr_in(*service_action, *alloc_len),
            Cdb::PersistentReserveOut { service_action, scope, pr_type, .. } => self.pr_out(*service_action, *scope, *pr_type, out, nexus),
            _ => Err(illegal(AscAscq::INVALID_COMMAND_OPERATION_CODE)),
        }
    }

    fn check_rw(&self, r: &Rw) -> Result<(u64, usize), Sense> {
        if r.protect() != 0 {
            // No protection information on riser LUs.
            return Err(bad_field(1, Some(7)));
        }
        self.range(r.lba, u64::from(r.transfer_blocks()))
    }

    fn read(&self, r: &Rw) -> R {
        let (off, len) = self.check_rw(r)?;
        let mut buf = lock_pool(&self.buffers).pop().unwrap_or_default();
        self.backend.read_into(off, len, &mut buf).map_err(|_| self.io_error(true))?;
        Ok(Outcome::good(buf))
    }

    /// Hand back the data buffer of a finished READ for reuse (large buffers would otherwise be
    /// a fresh mapping, page-faulted in, per command).
    pub fn recycle(&self, data: Bytes) {
        if let Ok(b) = data.try_into_mut()
            && b.capacity() <= 8 << 20
        {
            let mut pool = lock_pool(&self.buffers);
            if pool.len() < 32 {
                pool.push(b.into());
            }
        }
    }

    fn write(&self, r: &Rw, out: &[u8]) -> R {
        let (off, len) = self.check_rw(r)?;
        self.write_protected()?;
        // With an iSCSI EDTL below the CDB's transfer length only the whole blocks received are
        // written (the residual overflow tells the initiator); RFC 7143 §11.4.5.1.
        let bs = self.bs() as usize;
        let len = len.min(out.len() / bs * bs);
        self.backend.write(off, &out[..len]).map_err(|_| self.io_error(false))?;
        self.settle(r.fua())
    }

    /// SANITIZE (SBC-4 §5.30): OVERWRITE with an initialization pattern. The overwrite runs on
    /// its own thread; with IMMED the status is GOOD once it has started, without it the status
    /// waits for the end (the caller's thread blocks: see [`LogicalUnit::may_block`]).
    fn sanitize(&self, flags: u8, reserved: &[u8; 5], param_len: u16, out: &[u8]) -> R {
        const OVERWRITE: u8 = 0x01;
        const IMMED: u8 = 0x80;
        if flags & 0x40 != 0 {
            return Err(bad_field(1, Some(6)));
        }
        if reserved.iter().any(|&b| b != 0) {
            return Err(bad_field(2, None));
        }
        if flags & 0x1f != OVERWRITE {
            return Err(bad_field(1, Some(4)));
        }
        let p = usize::from(param_len);
        if p <= 4 || p >= self.bs() as usize + 5 || out.len() < p {
            return Err(bad_field(7, None));
        }
        let count = out[0] & 0x1f;
        let pattern_len = usize::from(u16::from_be_bytes([out[2], out[3]]));
        if count == 0 || pattern_len == 0 || pattern_len > self.bs() as usize || pattern_len > p - 4 {
            return Err(bad_field(7, None));
        }
        self.write_protected()?;
        let overwrite = Overwrite {
            backend: self.backend.clone(),
            pattern: out[4..4 + pattern_len].to_vec(),
            passes: count,
            invert: out[0] & 0x80 != 0,
            rate: self.sanitize_rate,
        };
        let job = Arc::new(SanitizeJob {
            total: self.blocks() * u64::from(self.bs()) * u64::from(count),
            done: AtomicU64::new(0),
            ok: Mutex::new(None),
            ended: Condvar::new(),
        });
        {
            let mut s = self.st();
            if let SanitizeState::Running { done, total } = s.sanitize_state() {
                // Two SANITIZE commands raced past the gate in plan().
                return Err(Sense::not_ready_in_progress(AscAscq::SANITIZE_IN_PROGRESS, done, total));
            }
            s.sanitize = Some(job.clone());
            s.sanitize_failed = false;
        }
        let worker = job.clone();
        if let Err(e) = std::thread::Builder::new().name("riser-sanitize".into()).spawn(move || worker.finish(overwrite.run(&worker))) {
            tracing::error!("cannot start the sanitize thread: {e}");
            job.finish(false);
        }
        if flags & IMMED != 0 || job.wait() {
            Ok(Outcome::good(Bytes::new()))
        } else {
            Err(Sense::new(SenseKey::MEDIUM_ERROR, AscAscq::SANITIZE_COMMAND_FAILED))
        }
    }

    fn or_write(&self, r: &Rw, out: &[u8]) -> R {
        let (off, len) = self.check_rw(r)?;
        self.write_protected()?;
        let bs = self.bs() as usize;
        let len = len.min(out.len() / bs * bs);
        let held = self.read_modify_write.lock(off..off + len as u64);
        let mut cur = vec![0u8; len];
        self.backend.read(off, &mut cur).map_err(|_| self.io_error(true))?;
        cur.iter_mut().zip(&out[..len]).for_each(|(c, o)| *c |= o);
        self.backend.write(off, &cur).map_err(|_| self.io_error(false))?;
        // The flush needs no atomicity: hand the blocks on first.
        drop(held);
        self.settle(r.fua())
    }

    fn verify(&self, r: &Rw, out: &[u8]) -> R {
        if r.protect() != 0 {
            return Err(bad_field(1, Some(7)));
        }
        let (off, len) = self.range(r.lba, u64::from(r.blocks))?;
        let mut buf = vec![0u8; len];
        self.backend.read(off, &mut buf).map_err(|_| self.io_error(true))?;
        let bs = self.bs() as usize;
        let cmp = |expected: &[u8], actual: &[u8]| expected.iter().zip(actual).position(|(a, b)| a != b);
        let miscompare = match r.bytchk() {
            0 => None,
            1 => cmp(out, &buf),
            3 => buf.chunks(bs).enumerate().find_map(|(i, blk)| cmp(&out[..bs.min(out.len())], blk).map(|p| i * bs + p)),
            _ => return Err(bad_field(1, Some(2))),
        };
        match miscompare {
            Some(at) => {
                let mut s = Sense::new(SenseKey::MISCOMPARE, AscAscq::MISCOMPARE_DURING_VERIFY);
                s.information = Some(at as u64);
                Err(s)
            }
            None => Ok(Outcome::good(Bytes::new())),
        }
    }

    fn write_same(&self, r: &Rw, out: &[u8]) -> R {
        if r.protect() != 0 {
            return Err(bad_field(1, Some(7)));
        }
        let ndob = r.size == CdbSize::Sixteen && r.flags & rw_flags::NDOB != 0;
        let unmap = r.flags & rw_flags::UNMAP != 0;
        if r.flags & rw_flags::ANCHOR != 0 {
            return Err(bad_field(1, Some(4)));
        }
        let blocks = if r.blocks == 0 { self.blocks().saturating_sub(r.lba) } else { u64::from(r.blocks) };
        if r.lba.checked_add(blocks).is_none_or(|e| e > self.blocks()) {
            return Err(illegal(AscAscq::LBA_OUT_OF_RANGE));
        }
        self.write_protected()?;
        let bs = u64::from(self.bs());
        let pattern: Vec<u8> = if ndob {
            vec![0; bs as usize]
        } else {
            out.get(..bs as usize).ok_or_else(|| illegal(AscAscq::PARAMETER_LIST_LENGTH_ERROR))?.to_vec()
        };
        // UNMAP=1 on a thin LU deallocates whatever the pattern (LBPRZ=1: the blocks then read
        // as zeros), as Linux LIO does and libiscsi's suite expects.
        if unmap && self.backend.thin() {
            self.backend.unmap(r.lba * bs, blocks * bs).map_err(|_| self.io_error(false))?;
        } else {
            let per_chunk = (1u64 << 20) / bs;
            let chunk: Vec<u8> = pattern.iter().copied().cycle().take((per_chunk.min(blocks) * bs) as usize).collect();
            let mut b = 0;
            while b < blocks {
                let n = per_chunk.min(blocks - b);
                self.backend.write((r.lba + b) * bs, &chunk[..(n * bs) as usize]).map_err(|_| self.io_error(false))?;
                b += n;
            }
        }
        self.settle(false)
    }

    fn unmap(&self, out: &[u8]) -> R {
        let ds = riser_scsi::unmap::parse(out).map_err(|e| e.sense(false))?;
        self.write_protected()?;
        let bs = u64::from(self.bs());
        for d in &ds {
            if d.lba.checked_add(u64::from(d.blocks)).is_none_or(|e| e > self.blocks()) {
                return Err(illegal(AscAscq::LBA_OUT_OF_RANGE));
            }
        }
        if ds.len() > 256 {
            return Err(bad_field(7, None));
        }
        for d in &ds {
            self.backend.unmap(d.lba * bs, u64::from(d.blocks) * bs).map_err(|_| self.io_error(false))?;
        }
        self.settle(false)
    }

    fn compare_and_write(&self, lba: u64, blocks: u8, flags: u8, out: &[u8]) -> R {
        if flags >> 5 != 0 {
            return Err(bad_field(1, Some(7)));
        }
        if blocks > 1 {
            return Err(bad_field(13, None));
        }
        if blocks == 0 {
            return Ok(Outcome::good(Bytes::new()));
        }
        let (off, len) = self.range(lba, u64::from(blocks))?;
        if out.len() < 2 * len {
            return Err(illegal(AscAscq::PARAMETER_LIST_LENGTH_ERROR));
        }
        self.write_protected()?;
        let held = self.read_modify_write.lock(off..off + len as u64);
        let mut cur = vec![0u8; len];
        self.backend.read(off, &mut cur).map_err(|_| self.io_error(true))?;
        if let Some(at) = cur.iter().zip(&out[..len]).position(|(a, b)| a != b) {
            let mut s = Sense::new(SenseKey::MISCOMPARE, AscAscq::MISCOMPARE_DURING_VERIFY);
            s.information = Some(at as u64);
            return Err(s);
        }
        self.backend.write(off, &out[len..2 * len]).map_err(|_| self.io_error(false))?;
        drop(held);
        self.settle(flags & rw_flags::FUA != 0)
    }

    fn inquiry(&self, evpd: bool, page: u8) -> Result<Vec<u8>, Sense> {
        let dev = inquiry::DEVICE_TYPE_DISK;
        if !evpd {
            if page != 0 {
                return Err(bad_field(2, None));
            }
            let mut s = StandardInquiry::disk("RISER", "RISER DISK", "0001");
            s.version_descriptors = vec![0x00c0, 0x0960, 0x0600, 0x04c0];
            return Ok(s.to_bytes());
        }
        let body = match page {
            vpd::SUPPORTED_PAGES => vec![0x00, 0x80, 0x83, 0xb0, 0xb1, 0xb2],
            vpd::UNIT_SERIAL_NUMBER => self.serial.as_bytes().to_vec(),
            vpd::DEVICE_IDENTIFICATION => inquiry::device_identification(&[
                Designator::naa_registered_extended(0x00_1405, self.naa.0, self.naa.1),
                Designator::t10_vendor("RISER", &self.serial),
                Designator::relative_target_port(1),
            ]),
            vpd::BLOCK_LIMITS => {
                let thin = self.backend.thin();
                BlockLimits {
                    max_compare_and_write_len: 1,
                    optimal_transfer_granularity: 1,
                    max_transfer_len: MAX_TRANSFER_BLOCKS,
                    optimal_transfer_len: 2048,
                    max_unmap_lba_count: if thin { 1 << 20 } else { 0 },
                    max_unmap_descriptor_count: if thin { 256 } else { 0 },
                    optimal_unmap_granularity: 1,
                    unmap_granularity_alignment: thin.then_some(0),
                    // No limit: WRITE SAME moves no data over the wire.
                    max_write_same_len: 0,
                    max_atomic_transfer_len: if self.backend.atomic_writes() { MAX_ATOMIC_BLOCKS } else { 0 },
                    atomic_alignment: 1,
                    atomic_granularity: 1,
                    ..BlockLimits::default()
                }
                .to_body()
                .to_vec()
            }
            vpd::BLOCK_DEVICE_CHARACTERISTICS => BlockDeviceCharacteristics { rotation_rate: 1, form_factor: 0 }.to_body().to_vec(),
            vpd::LOGICAL_BLOCK_PROVISIONING => {
                let thin = self.backend.thin();
                LogicalBlockProvisioning {
                    lbpu: thin,
                    lbpws: thin,
                    lbpws10: thin,
                    lbprz: u8::from(thin),
                    provisioning_type: if thin { 2 } else { 0 },
                    ..Default::default()
                }
                .to_body()
                .to_vec()
            }
            _ => return Err(bad_field(2, None)),
        };
        Ok(inquiry::vpd_page(dev, page, &body))
    }

    fn mode_pages(&self, pc: u8) -> Vec<ModePage> {
        let s = self.st();
        let changeable = pc == 1;
        let caching = if changeable { Caching { wce: true, rcd: false } } else { Caching { wce: s.wce, rcd: false } };
        let control = if changeable {
            Control { d_sense: true, swp: true, ..Control::default() }
        } else {
            Control { d_sense: s.d_sense, swp: s.swp, tas: false, queue_algorithm: 1, ..Control::default() }
        };
        let mut pages = vec![caching.to_page(), control.to_page(), InformationalExceptions::default().to_page()];
        if changeable {
            for p in &mut pages {
                if p.code == mode::page::CONTROL {
                    // Only D_SENSE and SWP are changeable.
                    let mut d = vec![0u8; p.data.len()];
                    d[0] = 0x04;
                    d[2] = 0x08;
                    p.data = d;
                } else if p.code == mode::page::INFORMATIONAL_EXCEPTIONS {
                    p.data.fill(0);
                }
            }
        }
        pages
    }

    fn mode_sense(&self, m: &riser_scsi::cdb::ModeSense) -> R {
        if m.pc == 3 {
            return Err(illegal(AscAscq::SAVING_PARAMETERS_NOT_SUPPORTED));
        }
        let all = self.mode_pages(m.pc);
        let pages: Vec<ModePage> = match (m.page, m.subpage) {
            (mode::page::ALL, 0 | 0xff) => all,
            (p, 0) => all.into_iter().filter(|x| x.code == p).collect(),
            _ => Vec::new(),
        };
        if pages.is_empty() {
            return Err(bad_field(2, Some(5)));
        }
        // The capacity comes from the backend: ask it without the state lock held.
        let swp = self.st().swp;
        let header = ModeHeader {
            medium_type: 0,
            device_specific: mode::device_specific::DPOFUA | if swp { mode::device_specific::WP } else { 0 },
            block_descriptor: (!m.dbd).then(|| (self.blocks(), self.bs())),
        };
        let data = mode::mode_sense_data(m.ten, &header, &pages);
        Ok(Outcome::good(truncate(data, u32::from(m.alloc_len))))
    }

    fn mode_select(&self, m: &riser_scsi::cdb::ModeSelect, out: &[u8]) -> R {
        if m.sp {
            return Err(bad_field(1, Some(0)));
        }
        if !m.pf {
            return Err(bad_field(1, Some(4)));
        }
        if out.is_empty() {
            return Ok(Outcome::good(Bytes::new()));
        }
        let (_, pages) = mode::parse_mode_parameters(m.ten, out).map_err(|e| e.sense(false))?;
        let mut s = self.st();
        for p in pages {
            match p.code {
                mode::page::CACHING => s.wce = Caching::parse(&p.data).map_err(|e| e.sense(false))?.wce,
                mode::page::CONTROL => {
                    let c = Control::parse(&p.data).map_err(|e| e.sense(false))?;
                    s.d_sense = c.d_sense;
                    s.swp = c.swp;
                }
                mode::page::INFORMATIONAL_EXCEPTIONS => {}
                _ => return Err(Sense::invalid_field_in_parameter_list(0, None)),
            }
        }
        Ok(Outcome::good(Bytes::new()))
    }

    fn supported(&self) -> Vec<CommandDescriptor> {
        let plain = |opcode: u8, len: u16| CommandDescriptor { opcode, service_action: 0, service_action_valid: false, cdb_len: len };
        let sa = |opcode: u8, s: u16, len: u16| CommandDescriptor { opcode, service_action: s, service_action_valid: true, cdb_len: len };
        use op::*;
        let mut v = vec![
            plain(TEST_UNIT_READY, 6),
            plain(REQUEST_SENSE, 6),
            plain(INQUIRY, 6),
            plain(READ_6, 6),
            plain(WRITE_6, 6),
            plain(MODE_SELECT_6, 6),
            plain(RESERVE_6, 6),
            plain(RELEASE_6, 6),
            plain(MODE_SENSE_6, 6),
            plain(START_STOP_UNIT, 6),
            plain(PREVENT_ALLOW_MEDIUM_REMOVAL, 6),
            plain(READ_CAPACITY_10, 10),
            plain(READ_10, 10),
            plain(WRITE_10, 10),
            plain(WRITE_AND_VERIFY_10, 10),
            plain(VERIFY_10, 10),
            plain(SYNCHRONIZE_CACHE_10, 10),
            plain(WRITE_SAME_10, 10),
            plain(MODE_SELECT_10, 10),
            plain(RESERVE_10, 10),
            plain(RELEASE_10, 10),
            plain(MODE_SENSE_10, 10),
            sa(PERSISTENT_RESERVE_IN, 0, 10),
            sa(PERSISTENT_RESERVE_IN, 1, 10),
            sa(PERSISTENT_RESERVE_IN, 2, 10),
            sa(PERSISTENT_RESERVE_IN, 3, 10),
            sa(PERSISTENT_RESERVE_OUT, 0, 10),
            sa(PERSISTENT_RESERVE_OUT, 1, 10),
            sa(PERSISTENT_RESERVE_OUT, 2, 10),
            sa(PERSISTENT_RESERVE_OUT, 3, 10),
            sa(PERSISTENT_RESERVE_OUT, 4, 10),
            sa(PERSISTENT_RESERVE_OUT, 6, 10),
            plain(READ_16, 16),
            plain(COMPARE_AND_WRITE, 16),
            plain(WRITE_16, 16),
            plain(WRITE_AND_VERIFY_16, 16),
            plain(VERIFY_16, 16),
            plain(SYNCHRONIZE_CACHE_16, 16),
            plain(WRITE_SAME_16, 16),
            sa(SERVICE_ACTION_IN_16, u16::from(SA_READ_CAPACITY_16), 16),
            sa(SERVICE_ACTION_IN_16, u16::from(SA_GET_LBA_STATUS), 16),
            plain(REPORT_LUNS, 12),
            plain(PRE_FETCH_10, 10),
            plain(PRE_FETCH_16, 16),
            plain(ORWRITE_16, 16),
            sa(SANITIZE, 0x01, 10),
            plain(WRITE_ATOMIC_16, 16),
            plain(READ_DEFECT_DATA_10, 10),
            plain(READ_DEFECT_DATA_12, 12),
            sa(MAINTENANCE_IN, u16::from(SA_REPORT_SUPPORTED_OPCODES), 12),
            plain(READ_12, 12),
            plain(WRITE_12, 12),
            plain(WRITE_AND_VERIFY_12, 12),
            plain(VERIFY_12, 12),
        ];
        if self.backend.thin() {
            v.push(plain(UNMAP, 10));
        }
        v
    }

    fn rsoc(&self, rctd: bool, options: u8, opcode: u8, sa: u16, alloc: u32) -> R {
        let cmds = self.supported();
        let data = match options {
            0 => all_commands_to_bytes(&cmds, rctd),
            1..=3 => {
                let found = cmds.iter().find(|c| c.opcode == opcode && (options == 1 || !c.service_action_valid || c.service_action == sa));
                let needs_sa = cmds.iter().any(|c| c.opcode == opcode && c.service_action_valid);
                if options == 1 && needs_sa {
                    return Err(bad_field(2, None));
                }
                if options == 2 && cmds.iter().any(|c| c.opcode == opcode && !c.service_action_valid) {
                    return Err(bad_field(2, None));
                }
                match found {
                    Some(c) => {
                        let mut usage = vec![0xffu8; usize::from(c.cdb_len)];
                        usage[0] = c.opcode;
                        one_command_to_bytes(3, &usage, rctd)
                    }
                    None => one_command_to_bytes(1, &[], rctd),
                }
            }
            _ => return Err(bad_field(2, None)),
        };
        Ok(Outcome::good(truncate(data, alloc)))
    }

    fn pr_in(&self, sa: u8, alloc: u16) -> R {
        use riser_scsi::pr::*;
        let s = self.st();
        let data = match sa {
            in_sa::READ_KEYS => read_keys_to_bytes(s.pr.generation, &s.pr.registrations.iter().map(|(_, k)| *k).collect::<Vec<_>>()),
            in_sa::READ_RESERVATION => read_reservation_to_bytes(
                s.pr.generation,
                // All-registrants reservations report key 0 (SPC-5 §6.16.3).
                s.pr.holder.as_ref().map(|(_, k, t)| Reservation { key: if all_registrants(*t) { 0 } else { *k }, scope: 0, pr_type: *t }),
            ),
            in_sa::READ_FULL_STATUS => self.full_status(&s.pr),
            in_sa::REPORT_CAPABILITIES => report_capabilities_to_bytes(0x10, 0x80, 0xea01).to_vec(),
            _ => return Err(bad_field(1, Some(4))),
        };
        Ok(Outcome::good(truncate(data, u32::from(alloc))))
    }

    fn full_status(&self, pr: &Pr) -> Vec<u8> {
        let mut body = Vec::new();
        for (n, k) in &pr.registrations {
            let holder = pr.holder.as_ref().filter(|(h, _, t)| h == n || all_registrants(*t));
            // iSCSI TransportID, format 00b: the initiator name, NUL-terminated, padded to 4.
            let name = n.split(",i,").next().unwrap_or(n);
            let mut tid = vec![0x05, 0, 0, 0];
            tid.extend_from_slice(name.as_bytes());
            tid.push(0);
            tid.resize(tid.len().div_ceil(4) * 4, 0);
            let l = (tid.len() - 4) as u16;
            tid[2..4].copy_from_slice(&l.to_be_bytes());
            let mut d = [0u8; 24];
            d[0..8].copy_from_slice(&k.to_be_bytes());
            if let Some((_, _, t)) = holder {
                d[12] = 0x01;
                d[13] = *t;
            }
            d[18..20].copy_from_slice(&1u16.to_be_bytes());
            d[20..24].copy_from_slice(&(tid.len() as u32).to_be_bytes());
            body.extend_from_slice(&d);
            body.extend_from_slice(&tid);
        }
        let mut v = Vec::with_capacity(8 + body.len());
        v.extend_from_slice(&pr.generation.to_be_bytes());
        v.extend_from_slice(&(body.len() as u32).to_be_bytes());
        v.extend_from_slice(&body);
        v
    }

    fn pr_out(&self, sa: u8, scope: u8, ty: u8, out: &[u8], nexus: &str) -> R {
        use riser_scsi::pr::*;
        let p = PrOutParams::parse(out).map_err(|e| e.sense(false))?;
        if out.len() != 24 && !p.spec_i_pt {
            return Err(illegal(AscAscq::PARAMETER_LIST_LENGTH_ERROR));
        }
        if p.spec_i_pt || p.aptpl {
            return Err(Sense::invalid_field_in_parameter_list(20, None));
        }
        let mut s = self.st();
        let mine = s.pr.registrations.iter().position(|(n, _)| n == nexus);
        let my_key = mine.map(|i| s.pr.registrations[i].1);
        let valid_type = |t: u8| matches!(t, 1 | 3 | 5 | 6 | 7 | 8);
        match sa {
            out_sa::REGISTER | out_sa::REGISTER_AND_IGNORE_EXISTING_KEY => {
                if sa == out_sa::REGISTER && my_key.unwrap_or(0) != p.key {
                    return Ok(Outcome::conflict());
                }
                if p.sa_key == 0 {
                    if let Some(i) = mine {
                        s.pr.registrations.remove(i);
                        if let Some((n, _, t)) = s.pr.holder.clone()
                            && n == nexus
                        {
                            // An all-registrants reservation survives while anyone is registered.
                            s.pr.holder = match (all_registrants(t), s.pr.registrations.first()) {
                                (true, Some((other, k))) => Some((other.clone(), *k, t)),
                                _ => None,
                            };
                        }
                    }
                } else if let Some(i) = mine {
                    s.pr.registrations[i].1 = p.sa_key;
                    if let Some(h) = s.pr.holder.as_mut().filter(|(n, _, _)| n == nexus) {
                        h.1 = p.sa_key;
                    }
                } else {
                    s.pr.registrations.push((nexus.into(), p.sa_key));
                }
                s.pr.generation = s.pr.generation.wrapping_add(1);
            }
            out_sa::RESERVE => {
                if my_key != Some(p.key) {
                    return Ok(Outcome::conflict());
                }
                if scope != 0 || !valid_type(ty) {
                    return Err(bad_field(2, None));
                }
                match &s.pr.holder {
                    Some((n, _, t)) if n != nexus || *t != ty => return Ok(Outcome::conflict()),
                    Some(_) => {}
                    None => s.pr.holder = Some((nexus.into(), p.key, ty)),
                }
            }
            out_sa::RELEASE => {
                if my_key != Some(p.key) {
                    return Ok(Outcome::conflict());
                }
                if let Some((n, _, t)) = &s.pr.holder
                    && n == nexus
                {
                    if *t != ty {
                        return Err(illegal(AscAscq::new(0x26, 0x04)));
                    }
                    s.pr.holder = None;
                }
            }
            out_sa::CLEAR => {
                if my_key != Some(p.key) {
                    return Ok(Outcome::conflict());
                }
                s.pr.registrations.clear();
                s.pr.holder = None;
                s.pr.generation = s.pr.generation.wrapping_add(1);
            }
            out_sa::PREEMPT | out_sa::PREEMPT_AND_ABORT => {
                if my_key != Some(p.key) {
                    return Ok(Outcome::conflict());
                }
                let victim_holds = s.pr.holder.as_ref().is_some_and(|(_, k, _)| *k == p.sa_key);
                s.pr.registrations.retain(|(n, k)| *k != p.sa_key || n == nexus);
                if victim_holds {
                    if !valid_type(ty) {
                        return Err(bad_field(2, None));
                    }
                    s.pr.holder = Some((nexus.into(), p.key, ty));
                }
                s.pr.generation = s.pr.generation.wrapping_add(1);
            }
            _ => return Err(bad_field(1, Some(4))),
        }
        Ok(Outcome::good(Bytes::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RamBackend;
    use std::sync::atomic::AtomicBool;

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

    const N: &str = "iqn.test,i,0x1";

    fn lu(size: u64, rate: Option<u64>) -> (Arc<Flaky>, LogicalUnit) {
        let b = Arc::new(Flaky {
            ram: RamBackend::new(size, 512),
            fail: AtomicBool::new(false),
            fail_flush: AtomicBool::new(false),
            flushes: AtomicU64::new(0),
            stall: Stall::default(),
        });
        (b.clone(), LogicalUnit::new(b, Lun::ZERO, 1).with_sanitize_rate(rate))
    }

    fn run(lu: &LogicalUnit, cdb: &[u8], out: &[u8]) -> Outcome {
        match lu.plan(cdb, N) {
            Ok(p) => lu.execute(&p, out, N),
            Err(o) => o,
        }
    }

    fn sense_of(o: &Outcome) -> Sense {
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
        assert!(lu.may_block(&lu.plan(&sanitize_cdb(false, 5), N).unwrap()));
        assert!(!lu.may_block(&lu.plan(&sanitize_cdb(true, 5), N).unwrap()));
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
    fn cdb16(opcode: u8, flags: u8, lba: u64, len: u32) -> [u8; 16] {
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
        lu.nexus_seen(N);
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
        assert!(lu.may_block(&lu.plan(&cdb16(op::COMPARE_AND_WRITE, 0, 8, 1), N).unwrap()));
        assert!(lu.may_block(&lu.plan(&cdb16(op::ORWRITE_16, 0, 8, 1), N).unwrap()));
        assert!(!lu.may_block(&lu.plan(&READ10, N).unwrap()));
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
}
