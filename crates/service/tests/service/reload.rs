//! A reload (SIGHUP) makes the running service what the edited file says, live.

use crate::support::{
    ME, OTHER, READ_CAPACITY_16, Running, TARGET, TUR, blocks, connect, lun, once, sense_of, session, tsihs_of, write_private,
};
use riser_initiator::{Error, Lun};
use riser_scsi::sense::{AscAscq, SenseKey};
use serde_json::{Value, json};

const BEFORE: &str = r#"
[limits]
logout_timeout = 1
drain_timeout = 2

[[store]]
name = "a"
backing = "ram:4MiB"

[[store]]
name = "grow"
backing = "ram:1MiB"

[[target]]
name = "iqn.2026-11.io.riser:svc"
alias = "before"

[[target.lun]]
lun = 0
store = "a"

[[target.lun]]
lun = 1
store = "grow"

[[target.acl]]
initiator = "iqn.2026-11.io.riser:me"

[[target.acl]]
initiator = "iqn.2026-11.io.riser:other"
"#;

/// A store added, and exported as LUN 2; OTHER's entry gone; another alias; the RAM store
/// grown to 2 MiB; a [limits] key changed.
const AFTER: &str = r#"
[limits]
logout_timeout = 1
drain_timeout = 2
queue_depth = 64

[[store]]
name = "a"
backing = "ram:4MiB"

[[store]]
name = "grow"
backing = "ram:2MiB"

[[store]]
name = "b"
backing = "ram:3MiB"

[[target]]
name = "iqn.2026-11.io.riser:svc"
alias = "after"

[[target.lun]]
lun = 0
store = "a"

[[target.lun]]
lun = 1
store = "grow"

[[target.lun]]
lun = 2
store = "b"

[[target.acl]]
initiator = "iqn.2026-11.io.riser:me"
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_the_edited_file_live() {
    let r = Running::start("reload", BEFORE).await;
    let mut rpc = r.client().await;
    let me = session(r.addr, ME, TARGET).await;
    let other = session(r.addr, OTHER, TARGET).await;
    me.write(Lun::ZERO, 0, crate::support::pattern(4, 4096), 512).await.unwrap();
    let uuids = |v: &Value| v.as_array().unwrap().iter().map(|s| (s["name"].clone(), s["uuid"].clone())).collect::<Vec<_>>();
    let stores_before = uuids(&rpc.ok("store_list", Value::Null).await);
    // Something added through the socket and not saved: a reload undoes it.
    rpc.ok("store_add", json!({"name": "unsaved", "backing": "ram:1MiB"})).await;

    // Reloading the same file changes nothing and says nothing.
    assert_eq!(r.svc.reload().await.unwrap(), Vec::<String>::new());
    once(&me, Lun::ZERO, &TUR, None, 0).await.expect("no change, no unit attention");

    let port = r.addr.port();
    write_private(&r.config, &format!("portal = [\"127.0.0.1:{port}\"]\n{AFTER}"));
    let notes = r.svc.reload().await.unwrap();
    assert_eq!(notes.len(), 1, "{notes:?}");
    assert!(notes[0].contains("limits") && notes[0].contains("next start"), "the [limits] change needs a restart: {notes:?}");

    // The running configuration is the file's.
    let running = r.svc.running_config().await;
    assert_eq!(running.limits.queue_depth, Some(toml::Value::Integer(64)));
    let t = &rpc.ok("target_list", Value::Null).await[0];
    assert_eq!(t["alias"], "after");
    assert_eq!(t["luns"], json!([{"lun": 0, "store": "a"}, {"lun": 1, "store": "grow"}, {"lun": 2, "store": "b"}]));
    assert_eq!(t["acl"].as_array().unwrap().iter().map(|a| a["initiator"].clone()).collect::<Vec<_>>(), [ME]);
    let stores = rpc.ok("store_list", Value::Null).await;
    let names: Vec<&str> = stores.as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["a", "grow", "b"], "the unsaved store is gone");
    let grow = stores.as_array().unwrap().iter().find(|s| s["name"] == "grow").unwrap();
    assert_eq!(grow["size"], 2 << 20, "the RAM store grew");
    assert_eq!(uuids(&stores)[..2], stores_before[..], "stores that stay keep their identity");

    // OTHER's session is gone, and it may not log in again; ME's goes on.
    assert!(tsihs_of(&mut rpc, OTHER).await.is_empty(), "the removed entry's session ended with the reload");
    assert!(other.test_unit_ready(Lun::ZERO).await.is_err());
    assert!(matches!(connect(r.addr, OTHER, TARGET).await, Err(Error::Login(_))));
    // ME is told of the new LUN once, then of its grown LUN's capacity once.
    assert_eq!(sense_of(once(&me, lun(0), &TUR, None, 0).await), (SenseKey::UNIT_ATTENTION, AscAscq::REPORTED_LUNS_DATA_CHANGED));
    once(&me, lun(0), &TUR, None, 0).await.expect("told once");
    assert_eq!(me.report_luns().await.unwrap(), vec![lun(0), lun(1), lun(2)]);
    assert_eq!(sense_of(once(&me, lun(1), &READ_CAPACITY_16, None, 32).await), (SenseKey::UNIT_ATTENTION, AscAscq::CAPACITY_DATA_CHANGED));
    assert_eq!(blocks(once(&me, lun(1), &READ_CAPACITY_16, None, 32).await.unwrap()), 4096);
    assert_eq!(me.read_capacity(lun(2)).await.unwrap().0, 6144);
    assert_eq!(me.read(Lun::ZERO, 0, 8, 512).await.unwrap(), crate::support::pattern(4, 4096), "the data of a store that stays");

    // A file that does not parse: refused, nothing changes.
    write_private(&r.config, "[[store]]\nname = \n");
    let e = r.svc.reload().await.unwrap_err();
    assert!(e.contains(&r.config.display().to_string()), "{e}");
    assert_eq!(rpc.ok("target_list", Value::Null).await[0]["alias"], "after");
    me.test_unit_ready(lun(2)).await.unwrap();
}
