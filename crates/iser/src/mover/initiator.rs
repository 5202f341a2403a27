//! The initiator half: a SCSI command sent with fresh registrations for its buffers (and its
//! unsolicited Data-Out), the read data taken back when it ends, and remote invalidations
//! checked against the task they arrive with.

use super::{InitTask, IserDatamover, Mr, Shared, copy_out, lock, rdma};
use crate::header::{IserHeader, RemoteBuf};
use bytes::{Bytes, BytesMut};
use riser_datamover::{Datamover, DmError, Violation};
use riser_iscsi::wire::{DataOut, Header, RESERVED_TAG, ScsiCommand};
use riser_verbs::{Access, MemoryRegion, ProtectionDomain, Provider, Sge};
use std::sync::Arc;
use std::sync::atomic::Ordering;

impl<P: Provider + 'static> Shared<P> {
    /// A received Send that invalidated key `k` (initiator): only with remote invalidation
    /// negotiated, and only a key of the task it came with (`itt`, read from the PDU's header
    /// before it is parsed; `None` when the message is too short to hold one).
    pub(super) fn check_invalidation(&self, itt: Option<u32>, invalidated: Option<u32>) -> Result<(), DmError> {
        if let Some(k) = invalidated {
            if !self.send_inv.load(Ordering::Acquire) {
                return Err(Violation::UnexpectedInvalidation.into());
            }
            let itt = itt.unwrap_or(RESERVED_TAG);
            let ok = lock(&self.tasks).get(&itt).is_some_and(|t| [&t.read, &t.write].into_iter().flatten().any(|mr| mr.rkey() == k));
            if !ok {
                return Err(Violation::ForeignInvalidation { key: k, itt }.into());
            }
        }
        Ok(())
    }
}

/// Immediate data up to this size is copied behind the command's headers; larger, it is sent
/// from the caller's bytes (a copy of 8 KiB costs less than a registration on rdma-core).
const IMMEDIATE_COPY_MAX: usize = 8 << 10;

/// The most data (immediate and unsolicited) a command gathered with others may carry: 64 KiB,
/// a whole first burst at the default FirstBurstLength, so every write gathers at the
/// defaults. Sending each command with more than 8 KiB at once (so the target would start on
/// its data sooner) cost a system call per command; gathered, iSER writes on the 2-core
/// development VM went from 0.85× to 1.07× TCP's rate with four sessions of 64 KiB (1.01× to
/// 1.03× with one), and 16 KiB writes with four sessions became 1.26× as fast.
const GATHERED_DATA_MAX: usize = 64 << 10;

/// Reads of up to this many bytes keep their regions (see `READ_REGIONS_KEPT`).
const READ_REGION_MAX: usize = 64 << 10;

/// Regions of ended reads kept per connection, on a provider whose regions are the buffers
/// themselves (the software RNIC): a read takes the oldest of its length, with a fresh buffer
/// swapped in when the last read ended, and re-keys it, instead of registering one and
/// deregistering it after (~550 of the initiator's 13.1k instructions per 4 KiB read,
/// callgrind). At most 32 regions of at most 64 KiB each (the oldest let go for a newer one).
const READ_REGIONS_KEPT: usize = 32;

/// Reads a kept region serves at most before it is let go: its STag index then goes back to
/// the domain's free indexes, oldest first, so an (index, key) pair comes back no sooner than
/// with a registration per read (the 8-bit key goes round only after 256 reads on the index,
/// with the domain's other indexes in between), and a late write of an abandoned command (a
/// timed-out one whose target still writes) finds no later read's buffer under its STag.
const READ_REGION_USES: u8 = 16;

impl<P: Provider + 'static> Shared<P> {
    /// A region for a read of `len` bytes, for the target's writes: a kept one of that length,
    /// re-keyed, else a new registration of a pooled buffer (as it is: what the target's writes
    /// do not reach reads as zeros, never as an earlier command's bytes). With how many reads
    /// it served before.
    fn read_region(&self, len: usize) -> Result<(Arc<Mr<P>>, u8), DmError> {
        if len <= READ_REGION_MAX {
            let kept = {
                let mut kept = lock(&self.read_regions);
                kept.iter().position(|(mr, _)| mr.len() == len).and_then(|i| kept.remove(i))
            };
            if let Some((mr, uses)) = kept
                && mr.rekey().is_ok()
            {
                return Ok((mr, uses));
            }
        }
        let mr = self
            .pd
            .register_for_peer_writes(self.pool.take_dirty_vec(len), Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .map_err(rdma("register a read buffer"))?;
        Ok((mr, 0))
    }

    /// The data of an ended read (its region invalidated): its buffer itself, the region kept
    /// with a fresh buffer in its place when it can be (see `READ_REGIONS_KEPT`), else let go.
    fn read_data(&self, mr: Arc<Mr<P>>, uses: u8) -> BytesMut {
        let len = mr.len();
        if len <= READ_REGION_MAX && uses + 1 < READ_REGION_USES && self.pd.registers_in_place() {
            // A pooled buffer of no more room than a kept region may hold.
            let fresh = self.pool.take_dirty_vec(len);
            let fresh = if fresh.capacity() <= READ_REGION_MAX {
                fresh
            } else {
                self.pool.give_vec(fresh);
                vec![0; len]
            };
            match self.pd.swap_for_peer_writes(&mr, fresh) {
                Ok(data) => {
                    let oldest = {
                        let mut kept = lock(&self.read_regions);
                        kept.push_back((mr, uses + 1));
                        (kept.len() > READ_REGIONS_KEPT).then(|| kept.pop_front()).flatten()
                    };
                    if let Some((old, _)) = oldest {
                        self.let_go(old);
                    }
                    return riser_datamover::into_bytes_mut(data);
                }
                Err(fresh) => self.pool.give_vec(fresh),
            }
        }
        copy_out(mr)
    }

    /// A kept region deregistered, its buffer back to the pool.
    fn let_go(&self, mr: Arc<Mr<P>>) {
        if let Ok(buf) = mr.into_buffer() {
            self.pool.give_vec(buf);
        }
    }

    /// The kept regions let go (the connection's resources end).
    pub(super) fn drop_read_regions(&self) {
        let kept = std::mem::take(&mut *lock(&self.read_regions));
        kept.into_iter().for_each(|(mr, _)| self.let_go(mr));
    }
}

impl<P: Provider + 'static> IserDatamover<P> {
    /// Send_Control for a SCSI Command: its buffers registered (a new key per command and
    /// direction), immediate data in the command, unsolicited Data-Out after it as negotiated.
    /// Posting never waits (the send queue is sized for the window).
    pub(super) fn send_command_with_buffers(
        &self,
        mut cmd: ScsiCommand,
        ahs: Bytes,
        read_len: u32,
        write: Option<Bytes>,
    ) -> Result<(), DmError> {
        let s = &self.s;
        let l = *lock(&s.limits);
        let mut ih = IserHeader::CONTROL;
        let mut task = InitTask::<P> { read: None, write: None, read_uses: 0 };
        if read_len > 0 {
            // A new key per command and direction: a kept region re-keyed or a fresh
            // registration (see `read_region`).
            let (mr, uses) = s.read_region(read_len as usize)?;
            ih.read = Some(RemoteBuf { stag: mr.rkey(), va: mr.addr() });
            task.read = Some(mr);
            task.read_uses = uses;
        }
        let mut immediate = Bytes::new();
        let mut by_ref = None;
        let mut unsolicited = Bytes::new();
        if let Some(data) = write.filter(|d| !d.is_empty()) {
            let len = data.len();
            let split = l.outgoing_write(len as u32, s.cfg.unsolicited_data_out);
            let (imm, unsolicited_end) = (split.immediate as usize, split.unsolicited_end as usize);
            if unsolicited_end < len {
                // The caller's bytes themselves, registered read-only for the target's RDMA Read.
                let mr = s.pd.register_shared(data.clone(), Access::REMOTE_READ).map_err(rdma("register write data"))?;
                // The write VA names the first byte not sent unsolicited.
                ih.write = Some(RemoteBuf { stag: mr.rkey(), va: mr.addr() + unsolicited_end as u64 });
                task.write = Some(mr);
            }
            if imm > IMMEDIATE_COPY_MAX {
                // Large immediate data (a target receiving large segments) leaves from the
                // caller's bytes, registered for this Send (or for the RDMA Read already).
                let mr = match &task.write {
                    Some(mr) => mr.clone(),
                    None => s.pd.register_shared(data.clone(), Access::empty()).map_err(rdma("register immediate data"))?,
                };
                let sge = Sge { addr: mr.addr(), length: imm as u32, lkey: mr.lkey() };
                by_ref = Some((mr, sge));
            } else {
                immediate = data.slice(..imm);
            }
            unsolicited = data.slice(imm..unsolicited_end);
        }
        // F: no unsolicited Data-Out follows.
        cmd.final_ = unsolicited.is_empty();
        let imm_len = immediate.len() + by_ref.as_ref().map_or(0, |(_, sge)| sge.length as usize);
        let (itt, lun, exp_stat_sn) = (cmd.itt, cmd.lun, cmd.exp_stat_sn);
        lock(&s.tasks).insert(itt, task);
        // A command with at most `GATHERED_DATA_MAX` of data waits for the flusher, with the
        // commands of the caller's other tasks (see `COMMANDS_GATHERED_MAX`); one with more
        // leaves at once (with what was gathered before it), so the target starts on its data
        // while the next is made.
        let gathered = imm_len + unsolicited.len() <= GATHERED_DATA_MAX;
        if gathered {
            s.gather_commands();
        }
        let mut r = s.send_pdu_from(ih, &Header::ScsiCommand(cmd), &ahs, &[&immediate], by_ref, None);
        // Unsolicited Data-Out PDUs as Sends, each within the target's receive size.
        let first = DataOut { lun, itt, ttt: RESERVED_TAG, exp_stat_sn, ..DataOut::default() };
        let at = imm_len as u32;
        for (d, range) in l.data_out(first, at..at + unsolicited.len() as u32) {
            if r.is_err() {
                break;
            }
            let piece = &unsolicited[range.start - imm_len..range.end - imm_len];
            r = s.send_pdu_from(IserHeader::CONTROL, &Header::DataOut(d), &[], &[piece], None, None);
        }
        if r.is_ok() {
            r = if gathered { s.command_gathered() } else { s.release_sends() };
        }
        if r.is_err() {
            self.deallocate_task_resources(itt);
        }
        r
    }

    /// The read data of an ended command; its keys revoked.
    pub(super) fn take_read_buffer(&self, itt: u32) -> Option<BytesMut> {
        let t = lock(&self.s.tasks).remove(&itt)?;
        if let Some(w) = t.write {
            w.invalidate();
        }
        let r = t.read?;
        r.invalidate();
        Some(self.s.read_data(r, t.read_uses))
    }
}
