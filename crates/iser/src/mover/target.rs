//! The target half: a write command's immediate data and unsolicited Data-Out (Sends) placed
//! in its task buffer, Put_Data as RDMA Writes to the initiator's read buffer and Get_Data as
//! RDMA Reads from its write buffer.

use super::driver::completion;
use super::{IserDatamover, Keep, Shared, WriteTask, copy_out, lock, rdma};
use crate::header::IserHeader;
use bytes::{Bytes, BytesMut};
use hashbrown::hash_map::Entry;
use riser_datamover::{Attempt, ControlPdu, DataInDesc, DmError, DmEvent, PutDataDone, R2tPlan, SequenceError, TaskBuffer, Violation};
use riser_iscsi::session::{DataOutTo, WriteIn};
use riser_iscsi::wire::{DataOut, Header, ScsiCommand, ScsiResponse};
use riser_verbs::{Access, MemoryRegion, ProtectionDomain, Provider, QueuePair, SendOp, SgList, Sge};
use std::sync::atomic::Ordering;

/// The largest single RDMA Read: well within every device's max_msg_sz (2 GiB on rxe, siw and
/// InfiniBand HCAs; unbounded on the software RNIC), large enough that a command is one Read.
const MAX_RDMA_READ: u32 = 16 << 20;

impl<P: Provider + 'static> Shared<P> {
    /// A write command with data (target): its immediate data goes straight into a new task
    /// buffer, sized for the unsolicited part; the command goes up as a control PDU. A tag
    /// still in use by a write is a protocol error of the connection (as over TCP).
    ///
    /// With `owned` (the receive buffer `immediate_data` lies in, handed on: see `Recv`), a
    /// write whose data all came with it keeps that buffer as its task buffer: nothing copied.
    pub(super) fn receive_write_command(
        &self,
        c: ScsiCommand,
        ahs: Bytes,
        immediate_data: &[u8],
        owned: Option<&Bytes>,
    ) -> Result<(), DmError> {
        let header = Header::ScsiCommand(c);
        let edtl = c.expected_data_len as usize;
        let imm = immediate_data.len();
        if edtl > crate::MAX_TASK_BUFFER || imm > edtl {
            // No task: the core answers CHECK CONDITION (as over TCP), seeing the
            // immediate data beyond the command's length or a length beyond
            // MAX_TASK_BUFFER; the connection goes on.
            self.queue_event(DmEvent::Control(ControlPdu { header, ahs, data: Bytes::new(), immediate: imm as u32 }));
            return Ok(());
        }
        let l = *lock(&self.limits);
        // Every byte is written before use: immediate data here, unsolicited
        // Data-Out in order after it, RDMA Reads for the rest. Only the unsolicited
        // part is allocated now; Get_Data takes the rest within the core's budget. A
        // pooled buffer for the whole transfer is taken at once if there is one (no
        // allocation, and Get_Data copies nothing).
        let split = l.incoming_write(c.expected_data_len, imm as u32, c.final_);
        let write = WriteIn::new(&split, c.final_, l.initial_r2t);
        let task = match owned {
            Some(b) if imm == edtl && imm > 0 => WriteTask { buf: Vec::new(), whole: Some(b.slice_ref(immediate_data)), write },
            _ => {
                let mut buf = self.pool.take_dirty_pooled(edtl).unwrap_or_else(|| self.pool.take_dirty_vec(split.unsolicited_end as usize));
                buf[..imm].copy_from_slice(&immediate_data[..imm]);
                WriteTask { buf, whole: None, write }
            }
        };
        match lock(&self.writes).entry(c.itt) {
            Entry::Occupied(_) => return Err(Violation::TaskTagReused { itt: c.itt }.into()),
            Entry::Vacant(v) => v.insert(task),
        };
        self.queue_event(DmEvent::Control(ControlPdu { header, ahs, data: Bytes::new(), immediate: imm as u32 }));
        Ok(())
    }

    /// A command whose tag names a task still held here (its remote keys, perhaps its write
    /// buffer). A write while that task's write is outstanding ends the connection (its data
    /// could not be told from the first's); otherwise the command takes nothing, keeps the
    /// first task's keys, and goes up to be rejected (Task in progress) and discarded — a
    /// discard that the `duplicates` count keeps from freeing the first task's state.
    pub(super) fn receive_duplicate_command(&self, c: ScsiCommand, ahs: Bytes) -> Result<(), DmError> {
        if c.write && lock(&self.writes).contains_key(&c.itt) {
            return Err(Violation::TaskTagReused { itt: c.itt }.into());
        }
        self.duplicates.note(c.itt);
        self.queue_event(DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), ahs, data: Bytes::new(), immediate: 0 }));
        Ok(())
    }

    /// A received Data-Out (target): unsolicited data placed in its task's buffer, checked by
    /// riser-iscsi's rules as over TCP (in order, DataSN, within the unsolicited burst, the
    /// burst ended by its F bit at FirstBurstLength or the transfer's end). Data that breaks
    /// them fails its task (CHECK CONDITION); the connection goes on.
    pub(super) fn receive_unsolicited_data_out(&self, d: &DataOut, payload: &[u8]) {
        // Unsolicited Data-Out (InitialR2T=No): a Send, placed by its buffer offset.
        let mut w = lock(&self.writes);
        if let Some(t) = w.get_mut(&d.itt) {
            // Within the burst is within the buffer (sized to it, or to the whole transfer);
            // checked again where the bytes are written.
            match t.write.place(d, payload.len() as u32) {
                DataOutTo::Place(p) if (p.offset as usize).saturating_add(payload.len()) > t.buf.len() => {
                    t.write.fail(SequenceError::BeyondFirstBurst);
                }
                DataOutTo::Place(p) => {
                    let at = p.offset as usize;
                    t.buf[at..at + payload.len()].copy_from_slice(payload);
                    // Its sequence's end or failure shows in Get_Data's `settle`.
                    let _ = t.write.accept(p, d.final_);
                }
                // An R2T's Data-Out over iSER (none are sent) fails the task in `place`.
                DataOutTo::Drain | DataOutTo::Fail(_) => {}
            }
        }
        drop(w);
        self.writes_changed.notify_waiters();
    }
}

impl<P: Provider + 'static> IserDatamover<P> {
    /// Put_Data: RDMA Write to the read STag and VA the initiator gave with the command. Posting
    /// never waits (the send queue is sized for the window), so this is the waiting call too.
    /// `room`: the data's place in `WritesInFlight` (none for no data), kept until the write
    /// has completed.
    pub(super) fn put_data_by_write(
        &self,
        desc: DataInDesc,
        data: Bytes,
        room: Option<tokio::sync::OwnedSemaphorePermit>,
    ) -> Result<PutDataDone, DmError> {
        let s = &self.s;
        // The data goes from where it lies (no copy): as the request's own bytes where the
        // queue pair takes them (the software RNIC: no registration, no key to look up), else
        // registered — before the lock below, as registering is a system call on rdma-core.
        let mr = if data.is_empty() || data.len() as u64 <= u64::from(s.qp.max_unregistered_payload()) {
            None
        } else {
            Some(s.pd.register_shared(data.clone(), Access::empty()).map_err(rdma("register read data"))?)
        };
        // Posted under the lock task management takes to end the task: once a task is aborted
        // (and its TMF response may be on its way) nothing more is posted for it, so the
        // initiator never sees a write to a key it has revoked.
        let mut remote = lock(&s.remote);
        let Some(rb) = remote.get(&desc.itt).and_then(|r| r.read) else { return Err(Violation::NoReadStag { itt: desc.itt }.into()) };
        if !data.is_empty() {
            // RDMA Write to (read STag, read VA + offset); the SCSI Response Send follows on
            // the same queue pair, so the data is placed before the status arrives. The write
            // is left queued: nothing waits for it (a send queue completes in order), and its
            // buffer goes back to the pool once the write has completed and the caller has
            // let go of it.
            let op = SendOp::RdmaWrite { remote_addr: rb.va.wrapping_add(u64::from(desc.offset)), rkey: rb.stag };
            match mr {
                None => {
                    let keep = Keep { mr: None, recycle: Some(data.clone()), also: None, counted: room };
                    s.post_wr_bytes(op, data, Some(keep), false)?;
                }
                Some(mr) => {
                    let sge = Sge { addr: mr.addr(), length: mr.len() as u32, lkey: mr.lkey() };
                    let keep = Keep { mr: Some(mr), recycle: Some(data), also: None, counted: room };
                    s.post_unawaited(op, SgList::from_slice(&[sge]), Some(keep), false)?;
                }
            }
        }
        // No Data-In PDUs (DataSN not consumed).
        let Some(cs) = desc.collapse_status else { return Ok(PutDataDone { pdus: 0, status_sent: false }) };
        // A status with the last data: iSER sends no Data-In (RFC 7145), so it leaves as the
        // SCSI Response Send that Send_Control would post (ExpDataSN 0, the read STag
        // invalidated where negotiated), right behind the data on the same queue pair and
        // still under the lock — the same messages on the wire, one call of the core instead
        // of two.
        let response = ScsiResponse {
            overflow: cs.overflow,
            underflow: cs.underflow,
            status: cs.status,
            itt: desc.itt,
            stat_sn: cs.stat_sn,
            exp_cmd_sn: cs.exp_cmd_sn,
            max_cmd_sn: cs.max_cmd_sn,
            residual: cs.residual,
            ..ScsiResponse::default()
        };
        let invalidate = s.response_invalidates(remote.remove(&desc.itt));
        s.send_pdu_from(IserHeader::CONTROL, &Header::ScsiResponse(response), &[], &[], None, invalidate)?;
        Ok(PutDataDone { pdus: 0, status_sent: true })
    }

    /// Room for `len` bytes of read data (see
    /// [`IserConfig::read_data_in_flight`](super::IserConfig::read_data_in_flight)), waiting
    /// in turn for it. What this side gathered is posted first: its completions may be what
    /// makes room.
    pub(super) async fn room_for_read_data(&self, len: u64) -> Result<Option<tokio::sync::OwnedSemaphorePermit>, DmError> {
        let s = &self.s;
        let w = &s.writes_in_flight;
        match w.try_take(len) {
            Ok(room) => return Ok(room),
            Err(tokio::sync::TryAcquireError::Closed) => return Err(DmError::Closed),
            Err(tokio::sync::TryAcquireError::NoPermits) => {}
        }
        s.release_sends()?;
        // Closed when the connection ends (`Shared::fail`).
        w.room.clone().acquire_many_owned(w.units_for(len)).await.map(Some).map_err(|_| DmError::Closed)
    }

    /// `try_get_data`: a write whose data all came with its command in a receive buffer of its
    /// own (see `WriteTask::whole`) gets that buffer's bytes, which go back to the receive ring
    /// when dropped (`driver::Lent`). Anything else, or anything amiss, is left to Get_Data.
    pub(super) fn lent_write_data(&self, plan: R2tPlan) -> Attempt<Result<Bytes, DmError>, R2tPlan> {
        let (itt, total_len, unsolicited_len) = (plan.itt, plan.end, plan.start);
        let mut writes = lock(&self.s.writes);
        let ready = writes.get_mut(&itt).is_some_and(|t| {
            t.whole.as_ref().is_some_and(|b| b.len() >= total_len as usize)
                && unsolicited_len <= total_len
                && matches!(t.write.settle(unsolicited_len, total_len), Ok(true))
        });
        if !ready {
            return Attempt::WouldWait(plan);
        }
        match writes.remove(&itt).and_then(|t| t.whole) {
            Some(b) => Attempt::Done(Ok(b.slice(..total_len as usize))),
            None => Attempt::WouldWait(plan),
        }
    }

    /// Get_Data: wait for the unsolicited part, then RDMA Read the rest from the write STag
    /// and VA the initiator gave with the command.
    pub(super) async fn get_data_by_read(&self, plan: R2tPlan) -> Result<TaskBuffer, DmError> {
        let s = &self.s;
        let (itt, total_len, unsolicited_len) = (plan.itt, plan.end, plan.start);
        if unsolicited_len > total_len {
            lock(&s.writes).remove(&itt);
            return Err(SequenceError::UnsolicitedBeyondLength { len: total_len }.into());
        }
        // Every byte is covered exactly once: the unsolicited part (checked complete below),
        // then the solicited range to the end (the buffer is reused, not cleared).
        // Unsolicited Data-Out arrives as Sends: wait for all of it (the caller bounds the
        // wait; the burst's end is known from its F bit).
        loop {
            let mut n = std::pin::pin!(s.writes_changed.notified());
            n.as_mut().enable();
            let state = lock(&s.writes).get_mut(&itt).map(|t| t.write.settle(unsolicited_len, total_len));
            match state {
                Some(Err(why)) => {
                    lock(&s.writes).remove(&itt);
                    return Err(why.into());
                }
                Some(Ok(true)) => break,
                Some(Ok(false)) => {}
                None if unsolicited_len > 0 => return Err(DmError::NoTask(itt)),
                None => break,
            }
            if s.closed.load(Ordering::Acquire) {
                return Err(DmError::Closed);
            }
            n.await;
        }
        let task = lock(&s.writes).remove(&itt);
        let (mut buf, whole) = task.map_or_else(|| (s.pool.take_vec(total_len as usize), None), |t| (t.buf, t.whole));
        if let Some(b) = whole {
            // All the data came with the command (nothing to fetch: `total_len` is at most the
            // immediate data, checked above), in the receive buffer the task kept: its bytes
            // as a buffer of their own (`try_get_data` takes them without this copy).
            let mut data = b.try_into_mut().unwrap_or_else(|b| BytesMut::from(&b[..]));
            data.truncate(total_len as usize);
            return Ok(TaskBuffer { data });
        }
        if buf.len() != total_len as usize {
            // The buffer held the unsolicited part; the whole transfer's memory is taken
            // only now that the core collects it.
            let mut whole = s.pool.take_dirty_vec(total_len as usize);
            let have = (unsolicited_len as usize).min(buf.len());
            whole[..have].copy_from_slice(&buf[..have]);
            s.pool.give_vec(std::mem::replace(&mut buf, whole));
        }
        if plan.count() == 0 {
            return Ok(TaskBuffer { data: riser_datamover::into_bytes_mut(buf) });
        }
        if lock(&s.remote).get(&itt).is_none_or(|r| r.write.is_none()) {
            return Err(SequenceError::NoWriteStag.into());
        }
        // RDMA Read the rest from (write STag, write VA + (offset − unsolicited)) into the
        // task buffer itself, registered as a read sink. The R2T sequence is only
        // bookkeeping here: the solicited range goes in reads as large as the provider
        // takes (not MaxBurstLength), all posted at once; the ORD paces them.
        let mr = s.pd.register(buf, Access::LOCAL_WRITE | Access::READ_SINK).map_err(rdma("register a write buffer"))?;
        let (start, end) = (plan.start, plan.end);
        let mut pending = Vec::new();
        {
            // Posted under the lock task management takes to end the task (see put_data).
            let remote = lock(&s.remote);
            let Some(wb) = remote.get(&itt).and_then(|r| r.write) else { return Err(DmError::NoTask(itt)) };
            let mut at = start;
            while at < end {
                let len = (end - at).min(MAX_RDMA_READ);
                let sge = Sge { addr: mr.addr() + u64::from(at), length: len, lkey: mr.lkey() };
                let remote_addr = wb.va.wrapping_add(u64::from(at - unsolicited_len.min(at)));
                // The sink stays registered until the read completes, even if this task is
                // aborted meanwhile (a response into a deregistered sink would end the stream).
                pending.push(s.post_queued(
                    SendOp::RdmaRead { remote_addr, rkey: wb.stag },
                    SgList::from_slice(&[sge]),
                    Some(Keep::region(mr.clone())),
                )?);
                at += len;
            }
        }
        for done in pending {
            completion(done).await?;
        }
        let data = copy_out(mr);
        Ok(TaskBuffer { data })
    }
}
