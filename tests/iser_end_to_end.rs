//! End to end over iSER on the software iWARP RNIC (loopback TCP underneath), in process: the
//! same target server and initiator as over TCP, with the iSER datamover in between.

use bytes::Bytes;
use riser::initiator::{IserConnector, Session, SessionConfig, discover_via};
use riser::iscsi::login::InitiatorAuth;
use riser::iscsi::wire::TmfFunction;
use riser::iser::IserConfig;
use riser::iwarp::SoftRnic;
use riser::scsi::lun::Lun;
use riser::target::backend::RamBackend;
use riser::target::lu::LogicalUnit;
use riser::target::server::{Node, Target, TargetConfig};
use riser::verbs::Provider;
use std::net::SocketAddr;
use std::sync::Arc;

const TARGET: &str = "iqn.2026-11.io.riser:iser-e2e";
const ME: &str = "iqn.2026-11.io.riser:iser-tester";

async fn start() -> SocketAddr {
    let _ = tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).with_test_writer().try_init();
    let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(64 << 20, 512)), Lun::ZERO, 9));
    let n = Node { name: TARGET.into(), alias: None, luns: vec![lu], acl: vec![], chap: None, mutual_chap: None };
    let c = TargetConfig { nodes: vec![n], queue_depth: 64, ..TargetConfig::default() };
    let rnic = SoftRnic::default();
    let l = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = riser::verbs::Listener::local_addr(&l).unwrap();
    tokio::spawn(Target::new(c).serve_iser(rnic, l, IserConfig::default()));
    addr
}

fn config() -> SessionConfig {
    let mut c = SessionConfig::new(ME, TARGET);
    c.connector = Arc::new(IserConnector::new(SoftRnic::default(), IserConfig::default()).unwrap());
    c
}

fn pattern(seed: u8, len: usize) -> Bytes {
    (0..len).map(|i| (i as u8).wrapping_mul(29).wrapping_add(seed) ^ (i >> 11) as u8).collect::<Vec<_>>().into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_login_and_every_transfer_size() {
    let addr = start().await;
    let found = discover_via(&*config().connector, addr, ME, InitiatorAuth::None).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, TARGET);
    let s = Session::connect(addr, config()).await.unwrap();
    assert!(s.params().rdma_extensions, "RDMAExtensions=Yes negotiated");
    let (blocks, bs) = s.read_capacity(0).await.unwrap();
    assert_eq!((blocks, bs), (131_072, 512));
    // 512 B to 16 MiB, written (immediate data + RDMA Read) and read back (RDMA Write).
    let mut lba = 0;
    for (i, len) in [512usize, 4096, 8192, 8704, 65_536, 262_144, 1 << 20, 4 << 20, 16 << 20].into_iter().enumerate() {
        let data = pattern(i as u8, len);
        s.write(0, lba, data.clone(), bs).await.unwrap();
        assert_eq!(s.read(0, lba, (len / 512) as u32, bs).await.unwrap(), data, "{len} bytes");
        lba = (lba + (len / 512) as u64) % 65_536;
    }
    s.ping().await.unwrap();
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_commands_in_flight() {
    let addr = start().await;
    let s = Session::connect(addr, config()).await.unwrap();
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 32_768);
            s.write(0, 1000 + i * 64, data.clone(), 512).await.unwrap();
            assert_eq!(s.read(0, 1000 + i * 64, 64, 512).await.unwrap(), data);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.task_management(0, TmfFunction::LOGICAL_UNIT_RESET, 0).await.unwrap();
    s.test_unit_ready(0).await.unwrap();
    s.logout().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resets_during_transfers_and_teardown_leave_no_registration_behind() {
    let addr = start().await;
    let rnic = SoftRnic::default();
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.connector = Arc::new(IserConnector::new(rnic.clone(), IserConfig::default()).unwrap());
    let s = Session::connect(addr, cfg).await.unwrap();
    // Large transfers in flight while the LU is reset: each command either completes with its
    // data intact or fails; none hangs, and the session carries on.
    let mut tasks = Vec::new();
    for i in 0..8u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 4 << 20);
            if s.write(0, i * 8192, data.clone(), 512).await.is_ok()
                && let Ok(back) = s.read(0, i * 8192, 8192, 512).await
            {
                assert_eq!(back, data);
            }
        }));
    }
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    s.task_management(0, TmfFunction::LOGICAL_UNIT_RESET, 0).await.unwrap();
    s.task_management(0, TmfFunction::ABORT_TASK_SET, 0).await.unwrap();
    for t in tasks {
        tokio::time::timeout(std::time::Duration::from_secs(30), t).await.expect("no command hangs").unwrap();
    }
    let data = pattern(99, 1 << 20);
    s.write(0, 100_000, data.clone(), 512).await.unwrap();
    assert_eq!(s.read(0, 100_000, 2048, 512).await.unwrap(), data);
    assert!(rnic.registered_regions() > 0, "receive buffers are registered while connected");
    s.logout().await.unwrap();
    drop(s);
    // Every per-command registration was revoked and deregistered; with the connection gone
    // its receive buffers are too.
    let t0 = std::time::Instant::now();
    while rnic.registered_regions() != 0 {
        assert!(t0.elapsed() < std::time::Duration::from_secs(10), "{} regions still registered", rnic.registered_regions());
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
