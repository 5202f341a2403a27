//! The SCSI command path of a session: plan the command on its logical unit, collect write
//! data (Get_Data with the R2T plan the session machine makes), execute, send read data
//! (Put_Data, with the status in the last Data-In where the datamover can), and end the task
//! with its status.

use super::lock;
use super::session::{BUDGET_UNIT, IoCount, IoGate, Session, Slot, within};
use super::view::PathGuard;
use crate::lu::{LogicalUnit, Outcome, Plan};
use bytes::Bytes;
use riser_datamover::SequenceError;
use riser_iscsi::session::{Residual, TargetSession, WriteSplit};
use riser_iscsi::wire::ScsiCommand;
use riser_scsi::lun::Lun;
use riser_scsi::sense::{AscAscq, Sense, SenseKey, Status};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tracing::{debug, warn};

/// A command's backend I/O running apart from its task (on the blocking pool, or a store's
/// future spawned): until it is dropped, when the I/O is over, a LUN removal waits for it (the
/// path) and, when `gated`, so do the session's end (the session's count) and task management
/// (the task's gate; a command run in the session's receiving task has none: nothing aborts it
/// while it runs).
struct InFlight {
    gate: Option<Arc<IoGate>>,
    io: Option<Arc<IoCount>>,
    _path: PathGuard,
}

impl InFlight {
    /// The command's I/O starts; `None` if its task was aborted already (then it must not:
    /// see [`IoGate`]).
    fn new(gate: Option<&Arc<IoGate>>, io: &Arc<IoCount>, path: PathGuard, gated: bool) -> Option<Self> {
        let gate = match gate.filter(|_| gated) {
            Some(g) if !g.enter() => return None,
            g => g.cloned(),
        };
        let io = gated.then(|| {
            io.enter();
            io.clone()
        });
        Some(Self { gate, io, _path: path })
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(g) = self.gate.take() {
            g.leave();
        }
        if let Some(io) = self.io.take() {
            io.leave();
        }
    }
}

/// A store's operation awaited by its command's task, holding what waits for it. Dropped before
/// the end (the task aborted by task management, or by the session's end) it hands the rest to
/// a task of its own, which holds the [`InFlight`] until the store is done: in the common case
/// the command's own task spawns nothing, and the store's completion wakes it directly (a
/// task per operation cost a spawn and a second wake-up per command).
///
/// Outside a runtime (its last thread is going down) there is nowhere to run the rest: the
/// operation still completes in the store, but what waits for it is told at once.
struct ToTheEnd {
    running: Option<crate::lu::Running>,
    in_flight: Option<InFlight>,
}

impl Future for ToTheEnd {
    type Output = Outcome;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Outcome> {
        let this = &mut *self;
        let Some(running) = this.running.as_mut() else { return std::task::Poll::Pending };
        let o = std::task::ready!(running.as_mut().poll(cx));
        this.running = None;
        this.in_flight = None;
        std::task::Poll::Ready(o)
    }
}

impl Drop for ToTheEnd {
    fn drop(&mut self) {
        // Dropped while the operation's future panics (the task unwinds): it cannot be polled
        // again; what waits for it is told at once, as when a task of its own panicked before.
        if let (Some(running), Some(in_flight)) = (self.running.take(), self.in_flight.take())
            && !std::thread::panicking()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(async move {
                running.await;
                drop(in_flight);
            });
        }
    }
}

/// A command as the session hands it to [`Session::command`].
pub(super) struct Command {
    pub(super) cmd: ScsiCommand,
    /// Its full CDB (the BHS's 16 bytes and an extended-CDB AHS).
    pub(super) cdb: smallvec::SmallVec<[u8; 16]>,
    pub(super) split: WriteSplit,
    /// REPORT LUNS: the nexus's LUNs, which it answers from (whichever LUN it names).
    pub(super) report: Option<Vec<Lun>>,
    /// Its task's I/O gate; `None` when it runs in the session's receiving task (one such
    /// command at a time, and nothing aborts it while it runs).
    pub(super) gate: Option<Arc<IoGate>>,
    /// An EXTENDED COPY: the unit resets the process had seen when the session took it, so
    /// that a reset of a unit it uses made before it runs stops it too (0 for any other
    /// command, which never looks).
    pub(super) since: u64,
}

impl Command {
    /// Whether it runs in the session's receiving task.
    fn inline(&self) -> bool {
        self.gate.is_none()
    }
}

/// Sense for write data that broke its sequence or did not come.
fn data_phase_error(lu: &LogicalUnit) -> Outcome {
    let s = Sense::new(SenseKey::ABORTED_COMMAND, AscAscq::DATA_PHASE_ERROR);
    Outcome { status: Status::CHECK_CONDITION, sense: Some(lu.encode_sense(&s)), data: Bytes::new() }
}

impl Session {
    /// Give read data back to the datamover's pool once it has been put (when nothing else
    /// holds it).
    fn give_back(&self, data: Bytes) {
        if let Ok(b) = data.try_into_mut() {
            self.dm.release_task_buffer(riser_datamover::TaskBuffer { data: b });
        }
    }

    /// The command's SCSI Response: its task ends (its window slot opens, so the response
    /// already announces the room it leaves). Counted once the response is out: counting is
    /// not on the way to the initiator, and the latency counted is the whole command's.
    async fn scsi_response(&self, o: &Outcome, residual: Residual, exp_data_sn: u32, slot: &Slot) {
        if let Some(task) = slot.take() {
            lock(&self.core).finish_command(task, o.status, o.sense.as_deref(), residual, exp_data_sn);
        }
        self.flush().await;
        slot.count(o.status, o.sense.as_deref());
    }

    /// CHECK CONDITION with ILLEGAL REQUEST / `asc` for a command refused before it ran (its
    /// write data, if any, is dropped by the datamover).
    async fn refuse(&self, c: &ScsiCommand, lu: &LogicalUnit, asc: AscAscq, slot: &Slot) {
        self.dm.deallocate_task_resources(c.itt);
        let o = Outcome {
            status: Status::CHECK_CONDITION,
            sense: Some(lu.encode_sense(&Sense::new(SenseKey::ILLEGAL_REQUEST, asc))),
            data: Bytes::new(),
        };
        let edtl = c.expected_data_len;
        self.scsi_response(&o, Residual::between(edtl, 0), 0, slot).await;
    }

    /// Take `bytes` of the session's memory budget, then of the target's (waiting for room in
    /// each, always in that order), for a command's data.
    async fn reserve(&self, bytes: u64) -> Option<(tokio::sync::OwnedSemaphorePermit, tokio::sync::OwnedSemaphorePermit)> {
        if bytes == 0 {
            return None;
        }
        let units = bytes.div_ceil(BUDGET_UNIT);
        let mine = take_units(&self.budget, units.min(u64::from(self.budget_units)) as u32).await?;
        let all = take_units(&self.target_budget, units.min(u64::from(self.target_budget_units)) as u32).await?;
        Some((mine, all))
    }

    /// Run a command: REPORT LUNS answers from the nexus's LUNs, every other command runs on
    /// the unit of the slot's path (or gets LOGICAL UNIT NOT SUPPORTED without one).
    pub(super) async fn command(&self, run: Command, slot: &Slot) {
        let inline = run.inline();
        let Command { cmd: c, cdb, split, report, gate, since } = run;
        let gate = gate.as_ref();
        let (edtl, immediate) = (c.expected_data_len, split.immediate);
        // The rare answers (REPORT LUNS, no unit, a refusal) are boxed: awaited in place, their
        // futures would set this one's size, and a future is copied whole each time one is made
        // — for this one, at every level that awaits it, once per command.
        if let Some(luns) = report {
            // Its data goes out through the task's resources (iSER: the read STag): they are
            // freed once the answer is out.
            Box::pin(self.report_luns(&c, &cdb, &luns, slot)).await;
            return self.dm.deallocate_task_resources(c.itt);
        }
        let Some(path) = slot.path() else {
            Box::pin(self.no_such_lun(&c, &cdb, slot)).await;
            return self.dm.deallocate_task_resources(c.itt);
        };
        // Borrowed from the path (a clone would write the unit's reference count, which every
        // session using the unit shares).
        let lu = &path.lu;
        // The nexus's LUN inventory changed: said once, to a command that is not INQUIRY or
        // REQUEST SENSE (SAM-5 §5.14). Read first: the swap writes, and is rarely needed.
        if !matches!(cdb.first(), Some(0x12 | 0x03))
            && self.luns_changed.load(Ordering::Relaxed)
            && self.luns_changed.swap(false, Ordering::AcqRel)
        {
            self.dm.deallocate_task_resources(c.itt);
            let s = Sense::new(SenseKey::UNIT_ATTENTION, AscAscq::REPORTED_LUNS_DATA_CHANGED);
            let o = Outcome { status: Status::CHECK_CONDITION, sense: Some(lu.encode_sense(&s)), data: Bytes::new() };
            return self.scsi_response(&o, Residual::between(edtl, 0), 0, slot).await;
        }
        // What no CDB can justify is refused before anything is planned or allocated: more
        // data than a task buffer holds, immediate data beyond the expected length.
        if c.write && edtl > crate::MAX_DATA_OUT {
            return Box::pin(self.refuse(&c, lu, AscAscq::INVALID_FIELD_IN_CDB, slot)).await;
        }
        if c.write && immediate > edtl {
            self.dm.deallocate_task_resources(c.itt);
            return self.scsi_response(&data_phase_error(lu), Residual::None, 0, slot).await;
        }
        let plan = match lu.plan(&cdb, &self.nexus) {
            Ok(p) => Plan { edtl, ..p },
            Err(o) => {
                self.dm.deallocate_task_resources(c.itt);
                return self.scsi_response(&o, Residual::between(edtl, 0), 0, slot).await;
            }
        };
        let out_len = plan.data_out;
        if c.read && edtl > 0 && out_len == 0 && !self.dm.can_put_data(c.itt) {
            // Read data with nowhere to go (an iSER command without a read STag): the command
            // ends here, before the medium is read, and the connection goes on.
            debug!(itt = c.itt, "read data expected but the datamover cannot deliver it");
            self.dm.deallocate_task_resources(c.itt);
            return self.scsi_response(&data_phase_error(lu), Residual::Underflow(edtl), 0, slot).await;
        }
        if !c.write && out_len > 0 {
            // The CDB wants data the initiator did not announce.
            self.dm.deallocate_task_resources(c.itt);
            let o = Outcome {
                status: Status::CHECK_CONDITION,
                sense: Some(lu.encode_sense(&Sense::new(SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_CDB))),
                data: Bytes::new(),
            };
            return self.scsi_response(&o, Residual::Overflow(out_len), 0, slot).await;
        }
        // The command's memory: its write data, or the read data it may produce. A command of
        // at most one budget unit run in the receiving task takes none: there is one such
        // command per connection at a time, so its memory is bounded per connection already
        // (and the target-wide budget, which every connection writes, is left alone).
        let _budget = if inline && u64::from(edtl) <= BUDGET_UNIT { None } else { self.reserve(u64::from(edtl)).await };
        let mut data_out = Bytes::new();
        if c.write && edtl > 0 {
            match tokio::time::timeout(self.data_timeout, self.fetch_write_data(&c, split, out_len)).await {
                Ok(Ok(b)) => data_out = b,
                Ok(Err(riser_datamover::DmError::Closed | riser_datamover::DmError::Io(_))) => return,
                Ok(Err(e)) => {
                    debug!(itt = c.itt, %e, "write data out of sequence");
                    return self.scsi_response(&data_phase_error(lu), Residual::None, 0, slot).await;
                }
                Err(_) => {
                    warn!(itt = c.itt, timeout = ?self.data_timeout, "write data did not arrive");
                    self.dm.deallocate_task_resources(c.itt);
                    return self.scsi_response(&data_phase_error(lu), Residual::None, 0, slot).await;
                }
            }
        }
        let usable = out_len.min(edtl) as usize;
        if data_out.len() < usable {
            // Never write what was not received (a buffer short of the data the CDB uses).
            warn!(itt = c.itt, got = data_out.len(), usable, "write data incomplete");
            return self.scsi_response(&data_phase_error(lu), Residual::None, 0, slot).await;
        }
        // A READ's data goes into a buffer of the datamover's pool, which gets it back once sent.
        let read_buf = if c.read && edtl > 0 { self.dm.take_buffer(edtl as usize) } else { Vec::new() };
        let (o, data_out) = if lu.runs_async(&plan) {
            // An asynchronous store: the command is a future completed by the store, awaited
            // here; should this task be aborted meanwhile, the rest of it goes on as a task of its
            // own (`ToTheEnd`), so its operation is followed to its end: the gate tells task
            // management (and the session's end) when it is over, and the path keeps a LUN being
            // removed waiting for it.
            // In flight (or refused, the task aborted) before the store's operation is made.
            let Some(in_flight) = InFlight::new(gate, &self.io, path.enter(), true) else {
                return;
            };
            let Some(running) = lu.execute_async(&plan, data_out.slice(..usable), &self.nexus, read_buf) else {
                return;
            };
            (ToTheEnd { running: Some(running), in_flight: Some(in_flight) }.await, data_out)
        } else if !lu.may_block(&plan) {
            // Memory-speed backends run inline; a thread hand-off would cost more than the I/O.
            // In a task of its own (a gate) it may be in the middle of it when task management
            // or the session's end aborts the task on another thread: the abort takes effect
            // only once this poll returns, so the gate and the session's count say when it is
            // over (a reinstating session must not write before it). In the receiving task
            // nothing ends the session meanwhile.
            let _in_flight = match gate {
                Some(g) => match InFlight::new(Some(g), &self.io, path.enter(), !lu.outlives_its_task(&plan)) {
                    Some(f) => Some(f),
                    None => return,
                },
                None => None,
            };
            let given_up = || gate.is_some_and(|g| g.is_aborted());
            let accepted = crate::lu::Accepted { since, given_up: &given_up };
            (lu.execute_since(&plan, &data_out[..usable], &self.nexus, read_buf, accepted), data_out)
        } else {
            // The blocking pool runs the I/O to its end even if this task is aborted meanwhile:
            // the gate tells task management (and the session's end) when it is over.
            let lu2 = lu.clone();
            let nexus = self.nexus.clone();
            let plan2: Plan = plan.clone();
            let gate2 = gate.cloned();
            // A SANITIZE is not waited for: it goes on across task management and reinstatement
            // by design, and the LU fences the medium while it runs. The I/O holds the path
            // either way: a LUN being removed waits for it even if this task is aborted meanwhile.
            let Some(in_flight) = InFlight::new(gate, &self.io, path.enter(), !lu.outlives_its_task(&plan)) else {
                return;
            };
            let Ok(r) = tokio::task::spawn_blocking(move || {
                let given_up = || gate2.as_ref().is_some_and(|g| g.is_aborted());
                let accepted = crate::lu::Accepted { since, given_up: &given_up };
                let r = (lu2.execute_since(&plan2, &data_out[..usable], &nexus, read_buf, accepted), data_out);
                drop(in_flight);
                r
            })
            .await
            else {
                return;
            };
            r
        };
        if c.write && usable > 0 && o.status == Status::GOOD {
            path.counters.written(usable as u32);
        }
        // The write data is consumed: let the datamover reuse its buffer.
        if let Ok(buf) = data_out.try_into_mut() {
            self.dm.release_task_buffer(riser_datamover::TaskBuffer { data: buf });
        }
        let mut pdus = 0;
        let mut residual;
        if c.write || out_len > 0 {
            residual = Residual::between(edtl, out_len);
        } else {
            let produced = o.data.len() as u32;
            let send = produced.min(edtl);
            residual = Residual::between(edtl, produced);
            if send > 0 && c.read && o.status == Status::GOOD && o.sense.is_none() && self.dm.collapses_status() {
                // GOOD status goes with the data (`collapses_status`): over TCP in the last
                // Data-In (phase collapse, RFC 7143 §11.7.4), over iSER as the SCSI Response
                // posted behind the RDMA Write; it takes the next StatSN, and everything
                // stamped before it leaves first.
                let sent = {
                    let collapsed = std::pin::pin!(async {
                        let _order = self.tx.lock().await;
                        self.flush_locked().await;
                        let Some(stamp) = slot.take().and_then(|t| lock(&self.core).take_status(t)) else {
                            // Aborted meanwhile: no data, no status.
                            return Ok::<_, riser_datamover::DmError>(None);
                        };
                        let (underflow, overflow, count) = residual.flags();
                        let collapse = riser_datamover::CollapsedStatus {
                            status: o.status,
                            underflow,
                            overflow,
                            residual: count,
                            stat_sn: stamp.stat_sn,
                            exp_cmd_sn: stamp.exp_cmd_sn,
                            max_cmd_sn: stamp.max_cmd_sn,
                        };
                        let desc =
                            riser_datamover::DataInDesc { itt: c.itt, lun: c.lun, offset: 0, data_sn: 0, collapse_status: Some(collapse) };
                        let done = self.put_data(desc, o.data.slice(..send as usize)).await?;
                        if !done.status_sent {
                            // The status did not fit the last Data-In: its own response, same StatSN.
                            let t = TargetSession::scsi_response(c.itt, o.status, None, residual, done.pdus, stamp);
                            self.send_control(riser_datamover::ControlPdu::new(t.header, t.data)).await?;
                        }
                        Ok(Some(done))
                    });
                    within(self.send_timeout, collapsed).await
                };
                match sent {
                    Ok(Ok(Some(_))) => {
                        slot.count(o.status, None);
                        path.counters.read(send);
                    }
                    Ok(Ok(None)) => {}
                    Ok(Err(_)) => return,
                    Err(_) => return self.send_failed("Data-In"),
                }
                self.give_back(o.data);
                return;
            } else if send > 0 && c.read {
                let desc = riser_datamover::DataInDesc { itt: c.itt, lun: c.lun, offset: 0, data_sn: 0, collapse_status: None };
                let put = std::pin::pin!(self.put_data(desc, o.data.slice(..send as usize)));
                match within(self.send_timeout, put).await {
                    Ok(Ok(d)) => {
                        pdus = d.pdus;
                        path.counters.read(send);
                    }
                    Ok(Err(_)) => return,
                    Err(_) => return self.send_failed("Data-In"),
                }
            } else if send > 0 {
                residual = Residual::Underflow(edtl);
            }
        }
        self.scsi_response(&o, residual, pdus, slot).await;
        self.give_back(o.data);
    }

    /// Collect a write's data: the unsolicited part the initiator announced (immediate data,
    /// then Data-Out up to FirstBurstLength unless InitialR2T=Yes or F=1), then solicited up to
    /// what the CDB uses (`out_len`, at most the expected length) — never more, so the R2Ts a
    /// command costs are bounded by its CDB, not by its expected length.
    async fn fetch_write_data(&self, c: &ScsiCommand, split: WriteSplit, out_len: u32) -> Result<Bytes, riser_datamover::DmError> {
        let plan = lock(&self.core).plan_write(c, split, out_len.min(c.expected_data_len));
        let end = plan.end;
        let got = match self.dm.try_get_data(plan) {
            riser_datamover::Attempt::Done(got) => got,
            riser_datamover::Attempt::WouldWait(plan) => self.dm.get_data(plan).await.map(|b| b.data.freeze()),
        };
        match got {
            Ok(b) if b.len() == end as usize => Ok(b),
            Ok(b) => Err(SequenceError::WrongLength { got: b.len() as u32, due: end }.into()),
            Err(e) => {
                warn!(itt = c.itt, %e, "write data not received");
                Err(e)
            }
        }
    }

    async fn no_such_lun(&self, c: &ScsiCommand, cdb: &[u8], slot: &Slot) {
        // INQUIRY works on any LUN (REPORT LUNS is answered for the nexus before), with the
        // peripheral qualifier "not present": the standard data, or the Supported VPD Pages page
        // listing only itself. Every other page, and every other command: LOGICAL UNIT NOT
        // SUPPORTED. (Standard data given for a VPD page made Linux read its version and flags
        // bytes as a page length and ask for page 00h some 3000 times in one rescan.)
        let not_supported = || {
            let s = Sense::new(SenseKey::ILLEGAL_REQUEST, AscAscq::LOGICAL_UNIT_NOT_SUPPORTED);
            Outcome { status: Status::CHECK_CONDITION, sense: Some(s.to_fixed().to_vec().into()), data: Bytes::new() }
        };
        let evpd = cdb.get(1).is_some_and(|b| b & 1 == 1);
        let page = cdb.get(2).copied().unwrap_or(0);
        let data = match cdb.first() {
            Some(&0x12) if !evpd => {
                let mut data = riser_scsi::inquiry::StandardInquiry::disk("RISER", "RISER DISK", "0001");
                data.peripheral = riser_scsi::inquiry::NOT_PRESENT;
                data.to_bytes()
            }
            Some(&0x12) if page == riser_scsi::inquiry::vpd::SUPPORTED_PAGES => {
                riser_scsi::inquiry::vpd_page(riser_scsi::inquiry::NOT_PRESENT, page, &[riser_scsi::inquiry::vpd::SUPPORTED_PAGES])
            }
            _ => return self.scsi_response(&not_supported(), Residual::between(c.expected_data_len, 0), 0, slot).await,
        };
        let alloc = cdb.get(3..5).map(|b| u16::from_be_bytes([b[0], b[1]])).unwrap_or(0);
        let mut bytes = data;
        bytes.truncate(usize::from(alloc).min(c.expected_data_len as usize));
        let n = bytes.len() as u32;
        let desc = riser_datamover::DataInDesc { itt: c.itt, lun: c.lun, offset: 0, data_sn: 0, collapse_status: None };
        let pdus = if n > 0 { self.put_answer(desc, bytes.into()).await } else { 0 };
        let o = Outcome { status: Status::GOOD, sense: None, data: Bytes::new() };
        self.scsi_response(&o, Residual::between(c.expected_data_len, n), pdus, slot).await;
    }
}

impl Session {
    /// Put_Data of a small answer of the target's own (INQUIRY without a unit, REPORT LUNS):
    /// its Data-In PDUs, 0 if it failed. A transport that takes nothing for `send_timeout`
    /// (over iSER, no room for read data: `IserConfig::read_data_in_flight`) ends the
    /// connection, as for a READ's data.
    async fn put_answer(&self, desc: riser_datamover::DataInDesc, data: Bytes) -> u32 {
        let put = std::pin::pin!(self.put_data(desc, data));
        match within(self.send_timeout, put).await {
            Ok(r) => r.map(|d| d.pdus).unwrap_or(0),
            Err(_) => {
                self.send_failed("Data-In");
                0
            }
        }
    }

    /// REPORT LUNS, from the nexus's LUN inventory; it clears a pending REPORTED LUNS DATA HAS
    /// CHANGED.
    async fn report_luns(&self, c: &ScsiCommand, cdb: &[u8], luns: &[Lun], slot: &Slot) {
        let select = cdb.get(2).copied().unwrap_or(0);
        let alloc = cdb.get(6..10).map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
        let (o, data) = match crate::lu::report_luns(select, alloc, luns) {
            Ok(data) => {
                self.luns_changed.store(false, Ordering::Release);
                (Outcome { status: Status::GOOD, sense: None, data: Bytes::new() }, data)
            }
            Err(s) => {
                (Outcome { status: Status::CHECK_CONDITION, sense: Some(s.to_fixed().to_vec().into()), data: Bytes::new() }, Bytes::new())
            }
        };
        let n = (data.len() as u32).min(c.expected_data_len);
        let desc = riser_datamover::DataInDesc { itt: c.itt, lun: c.lun, offset: 0, data_sn: 0, collapse_status: None };
        let pdus = if n > 0 { self.put_answer(desc, data.slice(..n as usize)).await } else { 0 };
        self.scsi_response(&o, Residual::between(c.expected_data_len, n), pdus, slot).await;
    }
}

/// `n` permits of `budget`, waiting in line if there is no room (`None`: closed). Taken at once
/// when there is room (no waiter is passed: released permits go to waiters first), which
/// costs a fraction of a queued acquisition.
async fn take_units(budget: &Arc<tokio::sync::Semaphore>, n: u32) -> Option<tokio::sync::OwnedSemaphorePermit> {
    match budget.clone().try_acquire_many_owned(n) {
        Ok(p) => Some(p),
        Err(tokio::sync::TryAcquireError::NoPermits) => budget.clone().acquire_many_owned(n).await.ok(),
        Err(tokio::sync::TryAcquireError::Closed) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::RamBackend;
    use crate::lu::LuIdentity;
    use crate::server::view::LunPath;

    /// Gated I/O holds the session's count, and its task's gate when it has one (a command run
    /// in the receiving task has none); ungated I/O (a SANITIZE) holds only the path.
    #[test]
    fn in_flight_io_holds_what_waits_for_it() {
        let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random()));
        let path = Arc::new(LunPath::new(0, lu));
        let (gate, io) = (Arc::new(IoGate::default()), Arc::new(IoCount::default()));
        let spawned = InFlight::new(Some(&gate), &io, path.enter(), true).unwrap();
        let inline = InFlight::new(None, &io, path.enter(), true).unwrap();
        assert!(gate.busy.load(Ordering::Acquire));
        assert_eq!(io.running(), 2);
        drop(spawned);
        assert!(!gate.busy.load(Ordering::Acquire));
        assert_eq!(io.running(), 1);
        assert!(path.busy());
        drop(inline);
        assert_eq!(io.running(), 0);
        let ungated = InFlight::new(Some(&gate), &io, path.enter(), false).unwrap();
        assert!(!gate.busy.load(Ordering::Acquire) && io.running() == 0 && path.busy());
        drop(ungated);
        assert!(!path.busy());
    }

    /// A task aborted (on another thread) before its I/O starts does not start it: the aborter
    /// found its gate idle and waits for nothing. One aborted while its I/O runs is waited for.
    #[test]
    fn io_does_not_start_once_its_task_is_aborted() {
        let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random()));
        let path = Arc::new(LunPath::new(0, lu));
        let io = Arc::new(IoCount::default());
        let running = Arc::new(IoGate::default());
        let started = InFlight::new(Some(&running), &io, path.enter(), true).unwrap();
        running.abort();
        assert!(running.busy.load(Ordering::SeqCst), "the I/O under way is waited for");
        drop(started);
        let late = Arc::new(IoGate::default());
        late.abort();
        assert!(InFlight::new(Some(&late), &io, path.enter(), true).is_none());
        assert!(!late.busy.load(Ordering::SeqCst) && io.running() == 0 && !path.busy());
        // A store operation that outlives its task (a SANITIZE) is not gated: it goes on.
        assert!(InFlight::new(Some(&late), &io, path.enter(), false).is_some());
    }
}
