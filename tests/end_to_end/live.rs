//! A target changed while it serves: several LUNs and what each initiator sees of them, LUNs
//! added, removed and resized under I/O, ACL entries changed, a logout asked for, SendTargets
//! over several portals, and the counters.

use crate::support::{Gated, ME, OTHER, TARGET, Transport, WAIT, pattern, read10, until, write10};
use bytes::Bytes;
use riser::initiator::{Error, Session, SessionConfig};
use riser::iscsi::chap::ChapCredentials;
use riser::iscsi::login::InitiatorAuth;
use riser::iscsi::wire::{AsyncEvent, Header};
use riser::scsi::lun::Lun;
use riser::scsi::sense::{AscAscq, SenseKey, Status};
use riser::target::backend::{BlockBackend, RamBackend};
use riser::target::lu::{LogicalUnit, LuIdentity};
use riser::target::server::stats::{ERROR_NAMES, Op};
use riser::target::server::{AclEntry, ChangeError, Node, Portal};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

on_every_transport!(
    every_lun_is_reported_and_each_initiator_sees_its_map,
    luns_change_under_io_and_only_the_sessions_that_see_them_hear_of_it,
    a_removed_lun_answers_once_its_running_write_is_over,
    removing_an_acl_entry_ends_that_initiators_sessions_only,
    a_requested_logout_is_announced_and_a_silent_initiator_dropped,
    a_riser_initiator_asked_to_log_out_does_and_comes_back,
    send_targets_lists_every_portal_of_the_target,
    statistics_count_what_the_sessions_did,
    a_target_name_spelled_otherwise_is_the_same_target_in_statistics_and_sessions,
);

fn lun(n: u16) -> Lun {
    Lun::from_number(n).unwrap()
}

fn unit(size: u64) -> Arc<LogicalUnit> {
    Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(size, 512)), LuIdentity::random()))
}

/// The sense of a failed command.
fn sense_of(r: Result<impl std::fmt::Debug, Error>) -> (SenseKey, AscAscq) {
    match r {
        Err(Error::Scsi { status: Status::CHECK_CONDITION, sense: Some(s) }) => (s.key, s.asc),
        other => panic!("expected CHECK CONDITION, got {other:?}"),
    }
}

/// Run `cdb` once (a unit attention is the answer, not retried): its data, or the error.
async fn once(s: &Session, l: Lun, cdb: &[u8], write: Option<Bytes>, read_len: u32) -> Result<Bytes, Error> {
    s.command_once(l, cdb, write, read_len).await?.into_good()
}

const TUR: [u8; 6] = [0; 6];
const READ_CAPACITY_16: [u8; 16] = [0x9e, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0];

/// The number of blocks in a READ CAPACITY (16) answer.
fn blocks(d: Bytes) -> u64 {
    u64::from_be_bytes(d[..8].try_into().unwrap()) + 1
}

async fn every_lun_is_reported_and_each_initiator_sees_its_map(t: Transport) {
    let (a, b, c) = (unit(1 << 20), unit(2 << 20), unit(4 << 20));
    let node = Node::new(TARGET).lun_at(0, a).lun_at(1, b).lun_at(5, c).lun_map(OTHER, [(0, 5), (1, 1)]);
    let (addr, _t) = t.serve(t.config().node(node)).await;
    let s = t.session(addr).await;
    assert_eq!(s.report_luns().await.unwrap(), vec![lun(0), lun(1), lun(5)]);
    for (l, blocks) in [(0, 2048), (1, 4096), (5, 8192)] {
        assert_eq!(s.read_capacity(lun(l)).await.unwrap().0, blocks, "LUN {l}");
    }
    let o = t.connect(addr, SessionConfig::new(OTHER, TARGET)).await.unwrap();
    assert_eq!(o.report_luns().await.unwrap(), vec![lun(0), lun(1)], "its own map");
    assert_eq!(o.read_capacity(lun(0)).await.unwrap().0, 8192, "its LUN 0 is the target's LUN 5");
    assert_eq!(sense_of(o.read_capacity(lun(5)).await), (SenseKey::ILLEGAL_REQUEST, AscAscq::LOGICAL_UNIT_NOT_SUPPORTED));
    // INQUIRY of a LUN it does not see: "not present", standard data or the one VPD page that
    // lists the pages (as Linux asks it, four bytes first); any other page is not supported.
    let std_inq = once(&o, lun(5), &[0x12, 0, 0, 0, 36, 0], None, 36).await.unwrap();
    assert_eq!(std_inq[0], 0x7f);
    assert_eq!(&once(&o, lun(5), &[0x12, 1, 0, 0, 4, 0], None, 4).await.unwrap()[..], [0x7f, 0, 0, 1], "a page length of 1");
    assert_eq!(&once(&o, lun(5), &[0x12, 1, 0, 0, 255, 0], None, 255).await.unwrap()[..], [0x7f, 0, 0, 1, 0]);
    assert_eq!(
        sense_of(once(&o, lun(5), &[0x12, 1, 0x80, 0, 255, 0], None, 255).await),
        (SenseKey::ILLEGAL_REQUEST, AscAscq::LOGICAL_UNIT_NOT_SUPPORTED)
    );
    // One unit, one identity, under whatever number it is seen.
    assert_eq!(o.vpd(lun(0), 0x83).await.unwrap(), s.vpd(lun(5), 0x83).await.unwrap());
    assert_ne!(s.vpd(lun(0), 0x83).await.unwrap(), s.vpd(lun(5), 0x83).await.unwrap());
}

/// Write a pattern to a region of `l` and read it back, over and over, until `stop`; every
/// failure counts in `errors`. The number of rounds done.
async fn verified_io(s: Session, l: Lun, seed: u8, stop: Arc<AtomicBool>, errors: Arc<AtomicU64>) -> u64 {
    let mut rounds = 0u64;
    // Each session its own 1 MiB of the LUN.
    let base = u64::from(seed / 40) * 2048;
    while !stop.load(Ordering::Relaxed) {
        let data = pattern(seed.wrapping_add(rounds as u8), 16 << 10);
        let lba = base + (rounds % 64) * 32;
        let ok = match once(&s, l, &write10(lba as u32, 32), Some(data.clone()), 0).await {
            Ok(_) => once(&s, l, &read10(lba as u32, 32), None, 16 << 10).await.is_ok_and(|back| back == data),
            Err(_) => false,
        };
        if !ok {
            errors.fetch_add(1, Ordering::Relaxed);
        }
        rounds += 1;
    }
    rounds
}

async fn luns_change_under_io_and_only_the_sessions_that_see_them_hear_of_it(t: Transport) {
    const WATCHER: &str = "iqn.2026-11.io.riser:watcher";
    const B: &str = "iqn.2026-11.io.riser:e2e-b";
    let a2 = unit(1 << 20);
    // Target A: ME and OTHER see one LUN each (their own), the watcher sees all; target B: one LUN.
    let a = Node::new(TARGET)
        .lun(unit(8 << 20))
        .lun(unit(8 << 20))
        .lun(a2.clone())
        .lun(unit(1 << 20))
        .lun_map(ME, [(0, 0)])
        .lun_map(OTHER, [(0, 1)]);
    let b = Node::new(B).lun(unit(8 << 20));
    let (addr, target) = t.serve(t.config().node(a).node(b)).await;
    let watcher = t.connect(addr, SessionConfig::new(WATCHER, TARGET)).await.unwrap();
    assert_eq!(watcher.report_luns().await.unwrap(), vec![lun(0), lun(1), lun(2), lun(3)]);
    // Four sessions doing verified I/O, none of which sees what changes.
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut io = Vec::new();
    for (i, (me, tgt)) in [(ME, TARGET), (OTHER, TARGET), (ME, B), (OTHER, B)].into_iter().enumerate() {
        let s = t.connect(addr, SessionConfig::new(me, tgt)).await.unwrap();
        io.push(tokio::spawn(verified_io(s, Lun::ZERO, i as u8 * 40, stop.clone(), errors.clone())));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The changes, each while the I/O runs.
    target.add_lun(TARGET, 7, unit(2 << 20)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    a2.resize(3 << 20).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    target.remove_lun(TARGET, 3).await.unwrap();
    target.set_acl(TARGET, AclEntry::new("iqn.2026-11.io.riser:late"), Some([(0, 2)].into())).await.unwrap();
    target.remove_acl(TARGET, "iqn.2026-11.io.riser:late").await.unwrap();
    // Refused changes change nothing.
    assert!(matches!(target.add_lun(TARGET, 7, unit(1 << 20)).await, Err(ChangeError::LunExists { .. })));
    assert!(matches!(target.remove_lun(TARGET, 3).await, Err(ChangeError::NoSuchLun { .. })));
    assert!(matches!(target.add_lun("iqn.2026-11.io.riser:nobody", 0, unit(1 << 20)).await, Err(ChangeError::NoSuchTarget(_))));
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for h in io {
        assert!(h.await.unwrap() > 0, "every session did I/O");
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0, "sessions that see none of the changes see no error");
    // The watcher sees them all: once the LUN inventory, then the capacity of the unit it saw.
    assert_eq!(sense_of(once(&watcher, lun(0), &TUR, None, 0).await), (SenseKey::UNIT_ATTENTION, AscAscq::REPORTED_LUNS_DATA_CHANGED));
    once(&watcher, lun(0), &TUR, None, 0).await.unwrap();
    assert_eq!(watcher.report_luns().await.unwrap(), vec![lun(0), lun(1), lun(2), lun(7)]);
    assert_eq!(
        sense_of(once(&watcher, lun(2), &READ_CAPACITY_16, None, 32).await),
        (SenseKey::UNIT_ATTENTION, AscAscq::CAPACITY_DATA_CHANGED)
    );
    assert_eq!(blocks(once(&watcher, lun(2), &READ_CAPACITY_16, None, 32).await.unwrap()), 6144);
    assert_eq!(watcher.read_capacity(lun(7)).await.unwrap().0, 4096);
    assert_eq!(sense_of(watcher.read_capacity(lun(3)).await), (SenseKey::ILLEGAL_REQUEST, AscAscq::LOGICAL_UNIT_NOT_SUPPORTED));
}

async fn a_removed_lun_answers_once_its_running_write_is_over(t: Transport) {
    let gated = Gated::new();
    let node = Node::new(TARGET).lun(unit(1 << 20)).lun(Arc::new(LogicalUnit::new(gated.clone(), LuIdentity::random())));
    let (addr, target) = t.serve(t.config().node(node)).await;
    let s = t.session(addr).await;
    gated.hold(true);
    let w = tokio::spawn({
        let s = s.clone();
        async move { s.write(lun(1), 8, pattern(9, 4096), 512).await }
    });
    until("the write reached the store", || gated.waiting() == 1).await;
    let removal = tokio::spawn({
        let target = target.clone();
        async move { target.remove_lun(TARGET, 1).await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!removal.is_finished(), "the removal waits for the write running on the LUN");
    gated.hold(false);
    tokio::time::timeout(WAIT, removal).await.unwrap().unwrap().unwrap();
    w.await.unwrap().unwrap();
    assert_eq!(gated.done(), 1);
    // Afterwards: no such LUN, and nothing more reaches the store; the inventory change is told
    // at the next command to a LUN that is there.
    assert_eq!(sense_of(s.write(lun(1), 8, pattern(1, 512), 512).await), (SenseKey::ILLEGAL_REQUEST, AscAscq::LOGICAL_UNIT_NOT_SUPPORTED));
    assert_eq!(gated.done(), 1);
    assert_eq!(sense_of(once(&s, lun(0), &TUR, None, 0).await), (SenseKey::UNIT_ATTENTION, AscAscq::REPORTED_LUNS_DATA_CHANGED));
    let mut back = vec![0; 4096];
    gated.read(8 * 512, &mut back).unwrap();
    assert_eq!(back, pattern(9, 4096), "the write that ran landed whole");
    s.read(lun(0), 0, 1, 512).await.unwrap();
}

async fn removing_an_acl_entry_ends_that_initiators_sessions_only(t: Transport) {
    // A node open to everyone stays open as entries come and go; this one admits only its ACL.
    let mut node = Node::new(TARGET).lun(unit(1 << 20));
    node.target.open = false;
    let (addr, target) = t.serve(t.config().node(node)).await;
    assert!(matches!(t.connect(addr, SessionConfig::new(ME, TARGET)).await, Err(Error::Login(_))), "no entry yet");
    target.set_acl(TARGET, AclEntry::new(ME), None).await.unwrap();
    target.set_acl(TARGET, AclEntry::new(OTHER), None).await.unwrap();
    let mine = t.session(addr).await;
    let other = t.connect(addr, SessionConfig::new(OTHER, TARGET)).await.unwrap();
    other.test_unit_ready(Lun::ZERO).await.unwrap();
    // New credentials for ME apply at its next login; its session goes on.
    let creds = ChapCredentials::new("me", b"mysecret12345".to_vec()).unwrap();
    target.set_acl(TARGET, AclEntry::new(ME).chap(creds.clone()), None).await.unwrap();
    target.remove_acl(TARGET, OTHER).await.unwrap();
    until("OTHER's session is gone", || target.sessions().iter().all(|s| s.initiator != OTHER)).await;
    assert!(other.test_unit_ready(Lun::ZERO).await.is_err(), "its session ended, and it may not log in again");
    assert!(matches!(t.connect(addr, SessionConfig::new(OTHER, TARGET)).await, Err(Error::Login(_))));
    mine.write(Lun::ZERO, 0, pattern(3, 4096), 512).await.unwrap();
    assert!(matches!(t.connect(addr, SessionConfig::new(ME, TARGET)).await, Err(Error::Login(_))), "CHAP now");
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.login.auth = InitiatorAuth::Chap { credentials: creds, mutual: None, algorithms: riser::iscsi::chap::ChapAlgorithm::ALL.to_vec() };
    let again = t.connect(addr, cfg).await.unwrap();
    again.test_unit_ready(Lun::ZERO).await.unwrap();
    assert!(matches!(target.remove_acl(TARGET, OTHER).await, Err(ChangeError::NoSuchAcl { .. })));
    // An open node admits anyone; an entry gives its initiator credentials of its own and keeps
    // the node open (it used to close it for a moment).
    target
        .update_node(TARGET, |n| {
            n.target.open = true;
            Ok(())
        })
        .await
        .unwrap();
    target.set_acl(TARGET, AclEntry::new(OTHER), None).await.unwrap();
    t.connect(addr, SessionConfig::new("iqn.2026-11.io.riser:anyone", TARGET)).await.unwrap();
}

async fn a_requested_logout_is_announced_and_a_silent_initiator_dropped(t: Transport) {
    let mut c = t.config().node(Node::new(TARGET).lun(unit(1 << 20)));
    c.logout_timeout = Duration::from_secs(1);
    let (addr, target) = t.serve(c).await;
    let mut raw = t.raw(addr, Default::default(), 7).await;
    let keep = t.session(addr).await;
    let tsih = target.sessions().iter().find(|s| s.isid.ends_with("07")).expect("listed").tsih;
    assert!(matches!(target.logout_session(0).await, Err(ChangeError::NoSuchSession(0))), "TSIH 0 is never a session's");
    target.logout_session(tsih).await.unwrap();
    let (h, _) = raw.next().await;
    let Header::AsyncMessage(a) = h else { panic!("{h:?}") };
    assert_eq!((a.event, a.param3), (AsyncEvent::REQUEST_LOGOUT, 1));
    assert!(target.sessions().iter().any(|s| s.tsih == tsih && s.logout_requested));
    // It says nothing: dropped after the second it was given (and not long before).
    assert!(!raw.ends_within(Duration::from_millis(500)).await);
    assert!(raw.ends_within(Duration::from_secs(5)).await);
    until("the session is gone", || target.sessions().iter().all(|s| s.tsih != tsih)).await;
    keep.test_unit_ready(Lun::ZERO).await.unwrap();
}

async fn a_riser_initiator_asked_to_log_out_does_and_comes_back(t: Transport) {
    let mut c = t.config().node(Node::new(TARGET).lun(unit(1 << 20)));
    // Far longer than the test waits: the initiator goes on its own, it is not dropped.
    c.logout_timeout = Duration::from_secs(60);
    let (addr, target) = t.serve(c).await;
    let s = t.session(addr).await;
    s.write(Lun::ZERO, 0, pattern(4, 4096), 512).await.unwrap();
    let first = target.sessions()[0].tsih;
    target.logout_session(first).await.unwrap();
    until("the session logged out", || target.sessions().is_empty()).await;
    // Its next command logs in again: a new session, the data still there.
    assert_eq!(s.read(Lun::ZERO, 0, 8, 512).await.unwrap(), pattern(4, 4096));
    let again = target.sessions();
    assert_eq!(again.len(), 1);
    assert_ne!(again[0].tsih, first);
    // A drain with initiators that log out when asked drops nobody.
    let t0 = std::time::Instant::now();
    assert_eq!(target.drain(Duration::from_secs(30)).await, 0);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert!(target.sessions().is_empty());
}

async fn send_targets_lists_every_portal_of_the_target(t: Transport) {
    let (addr, target) = t.serve(t.config().node(Node::new(TARGET).lun(unit(1 << 20)))).await;
    let here = Portal::new(addr, t.iscsi());
    target.add_portal(TARGET, 1, here).await.unwrap();
    target.add_portal(TARGET, 1, Portal::iser("127.0.0.1:3999".parse().unwrap())).await.unwrap();
    target.add_portal(TARGET, 2, Portal::tcp("127.0.0.2:3260".parse().unwrap())).await.unwrap();
    assert!(matches!(target.add_portal(TARGET, 3, here).await, Err(ChangeError::PortalExists { .. })));
    let found = t.discover(addr, ME, InitiatorAuth::None).await.unwrap();
    let (_, addrs) = found.iter().find(|(n, _)| n == TARGET).expect("listed");
    let mut addrs = addrs.clone();
    addrs.sort();
    let mut want = vec![format!("{addr},1"), "127.0.0.1:3999,1".to_string(), "127.0.0.2:3260,2".to_string()];
    want.sort();
    assert_eq!(addrs, want);
    // Logged in through its portal of group 1: that group's tag.
    let s = t.session(addr).await;
    assert_eq!(s.params().target_portal_group_tag, Some(1));
    // A target not reached through this portal cannot be logged in to here.
    target.remove_portal(TARGET, here).await.unwrap();
    assert!(matches!(t.connect(addr, SessionConfig::new(ME, TARGET)).await, Err(Error::Login(_))));
}

async fn statistics_count_what_the_sessions_did(t: Transport) {
    let (addr, target) = t.serve(t.config().node(Node::new(TARGET).lun(unit(1 << 20)))).await;
    let s = t.session(addr).await;
    s.write(Lun::ZERO, 0, pattern(1, 8192), 512).await.unwrap();
    s.read(Lun::ZERO, 0, 16, 512).await.unwrap();
    s.read(Lun::ZERO, 16, 8, 512).await.unwrap();
    assert!(s.read(Lun::ZERO, 1 << 30, 1, 512).await.is_err(), "beyond the end");
    // A command counts once its response is out: the initiator may have it a moment before.
    until("every command counted", || target.stats().luns.get(&(TARGET.to_string(), 0)).is_some_and(|l| l.total_commands() >= 4)).await;
    let st = target.stats();
    let l = &st.luns[&(TARGET.to_string(), 0)];
    assert_eq!((l.write_bytes, l.read_bytes), (8192, 12288));
    assert_eq!((l.commands[Op::Write.index()], l.commands[Op::Read.index()]), (1, 3));
    let illegal = ERROR_NAMES.iter().position(|n| *n == "illegal_request").unwrap();
    assert_eq!(l.errors[illegal], 1);
    assert_eq!(l.latency_buckets.iter().sum::<u64>(), l.total_commands());
    assert_eq!(st.sessions[TARGET], 1);
    assert_eq!(st.logins, 1);
    let listed = target.sessions();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].initiator.as_str(), listed[0].target.as_deref()), (ME, Some(TARGET)));
    assert!(listed[0].keys.iter().any(|(k, _)| *k == "MaxBurstLength"));
    assert_eq!(listed[0].luns[&0].write_bytes, 8192);
    // A failed login counts; counters outlive the session that made them.
    assert!(t.connect(addr, SessionConfig::new(ME, "iqn.2026-11.io.riser:nothing")).await.is_err());
    s.logout().await.unwrap();
    until("the session is gone", || target.sessions().is_empty()).await;
    let after = target.stats();
    assert_eq!(after.luns[&(TARGET.to_string(), 0)], *l);
    assert_eq!(after.sessions.get(TARGET), None);
    assert_eq!(after.login_failures.iter().sum::<u64>(), 1);
    assert_eq!(after.data_bytes, 0);
}

/// iSCSI names compare without case (RFC 3722): an initiator that spells the target's name in
/// capitals reaches the same target, and its session and statistics name the target as
/// configured — each spelling used to be an entry of its own, kept for good once its session
/// ended, and an I_T nexus of its own.
async fn a_target_name_spelled_otherwise_is_the_same_target_in_statistics_and_sessions(t: Transport) {
    let (addr, target) = t.serve(t.config().node(Node::new(TARGET).lun(unit(1 << 20)))).await;
    let shouted = TARGET.to_uppercase();
    let s = t.connect(addr, SessionConfig::new(ME, &shouted)).await.unwrap();
    s.write(Lun::ZERO, 0, pattern(1, 4096), 512).await.unwrap();
    let listed = target.sessions();
    assert_eq!(listed.iter().map(|l| l.target.as_deref()).collect::<Vec<_>>(), vec![Some(TARGET)]);
    until("the write counted", || target.stats().luns.get(&(TARGET.to_string(), 0)).is_some_and(|l| l.write_bytes == 4096)).await;
    s.logout().await.unwrap();
    until("the session is gone", || target.sessions().is_empty()).await;
    let st = target.stats();
    assert_eq!(st.luns.keys().map(|(name, _)| name.as_str()).collect::<Vec<_>>(), vec![TARGET]);
}
