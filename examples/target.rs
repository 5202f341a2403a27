//! riser's example iSCSI target: RAM, file or block-device LUNs behind one portal.
//!
//! ```text
//! cargo run --release --example target -- [--portal 127.0.0.1:3260 | --portal none] [--iser-portal ADDR[:PORT]]
//!     [--rdma-provider soft|rdma-core] [--rdma-keys auto|windows|per-region|fixed-pool] [--target-name IQN]
//!     [--lun ram:1GiB | --lun file:PATH[:SIZE] | --lun blk:DEVICE]... [--chap-file PATH]
//!     [--mutual-chap-file PATH] [--discovery-chap-file PATH] [--discovery-mutual-chap-file PATH]
//!     [--discovery-scope permitted|all] [--acl INITIATOR_IQN]... [--sanitize-rate RATE] [--config target.toml]
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

use clap::Parser;
use riser::iscsi::chap::ChapCredentials;
use riser::scsi::lun::Lun;
use riser::target::backend::{BlockBackend, FileBackend, RamBackend};
use riser::target::lu::LogicalUnit;
use riser::target::server::{DiscoveryScope, Node, Target, TargetConfig};
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
    /// A TOML file with the same settings (keys as the long options, `-` written `_`; lists for
    /// portal, lun and acl; also discovery_chap and discovery_mutual_chap). Command-line
    /// options and environment variables override it. If it holds a secret it must be private
    /// (mode 600).
    #[arg(long)]
    config: Option<PathBuf>,
}

/// The `--config` file. No `Debug`: it may hold secrets.
#[derive(serde::Deserialize, Default)]
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
    chap_file: Option<PathBuf>,
    mutual_chap: Option<String>,
    mutual_chap_file: Option<PathBuf>,
    discovery_chap: Option<String>,
    discovery_chap_file: Option<PathBuf>,
    discovery_mutual_chap: Option<String>,
    discovery_mutual_chap_file: Option<PathBuf>,
    discovery_scope: Option<String>,
    #[serde(default)]
    acl: Vec<String>,
    block_size: Option<u32>,
    sanitize_rate: Option<String>,
}

/// The CHAP settings, wherever they came from.
struct Credentials {
    chap: Option<ChapCredentials>,
    mutual_chap: Option<ChapCredentials>,
    discovery_chap: Option<ChapCredentials>,
    discovery_mutual_chap: Option<ChapCredentials>,
}

/// Read the `--config` file. A parse error quotes no line of it (the line may hold a secret);
/// a file holding a secret must be private.
fn read_config(path: &Path) -> Result<FileConfig, String> {
    use std::io::Read as _;
    let mut f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let meta = f.metadata().map_err(|e| format!("{}: {e}", path.display()))?;
    let mut text = String::new();
    f.read_to_string(&mut text).map_err(|e| format!("{}: {e}", path.display()))?;
    let file: FileConfig = toml::from_str(&text).map_err(|e| {
        let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        format!("{}{}: {}", path.display(), line.map(|l| format!(", line {l}")).unwrap_or_default(), e.message())
    })?;
    if file.chap.is_some() || file.mutual_chap.is_some() || file.discovery_chap.is_some() || file.discovery_mutual_chap.is_some() {
        riser::cli::check_private(path, &meta)?;
    }
    Ok(file)
}

/// One credential: from the command line or the environment (see `riser::cli::chap_credentials`),
/// else from the config file, inline or in a file of its own (a relative path is taken from the
/// config file's directory).
fn credential(
    option: &str,
    value: Option<&str>,
    file: Option<&Path>,
    env: &str,
    config: (Option<&str>, Option<&Path>),
    config_path: Option<&Path>,
) -> Result<Option<ChapCredentials>, String> {
    if let Some(c) = riser::cli::chap_credentials(option, value, file, env)? {
        return Ok(Some(c));
    }
    let key = option.trim_start_matches("--").replace('-', "_");
    let name = config_path.map(|p| p.display().to_string()).unwrap_or_default();
    match config {
        (Some(_), Some(_)) => Err(format!("{name}: {key} and {key}_file exclude each other")),
        (Some(text), None) => riser::cli::parse_credentials(&format!("{name}: {key}"), text).map(Some),
        (None, Some(f)) => {
            let f = config_path.and_then(Path::parent).map_or_else(|| f.to_path_buf(), |dir| dir.join(f));
            riser::cli::parse_credentials(&f.display().to_string(), &riser::cli::read_secret_file(&f)?).map(Some)
        }
        (None, None) => Ok(None),
    }
}

impl Args {
    /// Fill what the command line left out from the config file, then the defaults; resolve
    /// the CHAP credentials.
    fn merged(mut self) -> Result<(Self, Credentials), String> {
        let file = match &self.config {
            Some(p) => read_config(p)?,
            None => FileConfig::default(),
        };
        let cfg = self.config.as_deref();
        let creds = Credentials {
            chap: credential(
                "--chap",
                self.chap.as_deref(),
                self.chap_file.as_deref(),
                "RISER_CHAP",
                (file.chap.as_deref(), file.chap_file.as_deref()),
                cfg,
            )?,
            mutual_chap: credential(
                "--mutual-chap",
                self.mutual_chap.as_deref(),
                self.mutual_chap_file.as_deref(),
                "RISER_MUTUAL_CHAP",
                (file.mutual_chap.as_deref(), file.mutual_chap_file.as_deref()),
                cfg,
            )?,
            discovery_chap: credential(
                "--discovery-chap",
                None,
                self.discovery_chap_file.as_deref(),
                "RISER_DISCOVERY_CHAP",
                (file.discovery_chap.as_deref(), file.discovery_chap_file.as_deref()),
                cfg,
            )?,
            discovery_mutual_chap: credential(
                "--discovery-mutual-chap",
                None,
                self.discovery_mutual_chap_file.as_deref(),
                "RISER_DISCOVERY_MUTUAL_CHAP",
                (file.discovery_mutual_chap.as_deref(), file.discovery_mutual_chap_file.as_deref()),
                cfg,
            )?,
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
        self.block_size = self.block_size.or(file.block_size).or(Some(512));
        self.sanitize_rate = self.sanitize_rate.or(file.sanitize_rate);
        self.discovery_scope = self.discovery_scope.or(file.discovery_scope);
        Ok((self, creds))
    }
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
    let (args, creds) = Args::parse().merged()?;
    let target_name = args.target_name.clone().unwrap_or_default();
    let block_size = args.block_size.unwrap_or(512);
    let sanitize_rate = args.sanitize_rate.as_deref().map(riser::cli::parse_size).transpose()?;
    let mut luns = Vec::new();
    for (i, spec) in args.lun.iter().enumerate() {
        let b = backend(spec, block_size)?;
        let lun = Lun::from_number(i as u16).ok_or("too many LUNs")?;
        luns.push(Arc::new(LogicalUnit::new(b, lun, i as u64 + 1).with_sanitize_rate(sanitize_rate)));
    }
    let Credentials { chap, mutual_chap, discovery_chap, discovery_mutual_chap } = creds;
    if mutual_chap.is_some() && chap.is_none() {
        return Err("mutual CHAP needs CHAP (--chap-file, RISER_CHAP or chap in the config)".into());
    }
    if discovery_mutual_chap.is_some() && discovery_chap.is_none() {
        return Err("discovery mutual CHAP needs discovery CHAP (--discovery-chap-file, RISER_DISCOVERY_CHAP or discovery_chap)".into());
    }
    let node = Node { name: target_name.clone(), alias: None, luns, acl: args.acl.clone(), chap, mutual_chap };
    let target = Target::new(TargetConfig {
        nodes: vec![node],
        discovery_chap,
        discovery_mutual_chap,
        discovery_scope: discovery_scope(args.discovery_scope.as_deref())?,
        ..TargetConfig::default()
    });
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
