//! Reads and writes of every size and shape, on every transport: data comes back byte for
//! byte, whatever mix of immediate data, unsolicited Data-Out and solicited data (R2Ts on TCP,
//! RDMA Reads on iSER) carried it.

use crate::support::{ME, TARGET, Transport, pattern};
use riser::initiator::{Error, Session, SessionConfig};
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::wire::TmfFunction;
use riser::scsi::lun::Lun;

on_every_transport!(
    every_transfer_size,
    sixty_four_commands_in_flight,
    r2t_path_with_small_segments_and_bursts,
    immediate_unsolicited_and_solicited_data_in_one_write,
    unsolicited_bursts_racing_their_r2ts_lose_no_task,
    session_reinstatement_closes_the_old_connection,
    a_connection_dropped_by_the_initiator_is_replaced,
    a_logout_right_after_a_burst_is_answered,
);

async fn every_transfer_size(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let s = t.session(addr).await;
    assert_eq!(s.params().rdma_extensions, t != Transport::Tcp, "RDMAExtensions=Yes negotiated on iSER only");
    let (blocks, bs) = s.read_capacity(Lun::ZERO).await.unwrap();
    assert_eq!((blocks, bs), (131_072, 512));
    let inq = s.inquiry(Lun::ZERO).await.unwrap();
    assert_eq!(&inq.vendor, b"RISER   ");
    // An answer shorter than asked for is as long as the target sent (the underflow's residual
    // cut off; over iSER the whole buffer was registered for it).
    let cdb = riser::scsi::cdb::Cdb::Inquiry { evpd: false, page_code: 0, alloc_len: 255, control: 0 };
    let d = s.run(Lun::ZERO, &cdb, None, 255).await.unwrap();
    assert!(d.len() < 255 && d.len() == 5 + usize::from(d[4]), "{} bytes, additional length {}", d.len(), d[4]);
    // 512 B to 16 MiB, each written and read back byte for byte.
    let mut lba = 0;
    for (i, len) in [512usize, 4096, 8192, 8704, 65_536, 262_144, 1 << 20, 4 << 20, 16 << 20].into_iter().enumerate() {
        let data = pattern(i as u8, len);
        s.write(Lun::ZERO, lba, data.clone(), bs).await.unwrap();
        let back = s.read(Lun::ZERO, lba, (len / 512) as u32, bs).await.unwrap();
        assert_eq!(back, data, "{len} bytes");
        // Read buffers go back to the datamover; the next (smaller or larger) reads reuse them.
        s.recycle(back);
        lba = (lba + (len / 512) as u64) % 65_536;
    }
    // A recycled buffer never shows its old bytes: a read of fresh data into one.
    let fresh = pattern(200, 8192);
    s.write(Lun::ZERO, 40_000, fresh.clone(), bs).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 40_000, 16, bs).await.unwrap(), fresh);
    s.sync(Lun::ZERO).await.unwrap();
    s.unmap(Lun::ZERO, 0, 8).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 0, 8, 512).await.unwrap(), vec![0u8; 4096]);
    s.ping().await.unwrap();
    s.logout().await.unwrap();
}

async fn sixty_four_commands_in_flight(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let s = t.session(addr).await;
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(i as u8, 32_768);
            s.write(Lun::ZERO, 1000 + i * 64, data.clone(), 512).await.unwrap();
            assert_eq!(s.read(Lun::ZERO, 1000 + i * 64, 64, 512).await.unwrap(), data);
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    s.task_management(Lun::ZERO, TmfFunction::LOGICAL_UNIT_RESET, 0).await.unwrap();
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    s.logout().await.unwrap();
}

/// InitialR2T=Yes, no immediate data, 4 KiB segments, 16 KiB bursts: every write is solicited
/// in several bursts (R2Ts and many Data-Out PDUs on TCP); reads come in many Data-Ins.
async fn r2t_path_with_small_segments_and_bursts(t: Transport) {
    let op = OperationalConfig::default()
        .initial_r2t(true)
        .immediate_data(false)
        .max_recv_data_segment_length(4096)
        .max_burst_length(16_384)
        .first_burst_length(8192);
    let addr = t.start(|_| {}, |c| c.login.operational = op).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.login.operational.max_recv_data_segment_length = 4096;
    let s = t.connect(addr, cfg).await.unwrap();
    assert!(s.params().initial_r2t && !s.params().immediate_data);
    let data = pattern(9, 300 * 512);
    s.write(Lun::ZERO, 1000, data.clone(), 512).await.unwrap();
    assert_eq!(s.read(Lun::ZERO, 1000, 300, 512).await.unwrap(), data);
}

/// As the Linux initiator: InitialR2T=No, so up to FirstBurstLength goes unsolicited: 8 KiB of
/// immediate data, then Data-Out to 64 KiB, then the rest solicited (R2T, or RDMA Read).
async fn immediate_unsolicited_and_solicited_data_in_one_write(t: Transport) {
    let op =
        OperationalConfig::default().initial_r2t(false).immediate_data(true).first_burst_length(65_536).max_recv_data_segment_length(8192);
    let addr = t
        .start(
            |_| {},
            |c| {
                c.login.operational = op;
                c.iser_unsolicited_data = true;
            },
        )
        .await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.login.operational.first_burst_length = 65_536;
    cfg.connector = t.linux_like_connector();
    let s = Session::connect(addr, cfg).await.unwrap();
    assert!(!s.params().initial_r2t && s.params().immediate_data);
    assert_eq!(s.params().first_burst_length, 65_536);
    for (i, len) in [4096usize, 65_536, 70_000 / 512 * 512, 200 * 1024, 1 << 20].into_iter().enumerate() {
        let data = pattern(40 + i as u8, len);
        s.write(Lun::ZERO, 77, data.clone(), 512).await.unwrap();
        assert_eq!(s.read(Lun::ZERO, 77, (len / 512) as u32, 512).await.unwrap(), data, "{len} bytes");
    }
    s.logout().await.unwrap();
}

/// riser's defaults but for an 8 KiB receive segment on the target: each 1 MiB write sends
/// 8 KiB immediate data, 31 unsolicited Data-Outs and gets the rest solicited, eight writes at
/// once. On TCP the R2T is sent while the unsolicited Data-Outs still arrive, and the last
/// Data-Out of an R2T races the end of the collection. (Found by `cargo xtask evaluate`'s
/// parameter sweep: the target took a Data-Out's task out of its table while reading the data,
/// so a Get_Data that looked meanwhile found no task and failed the command with CHECK
/// CONDITION, DATA PHASE ERROR.)
async fn unsolicited_bursts_racing_their_r2ts_lose_no_task(t: Transport) {
    let op = OperationalConfig::default().max_recv_data_segment_length(8192);
    let addr = t
        .start(
            |_| {},
            |c| {
                c.login.operational = op;
                c.iser_unsolicited_data = true;
            },
        )
        .await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.connector = t.linux_like_connector();
    let s = Session::connect(addr, cfg).await.unwrap();
    assert!(!s.params().initial_r2t && s.params().immediate_data);
    for round in 0..4u8 {
        let mut writes = Vec::new();
        for i in 0..8u8 {
            let (s, data) = (s.clone(), pattern(round * 8 + i, 1 << 20));
            writes.push(tokio::spawn(async move { s.write(Lun::ZERO, u64::from(i) * 2048, data, 512).await }));
        }
        for (i, w) in writes.into_iter().enumerate() {
            w.await.unwrap().unwrap_or_else(|e| panic!("round {round}, write {i}: {e}"));
        }
        for i in 0..8u8 {
            assert_eq!(
                s.read(Lun::ZERO, u64::from(i) * 2048, 2048, 512).await.unwrap(),
                pattern(round * 8 + i, 1 << 20),
                "round {round}, write {i}"
            );
        }
    }
}

async fn session_reinstatement_closes_the_old_connection(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let first = t.session(addr).await;
    first.test_unit_ready(Lun::ZERO).await.unwrap();
    let second = t.session(addr).await;
    second.test_unit_ready(Lun::ZERO).await.unwrap();
    // The target closed the first connection; the first session notices, logs in again
    // (reinstating the session in turn) and its command goes through.
    let data = pattern(1, 4096);
    first.write(Lun::ZERO, 0, data.clone(), 512).await.unwrap();
    assert_eq!(first.read(Lun::ZERO, 0, 8, 512).await.unwrap(), data);
    first.logout().await.unwrap();
    assert!(matches!(first.test_unit_ready(Lun::ZERO).await.unwrap_err(), Error::ConnectionLost));
}

/// A connection the initiator ends itself (as after a fault it detected) ends its commands in
/// flight and the session logs in again: over iSER the local end was never reported, so the
/// session waited for its commands until they timed out.
async fn a_connection_dropped_by_the_initiator_is_replaced(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let c = SessionConfig::new(ME, TARGET).timeout(std::time::Duration::from_secs(5));
    let s = t.connect(addr, c).await.unwrap();
    let data = pattern(7, 1 << 20);
    s.write(Lun::ZERO, 0, data.clone(), 512).await.unwrap();
    let reads: Vec<_> = (0..8)
        .map(|_| {
            let s = s.clone();
            tokio::spawn(async move { s.read(Lun::ZERO, 0, 2048, 512).await })
        })
        .collect();
    s.drop_connection();
    for r in reads {
        // Done before the drop, retried on the new connection, or failed with the connection:
        // never waiting out the timeout.
        match r.await.unwrap() {
            Ok(back) => assert_eq!(back, data),
            Err(e) => assert!(matches!(e, Error::ConnectionLost), "{e}"),
        }
    }
    assert_eq!(s.read(Lun::ZERO, 0, 2048, 512).await.unwrap(), data);
    s.logout().await.unwrap();
}

/// A logout right after a burst of commands, answered or still in flight (the target holds
/// what a turn sends and lets it leave together): the Logout Response always reaches the
/// initiator before the connection ends, so the logout succeeds. Several sessions at once.
async fn a_logout_right_after_a_burst_is_answered(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let sessions: Vec<_> = (0..4u64)
        .map(|n| {
            tokio::spawn(async move {
                for round in 0..10u64 {
                    let c = SessionConfig::new(format!("{ME}-{n}"), TARGET);
                    let s = t.connect(addr, c).await.unwrap();
                    let mut burst: Vec<_> = (0..32u64)
                        .map(|i| {
                            let s = s.clone();
                            let lba = (n * 32 + i) * 128;
                            tokio::spawn(async move {
                                s.write(Lun::ZERO, lba, pattern(i as u8, 4096), 512).await?;
                                s.read(Lun::ZERO, lba, 128, 512).await.map(drop)
                            })
                        })
                        .collect();
                    // Every other round the logout does not wait for the burst: what is still in
                    // flight then ends with the session.
                    if round % 2 == 0 {
                        for c in burst.drain(..) {
                            c.await.unwrap().unwrap();
                        }
                    }
                    s.logout().await.unwrap_or_else(|e| panic!("session {n} round {round}: logout: {e}"));
                    for c in burst {
                        let _ = c.await.unwrap();
                    }
                }
            })
        })
        .collect();
    for s in sessions {
        s.await.unwrap();
    }
}
