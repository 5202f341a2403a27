//! riser-initiator with several paths to one unit (`--path`): two in-process riser targets
//! export one shared RAM store (two logical units of one identity over one backend), each in a
//! portal group, relative port and ALUA target port group of its own, as two gateways would.
//! `riser-initiator verify URL --path URL` runs over both as one multipath handle: it prints the
//! paths and their access states, sends the I/O where ALUA says, verifies the data and prints
//! its counters; a path to another unit is refused.

use riser::target::backend::RamBackend;
use riser::target::lu::{AccessState, LogicalUnit, LuIdentity, TargetPortGroup};
use riser::target::server::{Node, Portal, PortalGroup, Target, TargetConfig};
use std::net::SocketAddr;
use std::sync::Arc;

const TARGET: &str = "iqn.2026-11.io.riser:cli-mpath";
const BLOCK: u32 = 512;
const BYTES: u64 = 16 << 20;

/// One gateway: a target serving the shared unit as LUN 0 in portal group `group` (also its
/// relative port and target port group).
struct Gateway {
    target: Arc<Target>,
    lu: Arc<LogicalUnit>,
    addr: SocketAddr,
}

impl Gateway {
    async fn start(backend: &Arc<RamBackend>, identity: &LuIdentity, group: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let lu = Arc::new(LogicalUnit::new(backend.clone(), identity.clone()));
        let node = Node::new(TARGET)
            .lun(lu.clone())
            .portal_group(PortalGroup::new(group).relative_port(group).port_group(group).portal(Portal::tcp(addr)));
        let target = Target::new(TargetConfig::default().node(node));
        tokio::spawn(target.clone().serve(listener));
        let g = Self { target, lu, addr };
        g.set_states(AccessState::ActiveOptimized, AccessState::ActiveOptimized);
        g
    }

    /// The access states of groups 1 and 2 as this gateway reports them.
    fn set_states(&self, group1: AccessState, group2: AccessState) {
        self.lu.set_port_groups(vec![TargetPortGroup::new(1, [1], group1), TargetPortGroup::new(2, [2], group2)]).unwrap();
    }

    fn url(&self) -> String {
        format!("iscsi://{}/{TARGET}/0", self.addr)
    }

    fn commands(&self) -> u64 {
        self.target.stats().luns.values().map(|l| l.total_commands()).sum()
    }
}

/// Run riser-initiator with `args`: (success, stdout, stderr).
async fn initiator(args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_riser-initiator")).args(args).output().await.unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The line of `out` that starts (after indentation) with `prefix`.
fn line<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines().find(|l| l.trim_start().starts_with(prefix)).unwrap_or_else(|| panic!("no line {prefix:?} in:\n{out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verify_over_two_paths_follows_alua_and_prints_paths_and_counters() {
    let backend = Arc::new(RamBackend::new(BYTES, BLOCK));
    let identity = LuIdentity::random();
    let a = Gateway::start(&backend, &identity, 1).await;
    let b = Gateway::start(&backend, &identity, 2).await;
    let (ua, ub) = (a.url(), b.url());
    let verify = |seed: &'static str| {
        let (ua, ub) = (ua.clone(), ub.clone());
        async move {
            let args = ["verify", &ua, "--path", &ub, "--size", "4MiB", "--block-size", "64KiB", "--queue-depth", "8", "--seed", seed];
            initiator(&args).await
        }
    };

    // Both groups active/optimized: the I/O (64 writes, 64 reads) goes round robin over both.
    let before = (a.commands(), b.commands());
    let (ok, out, err) = verify("7").await;
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(line(&out, "multipath: 2 paths to unit naa.").contains("REPORT TARGET PORT GROUPS"), "{out}");
    let (p0, p1) = (line(&out, "path 0:"), line(&out, "path 1:"));
    assert!(p0.contains(&a.addr.to_string()) && p0.contains("up, target port group 1, relative port 1, active/optimized"), "{p0}");
    assert!(p1.contains(&b.addr.to_string()) && p1.contains("up, target port group 2, relative port 2, active/optimized"), "{p1}");
    assert!(line(&out, "read 4 MiB").ends_with(", verified"), "{out}");
    let stats = line(&out, "multipath: path_failures=");
    assert!(stats.starts_with("multipath: path_failures=0 reissued_reads=0 reissued_writes=0 writes_in_doubt=0 alua_reports="), "{stats}");
    let (da, db) = (a.commands() - before.0, b.commands() - before.1);
    assert!(da >= 40 && db >= 40, "both paths carry I/O: {da} and {db} commands");

    // Group 1 active/non-optimized, group 2 active/optimized: the I/O goes through b only.
    a.set_states(AccessState::ActiveNonOptimized, AccessState::ActiveOptimized);
    b.set_states(AccessState::ActiveNonOptimized, AccessState::ActiveOptimized);
    let before = (a.commands(), b.commands());
    let (ok, out, err) = verify("8").await;
    assert!(ok, "stdout:\n{out}\nstderr:\n{err}");
    assert!(line(&out, "path 0:").ends_with("active/non-optimized"), "{out}");
    assert!(line(&out, "path 1:").ends_with(", active/optimized"), "{out}");
    assert!(line(&out, "read 4 MiB").ends_with(", verified"), "{out}");
    let (da, db) = (a.commands() - before.0, b.commands() - before.1);
    assert!(db >= 128 && da < 16, "the optimized path carries the I/O: {da} commands on a, {db} on b");

    // The data is the store's, whichever path wrote it: a single-path verify through a reads the
    // pattern the multipath run wrote.
    let (ok, out, err) = initiator(&["verify", &ua, "--size", "4MiB", "--queue-depth", "4", "--seed", "8"]).await;
    assert!(ok && !out.contains("multipath"), "stdout:\n{out}\nstderr:\n{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_path_to_another_unit_is_refused() {
    let one = Gateway::start(&Arc::new(RamBackend::new(BYTES, BLOCK)), &LuIdentity::random(), 1).await;
    let other = Gateway::start(&Arc::new(RamBackend::new(BYTES, BLOCK)), &LuIdentity::random(), 2).await;
    let (ok, out, err) = initiator(&["verify", &one.url(), "--path", &other.url(), "--size", "1MiB"]).await;
    assert!(!ok && err.contains("different units"), "stdout:\n{out}\nstderr:\n{err}");
    // --path is for the I/O commands; discovery, luns and inquiry take one URL.
    let (ok, _, err) = initiator(&["inquiry", &one.url(), "--path", &one.url()]).await;
    assert!(!ok && err.contains("takes one URL"), "{err}");
    // Every path names its target and LUN.
    let (ok, _, err) = initiator(&["verify", &one.url(), "--path", &format!("iscsi://{}", other.addr)]).await;
    assert!(!ok && err.contains("every path needs"), "{err}");
}
