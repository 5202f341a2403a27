//! librados' and librbd's threads as batch threads (`ClusterOptions::batch_threads`), read back
//! from /proc. A test binary of its own: it counts the threads the process starts.

mod common;

use std::collections::BTreeMap;

use common::*;
use riser_rbd::{Cluster, ClusterOptions, Image};

/// Linux's `SCHED_OTHER` and `SCHED_BATCH`.
const OTHER: u32 = 0;
const BATCH: u32 = 3;

/// The process's threads: id → (name, scheduling policy).
fn threads() -> BTreeMap<u32, (String, u32)> {
    let mut all = BTreeMap::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let Some(tid) = t.file_name().to_str().and_then(|s| s.parse().ok()) else { continue };
        let (Ok(comm), Ok(sched)) = (std::fs::read_to_string(t.path().join("comm")), std::fs::read_to_string(t.path().join("sched")))
        else {
            continue;
        };
        all.insert(tid, (comm.trim().to_string(), policy_of(&sched)));
    }
    all
}

/// The calling thread's scheduling policy.
fn my_policy() -> u32 {
    policy_of(&std::fs::read_to_string("/proc/thread-self/sched").unwrap())
}

fn policy_of(sched: &str) -> u32 {
    sched
        .lines()
        .find(|l| l.starts_with("policy"))
        .and_then(|l| l.rsplit(':').next()?.trim().parse().ok())
        .expect("a policy line in /proc/*/sched")
}

/// Connects with `opts`, opens and reads an image; the threads that appeared meanwhile.
fn new_threads(opts: &ClusterOptions) -> Vec<(String, u32)> {
    let before = threads();
    let cluster = Cluster::connect(opts).expect("connect");
    let io = cluster.ioctx(POOL).unwrap();
    let (name, image) = fresh_image(&io, "sched", 1 << 20);
    let data = block_on(image.read(0, 4096, Vec::with_capacity(4096))).unwrap();
    assert_eq!(data.len(), 4096);
    let started: Vec<_> = threads().into_iter().filter(|(tid, _)| !before.contains_key(tid)).map(|(_, t)| t).collect();
    drop(image);
    Image::remove(&io, &name).unwrap();
    started
}

#[test]
fn librados_threads_are_batch_threads_only_when_asked_and_the_caller_keeps_its_policy() {
    let Some(conf) = ceph_conf("librados_threads_are_batch_threads") else { return };
    assert_eq!(my_policy(), OTHER);
    let batch = new_threads(&ClusterOptions { batch_threads: true, ..options(&conf) });
    eprintln!("started with batch_threads: {batch:?}");
    // The messengers (which take the OSDs' replies) and the completion pool (which calls back).
    for name in ["msgr-worker", "io_context_pool"] {
        assert!(batch.iter().any(|(n, _)| n.starts_with(name)), "no {name} thread started: {batch:?}");
    }
    assert!(batch.iter().all(|(_, p)| *p == BATCH), "{batch:?}");
    // The calling thread has its own policy back.
    assert_eq!(my_policy(), OTHER);

    let normal = new_threads(&ClusterOptions { batch_threads: false, ..options(&conf) });
    assert!(normal.iter().any(|(n, _)| n.starts_with("msgr-worker")), "{normal:?}");
    assert!(normal.iter().all(|(_, p)| *p == OTHER), "{normal:?}");
}
