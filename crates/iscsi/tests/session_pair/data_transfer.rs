//! Data transfer: write splits, R2T plans, residuals and sense, phase collapse.

use crate::harness::*;
use bytes::Bytes;
use riser_iscsi::keys::NegotiatedParams;
use riser_iscsi::session::{InitiatorEvent, Residual, TargetEvent, TargetSessionConfig};
use riser_iscsi::wire::{Header, RESERVED_TAG, ScsiCommand};
use riser_scsi::sense::Status;

#[test]
fn a_write_command_carries_its_split_and_its_r2t_plan_numbers_ttts() {
    let params = NegotiatedParams {
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 65_536,
        max_burst_length: 262_144,
        ..Default::default()
    };
    let mut p = Pair::with(TargetSessionConfig::new(4).luns([LUN0]), &params, 1, 1);
    let c = p.i.start_command(LUN0, &[0x2a], 0, 1 << 20).unwrap();
    let c = ScsiCommand { final_: false, ..c };
    p.t.handle_pdu(p.now, &Header::ScsiCommand(c), Bytes::new(), Bytes::new(), 8192);
    let Some(TargetEvent::Command { split, .. }) = p.t.poll_event() else { panic!("a command") };
    assert_eq!((split.immediate, split.unsolicited_end, split.len), (8192, 65_536, 1 << 20));
    let plan = p.t.plan_write(&c, split, 1 << 20);
    assert_eq!((plan.start, plan.end, plan.count()), (65_536, 1 << 20, 4));
    let second = p.t.plan_write(&c, split, 1 << 20);
    assert_eq!(second.first_ttt, plan.first_ttt + 4, "tags are not reused while the first plan's are live");
    assert!((0..4).all(|n| plan.nth(n).unwrap().ttt != RESERVED_TAG));
    assert_eq!(plan.nth(3).unwrap().len, (1 << 20) - 65_536 - 3 * 262_144);
}

#[test]
fn an_r2t_plan_is_stamped_with_the_current_numbers_without_consuming_stat_sn() {
    let mut p = Pair::new(4);
    let c = p.i.start_command(LUN0, &[0x2a], 0, 4096).unwrap();
    p.deliver_command(c);
    let split = riser_iscsi::session::WriteSplit { immediate: 0, unsolicited_end: 0, len: 4096 };
    let plan = p.t.plan_write(&c, split, 4096);
    assert_eq!((plan.stat_sn, plan.exp_cmd_sn, plan.max_cmd_sn), (100, 2, 4));
    assert_eq!(p.t.stat_sn(), 100);
}

#[test]
fn residuals_and_sense_reach_the_initiator() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 4096);
    let sense = [0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0];
    p.t.finish_command(p.task(itt), Status::CHECK_CONDITION, Some(&sense), Residual::Underflow(4096), 0);
    p.pump();
    assert_eq!(
        p.take_i_events(),
        vec![InitiatorEvent::CommandDone {
            itt,
            status: Status::CHECK_CONDITION,
            sense: Some(Bytes::copy_from_slice(&sense)),
            residual: Residual::Underflow(4096)
        }]
    );
}

#[test]
fn an_overflow_residual_crosses_intact() {
    let mut p = Pair::new(4);
    let itt = p.command(LUN0, 512);
    p.t.finish_command(p.task(itt), Status::GOOD, None, Residual::Overflow(1536), 0);
    p.pump();
    assert!(matches!(p.take_i_events()[..], [InitiatorEvent::CommandDone { residual: Residual::Overflow(1536), .. }]));
}

#[test]
fn a_status_taken_for_phase_collapse_consumes_stat_sn_and_frees_the_slot() {
    let mut p = Pair::new(1);
    let itt = p.command(LUN0, 512);
    let s = p.t.take_status(p.task(itt)).expect("the task is live");
    assert_eq!((s.stat_sn, s.exp_cmd_sn, s.max_cmd_sn), (100, 2, 2), "the window opened before the status is stamped");
    assert_eq!(p.t.stat_sn(), 101);
    assert!(p.t.take_status(p.task(itt)).is_none());
}
