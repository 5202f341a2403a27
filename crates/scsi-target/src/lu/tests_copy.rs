//! Tests of copy offload: EXTENDED COPY within a unit and across units of a directory, and
//! RECEIVE COPY RESULTS.

use super::tests::{n, run, run_as, sense_of};
use super::*;
use crate::backend::RamBackend;
use riser_scsi::copy::{CopyStatus, Cscd, ExtendedCopy, Segment, SegmentLength, list_id_usage, status};
use riser_scsi::inquiry::Designator;

fn unit() -> Arc<LogicalUnit> {
    unit_of(1 << 20)
}

fn unit_of(size: u64) -> Arc<LogicalUnit> {
    Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(size, 512)), LuIdentity::random()))
}

fn cscd(lu: &LogicalUnit) -> Cscd {
    Cscd::block(Designator::naa_locally_assigned(lu.identity().naa()), 512)
}

fn xcopy_cdb(len: usize) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x83;
    c[10..14].copy_from_slice(&(len as u32).to_be_bytes());
    c
}

fn rcr_cdb(sa: u8, list_id: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x84;
    c[1] = sa;
    c[2] = list_id;
    c[10..14].copy_from_slice(&1024u32.to_be_bytes());
    c
}

/// Run EXTENDED COPY of `list` on `lu`.
fn xcopy(lu: &LogicalUnit, list: &ExtendedCopy) -> Outcome {
    let b = list.to_bytes();
    run(lu, &xcopy_cdb(b.len()), &b)
}

fn list(cscds: Vec<Cscd>, segments: Vec<Segment>) -> ExtendedCopy {
    ExtendedCopy { list_id: 1, cscds, segments, ..ExtendedCopy::default() }
}

fn fill(lu: &LogicalUnit, lba: u64, blocks: usize, byte: u8) {
    lu.backend().write(lba * 512, &vec![byte; blocks * 512]).unwrap();
}

fn read(lu: &LogicalUnit, lba: u64, blocks: usize) -> Vec<u8> {
    let mut b = vec![0u8; blocks * 512];
    lu.backend().read(lba * 512, &mut b).unwrap();
    b
}

#[test]
fn copies_within_a_unit_and_reports_the_result() {
    let a = unit();
    fill(&a, 0, 16, 0xa5);
    let o = xcopy(&a, &list(vec![cscd(&a)], vec![Segment::blocks(0, 0, 16, 0, 100)]));
    assert_eq!(o.status, Status::GOOD, "{o:?}");
    assert!(read(&a, 100, 16).iter().all(|&b| b == 0xa5));
    assert!(read(&a, 116, 1).iter().all(|&b| b == 0), "not one block more");

    // Held under its list identifier for this nexus.
    let o = run(&a, &rcr_cdb(0, 1), &[]);
    let s = CopyStatus::parse(&o.data).unwrap();
    assert_eq!((s.status, s.segments_processed, s.transfer_count_units, s.transfer_count), (status::COMPLETED, 1, 0, 16 * 512));
    let other = Nexus::new("iqn.other,i,0x1", "iqn.target,t,0x1", 1);
    let s = sense_of(&run_as(&a, &rcr_cdb(0, 1), &[], &other));
    assert_eq!(s.asc, AscAscq::INVALID_FIELD_IN_CDB, "another nexus has no copy 1");
    let s = sense_of(&run(&a, &rcr_cdb(0, 2), &[]));
    assert_eq!(s.asc, AscAscq::INVALID_FIELD_IN_CDB);
    a.nexus_lost(&n());
    assert_eq!(sense_of(&run(&a, &rcr_cdb(0, 1), &[])).asc, AscAscq::INVALID_FIELD_IN_CDB, "gone with the nexus");

    // DISCARD holds nothing; 0x0A segments count bytes.
    let mut l = list(
        vec![cscd(&a)],
        vec![Segment { length: SegmentLength::Bytes { count: 1024, src_offset: 0, dst_offset: 0 }, ..Segment::blocks(0, 0, 0, 0, 200) }],
    );
    l.list_id_usage = list_id_usage::DISCARD;
    assert_eq!(xcopy(&a, &l).status, Status::GOOD);
    assert!(read(&a, 200, 2).iter().all(|&b| b == 0xa5));
    assert_eq!(sense_of(&run(&a, &rcr_cdb(0, 1), &[])).asc, AscAscq::INVALID_FIELD_IN_CDB);
}

#[test]
fn overlapping_copies_within_a_unit_move_like_memmove() {
    let a = unit_of(2 << 20);
    for lba in 0..4096u64 {
        a.backend().write(lba * 512, &[lba as u8; 512]).unwrap();
    }
    // 3000 blocks (over two chunks) up by 1000 blocks: overlapping, copied from the end down.
    assert_eq!(xcopy(&a, &list(vec![cscd(&a)], vec![Segment::blocks(0, 0, 3000, 0, 1000)])).status, Status::GOOD);
    for lba in [1000u64, 1999, 2000, 3999] {
        assert_eq!(read(&a, lba, 1)[0], (lba - 1000) as u8, "block {lba}");
    }
    // And down again.
    assert_eq!(xcopy(&a, &list(vec![cscd(&a)], vec![Segment::blocks(0, 0, 3000, 1000, 0)])).status, Status::GOOD);
    for lba in [0u64, 999, 1000, 2999] {
        assert_eq!(read(&a, lba, 1)[0], lba as u8, "block {lba}");
    }
}

#[test]
fn out_of_bounds_and_unreachable_segments_abort_the_copy() {
    let a = unit();
    let blocks = a.blocks();
    let check = |o: Outcome, segment: usize, cscds: usize| {
        let s = sense_of(&o);
        assert_eq!((s.key, s.asc), (SenseKey::COPY_ABORTED, AscAscq::COPY_TARGET_DEVICE_NOT_REACHABLE));
        let at = 16 + 32 * cscds + 28 * segment;
        assert_eq!(s.key_specific, Some([0x20, (at >> 8) as u8, at as u8]), "segment pointer");
        assert_eq!(s.command_specific.unwrap_or(0), segment as u64, "the segment's number");
    };
    check(xcopy(&a, &list(vec![cscd(&a)], vec![Segment::blocks(0, 0, 8, 0, blocks - 7)])), 0, 1);
    check(xcopy(&a, &list(vec![cscd(&a)], vec![Segment::blocks(0, 0, 8, blocks - 7, 0)])), 0, 1);
    check(xcopy(&a, &list(vec![cscd(&a)], vec![Segment::blocks(0, 0, 8, u64::MAX, 0)])), 0, 1);
    // The second segment names a CSCD that is not there: the first one is done, and held.
    fill(&a, 0, 1, 0x11);
    check(xcopy(&a, &list(vec![cscd(&a)], vec![Segment::blocks(0, 0, 1, 0, 10), Segment::blocks(0, 1, 1, 0, 20)])), 1, 1);
    assert_eq!(read(&a, 10, 1)[0], 0x11);
    let s = CopyStatus::parse(&run(&a, &rcr_cdb(0, 1), &[]).data).unwrap();
    assert_eq!((s.status, s.segments_processed), (status::FAILED, 1));
    // A unit outside any directory reaches no other.
    let b = unit();
    check(xcopy(&a, &list(vec![cscd(&a), cscd(&b)], vec![Segment::blocks(0, 1, 1, 0, 0)])), 0, 2);
}

#[test]
fn bad_parameter_lists_are_illegal_requests() {
    let a = unit();
    assert_eq!(run(&a, &xcopy_cdb(0), &[]).status, Status::GOOD, "an empty list is no copy");
    let l = list(vec![cscd(&a); 9], vec![Segment::blocks(0, 0, 1, 0, 1)]);
    assert_eq!(sense_of(&xcopy(&a, &l)).asc, AscAscq::TOO_MANY_TARGET_DESCRIPTORS);
    let l = list(vec![cscd(&a)], vec![Segment::blocks(0, 0, 1, 0, 1); 65]);
    assert_eq!(sense_of(&xcopy(&a, &l)).asc, AscAscq::TOO_MANY_SEGMENT_DESCRIPTORS);
    let b = list(vec![cscd(&a)], vec![Segment::blocks(0, 0, 1, 0, 1)]).to_bytes();
    let s = sense_of(&run(&a, &xcopy_cdb(b.len() - 1), &b[..b.len() - 1]));
    assert_eq!(s.asc, AscAscq::PARAMETER_LIST_LENGTH_ERROR);
    // A block length other than the unit's, a byte offset, LID4.
    let mut c = cscd(&a);
    c.block_len = 4096;
    assert_eq!(sense_of(&xcopy(&a, &list(vec![c], vec![Segment::blocks(0, 0, 1, 0, 1)]))).asc, AscAscq::INVALID_FIELD_IN_PARAMETER_LIST);
    let seg = Segment { length: SegmentLength::Bytes { count: 512, src_offset: 1, dst_offset: 0 }, ..Segment::blocks(0, 0, 0, 0, 1) };
    assert_eq!(sense_of(&xcopy(&a, &list(vec![cscd(&a)], vec![seg]))).asc, AscAscq::INVALID_FIELD_IN_PARAMETER_LIST);
    let mut cdb = xcopy_cdb(b.len());
    cdb[1] = 1;
    assert_eq!(sense_of(&run(&a, &cdb, &b)).asc, AscAscq::INVALID_FIELD_IN_CDB);
    // Nothing of these is held.
    assert_eq!(sense_of(&run(&a, &rcr_cdb(0, 1), &[])).asc, AscAscq::INVALID_FIELD_IN_CDB);
}

#[test]
fn copies_across_units_of_a_directory() {
    let (a, b, hidden) = (unit(), unit(), unit());
    let dir = UnitDirectory::new();
    // The tests' nexus comes through target "iqn.target".
    dir.replace([("iqn.target", vec![&a, &b], vec![("iqn.mapped", vec![&a])]), ("iqn.elsewhere", vec![&hidden], vec![])]);
    fill(&a, 0, 8, 0x5a);
    let o = xcopy(&a, &list(vec![cscd(&a), cscd(&b)], vec![Segment::blocks(0, 1, 8, 0, 40)]));
    assert_eq!(o.status, Status::GOOD, "{o:?}");
    assert!(read(&b, 40, 8).iter().all(|&x| x == 0x5a));
    assert_eq!(b.copy.peer_uses.load(Ordering::SeqCst), 0, "the peer is let go");
    // Issued at b, from b to a (b is the copy manager, a the peer).
    fill(&b, 0, 1, 0x77);
    assert_eq!(xcopy(&b, &list(vec![cscd(&b), cscd(&a)], vec![Segment::blocks(0, 1, 1, 0, 500)])).status, Status::GOOD);
    assert_eq!(read(&a, 500, 1)[0], 0x77);
    // Bounds are the peer's.
    let s = sense_of(&xcopy(&a, &list(vec![cscd(&a), cscd(&b)], vec![Segment::blocks(0, 1, 8, 0, b.blocks() - 1)])));
    assert_eq!((s.key, s.asc), (SenseKey::COPY_ABORTED, AscAscq::COPY_TARGET_DEVICE_NOT_REACHABLE));
    // A unit of another target, and a unit outside the initiator's LUN map, are not reached.
    let s = sense_of(&xcopy(&a, &list(vec![cscd(&a), cscd(&hidden)], vec![Segment::blocks(0, 1, 1, 0, 0)])));
    assert_eq!(s.key, SenseKey::COPY_ABORTED);
    let mapped = Nexus::new("iqn.mapped,i,0x1", "iqn.target,t,0x1", 1);
    let l = list(vec![cscd(&a), cscd(&b)], vec![Segment::blocks(0, 1, 1, 0, 0)]).to_bytes();
    assert_eq!(sense_of(&run_as(&a, &xcopy_cdb(l.len()), &l, &mapped)).key, SenseKey::COPY_ABORTED);
    // Out of the directory, out of reach.
    dir.replace([("iqn.target", vec![&a], vec![])]);
    assert_eq!(sense_of(&xcopy(&a, &list(vec![cscd(&a), cscd(&b)], vec![Segment::blocks(0, 1, 1, 0, 0)]))).key, SenseKey::COPY_ABORTED);
}

#[test]
fn a_reserved_destination_refuses_the_copy() {
    let (a, b) = (unit(), unit());
    let dir = UnitDirectory::new();
    dir.replace([("iqn.target", vec![&a, &b], vec![])]);
    fill(&a, 0, 1, 0x42);
    let other = Nexus::new("iqn.other,i,0x1", "iqn.target,t,0x1", 1);
    assert_eq!(run_as(&b, &[0x16, 0, 0, 0, 0, 0], &[], &other).status, Status::GOOD, "RESERVE(6) by another nexus");
    let o = xcopy(&a, &list(vec![cscd(&a), cscd(&b)], vec![Segment::blocks(0, 1, 1, 0, 0)]));
    assert_eq!(o.status, Status::RESERVATION_CONFLICT);
    assert_eq!(read(&b, 0, 1)[0], 0, "nothing written");
    // The reservation holder copies.
    let l = list(vec![cscd(&a), cscd(&b)], vec![Segment::blocks(0, 1, 1, 0, 0)]).to_bytes();
    assert_eq!(run_as(&a, &xcopy_cdb(l.len()), &l, &other).status, Status::GOOD);
    assert_eq!(read(&b, 0, 1)[0], 0x42);
}

#[test]
fn the_unit_advertises_copy_offload() {
    let a = unit();
    let std = run(&a, &[0x12, 0, 0, 0, 96, 0], &[]);
    assert_eq!(std.data[5] & 0x08, 0x08, "3PC");
    let pages = run(&a, &[0x12, 1, 0, 0, 255, 0], &[]);
    assert!(pages.data[4..].contains(&0x8f));
    let page = run(&a, &[0x12, 1, 0x8f, 4, 0, 0], &[]);
    assert_eq!(page.status, Status::GOOD);
    assert_eq!((page.data[1], &page.data[4..6]), (0x8f, &[0u8, 1][..]), "Supported Commands first");
    let op = run(&a, &rcr_cdb(3, 0), &[]);
    assert_eq!(op.status, Status::GOOD);
    assert_eq!(u16::from_be_bytes([op.data[8], op.data[9]]), MAX_CSCDS);
    assert_eq!(u16::from_be_bytes([op.data[10], op.data[11]]), MAX_SEGMENTS);
    assert_eq!(u32::from_be_bytes([op.data[16], op.data[17], op.data[18], op.data[19]]), MAX_SEGMENT_BYTES);
    assert_eq!(&op.data[43..], &[3, 0x02, 0x0a, 0xe4]);
    assert_eq!(sense_of(&run(&a, &rcr_cdb(1, 0), &[])).asc, AscAscq::INVALID_FIELD_IN_CDB, "RECEIVE DATA is not implemented");
    // RSOC lists both commands under their service actions.
    let one = run(&a, &[0xa3, 0x0c, 0x02, 0x83, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(one.data[1] & 7, 3, "EXTENDED COPY LID1 supported");
    let one = run(&a, &[0xa3, 0x0c, 0x02, 0x84, 0, 3, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(one.data[1] & 7, 3, "RECEIVE COPY RESULTS OPERATING PARAMETERS supported");
    assert!(a.may_block(&a.plan(&xcopy_cdb(0), &n()).unwrap()), "copies run off the I/O threads");
}

#[test]
fn a_reset_fences_the_copy_writes_accepted_before_it_only() {
    let fence = Arc::new(copy::ResetFence::default());
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
    let settles = |mark: u64| {
        let f = fence.clone();
        rt.block_on(async move { tokio::time::timeout(std::time::Duration::from_millis(50), f.written(mark)).await.is_ok() })
    };
    let since = resets_so_far();
    let before = fence.enter(since).unwrap();
    let mark = fence.reset();
    assert!(fence.reset_since(since));
    assert!(fence.enter(since).is_none(), "a copy accepted before the reset writes no more");
    assert!(!settles(mark), "the reset waits for the write under way");
    let after = fence.enter(resets_so_far()).unwrap();
    drop(before);
    assert!(settles(mark), "a write of a copy accepted after the reset is not waited for");
    // A second reset waits for that one; the first still does not.
    let second = fence.reset();
    assert!(!settles(second));
    assert!(settles(mark));
    drop(after);
    assert!(settles(second));
}

#[test]
fn a_copy_accepted_before_a_reset_of_a_unit_it_uses_stops() {
    let (a, b) = (unit(), unit());
    let dir = UnitDirectory::new();
    dir.replace([("iqn.target", vec![&a, &b], vec![])]);
    fill(&a, 0, 8, 0x5a);
    let l = list(vec![cscd(&a), cscd(&b)], vec![Segment::blocks(0, 1, 8, 0, 0)]).to_bytes();
    let plan = a.plan(&xcopy_cdb(l.len()), &n()).unwrap();
    // Accepted, then its destination reset before it ran (waiting for a thread, say).
    let since = resets_so_far();
    b.reset();
    let s = sense_of(&a.execute_since(&plan, &l, &n(), Vec::new(), Accepted { since, given_up: &|| false }));
    assert_eq!((s.key, s.asc), (SenseKey::COPY_ABORTED, AscAscq::THIRD_PARTY_DEVICE_FAILURE));
    assert_eq!(read(&b, 0, 8), vec![0; 8 * 512], "nothing written after the reset");
    // The same for a reset of the copy manager, or of the source.
    for reset in [&a, &b] {
        let since = resets_so_far();
        reset.reset();
        let s = sense_of(&a.execute_since(&plan, &l, &n(), Vec::new(), Accepted { since, given_up: &|| false }));
        assert_eq!(s.key, SenseKey::COPY_ABORTED);
    }
    // A copy whose task was given up writes nothing either.
    let s = sense_of(&a.execute_since(&plan, &l, &n(), Vec::new(), Accepted { since: resets_so_far(), given_up: &|| true }));
    assert_eq!(s.key, SenseKey::COPY_ABORTED);
    assert_eq!(read(&b, 0, 8), vec![0; 8 * 512]);
    // A copy accepted after the resets copies.
    assert_eq!(a.execute(&plan, &l, &n()).status, Status::GOOD);
    assert!(read(&b, 0, 8).iter().all(|&x| x == 0x5a));
}
