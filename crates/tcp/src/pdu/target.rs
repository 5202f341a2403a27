//! The target half: a write command's data collected in its task buffer — immediate data,
//! unsolicited Data-Out and the Data-Out each R2T solicits, every PDU checked against the
//! task's sequence — and read data sent as Data-In PDUs.

use super::{Notice, PduDatamover, Shared, WriteTask, lock};
use crate::link::LinkRx;
use bytes::{Bytes, BytesMut};
use riser_datamover::MAX_TASK_BUFFER;
use riser_datamover::{Attempt, ControlPdu, DataInDesc, DmError, DmEvent, PutDataDone, R2tPlan, SequenceError, TaskBuffer, Violation};
use riser_iscsi::session::{DataOutTo, WriteIn, WriteProgress};
use riser_iscsi::wire::{DataIn, DataOut, Header, RESERVED_TAG, ScsiCommand};
use tokio::sync::mpsc;

impl Shared {
    /// Target: a command without a write buffer of its own arrived: if its tag names a write
    /// still held here, the session rejects it (Task in progress) and its discard must leave
    /// that write alone.
    pub(super) fn note_if_duplicate(&self, itt: u32) {
        if lock(&self.writes).contains_key(&itt) {
            self.duplicates.note(itt);
        }
    }
}

impl PduDatamover {
    /// A write command with data: its immediate data read into a new task buffer, sized for
    /// the unsolicited part; the command goes up as a control PDU.
    pub(super) async fn receive_write_command(
        shared: &Shared,
        rx: &mut dyn LinkRx,
        cmd: ScsiCommand,
        ahs: Bytes,
        data_len: usize,
    ) -> Result<(), DmError> {
        let edtl = cmd.expected_data_len;
        let limits = *lock(&shared.limits);
        if edtl > MAX_TASK_BUFFER || data_len > edtl as usize {
            // No task: the core answers with CHECK CONDITION (it sees `immediate` beyond the
            // command's length, or a length beyond MAX_TASK_BUFFER); the data goes nowhere.
            shared.note_if_duplicate(cmd.itt);
            let mut scratch = vec![0u8; data_len];
            rx.read_data(&mut scratch).await?;
            shared.queue_event(DmEvent::Control(ControlPdu {
                header: Header::ScsiCommand(cmd),
                ahs,
                data: Bytes::new(),
                immediate: data_len as u32,
            }));
            return Ok(());
        }
        if !limits.immediate_data && data_len > 0 {
            return Err(Violation::ImmediateDataNotNegotiated.into());
        }
        // Every byte is written before use: Data-Out is checked to arrive in order, once. Only
        // the unsolicited part is allocated now (at most FirstBurstLength); Get_Data takes the
        // rest once the core decides to collect it (within its per-session memory budget). A
        // pooled buffer for the whole transfer is taken at once if there is one (no
        // allocation, and Get_Data copies nothing).
        let split = limits.incoming_write(edtl, data_len as u32, cmd.final_);
        let first = split.unsolicited_end;
        let mut buf = match shared.pool.take_dirty_pooled(edtl as usize) {
            Some(whole) => riser_datamover::into_bytes_mut(whole),
            None => shared.pool.take_dirty(first as usize),
        };
        rx.read_data(&mut buf[..data_len]).await?;
        let task = WriteTask { buf, write: WriteIn::new(&split, cmd.final_, limits.initial_r2t), notify: None, reading: false };
        if lock(&shared.writes).insert(cmd.itt, task).is_some() {
            return Err(Violation::TaskTagReused { itt: cmd.itt }.into());
        }
        shared.queue_event(DmEvent::Control(ControlPdu {
            header: Header::ScsiCommand(cmd),
            ahs,
            data: Bytes::new(),
            immediate: data_len as u32,
        }));
        Ok(())
    }

    /// A Data-Out: checked against its task, its data read into the task's buffer (or drained),
    /// and a waiting Get_Data told when a sequence ends.
    pub(super) async fn receive_data_out(shared: &Shared, rx: &mut dyn LinkRx, d: DataOut, len: usize) -> Result<(), DmError> {
        let len32 = len as u32;
        // Check the PDU against its task and take the task's buffer out while reading into it
        // (the lock is not held across the read); the task stays in the table meanwhile.
        let checked = {
            let mut writes = lock(&shared.writes);
            match writes.get_mut(&d.itt) {
                // An aborted or unknown task: drain the data.
                None => None,
                Some(task) => match task.write.place(&d, len32) {
                    // Within the sequence is within the buffer (sized to it, or to the whole
                    // transfer); checked again here, where the bytes are written.
                    DataOutTo::Place(p) if (p.offset as usize).saturating_add(len) > task.buf.len() => {
                        Self::fail_task(task, SequenceError::BeyondFirstBurst);
                        None
                    }
                    DataOutTo::Place(p) => {
                        task.reading = true;
                        Some((p, std::mem::take(&mut task.buf)))
                    }
                    DataOutTo::Drain => None,
                    // The PDU itself is well framed: it is drained and just this task ends
                    // (CHECK CONDITION), not the connection, so other commands are unaffected.
                    DataOutTo::Fail(e) => {
                        Self::fail_task(task, e);
                        None
                    }
                },
            }
        };
        let Some((placed, mut buf)) = checked else {
            let mut scratch = vec![0u8; len];
            return rx.read_data(&mut scratch).await;
        };
        let at = d.buffer_offset as usize;
        let read = rx.read_data(&mut buf[at..at + len]).await;
        let mut writes = lock(&shared.writes);
        let Some(task) = writes.get_mut(&d.itt) else {
            // Aborted while its data was read: the buffer goes back to the pool.
            drop(writes);
            shared.pool.give(buf);
            shared.write_read_done.notify_waiters();
            return read;
        };
        task.buf = buf;
        task.reading = false;
        shared.write_read_done.notify_waiters();
        read?;
        let notice = match task.write.accept(placed, d.final_) {
            WriteProgress::More => None,
            WriteProgress::UnsolicitedDone => Some(Notice::UnsolicitedDone),
            WriteProgress::R2tDone(_) => Some(Notice::R2tDone),
            WriteProgress::Failed(e) => Some(Notice::Failed(e)),
            WriteProgress::BurstWithoutFinal => return Err(Violation::BurstWithoutFinal.into()),
        };
        if let (Some(notice), Some(n)) = (notice, &task.notify) {
            let _ = n.send(notice);
        }
        Ok(())
    }

    /// The task's write failed with `e` (its sequence says why): whoever waits is told.
    fn fail_task(task: &mut WriteTask, e: SequenceError) {
        task.write.fail(e);
        if let (Some(n), Some(e)) = (&task.notify, task.write.failed()) {
            let _ = n.send(Notice::Failed(e));
        }
    }

    /// Get_Data's start, under the table's lock: check the unsolicited part, give the task its
    /// whole buffer, register `tx` for its notices. `Ok(false)`: a Data-Out is being read into
    /// the buffer; wait for `write_read_done` and try again.
    fn prepare_collection(
        &self,
        itt: u32,
        total_len: u32,
        unsolicited_len: u32,
        tx: &mpsc::UnboundedSender<Notice>,
    ) -> Result<bool, DmError> {
        let mut writes = lock(&self.shared.writes);
        let task = writes.get_mut(&itt).ok_or(DmError::NoTask(itt))?;
        if task.reading {
            return Ok(false);
        }
        // Every byte is covered exactly once — the unsolicited part, then the solicited
        // range — and the buffer is reused, not cleared: unsolicited data that ended
        // short of what the core counts on fails the task (a gap would be written).
        if let Err(e) = task.write.settle(unsolicited_len, total_len) {
            writes.remove(&itt);
            return Err(e.into());
        }
        // The buffer holds the unsolicited part so far; the whole transfer's memory is
        // taken only now, when the core has decided to collect it.
        if task.buf.len() != total_len as usize {
            let mut whole = self.shared.pool.take_dirty(total_len as usize);
            let have = task.write.unsolicited().received() as usize;
            whole[..have].copy_from_slice(&task.buf[..have]);
            let old = std::mem::replace(&mut task.buf, whole);
            self.shared.pool.give(old);
        }
        task.notify = Some(tx.clone());
        Ok(true)
    }

    /// Get_Data's end: the task out of the table with its buffer, or `None` while a Data-Out is
    /// being read into the buffer.
    fn finish_collection(&self, itt: u32) -> Result<Option<BytesMut>, DmError> {
        let mut writes = lock(&self.shared.writes);
        match writes.get(&itt) {
            None => Err(DmError::NoTask(itt)),
            Some(t) if t.reading => Ok(None),
            Some(_) => Ok(writes.remove(&itt).map(|t| t.buf)),
        }
    }

    /// Put_Data: read data as Data-In PDUs within the negotiated segment and burst sizes, the
    /// status collapsed into the last one when the core asks (riser-iscsi's segmentation,
    /// [`TransferLimits::data_in`](riser_iscsi::session::TransferLimits::data_in)).
    pub(super) async fn send_data_in(&self, desc: DataInDesc, data: Bytes) -> Result<PutDataDone, DmError> {
        let limits = *lock(&self.shared.limits);
        let mut done = PutDataDone::default();
        for (h, range) in limits.data_in(Self::first_data_in(&desc), data.len() as u32) {
            done.status_sent |= h.status_present;
            self.send(Header::DataIn(h), &[], data.slice(range)).await?;
            done.pdus += 1;
        }
        Ok(done)
    }

    /// [`send_data_in`](Self::send_data_in) without waiting, for data that fits one Data-In
    /// (the common case: a read no larger than the initiator's MaxRecvDataSegmentLength).
    pub(super) fn try_send_data_in(&self, desc: DataInDesc, data: Bytes) -> Attempt<Result<PutDataDone, DmError>, (DataInDesc, Bytes)> {
        let limits = *lock(&self.shared.limits);
        let mut pdus = limits.data_in(Self::first_data_in(&desc), data.len() as u32);
        let (Some((h, range)), None) = (pdus.next(), pdus.next()) else { return Attempt::WouldWait((desc, data)) };
        debug_assert_eq!(range, 0..data.len());
        match self.try_send(&Header::DataIn(h), &[], data) {
            Attempt::Done(r) => Attempt::Done(r.map(|()| PutDataDone { pdus: 1, status_sent: h.status_present })),
            Attempt::WouldWait(data) => Attempt::WouldWait((desc, data)),
        }
    }

    /// The first Data-In of a Put_Data: the task, the offset, and the status it may carry.
    fn first_data_in(desc: &DataInDesc) -> DataIn {
        let mut first = DataIn {
            lun: desc.lun,
            itt: desc.itt,
            ttt: RESERVED_TAG,
            data_sn: desc.data_sn,
            buffer_offset: desc.offset,
            ..DataIn::default()
        };
        if let Some(s) = desc.collapse_status {
            first.status_present = true;
            first.status = s.status;
            first.underflow = s.underflow;
            first.overflow = s.overflow;
            first.residual = s.residual;
            first.stat_sn = s.stat_sn;
            first.exp_cmd_sn = s.exp_cmd_sn;
            first.max_cmd_sn = s.max_cmd_sn;
        }
        first
    }

    /// Get_Data: the unsolicited part awaited, then the rest solicited one R2T at a time; the
    /// task's whole buffer once every byte is in.
    pub(super) async fn collect_write_data(&self, plan: R2tPlan) -> Result<TaskBuffer, DmError> {
        let itt = plan.itt;
        let (total_len, unsolicited_len) = (plan.end, plan.start);
        let (tx, mut rx) = mpsc::unbounded_channel();
        loop {
            // The buffer is replaced below: wait while a Data-Out is being read into it.
            let read_done = self.shared.write_read_done.notified();
            let mut read_done = std::pin::pin!(read_done);
            read_done.as_mut().enable();
            if self.prepare_collection(itt, total_len, unsolicited_len, &tx)? {
                break;
            }
            read_done.await;
        }
        // The task holds the only sender now: its removal (an abort) ends the wait below.
        drop(tx);
        let mut unsolicited_pending = {
            let writes = lock(&self.shared.writes);
            writes.get(&itt).is_some_and(|t| !t.write.unsolicited().done())
        };
        // One R2T at a time (MaxOutstandingR2T=1), each made when it is sent.
        let count = plan.count();
        let (mut next, mut outstanding, mut finished) = (0u32, false, 0u32);
        while finished < count || unsolicited_pending {
            if !outstanding && let Some(r) = plan.nth(next) {
                let h = {
                    let mut writes = lock(&self.shared.writes);
                    let Some(task) = writes.get_mut(&itt) else { return Err(DmError::NoTask(itt)) };
                    task.write.solicit(&r)
                };
                self.send(Header::R2t(h), &[], Bytes::new()).await?;
                next += 1;
                outstanding = true;
            }
            match rx.recv().await {
                Some(Notice::UnsolicitedDone) => unsolicited_pending = false,
                Some(Notice::R2tDone) => {
                    outstanding = false;
                    finished += 1;
                }
                Some(Notice::Failed(e)) => {
                    lock(&self.shared.writes).remove(&itt);
                    return Err(e.into());
                }
                None => return Err(DmError::NoTask(itt)),
            }
        }
        // Every byte is in; a stray Data-Out may still be reading into the buffer: the
        // buffer is taken only once it is back.
        loop {
            let read_done = self.shared.write_read_done.notified();
            let mut read_done = std::pin::pin!(read_done);
            read_done.as_mut().enable();
            if let Some(buf) = self.finish_collection(itt)? {
                return Ok(TaskBuffer { data: buf });
            }
            read_done.await;
        }
    }
}
