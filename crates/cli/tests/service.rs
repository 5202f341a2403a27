//! riser-target run as a service would be: the systemd unit in the repository verified, readiness
//! and reloads told through a `NOTIFY_SOCKET` the test owns (no systemd as PID 1 needed), SIGHUP
//! applying a changed configuration live, SIGTERM draining and exiting 0, riserctl against the
//! running target.

use riser::initiator::{Session, SessionConfig};
use riser::scsi::lun::Lun;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TARGET: &str = "iqn.2026-11.io.riser:svc";

/// A private directory of the test's own.
fn private_dir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("riser-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o700)).unwrap();
    d
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The next state the service manager hears (within 30 s).
fn heard(sock: &UnixDatagram) -> String {
    sock.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).expect("a notification");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

fn signal(child: &Child, sig: &str) {
    assert!(Command::new("kill").args([&format!("-{sig}"), &child.id().to_string()]).status().unwrap().success());
}

/// Wait up to `t` for the child to exit.
fn exit_within(child: &mut Child, t: Duration) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < t {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

fn config(port: u16, extra_lun: bool) -> String {
    let mut c = format!(
        "portal = [\"127.0.0.1:{port}\"]\n[limits]\ndrain_timeout = 20\nlogout_timeout = 2\n\n\
         [[store]]\nname = \"a\"\nbacking = \"ram:16MiB\"\n\n[[store]]\nname = \"b\"\nbacking = \"ram:8MiB\"\n\n\
         [[target]]\nname = \"{TARGET}\"\n[[target.lun]]\nlun = 0\nstore = \"a\"\n"
    );
    if extra_lun {
        c.push_str("[[target.lun]]\nlun = 3\nstore = \"b\"\n");
    }
    c
}

fn riserctl(socket: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_riserctl")).arg("--socket").arg(socket).args(args).output().unwrap()
}

#[test]
fn the_systemd_unit_verifies() {
    let unit = include_str!("../../../dist/systemd/riser-target.service");
    assert!(unit.contains("Type=notify") && unit.contains("ExecReload=/bin/kill -HUP $MAINPID"));
    // The unit as installed, its binary where this build put it.
    let dir = private_dir("unit");
    let path = dir.join("riser-target.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/riser-target", env!("CARGO_BIN_EXE_riser-target"))).unwrap();
    let out = Command::new("systemd-analyze").arg("verify").arg(&path).output().expect("systemd-analyze (Debian's systemd package)");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !stderr.contains("riser-target.service"), "systemd-analyze verify: {stderr}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn ready_once_serving_reload_on_sighup_drain_on_sigterm() {
    let dir = private_dir("lifecycle");
    let port = free_port();
    let cfg = dir.join("target.toml");
    std::fs::write(&cfg, config(port, false)).unwrap();
    let notify_path = dir.join("notify");
    let manager = UnixDatagram::bind(&notify_path).unwrap();
    let socket = dir.join("control.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_riser-target"))
        .arg("--config")
        .arg(&cfg)
        .arg("--control")
        .arg(&socket)
        .env("NOTIFY_SOCKET", &notify_path)
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let ready = heard(&manager);
    assert!(ready.starts_with("READY=1"), "{ready}");
    // Ready means serving: a login works at once, and the control socket answers.
    // A runtime of its own threads: the session answers the target while the test waits.
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let s = rt.block_on(Session::connect(addr, SessionConfig::new("iqn.2026-11.io.riser:host", TARGET))).unwrap();
    rt.block_on(s.write(Lun::ZERO, 0, vec![5u8; 4096].into(), 512)).unwrap();
    assert_eq!(rt.block_on(s.report_luns()).unwrap(), vec![Lun::ZERO]);
    assert!(riserctl(&socket, &["target_list"]).status.success());

    // SIGHUP: the changed file applies live; the session goes on and sees the new LUN.
    std::fs::write(&cfg, config(port, true)).unwrap();
    signal(&child, "HUP");
    assert!(heard(&manager).starts_with("RELOADING=1"));
    assert!(heard(&manager).starts_with("READY=1"));
    assert_eq!(rt.block_on(s.report_luns()).unwrap(), vec![Lun::ZERO, Lun::from_number(3).unwrap()]);
    assert_eq!(rt.block_on(s.read_capacity(Lun::from_number(3).unwrap())).unwrap(), (16384, 512));
    let listed = riserctl(&socket, &["--json", "target_list"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("\"lun\": 3"));

    // SIGTERM: stopping, no new connection, the session asked to log out — the riser initiator
    // does at once, so the drain ends well before its 20 s — exit 0.
    let t0 = Instant::now();
    signal(&child, "TERM");
    assert!(heard(&manager).starts_with("STOPPING=1"));
    let status = exit_within(&mut child, Duration::from_secs(40)).expect("exits after the drain");
    assert!(status.success(), "{status}");
    assert!(t0.elapsed() < Duration::from_secs(10), "the drain waited for a session that had logged out: {:?}", t0.elapsed());
    assert!(std::net::TcpStream::connect(addr).is_err(), "nothing listens any more");
    assert!(!socket.exists(), "the control socket is removed");
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_control_socket_others_could_replace_is_refused() {
    let dir = private_dir("opendir");
    let open = dir.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_riser-target"))
        .args(["--portal", &format!("127.0.0.1:{}", free_port()), "--lun", "ram:1MiB", "--control"])
        .arg(open.join("control.sock"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("others can write") && err.contains(&open.display().to_string()), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn riserctl_prints_tables_and_fails_with_the_error() {
    let dir = private_dir("ctl");
    let socket = dir.join("control.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_riser-target"))
        .args(["--portal", &format!("127.0.0.1:{}", free_port()), "--lun", "ram:4MiB", "--control"])
        .arg(&socket)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !socket.exists() {
        assert!(t0.elapsed() < Duration::from_secs(20), "no control socket");
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = riserctl(&socket, &["store_list"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.starts_with("STORE") && text.contains("lun0") && text.contains("ram:4MiB"), "{text}");
    let out = riserctl(&socket, &["store_add", "name=x", "backing=ram:1MiB"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = riserctl(&socket, &["lun_add", "target=iqn.2026-11.io.riser:none", "lun=1", "store=x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no target named"), "{}", String::from_utf8_lossy(&out.stderr));
    let out = riserctl(&socket, &["no_such_method"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("-32601"));
    signal(&child, "TERM");
    assert!(exit_within(&mut child, Duration::from_secs(20)).is_some_and(|s| s.success()));
    std::fs::remove_dir_all(&dir).unwrap();
}
