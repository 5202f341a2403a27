//! The initiator half: a SCSI command sent with its immediate data and unsolicited Data-Out,
//! the R2Ts served from its write data, and Data-In placed in its read buffer.

use super::{OutWrite, PduDatamover, ReadTask, Shared, lock};
use crate::link::LinkRx;
use bytes::{Bytes, BytesMut};
use riser_datamover::{Attempt, CommandArgs, ControlPdu, DmError, DmEvent, Violation};
use riser_iscsi::session::{R2tIn, ReadIn, Residual};
use riser_iscsi::wire::{DataIn, DataOut, Header, R2t, RESERVED_TAG, ScsiCommand, ScsiResponse};
use std::sync::atomic::Ordering;
use tokio::sync::mpsc;

impl PduDatamover {
    /// Initiator: send the Data-Out PDUs each R2T asks for, from the command's write buffer.
    pub(super) async fn serve_r2ts(self, mut q: mpsc::UnboundedReceiver<R2t>) {
        while let Some(r) = q.recv().await {
            self.shared.r2t_backlog.take();
            // Checked on arrival (`check_r2t`): within the write.
            let data = lock(&self.shared.out_writes).get(&r.itt).map(|w| (w.lun, w.data.clone()));
            let Some((lun, data)) = data else { continue };
            let end = (r.buffer_offset as usize).saturating_add(r.desired_len as usize).min(data.len());
            let start = (r.buffer_offset as usize).min(end);
            if self.send_data_out(r.itt, lun, r.ttt, &data, start, end).await.is_err() {
                return;
            }
        }
    }

    /// Send `data[start..end]` as Data-Out PDUs no larger than the target's receive limit,
    /// DataSN from 0, F on the last (riser-iscsi's [`TransferLimits::data_out`](riser_iscsi::session::TransferLimits::data_out)).
    async fn send_data_out(
        &self,
        itt: u32,
        lun: riser_scsi::lun::Lun,
        ttt: u32,
        data: &Bytes,
        start: usize,
        end: usize,
    ) -> Result<(), DmError> {
        let limits = *lock(&self.shared.limits);
        let first = DataOut { lun, itt, ttt, ..DataOut::default() };
        for (h, range) in limits.data_out(first, start as u32..end as u32) {
            self.send(Header::DataOut(h), &[], data.slice(range)).await?;
        }
        Ok(())
    }

    /// Initiator: Send_Control for a SCSI Command with its buffers. Immediate data rides in the
    /// command PDU and unsolicited Data-Out follows as negotiated; solicited data goes out as
    /// the target's R2Ts arrive; Data-In lands in a read buffer of `read_len` bytes, handed out
    /// by [`Datamover::take_read_data`](riser_datamover::Datamover::take_read_data) when the command ends.
    pub async fn send_scsi_command(&self, mut cmd: ScsiCommand, ahs: Bytes, read_len: u32, write: Option<Bytes>) -> Result<(), DmError> {
        if read_len > 0 {
            let bidi = write.as_ref().is_some_and(|d| !d.is_empty());
            lock(&self.shared.reads).insert(cmd.itt, self.read_task(read_len, bidi));
        }
        let Some(data) = write.filter(|d| !d.is_empty()) else {
            cmd.final_ = true;
            return self.send(Header::ScsiCommand(cmd), &ahs, Bytes::new()).await;
        };
        let len = data.len();
        let split = lock(&self.shared.limits).outgoing_write(u32::try_from(len).unwrap_or(u32::MAX), true);
        let (immediate, unsolicited_end) = (split.immediate as usize, split.unsolicited_end as usize);
        cmd.final_ = split.command_is_final();
        if unsolicited_end < len {
            let r2ts = R2tIn::new(len as u32);
            lock(&self.shared.out_writes).insert(cmd.itt, OutWrite { lun: cmd.lun, data: data.clone(), r2ts });
        }
        self.send(Header::ScsiCommand(cmd), &ahs, data.slice(..immediate)).await?;
        if unsolicited_end > immediate {
            self.send_data_out(cmd.itt, cmd.lun, RESERVED_TAG, &data, immediate, unsolicited_end).await?;
        }
        Ok(())
    }

    /// [`send_scsi_command`](Self::send_scsi_command) without waiting, for a command without
    /// write data (most reads): its read buffer registered and the command queued to leave
    /// with the flusher. `WouldWait` leaves nothing registered.
    pub(super) fn try_send_scsi_command(
        &self,
        mut cmd: ScsiCommand,
        ahs: Bytes,
        read_len: u32,
        write: Option<Bytes>,
    ) -> Attempt<Result<(), DmError>, CommandArgs> {
        if write.as_ref().is_some_and(|d| !d.is_empty()) {
            return Attempt::WouldWait(CommandArgs { cmd, ahs, read_len, write });
        }
        let Some(tx) = self.send_half_now(ahs.len()) else { return Attempt::WouldWait(CommandArgs { cmd, ahs, read_len, write }) };
        // Registered before it can leave: its Data-In may come back at once.
        if read_len > 0 {
            lock(&self.shared.reads).insert(cmd.itt, self.read_task(read_len, false));
        }
        cmd.final_ = true;
        Attempt::Done(self.queue(tx, &Header::ScsiCommand(cmd), &ahs, Bytes::new()))
    }

    pub(super) fn take_read_buffer(&self, itt: u32) -> Option<BytesMut> {
        lock(&self.shared.out_writes).remove(&itt);
        let mut r = lock(&self.shared.reads).remove(&itt)?;
        if r.read.in_order() {
            // Taken as it was: what no Data-In wrote (a short or failed read) is zeroed now,
            // never earlier data of the pool's.
            let received = (r.read.received() as usize).min(r.buf.len());
            r.buf[received..].fill(0);
        }
        Some(r.buf)
    }

    /// A read's buffer and its Data-In checks. With Data-In in order, what arrived is the
    /// buffer's front: it is taken as it was, and the rest zeroed when it is handed out (see
    /// `take_read_buffer`; a memset of every read's whole buffer spared). Else zeroed here: a
    /// buffer handed out after a failed status may be partly unwritten.
    fn read_task(&self, read_len: u32, bidi: bool) -> ReadTask {
        let in_order = self.shared.data_in_order.load(Ordering::Relaxed);
        let len = read_len as usize;
        let buf = if in_order { self.shared.pool.take_dirty(len) } else { self.shared.pool.take(len) };
        ReadTask { buf, read: ReadIn::new(read_len, in_order), bidi }
    }

    /// An R2T arrived: it must be the write's next, ask for data, and stay within the write
    /// (riser-iscsi's `R2tIn`); a bidirectional command's R2Ts share its Data-In numbering.
    /// `false`: an R2T for no write held here (one with no solicited data, or ended), which
    /// has nothing to answer.
    pub(super) fn check_r2t(shared: &Shared, r: &R2t) -> Result<bool, DmError> {
        let mut writes = lock(&shared.out_writes);
        let Some(w) = writes.get_mut(&r.itt) else { return Ok(false) };
        let mut reads = lock(&shared.reads);
        let read = reads.get_mut(&r.itt).map(|t| &mut t.read);
        let served = w.r2ts.serve(r, read.as_ref().map(|t| t.next_sn()));
        if let (Ok(_), Some(read)) = (&served, read) {
            read.r2t_numbered();
        }
        served.map(|_| true).map_err(|error| Violation::TaskData { itt: r.itt, error }.into())
    }

    /// Data-In: checked (riser-iscsi's `ReadIn`), its data placed in the command's read buffer
    /// (or drained if the command is gone); with status, the PDU goes up as the command's end
    /// once the status is known to cover only data that arrived.
    pub(super) async fn receive_data_in(shared: &Shared, rx: &mut dyn LinkRx, d: DataIn, len: usize) -> Result<(), DmError> {
        // The task stays in the table while its data is read (the lock is not held across the
        // read), its buffer taken out: a task forgotten meanwhile (aborted, timed out: its data
        // taken back) stays forgotten, and the buffer is dropped.
        let placed =
            lock(&shared.reads).get_mut(&d.itt).map(|t| t.read.place(&d, len as u32).map(|range| (range, std::mem::take(&mut t.buf))));
        match placed {
            Some(Ok((range, mut buf))) => {
                let r = rx.read_data(&mut buf[range]).await;
                let mut reads = lock(&shared.reads);
                let settled = match reads.get_mut(&d.itt) {
                    // Only the slot this read emptied (never another task's).
                    Some(t) if t.buf.is_empty() => {
                        t.buf = buf;
                        if r.is_ok() {
                            t.read.accept(len as u32);
                        }
                        (d.status_present && !t.bidi)
                            .then(|| t.read.settle(d.status, Residual::from_flags(d.underflow, d.overflow, d.residual)))
                    }
                    _ => None,
                };
                drop(reads);
                r?;
                if let Some(Err(error)) = settled {
                    return Err(Violation::TaskData { itt: d.itt, error }.into());
                }
            }
            Some(Err(error)) => return Err(Violation::TaskData { itt: d.itt, error }.into()),
            None => {
                let mut scratch = vec![0u8; len];
                rx.read_data(&mut scratch).await?;
            }
        }
        if d.status_present {
            shared.queue_event(DmEvent::Control(ControlPdu::new(Header::DataIn(d), Bytes::new())));
        }
        Ok(())
    }

    /// A SCSI Response for a read: its status may vouch only for data that arrived. Only a
    /// response whose Response code is "Command Completed at Target" has a status at all
    /// (§11.4.3). A bidirectional command's read is not settled: the initiator announces no
    /// Bidirectional Read Expected Data Transfer Length, so the target's read residual says
    /// nothing about what it owed (its Data-In are still checked as they arrive).
    pub(super) fn check_response(shared: &Shared, r: &ScsiResponse) -> Result<(), DmError> {
        if r.response != 0 {
            return Ok(());
        }
        let reads = lock(&shared.reads);
        let Some(t) = reads.get(&r.itt).filter(|t| !t.bidi) else { return Ok(()) };
        t.read
            .settle(r.status, Residual::from_flags(r.underflow, r.overflow, r.residual))
            .map_err(|error| Violation::TaskData { itt: r.itt, error }.into())
    }
}
