//! A target inside one's own tokio application with a store of one's own: a copy-on-write overlay
//! (an [`AsyncBackend`]) over another LUN's store. LUN 0 is a base image; LUN 1 reads the base's
//! blocks until they are written, and keeps what is written to itself.
//!
//! `cargo run --release --example embed_target_backend [-- --serve-for SECONDS]` serves on
//! 127.0.0.1 (a port the OS picks), checks the overlay through riser's initiator and exits 0 if it
//! held; with `--serve-for`, it first prints the LUN's URL and serves that long or until SIGINT.
use bytes::Bytes;
use riser::initiator::{Lun, Session, SessionConfig};
use riser::target::aio::{AsyncBackend, Io};
use riser::target::backend::{BlockBackend, RamBackend};
use riser::target::lu::{LogicalUnit, LuIdentity};
use riser::target::server::{Node, Target, TargetConfig};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::{io, time::Duration};

const BS: usize = 512;
const IQN: &str = "iqn.2026-11.io.riser:embed-backend";

/// Blocks written through the overlay, by LBA; every other block is the base's.
#[derive(Debug)]
struct Overlay {
    base: Arc<dyn BlockBackend>,
    written: Arc<Mutex<HashMap<u64, Bytes>>>,
}

impl AsyncBackend for Overlay {
    fn block_size(&self) -> u32 {
        BS as u32
    }
    fn num_blocks(&self) -> u64 {
        self.base.num_blocks()
    }
    fn read(&self, offset: u64, len: usize, mut buf: Vec<u8>) -> Io<Vec<u8>> {
        let (base, written) = (self.base.clone(), self.written.clone());
        // The base may be a file or a device: read it on the blocking pool; then the overlay.
        Io::pending(async move {
            buf.resize(len, 0);
            let mut buf =
                tokio::task::spawn_blocking(move || base.read(offset, &mut buf).map(|()| buf)).await.map_err(io::Error::other)??;
            let written = written.lock().unwrap();
            for (i, block) in buf.chunks_mut(BS).enumerate() {
                if let Some(b) = written.get(&(offset / BS as u64 + i as u64)) {
                    block.copy_from_slice(b)
                }
            }
            Ok(buf)
        })
    }
    fn write(&self, offset: u64, data: Bytes, _fua: bool) -> Io<()> {
        let mut written = self.written.lock().unwrap();
        for i in 0..data.len() / BS {
            written.insert(offset / BS as u64 + i as u64, data.slice(i * BS..(i + 1) * BS));
        }
        Io::ready(Ok(()))
    }
    fn flush(&self) -> Io<()> {
        Io::ready(Ok(()))
    }
    fn unmap(&self, _: u64, _: u64) -> Io<()> {
        Io::unsupported("UNMAP")
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let serve_for = match std::env::args().skip(1).collect::<Vec<_>>().as_slice() {
        [] => None,
        [flag, secs] if flag == "--serve-for" => Some(Duration::from_secs(secs.parse()?)),
        _ => return Err("usage: embed_target_backend [--serve-for SECONDS]".into()),
    };
    let base = Arc::new(RamBackend::new(8 << 20, BS as u32));
    base.write(0, &[0xba; 2 * BS])?; // the base image: LBAs 0 and 1 hold 0xba
    let overlay = Overlay { base: base.clone(), written: Default::default() };
    let node = Node::new(IQN)
        .lun(Arc::new(LogicalUnit::new(base, LuIdentity::random())))
        .lun(Arc::new(LogicalUnit::with_async(Arc::new(overlay), LuIdentity::random())));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(Target::new(TargetConfig::default().node(node)).serve(listener));
    // Write LBA 0 through the overlay; the base keeps its own, LBA 1 still comes from the base.
    let s = Session::connect(addr, SessionConfig::new("iqn.2026-11.io.riser:embedder", IQN)).await?;
    let (base_lun, cow_lun) = (Lun::ZERO, Lun::try_from(1u16)?);
    s.write(cow_lun, 0, Bytes::from(vec![0x0c; BS]), BS as u32).await?;
    for (lun, lba, want) in [(cow_lun, 0, 0x0c), (base_lun, 0, 0xba), (cow_lun, 1, 0xba)] {
        let got = s.read(lun, lba, 1, BS as u32).await?;
        if got.len() != BS || got.iter().any(|&b| b != want) {
            return Err(format!("{lun:?} LBA {lba}: expected {BS} bytes of {want:#x}, read {:x?}", &got[..got.len().min(8)]).into());
        }
    }
    s.logout().await?;
    println!("copy-on-write overlay verified");
    if let Some(d) = serve_for {
        println!("serving iscsi://{addr}/{IQN}/1");
        tokio::select! { _ = tokio::time::sleep(d) => {}, r = tokio::signal::ctrl_c() => r? }
    }
    Ok(())
}
