//! The initiator half: a SCSI command sent with its immediate data and unsolicited Data-Out,
//! the R2Ts served from its write data, and Data-In placed in its read buffer.

use super::{OutWrite, PduDatamover, ReadTask, Shared, lock};
use crate::link::LinkRx;
use bytes::{Bytes, BytesMut};
use riser_datamover::{Attempt, CommandArgs, ControlPdu, DmError, DmEvent, Violation};
use riser_iscsi::wire::{DataIn, DataOut, Header, R2t, RESERVED_TAG, ScsiCommand};
use tokio::sync::mpsc;

impl PduDatamover {
    /// Initiator: send the Data-Out PDUs each R2T asks for, from the command's write buffer.
    pub(super) async fn serve_r2ts(self, mut q: mpsc::UnboundedReceiver<R2t>) {
        while let Some(r) = q.recv().await {
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
            lock(&self.shared.reads).insert(cmd.itt, ReadTask { buf: self.shared.pool.take(read_len as usize) });
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
            lock(&self.shared.out_writes).insert(cmd.itt, OutWrite { lun: cmd.lun, data: data.clone() });
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
            lock(&self.shared.reads).insert(cmd.itt, ReadTask { buf: self.shared.pool.take(read_len as usize) });
        }
        cmd.final_ = true;
        Attempt::Done(self.queue(tx, &Header::ScsiCommand(cmd), &ahs, Bytes::new()))
    }

    pub(super) fn take_read_buffer(&self, itt: u32) -> Option<BytesMut> {
        lock(&self.shared.out_writes).remove(&itt);
        lock(&self.shared.reads).remove(&itt).map(|r| r.buf)
    }

    /// Data-In: its data placed in the command's read buffer (or drained if the command is
    /// gone); with status, the PDU goes up as the command's end.
    pub(super) async fn receive_data_in(shared: &Shared, rx: &mut dyn LinkRx, d: DataIn, len: usize) -> Result<(), DmError> {
        let removed = lock(&shared.reads).remove(&d.itt);
        match removed {
            Some(mut t) => {
                let at = d.buffer_offset as usize;
                let r = match at.checked_add(len).filter(|e| *e <= t.buf.len()) {
                    Some(end) => rx.read_data(&mut t.buf[at..end]).await,
                    None => Err(Violation::DataInBeyondBuffer { itt: d.itt }.into()),
                };
                lock(&shared.reads).insert(d.itt, t);
                r?;
            }
            None => {
                let mut scratch = vec![0u8; len];
                rx.read_data(&mut scratch).await?;
            }
        }
        if d.status_present {
            let _ = shared.events_tx.send(DmEvent::Control(ControlPdu::new(Header::DataIn(d), Bytes::new())));
        }
        Ok(())
    }
}
