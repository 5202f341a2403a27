//! A datamover of one's own, swapped in through the RFC 5047 seam ([`Datamover`]) on both roles:
//! a wrapper around riser's iSCSI/TCP datamover that counts what crosses the seam — control
//! PDUs each way, SCSI commands, and the bytes of Put_Data / Get_Data (target) and of write and
//! read buffers (initiator). The same wrapping fits a throttle, a tracer or a fault injector.
//!
//! `cargo run --release --example embed_custom_datamover`
//!
//! The initiator takes it through a [`Connector`] of one's own ([`SessionConfig::connector`]);
//! the target through [`Target::connection`], fed from one's own accept loop on 127.0.0.1 (a port
//! the OS picks). It writes and reads 1 MiB, then checks that both wrappers saw every command and
//! every byte, and that the two sides agree. Exit status 0 when every check held.

use bytes::{Bytes, BytesMut};
use riser::datamover::{
    Attempt, BoxFuture, CommandArgs, ConnectionResources, ControlPdu, DataInDesc, Datamover, DmError, DmEvent, PutDataDone, R2tPlan,
    SharedDatamover, TaskBuffer,
};
use riser::initiator::{Connector, Error, Lun, Session, SessionConfig};
use riser::iscsi::keys::{NegotiatedParams, Role, Transport};
use riser::iscsi::wire::{Header, ScsiCommand};
use riser::target::backend::RamBackend;
use riser::target::lu::{LogicalUnit, LuIdentity};
use riser::target::server::{Node, Target, TargetConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// What one side's datamovers saw.
#[derive(Debug, Default)]
struct Counts {
    control_sent: AtomicU64,
    control_received: AtomicU64,
    commands_sent: AtomicU64,
    commands_received: AtomicU64,
    write_bytes: AtomicU64,
    read_bytes: AtomicU64,
}

/// Any datamover, counted.
#[derive(Debug)]
struct Counting {
    inner: SharedDatamover,
    counts: Arc<Counts>,
}

impl Counting {
    fn received(&self, ev: &DmEvent) {
        if let DmEvent::Control(pdu) = ev {
            self.counts.control_received.fetch_add(1, Relaxed);
            if matches!(pdu.header, Header::ScsiCommand(_)) {
                self.counts.commands_received.fetch_add(1, Relaxed);
            }
        }
    }
}

impl Datamover for Counting {
    fn send_control(&self, pdu: ControlPdu) -> BoxFuture<'_, Result<(), DmError>> {
        self.counts.control_sent.fetch_add(1, Relaxed);
        self.inner.send_control(pdu)
    }
    fn put_data(&self, desc: DataInDesc, data: Bytes) -> BoxFuture<'_, Result<PutDataDone, DmError>> {
        self.counts.read_bytes.fetch_add(data.len() as u64, Relaxed);
        self.inner.put_data(desc, data)
    }
    fn get_data(&self, plan: R2tPlan) -> BoxFuture<'_, Result<TaskBuffer, DmError>> {
        Box::pin(async move {
            let buf = self.inner.get_data(plan).await?;
            self.counts.write_bytes.fetch_add(buf.data.len() as u64, Relaxed);
            Ok(buf)
        })
    }
    fn send_command(&self, cmd: ScsiCommand, ahs: Bytes, read_len: u32, write: Option<Bytes>) -> BoxFuture<'_, Result<(), DmError>> {
        self.counts.commands_sent.fetch_add(1, Relaxed);
        self.counts.write_bytes.fetch_add(write.as_ref().map_or(0, |w| w.len() as u64), Relaxed);
        self.inner.send_command(cmd, ahs, read_len, write)
    }
    // The calls without a future (the hot path: each returns what it was given when it would
    // have to wait, and the caller then makes the waiting call above): counted only when done.
    fn try_send_control(&self, pdu: ControlPdu) -> Attempt<Result<(), DmError>, ControlPdu> {
        let done = self.inner.try_send_control(pdu);
        if let Attempt::Done(_) = done {
            self.counts.control_sent.fetch_add(1, Relaxed);
        }
        done
    }
    fn try_put_data(&self, desc: DataInDesc, data: Bytes) -> Attempt<Result<PutDataDone, DmError>, (DataInDesc, Bytes)> {
        let len = data.len() as u64;
        let done = self.inner.try_put_data(desc, data);
        if let Attempt::Done(_) = done {
            self.counts.read_bytes.fetch_add(len, Relaxed);
        }
        done
    }
    fn try_send_command(
        &self,
        cmd: ScsiCommand,
        ahs: Bytes,
        read_len: u32,
        write: Option<Bytes>,
    ) -> Attempt<Result<(), DmError>, CommandArgs> {
        let len = write.as_ref().map_or(0, |w| w.len() as u64);
        let done = self.inner.try_send_command(cmd, ahs, read_len, write);
        if let Attempt::Done(_) = done {
            self.counts.commands_sent.fetch_add(1, Relaxed);
            self.counts.write_bytes.fetch_add(len, Relaxed);
        }
        done
    }
    fn try_get_data(&self, plan: R2tPlan) -> Attempt<Result<Bytes, DmError>, R2tPlan> {
        let done = self.inner.try_get_data(plan);
        if let Attempt::Done(Ok(data)) = &done {
            self.counts.write_bytes.fetch_add(data.len() as u64, Relaxed);
        }
        done
    }
    fn try_release_sends(&self) -> Attempt<Result<(), DmError>, ()> {
        self.inner.try_release_sends()
    }
    fn take_read_data(&self, itt: u32) -> Option<BytesMut> {
        let data = self.inner.take_read_data(itt);
        self.counts.read_bytes.fetch_add(data.as_ref().map_or(0, |d| d.len() as u64), Relaxed);
        data
    }
    fn next_event(&self) -> BoxFuture<'_, DmEvent> {
        Box::pin(async move {
            let ev = self.inner.next_event().await;
            self.received(&ev);
            ev
        })
    }
    fn try_next_event(&self) -> Option<DmEvent> {
        let ev = self.inner.try_next_event()?;
        self.received(&ev);
        Some(ev)
    }
    // The rest passes through as it is: a wrapper forwards every method, the provided ones
    // too, or it silently loses what the inner datamover does better than the default.
    fn notice_key_values(&self, params: &NegotiatedParams) {
        self.inner.notice_key_values(params)
    }
    fn allocate_connection_resources(&self, res: ConnectionResources) -> Result<(), DmError> {
        self.inner.allocate_connection_resources(res)
    }
    fn deallocate_connection_resources(&self) {
        self.inner.deallocate_connection_resources()
    }
    fn enable(&self) {
        self.inner.enable()
    }
    fn deallocate_task_resources(&self, itt: u32) {
        self.inner.deallocate_task_resources(itt)
    }
    fn discard_command(&self, itt: u32) {
        self.inner.discard_command(itt)
    }
    fn release_task_buffer(&self, buf: TaskBuffer) {
        self.inner.release_task_buffer(buf)
    }
    fn take_buffer(&self, len: usize) -> Vec<u8> {
        self.inner.take_buffer(len)
    }
    fn terminate(&self) {
        self.inner.terminate()
    }
    fn hold_sends(&self) {
        self.inner.hold_sends()
    }
    fn release_sends(&self) -> BoxFuture<'_, Result<(), DmError>> {
        self.inner.release_sends()
    }
    fn collapses_status(&self) -> bool {
        self.inner.collapses_status()
    }
    fn max_outstanding_commands(&self) -> Option<u32> {
        self.inner.max_outstanding_commands()
    }
    fn can_put_data(&self, itt: u32) -> bool {
        self.inner.can_put_data(itt)
    }
    fn max_recv_data_segment_length(&self) -> Option<u32> {
        self.inner.max_recv_data_segment_length()
    }
}

/// The initiator's side: connections are made by this connector, TCP's wrapped in [`Counting`].
#[derive(Debug)]
struct CountingConnector(Arc<Counts>);

impl Connector for CountingConnector {
    fn connect(&self, addr: std::net::SocketAddr) -> BoxFuture<'_, Result<SharedDatamover, Error>> {
        Box::pin(async move {
            let stream = tokio::net::TcpStream::connect(addr).await.map_err(Error::Connect)?;
            let (dm, driver) = riser::tcp::datamover(stream, Role::Initiator);
            tokio::spawn(driver);
            Ok(Arc::new(Counting { inner: Arc::new(dm), counts: self.0.clone() }) as SharedDatamover)
        })
    }
    fn transport(&self) -> Transport {
        Transport::Tcp
    }
}

const IQN: &str = "iqn.2026-11.io.riser:embed-datamover";
const BS: u32 = 512;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(16 << 20, BS)), LuIdentity::random()));
    let target = Target::new(TargetConfig::default().node(Node::new(IQN).lun(lu)));

    // The target's side: one's own accept loop hands each connection, on a counted datamover,
    // to Target::connection (login, then the session).
    let (target_counts, initiator_counts) = (Arc::new(Counts::default()), Arc::new(Counts::default()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let (t, counts) = (target.clone(), target_counts.clone());
    tokio::spawn(async move {
        while let Ok((stream, peer)) = listener.accept().await {
            let Ok(local) = stream.local_addr() else { continue };
            let (dm, driver) = riser::tcp::datamover(stream, Role::Target);
            dm.set_segment_timeout(t.config().data_timeout); // as Target::serve does
            tokio::spawn(driver);
            let dm = Arc::new(Counting { inner: Arc::new(dm), counts: counts.clone() });
            tokio::spawn(t.clone().connection(dm, Transport::Tcp, peer, local));
        }
    });

    let cfg = SessionConfig::new("iqn.2026-11.io.riser:embedder", IQN).connector(CountingConnector(initiator_counts.clone()));
    let s = Session::connect(addr, cfg).await?;
    // 16 writes of 64 KiB, and 16 reads of them back.
    const IOS: u64 = 16;
    const BLOCKS: u32 = 128;
    let bytes = u64::from(BLOCKS * BS) * IOS;
    for i in 0..IOS {
        s.write(Lun::ZERO, i * u64::from(BLOCKS), Bytes::from(vec![i as u8 + 1; (BLOCKS * BS) as usize]), BS).await?;
    }
    for i in 0..IOS {
        let data = s.read(Lun::ZERO, i * u64::from(BLOCKS), BLOCKS, BS).await?;
        if data.len() != (BLOCKS * BS) as usize || data.iter().any(|&b| b != i as u8 + 1) {
            return Err(format!("read {i} returned other data than write {i} wrote").into());
        }
    }
    s.logout().await?;

    let (i, t) = (&*initiator_counts, &*target_counts);
    let n = |c: &AtomicU64| c.load(Relaxed);
    println!(
        "initiator: {} control PDUs sent ({} SCSI commands), {} PDUs handed up; {} bytes written, {} read",
        n(&i.control_sent) + n(&i.commands_sent),
        n(&i.commands_sent),
        n(&i.control_received),
        n(&i.write_bytes),
        n(&i.read_bytes)
    );
    println!(
        "target:    {} control PDUs handed up ({} SCSI commands), {} sent; {} bytes by Get_Data, {} by Put_Data",
        n(&t.control_received),
        n(&t.commands_received),
        n(&t.control_sent),
        n(&t.write_bytes),
        n(&t.read_bytes)
    );
    let checks = [
        ("the initiator's SCSI commands", n(&i.commands_sent) >= 2 * IOS),
        ("SCSI commands sent = received", n(&i.commands_sent) == n(&t.commands_received)),
        ("the initiator's write bytes", n(&i.write_bytes) == bytes),
        ("the target's Get_Data bytes", n(&t.write_bytes) == bytes),
        ("the target's Put_Data bytes", n(&t.read_bytes) == bytes),
        ("the initiator's read bytes", n(&i.read_bytes) == bytes),
        ("control PDUs sent by the initiator = received by the target", n(&i.control_sent) + n(&i.commands_sent) == n(&t.control_received)),
    ];
    let failed: Vec<&str> = checks.iter().filter(|(_, ok)| !ok).map(|(what, _)| *what).collect();
    if !failed.is_empty() {
        return Err(format!("the counts do not add up: {}", failed.join("; ")).into());
    }
    println!("both datamovers counted every command and every byte");
    Ok(())
}
