//! riser's example iSCSI target: RAM, file or block-device LUNs behind one portal.
//!
//! ```text
//! cargo run --release --example target -- [--portal 127.0.0.1:3260 | --portal none] [--iser-portal ADDR[:PORT]]
//!     [--rdma-provider soft|rdma-core] [--rdma-keys auto|windows|per-region|fixed-pool] [--target-name IQN]
//!     [--lun ram:1GiB | --lun file:PATH[:SIZE] | --lun blk:DEVICE]... [--chap-file PATH]
//!     [--mutual-chap-file PATH] [--discovery-chap-file PATH] [--discovery-mutual-chap-file PATH]
//!     [--discovery-scope permitted|all] [--acl INITIATOR_IQN]... [--sanitize-rate RATE]
//!     [--param KEY=VALUE]... [--iser-param KEY=VALUE]... [--config target.toml]
//! ```
//!
//! CHAP secrets: each credential comes from its `--…-file` option (a file only its owner may
//! access, as ssh requires of a private key: `chmod 600`), else from its environment variable
//! (`RISER_CHAP`, `RISER_MUTUAL_CHAP`, `RISER_DISCOVERY_CHAP`, `RISER_DISCOVERY_MUTUAL_CHAP`),
//! else from the `--config` file (`chap`, `chap_file`, …; a config file holding a secret must be
//! private too). A credentials file or variable holds `USER:SECRET` on one line, or the user
//! and the secret on two lines (for a user name with a `:`, such as an iSCSI name); empty lines
//! and lines starting with `#` are skipped. `--chap USER:SECRET` and `--mutual-chap` still work
//! but warn: any user of the machine can read a command line.
//!
//! iSER portals run on riser's software iWARP RNIC (`--rdma-provider soft`, the default: no RDMA
//! device needed, a TCP listen of its own, port 3262 by default) or, in a build with the
//! `rdma-core` feature, on the RDMA device that owns the portal's address (`--rdma-provider
//! rdma-core`: an RNIC, soft-RoCE rxe or soft-iWARP siw; port 3260 by default, as Linux).
//!
//! Resource limits come from the `--config` file's `[limits]` table (no command-line options):
//! `max_connections` (and so sessions), `queue_depth` (commands per session),
//! `max_immediate_commands`, `max_session_bytes` and `max_target_bytes` (sizes such as
//! `"256MiB"`, or bytes), the
//! timeouts `login_timeout`, `data_timeout`, `send_timeout`, `nop_interval` (`0` or `"off"`: no
//! keepalive pings) and `nop_timeout` in seconds (`15`, `0.5`), `iser_unsolicited_data` and
//! `max_mpa_handshakes` (iSER on the software RNIC). Every key is optional; a value out of range
//! is an error naming its key. The defaults, and why they are what they are, are in the README
//! ("Limits").
//!
//! ```toml
//! [limits]
//! max_connections = 64
//! queue_depth = 64
//! max_session_bytes = "128MiB"
//! login_timeout = 10
//! nop_interval = "off"
//! ```
//!
//! This file is the command line and the serving; `config.rs` merges the command line with
//! the `--config` file and the environment, and checks the `[limits]` table.

mod config;

use clap::Parser;
use config::Credentials;
use riser::scsi::lun::Lun;
use riser::target::backend::{BlockBackend, FileBackend, RamBackend};
use riser::target::lu::LogicalUnit;
use riser::target::server::{DiscoveryScope, Node, Target, TargetNode};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// No `Debug`: it may hold secrets.
#[derive(Parser)]
#[command(about = "riser iSCSI target")]
struct Args {
    /// Address to listen on (repeatable; default 127.0.0.1:3260; `none`: no TCP portal).
    #[arg(long)]
    portal: Vec<String>,
    /// iSER portal (repeatable; served in addition to the TCP portals). On the software RNIC it
    /// is a TCP listen of its own (default port 3262); with rdma-core an RDMA CM listen on the
    /// device owning the address (default port 3260; on iWARP that is a kernel TCP listen, so
    /// it must not be a TCP portal's address and port too).
    #[arg(long, value_name = "ADDR[:PORT]")]
    iser_portal: Vec<String>,
    /// RDMA provider of the iSER portals: soft (riser's software iWARP RNIC) or rdma-core.
    #[arg(long, value_name = "soft|rdma-core")]
    rdma_provider: Option<String>,
    /// rdma-core: how remotely accessible memory is keyed (auto: memory windows where the device
    /// binds them, else a registration per command; fixed-pool: one key per connection, weaker).
    #[arg(long, value_name = "MODE")]
    rdma_keys: Option<String>,
    /// Target name (default iqn.2026-11.io.riser:target0).
    #[arg(long)]
    target_name: Option<String>,
    /// LUNs in order: ram:SIZE, file:PATH[:SIZE], blk:DEVICE (default: one 1 GiB RAM LUN).
    #[arg(long)]
    lun: Vec<String>,
    /// CHAP credentials initiators must present. Visible to every user of the machine: prefer
    /// --chap-file or RISER_CHAP.
    #[arg(long, value_name = "USER:SECRET")]
    chap: Option<String>,
    /// A file (mode 600) with the CHAP credentials initiators must present: USER:SECRET, or
    /// USER and SECRET on two lines.
    #[arg(long, value_name = "PATH")]
    chap_file: Option<PathBuf>,
    /// Credentials the target answers mutual CHAP with (requires CHAP). Visible to every user
    /// of the machine: prefer --mutual-chap-file or RISER_MUTUAL_CHAP.
    #[arg(long, value_name = "USER:SECRET")]
    mutual_chap: Option<String>,
    /// A file (mode 600) with the credentials the target answers mutual CHAP with.
    #[arg(long, value_name = "PATH")]
    mutual_chap_file: Option<PathBuf>,
    /// A file (mode 600) with the CHAP credentials a discovery session must present (default,
    /// also without RISER_DISCOVERY_CHAP: discovery needs no authentication).
    #[arg(long, value_name = "PATH")]
    discovery_chap_file: Option<PathBuf>,
    /// A file (mode 600) with the credentials the target answers mutual CHAP with on discovery
    /// sessions (requires discovery CHAP).
    #[arg(long, value_name = "PATH")]
    discovery_mutual_chap_file: Option<PathBuf>,
    /// Which targets SendTargets lists on a discovery session: permitted (default: those whose
    /// ACL admits the initiator, as tgt) or all (as LIO's default).
    #[arg(long, value_name = "permitted|all")]
    discovery_scope: Option<String>,
    /// Initiator names allowed to log in (default: all).
    #[arg(long)]
    acl: Vec<String>,
    /// Logical block size (default 512).
    #[arg(long)]
    block_size: Option<u32>,
    /// Pace SANITIZE to this many bytes per second (e.g. 64MiB; default: unpaced). Bounds the
    /// load a sanitize puts on a shared backing store.
    #[arg(long, value_name = "RATE")]
    sanitize_rate: Option<String>,
    /// An operational key offered in login (repeatable): MaxRecvDataSegmentLength,
    /// MaxBurstLength, FirstBurstLength (sizes), ImmediateData, InitialR2T (Yes/No).
    #[arg(long, value_name = "KEY=VALUE")]
    param: Vec<String>,
    /// An iSER datamover setting (repeatable): signal_every (requests per signaled one),
    /// send_depth (send queue entries).
    #[arg(long, value_name = "KEY=VALUE")]
    iser_param: Vec<String>,
    /// A TOML file with the same settings (keys as the long options, `-` written `_`; lists for
    /// portal, lun and acl; also discovery_chap and discovery_mutual_chap), and a `[limits]`
    /// table with the target's resource limits (connections, commands and bytes per session,
    /// timeouts; see the README). Command-line options and environment variables override it.
    /// If it holds a secret it must be private (mode 600).
    #[arg(long)]
    config: Option<PathBuf>,
}

fn discovery_scope(s: Option<&str>) -> Result<DiscoveryScope, String> {
    match s {
        None | Some("permitted") => Ok(DiscoveryScope::Permitted),
        Some("all") => Ok(DiscoveryScope::All),
        Some(other) => Err(format!("unknown discovery scope {other:?} (permitted, all)")),
    }
}

fn backend(spec: &str, bs: u32) -> Result<Arc<dyn BlockBackend>, String> {
    let (kind, rest) = spec.split_once(':').ok_or_else(|| format!("bad --lun {spec:?}"))?;
    Ok(match kind {
        "ram" => Arc::new(RamBackend::new(riser::cli::parse_size(rest)?, bs)),
        "file" => {
            let (path, size) = match rest.rsplit_once(':') {
                Some((p, s)) if riser::cli::parse_size(s).is_ok() => (p, Some(riser::cli::parse_size(s)?)),
                _ => (rest, None),
            };
            Arc::new(FileBackend::open(Path::new(path), size, bs).map_err(|e| format!("{path}: {e}"))?)
        }
        "blk" => Arc::new(FileBackend::open(Path::new(rest), None, bs).map_err(|e| format!("{rest}: {e}"))?),
        _ => return Err(format!("unknown LUN kind {kind:?} (ram, file, blk)")),
    })
}

/// An iSER portal on the RDMA device that owns `addr` (rdma-core).
#[cfg(feature = "rdma-core")]
fn rdma_core_portal(
    target: &Arc<Target>,
    addr: std::net::SocketAddr,
    keys: Option<&str>,
    cfg: riser::iser::IserConfig,
    target_name: &str,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>, String> {
    use riser::verbs::rdma_core::{RdmaCore, RdmaCoreConfig};
    use riser::verbs::{Listener, Provider};
    let rc = RdmaCoreConfig { keys: keys.map(riser::cli::parse_key_mode).transpose()?.unwrap_or_default(), ..RdmaCoreConfig::default() };
    let dev = RdmaCore::for_address(addr.ip(), rc).map_err(|e| format!("--iser-portal {addr}: {e}"))?;
    let listener = dev.listen(addr).map_err(|e| format!("cannot listen on {addr} (iSER, {}): {e}", dev.name()))?;
    let at = listener.local_addr().map_err(|e| e.to_string())?;
    tracing::info!("listening on {at} (iSER, {}, {:?} keys) for {target_name}", dev.name(), dev.key_mode());
    Ok(tokio::spawn(target.clone().serve_iser(dev, listener, cfg)))
}

#[cfg(not(feature = "rdma-core"))]
fn rdma_core_portal(
    _: &Arc<Target>,
    _: std::net::SocketAddr,
    _: Option<&str>,
    _: riser::iser::IserConfig,
    _: &str,
) -> Result<tokio::task::JoinHandle<std::io::Result<()>>, String> {
    Err("this target was built without rdma-core support: build it with `--features rdma-core`".into())
}

#[tokio::main]
async fn main() {
    // The log (RUST_LOG, info by default) goes to stderr.
    riser::cli::init_tracing("info");
    riser::cli::exit_on_error(run().await);
}

async fn run() -> Result<(), String> {
    let (args, creds, tuning) = Args::parse().merged()?;
    let target_name = args.target_name.clone().unwrap_or_default();
    let block_size = args.block_size.unwrap_or(512);
    let sanitize_rate = args.sanitize_rate.as_deref().map(riser::cli::parse_size).transpose()?;
    let mut luns = Vec::new();
    for (i, spec) in args.lun.iter().enumerate() {
        let b = backend(spec, block_size)?;
        Lun::from_number(i as u16).ok_or("too many LUNs")?;
        luns.push(Arc::new(LogicalUnit::new(b, riser::target::lu::LuIdentity::random()).with_sanitize_rate(sanitize_rate)));
    }
    let Credentials { chap, mutual_chap, discovery_chap, discovery_mutual_chap } = creds;
    if mutual_chap.is_some() && chap.is_none() {
        return Err("mutual CHAP needs CHAP (--chap-file, RISER_CHAP or chap in the config)".into());
    }
    if discovery_mutual_chap.is_some() && discovery_chap.is_none() {
        return Err("discovery mutual CHAP needs discovery CHAP (--discovery-chap-file, RISER_DISCOVERY_CHAP or discovery_chap)".into());
    }
    let mut node = TargetNode::open(target_name.clone()).chap(chap).mutual_chap(mutual_chap);
    for a in &args.acl {
        node = node.allow(a.clone());
    }
    let mut config = tuning.target.node(Node::from(node).luns(luns)).discovery_scope(discovery_scope(args.discovery_scope.as_deref())?);
    config.login.discovery_chap = discovery_chap;
    config.login.discovery_mutual_chap = discovery_mutual_chap;
    let target = Target::new(config);
    let mut servers = Vec::new();
    for p in args.portal.iter().filter(|p| p.as_str() != "none") {
        let listener = tokio::net::TcpListener::bind(p).await.map_err(|e| format!("cannot listen on {p}: {e}"))?;
        tracing::info!("listening on {} for {target_name}", listener.local_addr().map_err(|e| e.to_string())?);
        servers.push(tokio::spawn(target.clone().serve(listener)));
    }
    let provider = riser::cli::RdmaProvider::parse(args.rdma_provider.as_deref().unwrap_or("soft"))?;
    if args.rdma_keys.is_some() && provider != riser::cli::RdmaProvider::RdmaCore {
        return Err("--rdma-keys applies to --rdma-provider rdma-core".into());
    }
    if tuning.rnic.is_some() && provider != riser::cli::RdmaProvider::Soft {
        return Err("limits.max_mpa_handshakes applies to --rdma-provider soft".into());
    }
    for p in &args.iser_portal {
        use riser::verbs::{Listener, Provider};
        let spec = riser::cli::with_default_port(p, provider.default_port());
        let addr: std::net::SocketAddr = spec.parse().map_err(|e| format!("--iser-portal {p}: {e}"))?;
        let mut cfg = riser::iser::IserConfig::default();
        for kv in &args.iser_param {
            riser::cli::set_iser(&mut cfg, kv)?;
        }
        match provider {
            riser::cli::RdmaProvider::Soft => {
                let rnic = riser::iwarp::SoftRnic::new(tuning.rnic.clone().unwrap_or_default());
                let listener = rnic.listen(addr).map_err(|e| format!("cannot listen on {addr} (iSER): {e}"))?;
                let at = listener.local_addr().map_err(|e| e.to_string())?;
                tracing::info!("listening on {at} (iSER, software iWARP RNIC) for {target_name}");
                servers.push(tokio::spawn(target.clone().serve_iser(rnic, listener, cfg)));
            }
            riser::cli::RdmaProvider::RdmaCore => {
                servers.push(rdma_core_portal(&target, addr, args.rdma_keys.as_deref(), cfg, &target_name)?)
            }
        }
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    for s in servers {
        s.abort();
    }
    Ok(())
}
