//! Tests of implicit ALUA: the unit's target port groups in INQUIRY and REPORT TARGET PORT
//! GROUPS, the unit attention a state change queues, and what ports in states that are not
//! active refuse.

use super::tests::{run_as, sense_of};
use super::*;
use crate::backend::RamBackend;
use riser_scsi::alua::{TargetPortGroups, status, supported};
use riser_scsi::cdb::op;
use riser_scsi::inquiry::{StandardInquiry, designator_type, parse_device_identification, parse_vpd};

/// Gateway A's port (relative port 1, group 1) and gateway B's (relative port 2, group 2), as
/// one initiator reaches them.
fn port_a() -> Nexus {
    Nexus::new("iqn.host,i,0x1", "iqn.shared,t,0x0001", 1).with_port_group(1)
}
fn port_b() -> Nexus {
    Nexus::new("iqn.host,i,0x1", "iqn.shared,t,0x0002", 2).with_port_group(2)
}

fn unit() -> LogicalUnit {
    LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random())
}

/// Group 1 (gateway A: relative ports 1 and 3) active/optimized, group 2 (gateway B, not served
/// by this process: relative port 2) active/non-optimized.
fn two_groups(lu: &LogicalUnit) {
    lu.set_port_groups(vec![
        TargetPortGroup::new(2, [2], AccessState::ActiveNonOptimized),
        TargetPortGroup::new(1, [1, 3], AccessState::ActiveOptimized),
    ])
    .unwrap();
}

fn rtpg_cdb(format: u8, alloc: u32) -> [u8; 12] {
    let a = alloc.to_be_bytes();
    [op::MAINTENANCE_IN, (format << 5) | 0x0a, 0, 0, 0, 0, a[0], a[1], a[2], a[3], 0, 0]
}

fn rtpg(lu: &LogicalUnit, n: &Nexus, format: u8, alloc: u32) -> Vec<u8> {
    let o = run_as(lu, &rtpg_cdb(format, alloc), &[], n);
    assert_eq!(o.status, Status::GOOD, "{o:?}");
    o.data.to_vec()
}

fn tur(lu: &LogicalUnit, n: &Nexus) -> Outcome {
    run_as(lu, &[0; 6], &[], n)
}

#[test]
fn standard_inquiry_claims_implicit_alua_only_and_multiport_with_two_ports() {
    let lu = unit();
    let std = |lu: &LogicalUnit| StandardInquiry::parse(&run_as(lu, &[op::INQUIRY, 0, 0, 0, 96, 0], &[], &port_a()).data).unwrap();
    let s = std(&lu);
    assert_eq!((s.byte5 >> 4) & 3, 0b01, "TPGS: implicit only");
    assert_eq!(s.byte6 & 0x10, 0, "one port: not MULTIP");
    two_groups(&lu);
    let s = std(&lu);
    assert_eq!((s.byte5 >> 4) & 3, 0b01);
    assert_eq!(s.byte6 & 0x10, 0x10, "three ports in two groups: MULTIP");
}

#[test]
fn vpd_0x83_names_the_port_and_its_group_per_nexus() {
    let lu = unit();
    two_groups(&lu);
    let ids = |n: &Nexus| {
        let o = run_as(&lu, &[op::INQUIRY, 1, 0x83, 0x01, 0, 0], &[], n);
        parse_device_identification(parse_vpd(&o.data).unwrap().1).unwrap()
    };
    let (a, b) = (ids(&port_a()), ids(&port_b()));
    assert_eq!(a.len(), 4);
    assert_eq!(a[..2], b[..2], "the unit's designators are one for every port");
    for (ds, port, group) in [(&a, 1u8, 1u8), (&b, 2, 2)] {
        assert_eq!((ds[2].kind, ds[2].association, &ds[2].value[..]), (designator_type::RELATIVE_TARGET_PORT, 1, &[0, 0, 0, port][..]));
        assert_eq!((ds[3].kind, ds[3].association, &ds[3].value[..]), (designator_type::TARGET_PORT_GROUP, 1, &[0, 0, 0, group][..]));
    }
}

#[test]
fn rtpg_reports_every_group_the_remote_one_too_in_both_formats_and_truncated() {
    let lu = unit();
    two_groups(&lu);
    let sup = SUPPORTED_STATES;
    assert_eq!(sup, supported::T | supported::U | supported::S | supported::AN | supported::AO);
    #[rustfmt::skip]
    let descriptors = [
        // group 1: active/optimized, ports 1 and 3
        0x00, sup, 0, 1, 0, 0, 0, 2,   0, 0, 0, 1,   0, 0, 0, 3,
        // group 2 (the other gateway's): active/non-optimized, port 2
        0x01, sup, 0, 2, 0, 0, 0, 1,   0, 0, 0, 2,
    ];
    let short = rtpg(&lu, &port_a(), 0, 1024);
    assert_eq!(short[..4], [0, 0, 0, 28]);
    assert_eq!(short[4..], descriptors);
    let ext = rtpg(&lu, &port_a(), 1, 1024);
    assert_eq!(ext[..8], [0, 0, 0, 32, 0x10, 0, 0, 0], "extended header: format type 001b, no transition time");
    assert_eq!(ext[8..], descriptors);
    // Both ports of the unit report the same data.
    assert_eq!(rtpg(&lu, &port_b(), 1, 1024), ext);
    // The allocation length cuts the data; the length field still tells the whole.
    assert_eq!(rtpg(&lu, &port_a(), 1, 10), ext[..10]);
    assert_eq!(rtpg(&lu, &port_a(), 0, 4), [0, 0, 0, 28]);
    assert!(rtpg(&lu, &port_a(), 0, 0).is_empty());
    let parsed = TargetPortGroups::parse(&ext).unwrap();
    assert_eq!(
        parsed.groups.iter().map(|g| (g.id, g.state, g.relative_ports.clone())).collect::<Vec<_>>(),
        [(1, AccessState::ActiveOptimized, vec![1, 3]), (2, AccessState::ActiveNonOptimized, vec![2])]
    );
    // Other parameter data formats are refused.
    let s = sense_of(&run_as(&lu, &rtpg_cdb(2, 1024), &[], &port_a()));
    assert_eq!((s.key, s.asc), (SenseKey::ILLEGAL_REQUEST, AscAscq::INVALID_FIELD_IN_CDB));
    assert_eq!(s.field_pointer().map(|f| (f.byte, f.bit)), Some((1, Some(7))));
}

#[test]
fn without_a_model_the_asking_port_is_one_active_optimized_group() {
    let lu = unit();
    let data = TargetPortGroups::parse(&rtpg(&lu, &port_b(), 1, 1024)).unwrap();
    assert_eq!(data.groups.len(), 1);
    let g = &data.groups[0];
    assert_eq!((g.id, g.state, &g.relative_ports[..], g.status), (2, AccessState::ActiveOptimized, &[2u16][..], status::NONE));
    assert!(lu.port_groups().is_empty());
    assert_eq!(lu.access_state(7), AccessState::ActiveOptimized);
}

#[test]
fn moving_the_optimized_group_tells_every_nexus_then_reports_the_new_states() {
    let lu = unit();
    two_groups(&lu);
    let other_host = Nexus::new("iqn.other,i,0x2", "iqn.shared,t,0x0001", 1).with_port_group(1);
    for n in [port_a(), port_b(), other_host.clone()] {
        lu.nexus_seen(&n);
    }
    assert_eq!(lu.set_optimized(1), Ok(false), "group 1 is optimized already: no change");
    assert_eq!(tur(&lu, &port_a()).status, Status::GOOD, "and no unit attention");
    assert_eq!(lu.set_optimized(2), Ok(true));
    for n in [port_a(), port_b(), other_host] {
        let s = sense_of(&tur(&lu, &n));
        assert_eq!((s.key, s.asc), (SenseKey::UNIT_ATTENTION, AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED), "{n}");
        assert_eq!(tur(&lu, &n).status, Status::GOOD, "reported once");
    }
    let data = TargetPortGroups::parse(&rtpg(&lu, &port_a(), 0, 1024)).unwrap();
    assert_eq!(
        data.groups.iter().map(|g| (g.id, g.state, g.status)).collect::<Vec<_>>(),
        [(1, AccessState::ActiveNonOptimized, status::IMPLICIT), (2, AccessState::ActiveOptimized, status::IMPLICIT)]
    );
    assert_eq!(lu.access_state(2), AccessState::ActiveOptimized);
    // Both active states serve every command.
    let read = [op::READ_10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    assert_eq!(run_as(&lu, &read, &[], &port_a()).status, Status::GOOD);
    assert_eq!(run_as(&lu, &read, &[], &port_b()).status, Status::GOOD);
    assert_eq!(lu.set_optimized(9), Err(AluaError::UnknownGroup(9)));
}

#[test]
fn setting_the_model_queues_the_attention_only_when_a_state_changes() {
    let lu = unit();
    lu.nexus_seen(&port_a());
    // From the implicit model (every group active/optimized) to one optimized group: no change.
    assert_eq!(lu.set_port_groups(vec![TargetPortGroup::new(1, [1], AccessState::ActiveOptimized)]), Ok(true));
    assert_eq!(tur(&lu, &port_a()).status, Status::GOOD);
    // A second, non-optimized group is a state to tell.
    two_groups(&lu);
    assert_eq!(sense_of(&tur(&lu, &port_a())).asc, AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED);
    // The same model again: nothing.
    two_groups(&lu);
    assert_eq!(tur(&lu, &port_a()).status, Status::GOOD);
    // The optimized group moved by a new model (a configuration reload).
    lu.set_port_groups(vec![
        TargetPortGroup::new(1, [1, 3], AccessState::ActiveNonOptimized),
        TargetPortGroup::new(2, [2], AccessState::ActiveOptimized),
    ])
    .unwrap();
    assert_eq!(sense_of(&tur(&lu, &port_a())).asc, AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED);
    assert_eq!(lu.access_state(1), AccessState::ActiveNonOptimized);
}

#[test]
fn models_the_unit_cannot_honour_are_refused() {
    let lu = unit();
    let g = |id, ports: &[u16], st| TargetPortGroup::new(id, ports.iter().copied(), st);
    use AccessState::*;
    assert_eq!(lu.set_port_groups(vec![g(1, &[1], ActiveOptimized), g(1, &[2], ActiveOptimized)]), Err(AluaError::DuplicateGroup(1)));
    assert_eq!(lu.set_port_groups(vec![g(1, &[1], ActiveOptimized), g(2, &[1], ActiveOptimized)]), Err(AluaError::BadPort(1)));
    assert_eq!(lu.set_port_groups(vec![g(1, &[0], ActiveOptimized)]), Err(AluaError::BadPort(0)));
    assert_eq!(lu.set_port_groups(vec![g(1, &[1], Offline)]), Err(AluaError::Unsupported(Offline)));
    assert_eq!(lu.set_port_groups(vec![g(1, &[1], LbaDependent)]), Err(AluaError::Unsupported(LbaDependent)));
    let many: Vec<u16> = (1..=256).collect();
    assert_eq!(lu.set_port_groups(vec![g(1, &many, ActiveOptimized)]), Err(AluaError::TooManyPorts(1)));
    assert!(lu.port_groups().is_empty(), "nothing refused was kept");
    two_groups(&lu);
    assert_eq!(lu.set_access_state(3, Standby), Err(AluaError::UnknownGroup(3)));
    assert_eq!(lu.set_access_state(2, Offline), Err(AluaError::Unsupported(Offline)));
}

#[test]
fn ports_in_standby_unavailable_or_transitioning_refuse_what_spc_has_them_refuse() {
    let lu = unit();
    two_groups(&lu);
    let mode_sense = [op::MODE_SENSE_6, 0, 0x3f, 0, 255, 0];
    let read = [op::READ_10, 0, 0, 0, 0, 0, 0, 0, 1, 0];
    for (state, asc, mode_sense_served) in [
        (AccessState::Standby, AscAscq::LUN_NOT_ACCESSIBLE_STANDBY, true),
        (AccessState::Unavailable, AscAscq::LUN_NOT_ACCESSIBLE_UNAVAILABLE, false),
        (AccessState::Transitioning, AscAscq::LUN_NOT_ACCESSIBLE_TRANSITIONING, false),
    ] {
        lu.nexus_seen(&port_b());
        assert_eq!(lu.set_access_state(2, state), Ok(true));
        let s = sense_of(&run_as(&lu, &read, &[], &port_b()));
        assert_eq!((s.key, s.asc), (SenseKey::UNIT_ATTENTION, AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED), "the attention comes first");
        for cdb in [&[0u8; 6][..], &read] {
            let s = sense_of(&run_as(&lu, cdb, &[], &port_b()));
            assert_eq!((s.key, s.asc), (SenseKey::NOT_READY, asc), "{state:?}");
        }
        assert_eq!(run_as(&lu, &mode_sense, &[], &port_b()).status == Status::GOOD, mode_sense_served, "{state:?}");
        // INQUIRY, REPORT TARGET PORT GROUPS and REQUEST SENSE are served in every state.
        assert_eq!(run_as(&lu, &[op::INQUIRY, 0, 0, 0, 96, 0], &[], &port_b()).status, Status::GOOD);
        assert_eq!(run_as(&lu, &[op::REQUEST_SENSE, 0, 0, 0, 18, 0], &[], &port_b()).status, Status::GOOD);
        let data = TargetPortGroups::parse(&rtpg(&lu, &port_b(), 1, 1024)).unwrap();
        assert_eq!((data.groups[1].state, data.groups[1].status), (state, status::IMPLICIT));
        // The other group's port serves everything.
        assert_eq!(run_as(&lu, &read, &[], &port_a()).status, Status::GOOD);
    }
    assert_eq!(lu.set_access_state(2, AccessState::ActiveNonOptimized), Ok(true));
    assert_eq!(sense_of(&run_as(&lu, &read, &[], &port_b())).asc, AscAscq::ASYMMETRIC_ACCESS_STATE_CHANGED);
    assert_eq!(run_as(&lu, &read, &[], &port_b()).status, Status::GOOD);
}

#[test]
fn rsoc_lists_report_target_port_groups() {
    let lu = unit();
    // One command, by opcode and service action: supported (3), a 12-byte CDB.
    let cdb = [op::MAINTENANCE_IN, 0x0c, 0x02, op::MAINTENANCE_IN, 0, 0x0a, 0, 0, 1, 0, 0, 0];
    let o = run_as(&lu, &cdb, &[], &port_a());
    assert_eq!(o.status, Status::GOOD);
    assert_eq!((o.data[1] & 7, u16::from_be_bytes([o.data[2], o.data[3]])), (3, 12));
}
