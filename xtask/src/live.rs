//! `cargo xtask bench --live [--reps N] [--seconds S] [--interval-ms M]`: what live changes cost
//! the sessions they do not concern. One session reads 4 KiB blocks at random (queue depth 8)
//! from a target's LUN while, in every other round, another target is changed through the
//! control socket, one change every M ms (20): stores added, exported, resized, unexported and
//! removed, ACL entries added and removed. Quiet and changing rounds alternate. Prints the
//! medians of each kind's p99 latency and IOPS, and their ratio (the goal: p99 during changes
//! within 2× of without). The changes go over one connection to the socket (a riserctl process
//! per change would measure process start-up on this 2-core machine, not the target).

use crate::{RunningTarget, arg_value, build_examples, median, root};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const IQN: &str = "iqn.2026-11.io.riser:live";
const OTHER: &str = "iqn.2026-11.io.riser:live-other";

fn riserctl(socket: &std::path::Path, args: &[&str]) -> Result<(), String> {
    let out = Command::new(root().join("target/release/examples/riserctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if out.status.success() { Ok(()) } else { Err(format!("riserctl {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr))) }
}

/// One JSON-RPC connection to the control socket.
struct Control {
    writer: std::os::unix::net::UnixStream,
    reader: std::io::BufReader<std::os::unix::net::UnixStream>,
    id: u64,
}

impl Control {
    fn connect(socket: &std::path::Path) -> Result<Self, String> {
        let s = std::os::unix::net::UnixStream::connect(socket).map_err(|e| e.to_string())?;
        Ok(Self { reader: std::io::BufReader::new(s.try_clone().map_err(|e| e.to_string())?), writer: s, id: 0 })
    }

    /// Call `method` with `params` (a JSON object's text); an error answer is an error.
    fn call(&mut self, method: &str, params: &str) -> Result<(), String> {
        use std::io::{BufRead as _, Write as _};
        self.id += 1;
        writeln!(self.writer, r#"{{"jsonrpc":"2.0","id":{},"method":"{method}","params":{params}}}"#, self.id)
            .map_err(|e| e.to_string())?;
        let mut line = String::new();
        self.reader.read_line(&mut line).map_err(|e| e.to_string())?;
        if line.contains(r#""error""#) { Err(format!("{method} {params}: {line}")) } else { Ok(()) }
    }
}

/// One round of the load: (p99 µs, IOPS).
fn load(port: u16, seconds: u32) -> Result<(f64, f64), String> {
    let out = Command::new(root().join("target/release/examples/initiator"))
        .args(["load", &format!("iscsi://127.0.0.1:{port}/{IQN}/0"), "--rw", "randread", "--block-size", "4KiB", "--queue-depth", "8"])
        .args(["--size", "256MiB", "--seconds", &seconds.to_string()])
        .output()
        .map_err(|e| e.to_string())?;
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |k: &str| text.split_whitespace().find_map(|w| w.strip_prefix(k)).and_then(|v| v.parse::<f64>().ok());
    match (field("p99_us="), field("iops=")) {
        (Some(p), Some(i)) => Ok((p, i)),
        _ => Err(format!("initiator load: {text}{}", String::from_utf8_lossy(&out.stderr))),
    }
}

pub(crate) fn bench_live(args: &[String]) -> Result<(), String> {
    let reps: usize = arg_value(args, "--reps").and_then(|r| r.parse().ok()).unwrap_or(5);
    let seconds: u32 = arg_value(args, "--seconds").and_then(|r| r.parse().ok()).unwrap_or(4);
    let interval = std::time::Duration::from_millis(arg_value(args, "--interval-ms").and_then(|r| r.parse().ok()).unwrap_or(20));
    build_examples()?;
    let dir = std::env::temp_dir().join(format!("riser-live-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).map_err(|e| e.to_string())?;
    }
    let socket = dir.join("control.sock");
    let socket_text = socket.display().to_string();
    let target = RunningTarget::start(&["--target-name", IQN, "--lun", "ram:256MiB", "--control", &socket_text])?;
    riserctl(&socket, &["target_add", &format!("name={OTHER}"), "open=true"])?;
    let (mut quiet, mut busy) = (Vec::new(), Vec::new());
    let mut changes_per_s = Vec::new();
    for rep in 0..reps {
        quiet.push(load(target.port, seconds)?);
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let changer = std::thread::spawn({
            let (stop, done, socket) = (stop.clone(), done.clone(), socket.clone());
            move || -> Result<(), String> {
                let mut c = Control::connect(&socket)?;
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let s = format!("s{rep}x{i}");
                    let lun = i % 64 + 1;
                    for (method, params) in [
                        ("store_add", format!(r#"{{"name":"{s}","backing":"ram:16MiB"}}"#)),
                        ("lun_add", format!(r#"{{"target":"{OTHER}","lun":{lun},"store":"{s}"}}"#)),
                        ("store_resize", format!(r#"{{"name":"{s}","size":"32MiB"}}"#)),
                        ("acl_add", format!(r#"{{"target":"{OTHER}","initiator":"iqn.2026-11.io.riser:live-x"}}"#)),
                        ("acl_remove", format!(r#"{{"target":"{OTHER}","initiator":"iqn.2026-11.io.riser:live-x"}}"#)),
                        ("lun_remove", format!(r#"{{"target":"{OTHER}","lun":{lun}}}"#)),
                        ("store_remove", format!(r#"{{"name":"{s}"}}"#)),
                    ] {
                        // A sequence is always finished, so every round starts from the same state.
                        c.call(method, &params)?;
                        done.fetch_add(1, Ordering::Relaxed);
                        std::thread::sleep(interval);
                    }
                    i += 1;
                }
                Ok(())
            }
        });
        let t0 = std::time::Instant::now();
        let r = load(target.port, seconds);
        stop.store(true, Ordering::Relaxed);
        changer.join().map_err(|_| "the changer panicked")??;
        changes_per_s.push(done.load(Ordering::Relaxed) as f64 / t0.elapsed().as_secs_f64());
        busy.push(r?);
    }
    drop(target);
    let _ = std::fs::remove_dir_all(&dir);
    let p99 = |v: &[(f64, f64)]| median(v.iter().map(|x| x.0).collect());
    let iops = |v: &[(f64, f64)]| median(v.iter().map(|x| x.1).collect());
    println!(
        "== live changes on another target (one every {} ms) while one session reads 4 KiB at QD 8 ({reps} rounds of {seconds} s each kind, alternating)",
        interval.as_millis()
    );
    println!("{:<22} {:>10} {:>10}", "", "p99 µs", "IOPS");
    println!("{:<22} {:>10.1} {:>10.0}", "quiet", p99(&quiet), iops(&quiet));
    println!("{:<22} {:>10.1} {:>10.0}", "during changes", p99(&busy), iops(&busy));
    println!("p99 during changes / quiet: {:.2}x (goal ≤ 2x); {:.0} changes per second", p99(&busy) / p99(&quiet), median(changes_per_s));
    Ok(())
}
