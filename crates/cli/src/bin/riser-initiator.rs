//! riser's iSCSI initiator (installed as `riser-initiator`; also the example `initiator`).
//!
//! ```text
//! riser-initiator COMMAND URL [options]      (or: cargo run --release --example initiator -- ...)
//!   URL: iscsi://HOST[:PORT]/TARGET_IQN/LUN   (or iscsi://HOST[:PORT] for discover)
//!        iser://HOST[:PORT]/TARGET_IQN/LUN    iSER (default port 3262 on the software iWARP RNIC,
//!                                             3260 with --rdma-provider rdma-core)
//!   COMMAND: discover | luns | inquiry | readcap | read | write | verify | bench | load | soak
//!   (luns: every LUN the target shows this initiator, REPORT LUNS, with capacity and serial)
//!   (load: --seconds of --rw read|write|randread|randwrite requests, --queue-depth in flight,
//!    over the first --size bytes; prints IOPS, MiB/s and latency percentiles (HdrHistogram),
//!    --latency-cdf FILE writes the latency distribution as CSV)
//!   (soak: --seconds of write/read-back/compare rounds that ride out connection losses)
//!   [--path URL]...  a further path to the same unit (another portal, its target and LUN there):
//!    the URL and every --path form one multipath handle (riser_initiator::Multipath) that
//!    follows the ALUA states and fails over; for readcap, read, write, verify, bench, load, soak
//!   [--rdma-provider soft|rdma-core] [--rdma-keys auto|windows|per-region|fixed-pool]
//!   [--chap-file PATH] [--mutual-chap-file PATH]
//!   [--iser-param signal_every=N|send_depth=N]...
//!   [--busy-poll-us N]  poll each connection's socket (iscsi://, or iser:// on the software
//!    RNIC) for up to N µs before sleeping (lower latency at low queue depth, for CPU while
//!    waiting; default off)
//!   [--param KEY=VALUE]... (MaxRecvDataSegmentLength, MaxBurstLength, FirstBurstLength, ImmediateData, InitialR2T)
//! ```
//!
//! CHAP: the credentials come from `--chap-file` (a file only its owner may access, `chmod
//! 600`, as ssh requires of a private key), else from `RISER_CHAP`; the target's expected
//! credentials for mutual CHAP from `--mutual-chap-file`, else `RISER_MUTUAL_CHAP`. Either holds
//! `USER:SECRET` on one line, or the user and the secret on two lines (for a user name with a
//! `:`); empty lines and lines starting with `#` are skipped. `--chap USER:SECRET` and
//! `--mutual-chap` still work but warn: any user of the machine can read a command line.

use bytes::{Bytes, BytesMut};
use clap::Parser;
use riser::initiator::alua::AccessState;
use riser::initiator::{Error, IserConnector, Lun, Multipath, MultipathConfig, PathSpec, Session, SessionConfig, discover_via};
use riser::iser::IserConfig;
use riser::iwarp::SoftRnic;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// No `Debug`: it may hold secrets.
#[derive(Parser)]
#[command(about = "riser iSCSI initiator")]
struct Args {
    /// discover, luns, inquiry, readcap, read, write, verify, bench, load or soak.
    command: String,
    /// iscsi://HOST[:PORT]/TARGET_IQN/LUN, or iser://HOST[:PORT]/TARGET_IQN/LUN
    url: String,
    /// A further path to the same unit (repeatable): iscsi://HOST[:PORT]/TARGET_IQN/LUN (or
    /// iser://, as the URL). The URL and every --path then form one multipath handle: it checks
    /// they reach one unit, prints each path's ALUA state, sends I/O to the active/optimized
    /// paths, fails over when one dies, and prints its counters at the end. For readcap, read,
    /// write, verify, bench, load and soak.
    #[arg(long = "path", value_name = "URL")]
    paths: Vec<String>,
    /// Bytes to read, write or verify (suffixes KiB, MiB, GiB).
    #[arg(long, default_value = "64MiB")]
    size: String,
    /// Size of each I/O request.
    #[arg(long, default_value = "256KiB")]
    block_size: String,
    /// Requests in flight.
    #[arg(long, default_value_t = 8)]
    queue_depth: usize,
    /// Byte offset on the LUN.
    #[arg(long, default_value = "0")]
    offset: String,
    /// Seconds per bench measurement, of a load or of a soak.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Our initiator name.
    #[arg(long, default_value = "iqn.2026-11.io.riser:initiator")]
    initiator_name: String,
    /// CHAP credentials. Visible to every user of the machine: prefer --chap-file or RISER_CHAP.
    #[arg(long, value_name = "USER:SECRET")]
    chap: Option<String>,
    /// A file (mode 600) with the CHAP credentials: USER:SECRET, or USER and SECRET on two lines.
    #[arg(long, value_name = "PATH")]
    chap_file: Option<std::path::PathBuf>,
    /// Credentials expected from the target (mutual CHAP). Visible to every user of the
    /// machine: prefer --mutual-chap-file or RISER_MUTUAL_CHAP.
    #[arg(long, value_name = "USER:SECRET")]
    mutual_chap: Option<String>,
    /// A file (mode 600) with the credentials expected from the target (mutual CHAP).
    #[arg(long, value_name = "PATH")]
    mutual_chap_file: Option<std::path::PathBuf>,
    /// read: write the data to this file (default: only report).
    #[arg(long)]
    output: Option<std::path::PathBuf>,
    /// write: data from this file (default: a seeded pattern).
    #[arg(long)]
    input: Option<std::path::PathBuf>,
    /// load: read, write, randread or randwrite.
    #[arg(long, default_value = "randread")]
    rw: String,
    /// load: write the latency distribution here (CSV: percentile, microseconds).
    #[arg(long, value_name = "PATH")]
    latency_cdf: Option<std::path::PathBuf>,
    /// Pattern seed for write/verify.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// RDMA provider for iser:// URLs: soft (riser's software iWARP RNIC) or rdma-core (the
    /// RDMA device the route to the target leaves through; needs a build with `rdma-core`).
    #[arg(long, default_value = "soft", value_name = "soft|rdma-core")]
    rdma_provider: String,
    /// rdma-core: how the command buffers are keyed (auto: memory windows where the device binds
    /// them, else a registration per command; fixed-pool: one key per connection, weaker).
    #[arg(long, value_name = "MODE")]
    rdma_keys: Option<String>,
    /// An operational key offered in login (repeatable): MaxRecvDataSegmentLength,
    /// MaxBurstLength, FirstBurstLength (sizes), ImmediateData, InitialR2T (Yes/No).
    #[arg(long, value_name = "KEY=VALUE")]
    param: Vec<String>,
    /// An iSER datamover setting (repeatable): signal_every (requests per signaled one),
    /// send_depth (send queue entries).
    #[arg(long, value_name = "KEY=VALUE")]
    iser_param: Vec<String>,
    /// Busy polling, in microseconds (iscsi://, and iser:// on the software RNIC). A connection
    /// whose socket runs dry keeps looking for the next bytes this long before it sleeps: lower
    /// latency at low queue depth (no wake-up per answer), for CPU while waiting. Default: off.
    #[arg(long, value_name = "MICROSECONDS")]
    busy_poll_us: Option<u64>,
}

struct Url {
    iser: bool,
    host: String,
    target: Option<String>,
    lun: Lun,
}

fn parse_url(u: &str, provider: riser::cli::RdmaProvider) -> Result<Url, String> {
    let (iser, rest) = match (u.strip_prefix("iscsi://"), u.strip_prefix("iser://")) {
        (Some(r), _) => (false, r),
        (_, Some(r)) => (true, r),
        _ => return Err("URL must start with iscsi:// (TCP) or iser:// (iSER)".into()),
    };
    let mut parts = rest.splitn(3, '/');
    let host = parts.next().unwrap_or_default().to_string();
    if host.is_empty() {
        return Err("URL has no host".into());
    }
    // iSER on the software RNIC listens on its own TCP port (3262 by convention), since the TCP
    // portal holds 3260 on the same address; on an RDMA device iSER uses 3260 as Linux does.
    let host = riser::cli::with_default_port(&host, if iser { provider.default_port() } else { 3260 });
    let target = parts.next().filter(|t| !t.is_empty()).map(str::to_string);
    let lun = match parts.next() {
        Some(l) if !l.is_empty() => {
            let n: u16 = l.parse().map_err(|_| format!("bad LUN {l:?}"))?;
            Lun::try_from(n).map_err(|e| e.to_string())?
        }
        _ => Lun::ZERO,
    };
    Ok(Url { iser, host, target, lun })
}

/// A seeded pattern for `len` bytes at byte `offset` of the LUN, so any range can be
/// regenerated for comparison: each 64-byte line of the LUN from a hash of its index and the
/// seed, its eight words that value plus a step each. Cheap (about a third of an instruction
/// per byte), so a write's client measures the data path more than its own data: a
/// xorshift per 8 bytes cost about 170 000 instructions per 64 KiB written, several times
/// what the data path spends on it.
fn pattern(seed: u64, offset: u64, len: usize) -> Bytes {
    let first = offset / PATTERN_LINE as u64;
    let skip = (offset % PATTERN_LINE as u64) as usize;
    let mut v = vec![0u8; (skip + len).div_ceil(PATTERN_LINE) * PATTERN_LINE];
    pattern_lines(seed, first, &mut v);
    v.truncate(skip + len);
    let b = Bytes::from(v);
    if skip == 0 { b } else { b.slice(skip..) }
}

/// The unit of [`pattern`]: a line's eight words come from one hash.
const PATTERN_LINE: usize = 64;

/// [`pattern`]'s lines from line `first` on, over the whole of `out` (whole lines).
fn pattern_lines(seed: u64, first: u64, out: &mut [u8]) {
    for (k, line) in out.chunks_exact_mut(PATTERN_LINE).enumerate() {
        let mut h = (first + k as u64) ^ seed.rotate_left(32);
        h = h.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        h ^= h >> 29;
        for (j, word) in line.chunks_exact_mut(8).enumerate() {
            word.copy_from_slice(&h.wrapping_add((j as u64).wrapping_mul(0xd6e8_feb8_6659_fd93)).to_le_bytes());
        }
    }
}

/// The first of the oldest `kept` buffers nothing else holds any more (taken out of the
/// queue), if any: a few tries, the oldest first (a write's own buffer is let go of in order).
fn reclaim(kept: &mut std::collections::VecDeque<Bytes>) -> Option<BytesMut> {
    for _ in 0..kept.len().min(4) {
        match kept.pop_front()?.try_into_mut() {
            Ok(b) => return Some(b),
            Err(held) => kept.push_back(held),
        }
    }
    None
}

/// [`pattern`] in `buf` (made `len` long): a buffer of an earlier write, taken back once the
/// session let go of it, is filled where it lies. A fresh allocation per write cost more than
/// the pattern: the allocator hands large buffers back to the kernel and the next write
/// page-faults them in again (9–14 faults per 256 KiB write, 15–20 % of the client's CPU).
fn pattern_into(buf: &mut BytesMut, seed: u64, offset: u64, len: usize) {
    if !offset.is_multiple_of(PATTERN_LINE as u64) || !len.is_multiple_of(PATTERN_LINE) {
        buf.clear();
        buf.extend_from_slice(&pattern(seed, offset, len));
        return;
    }
    buf.resize(len, 0);
    pattern_lines(seed, offset / PATTERN_LINE as u64, buf);
}

fn fmt_err(e: Error) -> String {
    e.to_string()
}

/// Where the I/O commands go: one session's LUN, or a multipath handle over the URL and every
/// `--path` (one unit through several portals).
#[derive(Clone)]
enum Dev {
    One(Session, Lun),
    Multi(Multipath),
}

impl Dev {
    async fn read(&self, lba: u64, blocks: u32, bs: u32) -> Result<Bytes, String> {
        match self {
            Self::One(s, lun) => s.read(*lun, lba, blocks, bs).await.map_err(fmt_err),
            Self::Multi(m) => m.read(lba, blocks, bs).await.map_err(|e| e.to_string()),
        }
    }

    async fn write(&self, lba: u64, data: Bytes, bs: u32) -> Result<(), String> {
        match self {
            Self::One(s, lun) => s.write(*lun, lba, data, bs).await.map_err(fmt_err),
            Self::Multi(m) => m.write(lba, data, bs).await.map_err(|e| e.to_string()),
        }
    }

    async fn read_capacity(&self) -> Result<(u64, u32), String> {
        match self {
            Self::One(s, lun) => s.read_capacity(*lun).await.map_err(fmt_err),
            Self::Multi(m) => m.read_capacity().await.map_err(|e| e.to_string()),
        }
    }

    /// Hand a read's buffer back for reuse (a single session's pool).
    fn recycle(&self, d: Bytes) {
        if let Self::One(s, _) = self {
            s.recycle(d);
        }
    }

    /// Log out; a multipath handle prints its counters first.
    async fn close(&self) -> Result<(), String> {
        match self {
            Self::One(s, _) => s.logout().await.map_err(fmt_err),
            Self::Multi(m) => {
                let st = m.stats();
                println!(
                    "multipath: path_failures={} reissued_reads={} reissued_writes={} writes_in_doubt={} alua_reports={} paths_restored={}",
                    st.path_failures, st.reissued_reads, st.reissued_writes, st.writes_in_doubt, st.alua_reports, st.paths_restored
                );
                m.close().await;
                Ok(())
            }
        }
    }
}

/// An access state as SPC-5 names it.
fn state_name(s: Option<AccessState>) -> String {
    match s {
        Some(AccessState::ActiveOptimized) => "active/optimized".into(),
        Some(AccessState::ActiveNonOptimized) => "active/non-optimized".into(),
        Some(AccessState::Standby) => "standby".into(),
        Some(AccessState::Unavailable) => "unavailable".into(),
        Some(AccessState::LbaDependent) => "logical block dependent".into(),
        Some(AccessState::Offline) => "offline".into(),
        Some(AccessState::Transitioning) => "transitioning".into(),
        Some(AccessState::Reserved(c)) => format!("reserved state {c:#x}"),
        None => "not reported".into(),
    }
}

/// Log in on every path (the URL, then each `--path`) as one multipath handle, and print the
/// paths and their access states.
async fn connect_multipath(urls: &[Url], cfg: SessionConfig) -> Result<Multipath, String> {
    let specs = urls
        .iter()
        .map(|u| {
            let target = u.target.clone().ok_or("every path needs iscsi://HOST[:PORT]/TARGET_IQN/LUN (or iser://...)")?;
            Ok(PathSpec::new(u.host.clone(), target, u.lun))
        })
        .collect::<Result<Vec<_>, String>>()?;
    let mp = Multipath::connect(specs, MultipathConfig::new(cfg)).await.map_err(|e| e.to_string())?;
    let naa: String = mp.naa().iter().map(|b| format!("{b:02x}")).collect();
    let alua = match mp.alua_supported() {
        Some(true) => "ALUA states from REPORT TARGET PORT GROUPS",
        Some(false) => "no REPORT TARGET PORT GROUPS: every path taken as active/optimized",
        None => "ALUA states not read yet: every path taken as active/optimized",
    };
    println!("multipath: {} paths to unit naa.{naa} ({alua})", urls.len());
    for (i, p) in mp.paths().iter().enumerate() {
        let opt = |v: Option<u16>| v.map_or("-".to_string(), |v| v.to_string());
        println!(
            "  path {i}: {} {} LUN {}: {}, target port group {}, relative port {}, {}",
            p.portal,
            p.target_name,
            p.lun.number().unwrap_or(0),
            if p.up { "up" } else { "down" },
            opt(p.group),
            opt(p.relative_port),
            state_name(p.state)
        );
    }
    Ok(mp)
}

/// Run `total` bytes of I/O in `io`-byte requests with `qd` in flight; `f(offset, len)`.
async fn pump<F, Fut>(total: u64, io: u64, qd: usize, f: F) -> Result<(), String>
where
    F: Fn(u64, usize) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), String>> + Send,
{
    let f = Arc::new(f);
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = Vec::new();
    for _ in 0..qd.max(1) {
        let (f, next) = (f.clone(), next.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let at = next.fetch_add(io, std::sync::atomic::Ordering::Relaxed);
                if at >= total {
                    return Ok::<(), String>(());
                }
                f(at, io.min(total - at) as usize).await?;
            }
        }));
    }
    for w in workers {
        w.await.map_err(|e| e.to_string())??;
    }
    Ok(())
}

/// iSER through the RDMA device the route to `host` leaves through (rdma-core).
#[cfg(feature = "rdma-core")]
async fn rdma_core_connector(host: &str, keys: Option<&str>, iser: IserConfig) -> Result<Arc<dyn riser::initiator::Connector>, String> {
    use riser::verbs::Provider;
    use riser::verbs::rdma_core::{RdmaCore, RdmaCoreConfig};
    let addr = tokio::net::lookup_host(host).await.map_err(|e| format!("{host}: {e}"))?.next().ok_or("no address")?;
    let rc = RdmaCoreConfig { keys: keys.map(riser::cli::parse_key_mode).transpose()?.unwrap_or_default(), ..RdmaCoreConfig::default() };
    let dev = tokio::task::spawn_blocking(move || RdmaCore::for_destination(addr, rc))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    eprintln!("iSER through {} ({:?} keys)", dev.name(), dev.key_mode());
    Ok(Arc::new(IserConnector::new(dev, iser)))
}

#[cfg(not(feature = "rdma-core"))]
async fn rdma_core_connector(_: &str, _: Option<&str>, _: IserConfig) -> Result<Arc<dyn riser::initiator::Connector>, String> {
    Err("this initiator was built without rdma-core support: build it with `--features rdma-core`".into())
}

#[tokio::main]
async fn main() {
    // Diagnostics (RUST_LOG=debug or trace) go to stderr; only warnings by default.
    riser::cli::init_tracing("warn");
    riser::cli::exit_on_error(run().await);
}

async fn run() -> Result<(), String> {
    let a = Args::parse();
    let provider = riser::cli::RdmaProvider::parse(&a.rdma_provider)?;
    let url = parse_url(&a.url, provider)?;
    let mut urls = vec![];
    for p in &a.paths {
        let u = parse_url(p, provider)?;
        if u.iser != url.iser {
            return Err(format!("--path {p}: every path takes the URL's transport (iscsi:// or iser://)"));
        }
        urls.push(u);
    }
    let mut cfg = SessionConfig::new(a.initiator_name.clone(), url.target.clone().unwrap_or_default());
    for kv in &a.param {
        riser::cli::set_operational(&mut cfg.login.operational, kv)?;
    }
    let chap = riser::cli::chap_credentials("--chap", a.chap.as_deref(), a.chap_file.as_deref(), "RISER_CHAP")?;
    let mutual =
        riser::cli::chap_credentials("--mutual-chap", a.mutual_chap.as_deref(), a.mutual_chap_file.as_deref(), "RISER_MUTUAL_CHAP")?;
    match chap {
        Some(c) => cfg = cfg.with_chap(c, mutual),
        None if mutual.is_some() => return Err("mutual CHAP needs CHAP (--chap-file or RISER_CHAP)".into()),
        None => {}
    }
    let mut iser = IserConfig::default();
    // Receives for the queue depth asked for and what else the target sends (at most 4096):
    // an iSER initiator keeps no more commands outstanding than its receives hold answers for.
    let wanted = u32::try_from(a.queue_depth).unwrap_or(u32::MAX).saturating_add(riser::iser::ANSWERS_RESERVED);
    iser.recv_depth = iser.recv_depth.max(wanted.min(4096));
    for kv in &a.iser_param {
        riser::cli::set_iser(&mut iser, kv)?;
    }
    if url.iser {
        if !urls.is_empty() && provider == riser::cli::RdmaProvider::RdmaCore {
            return Err("--path with --rdma-provider rdma-core is not supported: the RDMA device is chosen by the route to one host".into());
        }
        cfg.connector = match provider {
            riser::cli::RdmaProvider::Soft => Arc::new(IserConnector::new(SoftRnic::default(), iser)),
            riser::cli::RdmaProvider::RdmaCore => rdma_core_connector(&url.host, a.rdma_keys.as_deref(), iser).await?,
        };
    } else if a.rdma_keys.is_some() {
        return Err("--rdma-keys applies to iser:// URLs with --rdma-provider rdma-core".into());
    }
    match a.busy_poll_us {
        Some(_) if url.iser && provider == riser::cli::RdmaProvider::RdmaCore => {
            return Err("--busy-poll-us applies to iscsi:// URLs and to iser:// on the software RNIC".into());
        }
        Some(us) if url.iser => {
            let rnic = SoftRnic::new(riser::iwarp::RnicConfig::default().busy_poll(Some(Duration::from_micros(us))));
            cfg.connector = Arc::new(IserConnector::new(rnic, iser));
        }
        Some(us) => cfg.connector = Arc::new(riser::initiator::TcpConnector::default().busy_poll(Some(Duration::from_micros(us)))),
        None => {}
    }
    if !urls.is_empty() && matches!(a.command.as_str(), "discover" | "luns" | "inquiry") {
        return Err(format!("{} takes one URL: --path is for readcap, read, write, verify, bench, load and soak", a.command));
    }
    if a.command == "discover" {
        let addr = tokio::net::lookup_host(&url.host).await.map_err(|e| e.to_string())?.next().ok_or("no address")?;
        let found = discover_via(&*cfg.connector, addr, &a.initiator_name, cfg.login.auth.clone()).await.map_err(fmt_err)?;
        for (t, addrs) in found {
            println!("{t}");
            for ad in addrs {
                println!("    {ad}");
            }
        }
        return Ok(());
    }
    if url.target.is_none() {
        return Err("this command needs iscsi://HOST[:PORT]/TARGET_IQN/LUN (or iser://...)".into());
    }
    let dev = if urls.is_empty() {
        Dev::One(Session::connect(&url.host, cfg).await.map_err(fmt_err)?, url.lun)
    } else {
        urls.insert(0, url);
        Dev::Multi(connect_multipath(&urls, cfg).await?)
    };
    if let Dev::One(s, _) = &dev
        && a.command == "luns"
    {
        // REPORT LUNS, then each LUN's capacity and serial number.
        for l in s.report_luns().await.map_err(fmt_err)? {
            let (blocks, bs) = s.read_capacity(l).await.map_err(fmt_err)?;
            let serial = s.vpd(l, 0x80).await.map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default();
            println!(
                "LUN {}: {blocks} blocks of {bs} bytes ({} MiB) serial {serial}",
                l.number().unwrap_or(0),
                (blocks * u64::from(bs)) >> 20
            );
        }
        return Ok(());
    }
    let (blocks, bs) = dev.read_capacity().await?;
    let size = riser::cli::parse_size(&a.size)?;
    let io = riser::cli::parse_size(&a.block_size)?.max(u64::from(bs)) / u64::from(bs) * u64::from(bs);
    let offset = riser::cli::parse_size(&a.offset)?;
    if offset % u64::from(bs) != 0 {
        return Err(format!("--offset must be a multiple of the {bs}-byte block size"));
    }
    let capacity = blocks * u64::from(bs);
    let size = size.min(capacity.saturating_sub(offset)) / u64::from(bs) * u64::from(bs);
    match a.command.as_str() {
        "inquiry" => {
            let Dev::One(s, lun) = &dev else { unreachable!("inquiry takes one URL") };
            let lun = *lun;
            let i = s.inquiry(lun).await.map_err(fmt_err)?;
            println!("vendor: {}", String::from_utf8_lossy(&i.vendor).trim());
            println!("product: {}", String::from_utf8_lossy(&i.product).trim());
            println!("revision: {}", String::from_utf8_lossy(&i.revision).trim());
            println!("peripheral: {:#04x}  version: {:#04x}", i.peripheral, i.version);
            if let Ok(sn) = s.vpd(lun, 0x80).await {
                println!("serial: {}", String::from_utf8_lossy(&sn));
            }
        }
        "readcap" => println!("{blocks} blocks of {bs} bytes ({} MiB)", capacity >> 20),
        "read" | "write" | "verify" => {
            let start = Instant::now();
            let sess = dev.clone();
            let seed = a.seed;
            if a.command != "read" {
                let input = match &a.input {
                    Some(p) => Some(Bytes::from(std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?)),
                    None => None,
                };
                // Pattern buffers of earlier writes, taken again once the session has let go
                // of them (over iSER it may hold one a while after the write ended: an
                // unsignaled send keeps its memory until a later one completes). At most two
                // per command in flight.
                let spare: Arc<std::sync::Mutex<std::collections::VecDeque<Bytes>>> = Arc::default();
                let keep = 2 * a.queue_depth.max(1);
                pump(size, io, a.queue_depth, move |at, len| {
                    let sess = sess.clone();
                    let spare = spare.clone();
                    let data = match &input {
                        Some(d) => d.slice((at as usize).min(d.len())..(at as usize + len).min(d.len())),
                        None => {
                            let mut b = reclaim(&mut spare.lock().unwrap_or_else(|e| e.into_inner())).unwrap_or_default();
                            pattern_into(&mut b, seed, offset + at, len);
                            b.freeze()
                        }
                    };
                    let reuse = input.is_none().then(|| data.clone());
                    async move {
                        if data.len() % bs as usize != 0 || data.is_empty() {
                            return Err("input is not a whole number of blocks".into());
                        }
                        sess.write((offset + at) / u64::from(bs), data, bs).await?;
                        let mut q = spare.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(b) = reuse.filter(|_| q.len() < keep) {
                            q.push_back(b);
                        }
                        Ok(())
                    }
                })
                .await?;
                let t = start.elapsed().as_secs_f64();
                println!("wrote {} MiB in {t:.2} s ({:.1} MiB/s)", size >> 20, size as f64 / 1048576.0 / t);
            }
            if a.command != "write" {
                let start = Instant::now();
                let sess = dev.clone();
                let verify = a.command == "verify";
                let out = Arc::new(std::sync::Mutex::new(if a.output.is_some() { vec![0u8; size as usize] } else { Vec::new() }));
                let out2 = out.clone();
                pump(size, io, a.queue_depth, move |at, len| {
                    let sess = sess.clone();
                    let out = out2.clone();
                    async move {
                        let d = sess.read((offset + at) / u64::from(bs), (len / bs as usize) as u32, bs).await?;
                        if verify && d != pattern(seed, offset + at, len) {
                            return Err(format!("data mismatch in the {len} bytes at offset {}", offset + at));
                        }
                        {
                            let mut o = out.lock().unwrap_or_else(|e| e.into_inner());
                            if !o.is_empty() {
                                o[at as usize..at as usize + len].copy_from_slice(&d);
                            }
                        }
                        sess.recycle(d);
                        Ok(())
                    }
                })
                .await?;
                let t = start.elapsed().as_secs_f64();
                println!(
                    "read {} MiB in {t:.2} s ({:.1} MiB/s){}",
                    size >> 20,
                    size as f64 / 1048576.0 / t,
                    if verify { ", verified" } else { "" }
                );
                if let Some(p) = &a.output {
                    std::fs::write(p, &*out.lock().unwrap_or_else(|e| e.into_inner())).map_err(|e| format!("{}: {e}", p.display()))?;
                }
            }
        }
        "bench" => {
            let bar = indicatif::ProgressBar::new(8);
            bar.set_style(indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").map_err(|e| e.to_string())?);
            let mut table = vec![format!("{:>9} {:>6} {:>11} {:>10}", "io size", "op", "MiB/s", "IOPS")];
            for io in [4096u64, 65536, 262_144, 1 << 20] {
                for rw in [Rw::Read, Rw::Write] {
                    bar.set_message(format!("{} KiB {}", io >> 10, rw.name()));
                    let span = size.min(capacity - offset).max(io);
                    let l = load(&dev, Where { bs, offset, span }, io, a.queue_depth, rw, a.seconds, a.seed).await?;
                    table.push(format!("{:>9} {:>6} {:>11.1} {:>10.0}", format!("{}KiB", io >> 10), rw.name(), l.mib_s(), l.iops()));
                    bar.inc(1);
                }
            }
            bar.finish_and_clear();
            for row in table {
                println!("{row}");
            }
        }
        "load" => {
            let rw = Rw::parse(&a.rw)?;
            let span = size.max(io);
            let l = load(&dev, Where { bs, offset, span }, io, a.queue_depth, rw, a.seconds, a.seed).await?;
            let us = |q: f64| l.latency.value_at_quantile(q) as f64 / 1000.0;
            println!(
                "load rw={} bs={io} qd={} ios={} seconds={:.3} iops={:.0} mib_s={:.1} p50_us={:.1} p99_us={:.1} p999_us={:.1} max_us={:.1}",
                rw.name(),
                a.queue_depth,
                l.ios,
                l.secs,
                l.iops(),
                l.mib_s(),
                us(0.5),
                us(0.99),
                us(0.999),
                l.latency.max() as f64 / 1000.0
            );
            if let Some(p) = &a.latency_cdf {
                let mut csv = String::from("percentile,latency_us\n");
                for v in l.latency.iter_quantiles(4) {
                    csv.push_str(&format!("{:.6},{:.3}\n", 100.0 * v.quantile_iterated_to(), v.value_iterated_to() as f64 / 1000.0));
                }
                std::fs::write(p, csv).map_err(|e| format!("{}: {e}", p.display()))?;
            }
        }
        "soak" => soak(&dev, bs, offset, size.max(io), io, &a).await?,
        other => return Err(format!("unknown command {other:?}")),
    }
    dev.close().await
}

/// The direction and order of a `load`.
#[derive(Clone, Copy, PartialEq)]
enum Rw {
    Read,
    Write,
    RandRead,
    RandWrite,
}

impl Rw {
    fn parse(s: &str) -> Result<Self, String> {
        Ok(match s {
            "read" => Self::Read,
            "write" => Self::Write,
            "randread" => Self::RandRead,
            "randwrite" => Self::RandWrite,
            _ => return Err(format!("--rw {s:?}: read, write, randread or randwrite")),
        })
    }

    fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::RandRead => "randread",
            Self::RandWrite => "randwrite",
        }
    }

    fn writes(self) -> bool {
        matches!(self, Self::Write | Self::RandWrite)
    }

    fn random(self) -> bool {
        matches!(self, Self::RandRead | Self::RandWrite)
    }
}

/// The part of the unit a `load` runs over: `span` bytes from byte `offset`, in blocks of `bs`
/// bytes.
#[derive(Clone, Copy)]
struct Where {
    bs: u32,
    offset: u64,
    span: u64,
}

/// What a `load` measured: commands completed, over how long, and their latencies (ns).
struct Load {
    ios: u64,
    io: u64,
    secs: f64,
    latency: hdrhistogram::Histogram<u64>,
}

impl Load {
    fn iops(&self) -> f64 {
        self.ios as f64 / self.secs
    }

    fn mib_s(&self) -> f64 {
        self.iops() * self.io as f64 / 1048576.0
    }
}

/// For `seconds`, `qd` workers each issue `io`-byte commands one after the other: in order
/// through the span (the workers share one cursor) or at random aligned offsets in it. Each
/// command's latency, issue to status, goes into an HdrHistogram (1 ns .. 1 h, 3 digits).
async fn load(s: &Dev, at: Where, io: u64, qd: usize, rw: Rw, seconds: f64, seed: u64) -> Result<Load, String> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    let slots = (at.span / io).max(1);
    let cursor = Arc::new(AtomicU64::new(0));
    let data = pattern(seed, 0, io as usize);
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(seconds);
    let mut workers = Vec::new();
    for w in 0..qd.max(1) as u64 {
        let (s, cursor, data) = (s.clone(), cursor.clone(), data.clone());
        workers.push(tokio::spawn(async move {
            let mut hist = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).map_err(|e| e.to_string())?;
            // xorshift64, one stream per worker: offsets need no cryptographic randomness.
            let mut x = (seed ^ (w + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15)) | 1;
            while Instant::now() < deadline {
                let slot = if rw.random() {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x % slots
                } else {
                    cursor.fetch_add(1, Relaxed) % slots
                };
                let lba = (at.offset + slot * io) / u64::from(at.bs);
                let t0 = Instant::now();
                if rw.writes() {
                    s.write(lba, data.clone(), at.bs).await?;
                } else {
                    s.read(lba, (io / u64::from(at.bs)) as u32, at.bs).await.map(|d| s.recycle(d))?;
                }
                hist.saturating_record(t0.elapsed().as_nanos() as u64);
            }
            Ok::<_, String>(hist)
        }));
    }
    let mut latency = hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).map_err(|e| e.to_string())?;
    for w in workers {
        latency.add(w.await.map_err(|e| e.to_string())??).map_err(|e| e.to_string())?;
    }
    Ok(Load { ios: latency.len(), io, secs: start.elapsed().as_secs_f64(), latency })
}

/// `soak`: for `--seconds`, each of `--queue-depth` workers writes a fresh pattern to its next
/// block, reads it back and compares. Failures (a target gone, a connection lost) are reported
/// once when they start, with their cause, and once when the session works again; the session
/// reconnects by itself. Exits non-zero on any data mismatch, or if the last round failed.
async fn soak(s: &Dev, bs: u32, offset: u64, span: u64, io: u64, a: &Args) -> Result<(), String> {
    use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
    #[derive(Default)]
    struct Log {
        failing_since: Option<Instant>,
        last_error: String,
        failed: u64,
        outages: u64,
        mismatches: u64,
        last_ok: bool,
    }
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(a.seconds);
    let log = Arc::new(std::sync::Mutex::new(Log::default()));
    let ok = Arc::new(AtomicU64::new(0));
    let blocks = (span / io).max(1);
    let mut workers = Vec::new();
    for w in 0..a.queue_depth.max(1) as u64 {
        let (s, log, ok, seed) = (s.clone(), log.clone(), ok.clone(), a.seed);
        workers.push(tokio::spawn(async move {
            let mut round = 0u64;
            while Instant::now() < deadline {
                let at = offset + ((w + round * 8) % blocks) * io;
                let data = pattern(seed ^ (round << 8 | w), at, io as usize);
                round += 1;
                let r = async {
                    s.write(at / u64::from(bs), data.clone(), bs).await?;
                    s.read(at / u64::from(bs), (io / u64::from(bs)) as u32, bs).await
                }
                .await;
                let now = start.elapsed().as_secs_f64();
                let pause = {
                    let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
                    match r {
                        Ok(back) if back == data => {
                            ok.fetch_add(1, Relaxed);
                            l.last_ok = true;
                            if let Some(since) = l.failing_since.take() {
                                println!(
                                    "t={now:.1}s: the session works again ({} rounds failed over {:.1} s)",
                                    l.failed,
                                    since.elapsed().as_secs_f64()
                                );
                                l.failed = 0;
                            }
                            s.recycle(back);
                            false
                        }
                        Ok(_) => {
                            l.mismatches += 1;
                            println!("t={now:.1}s: DATA MISMATCH in the {io} bytes at offset {at}");
                            false
                        }
                        Err(e) => {
                            l.failed += 1;
                            l.last_ok = false;
                            if l.failing_since.is_none() {
                                l.failing_since = Some(Instant::now());
                                l.outages += 1;
                                println!("t={now:.1}s: I/O failing: {e}");
                            } else if e != l.last_error {
                                println!("t={now:.1}s: now failing with: {e}");
                            }
                            l.last_error = e;
                            true
                        }
                    }
                };
                if pause {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            }
        }));
    }
    for w in workers {
        w.await.map_err(|e| e.to_string())?;
    }
    let l = log.lock().unwrap_or_else(|e| e.into_inner());
    println!(
        "soak: {} rounds verified in {:.1} s, {} outage(s), {} mismatch(es){}",
        ok.load(Relaxed),
        start.elapsed().as_secs_f64(),
        l.outages,
        l.mismatches,
        if l.failing_since.is_some() { ", still failing at the end" } else { "" }
    );
    if l.mismatches > 0 {
        return Err("data mismatch".into());
    }
    if !l.last_ok {
        return Err("the last round failed".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use riser::cli::RdmaProvider;

    #[test]
    fn a_url_names_a_single_level_lun_or_is_refused() {
        let u = parse_url("iscsi://127.0.0.1/iqn.2026-11.io.riser:t/300", RdmaProvider::Soft).unwrap();
        assert_eq!((u.host.as_str(), u.lun), ("127.0.0.1:3260", Lun::from_number(300).unwrap()));
        assert_eq!(parse_url("iser://h/iqn.x", RdmaProvider::Soft).unwrap().lun, Lun::ZERO);
        // Beyond flat addressing: an error, never another LUN.
        let e = parse_url("iscsi://h/iqn.x/16384", RdmaProvider::Soft).err().unwrap();
        assert!(e.contains("16384"), "{e}");
    }

    #[test]
    fn the_pattern_is_a_function_of_the_position_and_the_seed() {
        let whole = pattern(5, 0, 1 << 16);
        // Any range regenerates the bytes of the whole at its position, aligned or not.
        for (at, len) in [(4096u64, 512usize), (100, 7), (63, 130), (65_000, 536)] {
            assert_eq!(pattern(5, at, len), whole.slice(at as usize..at as usize + len), "{at}+{len}");
        }
        // Every 8-byte word differs from every other in 64 KiB (misplaced data shows), and
        // another seed gives other data.
        let words: std::collections::HashSet<&[u8]> = whole.chunks_exact(8).collect();
        assert_eq!(words.len(), (1 << 16) / 8);
        assert_ne!(pattern(6, 0, 4096), whole.slice(..4096));
        // Written into a reused buffer (longer, shorter, or at an unaligned offset), the same bytes.
        let mut b = BytesMut::from(&[0xee_u8; 8192][..]);
        for (at, len) in [(4096u64, 512usize), (0, 16384), (128, 4096), (100, 7), (63, 130)] {
            pattern_into(&mut b, 5, at, len);
            assert_eq!(&b[..], &whole[at as usize..at as usize + len], "{at}+{len}");
        }
    }
}
