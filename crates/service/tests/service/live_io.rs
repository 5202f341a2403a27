//! Changes through the control socket while initiators do I/O: sessions that see none of the
//! changes see no error at all, and a session whose LUN is removed under its writes sees each
//! command end cleanly.

use crate::support::{ME, OTHER, Running, TARGET, WAIT, connect, lun, once, pattern, read10, session, write10};
use bytes::Bytes;
use riser_initiator::{Error, Lun, Session};
use riser_scsi::sense::{AscAscq, Sense, SenseKey, Status};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const TB: &str = "iqn.2026-11.io.riser:svc-b";
const TC: &str = "iqn.2026-11.io.riser:svc-c";
const FIFTH: &str = "iqn.2026-11.io.riser:fifth";
const LATE: &str = "iqn.2026-11.io.riser:late";

/// Target A: ME and OTHER see one LUN each through their maps, FIFTH sees LUN 3 (the one that
/// goes); target B: one LUN, open.
const CONFIG: &str = r#"
[limits]
logout_timeout = 1
drain_timeout = 2

[[store]]
name = "me"
backing = "ram:8MiB"

[[store]]
name = "other"
backing = "ram:8MiB"

[[store]]
name = "resized"
backing = "ram:1MiB"

[[store]]
name = "doomed"
backing = "ram:4MiB"

[[store]]
name = "b"
backing = "ram:8MiB"

[[target]]
name = "iqn.2026-11.io.riser:svc"

[[target.lun]]
lun = 0
store = "me"

[[target.lun]]
lun = 1
store = "other"

[[target.lun]]
lun = 2
store = "resized"

[[target.lun]]
lun = 3
store = "doomed"

[[target.acl]]
initiator = "iqn.2026-11.io.riser:me"
luns = [0]

[[target.acl]]
initiator = "iqn.2026-11.io.riser:other"
luns = { "0" = 1 }

[[target.acl]]
initiator = "iqn.2026-11.io.riser:fifth"
luns = { "0" = 3 }

[[target]]
name = "iqn.2026-11.io.riser:svc-b"
open = true

[[target.lun]]
lun = 0
store = "b"
"#;

/// Write a pattern to a region of `l` and read it back, over and over, until `stop`; every
/// failure (a unit attention included) counts in `errors`. The number of rounds done.
async fn verified_io(s: Session, l: Lun, seed: u8, stop: Arc<AtomicBool>, errors: Arc<AtomicU64>) -> u64 {
    let mut rounds = 0u64;
    let base = u64::from(seed / 40) * 2048;
    while !stop.load(Ordering::Relaxed) {
        let data = pattern(seed.wrapping_add(rounds as u8), 16 << 10);
        let lba = base + (rounds % 64) * 32;
        let ok = match once(&s, l, &write10(lba as u32, 32), Some(data.clone()), 0).await {
            Ok(_) => once(&s, l, &read10(lba as u32, 32), None, 16 << 10).await.is_ok_and(|back| back == data),
            Err(e) => {
                eprintln!("session {seed}: {e}");
                false
            }
        };
        if !ok {
            errors.fetch_add(1, Ordering::Relaxed);
        }
        rounds += 1;
    }
    rounds
}

/// How a command ended, for the session whose LUN goes.
#[derive(Debug, PartialEq, Eq)]
enum End {
    Good(Bytes),
    LunGone,
}

fn ended(r: Result<Bytes, Error>) -> End {
    match r {
        Ok(d) => End::Good(d),
        Err(Error::Scsi { status: Status::CHECK_CONDITION, sense: Some(Sense { key: SenseKey::ILLEGAL_REQUEST, asc, .. }) })
            if asc == AscAscq::LOGICAL_UNIT_NOT_SUPPORTED =>
        {
            End::LunGone
        }
        other => panic!("a command on the LUN being removed ends GOOD or LOGICAL UNIT NOT SUPPORTED, not {other:?}"),
    }
}

/// Write distinct blocks, reading each back, until the LUN is gone (then a few more): the writes
/// acknowledged, by LBA, with their data. Once a command has found the LUN gone, none succeeds.
async fn writes_until_gone(s: Session, gone: Arc<AtomicBool>) -> BTreeMap<u32, Bytes> {
    let mut acked = BTreeMap::new();
    let mut refused = 0;
    for round in 0u32.. {
        let lba = (round % 256) * 16;
        let data = pattern(round as u8 ^ 0x5a, 8192);
        let w = tokio::time::timeout(WAIT, once(&s, Lun::ZERO, &write10(lba, 16), Some(data.clone()), 0)).await.expect("no hang");
        let r = match ended(w) {
            End::Good(_) => {
                assert_eq!(refused, 0, "round {round}: a write succeeded after the LUN was reported gone");
                acked.insert(lba, data.clone());
                // Read back at once: what was acknowledged is there (or the LUN is gone).
                let r = tokio::time::timeout(WAIT, once(&s, Lun::ZERO, &read10(lba, 16), None, 8192)).await.expect("no hang");
                ended(r)
            }
            End::LunGone => End::LunGone,
        };
        match r {
            End::Good(back) => {
                assert_eq!(refused, 0, "round {round}: a read succeeded after the LUN was reported gone");
                assert_eq!(back, data, "round {round}: acknowledged data reads back");
            }
            End::LunGone => {
                gone.store(true, Ordering::Relaxed);
                refused += 1;
                if refused == 5 {
                    break;
                }
            }
        }
    }
    acked
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_changes_through_the_socket_leave_other_sessions_untouched() {
    let r = Running::start("live", CONFIG).await;
    let mut rpc = r.client().await;
    // Four sessions doing verified I/O on LUNs none of the changes touch.
    let stop = Arc::new(AtomicBool::new(false));
    let errors = Arc::new(AtomicU64::new(0));
    let mut io = Vec::new();
    for (i, (me, t)) in [(ME, TARGET), (OTHER, TARGET), (ME, TB), (OTHER, TB)].into_iter().enumerate() {
        let s = session(r.addr, me, t).await;
        assert_eq!(s.report_luns().await.unwrap(), vec![lun(0)]);
        io.push(tokio::spawn(verified_io(s, Lun::ZERO, i as u8 * 40, stop.clone(), errors.clone())));
    }
    // The fifth writes to the LUN that goes.
    let fifth = session(r.addr, FIFTH, TARGET).await;
    let gone = Arc::new(AtomicBool::new(false));
    let writer = tokio::spawn(writes_until_gone(fifth, gone.clone()));
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The changes, each while the I/O runs.
    rpc.ok("store_add", json!({"name": "new", "backing": "ram:2MiB"})).await;
    rpc.ok("lun_add", json!({"target": TARGET, "lun": 7, "store": "new"})).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    rpc.ok("store_resize", json!({"name": "resized", "size": "3MiB"})).await;
    rpc.ok("acl_add", json!({"target": TARGET, "initiator": LATE, "luns": {"0": 2}})).await;
    let late = session(r.addr, LATE, TARGET).await;
    late.write(Lun::ZERO, 0, pattern(1, 4096), 512).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    rpc.ok("lun_remove", json!({"target": TARGET, "lun": 3})).await;
    rpc.ok("acl_remove", json!({"target": TARGET, "initiator": LATE})).await;
    rpc.ok("target_add", json!({"name": TC, "open": true})).await;
    rpc.ok("lun_add", json!({"target": TC, "lun": 0, "store": "new"})).await;
    let c = session(r.addr, ME, TC).await;
    c.test_unit_ready(Lun::ZERO).await.unwrap();
    rpc.ok("lun_remove", json!({"target": TARGET, "lun": 7})).await;
    rpc.ok("store_resize", json!({"name": "new", "size": "4MiB"})).await;
    rpc.ok("target_remove", json!({"name": TC})).await;
    rpc.ok("lun_remove", json!({"target": TARGET, "lun": 2})).await;
    // Refused changes change nothing.
    rpc.fails("lun_add", json!({"target": TARGET, "lun": 0, "store": "new"}), riser_service::control::code::EXISTS).await;
    rpc.fails("store_remove", json!({"name": "me"}), riser_service::control::code::IN_USE).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let acked = tokio::time::timeout(WAIT, writer).await.expect("the fifth session's commands all end").unwrap();
    assert!(gone.load(Ordering::Relaxed), "the fifth session saw its LUN go");
    stop.store(true, Ordering::Relaxed);
    for h in io {
        assert!(tokio::time::timeout(WAIT, h).await.expect("no hang").unwrap() > 0, "every session did I/O");
    }
    assert_eq!(errors.load(Ordering::Relaxed), 0, "sessions that see none of the changes see no error, not even a unit attention");

    // Every write acknowledged before the removal is in the store: exported again, it reads back.
    rpc.ok("target_add", json!({"name": TC, "open": true})).await;
    rpc.ok("lun_add", json!({"target": TC, "lun": 0, "store": "doomed"})).await;
    let check = session(r.addr, ME, TC).await;
    for (lba, data) in &acked {
        assert_eq!(check.read(Lun::ZERO, u64::from(*lba), 16, 512).await.unwrap(), *data, "LBA {lba}");
    }
    assert!(!acked.is_empty());
    // The initiators whose entries went are turned away; the others log in as before.
    assert!(connect(r.addr, LATE, TARGET).await.is_err());
    assert!(connect(r.addr, OTHER, TB).await.is_ok());
}
