//! A unit over an asynchronous store (its operations complete on threads of their own, as a
//! cluster's do): the data path end to end, task management that waits for a store operation
//! in flight, and a LUN removal that waits for one.

use crate::support::{AsyncGated, Gated, TARGET, Transport, WAIT, pattern, until};
use riser::scsi::lun::Lun;
use riser::target::backend::BlockBackend;
use riser::target::lu::{LogicalUnit, LuIdentity};
use std::sync::Arc;
use std::time::Duration;

on_every_transport!(
    reads_and_writes_of_every_size_at_queue_depth_16,
    task_management_waits_for_the_store_operation_of_an_aborted_write,
    a_removed_lun_answers_once_its_store_write_is_over,
);

fn unit(gated: &Arc<Gated>) -> Arc<LogicalUnit> {
    Arc::new(LogicalUnit::with_async(Arc::new(AsyncGated(gated.clone())), LuIdentity::random()))
}

async fn reads_and_writes_of_every_size_at_queue_depth_16(t: Transport) {
    let gated = Gated::new();
    let addr = t.start_with(unit(&gated), |_| {}, |_| {}).await;
    let s = t.session(addr).await;
    let mut tasks = Vec::new();
    for i in 0..16u32 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            for round in 0..4u32 {
                // 1 to 256 blocks, each task in a range of its own.
                let blocks = 1 + (i * 17 + round * 61) % 256;
                let lba = u64::from(i) * 4096 + u64::from(round) * 512;
                let data = pattern((i * 4 + round) as u8, blocks as usize * 512);
                s.write(Lun::ZERO, lba, data.clone(), 512).await.unwrap();
                assert_eq!(s.read(Lun::ZERO, lba, blocks, 512).await.unwrap(), data, "task {i} round {round}");
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(WAIT, task).await.unwrap().unwrap();
    }
    assert_eq!(gated.done(), 64, "every write went through the store");
}

/// ABORT TASK and LUN RESET are answered only once the aborted write's store operation is over,
/// as for a write on the blocking pool: the operation cannot be called back.
async fn task_management_waits_for_the_store_operation_of_an_aborted_write(t: Transport) {
    let gated = Gated::new();
    let addr = t.start_with(unit(&gated), |_| {}, |_| {}).await;
    crate::task_management::tmf_waits_for_the_aborted_write(t, addr, &gated, 11).await;
}

async fn a_removed_lun_answers_once_its_store_write_is_over(t: Transport) {
    let gated = Gated::new();
    let (addr, target) =
        t.serve(t.config().node(riser::target::server::Node::new(TARGET).lun(unit(&Gated::new())).lun(unit(&gated)))).await;
    let s = t.session(addr).await;
    let lun1 = Lun::from_number(1).unwrap();
    gated.hold(true);
    let w = tokio::spawn({
        let s = s.clone();
        async move { s.write(lun1, 8, pattern(9, 4096), 512).await }
    });
    until("the write reached the store", || gated.waiting() == 1).await;
    let removal = tokio::spawn({
        let target = target.clone();
        async move { target.remove_lun(TARGET, 1).await.map(drop) }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!removal.is_finished(), "the removal waits for the store's write");
    gated.hold(false);
    tokio::time::timeout(WAIT, removal).await.unwrap().unwrap().unwrap();
    w.await.unwrap().unwrap();
    let mut back = vec![0; 4096];
    gated.read(8 * 512, &mut back).unwrap();
    assert_eq!(back, pattern(9, 4096), "the write that ran landed whole");
}
