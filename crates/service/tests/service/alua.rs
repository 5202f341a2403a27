//! Implicit ALUA across two gateways: two riser targets in this process export one store (one
//! backend, one identity) under one target name, each configured with the other's port group,
//! and report consistent target port groups to the riser initiator; the optimized group moves.

use crate::support::{ME, Running, TUR, lun, once, sense_of, session, write_private};
use riser_initiator::{Lun, Session};
use riser_scsi::alua::{AccessState, TargetPortGroups};
use riser_scsi::cdb::Cdb;
use riser_scsi::inquiry::{designator_type, parse_device_identification};
use riser_scsi::sense::{AscAscq, SenseKey};
use riser_target::backend::{BlockBackend, RamBackend};
use riser_target::lu::{LogicalUnit, LuIdentity, TargetPortGroup};
use riser_target::server::{Node, Portal, PortalGroup, Target, TargetConfig};
use std::net::SocketAddr;
use std::sync::Arc;

const SHARED: &str = "iqn.2026-11.io.riser:shared";

/// REPORT TARGET PORT GROUPS through `s` (extended header format), parsed.
async fn rtpg(s: &Session, l: Lun) -> (Vec<u8>, TargetPortGroups) {
    let data = s.run(l, &Cdb::ReportTargetPortGroups { format: 1, alloc_len: 4096, control: 0 }, None, 4096).await.unwrap();
    let parsed = TargetPortGroups::parse(&data).unwrap();
    (data.to_vec(), parsed)
}

fn states(t: &TargetPortGroups) -> Vec<(u16, AccessState, Vec<u16>)> {
    t.groups.iter().map(|g| (g.id, g.state, g.relative_ports.clone())).collect()
}

/// A gateway: a target whose one portal group (relative port and ALUA group `me`) serves a unit
/// over `backend` with `identity`, its ALUA model both gateways' groups with group 1 optimized.
async fn gateway(me: u16, backend: Arc<dyn BlockBackend>, identity: LuIdentity) -> (SocketAddr, Arc<LogicalUnit>) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    let lu = Arc::new(LogicalUnit::new(backend, identity));
    lu.set_port_groups(vec![
        TargetPortGroup::new(1, [1], AccessState::ActiveOptimized),
        TargetPortGroup::new(2, [2], AccessState::ActiveNonOptimized),
    ])
    .unwrap();
    let group = PortalGroup::new(me).relative_port(me).port_group(me).portal(Portal::tcp(addr));
    let node = Node::new(SHARED).lun(lu.clone()).portal_group(group);
    let target = Target::new(TargetConfig::default().node(node));
    tokio::spawn(target.serve(l));
    (addr, lu)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_of_one_store_report_one_consistent_alua_model() {
    let backend: Arc<dyn BlockBackend> = Arc::new(RamBackend::new(4 << 20, 512));
    let identity = LuIdentity::new(uuid::Uuid::from_u128(0x6f1c2d3e_4a5b_4c6d_8e7f_0123456789ab));
    let (addr_a, lu_a) = gateway(1, backend.clone(), identity.clone()).await;
    let (addr_b, lu_b) = gateway(2, backend, identity).await;
    let (a, b) = (session(addr_a, ME, SHARED).await, session(addr_b, ME, SHARED).await);

    // One device (the unit's designators), two ports in two groups.
    let ids = |d: bytes::Bytes| parse_device_identification(&d).unwrap();
    let (ids_a, ids_b) = (ids(a.vpd(Lun::ZERO, 0x83).await.unwrap()), ids(b.vpd(Lun::ZERO, 0x83).await.unwrap()));
    assert_eq!(ids_a[..2], ids_b[..2], "the same unit through both gateways");
    let port = |ds: &[riser_scsi::inquiry::Designator], kind| ds.iter().find(|d| d.kind == kind).unwrap().value[3];
    assert_eq!((port(&ids_a, designator_type::RELATIVE_TARGET_PORT), port(&ids_a, designator_type::TARGET_PORT_GROUP)), (1, 1));
    assert_eq!((port(&ids_b, designator_type::RELATIVE_TARGET_PORT), port(&ids_b, designator_type::TARGET_PORT_GROUP)), (2, 2));
    assert_eq!((a.inquiry(Lun::ZERO).await.unwrap().byte5 >> 4) & 3, 1, "TPGS: implicit");

    // Each gateway reports both groups, the other's included, byte for byte the same.
    let (bytes_a, via_a) = rtpg(&a, Lun::ZERO).await;
    let (bytes_b, via_b) = rtpg(&b, Lun::ZERO).await;
    assert_eq!(bytes_a, bytes_b);
    assert_eq!(states(&via_a), [(1, AccessState::ActiveOptimized, vec![1]), (2, AccessState::ActiveNonOptimized, vec![2])]);
    assert_eq!(via_b.implicit_transition_time, Some(0));

    // Both paths serve I/O, of one store.
    let data = crate::support::pattern(9, 4096);
    b.write(Lun::ZERO, 16, data.clone(), 512).await.unwrap();
    assert_eq!(a.read(Lun::ZERO, 16, 8, 512).await.unwrap(), data);

    // The optimized group moves to gateway B (each gateway told, as a reload of both would).
    assert!(lu_a.set_optimized(2).unwrap());
    assert!(lu_b.set_optimized(2).unwrap());
    for s in [&a, &b] {
        assert_eq!(sense_of(once(s, Lun::ZERO, &TUR, None, 0).await), (SenseKey::UNIT_ATTENTION, AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED));
    }
    let (bytes_a, via_a) = rtpg(&a, Lun::ZERO).await;
    assert_eq!(rtpg(&b, Lun::ZERO).await.0, bytes_a);
    assert_eq!(states(&via_a), [(1, AccessState::ActiveNonOptimized, vec![1]), (2, AccessState::ActiveOptimized, vec![2])]);
    assert_eq!(a.read(Lun::ZERO, 16, 8, 512).await.unwrap(), data, "the non-optimized path still serves");
}

const GATEWAY_A: &str = r#"
[[store]]
name = "shared"
backing = "ram:1MiB"
uuid = "6f1c2d3e-4a5b-4c6d-8e7f-0123456789ab"

[[target]]
name = "iqn.2026-11.io.riser:svc"

[[target.portal_group]]
tag = 1
relative_port = 1
port_group = 1
portals = ["127.0.0.1:PORT"]

[[target.remote_port_group]]
port_group = 2
relative_ports = [2]

[[target.lun]]
lun = 0
store = "shared"
optimized_port_group = OPTIMIZED
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_moves_the_optimized_group_and_tells_the_hosts() {
    let r = Running::start("alua", &GATEWAY_A.replace("OPTIMIZED", "1")).await;
    let me = session(r.addr, ME, crate::support::TARGET).await;
    let (_, before) = rtpg(&me, lun(0)).await;
    assert_eq!(states(&before), [(1, AccessState::ActiveOptimized, vec![1]), (2, AccessState::ActiveNonOptimized, vec![2])]);

    let port = r.addr.port();
    let edited = format!("portal = [\"127.0.0.1:{port}\"]\n{}", GATEWAY_A.replace("OPTIMIZED", "2").replace("PORT", &port.to_string()));
    write_private(&r.config, &edited);
    assert_eq!(r.svc.reload().await.unwrap(), Vec::<String>::new());
    assert_eq!(sense_of(once(&me, lun(0), &TUR, None, 0).await), (SenseKey::UNIT_ATTENTION, AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED));
    let (_, after) = rtpg(&me, lun(0)).await;
    assert_eq!(states(&after), [(1, AccessState::ActiveNonOptimized, vec![1]), (2, AccessState::ActiveOptimized, vec![2])]);
    // The saved running configuration keeps the keys.
    let saved = r.svc.running_config().await;
    assert_eq!(saved.targets[0].luns[0].optimized_port_group, Some(2));
    assert_eq!(saved.targets[0].remote_port_groups[0].relative_ports, [2]);
    // Reloading the same file tells nothing.
    assert!(r.svc.reload().await.unwrap().is_empty());
    once(&me, lun(0), &TUR, None, 0).await.expect("no change, no unit attention");
}
