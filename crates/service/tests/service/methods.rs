//! Every method of the control plane, through the socket, with its effects checked where an
//! initiator or the operator sees them.

use crate::support::{
    ME, ONE_TARGET, OTHER, READ_CAPACITY_16, Relay, Running, TARGET, TUR, blocks, chap_session, connect, lun, mode, once, pattern,
    sense_of, session, sessions, tsihs_of, until,
};
use riser_initiator::{Error, Lun, SessionConfig};
use riser_scsi::sense::{AscAscq, SenseKey};
use riser_service::control::{METHODS, code};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

const T2: &str = "iqn.2026-11.io.riser:svc2";
const T3: &str = "iqn.2026-11.io.riser:svc3";

/// The store named `name` in `store_list`.
async fn store(rpc: &mut crate::support::Rpc, name: &str) -> Option<Value> {
    rpc.ok("store_list", Value::Null).await.as_array().unwrap().iter().find(|s| s["name"] == name).cloned()
}

/// The target named `name` in `target_list`.
async fn target(rpc: &mut crate::support::Rpc, name: &str) -> Option<Value> {
    rpc.ok("target_list", Value::Null).await.as_array().unwrap().iter().find(|t| t["name"] == name).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn introspection_lists_every_method() {
    let r = Running::start("methods", ONE_TARGET).await;
    let mut rpc = r.client().await;
    let listed = rpc.ok("rpc_get_methods", Value::Null).await;
    assert_eq!(listed, json!(METHODS));
    // Each listed method exists (no -32601), whatever its parameters.
    for m in METHODS {
        if let Err(e) = rpc.call(m, json!({"no_such_parameter": 1})).await {
            assert_ne!(e.code, code::METHOD_NOT_FOUND, "{m}");
        }
    }
    let v = rpc.ok("version", Value::Null).await;
    assert_eq!((v["name"].as_str(), v["version"].as_str()), (Some("riser"), Some(env!("CARGO_PKG_VERSION"))));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stores_are_added_listed_resized_and_removed() {
    let r = Running::start("stores", ONE_TARGET).await;
    let mut rpc = r.client().await;
    let s = session(r.addr, ME, TARGET).await;

    let added = rpc.ok("store_add", json!({"name": "extra", "backing": "ram:1MiB"})).await;
    assert_eq!((added["name"].as_str(), added["size"].as_u64(), added["block_size"].as_u64()), (Some("extra"), Some(1 << 20), Some(512)));
    assert_eq!(added["exported"], json!([]));
    let uuid = added["uuid"].as_str().unwrap().to_string();
    assert_eq!(uuid.len(), 36);
    assert_eq!(store(&mut rpc, "extra").await.unwrap(), added, "store_list shows it as store_add answered");
    let disk0 = store(&mut rpc, "disk0").await.unwrap();
    assert_eq!(disk0["exported"], json!([{"target": TARGET, "lun": 0}]));
    assert_ne!(disk0["uuid"], added["uuid"]);
    // 4 KiB blocks.
    let big = rpc.ok("store_add", json!({"name": "big-blocks", "backing": "ram:1MiB", "block_size": 4096})).await;
    assert_eq!((big["block_size"].as_u64(), big["size"].as_u64()), (Some(4096), Some(1 << 20)));

    // Refusals: the name taken, the identity taken, bad specs.
    rpc.fails("store_add", json!({"name": "extra", "backing": "ram:2MiB"}), code::EXISTS).await;
    let m = rpc.fails("store_add", json!({"name": "twin", "backing": "ram:1MiB", "uuid": uuid}), code::IN_USE).await;
    assert!(m.contains("extra"), "names the store that has the UUID: {m}");
    rpc.fails("store_add", json!({"name": "bad", "backing": "tape:1"}), code::INVALID_PARAMS).await;
    rpc.fails("store_add", json!({"name": "a b", "backing": "ram:1MiB"}), code::INVALID_PARAMS).await;
    rpc.fails("store_add", json!({"name": "odd", "backing": "ram:1MiB", "block_size": 1000}), code::INVALID_PARAMS).await;
    assert!(store(&mut rpc, "twin").await.is_none() && store(&mut rpc, "bad").await.is_none());

    // Resize: it grows, the list says so, and the initiator that sees it is told once.
    assert_eq!(rpc.ok("store_resize", json!({"name": "disk0", "size": "8MiB"})).await, json!({"size": 8 << 20}));
    let disk0 = store(&mut rpc, "disk0").await.unwrap();
    assert_eq!((disk0["size"].as_u64(), disk0["backing"].as_str()), (Some(8 << 20), Some("ram:8MiB")));
    assert_eq!(
        sense_of(once(&s, Lun::ZERO, &READ_CAPACITY_16, None, 32).await),
        (SenseKey::UNIT_ATTENTION, AscAscq::CAPACITY_DATA_CHANGED)
    );
    assert_eq!(blocks(once(&s, Lun::ZERO, &READ_CAPACITY_16, None, 32).await.unwrap()), 16384);
    assert_eq!(rpc.ok("store_resize", json!({"name": "extra", "size": 3 << 20})).await, json!({"size": 3 << 20}));
    // Shrinking would cut data off: refused, nothing changes.
    rpc.fails("store_resize", json!({"name": "disk0", "size": "1MiB"}), code::INVALID_PARAMS).await;
    assert_eq!(store(&mut rpc, "disk0").await.unwrap()["size"], 8 << 20);
    rpc.fails("store_resize", json!({"name": "nope", "size": "1GiB"}), code::NOT_FOUND).await;

    // Remove: refused while exported (naming the LUN), unknown names are not found.
    let m = rpc.fails("store_remove", json!({"name": "disk0"}), code::IN_USE).await;
    assert!(m.contains(TARGET) && m.contains("LUN 0"), "{m}");
    rpc.fails("store_remove", json!({"name": "nope"}), code::NOT_FOUND).await;
    assert_eq!(rpc.ok("store_remove", json!({"name": "extra"})).await, json!(true));
    assert!(store(&mut rpc, "extra").await.is_none());
    rpc.fails("store_remove", json!({"name": "extra"}), code::NOT_FOUND).await;
    // Its identity is free again.
    let back = rpc.ok("store_add", json!({"name": "extra-again", "backing": "ram:1MiB", "uuid": uuid})).await;
    assert_eq!(back["uuid"].as_str(), Some(uuid.as_str()));
    // The exported store still serves.
    s.write(Lun::ZERO, 0, pattern(1, 4096), 512).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn targets_are_closed_by_default_and_their_removal_ends_their_sessions() {
    let r = Running::start("targets", ONE_TARGET).await;
    let mut rpc = r.client().await;
    assert_eq!(rpc.ok("target_add", json!({"name": T2})).await, json!(true));
    let t2 = target(&mut rpc, T2).await.unwrap();
    assert_eq!((t2["open"].as_bool(), t2["acl"].as_array().map(Vec::len)), (Some(false), Some(0)));
    assert_eq!(t2["portal_groups"][0]["portals"][0]["address"], r.addr.to_string(), "reached through the default portal");
    assert!(matches!(connect(r.addr, ME, T2).await, Err(Error::Login(_))), "closed: nobody is admitted");

    rpc.ok("target_add", json!({"name": T3, "alias": "three", "open": true})).await;
    let t3 = target(&mut rpc, T3).await.unwrap();
    assert_eq!((t3["open"].as_bool(), t3["alias"].as_str()), (Some(true), Some("three")));
    let s3 = connect(r.addr, ME, T3).await.expect("open: anyone is admitted");
    s3.ping().await.unwrap();
    let keep = session(r.addr, ME, TARGET).await;

    rpc.fails("target_add", json!({"name": T3}), code::EXISTS).await;
    rpc.fails("target_add", json!({"name": T3.to_uppercase()}), code::EXISTS).await;
    rpc.fails("target_add", json!({"name": "not-an-iscsi-name"}), code::INVALID_PARAMS).await;
    assert!(target(&mut rpc, "not-an-iscsi-name").await.is_none());

    // Removal ends its sessions before it answers; the other target's go on.
    assert_eq!(sessions(&mut rpc).await.iter().filter(|s| s["target"] == T3).count(), 1);
    assert_eq!(rpc.ok("target_remove", json!({"name": T3})).await, json!(true));
    assert!(sessions(&mut rpc).await.iter().all(|s| s["target"] != T3), "its session is gone when target_remove answers");
    assert!(s3.ping().await.is_err());
    assert!(target(&mut rpc, T3).await.is_none());
    assert!(matches!(connect(r.addr, ME, T3).await, Err(Error::Login(_))));
    rpc.fails("target_remove", json!({"name": T3}), code::NOT_FOUND).await;
    keep.test_unit_ready(Lun::ZERO).await.unwrap();
    // Its portal stays listened on while another target is reached through it.
    rpc.ok("target_remove", json!({"name": T2})).await;
    assert!(connect(r.addr, ME, TARGET).await.is_ok());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn luns_come_and_go_and_initiators_are_told_once() {
    let r = Running::start("luns", ONE_TARGET).await;
    let mut rpc = r.client().await;
    let s = session(r.addr, ME, TARGET).await;
    assert_eq!(s.report_luns().await.unwrap(), vec![lun(0)]);

    rpc.ok("store_add", json!({"name": "l1", "backing": "ram:2MiB"})).await;
    assert_eq!(rpc.ok("lun_add", json!({"target": TARGET, "lun": 1, "store": "l1"})).await, json!(true));
    assert_eq!(sense_of(once(&s, lun(0), &TUR, None, 0).await), (SenseKey::UNIT_ATTENTION, AscAscq::REPORTED_LUNS_DATA_CHANGED));
    once(&s, lun(0), &TUR, None, 0).await.expect("told once");
    once(&s, lun(1), &TUR, None, 0).await.expect("told once, on every LUN");
    assert_eq!(s.report_luns().await.unwrap(), vec![lun(0), lun(1)]);
    assert_eq!(s.read_capacity(lun(1)).await.unwrap(), (4096, 512));
    assert_eq!(store(&mut rpc, "l1").await.unwrap()["exported"], json!([{"target": TARGET, "lun": 1}]));
    let t = target(&mut rpc, TARGET).await.unwrap();
    assert_eq!(t["luns"], json!([{"lun": 0, "store": "disk0"}, {"lun": 1, "store": "l1"}]));

    rpc.fails("lun_add", json!({"target": TARGET, "lun": 1, "store": "disk0"}), code::EXISTS).await;
    rpc.fails("lun_add", json!({"target": TARGET, "lun": 2, "store": "nope"}), code::NOT_FOUND).await;
    rpc.fails("lun_add", json!({"target": T2, "lun": 2, "store": "l1"}), code::NOT_FOUND).await;
    rpc.fails("lun_add", json!({"target": TARGET, "lun": 20000, "store": "l1"}), code::INVALID_PARAMS).await;
    once(&s, lun(0), &TUR, None, 0).await.expect("refused changes tell nobody anything");

    s.write(lun(1), 0, pattern(5, 4096), 512).await.unwrap();
    assert_eq!(rpc.ok("lun_remove", json!({"target": TARGET, "lun": 1})).await, json!(true));
    assert_eq!(sense_of(once(&s, lun(1), &TUR, None, 0).await), (SenseKey::ILLEGAL_REQUEST, AscAscq::LOGICAL_UNIT_NOT_SUPPORTED));
    assert_eq!(sense_of(once(&s, lun(0), &TUR, None, 0).await), (SenseKey::UNIT_ATTENTION, AscAscq::REPORTED_LUNS_DATA_CHANGED));
    once(&s, lun(0), &TUR, None, 0).await.expect("told once");
    assert_eq!(s.report_luns().await.unwrap(), vec![lun(0)]);
    assert_eq!(store(&mut rpc, "l1").await.unwrap()["exported"], json!([]));
    rpc.fails("lun_remove", json!({"target": TARGET, "lun": 1}), code::NOT_FOUND).await;
    rpc.fails("lun_remove", json!({"target": T2, "lun": 0}), code::NOT_FOUND).await;

    // The store kept its data: exported again, under another number.
    rpc.ok("lun_add", json!({"target": TARGET, "lun": 9, "store": "l1"})).await;
    assert_eq!(s.read(lun(9), 0, 8, 512).await.unwrap(), pattern(5, 4096));
    // Unexported, it can go.
    rpc.ok("lun_remove", json!({"target": TARGET, "lun": 9})).await;
    rpc.ok("store_remove", json!({"name": "l1"})).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acl_entries_admit_with_their_own_chap_and_luns_and_their_removal_ends_only_their_sessions() {
    let r = Running::start("acls", ONE_TARGET).await;
    let mut rpc = r.client().await;
    rpc.ok("target_add", json!({"name": T2})).await;
    rpc.ok("store_add", json!({"name": "a", "backing": "ram:1MiB"})).await;
    rpc.ok("store_add", json!({"name": "b", "backing": "ram:2MiB"})).await;
    rpc.ok("lun_add", json!({"target": T2, "lun": 0, "store": "a"})).await;
    rpc.ok("lun_add", json!({"target": T2, "lun": 1, "store": "b"})).await;

    // ME: its own CHAP credentials, as a table.
    let secret = "me-secret-0123456789";
    let ok = rpc.ok("acl_add", json!({"target": T2, "initiator": ME, "chap": {"user": "me", "secret": secret}})).await;
    assert_eq!(ok, json!(true));
    assert!(matches!(connect(r.addr, ME, T2).await, Err(Error::Login(_))), "CHAP is required of ME");
    assert!(matches!(chap_session(r.addr, ME, T2, "me", "wrong-secret-0123").await, Err(Error::Login(_))));
    let mine = chap_session(r.addr, ME, T2, "me", secret).await.expect("ME with its credentials");
    assert_eq!(mine.report_luns().await.unwrap(), vec![lun(0), lun(1)]);
    // OTHER: no CHAP, and a LUN map (its 0 is the target's 1), as "USER:SECRET" for a third.
    rpc.ok("acl_add", json!({"target": T2, "initiator": OTHER, "luns": {"0": 1}})).await;
    let other = session(r.addr, OTHER, T2).await;
    assert_eq!(other.report_luns().await.unwrap(), vec![lun(0)]);
    assert_eq!(other.read_capacity(lun(0)).await.unwrap().0, 4096, "its LUN 0 is the target's LUN 1");
    assert_eq!(other.vpd(lun(0), 0x83).await.unwrap(), mine.vpd(lun(1), 0x83).await.unwrap());
    const THIRD: &str = "iqn.2026-11.io.riser:third";
    rpc.ok("acl_add", json!({"target": T2, "initiator": THIRD, "chap": "third:third-secret-012", "luns": [0]})).await;
    let third = chap_session(r.addr, THIRD, T2, "third", "third-secret-012").await.unwrap();
    assert_eq!(third.report_luns().await.unwrap(), vec![lun(0)]);
    assert_eq!(third.read_capacity(lun(0)).await.unwrap().0, 2048);
    // An initiator without an entry is still turned away.
    assert!(matches!(connect(r.addr, "iqn.2026-11.io.riser:nobody", T2).await, Err(Error::Login(_))));

    let t = target(&mut rpc, T2).await.unwrap();
    let acl = t["acl"].as_array().unwrap();
    assert_eq!(acl.len(), 3);
    let me_entry = acl.iter().find(|a| a["initiator"] == ME).unwrap();
    assert_eq!(me_entry["chap"], json!({"user": "me", "from_file": false}));
    assert_eq!(acl.iter().find(|a| a["initiator"] == OTHER).unwrap()["luns"], json!({"0": 1}));

    // Refusals.
    rpc.fails("acl_add", json!({"target": T3, "initiator": OTHER}), code::NOT_FOUND).await;
    rpc.fails("acl_add", json!({"target": T2, "initiator": OTHER, "luns": {"0": 7}}), code::NOT_FOUND).await;
    rpc.fails("acl_add", json!({"target": T2, "initiator": OTHER, "luns": {"zero": 1}}), code::INVALID_PARAMS).await;
    rpc.fails("acl_add", json!({"target": T2, "initiator": "no name"}), code::INVALID_PARAMS).await;
    rpc.fails("acl_add", json!({"target": T2, "initiator": OTHER, "chap": "u:short"}), code::INVALID_PARAMS).await;
    rpc.fails("acl_add", json!({"target": T2, "initiator": OTHER, "mutual_chap": "t:target-secret-0123"}), code::INVALID_PARAMS).await;
    let e = rpc
        .fails(
            "acl_add",
            json!({"target": T2, "initiator": OTHER, "chap": "x:aaaaaaaaaaaaaa", "chap_file": "/nonexistent"}),
            code::INVALID_PARAMS,
        )
        .await;
    assert!(!e.contains("aaaaaaaaaaaaaa"), "no secret in an error: {e}");
    // A refused change left OTHER's entry as it was.
    assert_eq!(other.report_luns().await.unwrap(), vec![lun(0)]);

    // acl_remove: OTHER's session ends before the answer; ME's and THIRD's go on.
    assert_eq!(rpc.ok("acl_remove", json!({"target": T2, "initiator": OTHER})).await, json!(true));
    assert!(tsihs_of(&mut rpc, OTHER).await.is_empty(), "OTHER's session is gone when acl_remove answers");
    assert!(other.test_unit_ready(lun(0)).await.is_err());
    assert!(matches!(connect(r.addr, OTHER, T2).await, Err(Error::Login(_))), "and it may not log in again");
    mine.write(lun(1), 0, pattern(2, 4096), 512).await.unwrap();
    assert_eq!(mine.read(lun(1), 0, 8, 512).await.unwrap(), pattern(2, 4096));
    third.test_unit_ready(lun(0)).await.unwrap();
    rpc.fails("acl_remove", json!({"target": T2, "initiator": OTHER}), code::NOT_FOUND).await;
    rpc.fails("acl_remove", json!({"target": T3, "initiator": ME}), code::NOT_FOUND).await;
    // The case of a name does not matter.
    rpc.ok("acl_remove", json!({"target": T2, "initiator": THIRD.to_uppercase()})).await;
    until("THIRD's session ends", || async { third.test_unit_ready(lun(0)).await.is_err() }).await;
    mine.test_unit_ready(lun(0)).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portals_are_added_and_removed_live() {
    let r = Running::start("portals", ONE_TARGET).await;
    let mut rpc = r.client().await;
    let port = crate::support::free_port();
    let addr = crate::support::local(port);
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "nobody listens there yet");
    let v = rpc.ok("portal_add", json!({"target": TARGET, "address": addr.to_string()})).await;
    assert_eq!(v, json!({"address": addr.to_string(), "transport": "tcp"}));
    let t = target(&mut rpc, TARGET).await.unwrap();
    let portals: Vec<&str> = t["portal_groups"][0]["portals"].as_array().unwrap().iter().map(|p| p["address"].as_str().unwrap()).collect();
    assert_eq!(portals, [r.addr.to_string(), addr.to_string()]);
    // A login through the new portal works, in portal group 1.
    let through = session(addr, ME, TARGET).await;
    assert_eq!(through.params().target_portal_group_tag, Some(1));
    let listed = sessions(&mut rpc).await;
    assert_eq!(listed[0]["portal"], addr.to_string());

    // In a group of its own.
    let port2 = crate::support::free_port();
    let addr2 = crate::support::local(port2);
    rpc.ok("portal_add", json!({"target": TARGET, "address": addr2.to_string(), "group": 7})).await;
    let s7 = session(addr2, OTHER, TARGET).await;
    assert_eq!(s7.params().target_portal_group_tag, Some(7));
    let groups: Vec<u64> =
        target(&mut rpc, TARGET).await.unwrap()["portal_groups"].as_array().unwrap().iter().map(|g| g["tag"].as_u64().unwrap()).collect();
    assert_eq!(groups, [1, 7]);

    rpc.fails("portal_add", json!({"target": TARGET, "address": addr.to_string()}), code::EXISTS).await;
    rpc.fails("portal_add", json!({"target": T2, "address": "127.0.0.1:1"}), code::NOT_FOUND).await;
    rpc.fails("portal_add", json!({"target": TARGET, "address": "not an address"}), code::INVALID_PARAMS).await;
    rpc.fails("portal_add", json!({"target": TARGET, "address": "127.0.0.1:1", "transport": "udp"}), code::INVALID_PARAMS).await;
    rpc.fails("portal_add", json!({"target": TARGET, "address": "127.0.0.1:1", "group": 0}), code::INVALID_PARAMS).await;
    // An address taken by someone else: the system refuses.
    let squatter = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken = squatter.local_addr().unwrap();
    rpc.fails("portal_add", json!({"target": TARGET, "address": taken.to_string()}), code::SYSTEM).await;
    assert_eq!(target(&mut rpc, TARGET).await.unwrap()["portal_groups"].as_array().unwrap().len(), 2, "nothing added");

    // Removed: refused at once; the session that came in through it goes on.
    assert_eq!(rpc.ok("portal_remove", json!({"target": TARGET, "address": addr.to_string()})).await, json!(true));
    assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "nobody listens there once portal_remove has answered");
    drop(std::net::TcpListener::bind(addr).expect("the address is free again"));
    through.write(Lun::ZERO, 0, pattern(3, 4096), 512).await.unwrap();
    rpc.fails("portal_remove", json!({"target": TARGET, "address": addr.to_string()}), code::NOT_FOUND).await;
    rpc.fails("portal_remove", json!({"target": TARGET, "address": addr.to_string(), "group": 1}), code::INVALID_PARAMS).await;
    rpc.ok("portal_remove", json!({"target": TARGET, "address": addr2.to_string()})).await;
    assert!(tokio::net::TcpStream::connect(addr2).await.is_err());
    // The first portal still serves.
    assert!(connect(r.addr, ME, TARGET).await.is_ok());

    // An iSER portal (the software RNIC) is added and removed the same way.
    let iser = crate::support::local(crate::support::free_port());
    let v = rpc.ok("portal_add", json!({"target": TARGET, "address": iser.to_string(), "transport": "iser"})).await;
    assert_eq!(v["transport"], "iser");
    let p = target(&mut rpc, TARGET).await.unwrap()["portal_groups"][0]["portals"][1].clone();
    assert_eq!((p["transport"].as_str(), p["rdma_provider"].as_str()), (Some("iser"), Some("soft")));
    rpc.ok("portal_remove", json!({"target": TARGET, "address": iser.to_string(), "transport": "iser"})).await;
    drop(std::net::TcpListener::bind(iser).expect("the iSER portal's address is free again"));
    drop(squatter);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_listed_and_asked_to_log_out() {
    let r = Running::start("sessions", ONE_TARGET).await;
    let mut rpc = r.client().await;
    assert_eq!(sessions(&mut rpc).await, Vec::<Value>::new());
    let mut cfg = SessionConfig::new(ME, TARGET);
    cfg.login.isid = riser_iscsi::wire::Isid([0x80, 1, 2, 3, 4, 5]);
    let mine = riser_initiator::Session::connect(r.addr, cfg).await.unwrap();
    let other = session(r.addr, OTHER, TARGET).await;
    // Listed a moment after the login response has left.
    until("both sessions are listed", || async { sessions(&mut r.client().await).await.len() == 2 }).await;
    let listed = sessions(&mut rpc).await;
    assert_eq!(listed.len(), 2);
    let me = listed.iter().find(|s| s["initiator"] == ME).unwrap();
    assert_eq!(me["isid"], "800102030405");
    assert_eq!((me["target"].as_str(), me["type"].as_str(), me["transport"].as_str()), (Some(TARGET), Some("normal"), Some("tcp")));
    assert_eq!(me["portal"], r.addr.to_string());
    assert!(me["peer"].as_str().unwrap().starts_with("127.0.0.1:"));
    assert_eq!(me["commands"], 0);
    assert_eq!(me["logout_requested"], false);
    assert!(me["keys"]["MaxBurstLength"].is_string() && me["keys"]["HeaderDigest"].is_string(), "{me}");
    let (t_me, t_other) = (me["tsih"].as_u64().unwrap(), tsihs_of(&mut rpc, OTHER).await[0]);
    assert!(t_me > 0 && t_other > 0 && t_me != t_other);

    // session_logout: this initiator logs out when asked; the other goes on.
    assert_eq!(rpc.ok("session_logout", json!({"tsih": t_me})).await, json!(true));
    until("the session asked to log out is gone", || async { tsihs_of(&mut r.client().await, ME).await.is_empty() }).await;
    drop(mine);
    assert_eq!(tsihs_of(&mut rpc, OTHER).await, [t_other]);
    other.test_unit_ready(Lun::ZERO).await.unwrap();
    rpc.fails("session_logout", json!({"tsih": t_me}), code::NOT_FOUND).await;
    rpc.fails("session_logout", json!({"tsih": 0}), code::NOT_FOUND).await;
    rpc.fails("session_logout", json!({"tsih": 70000}), code::INVALID_PARAMS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_initiator_that_does_not_log_out_when_asked_is_dropped_after_the_logout_timeout() {
    let r = Running::start("logout", ONE_TARGET).await;
    let mut rpc = r.client().await;
    let relay = Relay::to(r.addr).await;
    let deaf = session(relay.addr, ME, TARGET).await;
    let keep = session(r.addr, OTHER, TARGET).await;
    let tsih = tsihs_of(&mut rpc, ME).await[0];
    // From now on ME hears nothing: it cannot answer the request.
    relay.deafen();
    let asked = Instant::now();
    assert_eq!(rpc.ok("session_logout", json!({"tsih": tsih})).await, json!(true));
    let listed = sessions(&mut rpc).await.into_iter().find(|s| s["tsih"] == tsih).expect("listed until it goes");
    assert_eq!(listed["logout_requested"], true);
    // The Asynchronous Message reached the connection: opcode 0x32, AsyncEvent 1 (the target
    // requests a logout), Parameter3 the seconds given (limits.logout_timeout = 1).
    until("the Asynchronous Message arrives", || async { relay.kept().len() >= 48 }).await;
    let bhs = relay.kept()[..48].to_vec();
    assert_eq!((bhs[0] & 0x3f, bhs[36], u16::from_be_bytes([bhs[42], bhs[43]])), (0x32, 1, 1), "{bhs:02x?}");
    // Dropped after the second it was given (and not long before or after).
    assert!(!relay.closed_within(Duration::from_millis(800)).await, "not before the logout timeout");
    assert!(relay.closed_within(Duration::from_secs(4)).await, "dropped after the configured logout timeout, not the default 10 s");
    let took = asked.elapsed();
    assert!(took >= Duration::from_millis(900), "{took:?}");
    until("the session is gone", || async { tsihs_of(&mut r.client().await, ME).await.is_empty() }).await;
    keep.test_unit_ready(Lun::ZERO).await.unwrap();
    drop(deaf);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statistics_grow_with_io() {
    let r = Running::start("stats", ONE_TARGET).await;
    let mut rpc = r.client().await;
    let before = rpc.ok("stats_get", Value::Null).await;
    assert_eq!(before["sessions_by_target"], json!({}));
    let s = session(r.addr, ME, TARGET).await;
    let lun0 = |v: &Value| v["luns"].as_array().unwrap().iter().find(|l| l["target"] == TARGET && l["lun"] == 0).cloned();
    let start = rpc.ok("stats_get", Value::Null).await;
    let l0 = lun0(&start).unwrap_or(json!({"write_bytes": 0, "read_bytes": 0, "commands": {"write": 0, "read": 0}}));
    s.write(Lun::ZERO, 0, pattern(1, 8192), 512).await.unwrap();
    s.read(Lun::ZERO, 0, 16, 512).await.unwrap();
    s.read(Lun::ZERO, 16, 8, 512).await.unwrap();
    assert!(s.read(Lun::ZERO, 1 << 30, 1, 512).await.is_err(), "beyond the end");
    assert!(connect(r.addr, ME, "iqn.2026-11.io.riser:nothing").await.is_err(), "a failed login");
    // The failed login is counted, and its connection, until the target has closed it: once
    // it has, the statistics are still.
    until("the failed login's connection is closed", || async {
        r.client().await.ok("stats_get", Value::Null).await["connections"]["tcp"] == 1
    })
    .await;
    let after = rpc.ok("stats_get", Value::Null).await;
    let l1 = lun0(&after).unwrap();
    let grew = |k: &str| l1[k].as_u64().unwrap() - l0[k].as_u64().unwrap();
    assert_eq!((grew("write_bytes"), grew("read_bytes")), (8192, 12288));
    let cmd = |v: &Value, op: &str| v["commands"][op].as_u64().unwrap();
    assert_eq!((cmd(&l1, "write") - cmd(&l0, "write"), cmd(&l1, "read") - cmd(&l0, "read")), (1, 3));
    assert_eq!(l1["errors"]["illegal_request"], 1);
    let counts: u64 = l1["latency"]["counts"].as_array().unwrap().iter().map(|c| c.as_u64().unwrap()).sum();
    let total: u64 = l1["commands"].as_object().unwrap().values().map(|c| c.as_u64().unwrap()).sum();
    assert_eq!(counts, total, "every command is in the latency histogram");
    assert_eq!(after["sessions_by_target"], json!({TARGET: 1}));
    assert_eq!(after["connections"]["tcp"], 1);
    assert!(after["logins"].as_u64().unwrap() > before["logins"].as_u64().unwrap());
    let failures: u64 = after["login_failures"].as_object().unwrap().values().map(|c| c.as_u64().unwrap()).sum();
    assert_eq!(failures, 1);
    assert!(after["data_limit_bytes"].as_u64().unwrap() > 0);
    let per_session = &after["sessions"].as_array().unwrap()[0];
    assert_eq!(per_session["initiator"], ME);
    assert_eq!(per_session["luns"][0]["write_bytes"], 8192);
    // Counters outlive the session that made them.
    s.logout().await.unwrap();
    until("the session is gone", || async { r.client().await.ok("stats_get", Value::Null).await["sessions_by_target"] == json!({}) }).await;
    assert_eq!(lun0(&rpc.ok("stats_get", Value::Null).await).unwrap()["write_bytes"], l1["write_bytes"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_save_writes_privately_and_atomically() {
    let r = Running::start("save", ONE_TARGET).await;
    let mut rpc = r.client().await;
    rpc.ok("store_add", json!({"name": "saved", "backing": "ram:1MiB"})).await;
    let inode = |p: &std::path::Path| std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(p).unwrap());
    let before = inode(&r.config);

    // To the --config file by default.
    let v = rpc.ok("config_save", Value::Null).await;
    assert_eq!(v["path"], r.config.display().to_string());
    assert_eq!(mode(&r.config), 0o600);
    assert_ne!(inode(&r.config), before, "a new file renamed over the old one, not rewritten in place");
    let saved = riser_service::config::read(&r.config).unwrap();
    assert!(saved.stores.iter().any(|s| s.name == "saved" && s.uuid.is_some()));
    assert_eq!(saved, r.svc.running_config().await);
    let names = |d: &std::path::Path| {
        let mut v: Vec<String> = std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
        v.sort();
        v
    };
    assert_eq!(names(r.dir.path()), ["control.sock", "target.toml"], "no temporary file left");

    // To a given path; an existing file there (readable by all) is replaced by a private one.
    let other = r.dir.join("elsewhere.toml");
    std::fs::write(&other, "old").unwrap();
    std::fs::set_permissions(&other, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let v = rpc.ok("config_save", json!({"path": other})).await;
    assert_eq!(v["path"], other.display().to_string());
    assert_eq!(mode(&other), 0o600);
    assert_eq!(std::fs::read(&other).unwrap(), std::fs::read(&r.config).unwrap());
    // Somewhere it cannot be written: an error, and nothing left behind.
    let nowhere = r.dir.join("missing/dir/x.toml");
    rpc.fails("config_save", json!({"path": nowhere}), code::SYSTEM).await;
    assert_eq!(names(r.dir.path()), ["control.sock", "elsewhere.toml", "target.toml"]);

    // A service started without a configuration file has nowhere to save by default.
    let dir = crate::support::TempDir::new("save-noconfig");
    let port = crate::support::free_port();
    let overrides =
        riser_service::config::ConfigFile { portal: vec![format!("127.0.0.1:{port}")], lun: vec!["ram:1MiB".into()], ..Default::default() };
    let svc = riser_service::Service::start(riser_service::Source { path: None, overrides }).await.unwrap();
    let sock = dir.join("c.sock");
    let _c = riser_service::control::listen(svc.clone(), &sock).await.unwrap();
    let mut rpc2 = crate::support::Rpc(riser_service::control::Client::connect(&sock).await.unwrap());
    rpc2.fails("config_save", Value::Null, code::INVALID_PARAMS).await;
    let to = dir.join("flags.toml");
    rpc2.ok("config_save", json!({"path": to})).await;
    let f = riser_service::config::read(&to).unwrap();
    assert_eq!((f.stores.len(), f.targets.len(), f.lun.len()), (1, 1, 0), "the flags' target, in the structured form");
}
