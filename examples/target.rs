//! riser's example iSCSI target: RAM, file or block-device LUNs behind one portal.
//!
//! ```text
//! cargo run --release --example target -- [--portal 127.0.0.1:3260 | --portal none] [--iser-portal ADDR[:PORT]]
//!     [--rdma-provider soft|rdma-core] [--rdma-keys auto|windows|per-region|fixed-pool] [--target-name IQN]
//!     [--lun ram:1GiB | --lun file:PATH[:SIZE] | --lun blk:DEVICE]... [--chap USER:SECRET]
//!     [--mutual-chap USER:SECRET] [--acl INITIATOR_IQN]... [--sanitize-rate RATE] [--config target.toml]
//! ```
//!
//! iSER portals run on riser's software iWARP RNIC (`--rdma-provider soft`, the default: no RDMA
//! device needed, a TCP listen of its own, port 3262 by default) or, in a build with the
//! `rdma-core` feature, on the RDMA device that owns the portal's address (`--rdma-provider
//! rdma-core`: an RNIC, soft-RoCE rxe or soft-iWARP siw; port 3260 by default, as Linux).

use clap::Parser;
use riser::iscsi::chap::ChapCredentials;
use riser::scsi::lun::Lun;
use riser::target::backend::{BlockBackend, FileBackend, RamBackend};
use riser::target::lu::LogicalUnit;
use riser::target::server::{Node, Target, TargetConfig};
use std::path::Path;
use std::sync::Arc;

#[derive(Parser, Debug)]
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
    /// CHAP credentials initiators must present.
    #[arg(long, value_name = "USER:SECRET")]
    chap: Option<String>,
    /// Credentials the target answers mutual CHAP with (requires --chap).
    #[arg(long, value_name = "USER:SECRET")]
    mutual_chap: Option<String>,
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
    /// A TOML file with the same settings (keys as the long options, `-` written `_`; lists for
    /// portal, lun and acl). Command-line options override it.
    #[arg(long)]
    config: Option<std::path::PathBuf>,
}

/// The `--config` file.
#[derive(serde::Deserialize, Debug, Default)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    portal: Vec<String>,
    #[serde(default)]
    iser_portal: Vec<String>,
    rdma_provider: Option<String>,
    rdma_keys: Option<String>,
    target_name: Option<String>,
    #[serde(default)]
    lun: Vec<String>,
    chap: Option<String>,
    mutual_chap: Option<String>,
    #[serde(default)]
    acl: Vec<String>,
    block_size: Option<u32>,
    sanitize_rate: Option<String>,
}

impl Args {
    /// Fill what the command line left out from the config file, then the defaults.
    fn merged(mut self) -> Result<Self, String> {
        let file = match &self.config {
            Some(p) => toml::from_str::<FileConfig>(&std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?)
                .map_err(|e| format!("{}: {e}", p.display()))?,
            None => FileConfig::default(),
        };
        let or = |cli: Vec<String>, file: Vec<String>, default: &str| {
            if !cli.is_empty() {
                cli
            } else if !file.is_empty() {
                file
            } else {
                vec![default.to_string()]
            }
        };
        self.portal = or(self.portal, file.portal, "127.0.0.1:3260");
        self.lun = or(self.lun, file.lun, "ram:1GiB");
        if self.acl.is_empty() {
            self.acl = file.acl;
        }
        if self.iser_portal.is_empty() {
            self.iser_portal = file.iser_portal;
        }
        self.rdma_provider = self.rdma_provider.or(file.rdma_provider).or(Some("soft".into()));
        self.rdma_keys = self.rdma_keys.or(file.rdma_keys);
        self.target_name = self.target_name.or(file.target_name).or(Some("iqn.2026-11.io.riser:target0".into()));
        self.chap = self.chap.or(file.chap);
        self.mutual_chap = self.mutual_chap.or(file.mutual_chap);
        self.block_size = self.block_size.or(file.block_size).or(Some(512));
        self.sanitize_rate = self.sanitize_rate.or(file.sanitize_rate);
        Ok(self)
    }
}

fn creds(s: &str) -> Result<ChapCredentials, String> {
    let (u, p) = s.split_once(':').ok_or("expected USER:SECRET")?;
    ChapCredentials::new(u, p.as_bytes().to_vec()).map_err(|e| e.to_string())
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
    if let Err(e) = run().await {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}

async fn run() -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        .init();
    let args = Args::parse().merged()?;
    let target_name = args.target_name.clone().unwrap_or_default();
    let block_size = args.block_size.unwrap_or(512);
    let sanitize_rate = args.sanitize_rate.as_deref().map(riser::cli::parse_size).transpose()?;
    let mut luns = Vec::new();
    for (i, spec) in args.lun.iter().enumerate() {
        let b = backend(spec, block_size)?;
        let lun = Lun::from_number(i as u16).ok_or("too many LUNs")?;
        luns.push(Arc::new(LogicalUnit::new(b, lun, i as u64 + 1).with_sanitize_rate(sanitize_rate)));
    }
    let chap = args.chap.as_deref().map(creds).transpose()?;
    let mutual_chap = args.mutual_chap.as_deref().map(creds).transpose()?;
    if mutual_chap.is_some() && chap.is_none() {
        return Err("--mutual-chap needs --chap".into());
    }
    let node = Node { name: target_name.clone(), alias: None, luns, acl: args.acl.clone(), chap, mutual_chap };
    let target = Target::new(TargetConfig { nodes: vec![node], ..TargetConfig::default() });
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
    for p in &args.iser_portal {
        use riser::verbs::{Listener, Provider};
        let spec = riser::cli::with_default_port(p, provider.default_port());
        let addr: std::net::SocketAddr = spec.parse().map_err(|e| format!("--iser-portal {p}: {e}"))?;
        let cfg = riser::iser::IserConfig::default();
        match provider {
            riser::cli::RdmaProvider::Soft => {
                let rnic = riser::iwarp::SoftRnic::default();
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
