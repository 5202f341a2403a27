//! Data transfer: write splits, R2T plans, residuals and sense, phase collapse.

use crate::harness::*;
use bytes::Bytes;
use riser_iscsi::keys::NegotiatedParams;
use riser_iscsi::session::SequenceError;
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

/// A write across both machines as the datamovers move it: the initiator's command with
/// immediate data and its unsolicited Data-Out (cut by its limits), the target's split, its R2T
/// plan and the R2Ts' Data-Out (cut by the initiator's limits), all taken by the target's
/// write tracking (`WriteIn`), every byte once; then the same write whose initiator ends an
/// R2T's sequence early fails its task, and only it.
#[test]
fn a_write_crosses_in_sequences_both_sides_agree_on() {
    use riser_iscsi::keys::Role;
    use riser_iscsi::session::{DataOutTo, WriteIn, WriteProgress};
    use riser_iscsi::wire::DataOut;
    let params = NegotiatedParams {
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 65_536,
        max_burst_length: 40_960,
        initiator_recv_data_segment_length: 8192,
        target_recv_data_segment_length: 16_384,
        ..Default::default()
    };
    let (ini, tgt) = (params.transfer_limits(Role::Initiator), params.transfer_limits(Role::Target));
    let len = 200_000u32;
    for early_f in [false, true] {
        let mut p = Pair::with(TargetSessionConfig::new(4).luns([LUN0]), &params, 1, 1);
        let sent = ini.outgoing_write(len, true);
        let c = p.i.start_command(LUN0, &[0x2a], 0, len).unwrap();
        let c = ScsiCommand { final_: sent.command_is_final(), ..c };
        p.t.handle_pdu(p.now, &Header::ScsiCommand(c), Bytes::new(), Bytes::new(), sent.immediate);
        let Some(TargetEvent::Command { split, .. }) = p.t.poll_event() else { panic!("a command") };
        assert_eq!((split.immediate, split.unsolicited_end), (sent.immediate, sent.unsolicited_end));
        let mut write = WriteIn::new(&split, c.final_, params.initial_r2t);
        let mut covered = vec![false; len as usize];
        covered[..sent.immediate as usize].iter_mut().for_each(|c| *c = true);
        let mut take = |write: &mut WriteIn, h: &DataOut, r: core::ops::Range<usize>| {
            let DataOutTo::Place(at) = write.place(h, r.len() as u32) else { panic!("Data-Out at {} not placed", h.buffer_offset) };
            assert_eq!(at.offset as usize, r.start);
            assert!(covered[r.clone()].iter().all(|c| !c), "bytes placed twice");
            covered[r].iter_mut().for_each(|c| *c = true);
            write.accept(at, h.final_)
        };
        let mut last = WriteProgress::More;
        for (h, r) in ini.data_out(DataOut { itt: c.itt, ttt: RESERVED_TAG, ..DataOut::default() }, sent.immediate..sent.unsolicited_end) {
            assert!(r.len() <= 16_384, "beyond the target's receive limit");
            last = take(&mut write, &h, r);
        }
        assert_eq!(last, WriteProgress::UnsolicitedDone);
        let plan = p.t.plan_write(&c, split, len);
        assert_eq!(write.settle(plan.start, plan.end), Ok(true));
        for n in 0..plan.count() {
            let r2t = write.solicit(&plan.nth(n).unwrap());
            assert!(r2t.desired_len <= tgt.max_burst);
            let mut last = WriteProgress::More;
            let pieces: Vec<_> = ini
                .data_out(
                    DataOut { itt: c.itt, ttt: r2t.ttt, ..DataOut::default() },
                    r2t.buffer_offset..r2t.buffer_offset + r2t.desired_len,
                )
                .collect();
            for (k, (mut h, r)) in pieces.into_iter().enumerate() {
                if early_f && n == 1 && k == 0 {
                    h.final_ = true;
                    assert_eq!(take(&mut write, &h, r), WriteProgress::Failed(SequenceError::R2tEndedEarly));
                    break;
                }
                last = take(&mut write, &h, r);
            }
            if early_f && n == 1 {
                break;
            }
            assert_eq!(last, WriteProgress::R2tDone(r2t.ttt));
        }
        if early_f {
            assert_eq!(write.failed(), Some(SequenceError::R2tEndedEarly));
        } else {
            assert_eq!(write.failed(), None);
            assert!(covered.iter().all(|c| *c), "a byte nobody sent");
        }
    }
}
