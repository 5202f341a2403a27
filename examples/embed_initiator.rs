//! riser's initiator as a library in one's own code: log in, read and write, task management,
//! and a session that survives the loss of its connection.
//!
//! `cargo run --release --example embed_initiator`
//!
//! To run by itself it brings its own target (in-process, on 127.0.0.1, a port the OS picks) and
//! reaches it through a TCP relay that stands for the network, which it cuts at one point. It
//! 1. logs in, asks INQUIRY and READ CAPACITY, writes 64 KiB and reads them back;
//! 2. sends a LOGICAL UNIT RESET while a read is in flight on a slow LUN: the reset completes and
//!    the read ends as [`Error::Aborted`] (the target sends it no response);
//! 3. cuts every connection of the relay: the next command finds the connection gone, the session
//!    logs in again (a session reinstatement, same ISID) and the command completes; the data
//!    written before the loss reads back the same.
//!
//! Exit status 0 when every step did what it says.

use bytes::Bytes;
use riser::initiator::{Error, Lun, Session, SessionConfig};
use riser::iscsi::wire::TmfFunction;
use riser::target::aio::{AsyncBackend, Io};
use riser::target::backend::{BlockBackend, RamBackend};
use riser::target::lu::{LogicalUnit, LuIdentity};
use riser::target::server::{Node, Target, TargetConfig};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tokio::net::TcpListener;

const IQN: &str = "iqn.2026-11.io.riser:embed-initiator";
const BS: u32 = 512;
/// How long a read of the slow LUN takes.
const SLOW: Duration = Duration::from_millis(700);

type Failure = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Failure> {
    let target_addr = start_target().await?;
    let relay_listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = relay_listener.local_addr()?;
    let accepted = Arc::new(AtomicUsize::new(0));
    let relay_task = tokio::spawn(relay(relay_listener, target_addr, accepted.clone()));

    // 1. Log in, read and write.
    let cfg = SessionConfig::new("iqn.2026-11.io.riser:embedder", IQN).timeout(Duration::from_secs(5));
    let s = Session::connect(addr, cfg).await?;
    let (lun0, slow) = (Lun::ZERO, Lun::try_from(1u16)?);
    let inquiry = s.inquiry(lun0).await?;
    let (blocks, block_size) = s.read_capacity(lun0).await?;
    let product = String::from_utf8_lossy(&inquiry.product).trim_end().to_string();
    println!("logged in to {IQN} at {addr}: LUN 0 is a {product:?}, {blocks} blocks of {block_size} bytes");
    let data = Bytes::from((0..128 * BS).map(|i| (i % 253) as u8).collect::<Vec<u8>>());
    s.write(lun0, 8, data.clone(), BS).await?;
    expect_data(&s, lun0, 8, &data, "written").await?;
    println!("wrote {} KiB and read them back; NOP round trip {:?}", data.len() / 1024, s.ping().await?);

    // 2. Task management: a LOGICAL UNIT RESET while a read of the slow LUN is in flight.
    let started = Instant::now();
    let (read, reset) = tokio::join!(s.read(slow, 0, 1, BS), async {
        tokio::time::sleep(SLOW / 4).await;
        s.task_management(slow, TmfFunction::LOGICAL_UNIT_RESET, 0).await
    });
    reset.map_err(|e| format!("LOGICAL UNIT RESET: {e}"))?;
    match read {
        Err(Error::Aborted) => println!("LOGICAL UNIT RESET done; the read in flight ended as aborted ({:?})", started.elapsed()),
        other => return Err(format!("the read in flight during the reset should have been aborted, it ended with {other:?}").into()),
    }
    // The session goes on (the unit's UNIT ATTENTION after its reset is retried past by `read`).
    s.read(slow, 0, 1, BS).await?;

    // 3. The network fails: every connection through the relay is cut. The relay comes back at
    // once, on the same address; the next command logs in again and completes.
    relay_task.abort();
    let _ = relay_task.await;
    let relay_listener = TcpListener::bind(addr).await?;
    let relay_task = tokio::spawn(relay(relay_listener, target_addr, accepted.clone()));
    expect_data(&s, lun0, 8, &data, "written before the connection loss").await?;
    let connections = accepted.load(Ordering::Relaxed);
    if connections != 2 {
        return Err(format!("expected the session on a second connection after the cut, the relay saw {connections}").into());
    }
    s.write(lun0, 1000, data.clone(), BS).await?;
    expect_data(&s, lun0, 1000, &data, "written after the reconnection").await?;
    println!("connection cut; the session logged in again and read what it had written before");

    s.logout().await?;
    relay_task.abort();
    Ok(())
}

/// Read `want.len()` bytes at `lba` and compare.
async fn expect_data(s: &Session, lun: Lun, lba: u64, want: &Bytes, what: &str) -> Result<(), Failure> {
    let got = s.read(lun, lba, want.len() as u32 / BS, BS).await?;
    if got != *want {
        return Err(format!("the data {what} at LBA {lba} read back different ({} bytes of {})", got.len(), want.len()).into());
    }
    Ok(())
}

/// A target with a RAM LUN 0 and a LUN 1 whose reads take [`SLOW`].
async fn start_target() -> Result<SocketAddr, Failure> {
    let lu0 = LogicalUnit::new(Arc::new(RamBackend::new(16 << 20, BS)), LuIdentity::random());
    let lu1 = LogicalUnit::with_async(Arc::new(Slow(Arc::new(RamBackend::new(1 << 20, BS)))), LuIdentity::random());
    let target = Target::new(TargetConfig::default().node(Node::new(IQN).lun(Arc::new(lu0)).lun(Arc::new(lu1))));
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(target.serve(listener));
    Ok(addr)
}

/// A RAM store whose reads take [`SLOW`].
#[derive(Debug)]
struct Slow(Arc<RamBackend>);

impl AsyncBackend for Slow {
    fn block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn num_blocks(&self) -> u64 {
        self.0.num_blocks()
    }
    fn read(&self, offset: u64, len: usize, mut buf: Vec<u8>) -> Io<Vec<u8>> {
        let store = self.0.clone();
        Io::pending(async move {
            tokio::time::sleep(SLOW).await;
            buf.resize(len, 0);
            store.read(offset, &mut buf).map(|()| buf)
        })
    }
    fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Io<()> {
        Io::ready(self.0.write(offset, &data))
    }
    fn flush(&self) -> Io<()> {
        Io::ready(Ok(()))
    }
    fn unmap(&self, _: u64, _: u64) -> Io<()> {
        Io::unsupported("UNMAP")
    }
}

/// The network: relays each connection accepted on `public` to `inner` (counting them in
/// `accepted`) until aborted, which drops them all.
async fn relay(public: TcpListener, inner: SocketAddr, accepted: Arc<AtomicUsize>) {
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((mut client, _)) = public.accept().await {
        accepted.fetch_add(1, Ordering::Relaxed);
        let Ok(mut server) = tokio::net::TcpStream::connect(inner).await else { continue };
        connections.spawn(async move { tokio::io::copy_bidirectional(&mut client, &mut server).await });
    }
}
