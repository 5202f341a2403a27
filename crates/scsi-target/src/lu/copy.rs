//! Copy offload (SPC-4 §6.4, LID1): EXTENDED COPY moves blocks within a unit or between units
//! of one target process without the data crossing the wire (VMware's XCOPY / "full copy"
//! VAAI primitive), and RECEIVE COPY RESULTS reports on it (COPY STATUS, OPERATING
//! PARAMETERS). The unit that receives the command is the copy manager.
//!
//! Copies are synchronous: EXTENDED COPY returns when the last segment is written, so COPY
//! STATUS only ever reports a finished copy (or, for a list identifier whose copy still runs
//! under another command, one in progress).
//!
//! The other units a copy may reach are found in a [`UnitDirectory`] the [`Target`] keeps in
//! step with what it exports: a copy reaches exactly the units its I_T nexus could reach with
//! READ and WRITE (the units of its target node, or those of its initiator's LUN map there).
//! A unit outside any target copies only within itself.
//!
//! Errors follow SPC-4: a malformed or oversized parameter list is ILLEGAL REQUEST (with the
//! copy ASCs and a field pointer); a segment that cannot be carried out ends the copy with
//! COPY ABORTED, the segment's offset in the parameter list as the sense-key specific segment
//! pointer and the segment's number in COMMAND-SPECIFIC INFORMATION.
//!
//! A copy runs on the blocking pool, apart from the task that sent it. A reset of a unit it
//! uses — the copy manager, a source or a destination; LOGICAL UNIT RESET, a target reset,
//! another gateway's reset of the store — made after the session accepted the command stops it
//! before its next write (or flush) with COPY ABORTED, THIRD PARTY DEVICE FAILURE, and a reset
//! of a unit is answered only once the copies' writes to it under way are over
//! ([`ResetFence`]; a reset of the copy manager waits through the copy's own task, which it
//! ends): nothing a copy accepted before a unit's reset writes there lands after the reset was
//! answered. A copy whose task is given up (aborted) stops before its next write too
//! ([`Accepted::given_up`]).
//!
//! [`Target`]: crate::server::Target

use super::sanitize::SanitizeState;
use super::{LogicalUnit, Nexus, Outcome, R, bad_field, illegal, truncate};
use riser_scsi::cdb::{Cdb, CdbSize, Rw, op};
use riser_scsi::copy::{
    CopyStatus, ExtendedCopy, Limits, OperatingParameters, Segment, SegmentLength, descriptor, list_id_usage, rcr, status,
    third_party_copy_vpd,
};
use riser_scsi::inquiry::{Designator, association, designator_type};
use riser_scsi::sense::{AscAscq, Sense, SenseKey};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// Most CSCD (copy source and copy destination) descriptors in one EXTENDED COPY: one per
/// unit taking part, VMware sends two.
pub const MAX_CSCDS: u16 = 8;
/// Most segment descriptors in one EXTENDED COPY.
pub const MAX_SEGMENTS: u16 = 64;
/// Most bytes of CSCD and segment descriptors in one EXTENDED COPY: room for
/// [`MAX_CSCDS`] CSCDs and [`MAX_SEGMENTS`] segments and then some (a list longer than this
/// is a PARAMETER LIST LENGTH ERROR).
pub const MAX_DESCRIPTOR_LIST_LEN: u32 = 4096;
/// Most bytes one segment descriptor may move (32 MiB: a full 0x02 segment of 512-byte
/// blocks). One EXTENDED COPY thus moves at most [`MAX_SEGMENTS`] × 32 MiB = 2 GiB.
pub const MAX_SEGMENT_BYTES: u32 = 32 << 20;
/// Most EXTENDED COPY commands a unit (as copy manager) runs at once; more get ILLEGAL
/// REQUEST / INSUFFICIENT RESOURCES. With [`COPY_CHUNK`] this bounds a unit's copy buffers to 8 MiB.
pub const MAX_CONCURRENT_COPIES: u16 = 8;
/// Most copy results a unit holds for RECEIVE COPY RESULTS (over all I_T nexuses); the oldest
/// goes first. A nexus's results go when the nexus does.
pub const MAX_HELD_RESULTS: usize = 64;
/// Bytes moved per read and write while copying.
pub const COPY_CHUNK: usize = 1 << 20;

const LIMITS: Limits = Limits {
    max_cscds: MAX_CSCDS,
    max_segments: MAX_SEGMENTS,
    max_list_len: MAX_DESCRIPTOR_LIST_LEN,
    max_segment_bytes: MAX_SEGMENT_BYTES,
};

/// The units copies may reach, by target node and initiator, as a [`Target`] exports them.
/// Units hold a weak reference to the directory they are in, the directory weak references to
/// its units; a copy holds the units it uses alive while it runs.
///
/// [`Target`]: crate::server::Target
#[derive(Debug, Default)]
pub struct UnitDirectory {
    targets: Mutex<HashMap<String, Reach>>,
}

/// What the nexuses of one target node reach.
#[derive(Debug, Default)]
struct Reach {
    /// Every unit of the node (an initiator without a LUN map of its own sees these).
    all: Vec<Weak<LogicalUnit>>,
    /// The units of each initiator (lower case) with a LUN map.
    mapped: HashMap<String, Vec<Weak<LogicalUnit>>>,
}

impl UnitDirectory {
    /// An empty directory.
    pub fn new() -> Arc<Self> {
        Arc::default()
    }

    /// Replace the directory's contents with one entry per target node: its name, its units
    /// (what its nexuses reach), and the units of each initiator with a LUN map of its own
    /// (by initiator name; such an initiator reaches only those). Each unit learns it is in
    /// this directory.
    pub fn replace<'a>(
        self: &Arc<Self>,
        nodes: impl IntoIterator<Item = (&'a str, Vec<&'a Arc<LogicalUnit>>, Vec<(&'a str, Vec<&'a Arc<LogicalUnit>>)>)>,
    ) {
        let weak = |units: Vec<&Arc<LogicalUnit>>| -> Vec<Weak<LogicalUnit>> {
            units
                .into_iter()
                .map(|lu| {
                    *lu.copy.directory.lock().unwrap_or_else(|e| e.into_inner()) = Arc::downgrade(self);
                    Arc::downgrade(lu)
                })
                .collect()
        };
        let mut targets: HashMap<String, Reach> = HashMap::new();
        for (name, all, maps) in nodes {
            let reach = targets.entry(name.to_ascii_lowercase()).or_default();
            reach.all.extend(weak(all));
            for (initiator, units) in maps {
                reach.mapped.entry(initiator.to_ascii_lowercase()).or_default().extend(weak(units));
            }
        }
        *self.targets.lock().unwrap_or_else(|e| e.into_inner()) = targets;
    }

    /// The unit with NAA value `naa` that `nexus` reaches, counted as in use by a copy until
    /// the returned handle drops (under the directory's lock: once a unit is out of the
    /// directory, no copy starts using it, see [`LogicalUnit::copies_done`]).
    fn lookup(&self, nexus: &Nexus, naa: u64) -> Option<PeerUse> {
        let targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        let target = nexus.target_port().split(",t,").next().unwrap_or_default().to_ascii_lowercase();
        let reach = targets.get(&target)?;
        let units = reach.mapped.get(&nexus.initiator_name().to_ascii_lowercase()).unwrap_or(&reach.all);
        let lu = units.iter().filter_map(Weak::upgrade).find(|u| u.identity.naa() == naa)?;
        lu.copy.peer_uses.fetch_add(1, Ordering::SeqCst);
        Some(PeerUse { lu })
    }
}

/// Another unit a copy reads or writes, held alive and counted in its `peer_uses`.
#[derive(Debug)]
struct PeerUse {
    lu: Arc<LogicalUnit>,
}

impl Drop for PeerUse {
    fn drop(&mut self) {
        if self.lu.copy.peer_uses.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.lu.copy.peer_idle.notify_waiters();
        }
    }
}

/// A copy source or destination.
enum Cscd<'a> {
    /// The copy manager itself.
    This(&'a LogicalUnit),
    /// Another unit.
    Peer(PeerUse),
    /// A designator the nexus reaches no unit by.
    Unreachable,
}

impl Cscd<'_> {
    fn lu(&self) -> Option<&LogicalUnit> {
        match self {
            Self::This(lu) => Some(lu),
            Self::Peer(p) => Some(&p.lu),
            Self::Unreachable => None,
        }
    }
}

/// A unit's copy manager state.
#[derive(Debug, Default)]
pub(super) struct CopyManager {
    state: Mutex<Copies>,
    /// The directory of the target the unit is exported by (none: the unit copies only within
    /// itself).
    directory: Mutex<Weak<UnitDirectory>>,
    /// Copies run by other units that read or write this one now.
    pub(super) peer_uses: AtomicUsize,
    peer_idle: tokio::sync::Notify,
    /// Copies' writes to this unit, fenced by its resets.
    pub(super) fence: Arc<ResetFence>,
}

/// Resets of every unit of the process so far, in order: a copy is told by this count when its
/// command was accepted ([`resets_so_far`]) which resets came after it.
static RESETS: AtomicU64 = AtomicU64::new(0);

/// The count of unit resets so far (see [`ResetFence`]): what a copy accepted now is measured by.
pub(crate) fn resets_so_far() -> u64 {
    RESETS.load(Ordering::SeqCst)
}

/// What a copy knows of its command beyond its parameter list.
#[derive(Clone, Copy)]
pub(crate) struct Accepted<'a> {
    /// The process's unit resets when its session took the command ([`resets_so_far`]): a
    /// reset of a unit the copy uses after that stops it.
    pub(crate) since: u64,
    /// Whether its task has been given up (aborted by task management or the session's end):
    /// the copy then stops before its next write too, rather than run on unanswered.
    pub(crate) given_up: &'a (dyn Fn() -> bool + Sync),
}

impl Accepted<'_> {
    /// A command taken now, never given up (a caller of `LogicalUnit::execute_into`).
    pub(crate) fn now() -> Accepted<'static> {
        Accepted { since: resets_so_far(), given_up: &|| false }
    }
}

/// What keeps a copy from writing to a unit once the unit has been reset. A copy runs on the
/// blocking pool, apart from the task that sent it — often a task of another unit (the copy
/// manager), which a reset of this one does not end — so without it a copy would go on writing
/// to a unit whose reset had been answered. A copy carries the count of resets when its command
/// was accepted ([`resets_so_far`]); before each write it checks that no unit it uses was
/// reset since (else it stops with COPY ABORTED), and a reset waits for the copies' writes to
/// the unit that were under way when it came ([`Self::written`]).
#[derive(Debug, Default)]
pub(super) struct ResetFence {
    state: Mutex<FenceState>,
    idle: tokio::sync::Notify,
}

#[derive(Debug, Default)]
struct FenceState {
    /// The process's reset count at this unit's last reset.
    last_reset: u64,
    /// This unit's resets so far.
    epoch: u64,
    /// Writes under way, by the unit's epoch they started in (oldest first).
    writing: VecDeque<(u64, usize)>,
}

impl ResetFence {
    fn lock(&self) -> std::sync::MutexGuard<'_, FenceState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether the unit was reset after a copy accepted at `since` (a [`resets_so_far`]).
    pub(super) fn reset_since(&self, since: u64) -> bool {
        self.lock().last_reset > since
    }

    /// The unit is reset: no copy accepted before writes to it from now on. Returns the mark
    /// to wait with ([`Self::written`]).
    pub(super) fn reset(&self) -> u64 {
        let seq = RESETS.fetch_add(1, Ordering::SeqCst) + 1;
        let mut s = self.lock();
        s.last_reset = s.last_reset.max(seq);
        s.epoch += 1;
        s.epoch
    }

    /// A write of a copy accepted at `since` is about to start: `None` if the unit has been
    /// reset since. Under way until the guard drops.
    pub(super) fn enter(self: &Arc<Self>, since: u64) -> Option<FencedWrite> {
        let mut s = self.lock();
        if s.last_reset > since {
            return None;
        }
        let epoch = s.epoch;
        match s.writing.back_mut() {
            Some((e, n)) if *e == epoch => *n += 1,
            _ => s.writing.push_back((epoch, 1)),
        }
        Some(FencedWrite { fence: self.clone(), epoch })
    }

    /// Resolves once no write that started before the reset that returned `mark` is under
    /// way (later ones are not waited for: a reset is never held up by copies accepted after
    /// it).
    pub(super) async fn written(&self, mark: u64) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.lock().writing.front().is_none_or(|(e, _)| *e >= mark) {
                return;
            }
            idle.await;
        }
    }
}

/// A copy's write under way ([`ResetFence::enter`]).
pub(super) struct FencedWrite {
    fence: Arc<ResetFence>,
    epoch: u64,
}

impl Drop for FencedWrite {
    fn drop(&mut self) {
        let mut s = self.fence.lock();
        if let Some(i) = s.writing.iter().position(|(e, _)| *e == self.epoch) {
            s.writing[i].1 -= 1;
            if s.writing[i].1 == 0 {
                s.writing.remove(i);
                drop(s);
                self.fence.idle.notify_waiters();
            }
        }
    }
}

#[derive(Debug, Default)]
struct Copies {
    /// (nexus key, list identifier; none for LIST ID USAGE 11b) of the copies running.
    running: Vec<(String, Option<u8>)>,
    /// Results held for RECEIVE COPY RESULTS, oldest first.
    held: VecDeque<((String, u8), CopyStatus)>,
}

impl CopyManager {
    fn lock(&self) -> std::sync::MutexGuard<'_, Copies> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Forget what a nexus that is gone had here.
    pub(super) fn forget(&self, nexus: &Nexus) {
        self.lock().held.retain(|((k, _), _)| k != nexus.key());
    }
}

/// A running copy, listed in [`Copies::running`] until dropped.
struct Running<'a> {
    manager: &'a CopyManager,
    key: (String, Option<u8>),
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        let mut c = self.manager.lock();
        if let Some(i) = c.running.iter().position(|k| *k == self.key) {
            c.running.swap_remove(i);
        }
    }
}

/// The NAA value of the unit a designator names: its NAA designator, or its T10 vendor ID
/// designator (which carries the unit's UUID).
fn naa_of(d: &Designator) -> Option<u64> {
    if d.association != association::LOGICAL_UNIT {
        return None;
    }
    match d.kind {
        designator_type::NAA if d.value.len() == 8 && d.value[0] >> 4 == 3 => {
            let mut v = [0u8; 8];
            v.copy_from_slice(&d.value);
            Some(u64::from_be_bytes(v) & 0x0fff_ffff_ffff_ffff)
        }
        designator_type::T10_VENDOR_ID if d.value.starts_with(b"RISER   ") => {
            let uuid = std::str::from_utf8(&d.value[8..]).ok()?.parse::<uuid::Uuid>().ok()?;
            Some(super::LuIdentity::new(uuid).naa())
        }
        _ => None,
    }
}

/// COPY ABORTED for segment number `n` (at byte `at` of the parameter list).
fn aborted(asc: AscAscq, n: usize, at: usize) -> Sense {
    let mut s = Sense::new(SenseKey::COPY_ABORTED, asc);
    let [hi, lo] = u16::try_from(at).unwrap_or(u16::MAX).to_be_bytes();
    // Segment pointer: SD set, the field pointer at the segment descriptor.
    s.key_specific = Some([0x20, hi, lo]);
    s.command_specific = Some(n as u64);
    s
}

/// Why a segment stopped.
enum Stop {
    Sense(Sense),
    Conflict,
}

impl From<Sense> for Stop {
    fn from(s: Sense) -> Self {
        Self::Sense(s)
    }
}

impl LogicalUnit {
    /// Wait until no copy run by another unit reads or writes this one. A unit taken out of
    /// its target's [`UnitDirectory`] gets no new such copies, so once this returns nothing
    /// reaches the unit through copies any more.
    pub async fn copies_done(&self) {
        loop {
            let idle = self.copy.peer_idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.copy.peer_uses.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }

    fn operating_parameters(&self) -> OperatingParameters {
        OperatingParameters {
            snlid: true,
            limits: LIMITS,
            concurrent_copies: MAX_CONCURRENT_COPIES,
            data_segment_granularity: self.bs().trailing_zeros() as u8,
            descriptor_types: vec![descriptor::BLOCK_TO_BLOCK, descriptor::BLOCK_TO_BLOCK_OFFSET, descriptor::IDENTIFICATION],
        }
    }

    /// The Third-party Copy VPD page body.
    pub(super) fn third_party_copy_vpd(&self) -> Vec<u8> {
        third_party_copy_vpd(
            &self.operating_parameters(),
            &[
                (op::EXTENDED_COPY, &[riser_scsi::copy::EXTENDED_COPY_LID1]),
                (op::RECEIVE_COPY_RESULTS, &[rcr::COPY_STATUS, rcr::OPERATING_PARAMETERS]),
            ],
        )
    }

    /// RECEIVE COPY RESULTS.
    pub(super) fn receive_copy_results(&self, sa: u8, list_id: u8, alloc: u32, nexus: &Nexus) -> R {
        let data = match sa {
            rcr::COPY_STATUS => {
                let c = self.copy.lock();
                let key = (nexus.key().to_owned(), list_id);
                match c.held.iter().rev().find(|(k, _)| *k == key) {
                    Some((_, s)) => s.to_bytes().to_vec(),
                    None if c.running.contains(&(key.0, Some(list_id))) => {
                        CopyStatus { status: status::IN_PROGRESS, ..Default::default() }.to_bytes().to_vec()
                    }
                    // No copy of that list identifier known to this nexus.
                    None => return Err(bad_field(2, None)),
                }
            }
            rcr::OPERATING_PARAMETERS => self.operating_parameters().to_bytes(),
            _ => return Err(bad_field(1, Some(4))),
        };
        Ok(Outcome::good(truncate(data, alloc)))
    }

    /// EXTENDED COPY (see [`Accepted`] for `accepted`).
    pub(super) fn extended_copy(&self, sa: u8, out: &[u8], nexus: &Nexus, accepted: Accepted<'_>) -> R {
        if sa != riser_scsi::copy::EXTENDED_COPY_LID1 {
            return Err(bad_field(1, Some(4)));
        }
        if out.is_empty() {
            // A parameter list length of zero: nothing to do, and not an error.
            return Ok(Outcome::good(Vec::new()));
        }
        let list = ExtendedCopy::parse(out, &LIMITS).map_err(|e| e.sense())?;
        let hold = list.list_id_usage == list_id_usage::HOLD;
        let _running = self.start_copy(nexus, &list)?;
        // Resolve the CSCDs up front (an unreachable one is an error once a segment uses it).
        let directory = self.copy.directory.lock().unwrap_or_else(|e| e.into_inner()).upgrade();
        let mut units = Vec::with_capacity(list.cscds.len());
        for (i, c) in list.cscds.iter().enumerate() {
            let at = riser_scsi::copy::HEADER_LEN + i * riser_scsi::copy::CSCD_LEN;
            if c.peripheral_type != 0 {
                return Err(Sense::invalid_field_in_parameter_list((at + 1) as u16, Some(4)));
            }
            let unit = match naa_of(&c.designator) {
                Some(naa) if naa == self.identity.naa() => Cscd::This(self),
                Some(naa) => directory.as_ref().and_then(|d| d.lookup(nexus, naa)).map_or(Cscd::Unreachable, Cscd::Peer),
                None => Cscd::Unreachable,
            };
            if let Some(lu) = unit.lu()
                && c.block_len != lu.bs()
            {
                return Err(Sense::invalid_field_in_parameter_list((at + 29) as u16, None));
            }
            units.push(unit);
        }
        let (mut done, mut bytes) = (0usize, 0u64);
        let mut stop = None;
        for (n, seg) in list.segments.iter().enumerate() {
            match self.copy_segment(seg, n, &units, accepted, nexus) {
                Ok(b) => {
                    done += 1;
                    bytes += b;
                }
                Err(e) => {
                    stop = Some(e);
                    break;
                }
            }
        }
        // A copy that got under way is held (a list refused as ILLEGAL REQUEST never was one).
        if hold && !matches!(&stop, Some(Stop::Sense(s)) if s.key == SenseKey::ILLEGAL_REQUEST) {
            let result = CopyStatus {
                status: if stop.is_none() { status::COMPLETED } else { status::FAILED },
                segments_processed: u16::try_from(done).unwrap_or(u16::MAX),
                ..Default::default()
            }
            .with_bytes(bytes);
            let mut c = self.copy.lock();
            let key = (nexus.key().to_owned(), list.list_id);
            c.held.retain(|(k, _)| *k != key);
            if c.held.len() >= MAX_HELD_RESULTS {
                c.held.pop_front();
            }
            c.held.push_back((key, result));
        }
        match stop {
            None => Ok(Outcome::good(Vec::new())),
            Some(Stop::Conflict) => Ok(Outcome::conflict()),
            Some(Stop::Sense(s)) => Err(s),
        }
    }

    /// List a copy as running, unless too many run or its list identifier is in use.
    fn start_copy(&self, nexus: &Nexus, list: &ExtendedCopy) -> Result<Running<'_>, Sense> {
        let mut c = self.copy.lock();
        if c.running.len() >= usize::from(MAX_CONCURRENT_COPIES) {
            return Err(illegal(AscAscq::INSUFFICIENT_RESOURCES));
        }
        let id = (list.list_id_usage != list_id_usage::NONE).then_some(list.list_id);
        let key = (nexus.key().to_owned(), id);
        if id.is_some() && c.running.contains(&key) {
            return Err(illegal(AscAscq::OPERATION_IN_PROGRESS));
        }
        c.running.push(key.clone());
        Ok(Running { manager: &self.copy, key })
    }

    /// Carry out segment number `n` of a copy (see [`Accepted`] and [`ResetFence`]): the
    /// bytes it moved.
    fn copy_segment(&self, seg: &Segment, n: usize, units: &[Cscd<'_>], accepted: Accepted<'_>, nexus: &Nexus) -> Result<u64, Stop> {
        let abort = |asc| aborted(asc, n, seg.at);
        let unit = |i: u16| units.get(usize::from(i)).and_then(Cscd::lu).ok_or_else(|| abort(AscAscq::COPY_TARGET_DEVICE_NOT_REACHABLE));
        let (src, dst) = (unit(seg.src)?, unit(seg.dst)?);
        let (sbs, dbs) = (u64::from(src.bs()), u64::from(dst.bs()));
        let len = match seg.length {
            SegmentLength::Blocks(b) => u64::from(b) * if seg.dc { dbs } else { sbs },
            SegmentLength::Bytes { count, src_offset, dst_offset } => {
                if src_offset != 0 || dst_offset != 0 {
                    // Copies within blocks are not implemented: whole blocks only.
                    let at = seg.at + if src_offset != 0 { 28 } else { 30 };
                    return Err(Sense::invalid_field_in_parameter_list(at as u16, None).into());
                }
                u64::from(count)
            }
        };
        let len_field = (seg.at + if matches!(seg.length, SegmentLength::Blocks(_)) { 10 } else { 8 }) as u16;
        if len > u64::from(MAX_SEGMENT_BYTES) || len % sbs != 0 || len % dbs != 0 {
            return Err(Sense::invalid_field_in_parameter_list(len_field, None).into());
        }
        // Both ranges on their medium; an access beyond it is a copy target the copy manager
        // cannot reach (COPY TARGET DEVICE NOT REACHABLE, as Linux's copy manager reports, and
        // as initiators expect).
        let in_range = |lu: &Self, lba: u64, bs: u64| lba.checked_add(len / bs).is_some_and(|end| end <= lu.blocks());
        if !in_range(src, seg.src_lba, sbs) || !in_range(dst, seg.dst_lba, dbs) {
            return Err(abort(AscAscq::COPY_TARGET_DEVICE_NOT_REACHABLE).into());
        }
        // The issuing nexus reads the source and writes the destination: their reservations
        // (and a sanitize fencing the medium of either) apply as to READ and WRITE.
        let rw = |lba, bs| Rw { size: CdbSize::Sixteen, lba, blocks: u32::try_from(len / bs).unwrap_or(u32::MAX), ..Rw::default() };
        if src.reservation_conflict(&Cdb::Read(rw(seg.src_lba, sbs)), nexus).is_some()
            || dst.reservation_conflict(&Cdb::Write(rw(seg.dst_lba, dbs)), nexus).is_some()
        {
            return Err(Stop::Conflict);
        }
        for lu in [src, dst] {
            if !matches!(lu.st().sanitize_state(), SanitizeState::Idle) {
                return Err(abort(AscAscq::COPY_TARGET_DEVICE_NOT_REACHABLE).into());
            }
        }
        dst.write_protected()?;
        if len == 0 {
            return Ok(0);
        }
        let (from, to) = (seg.src_lba * sbs, seg.dst_lba * dbs);
        // Within one unit, a destination just above an overlapping source is copied from the
        // end down, so every block is read before it is overwritten.
        let backwards = std::ptr::eq(src, dst) && to > from && to < from + len;
        // A reset of the copy manager, the source or the destination since the copy was
        // accepted ends it before its next write (or flush): the destination's reset may have
        // been answered already, and waits only for a write under way. So does its task's end.
        let since = accepted.since;
        let fenced = || {
            let reset = || abort(AscAscq::THIRD_PARTY_DEVICE_FAILURE);
            if (accepted.given_up)() || self.copy.fence.reset_since(since) || src.copy.fence.reset_since(since) {
                return Err(reset());
            }
            dst.copy.fence.enter(since).ok_or_else(reset)
        };
        let mut buf = vec![0u8; COPY_CHUNK.min(len as usize)];
        let mut moved = 0u64;
        while moved < len {
            let n = (len - moved).min(COPY_CHUNK as u64);
            let at = if backwards { len - moved - n } else { moved };
            let b = &mut buf[..n as usize];
            src.backend.read(from + at, b).map_err(|_| abort(AscAscq::THIRD_PARTY_DEVICE_FAILURE))?;
            let _writing = fenced()?;
            dst.backend.write(to + at, b).map_err(|_| abort(AscAscq::THIRD_PARTY_DEVICE_FAILURE))?;
            moved += n;
        }
        let _flushing = fenced()?;
        dst.settle(false).map_err(|_| abort(AscAscq::THIRD_PARTY_DEVICE_FAILURE))?;
        Ok(len)
    }
}
