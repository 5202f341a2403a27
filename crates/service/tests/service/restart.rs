//! A saved configuration brings back the same service: the same targets and stores, and the same
//! identities as initiators read them (VPD pages 0x80 and 0x83), for file and RAM stores alike.

use crate::support::{ME, OTHER, Running, TARGET, TempDir, chap_session, free_port, local, lun, pattern, session};
use riser_initiator::Session;
use riser_service::control::{self, Client};
use riser_service::{Service, Source};
use serde_json::{Value, json};
use std::net::SocketAddr;

const T2: &str = "iqn.2026-11.io.riser:svc2";
const LATE: &str = "iqn.2026-11.io.riser:late";

/// Two portal groups (the second with its own relative port and ALUA group), a file store and
/// a RAM store, an ACL entry with inline CHAP and a LUN map, another without.
const SAVED: &str = r#"
[limits]
logout_timeout = 1
drain_timeout = 2

[[store]]
name = "file0"
backing = "file:DIR/disk0.img:4MiB"

[[store]]
name = "ram0"
backing = "ram:2MiB"

[[target]]
name = "iqn.2026-11.io.riser:svc"
alias = "restartable"

[[target.portal_group]]
tag = 1
portals = ["127.0.0.1:PORT"]

[[target.portal_group]]
tag = 2
relative_port = 7
port_group = 9
portals = ["127.0.0.1:SECOND"]

[[target.lun]]
lun = 0
store = "file0"

[[target.lun]]
lun = 1
store = "ram0"

[[target.acl]]
initiator = "iqn.2026-11.io.riser:me"
chap = { user = "me", secret = "me-secret-0123456789" }
luns = { "0" = 1, "1" = 0 }

[[target.acl]]
initiator = "iqn.2026-11.io.riser:other"
"#;

/// VPD pages 0x80 and 0x83 of `luns` through `s`.
async fn identities(s: &Session, luns: &[u16]) -> Vec<(u16, Vec<u8>, Vec<u8>)> {
    let mut out = Vec::new();
    for &l in luns {
        out.push((l, s.vpd(lun(l), 0x80).await.unwrap().to_vec(), s.vpd(lun(l), 0x83).await.unwrap().to_vec()));
    }
    out
}

/// What the operator sees of the service: its targets and stores.
async fn listing(c: &mut Client) -> (Value, Value) {
    (c.call("target_list", Value::Null).await.unwrap().unwrap(), c.call("store_list", Value::Null).await.unwrap().unwrap())
}

/// Stop a service and release everything it holds: sessions, listeners, the control socket.
async fn stop(svc: std::sync::Arc<Service>, socket: Option<control::ControlSocket>) {
    assert_eq!(svc.shutdown().await, 0, "every session logged out before the stop");
    drop(socket);
    drop(svc);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_save_then_restart_gives_the_same_targets_stores_and_identities() {
    let dir = TempDir::new("restart");
    let (port, second) = (free_port(), free_port());
    let r = Running::start_in(dir, port, &SAVED.replace("SECOND", &second.to_string())).await;
    let addr2 = local(second);
    let mut rpc = r.client().await;
    // Changes through the socket: a store and its LUN, a target, ACL entries with CHAP and maps.
    rpc.ok("store_add", json!({"name": "ram1", "backing": "ram:1MiB"})).await;
    rpc.ok("lun_add", json!({"target": TARGET, "lun": 2, "store": "ram1"})).await;
    rpc.ok(
        "acl_add",
        json!({"target": TARGET, "initiator": LATE, "chap": {"user": "late", "secret": "late-secret-01234"}, "luns": {"5": 2}}),
    )
    .await;
    rpc.ok("target_add", json!({"name": T2, "alias": "second", "open": true})).await;
    rpc.ok("store_add", json!({"name": "file1", "backing": format!("file:{}:1MiB", r.dir.join("disk1.img").display())})).await;
    rpc.ok("lun_add", json!({"target": T2, "lun": 3, "store": "file1"})).await;
    rpc.ok("store_add", json!({"name": "spare", "backing": "ram:1MiB", "block_size": 4096})).await;
    rpc.ok("store_resize", json!({"name": "ram0", "size": "3MiB"})).await;

    // What initiators see, through each portal group (T2 is reached through the first only).
    let read_all = |addr: SocketAddr, t2_addr: SocketAddr| async move {
        let other = session(addr, OTHER, TARGET).await;
        let me = chap_session(addr, ME, TARGET, "me", "me-secret-0123456789").await.unwrap();
        me.report_luns().await.unwrap();
        let late = chap_session(addr, LATE, TARGET, "late", "late-secret-01234").await.unwrap();
        let t2 = session(t2_addr, ME, T2).await;
        let seen = (
            identities(&other, &[0, 1, 2]).await,
            identities(&me, &[0, 1]).await,
            late.report_luns().await.unwrap(),
            identities(&late, &[5]).await,
            identities(&t2, &[3]).await,
            other.read_capacity(lun(1)).await.unwrap(),
        );
        (seen, [other, me, late, t2])
    };
    let (before, sessions) = read_all(r.addr, r.addr).await;
    let (before2, sessions2) = read_all(addr2, r.addr).await;
    assert_ne!(before.0, before2.0, "the second portal group is another target port");
    // Data written to the file store is there after the restart.
    sessions[0].write(lun(0), 0, pattern(9, 4096), 512).await.unwrap();
    let (targets, stores) = listing(&mut rpc.0).await;
    assert_eq!(stores.as_array().unwrap().len(), 5);

    let v = rpc.ok("config_save", Value::Null).await;
    assert_eq!(v["path"], r.config.display().to_string());
    for s in sessions.into_iter().chain(sessions2) {
        s.logout().await.unwrap();
    }
    let Running { svc, control, config, dir, .. } = r;
    drop(rpc);
    stop(svc, control).await;

    // Started again from the saved file: the same ports are free, the same service is back.
    let svc = Service::start(Source { path: Some(config.clone()), overrides: Default::default() })
        .await
        .expect("the saved configuration starts, on the ports the stopped service released");
    let sock = dir.join("control.sock");
    let socket = control::listen(svc.clone(), &sock).await.unwrap();
    let mut c = Client::connect(&sock).await.unwrap();
    let (targets_after, stores_after) = listing(&mut c).await;
    assert_eq!(targets_after, targets);
    assert_eq!(stores_after, stores);
    let (after, sessions) = read_all(local(port), local(port)).await;
    let (after2, sessions2) = read_all(addr2, local(port)).await;
    assert_eq!(after, before, "identities through portal group 1 are byte-identical");
    assert_eq!(after2, before2, "identities through portal group 2 are byte-identical");
    assert_eq!(sessions[0].read(lun(0), 0, 8, 512).await.unwrap(), pattern(9, 4096));
    // And saving again changes nothing.
    let saved = std::fs::read_to_string(&config).unwrap();
    c.call("config_save", Value::Null).await.unwrap().unwrap();
    assert_eq!(std::fs::read_to_string(&config).unwrap(), saved);
    for s in sessions.into_iter().chain(sessions2) {
        s.logout().await.unwrap();
    }
    drop(c);
    stop(svc, Some(socket)).await;
    drop(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_stores_identity_is_derived_from_the_file_and_stable_across_starts() {
    let dir = TempDir::new("uuid");
    let port = free_port();
    // The command line's form only: no UUID anywhere.
    let flags = || riser_service::config::ConfigFile {
        portal: vec![format!("127.0.0.1:{port}")],
        lun: vec![format!("file:{}:1MiB", dir.join("a.img").display()), format!("file:{}:1MiB", dir.join("b.img").display())],
        limits: riser_service::config::Limits { drain_timeout: Some(toml::Value::Integer(1)), ..Default::default() },
        ..Default::default()
    };
    let mut seen = Vec::new();
    for _ in 0..2 {
        let svc = Service::start(Source { path: None, overrides: flags() }).await.unwrap();
        let stores: Vec<(String, String, String)> = riser_service::views::stores(&svc)
            .await
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["uuid"].as_str().unwrap().into(), s["serial"].as_str().unwrap().into(), s["naa"].as_str().unwrap().into()))
            .collect();
        let s = session(local(port), ME, riser_service::config::DEFAULT_TARGET_NAME).await;
        let vpd = identities(&s, &[0, 1]).await;
        s.logout().await.unwrap();
        stop(svc, None).await;
        seen.push((stores, vpd));
    }
    assert_eq!(seen[0], seen[1], "the same files, the same identities at every start");
    let (stores, vpd) = &seen[0];
    assert_eq!(stores.len(), 2);
    assert_ne!(stores[0], stores[1], "another file, another identity");
    assert_ne!(vpd[0].1, vpd[1].1);
    assert_ne!(vpd[0].2, vpd[1].2);
    assert_eq!(uuid::Uuid::parse_str(&stores[0].0).unwrap().get_version_num(), 5, "derived, not random");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_service_has_released_its_portals() {
    let port = free_port();
    let flags = || riser_service::config::ConfigFile {
        portal: vec![format!("127.0.0.1:{port}")],
        lun: vec!["ram:1MiB".into()],
        limits: riser_service::config::Limits { drain_timeout: Some(toml::Value::Integer(1)), ..Default::default() },
        ..Default::default()
    };
    for i in 0..20 {
        let svc = Service::start(Source { path: None, overrides: flags() }).await.unwrap_or_else(|e| panic!("start {i}: {e}"));
        if i % 5 == 0 {
            let s = session(local(port), ME, riser_service::config::DEFAULT_TARGET_NAME).await;
            s.logout().await.unwrap();
        }
        svc.shutdown().await;
        // Free the moment shutdown returns: anyone may listen there.
        drop(std::net::TcpListener::bind(local(port)).unwrap_or_else(|e| panic!("stop {i}: the portal is still held: {e}")));
        drop(svc);
    }
}
