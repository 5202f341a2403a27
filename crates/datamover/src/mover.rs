//! [`PduDatamover`]: the iSCSI/TCP datamover semantics (RFC 7143 data transfer with Data-In,
//! R2T and Data-Out PDUs) over any [`LinkRx`]/[`LinkTx`] pair. riser-tcp supplies the socket
//! link; [`crate::loopback`] an in-memory one for tests.

use crate::link::{LinkParams, LinkRx, LinkTx};
use crate::{
    BoxFuture, ConnectionResources, ControlPdu, DataInDesc, Datamover, DmError, DmEvent, PutDataDone, R2tPlan, SequenceError, TaskBuffer,
    Terminated, Violation,
};
use bytes::{Bytes, BytesMut};
use riser_iscsi::keys::{NegotiatedParams, Role};
use riser_iscsi::session::TransferLimits;
use riser_iscsi::wire::{DataIn, DataOut, Header, R2t, RESERVED_TAG, ScsiCommand};
use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;
use tokio::sync::{Mutex, Notify, mpsc, watch};

/// Largest write buffer the datamover allocates for one command (EDTL above this is refused
/// by the target core with CHECK CONDITION before any data is solicited).
pub const MAX_TASK_BUFFER: u32 = 64 << 20;

#[derive(Debug)]
struct Solicited {
    ttt: u32,
    offset: u32,
    len: u32,
    received: u32,
    next_data_sn: u32,
}

/// Progress notes from the receiver to a waiting Get_Data.
#[derive(Debug, Clone, Copy)]
enum Notice {
    UnsolicitedDone,
    R2tDone,
    Failed(SequenceError),
}

#[derive(Debug)]
struct WriteTask {
    buf: BytesMut,
    /// Bytes of unsolicited data (immediate + Data-Out with the reserved TTT) received.
    unsolicited: u32,
    /// Whether the unsolicited sequence ended (F bit) or none was allowed.
    unsolicited_done: bool,
    next_unsol_data_sn: u32,
    r2ts: Vec<Solicited>,
    /// Woken with the TTT of each finished R2T (and `RESERVED_TAG` when unsolicited data ends).
    notify: Option<mpsc::UnboundedSender<Notice>>,
    /// Set when the task's data broke sequence: the task ends with CHECK CONDITION and its
    /// further Data-Out is drained.
    failed: Option<SequenceError>,
    /// A Data-Out's data is being read into `buf`, which is out of the table meanwhile (the
    /// lock is not held across the read); the task itself stays, so Get_Data always finds it.
    reading: bool,
}

/// Initiator side: a read buffer Data-In lands in.
#[derive(Debug)]
struct ReadTask {
    buf: BytesMut,
}

/// Initiator side: write data the target may solicit with R2Ts.
#[derive(Debug)]
struct OutWrite {
    lun: riser_scsi::lun::Lun,
    data: Bytes,
}

struct Shared {
    role: Role,
    reads: StdMutex<HashMap<u32, ReadTask>>,
    pool: crate::BufferPool,
    out_writes: StdMutex<HashMap<u32, OutWrite>>,
    r2t_queue: mpsc::UnboundedSender<R2t>,
    tx: Mutex<Box<dyn LinkTx>>,
    limits: StdMutex<TransferLimits>,
    pending_rx_params: StdMutex<Option<LinkParams>>,
    pending_tx_params: StdMutex<Option<LinkParams>>,
    writes: StdMutex<HashMap<u32, WriteTask>>,
    /// Woken whenever a Data-Out's read ends and its task's buffer is back (`reading` false),
    /// and whenever tasks leave the table (so a Get_Data waiting on a read learns it is gone).
    write_read_done: Notify,
    events_tx: mpsc::UnboundedSender<DmEvent>,
    events_rx: Mutex<mpsc::UnboundedReceiver<DmEvent>>,
    /// Login (PDUs read one at a time by [`Datamover::next_event`]), enabled (the receive
    /// driver reads), or closed.
    phase: watch::Sender<Phase>,
    /// The receiving half of the link: read on demand during login, then taken by the driver.
    login_rx: Mutex<Option<Box<dyn LinkRx>>>,
    /// Once a PDU's header is in, its AHS and data segment must follow within this long
    /// (milliseconds): a peer that announces a segment and stalls cannot hold the connection.
    segment_timeout_ms: AtomicU64,
}

/// Default of [`PduDatamover::set_segment_timeout`]: a whole data segment (at most 16 MiB) in
/// 30 s is 0.5 MiB/s, slow enough for any live peer.
pub const DEFAULT_SEGMENT_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a connection is, as the datamover sees it (RFC 5047 §7: Enable_Datamover ends login).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Login,
    Enabled,
    Closed,
}

/// A datamover moving data as iSCSI PDUs over a link.
#[derive(Clone)]
pub struct PduDatamover {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PduDatamover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PduDatamover").field("role", &self.shared.role).finish_non_exhaustive()
    }
}

impl PduDatamover {
    /// A datamover for `role` over a link. The returned future is the receive driver: spawn it
    /// on any executor; it ends when the connection does (after sending
    /// Connection_Terminate_Notify).
    pub fn new(role: Role, rx: Box<dyn LinkRx>, tx: Box<dyn LinkTx>) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (r2t_tx, r2t_rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            role,
            reads: StdMutex::new(HashMap::new()),
            pool: crate::BufferPool::default(),
            out_writes: StdMutex::new(HashMap::new()),
            r2t_queue: r2t_tx,
            tx: Mutex::new(tx),
            limits: StdMutex::new(TransferLimits::default()),
            pending_rx_params: StdMutex::new(None),
            pending_tx_params: StdMutex::new(None),
            writes: StdMutex::new(HashMap::new()),
            write_read_done: Notify::new(),
            events_tx,
            events_rx: Mutex::new(events_rx),
            phase: watch::Sender::new(Phase::Login),
            login_rx: Mutex::new(Some(rx)),
            segment_timeout_ms: AtomicU64::new(DEFAULT_SEGMENT_TIMEOUT.as_millis() as u64),
        });
        let me = Self { shared: shared.clone() };
        let r2t_server = me.clone().serve_r2ts(r2t_rx);
        let driver = async move {
            // Receiving and answering R2Ts run side by side so a large Data-Out burst never
            // stops us from reading (both sides writing into full sockets would deadlock).
            tokio::select! {
                _ = Self::drive(shared) => {}
                _ = r2t_server => {}
            }
        };
        (me, driver)
    }

    /// Whether two handles are the same connection's datamover.
    pub fn same(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    /// How long a PDU's AHS and data segment may take to arrive once its header has (default
    /// [`DEFAULT_SEGMENT_TIMEOUT`]); past it the connection ends.
    pub fn set_segment_timeout(&self, t: Duration) {
        self.shared.segment_timeout_ms.store(t.as_millis().min(u128::from(u64::MAX)) as u64, Ordering::Relaxed);
    }

    /// One login-phase PDU, read when the iSCSI layer asks for it; `None` once enabled.
    async fn login_event(shared: &Shared) -> Option<DmEvent> {
        let mut phase = shared.phase.subscribe();
        let mut link = shared.login_rx.lock().await;
        let rx = link.as_mut().filter(|_| *phase.borrow_and_update() == Phase::Login)?;
        let read = async {
            let h = match rx.read_header().await {
                Ok(Some(h)) => h,
                Ok(None) => return DmEvent::Terminated(Terminated::PeerClosed),
                Err(e) => return DmEvent::Terminated(Terminated::Error(e)),
            };
            let mut data = BytesMut::zeroed(h.data_len);
            match (h.malformed, rx.read_data(&mut data).await) {
                (_, Err(e)) => DmEvent::Terminated(Terminated::Error(e)),
                // Nothing is rejected during login: a malformed login PDU ends the attempt.
                (Some(e), Ok(())) => DmEvent::Terminated(Terminated::Error(e.into())),
                (None, Ok(())) => DmEvent::Control(ControlPdu { header: h.header, ahs: h.ahs, data: data.freeze(), immediate: 0 }),
            }
        };
        tokio::select! {
            ev = read => Some(ev),
            _ = phase.wait_for(|p| *p == Phase::Closed) => Some(DmEvent::Terminated(Terminated::Local)),
        }
    }

    async fn drive(shared: Arc<Shared>) {
        let mut phase = shared.phase.subscribe();
        // Nothing is read ahead during login (the iSCSI layer reads each login PDU through
        // `next_event`): Enable_Datamover starts this loop, with the negotiated framing.
        if phase.wait_for(|p| *p != Phase::Login).await.map_or(true, |p| *p == Phase::Closed) {
            let _ = shared.events_tx.send(DmEvent::Terminated(Terminated::Local));
            return;
        }
        let Some(mut rx) = shared.login_rx.lock().await.take() else { return };
        let why = loop {
            // New framing (digests, limits) applies from the next PDU.
            if let Some(p) = lock(&shared.pending_rx_params).take() {
                rx.set_params(p);
            }
            let next = tokio::select! {
                r = rx.read_header() => r,
                _ = phase.wait_for(|p| *p == Phase::Closed) => break Terminated::Local,
            };
            let h = match next {
                Ok(Some(h)) => h,
                Ok(None) => break Terminated::PeerClosed,
                Err(e) => break Terminated::Error(e),
            };
            // The rest of the PDU, bounded in time and still ending at a local close: a peer
            // that announces a data segment and stalls must not keep the connection.
            let limit = Duration::from_millis(shared.segment_timeout_ms.load(Ordering::Relaxed));
            let len = h.data_len as u32;
            tokio::select! {
                r = tokio::time::timeout(limit, Self::receive(&shared, rx.as_mut(), h)) => match r {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => break Terminated::Error(e),
                    Err(_) => break Terminated::Error(Violation::SegmentStalled { len, secs: limit.as_secs() }.into()),
                },
                _ = phase.wait_for(|p| *p == Phase::Closed) => break Terminated::Local,
            }
        };
        // Fail every waiting Get_Data (also one waiting for a Data-Out's read to end).
        lock(&shared.writes).clear();
        shared.write_read_done.notify_waiters();
        let _ = shared.events_tx.send(DmEvent::Terminated(why));
    }

    /// Initiator: send the Data-Out PDUs each R2T asks for, from the command's write buffer.
    async fn serve_r2ts(self, mut q: mpsc::UnboundedReceiver<R2t>) {
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
    /// DataSN from 0, F on the last.
    async fn send_data_out(
        &self,
        itt: u32,
        lun: riser_scsi::lun::Lun,
        ttt: u32,
        data: &Bytes,
        start: usize,
        end: usize,
    ) -> Result<(), DmError> {
        let seg = lock(&self.shared.limits).send_segment();
        let mut at = start;
        let mut sn = 0;
        while at < end {
            let n = seg.min(end - at);
            let h = DataOut { final_: at + n == end, lun, itt, ttt, data_sn: sn, buffer_offset: at as u32, ..DataOut::default() };
            self.send(Header::DataOut(h), &[], &[&data[at..at + n]]).await?;
            at += n;
            sn += 1;
        }
        Ok(())
    }

    /// Initiator: Send_Control for a SCSI Command with its buffers. Immediate data rides in the
    /// command PDU and unsolicited Data-Out follows as negotiated; solicited data goes out as
    /// the target's R2Ts arrive; Data-In lands in a read buffer of `read_len` bytes, handed out
    /// by [`Datamover::take_read_data`] when the command ends.
    pub async fn send_scsi_command(&self, mut cmd: ScsiCommand, ahs: Bytes, read_len: u32, write: Option<Bytes>) -> Result<(), DmError> {
        if read_len > 0 {
            lock(&self.shared.reads).insert(cmd.itt, ReadTask { buf: self.shared.pool.take(read_len as usize) });
        }
        let Some(data) = write.filter(|d| !d.is_empty()) else {
            cmd.final_ = true;
            return self.send(Header::ScsiCommand(cmd), &ahs, &[]).await;
        };
        let len = data.len();
        let split = lock(&self.shared.limits).outgoing_write(u32::try_from(len).unwrap_or(u32::MAX), true);
        let (immediate, unsolicited_end) = (split.immediate as usize, split.unsolicited_end as usize);
        cmd.final_ = split.command_is_final();
        if unsolicited_end < len {
            lock(&self.shared.out_writes).insert(cmd.itt, OutWrite { lun: cmd.lun, data: data.clone() });
        }
        self.send(Header::ScsiCommand(cmd), &ahs, &[&data[..immediate]]).await?;
        if unsolicited_end > immediate {
            self.send_data_out(cmd.itt, cmd.lun, RESERVED_TAG, &data, immediate, unsolicited_end).await?;
        }
        Ok(())
    }

    fn take_read_buffer(&self, itt: u32) -> Option<BytesMut> {
        lock(&self.shared.out_writes).remove(&itt);
        lock(&self.shared.reads).remove(&itt).map(|r| r.buf)
    }

    async fn receive_data_in(shared: &Shared, rx: &mut dyn LinkRx, d: DataIn, len: usize) -> Result<(), DmError> {
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

    async fn receive(shared: &Shared, rx: &mut dyn LinkRx, h: crate::link::RxHeader) -> Result<(), DmError> {
        if let (Some(error), Header::Unknown(bhs)) = (h.malformed, h.header) {
            // Well framed, but a field breaks a rule whose answer is a Reject: the data goes
            // nowhere and the session rejects the header.
            let mut scratch = vec![0u8; h.data_len];
            rx.read_data(&mut scratch).await?;
            let _ = shared.events_tx.send(DmEvent::Malformed { bhs, error });
            return Ok(());
        }
        match h.header {
            Header::DataIn(d) if shared.role == Role::Initiator => Self::receive_data_in(shared, rx, d, h.data_len).await,
            Header::R2t(r) if shared.role == Role::Initiator => {
                let _ = shared.r2t_queue.send(r);
                Ok(())
            }
            Header::ScsiCommand(cmd) if shared.role == Role::Target && cmd.write && cmd.expected_data_len > 0 => {
                Self::receive_write_command(shared, rx, cmd, h.ahs, h.data_len).await
            }
            Header::DataOut(d) if shared.role == Role::Target => Self::receive_data_out(shared, rx, d, h.data_len).await,
            header => {
                let mut data = BytesMut::zeroed(h.data_len);
                rx.read_data(&mut data).await?;
                let _ = shared.events_tx.send(DmEvent::Control(ControlPdu { header, ahs: h.ahs, data: data.freeze(), immediate: 0 }));
                Ok(())
            }
        }
    }

    async fn receive_write_command(
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
            let mut scratch = vec![0u8; data_len];
            rx.read_data(&mut scratch).await?;
            let _ = shared.events_tx.send(DmEvent::Control(ControlPdu {
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
        // the unsolicited part is taken now (at most FirstBurstLength); Get_Data takes the
        // rest once the core decides to collect it (within its per-session memory budget).
        let split = limits.incoming_write(edtl, data_len as u32, cmd.final_);
        let first = split.unsolicited_end;
        let mut buf = shared.pool.take_dirty(first as usize);
        rx.read_data(&mut buf[..data_len]).await?;
        let task = WriteTask {
            buf,
            unsolicited: data_len as u32,
            unsolicited_done: split.unsolicited_data_out() == 0,
            next_unsol_data_sn: 0,
            r2ts: Vec::new(),
            notify: None,
            // F=0 announces unsolicited Data-Out, which InitialR2T=Yes forbids (RFC 7143
            // §11.2.1.6): the task fails rather than guess where the data starts.
            failed: (limits.initial_r2t && !cmd.final_).then_some(SequenceError::UnsolicitedWithInitialR2t),
            reading: false,
        };
        if lock(&shared.writes).insert(cmd.itt, task).is_some() {
            return Err(Violation::TaskTagReused { itt: cmd.itt }.into());
        }
        let _ = shared.events_tx.send(DmEvent::Control(ControlPdu {
            header: Header::ScsiCommand(cmd),
            ahs,
            data: Bytes::new(),
            immediate: data_len as u32,
        }));
        Ok(())
    }

    async fn receive_data_out(shared: &Shared, rx: &mut dyn LinkRx, d: DataOut, len: usize) -> Result<(), DmError> {
        let first_burst = lock(&shared.limits).first_burst;
        let len32 = len as u32;
        // Check the PDU against its task and take the task's buffer out while reading into it
        // (the lock is not held across the read); the task stays in the table meanwhile.
        let checked = {
            let mut writes = lock(&shared.writes);
            match writes.get_mut(&d.itt) {
                // An aborted or unknown task, or one that already failed: drain the data.
                None => None,
                Some(task) if task.failed.is_some() => None,
                Some(task) => match Self::check_data_out(task, &d, len32, first_burst) {
                    Ok(slot) => {
                        task.reading = true;
                        Some((slot, std::mem::take(&mut task.buf)))
                    }
                    Err(msg) => {
                        // The PDU itself is well framed: drain it and end just this task (CHECK
                        // CONDITION) rather than the connection, so other commands are unaffected.
                        task.failed = Some(msg);
                        if let Some(n) = &task.notify {
                            let _ = n.send(Notice::Failed(msg));
                        }
                        None
                    }
                },
            }
        };
        let Some((slot, mut buf)) = checked else {
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
        match slot {
            None => {
                task.unsolicited += len32;
                task.next_unsol_data_sn += 1;
                if d.final_ {
                    task.unsolicited_done = true;
                    // The unsolicited burst is FirstBurstLength or the whole transfer, never
                    // less (as LIO): the target solicits only what lies beyond it, so a burst
                    // ended early would leave bytes of the buffer nobody sent.
                    let expected = first_burst.min(task.buf.len() as u32);
                    let notice = if task.unsolicited == expected {
                        Notice::UnsolicitedDone
                    } else {
                        task.failed = Some(SequenceError::UnsolicitedEndedEarly);
                        Notice::Failed(SequenceError::UnsolicitedEndedEarly)
                    };
                    if let Some(n) = &task.notify {
                        let _ = n.send(notice);
                    }
                }
            }
            Some(i) => {
                let r = &mut task.r2ts[i];
                r.received += len32;
                r.next_data_sn += 1;
                if r.received == r.len {
                    if !d.final_ {
                        return Err(Violation::BurstWithoutFinal.into());
                    }
                    task.r2ts.swap_remove(i);
                    if let Some(n) = &task.notify {
                        let _ = n.send(Notice::R2tDone);
                    }
                }
            }
        }
        Ok(())
    }

    /// Where a Data-Out belongs in its task: `None` for unsolicited data, the index of its R2T
    /// otherwise; or why it breaks the task's sequence.
    fn check_data_out(task: &WriteTask, d: &DataOut, len: u32, first_burst: u32) -> Result<Option<usize>, SequenceError> {
        if d.ttt == RESERVED_TAG {
            let end = d.buffer_offset.checked_add(len);
            if task.unsolicited_done {
                Err(SequenceError::UnsolicitedAfterEnd)
            } else if d.buffer_offset != task.unsolicited {
                Err(SequenceError::UnsolicitedOutOfOrder)
            } else if end.is_none_or(|e| e > first_burst || e as usize > task.buf.len()) {
                Err(SequenceError::BeyondFirstBurst)
            } else if d.data_sn != task.next_unsol_data_sn {
                Err(SequenceError::DataSn)
            } else {
                Ok(None)
            }
        } else {
            match task.r2ts.iter().position(|r| r.ttt == d.ttt) {
                None => Err(SequenceError::UnknownTtt),
                Some(i) => {
                    let r = &task.r2ts[i];
                    if d.buffer_offset != r.offset + r.received || r.received + len > r.len {
                        Err(SequenceError::OutsideR2t)
                    } else if d.data_sn != r.next_data_sn {
                        Err(SequenceError::DataSn)
                    } else {
                        Ok(Some(i))
                    }
                }
            }
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
        if unsolicited_len > total_len || task.unsolicited > total_len {
            writes.remove(&itt);
            return Err(SequenceError::UnsolicitedBeyondLength { len: total_len }.into());
        }
        // The buffer holds the unsolicited part so far; the whole transfer's memory is
        // taken only now, when the core has decided to collect it.
        if task.buf.len() != total_len as usize {
            let mut whole = self.shared.pool.take_dirty(total_len as usize);
            let have = task.unsolicited as usize;
            whole[..have].copy_from_slice(&task.buf[..have]);
            let old = std::mem::replace(&mut task.buf, whole);
            self.shared.pool.give(old);
        }
        if task.unsolicited >= unsolicited_len {
            task.unsolicited_done = true;
        }
        // Every byte is covered exactly once — the unsolicited part, then the solicited
        // range — and the buffer is reused, not cleared: unsolicited data that ended
        // short of what the core counts on fails the task (a gap would be written).
        if task.unsolicited_done && task.unsolicited != unsolicited_len && task.failed.is_none() {
            task.failed = Some(SequenceError::UnsolicitedShort { got: task.unsolicited, due: unsolicited_len });
        }
        if let Some(e) = task.failed {
            writes.remove(&itt);
            return Err(e.into());
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

    async fn send(&self, header: Header, ahs: &[u8], data: &[&[u8]]) -> Result<(), DmError> {
        let mut tx = self.shared.tx.lock().await;
        // New framing applies to what is sent once the datamover is enabled: the final login
        // PDU, sent after Notice_Key_Values, still goes out with the login's.
        if *self.shared.phase.borrow() != Phase::Login
            && let Some(p) = lock(&self.shared.pending_tx_params).take()
        {
            tx.set_params(p);
        }
        tx.write_pdu(&header, ahs, data).await
    }
}

fn lock<T>(m: &StdMutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Datamover for PduDatamover {
    fn send_command(&self, cmd: ScsiCommand, ahs: Bytes, read_len: u32, write: Option<Bytes>) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(self.send_scsi_command(cmd, ahs, read_len, write))
    }

    fn take_read_data(&self, itt: u32) -> Option<BytesMut> {
        self.take_read_buffer(itt)
    }

    fn collapses_status(&self) -> bool {
        true
    }

    fn send_control(&self, pdu: ControlPdu) -> BoxFuture<'_, Result<(), DmError>> {
        Box::pin(async move { self.send(pdu.header, &pdu.ahs, &[&pdu.data]).await })
    }

    fn put_data(&self, desc: DataInDesc, data: Bytes) -> BoxFuture<'_, Result<PutDataDone, DmError>> {
        Box::pin(async move {
            let l = *lock(&self.shared.limits);
            let (seg, burst) = (l.send_segment(), l.burst());
            let mut done = PutDataDone::default();
            let mut sent = 0usize;
            let mut in_burst = 0usize;
            while sent < data.len() || (data.is_empty() && done.pdus == 0 && desc.collapse_status.is_some()) {
                let n = seg.min(data.len() - sent).min(burst - in_burst);
                let last = sent + n == data.len();
                in_burst += n;
                let end_of_sequence = last || in_burst == burst;
                let mut h = DataIn {
                    final_: end_of_sequence,
                    lun: desc.lun,
                    itt: desc.itt,
                    ttt: RESERVED_TAG,
                    data_sn: desc.data_sn.wrapping_add(done.pdus),
                    buffer_offset: desc.offset + sent as u32,
                    ..DataIn::default()
                };
                if last && let Some(s) = desc.collapse_status {
                    h.status_present = true;
                    h.status = s.status;
                    h.underflow = s.underflow;
                    h.overflow = s.overflow;
                    h.residual = s.residual;
                    h.stat_sn = s.stat_sn;
                    done.status_sent = true;
                }
                if let Some(s) = desc.collapse_status {
                    h.exp_cmd_sn = s.exp_cmd_sn;
                    h.max_cmd_sn = s.max_cmd_sn;
                }
                self.send(Header::DataIn(h), &[], &[&data[sent..sent + n]]).await?;
                done.pdus += 1;
                sent += n;
                if in_burst == burst {
                    in_burst = 0;
                }
                if data.is_empty() {
                    break;
                }
            }
            Ok(done)
        })
    }

    fn get_data(&self, plan: R2tPlan) -> BoxFuture<'_, Result<TaskBuffer, DmError>> {
        Box::pin(async move {
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
                writes.get(&itt).is_some_and(|t| !t.unsolicited_done)
            };
            // One R2T at a time (MaxOutstandingR2T=1), each made when it is sent.
            let count = plan.count();
            let (mut next, mut outstanding, mut finished) = (0u32, false, 0u32);
            while finished < count || unsolicited_pending {
                if !outstanding && let Some(r) = plan.nth(next) {
                    {
                        let mut writes = lock(&self.shared.writes);
                        let Some(task) = writes.get_mut(&itt) else { return Err(DmError::NoTask(itt)) };
                        task.r2ts.push(Solicited { ttt: r.ttt, offset: r.offset, len: r.len, received: 0, next_data_sn: 0 });
                    }
                    let h = R2t {
                        lun: r.lun,
                        itt,
                        ttt: r.ttt,
                        stat_sn: r.stat_sn,
                        exp_cmd_sn: r.exp_cmd_sn,
                        max_cmd_sn: r.max_cmd_sn,
                        r2t_sn: r.r2t_sn,
                        buffer_offset: r.offset,
                        desired_len: r.len,
                    };
                    self.send(Header::R2t(h), &[], &[]).await?;
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
        })
    }

    fn notice_key_values(&self, p: &NegotiatedParams) {
        let limits = p.transfer_limits(self.shared.role);
        *lock(&self.shared.limits) = limits;
        let lp = LinkParams {
            header_digest: p.header_digest,
            data_digest: p.data_digest,
            max_recv_data_segment_length: limits.max_recv_segment,
        };
        *lock(&self.shared.pending_rx_params) = Some(lp);
        *lock(&self.shared.pending_tx_params) = Some(lp);
    }

    fn allocate_connection_resources(&self, _res: ConnectionResources) -> Result<(), DmError> {
        // Receive buffers are allocated per PDU on a byte stream.
        Ok(())
    }

    fn deallocate_connection_resources(&self) {
        lock(&self.shared.writes).clear();
        self.shared.write_read_done.notify_waiters();
    }

    fn enable(&self) {
        self.shared.phase.send_if_modified(|p| {
            let login = *p == Phase::Login;
            if login {
                *p = Phase::Enabled;
            }
            login
        });
    }

    fn deallocate_task_resources(&self, itt: u32) {
        lock(&self.shared.writes).remove(&itt);
        // A Get_Data waiting for a Data-Out's read to end finds the task gone.
        self.shared.write_read_done.notify_waiters();
    }

    fn release_task_buffer(&self, buf: TaskBuffer) {
        self.shared.pool.give(buf.data);
    }

    fn terminate(&self) {
        self.shared.phase.send_replace(Phase::Closed);
    }

    fn next_event(&self) -> BoxFuture<'_, DmEvent> {
        Box::pin(async move {
            if let Some(ev) = Self::login_event(&self.shared).await {
                return ev;
            }
            match self.shared.events_rx.lock().await.recv().await {
                Some(e) => e,
                None => DmEvent::Terminated(Terminated::Local),
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loopback::{RawEnd, pair};
    use riser_iscsi::wire::{DecodeError, LoginRequest, NopOut, Stage};

    /// A target datamover on one end of a loopback link, the other end driven by hand.
    fn target() -> (PduDatamover, RawEnd) {
        let ((a_rx, a_tx), (b_rx, b_tx)) = pair();
        let (dm, driver) = PduDatamover::new(Role::Target, Box::new(a_rx), Box::new(a_tx));
        tokio::spawn(driver);
        (dm, RawEnd { rx: b_rx, tx: b_tx })
    }

    fn final_login() -> Header {
        Header::LoginRequest(LoginRequest { transit: true, nsg: Stage::FULL_FEATURE, ..LoginRequest::default() })
    }

    fn ping_with(len: usize) -> (Header, Bytes) {
        (Header::NopOut(NopOut { immediate: true, itt: 5, ttt: RESERVED_TAG, ..NopOut::default() }), Bytes::from(vec![7u8; len]))
    }

    #[tokio::test]
    async fn nothing_is_read_ahead_of_login_so_the_first_full_feature_pdu_gets_the_new_limits() {
        let (dm, peer) = target();
        // The initiator's first full-feature PDU follows the final login PDU at once, with a
        // data segment beyond the login phase's 8 KiB limit but within the negotiated one.
        peer.send(final_login(), Bytes::new()).unwrap();
        let (h, d) = ping_with(16_384);
        peer.send(h, d.clone()).unwrap();
        assert!(matches!(dm.next_event().await, DmEvent::Control(p) if matches!(p.header, Header::LoginRequest(_))));
        let p = NegotiatedParams { target_recv_data_segment_length: 65_536, ..NegotiatedParams::default() };
        dm.notice_key_values(&p);
        dm.enable();
        match dm.next_event().await {
            DmEvent::Control(p) => assert_eq!((p.header, p.data), (h, d)),
            other => panic!("expected the NOP-Out, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn the_login_limit_holds_until_new_values_are_noticed() {
        let (dm, peer) = target();
        peer.send(final_login(), Bytes::new()).unwrap();
        let (h, d) = ping_with(16_384);
        peer.send(h, d).unwrap();
        assert!(matches!(dm.next_event().await, DmEvent::Control(_)));
        dm.enable();
        let expected = DmError::Decode(DecodeError::DataSegmentTooLong { len: 16_384, max: 8192 });
        match dm.next_event().await {
            DmEvent::Terminated(Terminated::Error(e)) => assert_eq!(e, expected),
            other => panic!("expected the connection to end, got {other:?}"),
        }
    }

    /// A sending half that records the framing each PDU went out with.
    struct RecordingTx(Arc<StdMutex<Vec<(u8, LinkParams)>>>, LinkParams);

    impl LinkTx for RecordingTx {
        fn write_pdu<'a>(&'a mut self, header: &'a Header, _: &'a [u8], _: &'a [&'a [u8]]) -> BoxFuture<'a, Result<(), DmError>> {
            self.0.lock().unwrap().push((header.opcode().0, self.1));
            Box::pin(async { Ok(()) })
        }
        fn set_params(&mut self, p: LinkParams) {
            self.1 = p;
        }
        fn shutdown(&mut self) -> BoxFuture<'_, ()> {
            Box::pin(async {})
        }
    }

    #[tokio::test]
    async fn values_noticed_before_the_final_login_response_frame_only_what_follows_enable() {
        let ((a_rx, _a_tx), _peer) = pair();
        let sent = Arc::new(StdMutex::new(Vec::new()));
        let tx = RecordingTx(sent.clone(), LinkParams::default());
        let (dm, driver) = PduDatamover::new(Role::Target, Box::new(a_rx), Box::new(tx));
        tokio::spawn(driver);
        let digests = NegotiatedParams {
            header_digest: riser_iscsi::keys::Digest::Crc32c,
            data_digest: riser_iscsi::keys::Digest::Crc32c,
            ..NegotiatedParams::default()
        };
        // The target's order: resources and values, the final Login Response, then Enable.
        dm.notice_key_values(&digests);
        let last = riser_iscsi::wire::LoginResponse { transit: true, nsg: Stage::FULL_FEATURE, ..Default::default() };
        dm.send_control(ControlPdu::new(Header::LoginResponse(last), Bytes::new())).await.unwrap();
        dm.enable();
        let nop = riser_iscsi::wire::NopIn { itt: 1, ..Default::default() };
        dm.send_control(ControlPdu::new(Header::NopIn(nop), Bytes::new())).await.unwrap();
        let sent = sent.lock().unwrap().clone();
        assert_eq!(sent[0].1.header_digest, riser_iscsi::keys::Digest::None, "the final Login Response is framed as login");
        assert_eq!(sent[1].1.header_digest, riser_iscsi::keys::Digest::Crc32c, "the first full-feature PDU has the digests");
    }

    #[tokio::test]
    async fn terminating_during_login_ends_a_waiting_next_event() {
        let (dm, _peer) = target();
        let waiting = tokio::spawn({
            let dm = dm.clone();
            async move { dm.next_event().await }
        });
        tokio::task::yield_now().await;
        dm.terminate();
        let ev = tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("next_event ends").unwrap();
        assert!(matches!(ev, DmEvent::Terminated(Terminated::Local)), "{ev:?}");
    }

    #[tokio::test]
    async fn a_peer_closing_during_login_is_reported() {
        let (dm, peer) = target();
        drop(peer);
        assert!(matches!(dm.next_event().await, DmEvent::Terminated(Terminated::PeerClosed)));
    }

    fn write_task(len: usize, unsolicited: u32) -> WriteTask {
        WriteTask {
            buf: BytesMut::zeroed(len),
            unsolicited,
            unsolicited_done: false,
            next_unsol_data_sn: 1,
            r2ts: vec![Solicited { ttt: 9, offset: 65_536, len: 8192, received: 0, next_data_sn: 0 }],
            notify: None,
            failed: None,
            reading: false,
        }
    }

    fn data_out(ttt: u32, offset: u32, data_sn: u32) -> DataOut {
        DataOut { ttt, buffer_offset: offset, data_sn, ..DataOut::default() }
    }

    #[test]
    fn data_out_is_placed_only_where_its_sequence_says() {
        let t = write_task(131_072, 8192);
        let check = |d: DataOut, len| PduDatamover::check_data_out(&t, &d, len, 65_536);
        assert_eq!(check(data_out(RESERVED_TAG, 8192, 1), 8192), Ok(None));
        assert_eq!(check(data_out(RESERVED_TAG, 0, 1), 8192), Err(SequenceError::UnsolicitedOutOfOrder));
        assert_eq!(check(data_out(RESERVED_TAG, 8192, 2), 8192), Err(SequenceError::DataSn));
        assert_eq!(check(data_out(RESERVED_TAG, 8192, 1), 65_536), Err(SequenceError::BeyondFirstBurst));
        assert_eq!(check(data_out(9, 65_536, 0), 8192), Ok(Some(0)));
        assert_eq!(check(data_out(9, 65_536, 1), 8192), Err(SequenceError::DataSn));
        assert_eq!(check(data_out(9, 65_536, 0), 8193), Err(SequenceError::OutsideR2t));
        assert_eq!(check(data_out(9, 70_000, 0), 100), Err(SequenceError::OutsideR2t));
        assert_eq!(check(data_out(10, 65_536, 0), 8192), Err(SequenceError::UnknownTtt));
        let ended = WriteTask { unsolicited_done: true, ..write_task(131_072, 8192) };
        assert_eq!(
            PduDatamover::check_data_out(&ended, &data_out(RESERVED_TAG, 8192, 1), 512, 65_536),
            Err(SequenceError::UnsolicitedAfterEnd)
        );
    }
}
