//! Discovery sessions on every transport: what SendTargets lists, to whom, behind which CHAP,
//! and that a discovery session claims nothing of a normal session's nexus.

use crate::support::{ME, OTHER, TARGET, Transport, creds};
use bytes::Bytes;
use riser::datamover::{ControlPdu, DmEvent, SharedDatamover};
use riser::initiator::{Error, SessionConfig};
use riser::iscsi::chap::{ChapAlgorithm, ChapCredentials};
use riser::iscsi::login::{AuthFailure, InitiatorAuth, InitiatorLoginConfig, LoginFailure, LoginOutcome, LoginStatus};
use riser::iscsi::wire::{Header, Isid, LogoutReason, LogoutRequest};
use riser::scsi::lun::Lun;
use riser::scsi::sense::Status;
use riser::target::server::{DiscoveryScope, Node, TargetConfig, TargetNode};
use std::net::SocketAddr;
use std::time::Duration;

on_every_transport!(
    discovery_lists_the_target,
    sendtargets_lists_only_permitted_targets_unless_told_to_list_all,
    discovery_chap_required_refused_and_mutual,
    sendtargets_longer_than_one_pdu_uses_continuation,
    discovery_in_a_victims_names_leaves_its_reservation_and_session,
);

async fn discovery_lists_the_target(t: Transport) {
    let addr = t.start(|_| {}, |_| {}).await;
    let found = t.discover(addr, ME, InitiatorAuth::None).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].0, TARGET);
    assert_eq!(found[0].1, [format!("{addr},1")]);
}

async fn sendtargets_lists_only_permitted_targets_unless_told_to_list_all(t: Transport) {
    const MINE: &str = "iqn.2026-11.io.riser:mine";
    const THEIRS: &str = "iqn.2026-11.io.riser:theirs";
    let nodes = |c: &mut TargetConfig| {
        for (name, acl) in [(MINE, ME), (THEIRS, OTHER)] {
            c.nodes.push(Node::from(TargetNode::open(name).allow(acl)));
        }
    };
    let names = |found: Vec<(String, Vec<String>)>| found.into_iter().map(|(n, _)| n).collect::<Vec<_>>();
    // Default: the open target and those whose ACL names the initiator.
    let addr = t.start(|_| {}, nodes).await;
    assert_eq!(names(t.discover(addr, ME, InitiatorAuth::None).await.unwrap()), [TARGET, MINE]);
    assert_eq!(names(t.discover(addr, OTHER, InitiatorAuth::None).await.unwrap()), [TARGET, THEIRS]);
    // A normal session to a target the ACL refuses stays refused.
    let e = t.connect(addr, SessionConfig::new(ME, THEIRS)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHORIZATION_FAILURE))), "{e}");
    // Configured to list everything (LIO's demo_mode_discovery=1).
    let addr = t
        .start(
            |_| {},
            |c| {
                nodes(c);
                c.discovery_scope = DiscoveryScope::All;
            },
        )
        .await;
    assert_eq!(names(t.discover(addr, ME, InitiatorAuth::None).await.unwrap()), [TARGET, MINE, THEIRS]);
}

async fn discovery_chap_required_refused_and_mutual(t: Transport) {
    let chap = |secret: &str, mutual: Option<ChapCredentials>| InitiatorAuth::Chap {
        credentials: creds("disc", secret),
        algorithms: ChapAlgorithm::ALL.to_vec(),
        mutual,
    };
    let addr = t.start(|_| {}, |c| c.login.discovery_chap = Some(creds("disc", "discoverysecret"))).await;
    let e = t.discover(addr, ME, InitiatorAuth::None).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "{e}");
    let e = t.discover(addr, ME, chap("wrongsecret1234", None)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "{e}");
    assert_eq!(t.discover(addr, ME, chap("discoverysecret", None)).await.unwrap().len(), 1);
    // Discovery CHAP is not the targets' CHAP: a normal session to the open node needs none.
    t.session(addr).await.test_unit_ready(Lun::ZERO).await.unwrap();

    let addr = t
        .start(
            |_| {},
            |c| {
                c.login.discovery_chap = Some(creds("disc", "discoverysecret"));
                c.login.discovery_mutual_chap = Some(creds("portal", "portalsecret12"));
            },
        )
        .await;
    assert_eq!(t.discover(addr, ME, chap("discoverysecret", Some(creds("portal", "portalsecret12")))).await.unwrap().len(), 1);
    let e = t.discover(addr, ME, chap("discoverysecret", Some(creds("portal", "impostorsecret")))).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Authentication(AuthFailure::MutualChapFailed))), "{e}");
    let e = t.discover(addr, ME, chap("discoverysecret", None)).await.unwrap_err();
    assert!(matches!(e, Error::Login(LoginFailure::Status(LoginStatus::AUTHENTICATION_FAILURE))), "mutual CHAP required: {e}");
}

/// 4000 targets: about 400 KB of SendTargets text, more than the initiator's 256 KiB
/// MaxRecvDataSegmentLength, so the answer comes in C-bit pieces.
async fn sendtargets_longer_than_one_pdu_uses_continuation(t: Transport) {
    let names: Vec<String> = (0..4000).map(|i| format!("iqn.2026-11.io.riser:a-rather-long-target-name-for-the-list-{i:05}")).collect();
    let addr = t
        .start(
            |_| {},
            |c| {
                for n in &names {
                    c.nodes.push(Node::new(n.clone()));
                }
            },
        )
        .await;
    let found = t.discover(addr, ME, InitiatorAuth::None).await.unwrap();
    assert_eq!(found.len(), 4001);
    assert_eq!(found[4000].0, names[3999]);
    assert!(found.iter().all(|(_, a)| a.len() == 1));
}

/// A discovery session (the sans-IO machine over a datamover of `t`) in the name of
/// `initiator` with `isid`, that also declares `TargetName=target` in its first request (RFC
/// 7143 requires TargetName only on normal sessions; nothing forbids it on discovery).
async fn discovery_session_naming(
    t: Transport,
    addr: SocketAddr,
    initiator: &str,
    isid: Isid,
    target: &str,
) -> (SharedDatamover, LoginOutcome) {
    let connector = t.connector();
    let dm = connector.connect(addr).await.unwrap();
    let mut cfg = InitiatorLoginConfig::new(initiator, None, isid);
    cfg.transport = connector.transport();
    let o = crate::support::raw::login_over(&dm, cfg, format!("TargetName={target}\0").as_bytes()).await;
    (dm, o)
}

async fn discovery_in_a_victims_names_leaves_its_reservation_and_session(t: Transport) {
    let addr = t.start(|n| n.target = n.target.clone().allow(ME).allow(OTHER), |_| {}).await;
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.login.isid = Isid([0x80, 0x11, 0x22, 0x33, 0x44, 0x55]);
    let victim = t.connect(addr, cfg.clone()).await.unwrap();
    let reserve6 = [0x16, 0, 0, 0, 0, 0];
    assert_eq!(victim.command(Lun::ZERO, &reserve6, None, 0).await.unwrap().status, Status::GOOD);
    let other = t.connect(addr, SessionConfig::new(OTHER, TARGET)).await.unwrap();
    let tur = |s: riser::initiator::Session| async move { s.command(Lun::ZERO, &[0; 6], None, 0).await.unwrap().status };
    assert_eq!(tur(other.clone()).await, Status::RESERVATION_CONFLICT);

    // A discovery session with the victim's InitiatorName, ISID and TargetName, ending with a
    // Logout (the target releases what the nexus holds before it answers)...
    let (dm, o) = discovery_session_naming(t, addr, ME, cfg.login.isid, TARGET).await;
    let logout = LogoutRequest {
        immediate: true,
        reason: LogoutReason::CLOSE_SESSION,
        itt: 2,
        cmd_sn: o.exp_cmd_sn,
        exp_stat_sn: o.stat_sn,
        ..LogoutRequest::default()
    };
    dm.send_control(ControlPdu::new(Header::LogoutRequest(logout), Bytes::new())).await.unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(5), dm.next_event()).await.unwrap() {
            DmEvent::Control(ControlPdu { header: Header::LogoutResponse(_), .. }) => break,
            DmEvent::Control(_) => continue,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(tur(other.clone()).await, Status::RESERVATION_CONFLICT, "a discovery Logout released the victim's RESERVE(6)");

    // ...and one that just drops its connection.
    let (dm, _) = discovery_session_naming(t, addr, ME, cfg.login.isid, TARGET).await;
    dm.terminate();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(tur(other.clone()).await, Status::RESERVATION_CONFLICT, "a discovery session's end released the victim's RESERVE(6)");

    // The victim still holds the unit (a reinstatement or a closed session would have ended
    // its nexus, and the reservation with it) and releases it.
    assert_eq!(tur(victim.clone()).await, Status::GOOD);
    assert_eq!(victim.command(Lun::ZERO, &[0x17, 0, 0, 0, 0, 0], None, 0).await.unwrap().status, Status::GOOD);
    assert_eq!(tur(other).await, Status::GOOD, "RELEASE(6) by the victim frees the unit");
}
