//! Shared test support: a Ceph cluster for the whole test binary, a tiny executor, random data.
//!
//! `CEPH_CONF` set: use that cluster. Otherwise, when `ceph-up.sh` (`$RISER_SHARED/ceph/` or
//! `/work/shared/ceph/`) and `ceph-mon` exist, start a private cluster once per test binary
//! (its own directory and port) and stop it when the process exits. Otherwise tests print
//! "skipped: no Ceph" and return.

#![allow(dead_code)]

use std::future::Future;
use std::path::PathBuf;
use std::pin::pin;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Wake};
use std::thread::Thread;
use std::time::{Duration, Instant};

use riser_rbd::{Cluster, ClusterOptions, Image, Ioctx};

pub(crate) const POOL: &str = "rbd";

struct Env {
    conf: PathBuf,
}

static ENV: OnceLock<Option<Env>> = OnceLock::new();
static STARTED: OnceLock<(PathBuf, String, PathBuf)> = OnceLock::new();

fn shared_script(name: &str) -> Option<PathBuf> {
    let dirs = std::env::var_os("RISER_SHARED").map(PathBuf::from).into_iter().chain([PathBuf::from("/work/shared")]);
    dirs.map(|d| d.join("ceph").join(name)).find(|p| p.exists())
}

fn on_path(bin: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(bin).exists()))
}

extern "C" fn stop_cluster() {
    if let Some((script, port, dir)) = STARTED.get() {
        let _ = Command::new(script).env("CEPH_DIR", dir).env("CEPH_PORT", port).status();
    }
}

fn setup() -> Option<Env> {
    if let Some(conf) = std::env::var_os("CEPH_CONF") {
        return Some(Env { conf: conf.into() });
    }
    let up = shared_script("ceph-up.sh")?;
    let down = shared_script("ceph-down.sh")?;
    if !on_path("ceph-mon") {
        return None;
    }
    // A private cluster per test binary: directory and port from the pid.
    let pid = std::process::id();
    let dir = PathBuf::from(format!("/tmp/riser-ceph-rbdtest-{pid}"));
    let port = (20000 + (pid % 200) * 100).to_string();
    let t = Instant::now();
    let out = Command::new(&up).env("CEPH_DIR", &dir).env("CEPH_PORT", &port).output().ok()?;
    let _ = STARTED.set((down, port, dir));
    // SAFETY: registers a plain extern "C" fn without arguments, run once at process exit.
    #[allow(unsafe_code)]
    unsafe {
        libc::atexit(stop_cluster);
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let conf = stdout.lines().find_map(|l| l.strip_prefix("CEPH_CONF="))?;
    eprintln!("started a private Ceph cluster in {:?} ({conf})", t.elapsed());
    Some(Env { conf: conf.trim().into() })
}

/// The cluster's configuration file, or `None` (and a "skipped" line) without Ceph.
pub(crate) fn ceph_conf(test: &str) -> Option<PathBuf> {
    let env = ENV.get_or_init(setup);
    match env {
        Some(e) => Some(e.conf.clone()),
        None => {
            eprintln!("{test}: skipped: no Ceph (set CEPH_CONF or install ceph-mon and /work/shared/ceph)");
            None
        }
    }
}

pub(crate) fn options(conf: &std::path::Path) -> ClusterOptions {
    ClusterOptions::for_lun_serving(Some(conf.to_path_buf()))
}

pub(crate) fn connect(conf: &std::path::Path) -> Arc<Cluster> {
    Cluster::connect(&options(conf)).expect("connect")
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A unique name for this process and test.
pub(crate) fn unique(prefix: &str) -> String {
    format!("{prefix}-{}-{}", std::process::id(), SEQ.fetch_add(1, Ordering::Relaxed))
}

/// Creates a fresh image of `size` bytes and opens it.
pub(crate) fn fresh_image(io: &Ioctx, prefix: &str, size: u64) -> (String, Image) {
    let name = unique(prefix);
    Image::create(io, &name, size).expect("create image");
    let img = Image::open(io, &name).expect("open image");
    (name, img)
}

struct ThreadWaker(Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Runs a future to completion on this thread, giving up after `timeout`.
pub(crate) fn block_on_timeout<F: Future>(fut: F, timeout: Duration) -> Option<F::Output> {
    let waker = Arc::new(ThreadWaker(std::thread::current())).into();
    let mut cx = Context::from_waker(&waker);
    let mut fut = pin!(fut);
    let deadline = Instant::now() + timeout;
    loop {
        if let Poll::Ready(v) = fut.as_mut().poll(&mut cx) {
            return Some(v);
        }
        let now = Instant::now();
        if now >= deadline {
            return None;
        }
        std::thread::park_timeout(deadline - now);
    }
}

/// Runs a future to completion (30 s at most, then panics: a hung request is a failure).
pub(crate) fn block_on<F: Future>(fut: F) -> F::Output {
    block_on_timeout(fut, Duration::from_secs(30)).expect("request did not complete within 30 s")
}

/// Deterministic pseudo-random bytes (xorshift64*).
pub(crate) fn random_bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Polls `cond` every 20 ms until it holds or `timeout` passes.
pub(crate) fn wait_until(timeout: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
