//! No CHAP secret is shown anywhere but in the (private) saved configuration: not by any method
//! of the control plane, not in the metrics, not in the Debug output of the configuration types,
//! not in an error, not in a log line.

use crate::support::{ME, OTHER, Running, TARGET, chap_session, creds, mode};
use riser_initiator::{Session, SessionConfig};
use riser_service::control::code;
use serde_json::{Value, json};
use std::io::Write;
use std::sync::{Arc, Mutex};

/// Every secret below holds this; nothing shown may.
const NEEDLE: &str = "xyzzy";
const THIRD: &str = "iqn.2026-11.io.riser:third";
const FOURTH: &str = "iqn.2026-11.io.riser:fourth";

const CONFIG: &str = r#"
discovery_chap = "disc:xyzzy-discovery-05"

[limits]
logout_timeout = 1
drain_timeout = 2

[[store]]
name = "d"
backing = "ram:1MiB"

[[target]]
name = "iqn.2026-11.io.riser:svc"
open = true
chap = { user = "tuser", secret = "xyzzy-target-secret-01" }
mutual_chap = { user = "ttarget", secret = "xyzzy-target-mutual-02" }

[[target.lun]]
lun = 0
store = "d"

[[target.acl]]
initiator = "iqn.2026-11.io.riser:me"
chap = "meuser:xyzzy-acl-secret-03"
mutual_chap = { user = "metarget", secret = "xyzzy-acl-mutual-04" }
"#;

/// Log output, kept.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn clean(what: &str, text: &str) {
    assert!(!text.contains(NEEDLE), "a secret in {what}: {text}");
}

#[test]
fn no_secret_is_shown_or_logged() {
    let logs = Capture::default();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer({
            let logs = logs.clone();
            move || logs.clone()
        })
        .finish();
    // One thread: every task of the service and the initiator logs to this subscriber.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    tracing::subscriber::with_default(subscriber, || rt.block_on(shown_nowhere()));
    let logs = String::from_utf8(logs.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("ACL entry set") && logs.contains("control request"), "the logs were captured");
    clean("the logs", &logs);
}

async fn shown_nowhere() {
    let r = Running::start("secrets", CONFIG).await;
    let mut rpc = r.client().await;
    // More, through the socket: a table and a line.
    rpc.ok("acl_add", json!({"target": TARGET, "initiator": THIRD, "chap": {"user": "third", "secret": "xyzzy-socket-secret-06"}})).await;
    rpc.ok("acl_add", json!({"target": TARGET, "initiator": FOURTH, "chap": "fourth:xyzzy-socket-line-07"})).await;
    // Refused credentials: the error says why, not what.
    for bad in [json!("u:xyzzy1"), json!({"user": "u", "secret": "xyzzy1"}), json!("xyzzy-no-user-separator-at-all")] {
        let e = rpc.fails("acl_add", json!({"target": TARGET, "initiator": OTHER, "chap": bad}), code::INVALID_PARAMS).await;
        clean("an acl_add error", &e);
    }
    let e = rpc
        .fails("acl_add", json!({"target": TARGET, "initiator": OTHER, "mutual_chap": "m:xyzzy-mutual-only-08"}), code::INVALID_PARAMS)
        .await;
    clean("an acl_add error", &e);
    // A malformed request that holds a secret: the parse error does not quote it.
    let mut raw = crate::support::RawControl::connect(&r.socket()).await;
    let v = raw.send_and_reply(br#"{"jsonrpc":"2.0","method":"acl_add","params":{"chap":"u:xyzzy-in-bad-json-09"},"id":1,}"#).await;
    clean("a parse error", &v.to_string());

    // Sessions with every kind of credential: the target's (mutual), ME's own (mutual), THIRD's.
    let other = Session::connect(
        r.addr,
        SessionConfig::new(OTHER, TARGET)
            .with_chap(creds("tuser", "xyzzy-target-secret-01"), Some(creds("ttarget", "xyzzy-target-mutual-02"))),
    )
    .await
    .unwrap();
    let me = Session::connect(
        r.addr,
        SessionConfig::new(ME, TARGET).with_chap(creds("meuser", "xyzzy-acl-secret-03"), Some(creds("metarget", "xyzzy-acl-mutual-04"))),
    )
    .await
    .unwrap();
    let third = chap_session(r.addr, THIRD, TARGET, "third", "xyzzy-socket-secret-06").await.unwrap();
    let fourth = chap_session(r.addr, FOURTH, TARGET, "fourth", "xyzzy-socket-line-07").await.unwrap();
    let wrong = chap_session(r.addr, FOURTH, TARGET, "fourth", "xyzzy-wrong-secret-10").await;
    assert!(wrong.is_err());
    for s in [&other, &me, &third, &fourth] {
        s.write(riser_initiator::Lun::ZERO, 0, crate::support::pattern(1, 4096), 512).await.unwrap();
    }
    let found = riser_initiator::discover(
        r.addr,
        ME,
        riser_initiator::InitiatorAuth::Chap {
            credentials: creds("disc", "xyzzy-discovery-05"),
            mutual: None,
            algorithms: riser_iscsi::chap::ChapAlgorithm::ALL.to_vec(),
        },
    )
    .await
    .unwrap();
    assert_eq!(found[0].0, TARGET);

    // Every method that shows something.
    let listed = rpc.ok("session_list", Value::Null).await;
    assert_eq!(listed.as_array().unwrap().len(), 4);
    for (what, v) in [
        ("session_list", listed),
        ("stats_get", rpc.ok("stats_get", Value::Null).await),
        ("target_list", rpc.ok("target_list", Value::Null).await),
        ("store_list", rpc.ok("store_list", Value::Null).await),
        ("rpc_get_methods", rpc.ok("rpc_get_methods", Value::Null).await),
        ("version", rpc.ok("version", Value::Null).await),
    ] {
        clean(what, &v.to_string());
    }
    let t = &rpc.ok("target_list", Value::Null).await[0];
    assert_eq!(t["chap"], json!({"user": "tuser", "from_file": false}), "the user is shown, the secret is not");
    // The metrics, rendered and served.
    clean("the metrics", &riser_service::metrics::render(r.svc.target()));
    let ep = riser_service::metrics::serve(r.svc.target().clone(), "127.0.0.1:0".parse().unwrap()).await.unwrap();
    let mut s = tokio::net::TcpStream::connect(ep.local_addr()).await.unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut s, b"GET /metrics HTTP/1.1\r\n\r\n").await.unwrap();
    let mut body = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut s, &mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200"));
    clean("GET /metrics", &body);

    // The Debug output of the service and of every configuration type.
    let text = std::fs::read_to_string(&r.config).unwrap();
    let file = riser_service::config::parse(&text, "target.toml").unwrap();
    let resolved = file.resolve(r.dir.path()).unwrap();
    clean("Debug of ConfigFile", &format!("{file:?} {file:#?}"));
    clean("Debug of Resolved", &format!("{resolved:?}"));
    clean("Debug of Settings", &format!("{:?}", resolved.settings));
    clean("Debug of TargetSpec", &format!("{:?}", resolved.targets));
    clean("Debug of AclSpec", &format!("{:?}", resolved.targets[0].acl));
    clean("Debug of Credential", &format!("{:?}", resolved.targets[0].chap));
    clean("Debug of CredentialText", &format!("{:?}", file.targets[0].chap));
    clean("Debug of the running configuration", &format!("{:?}", r.svc.running_config().await));
    clean("Debug of the service", &format!("{:?}", r.svc));
    clean("Debug of the targets", &format!("{:?}", r.svc.targets().await));
    clean("Debug of the target's nodes", &format!("{:?}", r.svc.target().nodes()));
    clean("Debug of the target's sessions", &format!("{:?}", r.svc.target().sessions()));
    // A file that does not parse: the error names the line, not what is on it.
    let broken = text.replace("secret = \"xyzzy-target-secret-01\" }", "secret = \"xyzzy-target-secret-01\" ]");
    let e = riser_service::config::parse(&broken, "target.toml").unwrap_err();
    assert!(e.contains("line"), "{e}");
    clean("a parse error", &e);
    crate::support::write_private(&r.config, &broken);
    let e = r.svc.reload().await.unwrap_err();
    clean("a reload error", &e);
    crate::support::write_private(&r.config, &text);

    // The one place secrets are: the saved configuration, private.
    let saved = r.dir.join("saved.toml");
    rpc.ok("config_save", json!({"path": saved})).await;
    assert_eq!(mode(&saved), 0o600);
    let saved_text = std::fs::read_to_string(&saved).unwrap();
    for secret in [
        "xyzzy-target-secret-01",
        "xyzzy-target-mutual-02",
        "xyzzy-acl-secret-03",
        "xyzzy-socket-secret-06",
        "xyzzy-socket-line-07",
        "xyzzy-discovery-05",
    ] {
        assert!(saved_text.contains(secret), "config_save keeps {secret} (the test can see a secret where there is one)");
    }
    for s in [other, me, third, fourth] {
        s.logout().await.unwrap();
    }
}
