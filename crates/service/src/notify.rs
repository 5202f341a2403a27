//! systemd's readiness protocol (`sd_notify`): a datagram to `$NOTIFY_SOCKET` saying `READY=1`
//! once the portals listen, `RELOADING=1` while a SIGHUP is applied, `STOPPING=1` when the
//! drain starts, and `STATUS=...` along the way. Without `$NOTIFY_SOCKET` (not started by
//! systemd) nothing is sent.
//!
//! Written here rather than taken from a crate: it is one datagram on a unix socket, which the
//! standard library sends (abstract socket names included), and the crates that do it link libc
//! or libsystemd for no more than that.

use std::os::unix::net::UnixDatagram;

/// Send `state` (`KEY=VALUE` lines) to the service manager, if one listens. Errors are returned
/// for the caller to log: a missing manager is not one.
pub fn notify(state: &str) -> std::io::Result<()> {
    match std::env::var_os("NOTIFY_SOCKET") {
        Some(socket) => notify_to(&socket, state),
        None => Ok(()),
    }
}

/// Send `state` to the socket `socket` names: a path, or `@name` in the abstract namespace.
pub fn notify_to(socket: &std::ffi::OsStr, state: &str) -> std::io::Result<()> {
    let path = socket;
    let sock = UnixDatagram::unbound()?;
    let bytes = path.as_encoded_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt as _;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(state.as_bytes(), &addr)?;
    } else {
        sock.send_to(state.as_bytes(), path)?;
    }
    Ok(())
}

/// [`notify`], logging a failure.
pub fn tell(state: &str) {
    if let Err(e) = notify(state) {
        tracing::warn!("cannot notify the service manager ({state}): {e}");
    }
}

/// `RELOADING=1` with the monotonic time systemd's `Type=notify-reload` wants beside it.
pub fn reloading() -> String {
    let t = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|u| u.parse::<f64>().ok()))
        .unwrap_or(0.0);
    format!("RELOADING=1\nMONOTONIC_USEC={}", (t * 1e6) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_state_reaches_a_path_or_an_abstract_socket() {
        let dir = std::env::temp_dir().join(format!("riser-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let rx = UnixDatagram::bind(&path).unwrap();
        notify_to(path.as_os_str(), "READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 64];
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1\nSTATUS=serving");
        std::fs::remove_dir_all(&dir).unwrap();

        use std::os::linux::net::SocketAddrExt as _;
        let name = format!("riser-notify-test-{}", std::process::id());
        let rx = UnixDatagram::bind_addr(&std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        notify_to(std::ffi::OsStr::new(&format!("@{name}")), "STOPPING=1").unwrap();
        let n = rx.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"STOPPING=1");
        assert!(reloading().starts_with("RELOADING=1\nMONOTONIC_USEC="));
    }
}
