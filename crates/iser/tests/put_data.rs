//! Put_Data over the software RNIC: read data goes out by RDMA Write from where it lies (no
//! copy, nothing waited for), arrives whole before its response, and its buffer comes back to
//! the target's pool once the write has completed.

use bytes::Bytes;
use riser_datamover::{ControlPdu, DataInDesc, Datamover, DmEvent};
use riser_iscsi::wire::{Header, ScsiCommand, ScsiResponse};
use riser_iwarp::SoftRnic;
use std::time::Duration;

mod common;
use common::pair;

fn pattern(seed: u32, n: usize) -> Vec<u8> {
    (0..n).map(|i| (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed).to_le_bytes()[1]).collect()
}

/// The initiator sends a read command of `len` bytes as task `itt`; the target receives it.
async fn read_command<D: Datamover>(initiator: &D, target: &D, itt: u32, len: usize) {
    let cmd = ScsiCommand { final_: true, read: true, itt, expected_data_len: len as u32, cmd_sn: itt, ..ScsiCommand::default() };
    initiator.send_command(cmd, Bytes::new(), len as u32, None).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.unwrap();
    assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), .. }) if c.itt == itt), "{ev:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_data_arrives_before_its_response_and_its_buffer_comes_back() {
    let rnic = SoftRnic::default();
    let (target, initiator) = pair(&rnic).await;
    let (mut recycled, mut larger, mut seen) = (0, 0, std::collections::HashSet::new());
    for (round, len) in [4096usize, 65_536, 300_000, 512, 65_536, 4096].into_iter().cycle().take(60).enumerate() {
        let itt = 10 + round as u32;
        let cmd =
            ScsiCommand { final_: true, read: true, itt, expected_data_len: len as u32, cmd_sn: round as u32, ..ScsiCommand::default() };
        initiator.send_command(cmd, Bytes::new(), len as u32, None).await.unwrap();
        let ev = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.unwrap();
        assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiCommand(c), .. }) if c.itt == itt), "{ev:?}");
        // The target's buffer: room from its pool, so a recycled one is memory an earlier
        // round's data was put from.
        let mut buf = target.take_buffer(len);
        assert!(buf.capacity() >= len);
        if !seen.insert(buf.as_ptr() as usize) {
            recycled += 1;
        }
        if buf.capacity() > len {
            larger += 1;
        }
        let data = pattern(itt, len);
        buf.clear();
        buf.extend_from_slice(&data);
        let desc = DataInDesc { itt, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
        let done = target.put_data(desc, Bytes::from(buf)).await.unwrap();
        assert!(!done.status_sent);
        let r = ScsiResponse { itt, stat_sn: round as u32, ..ScsiResponse::default() };
        target.send_control(ControlPdu::new(Header::ScsiResponse(r), Bytes::new())).await.unwrap();
        let ev = tokio::time::timeout(Duration::from_secs(5), initiator.next_event()).await.unwrap();
        assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiResponse(r), .. }) if r.itt == itt), "{ev:?}");
        let got = initiator.take_read_data(itt).expect("the read's data");
        assert!(got[..] == data[..], "round {round}: {len} bytes placed before the response");
        initiator.deallocate_task_resources(itt);
        target.deallocate_task_resources(itt);
    }
    // Responses go mostly unsignaled: a write's buffer comes back when a later signaled request
    // completes, so most rounds after the first few reuse one.
    // (By address; and a buffer with more room than asked for can only be a pooled one of an
    // earlier, larger read: a new one has the room asked for. The pool hands out the smallest
    // buffer that fits, so only a 512-byte read finding no small one back yet gets one.)
    assert!(recycled >= 30, "only {recycled} of 59 buffers came back from the pool");
    assert!(larger >= 1, "no buffer was a larger one from the pool");
}

/// Sends held for a turn leave once the turn ends — or as soon as what was gathered exceeds
/// what the software RNIC writes on the poster's thread at once (320 KiB), so a turn of large
/// reads never becomes one list for the RNIC's transmitter task: here the first reads' data
/// and responses arrive before the turn ends, the rest at its end, all in order and whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_of_large_reads_leaves_in_parts_of_at_most_320_kib() {
    let rnic = SoftRnic::default();
    let (target, initiator) = pair(&rnic).await;
    let len = 100_000usize;
    let itts: Vec<u32> = (20..26).collect();
    for &itt in &itts {
        read_command(&initiator, &target, itt, len).await;
    }
    target.hold_sends();
    for &itt in &itts {
        let desc = DataInDesc { itt, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
        target.put_data(desc, Bytes::from(pattern(itt, len))).await.unwrap();
        let r = ScsiResponse { itt, stat_sn: itt, ..ScsiResponse::default() };
        target.send_control(ControlPdu::new(Header::ScsiResponse(r), Bytes::new())).await.unwrap();
    }
    let response = || async {
        match tokio::time::timeout(Duration::from_secs(2), initiator.next_event()).await {
            Ok(DmEvent::Control(ControlPdu { header: Header::ScsiResponse(r), .. })) => Some(r.itt),
            Ok(ev) => panic!("{ev:?}"),
            Err(_) => None,
        }
    };
    // Three reads and their responses (300 KB) were gathered when the fourth would have passed
    // 320 KiB: they left then, the turn still open.
    assert_eq!(response().await, Some(itts[0]), "nothing left before the turn's end");
    assert_eq!(response().await, Some(itts[1]));
    assert_eq!(response().await, Some(itts[2]));
    target.release_sends().await.unwrap();
    for &itt in &itts[3..] {
        assert_eq!(response().await, Some(itt), "in order, at the turn's end");
    }
    for &itt in &itts {
        assert!(initiator.take_read_data(itt).expect("the read's data")[..] == pattern(itt, len)[..], "itt {itt}");
    }
}

/// A read buffer comes from the initiator's pool as it is (no memset per read), yet a target
/// that writes only part of a read never shows the caller an earlier read's bytes: what its
/// writes did not reach reads as zeros.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partly_written_read_shows_zeros_never_an_earlier_reads_data() {
    let rnic = SoftRnic::default();
    let (target, initiator) = pair(&rnic).await;
    let len = 100_000usize;
    let (mut reused, mut last) = (false, None);
    for (itt, written) in [(40u32, len), (41, len / 2), (42, len), (43, 0)] {
        read_command(&initiator, &target, itt, len).await;
        if written > 0 {
            let desc = DataInDesc { itt, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
            target.put_data(desc, Bytes::from(pattern(itt, written))).await.unwrap();
        }
        let r = ScsiResponse { itt, stat_sn: itt, ..ScsiResponse::default() };
        target.send_control(ControlPdu::new(Header::ScsiResponse(r), Bytes::new())).await.unwrap();
        let ev = tokio::time::timeout(Duration::from_secs(5), initiator.next_event()).await.unwrap();
        assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiResponse(r), .. }) if r.itt == itt), "{ev:?}");
        let got = initiator.take_read_data(itt).expect("the read's data");
        assert_eq!(got.len(), len);
        assert!(got[..written] == pattern(itt, written)[..], "itt {itt}: the target's data");
        assert!(got[written..].iter().all(|&b| b == 0), "itt {itt}: zeros where the target wrote nothing");
        initiator.deallocate_task_resources(itt);
        target.deallocate_task_resources(itt);
        // Back to the initiator's pool, for the next read (of the same length) to find.
        reused |= last.replace(got.as_ptr() as usize) == Some(got.as_ptr() as usize);
        initiator.release_task_buffer(riser_datamover::TaskBuffer { data: got });
    }
    assert!(reused, "the pool never handed a read buffer back: the test shows nothing");
}

/// A large read's buffer comes back to the target's pool once its RDMA Write has completed,
/// without waiting for later requests: a megabyte posted unsignaled is signaled (with sixteen
/// 1 MiB reads held for a later completion the pool, 8 MiB, ran dry and every read took fresh
/// memory).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_reads_buffer_comes_back_without_waiting_for_later_requests() {
    let rnic = SoftRnic::default();
    let (target, initiator) = pair(&rnic).await;
    let (itt, len) = (50u32, 1usize << 20);
    read_command(&initiator, &target, itt, len).await;
    let mut buf = target.take_buffer(len);
    let at = buf.as_ptr() as usize;
    buf.clear();
    buf.extend_from_slice(&pattern(itt, len));
    let desc = DataInDesc { itt, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
    target.put_data(desc, Bytes::from(buf)).await.unwrap();
    let mut back = false;
    for _ in 0..200 {
        // Only what came back is in the pool; anything else is fresh (and dropped).
        let taken = target.take_buffer(len);
        if taken.as_ptr() as usize == at {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(back, "the read's buffer did not come back within 2 s of its write");
    let r = ScsiResponse { itt, stat_sn: itt, ..ScsiResponse::default() };
    target.send_control(ControlPdu::new(Header::ScsiResponse(r), Bytes::new())).await.unwrap();
    let ev = tokio::time::timeout(Duration::from_secs(5), initiator.next_event()).await.unwrap();
    assert!(matches!(ev, DmEvent::Control(ControlPdu { header: Header::ScsiResponse(r), .. }) if r.itt == itt), "{ev:?}");
    assert!(initiator.take_read_data(itt).expect("the read's data")[..] == pattern(itt, len)[..]);
}

/// A read's status given with its data (`collapses_status`): no Data-In exists on iSER, so it
/// leaves as the SCSI Response Send right behind the RDMA Write — the response the initiator
/// gets carries the status, residual and sequence numbers given, ExpDataSN 0 (no Data-In
/// PDUs), and arrives after the data; the command's keys end with it, so nothing more can be
/// put for the task.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_status_given_with_the_data_leaves_as_the_response_behind_it() {
    let rnic = SoftRnic::default();
    let (target, initiator) = pair(&rnic).await;
    assert!(target.collapses_status());
    for (itt, len, sent) in [(60u32, 4096usize, 4096usize), (61, 300_000, 300_000), (62, 8192, 6000)] {
        read_command(&initiator, &target, itt, len).await;
        let residual = (len - sent) as u32;
        // A collapsed status may be other than GOOD (RFC 7143 §11.7.4 allows CONDITION MET):
        // the field is carried, not assumed.
        let scsi = if itt == 62 { riser_scsi::sense::Status::CONDITION_MET } else { riser_scsi::sense::Status::GOOD };
        let status = riser_datamover::CollapsedStatus {
            status: scsi,
            underflow: residual > 0,
            overflow: false,
            residual,
            stat_sn: 700 + itt,
            exp_cmd_sn: 800 + itt,
            max_cmd_sn: 900 + itt,
        };
        let desc = DataInDesc { itt, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: Some(status) };
        let done = target.put_data(desc, Bytes::from(pattern(itt, sent))).await.unwrap();
        assert!(done.status_sent, "the status left with the data");
        assert_eq!(done.pdus, 0, "no Data-In PDUs");
        let ev = tokio::time::timeout(Duration::from_secs(5), initiator.next_event()).await.unwrap();
        let DmEvent::Control(ControlPdu { header: Header::ScsiResponse(r), data, .. }) = ev else { panic!("{ev:?}") };
        let want = ScsiResponse {
            underflow: residual > 0,
            status: scsi,
            itt,
            stat_sn: 700 + itt,
            exp_cmd_sn: 800 + itt,
            max_cmd_sn: 900 + itt,
            residual,
            ..ScsiResponse::default()
        };
        assert_eq!(r, want);
        assert!(data.is_empty(), "no sense");
        let got = initiator.take_read_data(itt).expect("the read's data");
        assert!(got[..sent] == pattern(itt, sent)[..], "itt {itt}: the data placed before its response");
        // The task's keys ended with its response: a later Put_Data has nowhere to go.
        let again = DataInDesc { itt, lun: Default::default(), offset: 0, data_sn: 0, collapse_status: None };
        assert!(target.put_data(again, Bytes::from(vec![1u8; 512])).await.is_err(), "itt {itt}: put after the response");
        initiator.deallocate_task_resources(itt);
        target.deallocate_task_resources(itt);
    }
}
