//! Data-transfer limits of one connection and the split of a write's data (RFC 7143 §13.10,
//! §13.11, §13.12, §13.13, §13.14; RFC 7145 §6.1–6.2 for the iSER directions).

use crate::keys::{NegotiatedParams, Role};
use crate::wire::{DataIn, DataOut, R2t};
use alloc::vec::Vec;
use core::ops::Range;
use riser_scsi::lun::Lun;

/// The negotiated values that govern data transfer on one connection, seen from one side.
/// `Copy` and small: a datamover keeps one and reads it per command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferLimits {
    /// Largest data segment this side may send in one PDU (the peer's receive limit).
    pub max_send_segment: u32,
    /// Largest data segment this side accepts in one PDU (its own receive limit).
    pub max_recv_segment: u32,
    /// MaxBurstLength: the most data one R2T (or one Data-In sequence) moves.
    pub max_burst: u32,
    /// FirstBurstLength: the most unsolicited data (immediate and Data-Out) per command.
    pub first_burst: u32,
    /// ImmediateData: whether the command PDU may carry write data.
    pub immediate_data: bool,
    /// InitialR2T: whether every Data-Out beyond the immediate data must be solicited.
    pub initial_r2t: bool,
}

impl Default for TransferLimits {
    /// RFC 7143's defaults, which hold until login negotiates others.
    fn default() -> Self {
        Self::of(&NegotiatedParams::default(), Role::Target)
    }
}

/// How a write's data travels: `[0, immediate)` in the SCSI Command PDU, `[immediate,
/// unsolicited_end)` in unsolicited Data-Out (Target Transfer Tag 0xffffffff), and
/// `[unsolicited_end, len)` solicited (R2Ts over TCP, RDMA Reads over iSER).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteSplit {
    /// Bytes in the command PDU.
    pub immediate: u32,
    /// End of the unsolicited data (at least `immediate`).
    pub unsolicited_end: u32,
    /// The whole transfer (Expected Data Transfer Length).
    pub len: u32,
}

impl WriteSplit {
    /// Bytes of unsolicited Data-Out (after the immediate data).
    pub const fn unsolicited_data_out(&self) -> u32 {
        self.unsolicited_end - self.immediate
    }

    /// Bytes the target must solicit.
    pub const fn solicited(&self) -> u32 {
        self.len.saturating_sub(self.unsolicited_end)
    }

    /// Whether the SCSI Command PDU ends the unsolicited data (its F bit): no unsolicited
    /// Data-Out follows it.
    pub const fn command_is_final(&self) -> bool {
        self.unsolicited_end == self.immediate
    }
}

impl TransferLimits {
    /// The limits `role` works under after negotiating `p`.
    pub fn of(p: &NegotiatedParams, role: Role) -> Self {
        Self {
            max_send_segment: p.max_send_data_segment_length(role),
            max_recv_segment: p.max_recv_data_segment_length(role),
            max_burst: p.max_burst_length,
            first_burst: p.first_burst_length,
            immediate_data: p.immediate_data,
            initial_r2t: p.initial_r2t,
        }
    }

    /// The largest segment to send, never below 512 bytes (the smallest legal
    /// MaxRecvDataSegmentLength), so a segmenting loop always makes progress.
    pub fn send_segment(&self) -> usize {
        self.max_send_segment.max(512) as usize
    }

    /// The burst to solicit or send per sequence, never below 512 bytes.
    pub fn burst(&self) -> usize {
        self.max_burst.max(512) as usize
    }

    /// Initiator: how to send a write of `len` bytes. Immediate data takes what ImmediateData,
    /// FirstBurstLength and the target's receive limit allow; without InitialR2T unsolicited
    /// Data-Out continues up to FirstBurstLength (when `unsolicited_data_out` permits it: an
    /// iSER initiator may choose to send none, RFC 7145 §6.1).
    pub fn outgoing_write(&self, len: u32, unsolicited_data_out: bool) -> WriteSplit {
        let first_burst = self.first_burst.min(len);
        let immediate = if self.immediate_data { first_burst.min(self.max_send_segment) } else { 0 };
        let unsolicited_end = if self.initial_r2t || !unsolicited_data_out { immediate } else { first_burst.max(immediate) };
        WriteSplit { immediate, unsolicited_end, len }
    }

    /// Target: what a received SCSI Command announces about its write of `edtl` bytes, given
    /// the `immediate` bytes it carried and its F bit. Unsolicited Data-Out is due only when
    /// the command is not final and InitialR2T is No, and then up to FirstBurstLength.
    pub fn incoming_write(&self, edtl: u32, immediate: u32, final_: bool) -> WriteSplit {
        let unsolicited_end = if final_ || self.initial_r2t { immediate } else { self.first_burst.min(edtl).max(immediate) };
        WriteSplit { immediate, unsolicited_end, len: edtl }
    }
}

impl NegotiatedParams {
    /// The largest data segment `role` accepts in one PDU (its own receive limit).
    pub fn max_recv_data_segment_length(&self, role: Role) -> u32 {
        match role {
            Role::Initiator => self.initiator_recv_data_segment_length,
            Role::Target => self.target_recv_data_segment_length,
        }
    }

    /// [`TransferLimits`] for `role`.
    pub fn transfer_limits(&self, role: Role) -> TransferLimits {
        TransferLimits::of(self, role)
    }
}

/// Contents of one R2T (Get_Data), as an [`R2tPlan`] generates them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2tDesc {
    /// Task.
    pub itt: u32,
    /// LUN.
    pub lun: Lun,
    /// Target Transfer Tag.
    pub ttt: u32,
    /// R2TSN.
    pub r2t_sn: u32,
    /// Buffer offset.
    pub offset: u32,
    /// Desired data transfer length (≤ MaxBurstLength).
    pub len: u32,
    /// StatSN (not advanced), ExpCmdSN, MaxCmdSN to stamp.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// What Get_Data collects of a write: a buffer of `end` bytes whose first `start` bytes come
/// unsolicited (immediate data and unsolicited Data-Out), and whose rest `[start, end)` is
/// solicited in pieces of at most `max_burst` bytes — R2Ts numbered from 0 with the Target
/// Transfer Tags `first_ttt`, `first_ttt + 1`, … over TCP, RDMA Reads over iSER. The pieces are
/// made as they are needed, so a tiny MaxBurstLength costs no memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2tPlan {
    /// Task.
    pub itt: u32,
    /// LUN.
    pub lun: Lun,
    /// Bytes that arrive unsolicited (the solicited range starts here).
    pub start: u32,
    /// The whole buffer's length.
    pub end: u32,
    /// MaxBurstLength (at least 512).
    pub max_burst: u32,
    /// Target Transfer Tag of the first R2T; the following ones count up (below 0x8000_0000).
    pub first_ttt: u32,
    /// StatSN (not advanced) to stamp the R2Ts with.
    pub stat_sn: u32,
    /// ExpCmdSN to stamp.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN to stamp.
    pub max_cmd_sn: u32,
}

impl R2tPlan {
    /// How many R2Ts the solicited range takes.
    pub fn count(&self) -> u32 {
        self.end.saturating_sub(self.start).div_ceil(self.max_burst.max(512))
    }

    /// The `n`th R2T (from 0), if there is one.
    pub fn nth(&self, n: u32) -> Option<R2tDesc> {
        let burst = self.max_burst.max(512);
        let offset = self.start.checked_add(n.checked_mul(burst)?)?;
        (offset < self.end).then(|| R2tDesc {
            itt: self.itt,
            lun: self.lun,
            ttt: self.first_ttt.wrapping_add(n) & 0x7fff_ffff,
            r2t_sn: n,
            offset,
            len: (self.end - offset).min(burst),
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
        })
    }
}

/// Why a task's write data broke sequence (RFC 7143 §11.7–11.8); the task ends with CHECK
/// CONDITION, the connection goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SequenceError {
    /// The command announced unsolicited Data-Out (F=0) although InitialR2T=Yes.
    #[error("unsolicited Data-Out announced (F=0) with InitialR2T=Yes")]
    UnsolicitedWithInitialR2t,
    /// Unsolicited Data-Out after the unsolicited sequence ended (F bit seen).
    #[error("unsolicited Data-Out after the unsolicited burst ended")]
    UnsolicitedAfterEnd,
    /// Unsolicited Data-Out at an unexpected buffer offset.
    #[error("unsolicited Data-Out out of order")]
    UnsolicitedOutOfOrder,
    /// The unsolicited sequence ended (F bit) before FirstBurstLength or the transfer's end.
    #[error("unsolicited Data-Out ended before FirstBurstLength")]
    UnsolicitedEndedEarly,
    /// Unsolicited data past FirstBurstLength.
    #[error("unsolicited Data-Out beyond FirstBurstLength")]
    BeyondFirstBurst,
    /// Unsolicited data past what the command announced.
    #[error("unsolicited data beyond the {len} bytes to collect")]
    UnsolicitedBeyondLength {
        /// The bytes to collect.
        len: u32,
    },
    /// The unsolicited sequence ended short of what was due.
    #[error("{got} bytes of unsolicited data where {due} were due")]
    UnsolicitedShort {
        /// Received.
        got: u32,
        /// Due.
        due: u32,
    },
    /// A Data-Out with a DataSN other than the next one.
    #[error("Data-Out with a wrong DataSN")]
    DataSn,
    /// A Data-Out naming a Target Transfer Tag no R2T of the task has.
    #[error("Data-Out for an unknown Target Transfer Tag")]
    UnknownTtt,
    /// A Data-Out outside the range its R2T asked for.
    #[error("Data-Out outside its R2T")]
    OutsideR2t,
    /// An R2T's sequence ended (F bit) before every byte it asked for.
    #[error("Data-Out sequence of an R2T ended before its desired length")]
    R2tEndedEarly,
    /// iSER: the command has solicited write data but its initiator advertised no write STag.
    #[error("solicited write data but no write STag advertised")]
    NoWriteStag,
    /// Get_Data delivered another amount than the command's transfer length.
    #[error("{got} bytes of write data where {due} were due")]
    WrongLength {
        /// Delivered.
        got: u32,
        /// Due.
        due: u32,
    },
}

/// The unsolicited part of a write as the target receives it (RFC 7143 §13.10–13.11): the
/// immediate data, then Data-Out with the reserved Target Transfer Tag, in order (DataPDUInOrder
/// and DataSequenceInOrder are Yes), DataSN counting from 0, up to the end the command announced
/// ([`WriteSplit::unsolicited_end`]: FirstBurstLength or the whole transfer, never less — as LIO),
/// the last with the F bit. The TCP and iSER datamovers both keep one per write: each PDU is
/// [`check`](Self::check)ed before its data is placed, then [`accept`](Self::accept)ed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnsolicitedIn {
    received: u32,
    end: u32,
    next_data_sn: u32,
    done: bool,
}

impl UnsolicitedIn {
    /// The sequence `split` announces, its immediate data in; over when the command was final.
    pub const fn new(split: &WriteSplit) -> Self {
        Self { received: split.immediate, end: split.unsolicited_end, next_data_sn: 0, done: split.command_is_final() }
    }

    /// Bytes received so far (immediate data included): the covered prefix of the buffer.
    pub const fn received(&self) -> u32 {
        self.received
    }

    /// Whether the sequence is over (its F bit seen, or none was announced).
    pub const fn done(&self) -> bool {
        self.done
    }

    /// Whether a Data-Out of `len` bytes at `offset` with `data_sn` continues the sequence.
    pub fn check(&self, offset: u32, data_sn: u32, len: u32) -> Result<(), SequenceError> {
        if self.done {
            Err(SequenceError::UnsolicitedAfterEnd)
        } else if offset != self.received {
            Err(SequenceError::UnsolicitedOutOfOrder)
        } else if offset.checked_add(len).is_none_or(|e| e > self.end) {
            Err(SequenceError::BeyondFirstBurst)
        } else if data_sn != self.next_data_sn {
            Err(SequenceError::DataSn)
        } else {
            Ok(())
        }
    }

    /// Counts a [`check`](Self::check)ed Data-Out of `len` bytes, placed. With the F bit the
    /// sequence ends: `Ok(true)`, or [`SequenceError::UnsolicitedEndedEarly`] short of its end.
    pub fn accept(&mut self, len: u32, final_: bool) -> Result<bool, SequenceError> {
        self.received += len;
        self.next_data_sn = self.next_data_sn.wrapping_add(1);
        if !final_ {
            return Ok(false);
        }
        self.done = true;
        if self.received == self.end { Ok(true) } else { Err(SequenceError::UnsolicitedEndedEarly) }
    }

    /// Get_Data's view: the core collects `due` bytes unsolicited (its plan's start, which is
    /// less than announced when the CDB uses less than the expected length: the sequence then
    /// ends there). `Ok(true)`: all in (the sequence is over: nothing more of it is taken);
    /// `Ok(false)`: more is coming; or why `due` bytes never will be.
    pub fn settle(&mut self, due: u32) -> Result<bool, SequenceError> {
        self.end = self.end.min(due);
        if self.received >= due {
            self.done = true;
        }
        match (self.done, self.received == due) {
            (true, true) => Ok(true),
            (true, false) => Err(SequenceError::UnsolicitedShort { got: self.received, due }),
            (false, _) => Ok(false),
        }
    }
}

/// One R2T's Data-Out sequence as the target receives it (RFC 7143 §11.7–11.8): in order from
/// the R2T's offset, DataSN counting from 0, exactly its length, the last PDU with the F bit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SolicitedIn {
    ttt: u32,
    offset: u32,
    len: u32,
    received: u32,
    next_data_sn: u32,
}

/// What a Data-Out did to its R2T's sequence ([`SolicitedIn::accept`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Burst {
    /// More is due.
    More,
    /// Every byte the R2T asked for is in, the last PDU with the F bit.
    Complete,
    /// Every byte is in but the last PDU lacks the F bit: a protocol error of the connection
    /// (the sequence's end is not where the initiator says).
    CompleteWithoutFinal,
    /// The F bit came before every byte the R2T asked for: the initiator ended the sequence
    /// short, and nothing more of it will come (the task fails,
    /// [`SequenceError::R2tEndedEarly`]).
    EndedEarly,
}

impl SolicitedIn {
    /// The sequence `r2t` asks for, nothing received yet.
    pub const fn new(r2t: &R2tDesc) -> Self {
        Self { ttt: r2t.ttt, offset: r2t.offset, len: r2t.len, received: 0, next_data_sn: 0 }
    }

    /// The R2T's Target Transfer Tag (which Data-Out names).
    pub const fn ttt(&self) -> u32 {
        self.ttt
    }

    /// Whether a Data-Out of `len` bytes at `offset` with `data_sn` continues the sequence.
    pub fn check(&self, offset: u32, data_sn: u32, len: u32) -> Result<(), SequenceError> {
        if offset != self.offset + self.received || self.received + len > self.len {
            Err(SequenceError::OutsideR2t)
        } else if data_sn != self.next_data_sn {
            Err(SequenceError::DataSn)
        } else {
            Ok(())
        }
    }

    /// Counts a [`check`](Self::check)ed Data-Out of `len` bytes, placed.
    pub fn accept(&mut self, len: u32, final_: bool) -> Burst {
        self.received += len;
        self.next_data_sn = self.next_data_sn.wrapping_add(1);
        match (self.received == self.len, final_) {
            (false, false) => Burst::More,
            (false, true) => Burst::EndedEarly,
            (true, true) => Burst::Complete,
            (true, false) => Burst::CompleteWithoutFinal,
        }
    }
}

/// A write's incoming data as the target tracks it, whatever moves the bytes (RFC 7143
/// §11.7–11.8, §13.10–13.11): the unsolicited part ([`UnsolicitedIn`]), the R2Ts outstanding
/// ([`SolicitedIn`], made by [`solicit`](Self::solicit)), and why the write failed if it did. The
/// TCP datamover and the iSER target each keep one per write task and hold only the bytes
/// themselves: a Data-Out is [`place`](Self::place)d before its data is written and
/// [`accept`](Self::accept)ed after; Get_Data starts with [`settle`](Self::settle).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteIn {
    unsolicited: UnsolicitedIn,
    r2ts: Vec<SolicitedIn>,
    failed: Option<SequenceError>,
}

/// Where a Data-Out's data goes ([`WriteIn::place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataOutTo {
    /// Into the task's buffer at `offset`; [`WriteIn::accept`] it once written.
    Place(Placement),
    /// Nowhere (read and dropped): the write failed before.
    Drain,
    /// Nowhere: this PDU broke the write's sequence, which has failed now (tell whoever waits).
    Fail(SequenceError),
}

/// A [`place`](WriteIn::place)d Data-Out: where its bytes go, and the sequence it belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Placement {
    /// Buffer offset.
    pub offset: u32,
    /// Length.
    pub len: u32,
    /// The R2T's Target Transfer Tag; `None` for unsolicited data.
    pub ttt: Option<u32>,
}

/// What a placed Data-Out did to its write ([`WriteIn::accept`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteProgress {
    /// More of its sequence is due.
    More,
    /// The unsolicited sequence is over (its F bit).
    UnsolicitedDone,
    /// The sequence of the R2T with this Target Transfer Tag is complete.
    R2tDone(u32),
    /// The write failed with this PDU (the task ends with CHECK CONDITION).
    Failed(SequenceError),
    /// An R2T's every byte came without the F bit on the last PDU: a protocol error of the
    /// connection, not just of the task.
    BurstWithoutFinal,
}

impl WriteIn {
    /// A write command's data as `split` announces it, its immediate data in; `final_` is the
    /// command's F bit. With InitialR2T `initial_r2t`, a command that announces unsolicited
    /// Data-Out (F=0) fails at once (RFC 7143 §11.2.1.6: where its data would start is unknown).
    pub fn new(split: &WriteSplit, final_: bool, initial_r2t: bool) -> Self {
        let failed = (initial_r2t && !final_).then_some(SequenceError::UnsolicitedWithInitialR2t);
        Self { unsolicited: UnsolicitedIn::new(split), r2ts: Vec::new(), failed }
    }

    /// Why the write failed, if it did.
    pub const fn failed(&self) -> Option<SequenceError> {
        self.failed
    }

    /// The unsolicited part.
    pub const fn unsolicited(&self) -> &UnsolicitedIn {
        &self.unsolicited
    }

    /// Where a Data-Out of `len` bytes goes, checked against its sequence: the unsolicited one
    /// for the reserved Target Transfer Tag, else the outstanding R2T it names.
    pub fn place(&mut self, d: &DataOut, len: u32) -> DataOutTo {
        if self.failed.is_some() {
            return DataOutTo::Drain;
        }
        let checked = if d.ttt == crate::wire::RESERVED_TAG {
            self.unsolicited.check(d.buffer_offset, d.data_sn, len).map(|()| None)
        } else {
            match self.r2ts.iter().find(|r| r.ttt() == d.ttt) {
                Some(r) => r.check(d.buffer_offset, d.data_sn, len).map(|()| Some(d.ttt)),
                None => Err(SequenceError::UnknownTtt),
            }
        };
        match checked {
            Ok(ttt) => DataOutTo::Place(Placement { offset: d.buffer_offset, len, ttt }),
            Err(e) => {
                self.failed = Some(e);
                DataOutTo::Fail(e)
            }
        }
    }

    /// Counts a placed Data-Out whose data is written (`final_`: its F bit).
    pub fn accept(&mut self, p: Placement, final_: bool) -> WriteProgress {
        if let Some(e) = self.failed {
            return WriteProgress::Failed(e);
        }
        let Some(ttt) = p.ttt else {
            return match self.unsolicited.accept(p.len, final_) {
                Ok(false) => WriteProgress::More,
                Ok(true) => WriteProgress::UnsolicitedDone,
                Err(e) => self.failing(e),
            };
        };
        let Some(i) = self.r2ts.iter().position(|r| r.ttt() == ttt) else { return self.failing(SequenceError::UnknownTtt) };
        match self.r2ts[i].accept(p.len, final_) {
            Burst::More => WriteProgress::More,
            Burst::Complete => {
                self.r2ts.swap_remove(i);
                WriteProgress::R2tDone(ttt)
            }
            Burst::CompleteWithoutFinal => WriteProgress::BurstWithoutFinal,
            Burst::EndedEarly => self.failing(SequenceError::R2tEndedEarly),
        }
    }

    /// Get_Data's start: the core collects `total` bytes, the first `due` of them unsolicited
    /// (its plan's start and end). `Ok(true)`: the unsolicited part is all in; `Ok(false)`: more
    /// of it is coming; or why the write fails (recorded).
    pub fn settle(&mut self, due: u32, total: u32) -> Result<bool, SequenceError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        let r = if due > total || self.unsolicited.received() > total {
            Err(SequenceError::UnsolicitedBeyondLength { len: total })
        } else {
            self.unsolicited.settle(due)
        };
        if let Err(e) = r {
            self.failed = Some(e);
        }
        r
    }

    /// The R2T `r` asks for, as sent: its sequence is expected from now on.
    pub fn solicit(&mut self, r: &R2tDesc) -> R2t {
        self.r2ts.push(SolicitedIn::new(r));
        R2t {
            lun: r.lun,
            itt: r.itt,
            ttt: r.ttt,
            stat_sn: r.stat_sn,
            exp_cmd_sn: r.exp_cmd_sn,
            max_cmd_sn: r.max_cmd_sn,
            r2t_sn: r.r2t_sn,
            buffer_offset: r.offset,
            desired_len: r.len,
        }
    }

    /// Whether an R2T is outstanding.
    pub fn soliciting(&self) -> bool {
        !self.r2ts.is_empty()
    }

    /// Fail the write for a reason of the caller's (a check of its own); the first reason
    /// stays.
    pub fn fail(&mut self, e: SequenceError) {
        self.failed.get_or_insert(e);
    }

    fn failing(&mut self, e: SequenceError) -> WriteProgress {
        self.fail(e);
        WriteProgress::Failed(e)
    }
}

impl TransferLimits {
    /// Put_Data over PDUs: read data of `len` bytes as Data-In PDUs, each at most
    /// [`send_segment`](Self::send_segment) bytes, sequences of at most
    /// [`burst`](Self::burst) bytes (the last PDU of each with the F bit), DataSN and buffer
    /// offset counting up from `first`'s. `first` carries the task's fields, and the status
    /// when it is collapsed into the data (RFC 7143 §11.7.4): only the last PDU keeps it. With
    /// no data and a status, one PDU carries the status alone; with neither, there is none.
    /// Yields each PDU's header and the range of the data it carries.
    pub fn data_in(&self, first: DataIn, len: u32) -> DataInSegments {
        DataInSegments { first, len, segment: self.send_segment() as u32, burst: self.burst() as u32, sent: 0, in_burst: 0, pdus: 0 }
    }
}

impl TransferLimits {
    /// An initiator's Data-Out for the bytes `range` of a write buffer (an R2T's, or the
    /// unsolicited part after the immediate data): PDUs of at most
    /// [`send_segment`](Self::send_segment) bytes, buffer offsets from `range.start`, DataSN
    /// counting up from `first`'s (0 for a new sequence), the F bit on the last. `first` carries
    /// the task's fields (LUN, ITT, TTT, ExpStatSN). Yields each PDU's header and the range of
    /// the buffer it carries; nothing for an empty range.
    pub fn data_out(&self, first: DataOut, range: Range<u32>) -> DataOutSegments {
        DataOutSegments { first, at: range.start, end: range.end, segment: self.send_segment() as u32, pdus: 0 }
    }
}

/// The Data-Out PDUs of one sequence ([`TransferLimits::data_out`]).
#[derive(Clone, Debug)]
pub struct DataOutSegments {
    first: DataOut,
    at: u32,
    end: u32,
    segment: u32,
    pdus: u32,
}

impl Iterator for DataOutSegments {
    type Item = (DataOut, Range<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.end {
            return None;
        }
        let n = self.segment.min(self.end - self.at);
        let h = DataOut {
            final_: self.at + n == self.end,
            data_sn: self.first.data_sn.wrapping_add(self.pdus),
            buffer_offset: self.at,
            ..self.first
        };
        let range = self.at as usize..(self.at + n) as usize;
        self.at += n;
        self.pdus += 1;
        Some((h, range))
    }
}

/// The Data-In PDUs of one Put_Data ([`TransferLimits::data_in`]).
#[derive(Clone, Debug)]
pub struct DataInSegments {
    first: DataIn,
    len: u32,
    segment: u32,
    burst: u32,
    sent: u32,
    in_burst: u32,
    pdus: u32,
}

impl Iterator for DataInSegments {
    type Item = (DataIn, Range<usize>);

    fn next(&mut self) -> Option<Self::Item> {
        let status_only = self.len == 0 && self.pdus == 0 && self.first.status_present;
        if self.sent >= self.len && !status_only {
            return None;
        }
        let n = self.segment.min(self.len - self.sent).min(self.burst - self.in_burst);
        let last = self.sent + n == self.len;
        self.in_burst += n;
        let mut h = DataIn {
            final_: last || self.in_burst == self.burst,
            data_sn: self.first.data_sn.wrapping_add(self.pdus),
            buffer_offset: self.first.buffer_offset.wrapping_add(self.sent),
            ..self.first
        };
        if !last {
            // The status rides in the last PDU only (its StatSN with it).
            let none = DataIn::default();
            (h.status_present, h.status, h.underflow, h.overflow, h.residual, h.stat_sn) =
                (none.status_present, none.status, none.underflow, none.overflow, none.residual, none.stat_sn);
        }
        let range = self.sent as usize..(self.sent + n) as usize;
        self.sent += n;
        self.pdus += 1;
        if self.in_burst == self.burst {
            self.in_burst = 0;
        }
        Some((h, range))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::RESERVED_TAG;

    fn limits(immediate_data: bool, initial_r2t: bool) -> TransferLimits {
        TransferLimits {
            max_send_segment: 8192,
            max_recv_segment: 65536,
            max_burst: 262_144,
            first_burst: 65_536,
            immediate_data,
            initial_r2t,
        }
    }

    #[test]
    fn each_side_sends_within_the_others_receive_limit() {
        let p =
            NegotiatedParams { initiator_recv_data_segment_length: 4096, target_recv_data_segment_length: 131_072, ..Default::default() };
        let i = p.transfer_limits(Role::Initiator);
        let t = p.transfer_limits(Role::Target);
        assert_eq!((i.max_send_segment, i.max_recv_segment), (131_072, 4096));
        assert_eq!((t.max_send_segment, t.max_recv_segment), (4096, 131_072));
    }

    #[test]
    fn the_defaults_are_the_rfcs() {
        let d = TransferLimits::default();
        assert_eq!((d.max_send_segment, d.max_recv_segment), (8192, 8192));
        assert_eq!((d.max_burst, d.first_burst, d.immediate_data, d.initial_r2t), (262_144, 65_536, true, true));
    }

    #[test]
    fn immediate_data_is_bounded_by_first_burst_segment_and_length() {
        let l = limits(true, true);
        assert_eq!(l.outgoing_write(100_000, true), WriteSplit { immediate: 8192, unsolicited_end: 8192, len: 100_000 });
        assert_eq!(l.outgoing_write(1000, true), WriteSplit { immediate: 1000, unsolicited_end: 1000, len: 1000 });
        let small_burst = TransferLimits { first_burst: 4096, ..l };
        assert_eq!(small_burst.outgoing_write(100_000, true).immediate, 4096);
        assert_eq!(limits(false, true).outgoing_write(100_000, true).immediate, 0);
    }

    #[test]
    fn without_initial_r2t_unsolicited_data_out_runs_to_first_burst() {
        let s = limits(true, false).outgoing_write(1 << 20, true);
        assert_eq!((s.immediate, s.unsolicited_end, s.unsolicited_data_out(), s.solicited()), (8192, 65_536, 57_344, (1 << 20) - 65_536));
        assert!(!s.command_is_final());
        let s = limits(false, false).outgoing_write(30_000, true);
        assert_eq!((s.immediate, s.unsolicited_end, s.solicited()), (0, 30_000, 0));
        // An initiator that sends no unsolicited Data-Out (iSER's choice) stops at the immediate data.
        let s = limits(true, false).outgoing_write(1 << 20, false);
        assert_eq!(s.unsolicited_end, 8192);
        assert!(s.command_is_final());
    }

    #[test]
    fn the_target_expects_what_the_initiator_sends() {
        for (imm, r2t) in [(true, true), (true, false), (false, true), (false, false)] {
            let l = limits(imm, r2t);
            for len in [0, 1, 512, 8191, 8192, 8193, 65_536, 65_537, 1 << 20] {
                let sent = l.outgoing_write(len, true);
                let seen = l.incoming_write(len, sent.immediate, sent.command_is_final());
                assert_eq!(seen, sent, "ImmediateData={imm} InitialR2T={r2t} len={len}");
            }
        }
    }

    #[test]
    fn a_final_command_announces_no_unsolicited_data_out() {
        let l = limits(true, false);
        assert_eq!(l.incoming_write(1 << 20, 8192, true).unsolicited_end, 8192);
        assert_eq!(l.incoming_write(1 << 20, 0, false).unsolicited_end, 65_536);
        // Immediate data beyond FirstBurstLength is the command's problem, not a negative range.
        assert_eq!(l.incoming_write(1 << 20, 100_000, false).unsolicited_end, 100_000);
    }

    #[test]
    fn segmenting_never_stalls_on_a_zero_limit() {
        let l = TransferLimits { max_send_segment: 0, max_burst: 0, ..limits(true, true) };
        assert_eq!((l.send_segment(), l.burst()), (512, 512));
    }

    fn split(immediate: u32, unsolicited_end: u32, len: u32) -> WriteSplit {
        WriteSplit { immediate, unsolicited_end, len }
    }

    #[test]
    fn unsolicited_data_out_continues_the_immediate_data_in_order_to_the_burst_end() {
        // 8 KiB immediate, Data-Out to 64 KiB (FirstBurstLength) of a 1 MiB write.
        let mut u = UnsolicitedIn::new(&split(8192, 65_536, 1 << 20));
        assert!(!u.done());
        assert_eq!(u.check(8192, 1, 8192), Err(SequenceError::DataSn));
        assert_eq!(u.check(16_384, 0, 8192), Err(SequenceError::UnsolicitedOutOfOrder));
        assert_eq!(u.check(8192, 0, 65_536), Err(SequenceError::BeyondFirstBurst));
        assert_eq!(u.check(u32::MAX - 10, 0, 100), Err(SequenceError::UnsolicitedOutOfOrder));
        let mut at = 8192;
        for sn in 0..7 {
            assert_eq!(u.check(at, sn, 8192), Ok(()));
            assert_eq!(u.accept(8192, sn == 6), Ok(sn == 6));
            at += 8192;
        }
        assert!(u.done());
        assert_eq!(u.received(), 65_536);
        assert_eq!(u.check(65_536, 7, 512), Err(SequenceError::UnsolicitedAfterEnd));
        assert_eq!(u.settle(65_536), Ok(true));
    }

    #[test]
    fn an_unsolicited_burst_ended_early_or_after_a_final_command_fails_its_task() {
        let mut u = UnsolicitedIn::new(&split(0, 65_536, 1 << 20));
        assert_eq!(u.check(0, 0, 4096), Ok(()));
        assert_eq!(u.accept(4096, true), Err(SequenceError::UnsolicitedEndedEarly));
        assert!(u.done());
        // A command with the F bit announced none.
        let u = UnsolicitedIn::new(&split(4096, 4096, 8192));
        assert!(u.done());
        assert_eq!(u.check(4096, 0, 4096), Err(SequenceError::UnsolicitedAfterEnd));
    }

    #[test]
    fn get_data_settles_what_it_collects_unsolicited() {
        // Still coming, then complete once the due bytes are in (no F bit needed).
        let mut u = UnsolicitedIn::new(&split(4096, 16_384, 65_536));
        assert_eq!(u.settle(16_384), Ok(false));
        u.accept(8192, false).unwrap();
        assert_eq!(u.settle(16_384), Ok(false));
        u.accept(4096, false).unwrap();
        assert_eq!(u.settle(16_384), Ok(true));
        assert!(u.done());
        // The CDB uses less than announced: the sequence ends there.
        let mut u = UnsolicitedIn::new(&split(0, 16_384, 65_536));
        assert_eq!(u.settle(8192), Ok(false));
        assert_eq!(u.check(0, 0, 16_384), Err(SequenceError::BeyondFirstBurst));
        assert_eq!(u.check(0, 0, 8192), Ok(()));
        assert_eq!(u.accept(8192, true), Ok(true));
        // More than due already in, or the burst over short of it.
        let mut u = UnsolicitedIn::new(&split(8192, 8192, 65_536));
        assert_eq!(u.settle(4096), Err(SequenceError::UnsolicitedShort { got: 8192, due: 4096 }));
        let mut u = UnsolicitedIn::new(&split(4096, 4096, 65_536));
        assert_eq!(u.settle(8192), Err(SequenceError::UnsolicitedShort { got: 4096, due: 8192 }));
    }

    #[test]
    fn solicited_data_out_fills_its_r2t_in_order_and_ends_with_the_f_bit() {
        let plan = R2tPlan {
            itt: 1,
            lun: Lun::default(),
            start: 8192,
            end: 40_960,
            max_burst: 16_384,
            first_ttt: 7,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        };
        let mut s = SolicitedIn::new(&plan.nth(0).unwrap());
        assert_eq!((s.ttt(), plan.count()), (7, 2));
        assert_eq!(s.check(0, 0, 8192), Err(SequenceError::OutsideR2t));
        assert_eq!(s.check(8192, 0, 16_384 + 512), Err(SequenceError::OutsideR2t));
        assert_eq!(s.check(8192, 1, 8192), Err(SequenceError::DataSn));
        assert_eq!(s.check(8192, 0, 8192), Ok(()));
        assert_eq!(s.accept(8192, false), Burst::More);
        assert_eq!(s.check(16_384, 1, 8192), Ok(()));
        assert_eq!(s.accept(8192, true), Burst::Complete);
        let mut s = SolicitedIn::new(&plan.nth(1).unwrap());
        assert_eq!(s.check(24_576, 0, 16_384), Ok(()));
        assert_eq!(s.accept(16_384, false), Burst::CompleteWithoutFinal);
    }

    fn data_out_at(ttt: u32, offset: u32, data_sn: u32, final_: bool) -> DataOut {
        DataOut { ttt, buffer_offset: offset, data_sn, final_, ..DataOut::default() }
    }

    fn r2t_at(ttt: u32, offset: u32, len: u32) -> R2tDesc {
        R2tDesc { itt: 1, lun: Lun::default(), ttt, r2t_sn: 0, offset, len, stat_sn: 3, exp_cmd_sn: 4, max_cmd_sn: 5 }
    }

    /// A write of 128 KiB whose unsolicited burst ends at 64 KiB: each Data-Out goes where its
    /// sequence says — the unsolicited one, or the outstanding R2T it names — and the first
    /// that breaks a sequence fails the write, after which everything is drained.
    #[test]
    fn a_write_places_each_data_out_by_its_sequence() {
        let place = |w: &mut WriteIn, d: DataOut, len| w.place(&d, len);
        let fresh = || {
            let mut w = WriteIn::new(&split(0, 65_536, 131_072), false, false);
            let p = w.place(&data_out_at(RESERVED_TAG, 0, 0, false), 8192);
            assert_eq!(p, DataOutTo::Place(Placement { offset: 0, len: 8192, ttt: None }));
            let DataOutTo::Place(p) = p else { unreachable!() };
            assert_eq!(w.accept(p, false), WriteProgress::More);
            let r2t = w.solicit(&r2t_at(9, 65_536, 8192));
            assert_eq!((r2t.ttt, r2t.buffer_offset, r2t.desired_len, r2t.stat_sn), (9, 65_536, 8192, 3));
            assert!(w.soliciting());
            w
        };
        let fails = |d: DataOut, len, why| {
            let mut w = fresh();
            assert_eq!(place(&mut w, d, len), DataOutTo::Fail(why));
            assert_eq!(w.failed(), Some(why));
            assert_eq!(place(&mut w, data_out_at(RESERVED_TAG, 8192, 1, false), 512), DataOutTo::Drain, "drained once failed");
        };
        let mut w = fresh();
        assert_eq!(
            place(&mut w, data_out_at(RESERVED_TAG, 8192, 1, false), 8192),
            DataOutTo::Place(Placement { offset: 8192, len: 8192, ttt: None })
        );
        assert_eq!(
            place(&mut w, data_out_at(9, 65_536, 0, false), 8192),
            DataOutTo::Place(Placement { offset: 65_536, len: 8192, ttt: Some(9) })
        );
        fails(data_out_at(RESERVED_TAG, 0, 1, false), 8192, SequenceError::UnsolicitedOutOfOrder);
        fails(data_out_at(RESERVED_TAG, 8192, 2, false), 8192, SequenceError::DataSn);
        fails(data_out_at(RESERVED_TAG, 8192, 1, false), 65_536, SequenceError::BeyondFirstBurst);
        fails(data_out_at(9, 65_536, 1, false), 8192, SequenceError::DataSn);
        fails(data_out_at(9, 65_536, 0, false), 8193, SequenceError::OutsideR2t);
        fails(data_out_at(9, 70_000, 0, false), 100, SequenceError::OutsideR2t);
        fails(data_out_at(10, 65_536, 0, false), 8192, SequenceError::UnknownTtt);
        // Get_Data settled the unsolicited part at 8 KiB: more of it is after its end.
        let mut ended = fresh();
        assert_eq!(ended.settle(8192, 131_072), Ok(true));
        assert_eq!(place(&mut ended, data_out_at(RESERVED_TAG, 8192, 1, false), 512), DataOutTo::Fail(SequenceError::UnsolicitedAfterEnd));
    }

    /// An R2T's sequence completes with the F bit on its last byte; the F bit early fails the
    /// write (the initiator will send no more of it), and its last byte without the F bit is
    /// the connection's error.
    #[test]
    fn an_r2ts_sequence_ends_with_its_f_bit_on_its_last_byte() {
        let run = |pieces: &[(u32, u32, bool)]| {
            let mut w = WriteIn::new(&split(0, 0, 16_384), true, true);
            let _ = w.solicit(&r2t_at(4, 0, 16_384));
            let mut last = WriteProgress::More;
            for (sn, &(offset, len, f)) in pieces.iter().enumerate() {
                let DataOutTo::Place(p) = w.place(&data_out_at(4, offset, sn as u32, f), len) else { panic!("not placed") };
                last = w.accept(p, f);
            }
            (last, w.soliciting(), w.failed())
        };
        assert_eq!(run(&[(0, 8192, false), (8192, 8192, true)]), (WriteProgress::R2tDone(4), false, None));
        assert_eq!(
            run(&[(0, 8192, true)]),
            (WriteProgress::Failed(SequenceError::R2tEndedEarly), true, Some(SequenceError::R2tEndedEarly))
        );
        assert_eq!(run(&[(0, 16_384, false)]), (WriteProgress::BurstWithoutFinal, true, None));
    }

    /// The ways a write fails before any Data-Out: unsolicited Data-Out announced under
    /// InitialR2T=Yes, more unsolicited data than the core collects; the first reason stays.
    #[test]
    fn a_write_fails_for_its_first_reason() {
        let mut w = WriteIn::new(&split(0, 0, 4096), true, true);
        assert_eq!(w.failed(), None, "a final command under InitialR2T=Yes is fine");
        // F=0 under InitialR2T=Yes: the target's split announces no Data-Out, but the F bit did.
        let mut w2 = WriteIn::new(&split(512, 512, 8192), false, true);
        assert_eq!(w2.failed(), Some(SequenceError::UnsolicitedWithInitialR2t));
        assert_eq!(w2.settle(512, 8192), Err(SequenceError::UnsolicitedWithInitialR2t));
        w2.fail(SequenceError::DataSn);
        assert_eq!(w2.failed(), Some(SequenceError::UnsolicitedWithInitialR2t), "the first reason stays");
        let mut w3 = WriteIn::new(&split(8192, 8192, 16_384), true, false);
        assert_eq!(w3.settle(8192, 4096), Err(SequenceError::UnsolicitedBeyondLength { len: 4096 }));
        assert_eq!(w3.failed(), Some(SequenceError::UnsolicitedBeyondLength { len: 4096 }));
        assert_eq!(w.settle(0, 4096), Ok(true));
    }

    fn data_in_of(limits: &TransferLimits, first: DataIn, len: u32) -> Vec<(DataIn, Range<usize>)> {
        limits.data_in(first, len).collect()
    }

    #[test]
    fn data_in_is_cut_to_the_segment_and_the_burst_with_the_status_in_the_last_pdu() {
        // 8 KiB segments, 20 KiB bursts: 48 KiB read data at offset 4096, DataSN from 3.
        let l = TransferLimits { max_send_segment: 8192, max_burst: 20_480, ..limits(true, true) };
        let first = DataIn {
            itt: 9,
            ttt: 0xffff_ffff,
            data_sn: 3,
            buffer_offset: 4096,
            status_present: true,
            status: riser_scsi::sense::Status::GOOD,
            underflow: true,
            residual: 512,
            stat_sn: 77,
            exp_cmd_sn: 5,
            max_cmd_sn: 40,
            ..DataIn::default()
        };
        let pdus = data_in_of(&l, first, 49_152);
        let lens: Vec<usize> = pdus.iter().map(|(_, r)| r.len()).collect();
        assert_eq!(lens, [8192, 8192, 4096, 8192, 8192, 4096, 8192]);
        let finals: Vec<bool> = pdus.iter().map(|(h, _)| h.final_).collect();
        assert_eq!(finals, [false, false, true, false, false, true, true]);
        let mut at = 0;
        for (i, (h, r)) in pdus.iter().enumerate() {
            assert_eq!((h.itt, h.data_sn, h.buffer_offset, r.start), (9, 3 + i as u32, 4096 + at as u32, at));
            assert_eq!((h.exp_cmd_sn, h.max_cmd_sn), (5, 40));
            let last = i == pdus.len() - 1;
            assert_eq!(
                (h.status_present, h.underflow, h.residual, h.stat_sn),
                if last { (true, true, 512, 77) } else { (false, false, 0, 0) }
            );
            at = r.end;
        }
        assert_eq!(at, 49_152);
        // The status alone when there is no data; nothing when neither.
        let status_only = data_in_of(&l, first, 0);
        assert_eq!(status_only.len(), 1);
        assert!(status_only[0].0.status_present && status_only[0].0.final_ && status_only[0].1.is_empty());
        assert!(data_in_of(&l, DataIn { status_present: false, ..first }, 0).is_empty());
    }

    #[test]
    fn data_out_is_cut_to_the_targets_receive_limit_with_the_f_bit_last() {
        let l = TransferLimits { max_send_segment: 8192, ..limits(true, true) };
        let first = DataOut { itt: 4, ttt: 11, exp_stat_sn: 9, ..DataOut::default() };
        let pdus: Vec<_> = l.data_out(first, 4096..24_576).collect();
        let shape: Vec<_> = pdus.iter().map(|(h, r)| (h.buffer_offset, h.data_sn, h.final_, r.clone())).collect();
        assert_eq!(shape, [(4096, 0, false, 4096..12_288), (12_288, 1, false, 12_288..20_480), (20_480, 2, true, 20_480..24_576)]);
        assert!(pdus.iter().all(|(h, _)| (h.itt, h.ttt, h.exp_stat_sn) == (4, 11, 9)));
        assert_eq!(l.data_out(first, 100..100).count(), 0);
    }

    proptest::proptest! {
        /// Every byte once, in order; no PDU above the segment; the F bit exactly where a burst
        /// fills or the data ends; DataSN one per PDU.
        #[test]
        fn data_in_covers_the_data_within_the_limits(seg in 0u32..70_000, burst in 0u32..300_000, len in 0u32..600_000) {
            let l = TransferLimits { max_send_segment: seg, max_burst: burst, ..limits(true, true) };
            let (seg, burst) = (l.send_segment(), l.burst());
            let pdus = data_in_of(&l, DataIn::default(), len);
            let (mut at, mut in_burst) = (0usize, 0usize);
            for (i, (h, r)) in pdus.iter().enumerate() {
                proptest::prop_assert_eq!(r.start, at);
                proptest::prop_assert!(!r.is_empty() && r.len() <= seg);
                proptest::prop_assert_eq!((h.data_sn, h.buffer_offset), (i as u32, at as u32));
                in_burst += r.len();
                proptest::prop_assert!(in_burst <= burst);
                proptest::prop_assert_eq!(h.final_, in_burst == burst || r.end == len as usize);
                if h.final_ {
                    in_burst = 0;
                }
                at = r.end;
            }
            proptest::prop_assert_eq!(at, len as usize);
        }

        /// What an initiator sends of a write (immediate data, unsolicited Data-Out, the
        /// Data-Out of each R2T, cut by `data_out`), the target's checks take, every byte once,
        /// each sequence ending where the F bit says: both sides' rules agree for any limits.
        #[test]
        fn the_target_takes_every_data_out_the_initiator_sends(
            immediate_data: bool,
            initial_r2t: bool,
            seg in 512u32..70_000,
            first_burst in 512u32..300_000,
            burst in 512u32..300_000,
            len in 1u32..700_000,
        ) {
            let l = TransferLimits { max_send_segment: seg, max_recv_segment: seg, max_burst: burst, first_burst, immediate_data, initial_r2t };
            let sent = l.outgoing_write(len, true);
            let seen = l.incoming_write(len, sent.immediate, sent.command_is_final());
            let mut write = WriteIn::new(&seen, sent.command_is_final(), initial_r2t);
            let mut covered = sent.immediate;
            let mut ended = false;
            for (h, r) in l.data_out(DataOut { ttt: RESERVED_TAG, ..DataOut::default() }, sent.immediate..sent.unsolicited_end) {
                proptest::prop_assert_eq!(r.start as u32, covered);
                let DataOutTo::Place(p) = write.place(&h, r.len() as u32) else { return Err(proptest::test_runner::TestCaseError::fail("not placed")) };
                proptest::prop_assert_eq!((p.offset, p.len as usize), (covered, r.len()));
                let progress = write.accept(p, h.final_);
                ended = progress == WriteProgress::UnsolicitedDone;
                proptest::prop_assert_eq!(ended, h.final_, "{:?}", progress);
                covered = r.end as u32;
            }
            proptest::prop_assert_eq!(ended, sent.unsolicited_end > sent.immediate);
            proptest::prop_assert_eq!(write.settle(seen.unsolicited_end, len), Ok(true));
            let plan = R2tPlan { itt: 1, lun: Lun::default(), start: seen.unsolicited_end, end: len, max_burst: burst, first_ttt: 5, stat_sn: 0, exp_cmd_sn: 0, max_cmd_sn: 0 };
            for n in 0..plan.count() {
                let r2t = write.solicit(&plan.nth(n).unwrap());
                let mut last = WriteProgress::More;
                for (h, r) in l.data_out(DataOut { ttt: r2t.ttt, ..DataOut::default() }, r2t.buffer_offset..r2t.buffer_offset + r2t.desired_len) {
                    proptest::prop_assert_eq!(r.start as u32, covered);
                    let DataOutTo::Place(p) = write.place(&h, r.len() as u32) else { return Err(proptest::test_runner::TestCaseError::fail("not placed")) };
                    last = write.accept(p, h.final_);
                    covered = r.end as u32;
                }
                proptest::prop_assert_eq!(last, WriteProgress::R2tDone(r2t.ttt));
            }
            proptest::prop_assert!(!write.soliciting());
            proptest::prop_assert_eq!(write.failed(), None);
            proptest::prop_assert_eq!(covered, len);
        }
    }
}
