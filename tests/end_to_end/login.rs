//! Login and the session's life on every transport: CHAP, ACLs, unknown targets and LUNs,
//! the keepalive, and session reinstatement.

use crate::support::{Gated, ME, TARGET, Transport, creds, write10};
use riser::datamover::{ControlPdu, DmEvent};
use riser::initiator::{Error, SessionConfig};
use riser::iscsi::keys::OperationalConfig;
use riser::iscsi::login::{AuthFailure, LoginFailure, LoginStatus};
use riser::iscsi::wire::Header;
use riser::scsi::lun::Lun;
use riser::scsi::sense::{AscAscq, SenseKey};
use riser::target::server::TargetConfig;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

on_every_transport!(
    chap_one_way_mutual_and_wrong_secret,
    acl_and_unknown_target_and_lun,
    nop_in_keepalive_answered_keeps_the_session_unanswered_drops_it,
    reinstatement_waits_for_the_old_sessions_write,
    reinstatement_waits_for_a_write_running_in_its_task,
);

async fn chap_one_way_mutual_and_wrong_secret(t: Transport) {
    let chap = |secret: &str, mutual: Option<(&str, &str)>| {
        SessionConfig::new(ME, TARGET).with_chap(creds("alice", secret), mutual.map(|(u, s)| creds(u, s)))
    };
    let addr = t.start(|n| n.target.chap = Some(creds("alice", "alicesecret12")), |_| {}).await;
    t.connect(addr, chap("alicesecret12", None)).await.unwrap();
    let e = t.connect(addr, chap("wrongsecret12", None)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "{e}");
    let e = t.connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "{e}");

    let addr = t
        .start(
            |n| {
                n.target.chap = Some(creds("alice", "alicesecret12"));
                n.target.mutual_chap = Some(creds("target", "targetsecret1"));
            },
            |_| {},
        )
        .await;
    let s = t.connect(addr, chap("alicesecret12", Some(("target", "targetsecret1")))).await.unwrap();
    s.test_unit_ready(Lun::ZERO).await.unwrap();
    let e = t.connect(addr, chap("alicesecret12", Some(("target", "impostorsecret")))).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Authentication(AuthFailure::MutualChapFailed))), "{e}");
}

async fn acl_and_unknown_target_and_lun(t: Transport) {
    let addr = t.start(|n| n.target = n.target.clone().allow("iqn.2026-11.io.riser:someone-else"), |_| {}).await;
    let e = t.connect(addr, SessionConfig::new(ME, TARGET)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHORIZATION_FAILURE))), "{e}");
    let e = t.connect(addr, SessionConfig::new(ME, "iqn.2026-11.io.riser:nothing")).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::NOT_FOUND))), "{e}");

    let addr = t.start(|_| {}, |_| {}).await;
    let s = t.session(addr).await;
    match s.test_unit_ready(Lun::from(3)).await.unwrap_err() {
        Error::Scsi { sense: Some(sense), .. } => {
            assert_eq!((sense.key, sense.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::LOGICAL_UNIT_NOT_SUPPORTED))
        }
        e => panic!("{e}"),
    }
    // Out of range and unknown opcode get the SBC answers.
    match s.read(Lun::ZERO, 1 << 30, 1, 512).await.unwrap_err() {
        Error::Scsi { sense: Some(sense), .. } => assert_eq!(sense.asc, AscAscq::LBA_OUT_OF_RANGE),
        e => panic!("{e}"),
    }
    let r = s.command(Lun::ZERO, &[0xc7, 0, 0, 0, 0, 0], None, 0).await.unwrap();
    assert_eq!(riser::scsi::sense::Sense::parse(&r.sense.unwrap()).unwrap().asc, AscAscq::INVALID_COMMAND_OPERATION_CODE);
}

async fn nop_in_keepalive_answered_keeps_the_session_unanswered_drops_it(t: Transport) {
    let quick = |c: &mut TargetConfig| {
        c.nop_interval = Some(Duration::from_millis(200));
        c.nop_timeout = Duration::from_millis(600);
    };
    // The riser initiator answers pings: the session outlives many intervals.
    let addr = t.start(|_| {}, quick).await;
    let s = t.session(addr).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    s.test_unit_ready(Lun::ZERO).await.unwrap();

    // A silent initiator is dropped after the timeout.
    let r = t.raw(addr, OperationalConfig::default(), 0x61).await;
    let first = tokio::time::timeout(Duration::from_secs(5), r.dm().next_event()).await.unwrap();
    assert!(matches!(first, DmEvent::Control(ControlPdu { header: Header::NopIn(n), .. }) if n.itt == u32::MAX && n.ttt != u32::MAX));
    let end = tokio::time::timeout(Duration::from_secs(5), r.dm().next_event()).await.unwrap();
    assert!(matches!(end, DmEvent::Terminated(_)), "{end:?}");
}

/// Session reinstatement: the new session runs nothing before the old one's backend I/O is over.
async fn reinstatement_waits_for_the_old_sessions_write(t: Transport) {
    reinstatement_while_a_write_is_held(t, Gated::new(), 11, &write10(0, 1)).await;
}

/// The same with a store in memory, whose calls a command makes in its own task (on a runtime
/// worker, not the blocking pool): a WRITE SAME (a task of its own) still writing when the
/// session ends must be over before the reinstating session runs anything.
async fn reinstatement_waits_for_a_write_running_in_its_task(t: Transport) {
    // WRITE SAME(10) of 8 blocks at LBA 0.
    reinstatement_while_a_write_is_held(t, Gated::in_memory(), 12, &[0x41, 0, 0, 0, 0, 0, 0, 0, 8, 0]).await;
}

/// The old session's `cdb` (one block of data, immediate) is held in `gated`'s write when the
/// same initiator logs in again with the same ISID; the write is let go 600 ms later, and the
/// new session's first answer must come after that.
async fn reinstatement_while_a_write_is_held(t: Transport, gated: Arc<Gated>, isid: u8, cdb: &[u8]) {
    let addr = t.start_on(gated.clone(), |_| {}, |_| {}).await;
    let op = OperationalConfig::default().initial_r2t(false).immediate_data(true);
    let mut old = t.raw(addr, op.clone(), isid).await;
    gated.hold(true);
    let h = old.command(0x800, cdb, 512, true, true, false);
    old.send(h, &[4; 512]).await;
    crate::support::until("the write reached the disk", || gated.waiting() > 0).await;
    // Let go from a thread of its own: a held write in memory keeps the thread it runs on.
    let released = Arc::new(AtomicBool::new(false));
    let release = {
        let (g, released) = (gated.clone(), released.clone());
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(600));
            released.store(true, Ordering::SeqCst);
            g.hold(false);
        })
    };
    let mut new = t.raw(addr, op, isid).await;
    let h = new.command(0x801, &[0; 6], 0, false, true, false);
    new.send(h, &[]).await;
    let _ = new.response(0x801, |_| {}).await;
    assert!(released.load(Ordering::SeqCst), "the new session answered while the old session's write was still held");
    release.join().unwrap();
    assert_eq!(gated.done(), 1);
}
