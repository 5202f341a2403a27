//! The queue pair at work: receives posted and reposted, send-queue requests posted (most of
//! them unsignaled) and their completions awaited, the completion driver, and the receive path
//! that handles each received Send in place.

use super::{
    GATHER_BYTES_MAX, InitTask, IserConfig, IserDatamover, Keep, Mr, Post, Recv, Remote, Shared, Unsignaled, Waiter, lock, rdma,
    signal_interval,
};
use crate::header::{ISER_HDR_LEN, ISER_HEADERS_LEN, IserHeader, IserOpcode, RFC5046_HDR_LEN};
use bytes::{Bytes, BytesMut};
use riser_datamover::{ControlPdu, DmError, DmEvent, Terminated, Violation};
use riser_iscsi::keys::Role;
use riser_iscsi::wire::{BHS_LEN, Bhs, DecodeError, Header, Pdu, PduLayout, Reaction};
use riser_verbs::{
    Access, CompletionQueue, MemoryRegion, ProtectionDomain, Provider, QueuePair, RecvWr, SendOp, SendWr, SgList, Sge, Wc, WcOpcode,
    WcStatus,
};
use std::sync::atomic::Ordering;
use std::sync::{Arc, MutexGuard};
use std::time::Duration;
use tokio::sync::oneshot;
use tracing::warn;

/// A received message's data segment, in a receive buffer of its own (see [`Recv`]).
enum Tail<'a> {
    /// Read where it lies.
    Borrowed(&'a [u8]),
    /// The buffer taken out of its region: a task may keep it (`Bytes::slice_ref`).
    Owned(&'a Bytes),
}

impl Tail<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            Self::Borrowed(b) => b,
            Self::Owned(b) => b,
        }
    }
}

/// A received data segment that fills a quarter of its receive buffer, and is at least this
/// long, is handed on with it (see [`Lent`]), as one filling half of it is whatever its length:
/// copying it costs more than that. Four sessions writing 64 KiB at QD 8 into 256 KiB receives,
/// before: the copy, and the zeroing of buffers that came back short, took a fifth of the
/// target's CPU time. The quarter bounds what a write holds: at most four times its data.
const HAND_ON_MIN: usize = 32 << 10;

/// A receive buffer handed on with the data segment at its start: a write's immediate data
/// becomes its task's data (`Datamover::try_get_data`), nothing copied. When the last `Bytes` of
/// it is dropped (the write done), the buffer goes back whole to its connection's spares and is
/// posted again as it is: a buffer given back as a task buffer is only as long as its data, and
/// its tail would have been zeroed again before it could take a receive.
struct Lent {
    buf: Vec<u8>,
    len: usize,
    home: Arc<std::sync::Mutex<Vec<Vec<u8>>>>,
}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // Kept up to as many bytes as the connection's buffer pool keeps; beyond that, freed.
        let mut spares = lock(&self.home);
        if (spares.len() + 1) * self.buf.len() <= riser_datamover::POOL_MAX_BYTES {
            spares.push(std::mem::take(&mut self.buf));
        }
    }
}

/// Bytes of a receive buffer as bytes of their own (the buffer is posted again); none, mostly
/// (an AHS, a command's or a response's data segment), without a call.
fn owned(b: &[u8]) -> Bytes {
    if b.is_empty() { Bytes::new() } else { Bytes::copy_from_slice(b) }
}

/// A PDU from its BHS and its data segment apart (no AHS: the caller checked), with the
/// checks `Pdu::parse_limited` makes.
fn parts<'a>(bhs: &'a [u8], data: &'a [u8], max_data: u32) -> Result<Pdu<&'a [u8]>, DecodeError> {
    let b = Bhs::new_checked(bhs)?;
    let layout = PduLayout::of(&b, max_data)?;
    if layout.data_len != data.len() {
        return Err(DecodeError::Truncated { need: layout.data_offset() + layout.data_len, have: BHS_LEN + data.len() });
    }
    Ok(Pdu { header: Header::parse(&b)?, ahs: &bhs[..0], data })
}

impl<P: Provider + 'static> Shared<P> {
    /// Post one receive: `reuse` again, fresh buffers for what it lacks (with
    /// `split_recv`, a data buffer handed on with its message).
    pub(super) fn post_recv(&self, reuse: Option<Recv<Mr<P>>>) -> Result<(), riser_verbs::Error> {
        let (head, data) = match reuse {
            Some(r) => (Some(r.head), r.data),
            None => (None, None),
        };
        let head = match head {
            Some(h) => h,
            None => self.pd.register(vec![0u8; if self.split_recv { ISER_HEADERS_LEN } else { self.recv_size }], Access::LOCAL_WRITE)?,
        };
        let data = match (self.split_recv, data) {
            (false, _) => None,
            (true, Some(d)) => Some(d),
            // Nothing beyond what a message placed is ever read: a buffer back from a task (see
            // `Lent`), else a pooled one, as it is.
            (true, None) => {
                let len = self.recv_size - ISER_HEADERS_LEN;
                let spare = lock(&self.recv_spares).pop().filter(|b| b.len() == len);
                Some(self.pd.register(spare.unwrap_or_else(|| self.pool.take_dirty_vec(len)), Access::LOCAL_WRITE)?)
            }
        };
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        let mut sg_list = SgList::from_slice(&[Sge { addr: head.addr(), length: head.len() as u32, lkey: head.lkey() }]);
        if let Some(d) = &data {
            sg_list.push(Sge { addr: d.addr(), length: d.len() as u32, lkey: d.lkey() });
        }
        lock(&self.recvs).insert(wr_id, Recv { head, data });
        self.qp.post_recv(RecvWr { wr_id, sg_list }).inspect_err(|_| {
            lock(&self.recvs).remove(&wr_id);
        })
    }

    /// Full-feature receives: posted once, before the final login PDU leaves, so MaxCmdSN
    /// never opens beyond posted receives.
    pub(super) fn post_ff_recvs(&self) -> Result<(), DmError> {
        if self.ff_posted.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let have = lock(&self.recvs).len() as u32;
        for _ in have..self.cfg.recv_depth {
            self.post_recv(None).map_err(rdma("post a receive"))?;
        }
        Ok(())
    }

    /// Queue an event for the iSCSI layer ([`Datamover::next_event`]), counted in the backlog.
    pub(super) fn queue_event(&self, e: DmEvent) {
        self.backlog.queue(|| self.events_tx.send(e).is_ok());
    }

    /// Whether the iSCSI layer has room for another received PDU. A Send cannot be made to
    /// wait, so a peer that sends beyond the bound (see [`riser_datamover::Backlog`]) breaks
    /// the rules, and its connection ends before anything more is taken for it: an initiator
    /// beyond the command window and a few immediate PDUs while the session is busy; a target
    /// beyond the answers to what its initiator has outstanding — no more than its receives
    /// (`recv_depth`, see `allocate_connection_resources`) — and a few PDUs of its own.
    fn room_for_received(&self) -> Result<(), DmError> {
        if self.backlog.has_room() {
            return Ok(());
        }
        Err(Violation::Backlog { limit: u32::try_from(self.backlog.limit()).unwrap_or(u32::MAX) }.into())
    }

    pub(super) fn fail(&self, why: DmError) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            warn!("iSER connection ended: {why}");
            self.queue_event(DmEvent::Terminated(Terminated::Error(why)));
        }
        self.qp.disconnect();
        self.writes_changed.notify_waiters();
        self.writes_in_flight.room.close();
    }

    pub(super) async fn drive(self: Arc<Self>) {
        let mut quiet_rounds = 0;
        // One future for the connection's end, made once (not at every wait).
        let mut disconnected = self.qp.disconnected();
        let mut gone = false;
        let mut wcs = Vec::with_capacity(64);
        loop {
            if self.cq.poll_into(64, &mut wcs) == 0 {
                if gone || !self.qp.is_connected() {
                    // Flushes may trail the disconnect: look twice before leaving.
                    quiet_rounds += 1;
                    if quiet_rounds > 2 {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
                tokio::select! {
                    biased;
                    _ = self.cq.ready() => {}
                    _ = &mut disconnected, if !gone => gone = true,
                }
                continue;
            }
            quiet_rounds = 0;
            // Room for read data that completed writes leave, given back once for the batch.
            let mut room: Option<tokio::sync::OwnedSemaphorePermit> = None;
            for wc in wcs.drain(..) {
                if wc.opcode == WcOpcode::Recv {
                    self.on_receive(wc);
                } else if let Some(Waiter { done, keep }) = self.take_waiter(wc.wr_id) {
                    // Every request posted before this one has completed too.
                    let mut u = lock(&self.unsignaled);
                    let upto = u.held.iter().take_while(|(id, _)| *id < wc.wr_id).count();
                    let released: Vec<_> = u.held.drain(..upto).collect();
                    drop(u);
                    released.into_iter().for_each(|(_, k)| k.release_into(&self.pool, &mut room));
                    if wc.status != WcStatus::Success && wc.status != WcStatus::WrFlushErr {
                        self.fail(DmError::Completion { op: wc.opcode.name(), status: wc.status.name() });
                    }
                    // Our handle on the memory goes first, so the waiter may take it back whole.
                    if let Some(k) = keep {
                        k.release_into(&self.pool, &mut room);
                    }
                    let _ = done.send(wc.status);
                }
            }
            drop(room);
        }
        lock(&self.waiting).clear();
        lock(&self.unsignaled).held.clear();
        self.drop_read_regions();
        lock(&self.recvs).clear();
        if !self.closed.swap(true, Ordering::AcqRel) {
            self.queue_event(DmEvent::Terminated(Terminated::PeerClosed));
        }
        self.writes_changed.notify_waiters();
        self.writes_in_flight.room.close();
    }

    /// A receive completed: the message is handled in place (immediate and Data-Out payload go
    /// straight to the task buffer), then the buffer is posted again.
    pub(super) fn on_receive(&self, wc: Wc) {
        let Some(Recv { head, data }) = lock(&self.recvs).remove(&wc.wr_id) else { return };
        if wc.status != WcStatus::Success {
            if wc.status != WcStatus::WrFlushErr {
                self.fail(DmError::Completion { op: WcOpcode::Recv.name(), status: wc.status.name() });
            }
            return;
        }
        let n = wc.byte_len as usize;
        let inv = wc.invalidated_rkey;
        let mut handled = Ok(());
        let data = match data {
            Some(d) if n > head.len() => self.on_split_message(&head, d, n - head.len(), inv, &mut handled),
            // The whole message in the first buffer.
            d => {
                head.read(&mut |b| handled = self.on_message(&b[..n.min(b.len())], None, inv));
                d
            }
        };
        if !self.closed.load(Ordering::Acquire) && self.qp.is_connected() && self.post_recv(Some(Recv { head, data })).is_err() {
            self.fail(DmError::Resources { what: "repost a receive" });
        }
        if let Err(why) = handled {
            self.fail(why);
        }
    }

    /// A message in two receive elements (see [`Recv`]): its headers in `head`, the `n` bytes
    /// after them in `data`. A PDU whose data segment is all of them (no AHS) is handled in
    /// place, and one whose data segment fills at least half the buffer, or a quarter of it
    /// from [`HAND_ON_MIN`], is handed on with it (a command's immediate data becomes its
    /// task's buffer, nothing copied; see [`Lent`]); anything else is put together first. The
    /// data buffer to post again, if it stays.
    fn on_split_message(
        &self,
        head: &Mr<P>,
        data: Arc<Mr<P>>,
        n: usize,
        inv: Option<u32>,
        handled: &mut Result<(), DmError>,
    ) -> Option<Arc<Mr<P>>> {
        let mut hdr = [0u8; ISER_HEADERS_LEN];
        head.read(&mut |b| hdr.copy_from_slice(&b[..ISER_HEADERS_LEN]));
        let bhs = &hdr[ISER_HDR_LEN..];
        let segment = u32::from_be_bytes([0, bhs[5], bhs[6], bhs[7]]) as usize;
        if bhs[4] != 0 || segment != n {
            // AHS, or lengths that do not add up (the parse says what is wrong): contiguous.
            let mut msg = Vec::with_capacity(ISER_HEADERS_LEN + n);
            msg.extend_from_slice(&hdr);
            data.read(&mut |b| msg.extend_from_slice(&b[..n.min(b.len())]));
            *handled = self.on_message(&msg, None, inv);
            return Some(data);
        }
        let hand_on = 2 * n >= data.len() || (4 * n >= data.len() && n >= HAND_ON_MIN);
        let data = if !hand_on {
            data
        } else {
            match data.into_buffer() {
                Ok(whole) => {
                    let owned = Bytes::from_owner(Lent { buf: whole, len: n, home: self.recv_spares.clone() });
                    *handled = self.on_message(&hdr, Some(Tail::Owned(&owned)), inv);
                    // Kept by a task or not, the buffer comes back whole once the last of its
                    // bytes goes; the receive is posted again with the buffer back last (this
                    // one, if no task kept it).
                    drop(owned);
                    return None;
                }
                // Held for a moment elsewhere: read where it lies.
                Err(data) => data,
            }
        };
        data.read(&mut |b| *handled = self.on_message(&hdr, Some(Tail::Borrowed(&b[..n.min(b.len())])), inv));
        Some(data)
    }

    /// The waiter of a send-queue request (the map's lock released at once: the caller goes on
    /// to lock `unsignaled`, which posting takes before `waiting`).
    fn take_waiter(&self, wr_id: u64) -> Option<Waiter<P>> {
        lock(&self.waiting).remove(&wr_id)
    }

    /// One received Send: an iSER header, a BHS, AHS and data — or, with `tail`, the iSER header
    /// and BHS in `msg` and the data segment (no AHS) in `tail`.
    fn on_message(&self, msg: &[u8], tail: Option<Tail<'_>>, invalidated: Option<u32>) -> Result<(), DmError> {
        let ih = IserHeader::parse(msg).map_err(|_| Violation::IserTruncated)?;
        match ih.opcode {
            IserOpcode::Control => {}
            IserOpcode::Hello | IserOpcode::HelloReply => {
                return Err(Violation::IserHello.into());
            }
            IserOpcode::Other(n) => return Err(Violation::IserOpcode(n).into()),
        }
        // A remote invalidation is judged before the PDU is: whatever the PDU holds, the key is
        // already gone, so it must have been one of the task's own.
        if self.role == Role::Initiator {
            let itt = msg.get(ISER_HDR_LEN..).and_then(|b| Bhs::new_checked(b).ok()).map(|b| b.itt());
            self.check_invalidation(itt, invalidated)?;
        }
        let parsed = match &tail {
            None => Pdu::parse_limited(&msg[ISER_HDR_LEN..], self.cfg.recv_segment(), false).map(|(p, _)| p),
            Some(t) => parts(&msg[ISER_HDR_LEN..], t.bytes(), self.cfg.recv_segment()),
        };
        let pdu = match parsed {
            Ok(p) => p,
            Err(e) => {
                // Only a message that is exactly one PDU behind a 12-byte header: a control PDU's
                // zero STags and VAs also parse as a (NOP-Out) header at that offset.
                let rfc5046 = msg.len() >= RFC5046_HDR_LEN + 48
                    && matches!(Pdu::parse_limited(&msg[RFC5046_HDR_LEN..], u32::MAX, false),
                        Ok((_, need)) if (need..need + 4).contains(&(msg.len() - RFC5046_HDR_LEN)));
                if rfc5046 {
                    return Err(Violation::Rfc5046Header.into());
                }
                // A whole message is one PDU, so the next one is framed whatever this one holds:
                // a field the session rejects costs only this PDU.
                if let (Reaction::Reject(_), Some(raw)) = (e.reaction(), msg.get(ISER_HDR_LEN..ISER_HDR_LEN + BHS_LEN)) {
                    let mut bhs = [0u8; BHS_LEN];
                    bhs.copy_from_slice(raw);
                    self.room_for_received()?;
                    self.queue_event(DmEvent::Malformed { bhs, error: e });
                    return Ok(());
                }
                return Err(e.into());
            }
        };
        let header = pdu.header;
        tracing::trace!(role = ?self.role, op = ?header.opcode(), itt = header.itt(), len = msg.len(), ?invalidated, "iSER receive");
        let ahs = owned(pdu.ahs);
        // Only a NOP-Out answers a ping (the lock is not taken for every command).
        if self.role == Role::Target && matches!(header, Header::NopOut(_)) {
            lock(&self.unexpected).received(&header);
        }
        // Every PDU but a target's Data-Out goes up to the iSCSI layer.
        if !(self.role == Role::Target && matches!(header, Header::DataOut(_))) {
            self.room_for_received()?;
        }
        match (self.role, &header) {
            (Role::Target, Header::ScsiCommand(c)) => {
                let fresh = match lock(&self.remote).entry(c.itt) {
                    hashbrown::hash_map::Entry::Vacant(v) => {
                        v.insert(Remote { write: ih.write, read: ih.read });
                        true
                    }
                    hashbrown::hash_map::Entry::Occupied(_) => false,
                };
                if !fresh {
                    return self.receive_duplicate_command(*c, ahs);
                }
                if c.write && c.expected_data_len > 0 {
                    let owned = match &tail {
                        Some(Tail::Owned(b)) => Some(*b),
                        _ => None,
                    };
                    return self.receive_write_command(*c, ahs, pdu.data, owned);
                }
            }
            (Role::Target, Header::DataOut(d)) => {
                self.receive_unsolicited_data_out(d, pdu.data);
                return Ok(());
            }
            _ => {}
        }
        let data = owned(pdu.data);
        self.queue_event(DmEvent::Control(ControlPdu { header, ahs, data, immediate: 0 }));
        Ok(())
    }

    /// Post a send-queue request now and hand back the receiver of its completion status.
    pub(super) fn post_queued(&self, op: SendOp, sg: SgList, keep: Option<Keep<P>>) -> Result<oneshot::Receiver<WcStatus>, DmError> {
        let (tx, rx) = oneshot::channel();
        self.post_wr(op, sg, None, keep, Some(tx), true)?;
        Ok(rx)
    }

    /// Post a request nobody waits for. Unless `signal`, most go unsignaled (no completion, no
    /// wake-up of the driver): their memory is released when a later request completes, since
    /// a send queue completes in order. Every [`IserConfig::signal_every`]th is signaled so that always
    /// happens, and one that brings what went unsignaled to 1 MiB of payload (`SIGNAL_BYTES`), so
    /// that large buffers come back soon; a signaled one is in `waiting` until it completes (see
    /// `terminate`).
    pub(super) fn post_unawaited(&self, op: SendOp, sg: SgList, keep: Option<Keep<P>>, signal: bool) -> Result<(), DmError> {
        self.post_wr(op, sg, None, keep, signal.then(|| oneshot::channel().0), false)
    }

    /// [`post_unawaited`](Self::post_unawaited) of a request whose payload is `data` itself,
    /// unregistered (the queue pair takes that much: see `QueuePair::max_unregistered_payload`).
    pub(super) fn post_wr_bytes(&self, op: SendOp, data: Bytes, keep: Option<Keep<P>>, signal: bool) -> Result<(), DmError> {
        self.post_wr(op, SgList::new(), Some(data), keep, signal.then(|| oneshot::channel().0), false)
    }

    /// Initiator: post the commands gathered by `send_command` once the executor's other ready
    /// tasks have run (their commands join the list). Pending forever once posting failed (the
    /// connection has ended; the driver ends with it).
    pub(super) async fn flush_when_due(&self) {
        loop {
            self.flush_due.notified().await;
            tokio::task::yield_now().await;
            if self.release_sends().is_err() {
                return std::future::pending().await;
            }
        }
    }

    /// Initiator: gather the requests posted from now on (until the flusher posts them).
    pub(super) fn gather_commands(&self) {
        lock(&self.unsignaled).start_gathering();
    }

    /// Initiator: a command was gathered: post the list now if it holds
    /// [`COMMANDS_GATHERED_MAX`](super::COMMANDS_GATHERED_MAX) requests, else let the flusher.
    pub(super) fn command_gathered(&self) -> Result<(), DmError> {
        let full = lock(&self.unsignaled).gathering.as_ref().is_some_and(|l| l.len() >= super::COMMANDS_GATHERED_MAX);
        if full {
            return self.release_sends();
        }
        self.flush_due.notify_one();
        Ok(())
    }

    /// Post what was gathered since `hold_sends`, as one list, and stop gathering.
    pub(super) fn release_sends(&self) -> Result<(), DmError> {
        let mut u = lock(&self.unsignaled);
        u.gathered_bytes = 0;
        let Some(list) = u.gathering.take() else { return Ok(()) };
        if list.is_empty() {
            u.give_back(list);
            return Ok(());
        }
        if let Err(e) = self.post_in_turn(u, Post::List(list)) {
            // Their bookkeeping cannot be told apart any more: the connection ends.
            let e = rdma("post gathered work requests")(e);
            self.fail(e);
            return Err(e);
        }
        Ok(())
    }

    /// Post one request: signaled when someone waits, else now and then. Request ids increase
    /// in posting order (see `Unsignaled`). While sends are held, a request nobody `awaited` is
    /// gathered; one that is awaited is posted at once, with what was gathered before it.
    fn post_wr(
        &self,
        op: SendOp,
        sg: SgList,
        unregistered: Option<Bytes>,
        keep: Option<Keep<P>>,
        done: Option<oneshot::Sender<WcStatus>>,
        awaited: bool,
    ) -> Result<(), DmError> {
        if self.closed.load(Ordering::Acquire) {
            return Err(DmError::Closed);
        }
        let mut guard = lock(&self.unsignaled);
        let u = &mut *guard;
        let wr_id = self.next_wr.fetch_add(1, Ordering::Relaxed);
        // Payload this request sends (a Read Request sends none, whatever it reads).
        let bytes = match op {
            SendOp::RdmaRead { .. } => 0,
            _ => sg.iter().map(|e| u64::from(e.length)).sum::<u64>() + unregistered.as_ref().map_or(0, |b| b.len() as u64),
        };
        u.since_signal += 1;
        u.bytes_since_signal += bytes;
        let signaled = done.is_some() || u.since_signal >= signal_interval(&self.cfg) || u.bytes_since_signal >= super::SIGNAL_BYTES;
        if signaled {
            u.since_signal = 0;
            u.bytes_since_signal = 0;
            let done = done.unwrap_or_else(|| oneshot::channel().0);
            lock(&self.waiting).insert(wr_id, Waiter { done, keep });
        } else if let Some(mr) = keep {
            u.held.push_back((wr_id, mr));
        }
        tracing::trace!(role = ?self.role, wr_id, ?op, signaled, "iSER post");
        let wr = SendWr { wr_id, op, sg_list: sg, unregistered, signaled };
        // What leaves now: this request alone, or a list (what was gathered, with or before it).
        let (one, list) = match u.gathering.as_mut() {
            Some(list) if !awaited => {
                // Past the cap, what was gathered leaves now, while the poster may still write
                // it itself; this request starts the next list.
                let full = !list.is_empty() && u.gathered_bytes + bytes > GATHER_BYTES_MAX;
                let full = full.then(|| u.take_gathered());
                if full.is_some() {
                    u.gathered_bytes = 0;
                }
                u.gathered_bytes += bytes;
                u.gathering.get_or_insert_with(Vec::new).push(wr);
                match full {
                    Some(full) => (None, full),
                    None => return Ok(()),
                }
            }
            Some(list) if !list.is_empty() => {
                let mut list = u.take_gathered();
                u.gathered_bytes = 0;
                list.push(wr);
                (None, list)
            }
            _ => (Some(wr), Vec::new()),
        };
        let alone = one.is_some();
        let post = match one {
            Some(wr) => Post::One { wr, awaited },
            None => Post::List(list),
        };
        let Err(e) = self.post_in_turn(guard, post) else { return Ok(()) };
        // A full send queue: the peer takes nothing of what is sent (the transmitter cannot
        // write), as a TCP peer that stops reading — its connection ends, as over TCP once
        // `send_timeout` passes, rather than every command after failing unanswered.
        let full = matches!(e, riser_verbs::Error::Invalid(riser_verbs::Invalid::SendQueueFull { .. }));
        if alone && !full {
            // The request fails and the connection goes on; its memory, if held, goes with a
            // later completion or the connection's end. Had it been the signaled one, what was
            // posted unsignaled before it waits for the next: signaled, whatever it carries
            // (else more than `SIGNAL_BYTES` could wait for a completion that never comes).
            lock(&self.waiting).remove(&wr_id);
            lock(&self.unsignaled).bytes_since_signal = super::SIGNAL_BYTES;
            return Err(rdma("post a work request")(e));
        }
        // The gathered requests' bookkeeping cannot be told apart: the connection ends.
        let e = rdma(if full { "post: the send queue is full (the peer takes nothing)" } else { "post gathered work requests" })(e);
        self.fail(e);
        Err(e)
    }

    /// Post `post` (taken under `u`, in id order) now, unless another thread is posting: then
    /// it is left in `ready` for that thread, which posts it after its own (see `Unsignaled`).
    /// A thread that posted goes on to post what others left meanwhile, in order, before it
    /// stops. The error of this thread's own post, if it made it; a failure of a post it made
    /// for another thread ends the connection (that request's bookkeeping is not its own).
    fn post_in_turn(&self, mut u: MutexGuard<'_, Unsignaled<P>>, post: Post) -> Result<(), riser_verbs::Error> {
        if u.posting {
            u.ready.push_back(post);
            return Ok(());
        }
        u.posting = true;
        drop(u);
        let turn = PostingTurn(self);
        let (mine, memory) = self.post_as(post);
        self.post_ready(memory);
        std::mem::forget(turn);
        mine
    }

    /// The posting thread, its own post made: post what others left in `ready` meanwhile, in
    /// order, until none is left, then stop posting (`memory`: a posted list's, for the next).
    fn post_ready(&self, mut memory: Option<Vec<SendWr>>) {
        loop {
            let mut u = lock(&self.unsignaled);
            if let Some(list) = memory.take() {
                u.give_back(list);
            }
            let Some(next) = u.ready.pop_front() else {
                u.posting = false;
                return;
            };
            drop(u);
            let (posted, list) = self.post_as(next);
            memory = list;
            if let Err(e) = posted {
                self.fail(rdma("post work requests of another poster")(e));
            }
        }
    }

    /// Post as `post` says: one request alone or as a list of one (someone waits for it —
    /// Get_Data's RDMA Read — so a provider may transmit it on the spot rather than through
    /// its transmitter), or a gathered list, whose memory (emptied) comes back for the next.
    fn post_as(&self, post: Post) -> (Result<(), riser_verbs::Error>, Option<Vec<SendWr>>) {
        match post {
            Post::One { wr, awaited: true } => (self.qp.post_send_list(&mut vec![wr]), None),
            Post::One { wr, awaited: false } => (self.qp.post_send(wr), None),
            Post::List(mut list) => (self.qp.post_send_list(&mut list), Some(list)),
        }
    }

    /// One PDU as one Send: [iSER header | BHS | AHS | data], the data segment ending with
    /// `tail` if given (a region and the SGE of its bytes), sent from where it lies: the message
    /// is the copied headers (and `data`), then the tail's bytes, as a second SGE; the request
    /// keeps the region until it completes. Posting never waits.
    pub(super) fn send_pdu_from(
        &self,
        ih: IserHeader,
        header: &Header,
        ahs: &[u8],
        data: &[&[u8]],
        tail: Option<(Arc<Mr<P>>, Sge)>,
        invalidate: Option<u32>,
    ) -> Result<(), DmError> {
        let copied: usize = data.iter().map(|d| d.len()).sum();
        let dsl = copied + tail.as_ref().map_or(0, |(_, sge)| sge.length as usize);
        let len = ISER_HEADERS_LEN + ahs.len() + copied;
        let mut bhs = [0u8; 48];
        header.emit(&mut bhs, ahs.len(), dsl as u32);
        let ihb = ih.emit();
        let parts = || [&ihb[..], &bhs[..], ahs].into_iter().chain(data.iter().copied());
        let op = match invalidate {
            Some(rkey) => SendOp::SendWithInvalidate { rkey },
            None => SendOp::Send,
        };
        // The traffic of commands goes mostly unsignaled; anything else (login, logout, NOP,
        // task management, text, reject) is signaled, so a connection's end can wait for it.
        let routine = matches!(header, Header::ScsiCommand(_) | Header::ScsiResponse(_) | Header::DataOut(_));
        if tail.is_none() && len <= SEND_BUFFERS[0].0 && len as u64 <= u64::from(self.qp.max_unregistered_payload()) {
            // A small message (headers, mostly) as bytes of its own where the queue pair takes
            // them (the software RNIC): no registered buffer to find, write under its lock and
            // have looked up again by its key. A larger one (a command's immediate data) is
            // copied into a registered buffer still: allocating it cost more than that.
            let bytes = self.small_send(len, &ihb, &bhs, std::iter::once(ahs).chain(data.iter().copied()));
            return self.post_wr_bytes(op, bytes, None, !routine);
        }
        let mr = match self.registered_send_buffer(len) {
            // A registered buffer of the connection's, free again: written in place.
            Some(mr) => {
                mr.write(&mut |b| {
                    // The headers as two copies of fixed size (no call), then what follows.
                    let (head, rest) = b.split_at_mut(ISER_HEADERS_LEN);
                    head[..ISER_HDR_LEN].copy_from_slice(&ihb);
                    head[ISER_HDR_LEN..].copy_from_slice(&bhs);
                    let mut at = 0;
                    for p in std::iter::once(ahs).chain(data.iter().copied()).filter(|p| !p.is_empty()) {
                        rest[at..at + p.len()].copy_from_slice(p);
                        at += p.len();
                    }
                });
                mr
            }
            None => {
                let mut buf = Vec::with_capacity(len);
                parts().for_each(|p| buf.extend_from_slice(p));
                self.pd.register(buf, Access::empty()).map_err(rdma("register a send buffer"))?
            }
        };
        let mut sg = SgList::from_slice(&[Sge { addr: mr.addr(), length: len as u32, lkey: mr.lkey() }]);
        let mut keep = Keep::region(mr);
        if let Some((region, sge)) = tail {
            sg.push(sge);
            keep.also = Some(region);
        }
        self.post_unawaited(op, sg, Some(keep), !routine)
    }
}

/// A thread's turn at posting, should a post panic: the turn ends and the connection with it
/// (what others left in `ready` cannot be posted in order any more), rather than every later
/// request waiting in `ready` for a poster that is gone. Forgotten when the turn ends normally.
struct PostingTurn<'a, P: Provider + 'static>(&'a Shared<P>);

impl<P: Provider + 'static> Drop for PostingTurn<'_, P> {
    fn drop(&mut self) {
        let left = {
            let mut u = lock(&self.0.unsignaled);
            u.posting = false;
            std::mem::take(&mut u.ready)
        };
        drop(left);
        self.0.fail(DmError::Resources { what: "post work requests (a post panicked)" });
    }
}

/// Room in which small Sends are put together: a message's bytes are a slice of it (no
/// allocation of their own), and it is let go once its room is used up and its last message sent.
/// Small: a message still queued keeps its chunk.
const SMALL_SEND_CHUNK: usize = 4 << 10;

impl<P: Provider + 'static> Shared<P> {
    /// A small message's `len` bytes: the iSER header, the BHS, then `rest`.
    fn small_send<'a>(&self, len: usize, ih: &[u8; ISER_HDR_LEN], bhs: &[u8; 48], rest: impl Iterator<Item = &'a [u8]>) -> Bytes {
        let mut room = lock(&self.small_sends);
        if room.capacity() < len {
            *room = BytesMut::with_capacity(SMALL_SEND_CHUNK.max(len));
        }
        room.extend_from_slice(ih);
        room.extend_from_slice(bhs);
        for p in rest.filter(|p| !p.is_empty()) {
            room.extend_from_slice(p);
        }
        room.split().freeze()
    }
}

/// The connection's registered send buffers, by size: messages up to 512 bytes (responses,
/// commands without immediate data, NOPs…), then up to 9 KiB (commands with up to
/// `IMMEDIATE_COPY_MAX` of immediate data behind their headers); larger ones get a registration
/// of their own, as do more Sends in flight than a size keeps buffers (its second number).
pub(super) const SEND_BUFFERS: [(usize, usize); 2] = [(512, 64), (9 << 10, 64)];

impl<P: Provider + 'static> Shared<P> {
    /// A registered send buffer for a message of `len` bytes that nothing else holds (the
    /// request that last used it has completed, or a later one has: see `Unsignaled`), or a new
    /// one while its size has fewer than it keeps (see [`SEND_BUFFERS`]); `None`: register one
    /// for this message.
    fn registered_send_buffer(&self, len: usize) -> Option<Arc<Mr<P>>> {
        let tier = SEND_BUFFERS.iter().position(|&(size, _)| len <= size)?;
        let (size, most) = SEND_BUFFERS[tier];
        let mut guard = lock(&self.send_bufs[tier]);
        let (bufs, next) = &mut *guard;
        // From the one after the last taken, round: they are taken and let go in turn, so the
        // first looked at is mostly the one used longest ago, and free.
        let n = bufs.len();
        if let Some(i) = (*next..n).chain(0..*next).find(|&i| Arc::strong_count(&bufs[i]) == 1) {
            *next = if i + 1 == n { 0 } else { i + 1 };
            return Some(bufs[i].clone());
        }
        if n >= most {
            return None;
        }
        let mr = self.pd.register(vec![0u8; size], Access::empty()).ok()?;
        bufs.push(mr.clone());
        *next = 0;
        Some(mr)
    }
}

/// The outcome of a posted request, once it completes.
pub(super) async fn completion(done: oneshot::Receiver<WcStatus>) -> Result<(), DmError> {
    match done.await {
        Ok(WcStatus::Success) => Ok(()),
        Ok(WcStatus::WrFlushErr) | Err(_) => Err(DmError::Closed),
        Ok(st) => Err(DmError::Completion { op: "work request", status: st.name() }),
    }
}

/// The fuzz target for the iSER receive path: `input` (a control byte, then messages as
/// `[selector, length u16 LE, bytes]`) is handled as received Sends, in either role, on a
/// datamover over the given (unconnected) queue pair, until one ends the connection. Checks
/// what must hold whatever arrives: no panic, write data only inside its task buffer, no more
/// immediate data than the command's length, remote invalidation only of the task's own keys.
pub fn fuzz_receive<P: Provider + 'static>(pd: Arc<P::Pd>, cq: Arc<P::Cq>, qp: Arc<P::Qp>, input: &[u8]) {
    let Some((&ctl, mut rest)) = input.split_first() else { return };
    let role = if ctl & 1 == 0 { Role::Target } else { Role::Initiator };
    let cfg = IserConfig { unsolicited_data_out: ctl & 4 != 0, ..IserConfig::default() };
    let Ok(dm) = IserDatamover::<P>::new(role, cfg, pd, cq, qp) else { return };
    let s = &dm.s;
    s.send_inv.store(ctl & 2 != 0, Ordering::Release);
    // An initiator with two commands in flight, each with a read and a write registration.
    let mut keys = Vec::new();
    if role == Role::Initiator {
        for itt in 1..=2u32 {
            let (Ok(read), Ok(write)) = (
                s.pd.register(vec![0; 4096], Access::LOCAL_WRITE | Access::REMOTE_WRITE),
                s.pd.register(vec![0; 4096], Access::REMOTE_READ),
            ) else {
                return;
            };
            keys.extend([read.rkey(), write.rkey()]);
            lock(&s.tasks).insert(itt, InitTask { read: Some(read), write: Some(write), read_uses: 0 });
        }
    }
    for _ in 0..64 {
        let [sel, l0, l1, tail @ ..] = rest else { break };
        let (msg, tail) = tail.split_at(usize::from(u16::from_le_bytes([*l0, *l1])).min(tail.len()));
        rest = tail;
        let invalidated = match sel % 4 {
            0 => None,
            1 | 2 => keys.get(usize::from(sel >> 2) % 4).copied().or(Some(u32::from(*sel))),
            _ => Some(u32::from(*sel) << 8),
        };
        // A message never exceeds the receive buffer it lands in.
        if msg.len() > s.recv_size {
            continue;
        }
        let tasks_before: std::collections::HashSet<u32> = lock(&s.writes).keys().copied().collect();
        // A target on the software RNIC receives in two elements (see `Recv`): a message as it
        // lands there, now and then.
        let r = if s.split_recv && sel & 0x40 != 0 && msg.len() > ISER_HEADERS_LEN {
            let (Ok(head), Ok(data)) = (
                s.pd.register(msg[..ISER_HEADERS_LEN].to_vec(), Access::LOCAL_WRITE),
                s.pd.register([&msg[ISER_HEADERS_LEN..], &vec![0; s.recv_size - msg.len()][..]].concat(), Access::LOCAL_WRITE),
            ) else {
                return;
            };
            let mut handled = Ok(());
            s.on_split_message(&head, data, msg.len() - ISER_HEADERS_LEN, invalidated, &mut handled);
            handled
        } else {
            s.on_message(msg, None, invalidated)
        };
        let mut events = s.events_rx.try_lock().expect("events");
        while let Ok(ev) = events.try_recv() {
            if let DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), immediate, .. }) = ev {
                // Immediate data beyond EDTL reaches the target core (which answers it with
                // CHECK CONDITION) without a task: nothing of it is ever written.
                let new_task = lock(&s.writes).contains_key(&c.itt) && !tasks_before.contains(&c.itt);
                assert!(immediate <= c.expected_data_len || !new_task, "a write task for immediate data beyond EDTL");
            }
        }
        drop(events);
        if r.is_err() {
            break;
        }
        for t in lock(&s.writes).values() {
            let held = t.whole.as_ref().map_or(t.buf.len(), Bytes::len);
            assert!(t.write.unsolicited().received() as usize <= held && held <= crate::MAX_TASK_BUFFER);
        }
        // A remote invalidation accepted by the initiator named a key of the task it came with.
        if let (Role::Initiator, Some(k)) = (role, invalidated) {
            assert!(s.send_inv.load(Ordering::Acquire) && keys.contains(&k), "invalidation of {k:#x} accepted");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser_iscsi::wire::{LoginRequest, NopOut, RESERVED_TAG, ScsiCommand};

    /// A target-side datamover on an unconnected software-RNIC queue pair (the RNIC is kept
    /// alive beside it).
    fn target() -> (riser_iwarp::SoftRnic, IserDatamover<riser_iwarp::SoftRnic>) {
        let (rnic, pd, cq, qp) = riser_iwarp::fuzzing::detached_qp();
        (rnic, IserDatamover::new(Role::Target, IserConfig::default(), pd, cq, qp).expect("datamover"))
    }

    fn pdu_bytes(h: Header, data: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        Pdu::new(h, &[][..], data).encode(&mut v);
        v
    }

    /// A received message in two elements, as the RNIC scattered it: its first
    /// `ISER_HEADERS_LEN` bytes in a head buffer, the rest at the start of a data buffer the
    /// size of the receive segment. What `on_split_message` returns, and the data buffer's
    /// address.
    fn split_receive(dm: &IserDatamover<riser_iwarp::SoftRnic>, msg: &[u8]) -> (Option<u64>, u64) {
        let s = &dm.s;
        let head = s.pd.register(msg[..ISER_HEADERS_LEN].to_vec(), Access::LOCAL_WRITE).unwrap();
        let mut data = vec![0xee_u8; s.recv_size - ISER_HEADERS_LEN];
        data[..msg.len() - ISER_HEADERS_LEN].copy_from_slice(&msg[ISER_HEADERS_LEN..]);
        let data = s.pd.register(data, Access::LOCAL_WRITE).unwrap();
        let addr = data.addr();
        let mut handled = Ok(());
        let kept = s.on_split_message(&head, data, msg.len() - ISER_HEADERS_LEN, None, &mut handled);
        assert_eq!(handled, Ok(()));
        (kept.map(|d| d.addr()), addr)
    }

    /// With receives in two elements (the target on the software RNIC), a write whose data
    /// all came with its command gets the receive buffer itself as its task buffer (nothing
    /// copied; the receive is posted again with another), when the data fills at least half of
    /// it; smaller immediate data, a write with more to fetch and a PDU with an AHS are copied
    /// as before, the buffer staying with its receive (or, taken out for a moment, back whole
    /// for the next).
    #[test]
    fn immediate_data_filling_its_receive_buffer_becomes_the_task_buffer() {
        let (_rnic, dm) = target();
        assert!(dm.s.split_recv);
        let segment = dm.s.recv_size - ISER_HEADERS_LEN;
        let command = |itt: u32, edtl: usize, data: &[u8], ahs: &[u8]| {
            let c = ScsiCommand { final_: true, write: true, itt, expected_data_len: edtl as u32, cmd_sn: itt, ..ScsiCommand::default() };
            let mut v = IserHeader::CONTROL.emit().to_vec();
            Pdu::new(Header::ScsiCommand(c), ahs, data).encode(&mut v);
            v
        };
        let data: Vec<u8> = (0..segment).map(|i| (i * 7 + i / 251) as u8).collect();
        let whole = |itt: u32| lock(&dm.s.writes).get(&itt).and_then(|t| t.whole.as_ref().map(|b| (b.as_ptr() as u64, b.to_vec())));
        // All of a write's data, filling the buffer: handed on.
        let (kept, addr) = split_receive(&dm, &command(1, segment, &data, &[]));
        assert_eq!(kept, None, "the data buffer went with the command");
        assert_eq!(whole(1), Some((addr, data.clone())), "the task buffer is the receive buffer");
        // Half of it: handed on too.
        let half = &data[..segment / 2];
        let (kept, addr) = split_receive(&dm, &command(2, half.len(), half, &[]));
        assert_eq!((kept, whole(2)), (None, Some((addr, half.to_vec()))));
        // Less than half: copied; the buffer stays.
        let small = &data[..segment / 2 - 4];
        let (kept, addr) = split_receive(&dm, &command(3, small.len(), small, &[]));
        assert_eq!((kept, whole(3)), (Some(addr), None));
        assert_eq!(&lock(&dm.s.writes)[&3].buf[..], small);
        // More to fetch than came with it: the immediate part copied into the task's buffer.
        let (kept, addr) = split_receive(&dm, &command(4, 4 * segment, &data, &[]));
        assert_eq!((whole(4), &lock(&dm.s.writes)[&4].buf[..segment]), (None, &data[..]));
        let spare = lock(&dm.s.recv_spares).last().map(|b| (b.as_ptr() as u64, b.len()));
        assert_eq!((kept, spare), (None, Some((addr, segment))), "the buffer, not kept by the task, back whole for the next receive");
        // An AHS: the message put together, then as before.
        let ahs = [0u8, 4, 1, 0, 1, 2, 3, 4];
        let (kept, addr) = split_receive(&dm, &command(5, segment / 2, &data[..segment / 2], &ahs));
        assert_eq!((kept, whole(5)), (Some(addr), None));
        assert_eq!(&lock(&dm.s.writes)[&5].buf[..], &data[..segment / 2]);
        let mut events = dm.s.events_rx.try_lock().expect("events");
        for itt in 1..=5 {
            let ev = events.try_recv().expect("the command went up");
            assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), .. }) if c.itt == itt), "{ev:?}");
        }
    }

    /// Receives of 256 KiB (riser's target on the software RNIC): a write's 64 KiB of
    /// immediate data, a quarter of its receive buffer, is handed on in it too (from
    /// `HAND_ON_MIN`), and `try_get_data` gives those very bytes; once they are dropped (the
    /// write done) the buffer is back whole and the next receive posted takes it, nothing
    /// zeroed. Less than a quarter is copied and the buffer stays with its receive.
    #[test]
    fn immediate_data_from_32_kib_is_handed_on_and_its_buffer_comes_back_whole() {
        use riser_datamover::{Attempt, Datamover, R2tPlan};
        let (_rnic, pd, cq, qp) = riser_iwarp::fuzzing::detached_qp();
        let dm = IserDatamover::new(Role::Target, IserConfig::default().recv_dsl(256 << 10), pd, cq, qp).expect("datamover");
        let segment = dm.s.recv_size - ISER_HEADERS_LEN;
        let command = |itt: u32, data: &[u8]| {
            let c =
                ScsiCommand { final_: true, write: true, itt, expected_data_len: data.len() as u32, cmd_sn: itt, ..ScsiCommand::default() };
            let mut v = IserHeader::CONTROL.emit().to_vec();
            Pdu::new(Header::ScsiCommand(c), &[][..], data).encode(&mut v);
            v
        };
        // Get_Data's plan for a write whose `len` bytes all came with the command.
        let plan = |itt: u32, len: usize| {
            let len = len as u32;
            R2tPlan {
                itt,
                lun: Default::default(),
                start: len,
                end: len,
                max_burst: 1 << 20,
                first_ttt: 0,
                stat_sn: 0,
                exp_cmd_sn: 0,
                max_cmd_sn: 0,
            }
        };
        let data: Vec<u8> = (0..64 << 10).map(|i: usize| (i * 13 + i / 509) as u8).collect();
        let (kept, addr) = split_receive(&dm, &command(1, &data));
        assert_eq!(kept, None, "the data buffer went with the command");
        let Attempt::Done(Ok(got)) = dm.try_get_data(plan(1, data.len())) else { panic!("the write's data is all here") };
        assert_eq!((got.as_ptr() as u64, &got[..]), (addr, &data[..]), "the receive buffer's own bytes");
        assert!(lock(&dm.s.writes).is_empty(), "the task's data was taken");
        assert!(lock(&dm.s.recv_spares).is_empty(), "the buffer is the write's while it runs");
        drop(got);
        let spare = lock(&dm.s.recv_spares).last().map(|b| (b.as_ptr() as u64, b.len()));
        assert_eq!(spare, Some((addr, segment)), "back whole once the write is done");
        dm.s.post_recv(None).expect("a receive");
        assert!(lock(&dm.s.recvs).values().any(|r| r.data.as_ref().is_some_and(|d| d.addr() == addr)), "posted again");
        assert!(lock(&dm.s.recv_spares).is_empty());
        // 60 KiB, short of a quarter: copied into a task buffer of its own; the receive keeps its buffer.
        let (kept, addr) = split_receive(&dm, &command(2, &data[..60 << 10]));
        assert_eq!(kept, Some(addr));
        assert!(matches!(dm.try_get_data(plan(2, 60 << 10)), Attempt::WouldWait(_)), "not lent: Get_Data's buffer");
        assert_eq!(&lock(&dm.s.writes)[&2].buf[..], &data[..60 << 10]);
    }

    /// A Send cannot be made to wait: a peer whose PDUs the session has not taken reach the
    /// command window and `BACKLOG_SLACK` more loses its connection at the next one, before
    /// anything is kept for it (a write's data included). A target's Data-Out goes into its
    /// task, not up, and is not counted; once the session takes an event there is room again.
    #[test]
    fn a_peer_sending_beyond_its_window_while_the_session_waits_loses_the_connection() {
        use riser_datamover::{BACKLOG_SLACK, ConnectionResources, Datamover};
        use riser_iscsi::wire::{DataOut, ScsiCommand};
        let (_rnic, dm) = target();
        dm.allocate_connection_resources(ConnectionResources { commands: 4 }).unwrap();
        let limit = 4 + BACKLOG_SLACK;
        let message = |h: Header, data: &[u8]| {
            let mut v = IserHeader::CONTROL.emit().to_vec();
            v.extend(pdu_bytes(h, data));
            v
        };
        let read = |itt: u32| {
            let c = ScsiCommand { final_: true, read: true, itt, expected_data_len: 512, cmd_sn: itt, ..ScsiCommand::default() };
            message(Header::ScsiCommand(c), &[])
        };
        for itt in 0..limit as u32 {
            assert_eq!(dm.s.on_message(&read(itt), None, None), Ok(()));
        }
        let data_out = DataOut { final_: true, itt: 1, ttt: RESERVED_TAG, ..DataOut::default() };
        assert_eq!(dm.s.on_message(&message(Header::DataOut(data_out), &[0; 512]), None, None), Ok(()), "a Data-Out is not counted");
        let write = ScsiCommand { final_: true, write: true, itt: 1000, expected_data_len: 512, cmd_sn: 1000, ..ScsiCommand::default() };
        let over = Err(Violation::Backlog { limit: limit as u32 }.into());
        assert_eq!(dm.s.on_message(&message(Header::ScsiCommand(write), &[7; 512]), None, None), over);
        assert!(!lock(&dm.s.writes).contains_key(&1000), "nothing kept for it");
        assert!(matches!(dm.try_next_event(), Some(DmEvent::Control(p)) if p.header.itt() == 0));
        assert_eq!(dm.s.on_message(&message(Header::ScsiCommand(write), &[7; 512]), None, None), Ok(()), "room again");
        assert!(lock(&dm.s.writes).contains_key(&1000));
    }

    /// An initiator's answers are bounded by what it has outstanding — no more than its
    /// receives (`max_outstanding_commands`) — so a target that sends beyond `recv_depth` and
    /// `BACKLOG_SLACK` more PDUs while the session takes none (here NOP-In pings) loses the
    /// connection before anything more is kept; once the session takes one, there is room.
    /// (Every one was queued before, without end.)
    #[test]
    fn a_target_sending_beyond_what_the_initiator_can_have_asked_for_loses_the_connection() {
        use riser_datamover::{BACKLOG_SLACK, ConnectionResources, Datamover};
        use riser_iscsi::wire::NopIn;
        let (_rnic, pd, cq, qp) = riser_iwarp::fuzzing::detached_qp();
        let cfg = IserConfig::default();
        let dm = IserDatamover::<riser_iwarp::SoftRnic>::new(Role::Initiator, cfg, pd, cq, qp).expect("datamover");
        dm.allocate_connection_resources(ConnectionResources::default()).unwrap();
        let limit = cfg.recv_depth as usize + BACKLOG_SLACK;
        let ping = |n: u32| {
            let h = Header::NopIn(NopIn { itt: RESERVED_TAG, ttt: n, stat_sn: 1, exp_cmd_sn: 1, max_cmd_sn: 1, ..NopIn::default() });
            let mut v = IserHeader::CONTROL.emit().to_vec();
            v.extend(pdu_bytes(h, &[]));
            v
        };
        for n in 0..limit as u32 {
            assert_eq!(dm.s.on_message(&ping(n), None, None), Ok(()), "ping {n}");
        }
        let over = Err(Violation::Backlog { limit: limit as u32 }.into());
        assert_eq!(dm.s.on_message(&ping(9999), None, None), over);
        assert!(dm.try_next_event().is_some());
        assert_eq!(dm.s.on_message(&ping(10_000), None, None), Ok(()), "room again");
    }

    /// An initiator that reads nothing while it sends READs: the target posts RDMA Writes of
    /// read data up to `read_data_in_flight` (what the sockets took aside), then Put_Data waits,
    /// in turn (riser's target ends the connection after `send_timeout`); once the initiator
    /// reads, the writes complete and the waiting one goes. Before, every write was posted (and kept by
    /// the software RNIC) up to the send queue's depth: hundreds of reads of up to 64 MiB.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn read_data_posted_to_a_peer_that_reads_nothing_is_bounded() {
        use riser_datamover::{Attempt, ConnectionResources, DataInDesc, Datamover};
        use riser_verbs::Listener;
        const MIB: u32 = 1 << 20;
        let cap = 4 * u64::from(MIB);
        let rnic = riser_iwarp::SoftRnic::default();
        let listener = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let r = rnic.clone();
        let cfg = IserConfig::default().read_data_in_flight(cap);
        let target = tokio::task::spawn_blocking(move || super::super::accept(&r, listener.get_request().unwrap(), cfg));
        // The initiator's engines run on a runtime of their own, driven only while `drive` runs:
        // otherwise the initiator reads nothing.
        let r = rnic.clone();
        let (irt, initiator) = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let dm = {
                let _in = rt.enter();
                super::super::connect(&r, addr, IserConfig::default()).unwrap()
            };
            (Arc::new(rt), dm)
        })
        .join()
        .unwrap();
        let drive = |rt: &Arc<tokio::runtime::Runtime>| {
            let (stop, stopped) = oneshot::channel::<()>();
            let rt = rt.clone();
            let running = std::thread::spawn(move || rt.block_on(async { stopped.await.ok() }));
            move || {
                stop.send(()).unwrap();
                running.join().unwrap();
            }
        };
        let (target, _) = target.await.unwrap().unwrap();
        tokio::spawn(target.driver());
        for dm in [&target, &initiator] {
            dm.allocate_connection_resources(ConnectionResources { commands: 128 }).unwrap();
            dm.enable();
        }
        let data = Bytes::from(vec![0x5a; MIB as usize]);
        let desc = |itt: u32| DataInDesc { itt, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
        // Driven for the first command (its ready-to-receive message leaves first).
        let mut first = Some(drive(&irt));
        let mut itt = 0u32;
        let mut put = loop {
            // The sockets take some megabytes before nothing moves (more as their buffers grow).
            assert!(itt < 64, "64 MiB of read data posted to a peer that reads nothing");
            let cmd = ScsiCommand { final_: true, read: true, itt, expected_data_len: MIB, cmd_sn: itt, ..ScsiCommand::default() };
            initiator.send_command(cmd, Bytes::new(), MIB, None).await.unwrap();
            initiator.s.release_sends().unwrap();
            let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.unwrap_or_else(|_| panic!("command {itt}"));
            assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), .. }) if c.itt == itt), "{ev:?}");
            if let Some(stop) = first.take() {
                stop();
            }
            match target.try_put_data(desc(itt), data.clone()) {
                Attempt::Done(r) => {
                    r.unwrap();
                }
                Attempt::WouldWait((d, b)) => {
                    let mut put = Box::pin(target.put_data(d, b));
                    if tokio::time::timeout(Duration::from_millis(300), put.as_mut()).await.is_err() {
                        break put;
                    }
                }
            }
            let held = target.s.writes_in_flight.held();
            assert!(held <= cap, "{held} bytes of read data held");
            itt += 1;
        };
        assert!(tokio::time::timeout(Duration::from_millis(300), put.as_mut()).await.is_err(), "no room while the peer reads nothing");
        // Writes wait in turn: a small one does not overtake the one waiting.
        assert!(matches!(target.try_put_data(desc(0), Bytes::from(vec![0; 4096])), Attempt::WouldWait(_)), "in turn");
        // The initiator reads: the writes complete, and the waiting one goes.
        let stop = drive(&irt);
        tokio::time::timeout(Duration::from_secs(10), put).await.expect("room once the peer reads").unwrap();
        stop();
        drop(initiator);
        std::thread::spawn(move || drop(irt)).join().unwrap();
    }

    #[test]
    fn an_rfc_5046_header_is_told_apart_from_a_pdu_with_a_bad_field() {
        let (_rnic, dm) = target();
        // RFC 7145 header, then a Login Request with both T and C (an invalid field): one PDU
        // the session rejects; the connection goes on.
        let bad = Header::LoginRequest(LoginRequest { transit: true, cont: true, itt: 7, ..LoginRequest::default() });
        let mut msg = IserHeader::CONTROL.emit().to_vec();
        msg.extend(pdu_bytes(bad, b"x"));
        assert_eq!(dm.s.on_message(&msg, None, None), Ok(()));
        let ev = dm.s.events_rx.try_lock().expect("events").try_recv().expect("an event");
        assert!(matches!(ev, DmEvent::Malformed { bhs, .. } if bhs[0] & 0x3f == 0x03), "{ev:?}");
        // A peer speaking RFC 5046: a 12-byte header, then a whole PDU. Named as such.
        let nop = Header::NopOut(NopOut {
            immediate: true,
            lun: Default::default(),
            itt: 0x3f00_0001,
            ttt: RESERVED_TAG,
            cmd_sn: 1,
            exp_stat_sn: 1,
        });
        let mut old = vec![0x10u8; 1];
        old.extend([0u8; RFC5046_HDR_LEN - 1]);
        old.extend(pdu_bytes(nop, &[]));
        assert_eq!(dm.s.on_message(&old, None, None), Err(Violation::Rfc5046Header.into()));
    }

    /// A target (configured by `cfg`) and an initiator connected over the software RNIC, their
    /// drivers running, in full feature phase.
    async fn connected(cfg: IserConfig) -> (IserDatamover<riser_iwarp::SoftRnic>, IserDatamover<riser_iwarp::SoftRnic>) {
        use riser_datamover::{ConnectionResources, Datamover};
        use riser_verbs::Listener;
        let rnic = riser_iwarp::SoftRnic::default();
        let listener = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
        let addr = listener.local_addr().unwrap();
        let r = rnic.clone();
        let target = tokio::task::spawn_blocking(move || super::super::accept(&r, listener.get_request().unwrap(), cfg));
        let initiator =
            tokio::task::spawn_blocking(move || super::super::connect(&rnic, addr, IserConfig::default())).await.unwrap().unwrap();
        let (target, _) = target.await.unwrap().unwrap();
        for dm in [&target, &initiator] {
            tokio::spawn(dm.driver());
            dm.allocate_connection_resources(ConnectionResources::default()).unwrap();
            dm.enable();
        }
        (target, initiator)
    }

    /// An initiator's commands wait for the turn's end and leave together, posted by the
    /// flusher; the eighth gathered, or one with more than 64 KiB of data, posts them at once.
    /// The target handles them in the order they arrived, large or small. (A current-thread
    /// runtime: nothing else runs until the test yields.)
    #[tokio::test(flavor = "current_thread")]
    async fn an_initiators_commands_leave_after_the_turn_or_at_the_eighth() {
        use riser_datamover::Datamover;
        use riser_iscsi::keys::{NegotiatedParams, Transport};
        use riser_iscsi::wire::ScsiCommand;
        // The target receives segments of up to 128 KiB.
        let (target, initiator) = connected(IserConfig::default().recv_dsl(128 << 10)).await;
        let gathered = || lock(&initiator.s.unsignaled).gathering.as_ref().map_or(0, Vec::len);
        let read = |itt: u32| ScsiCommand { final_: true, read: true, itt, expected_data_len: 512, cmd_sn: itt, ..ScsiCommand::default() };
        for itt in 1..8 {
            initiator.send_command(read(itt), Bytes::new(), 512, None).await.unwrap();
            assert_eq!(gathered(), itt as usize, "gathered until the turn ends");
        }
        initiator.send_command(read(8), Bytes::new(), 512, None).await.unwrap();
        assert_eq!(gathered(), 0, "the eighth posts them at once");
        for itt in 9..12 {
            initiator.send_command(read(itt), Bytes::new(), 512, None).await.unwrap();
        }
        assert_eq!(gathered(), 3);
        // The turn ends here: the flusher posts the rest, and all arrive in order.
        for itt in 1..12 {
            let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.expect("a command");
            assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), .. }) if c.itt == itt), "{ev:?}");
        }
        assert_eq!(gathered(), 0);
        // A command with up to 64 KiB of data (here 16 KiB of immediate data, registered where
        // it lies) is gathered too; one with more (96 KiB, the target receiving 128 KiB
        // segments) leaves at once, with what was gathered before it: the target starts on its
        // data while the next command is made.
        let p = NegotiatedParams {
            transport: Transport::Iser,
            immediate_data: true,
            target_recv_data_segment_length: 128 << 10,
            first_burst_length: 128 << 10,
            ..NegotiatedParams::default()
        };
        initiator.notice_key_values(&p);
        initiator.send_command(read(12), Bytes::new(), 512, None).await.unwrap();
        assert_eq!(gathered(), 1);
        let write = |itt: u32, len: usize| {
            let cmd = ScsiCommand { final_: true, write: true, itt, expected_data_len: len as u32, cmd_sn: itt, ..ScsiCommand::default() };
            (cmd, Bytes::from(vec![itt as u8; len]))
        };
        let (cmd, data) = write(13, 16 << 10);
        initiator.send_command(cmd, Bytes::new(), 0, Some(data)).await.unwrap();
        assert_eq!(gathered(), 2, "16 KiB of data: gathered");
        let (cmd, data) = write(14, 96 << 10);
        initiator.send_command(cmd, Bytes::new(), 0, Some(data)).await.unwrap();
        assert_eq!(gathered(), 0, "96 KiB: posted at once, with the commands gathered before it");
        // A small PDU right behind the large one is handled after it (every received message
        // is handled by the driver, in the order it arrived).
        let ping = NopOut { immediate: true, itt: 15, ttt: RESERVED_TAG, ..NopOut::default() };
        initiator.send_control(ControlPdu::new(Header::NopOut(ping), Bytes::new())).await.unwrap();
        for (itt, data) in [(12, 0), (13, 16 << 10), (14, 96 << 10), (15, 0)] {
            let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.expect("a PDU");
            let DmEvent::Control(ControlPdu { header, immediate, .. }) = &ev else { panic!("{ev:?}") };
            assert_eq!((header.itt(), *immediate), (itt, data), "{ev:?}");
        }
    }

    /// While a thread posts, another's requests never wait for it: they are left, in the order
    /// their ids were drawn, to the posting thread, which posts them after its own before it
    /// stops (here the test plays the posting thread). Single requests and a gathered list
    /// alike; every PDU arrives, in that order.
    #[tokio::test(flavor = "current_thread")]
    async fn requests_taken_while_another_thread_posts_are_left_to_it_in_order() {
        use riser_datamover::{Attempt, Datamover};
        let (target, initiator) = connected(IserConfig::default()).await;
        let ping = |itt: u32| {
            ControlPdu::new(Header::NopOut(NopOut { immediate: true, itt, ttt: RESERVED_TAG, ..NopOut::default() }), Bytes::new())
        };
        let read = |itt: u32| ScsiCommand { final_: true, read: true, itt, expected_data_len: 512, cmd_sn: itt, ..ScsiCommand::default() };
        // Another thread is posting (and never finishes while the test looks).
        lock(&initiator.s.unsignaled).posting = true;
        std::thread::scope(|t| {
            t.spawn(|| {
                for itt in 1..=3 {
                    assert!(matches!(initiator.try_send_control(ping(itt)), Attempt::Done(Ok(()))), "returns at once");
                }
                // Two commands gathered, then released as one list.
                for itt in 4..=5 {
                    assert!(matches!(initiator.try_send_command(read(itt), Bytes::new(), 512, None), Attempt::Done(Ok(()))));
                }
                initiator.s.release_sends().expect("left to the posting thread");
                assert!(matches!(initiator.try_send_control(ping(6)), Attempt::Done(Ok(()))));
            });
        });
        let left: Vec<usize> = lock(&initiator.s.unsignaled)
            .ready
            .iter()
            .map(|p| match p {
                Post::One { .. } => 1,
                Post::List(l) => l.len(),
            })
            .collect();
        assert_eq!(left, [1, 1, 1, 2, 1], "left in order, as they were to be posted");
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(target.try_next_event().is_none(), "nothing posted yet");
        // The posting thread, its own post done, posts what was left and stops.
        initiator.s.post_ready(None);
        let idle = {
            let u = lock(&initiator.s.unsignaled);
            !u.posting && u.ready.is_empty()
        };
        assert!(idle, "posting stopped, nothing left");
        for itt in 1..=6 {
            let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.expect("a PDU");
            let DmEvent::Control(ControlPdu { header, .. }) = &ev else { panic!("{ev:?}") };
            assert_eq!(header.itt(), itt, "{ev:?}");
        }
        // Nobody posting now: a request is posted by its own thread at once.
        assert!(matches!(initiator.try_send_control(ping(7)), Attempt::Done(Ok(()))));
        assert!(lock(&initiator.s.unsignaled).ready.is_empty());
        let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.expect("a PDU");
        assert!(matches!(&ev, DmEvent::Control(ControlPdu { header, .. }) if header.itt() == 7), "{ev:?}");
    }

    /// A connection ended while another thread posts waits for that thread to post what was
    /// left to it: a command sent before the end (unsignaled: nothing in `waiting` holds the
    /// end back for it) arrives before the end.
    #[tokio::test(flavor = "current_thread")]
    async fn an_end_waits_for_what_was_left_to_a_thread_still_posting() {
        use riser_datamover::{Attempt, Datamover};
        let (target, initiator) = connected(IserConfig::default()).await;
        let read = ScsiCommand { final_: true, read: true, itt: 1, expected_data_len: 512, cmd_sn: 1, ..ScsiCommand::default() };
        lock(&initiator.s.unsignaled).posting = true;
        assert!(matches!(initiator.try_send_command(read, Bytes::new(), 512, None), Attempt::Done(Ok(()))));
        initiator.s.release_sends().expect("left to the posting thread");
        assert!(lock(&initiator.s.waiting).is_empty(), "nothing signaled to wait for");
        initiator.terminate();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(initiator.s.qp.is_connected(), "the end waits for the posting thread");
        initiator.s.post_ready(None);
        let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.expect("the command");
        assert!(matches!(&ev, DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), .. }) if c.itt == 1), "{ev:?}");
        let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.expect("the end");
        assert!(matches!(ev, DmEvent::Terminated(_)), "{ev:?}");
    }

    /// Read data waiting for room always gets it: the room that unsignaled writes with no
    /// signaled request behind them may hold (whose completion may never come) is kept out of
    /// what one write takes, their rounding to whole units included. Seven reads of 146 KiB and
    /// their responses (14 requests, just under 1 MiB, none signaled) held 259 units of 4 KiB,
    /// and a 1 MiB read then asked for 256 of the 253 left: it waited for a completion that
    /// could not come, and its connection was given up.
    #[tokio::test(flavor = "current_thread")]
    async fn read_data_waiting_for_room_gets_it_whatever_unsignaled_writes_round_up_to() {
        use riser_datamover::{DataInDesc, Datamover};
        use riser_iscsi::wire::ScsiResponse;
        let (target, initiator) = connected(IserConfig::default().read_data_in_flight(2 << 20)).await;
        let read = |itt: u32, len: usize| ScsiCommand {
            final_: true,
            read: true,
            itt,
            expected_data_len: len as u32,
            cmd_sn: itt,
            ..ScsiCommand::default()
        };
        let command = async |itt: u32, len: usize| {
            initiator.send_command(read(itt, len), Bytes::new(), len as u32, None).await.unwrap();
            let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.expect("the command");
            assert!(matches!(&ev, DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), .. }) if c.itt == itt), "{ev:?}");
        };
        let small = 149_504;
        for itt in 1..=7 {
            command(itt, small).await;
            let desc = DataInDesc { itt, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
            target.put_data(desc, Bytes::from(vec![itt as u8; small])).await.unwrap();
            let r = ScsiResponse { itt, stat_sn: itt, ..ScsiResponse::default() };
            target.send_control(ControlPdu::new(Header::ScsiResponse(r), Bytes::new())).await.unwrap();
        }
        assert!(lock(&target.s.waiting).is_empty(), "nothing signaled: no completion comes for what they hold");
        assert_eq!(target.s.writes_in_flight.held(), 7 * 37 * super::super::WRITE_UNIT, "more than 1 MiB held, in whole units");
        let big = 1 << 20;
        command(8, big).await;
        command(9, big).await;
        assert_eq!(target.s.writes_in_flight.held(), 7 * 37 * super::super::WRITE_UNIT, "nothing completed meanwhile");
        let desc = DataInDesc { itt: 8, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
        let put = tokio::time::timeout(Duration::from_secs(3), target.put_data(desc, Bytes::from(vec![8u8; big]))).await;
        assert!(matches!(put, Ok(Ok(_))), "the 1 MiB read got no room: {put:?}");
        // The next 1 MiB read finds too little room left and waits: the completions that come
        // (the 1 MiB write is signaled, its megabyte) give it back.
        assert!(target.s.writes_in_flight.try_take(big as u64).is_err(), "no room for it yet: the test would show nothing");
        let desc = DataInDesc { itt: 9, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
        let put = tokio::time::timeout(Duration::from_secs(3), target.put_data(desc, Bytes::from(vec![9u8; big]))).await;
        assert!(matches!(put, Ok(Ok(_))), "the second 1 MiB read waited for room that never came: {put:?}");
    }

    /// An initiator keeps the regions of its small reads, one per length: the next read of
    /// that length takes one with a fresh buffer and a new key (the same STag index, never an
    /// earlier STag), each serves 16 reads at most before it is let go, and a read the target
    /// wrote only part of (or none of) shows zeros where it did not write, never an earlier
    /// read's bytes. The connection's end lets them all go.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_initiator_reuses_its_read_regions_under_new_keys() {
        use riser_datamover::{DataInDesc, Datamover, TaskBuffer};
        use riser_iscsi::wire::{ScsiCommand, ScsiResponse};
        let (target, initiator) = connected(IserConfig::default()).await;
        let mut stags: Vec<(usize, u32)> = Vec::new();
        let mut reused = 0;
        for itt in 1u32..=48 {
            // 4 KiB and 8 KiB reads in turn, written whole, in part or not at all.
            let len = if itt % 2 == 1 { 4096usize } else { 8192 };
            let written = [len, 1000, len, 0][(itt as usize / 2) % 4];
            let cmd = ScsiCommand { final_: true, read: true, itt, expected_data_len: len as u32, cmd_sn: itt, ..ScsiCommand::default() };
            initiator.send_command(cmd, Bytes::new(), len as u32, None).await.unwrap();
            let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.expect("the command");
            assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), .. }) if c.itt == itt), "{ev:?}");
            let stag = lock(&target.s.remote).get(&itt).and_then(|r| r.read).expect("a read STag").stag;
            assert!(stags.iter().all(|&(_, s)| s != stag), "itt {itt}: an earlier read's STag came back");
            reused += usize::from(stags.iter().any(|&(l, s)| l == len && s >> 8 == stag >> 8));
            stags.push((len, stag));
            let data: Vec<u8> = (0..written).map(|i| (i as u8).wrapping_mul(7).wrapping_add(itt as u8)).collect();
            if written > 0 {
                let desc = DataInDesc { itt, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
                target.put_data(desc, Bytes::from(data.clone())).await.unwrap();
            }
            let r = ScsiResponse { itt, stat_sn: itt, ..ScsiResponse::default() };
            target.send_control(ControlPdu::new(Header::ScsiResponse(r), Bytes::new())).await.unwrap();
            let ev = tokio::time::timeout(Duration::from_secs(5), initiator.next_event()).await.expect("the response");
            assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiResponse(r), .. }) if r.itt == itt), "{ev:?}");
            let got = initiator.take_read_data(itt).expect("the read's data");
            assert_eq!(got.len(), len);
            assert!(got[..written] == data[..], "itt {itt}: the target's data");
            assert!(got[written..].iter().all(|&b| b == 0), "itt {itt}: zeros where the target wrote nothing");
            initiator.deallocate_task_resources(itt);
            target.deallocate_task_resources(itt);
            // Back to the pool dirty: a later read's buffer may be this one.
            initiator.release_task_buffer(TaskBuffer { data: got });
        }
        // 24 reads of each length: a region each, let go after 16, so two regions each.
        assert_eq!(reused, 48 - 4, "every read but the first of each region took a kept one");
        for len in [4096, 8192] {
            let mut indexes: Vec<u32> = stags.iter().filter(|&&(l, _)| l == len).map(|&(_, s)| s >> 8).collect();
            indexes.dedup();
            assert_eq!(indexes.len(), 2, "{len} bytes: a region serves 16 reads, then another");
        }
        assert_eq!(lock(&initiator.s.read_regions).len(), 2, "one region per length kept");
        initiator.deallocate_connection_resources();
        assert!(lock(&initiator.s.read_regions).is_empty(), "let go with the connection's resources");
    }

    /// The full-feature receives go up once: at allocate_connection_resources, or at enable
    /// for a consumer that skipped it (it used to run on the four login receives, and a burst
    /// of responses ended the connection: Send with no receive posted).
    #[test]
    fn full_feature_receives_are_posted_once_even_without_allocation() {
        use riser_datamover::{ConnectionResources, Datamover};
        let posted = |dm: &IserDatamover<riser_iwarp::SoftRnic>| lock(&dm.s.recvs).len() as u32;
        let depth = IserConfig::default().recv_depth;
        let (_rnic, dm) = target();
        assert!(posted(&dm) < depth);
        dm.enable();
        assert_eq!(posted(&dm), depth);
        let (_rnic, dm) = target();
        dm.allocate_connection_resources(ConnectionResources::default()).unwrap();
        dm.enable();
        assert_eq!(posted(&dm), depth);
    }
}
