//! The control socket is private to its owner and there is one per path.

use crate::support::{ONE_TARGET, Running, TempDir, mode};
use riser_service::control::{self, Client};
use serde_json::Value;
use std::os::unix::fs::{FileTypeExt as _, PermissionsExt as _};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_control_socket_is_private_and_single() {
    let mut r = Running::start("socket", ONE_TARGET).await;
    let path = r.socket();
    // Mode 600, in a directory only its owner can write to.
    assert!(std::fs::metadata(&path).unwrap().file_type().is_socket());
    assert_eq!(mode(&path), 0o600, "the socket is its owner's alone");
    // No temporary name left behind.
    let names: Vec<String> =
        std::fs::read_dir(r.dir.path()).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["control.sock", "target.toml"], "{names:?}");

    // A second listener on the same path while the first answers: refused, the first unharmed.
    let e = control::listen(r.svc.clone(), &path).await.unwrap_err();
    assert!(e.contains(&path.display().to_string()), "the error names the socket: {e}");
    let mut c = Client::connect(&path).await.unwrap();
    assert_eq!(c.call("version", Value::Null).await.unwrap().unwrap()["name"], "riser");

    // Closed: the socket file goes with it.
    drop(c);
    drop(r.control.take());
    assert!(!path.exists(), "the socket file is removed when the socket closes");

    // A stale socket (nobody listening) is replaced.
    drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
    assert!(path.exists());
    let again = control::listen(r.svc.clone(), &path).await.expect("a stale socket is replaced");
    assert_eq!(mode(&path), 0o600);
    let mut c = Client::connect(&path).await.unwrap();
    assert!(c.call("target_list", Value::Null).await.unwrap().unwrap().is_array());
    drop(again);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_directory_others_can_write_to_is_refused() {
    let r = Running::start("socketdir", ONE_TARGET).await;
    for m in [0o777, 0o770, 0o707, 0o1777, 0o722] {
        let dir = TempDir::new("opendir");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(m)).unwrap();
        let sock = dir.join("control.sock");
        let e = control::listen(r.svc.clone(), &sock).await.unwrap_err();
        assert!(e.contains(&dir.path().display().to_string()), "mode {m:o}: the error names the directory: {e}");
        assert!(!sock.exists(), "mode {m:o}: nothing is created there");
    }
    // Readable and searchable by others is fine (the socket itself is 600).
    let dir = TempDir::new("readable");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let s = control::listen(r.svc.clone(), &dir.join("control.sock")).await.unwrap();
    assert_eq!(mode(s.path()), 0o600);
    // A directory that does not exist: an error naming it.
    let missing = dir.join("no/such/dir/control.sock");
    let e = control::listen(r.svc.clone(), &missing).await.unwrap_err();
    assert!(e.contains("no/such/dir"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_that_is_no_socket_is_never_replaced() {
    // A misconfigured control path naming a file (the configuration itself, say) must not cost
    // the operator that file.
    let r = Running::start("notasocket", ONE_TARGET).await;
    let before = std::fs::read(&r.config).unwrap();
    let e = control::listen(r.svc.clone(), &r.config).await.unwrap_err();
    assert!(e.contains(&r.config.display().to_string()), "{e}");
    assert_eq!(std::fs::read(&r.config).unwrap(), before, "the file is untouched");
    let dir = r.dir.join("a-directory");
    std::fs::create_dir(&dir).unwrap();
    assert!(control::listen(r.svc.clone(), &dir).await.is_err());
    assert!(dir.is_dir());
}
