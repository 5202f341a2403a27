//! One target serving one LUN over iSCSI/TCP and over iSER at once, inside one's own tokio
//! application. The iSER portal runs on riser's software iWARP RNIC ([`SoftRnic`], RDMA over a
//! TCP socket: no RDMA hardware needed); with the `rdma-core` feature any riser-verbs provider
//! (a real RNIC, rxe, siw) serves in its place.
//!
//! `cargo run --release --example embed_tcp_and_iser`
//!
//! It serves both portals on 127.0.0.1 (ports the OS picks), logs riser's initiator in over each,
//! writes through one session and reads back through the other (both ways), checks that the
//! target sees one TCP and one iSER session, and exits: 0 when every check held.

use bytes::Bytes;
use riser::initiator::{IserConnector, Lun, Session, SessionConfig};
use riser::iscsi::keys::Transport;
use riser::iser::IserConfig;
use riser::iwarp::SoftRnic;
use riser::target::backend::RamBackend;
use riser::target::lu::{LogicalUnit, LuIdentity};
use riser::target::server::{Node, Target, TargetConfig};
use riser::verbs::{Listener, Provider};
use std::sync::Arc;

const IQN: &str = "iqn.2026-11.io.riser:embed-tcp-iser";
const INITIATOR: &str = "iqn.2026-11.io.riser:embedder";
const BS: u32 = 512;

type Error = Box<dyn std::error::Error>;

#[tokio::main]
async fn main() -> Result<(), Error> {
    // One LUN, one target, two portals.
    let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(16 << 20, BS)), LuIdentity::random()));
    let target = Target::new(TargetConfig::default().node(Node::new(IQN).lun(lu)));

    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let tcp_addr = tcp.local_addr()?;
    tokio::spawn(target.clone().serve(tcp));

    let rnic = SoftRnic::default();
    let iser = rnic.listen("127.0.0.1:0".parse()?)?;
    let iser_addr = iser.local_addr()?;
    tokio::spawn(target.clone().serve_iser(rnic, iser, IserConfig::default()));
    println!("serving {IQN} on iSCSI/TCP {tcp_addr} and iSER {iser_addr}");

    // riser's initiator over each transport: the connector decides how connections are made.
    let over_tcp = Session::connect(tcp_addr, SessionConfig::new(INITIATOR, IQN)).await?;
    let iser_connector = IserConnector::new(SoftRnic::default(), IserConfig::default());
    let over_iser = Session::connect(iser_addr, SessionConfig::new(INITIATOR, IQN).connector(iser_connector)).await?;
    for (s, want) in [(&over_tcp, Transport::Tcp), (&over_iser, Transport::Iser)] {
        if s.params().transport != want {
            return Err(format!("a session meant for {want:?} negotiated {:?}", s.params().transport).into());
        }
    }

    // 256 KiB written over TCP, read over iSER; then the other way, elsewhere on the LUN.
    cross_check(&over_tcp, "TCP", &over_iser, "iSER", 0, 1).await?;
    cross_check(&over_iser, "iSER", &over_tcp, "TCP", 2048, 2).await?;

    // The target's view: one session per transport.
    let mut seen: Vec<Transport> = target.sessions().iter().map(|s| s.transport).collect();
    seen.sort_by_key(|t| *t == Transport::Iser);
    if seen != [Transport::Tcp, Transport::Iser] {
        return Err(format!("the target lists sessions over {seen:?}, not one over TCP and one over iSER").into());
    }
    over_tcp.logout().await?;
    over_iser.logout().await?;
    println!("TCP and iSER read each other's writes");
    Ok(())
}

/// Write 256 KiB at `lba` through `writer`, read them through `reader`, compare.
async fn cross_check(writer: &Session, w: &str, reader: &Session, r: &str, lba: u64, seed: u8) -> Result<(), Error> {
    const BLOCKS: u32 = 512;
    let data: Vec<u8> = (0..BLOCKS * BS).map(|i| (i / BS) as u8 ^ (i % 251) as u8 ^ seed.wrapping_mul(0x5b)).collect();
    writer.write(Lun::ZERO, lba, Bytes::from(data.clone()), BS).await?;
    let back = reader.read(Lun::ZERO, lba, BLOCKS, BS).await?;
    if back[..] != data[..] {
        let at = back.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(back.len().min(data.len()));
        return Err(format!(
            "written over {w} at LBA {lba}, read over {r}: {} bytes back of {}, first difference at byte {at}",
            back.len(),
            data.len()
        )
        .into());
    }
    println!("{} KiB written over {w} at LBA {lba}, read back over {r}", data.len() / 1024);
    Ok(())
}
