//! riser's iSCSI target (installed as `riser-target`): RAM, file or block-device storage behind
//! TCP and iSER portals, changed live through a control socket, with metrics, run as a service.
//!
//! ```text
//! riser-target [--portal 127.0.0.1:3260 | --portal none] [--iser-portal ADDR[:PORT]]
//!     [--rdma-provider soft|rdma-core] [--rdma-keys auto|windows|per-region|fixed-pool] [--target-name IQN]
//!     [--lun ram:1GiB | --lun file:PATH[:SIZE] | --lun blk:DEVICE]... [--chap-file PATH]
//!     [--mutual-chap-file PATH] [--discovery-chap-file PATH] [--discovery-mutual-chap-file PATH]
//!     [--discovery-scope permitted|all] [--acl INITIATOR_IQN]... [--sanitize-rate RATE]
//!     [--param KEY=VALUE]... [--iser-param KEY=VALUE]... [--config target.toml]
//!     [--control SOCKET] [--metrics ADDR:PORT] [--state-dir DIR] [--log-format text|json]
//! ```
//!
//! The configuration file (`--config`) and its format — storage objects, targets with portal
//! groups, LUN maps and ACL entries, the `[limits]` table — are riser-service's (see its
//! `config` module and the README, "Running riser as a service"); the options above set the
//! same keys and override the file's. CHAP secrets: each credential comes from its `--…-file`
//! option (a file only its owner may read: `chmod 600`), else its environment variable
//! (`RISER_CHAP`, `RISER_MUTUAL_CHAP`, `RISER_DISCOVERY_CHAP`, `RISER_DISCOVERY_MUTUAL_CHAP`),
//! else the configuration file. `--chap USER:SECRET` and `--mutual-chap` still work but warn:
//! any user of the machine can read a command line.
//!
//! Signals: SIGHUP reads the configuration file again and applies the difference live (the keys
//! that need a restart are logged); SIGTERM and SIGINT drain — stop accepting, ask initiators to
//! log out, wait for their commands (`limits.drain_timeout`), flush — and exit 0. Under systemd
//! (`Type=notify`) readiness is signalled once every portal listens.

use clap::Parser;
use riser::service::config::{ConfigFile, CredentialText};
use riser::service::service::credential_override;
use riser::service::{Service, Source, control, metrics, notify};
use std::path::PathBuf;

/// No `Debug`: it may hold secrets.
#[derive(Parser)]
#[command(name = "riser-target", about = "riser iSCSI/iSER target", version)]
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
    /// The control socket (JSON-RPC 2.0; `riserctl` talks to it): mode 600, in a directory only
    /// its owner can write to (default: none).
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// Serve the metrics at http://ADDR:PORT/metrics (default: nowhere).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,
    /// Where persistent state lives: reservations with APTPL (default: none, APTPL refused).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// Log format: text (default) or json (one object per line).
    #[arg(long, value_name = "text|json")]
    log_format: Option<String>,
    /// A TOML file with the configuration (the keys of these options, `-` written `_`; storage
    /// objects and targets; a `[limits]` table). Options and environment variables override it.
    /// If it holds a secret it must be private (mode 600).
    #[arg(long)]
    config: Option<PathBuf>,
}

impl Args {
    /// The command line (and the environment's credentials) as configuration keys.
    fn overrides(&self) -> Result<ConfigFile, String> {
        let cred =
            |option: &str, value: Option<&str>, file: Option<&std::path::Path>, env: &str| credential_override(option, value, file, env);
        let (chap, chap_file) = cred("--chap", self.chap.as_deref(), self.chap_file.as_deref(), "RISER_CHAP")?;
        let (mutual_chap, mutual_chap_file) =
            cred("--mutual-chap", self.mutual_chap.as_deref(), self.mutual_chap_file.as_deref(), "RISER_MUTUAL_CHAP")?;
        let (discovery_chap, discovery_chap_file) =
            cred("--discovery-chap", None, self.discovery_chap_file.as_deref(), "RISER_DISCOVERY_CHAP")?;
        let (discovery_mutual_chap, discovery_mutual_chap_file) =
            cred("--discovery-mutual-chap", None, self.discovery_mutual_chap_file.as_deref(), "RISER_DISCOVERY_MUTUAL_CHAP")?;
        let absolute = |p: &Option<PathBuf>| p.as_ref().map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone()));
        Ok(ConfigFile {
            portal: self.portal.clone(),
            iser_portal: self.iser_portal.clone(),
            rdma_provider: self.rdma_provider.clone(),
            rdma_keys: self.rdma_keys.clone(),
            param: self.param.clone(),
            iser_param: self.iser_param.clone(),
            discovery_scope: self.discovery_scope.clone(),
            discovery_chap,
            discovery_chap_file,
            discovery_mutual_chap,
            discovery_mutual_chap_file,
            sanitize_rate: self.sanitize_rate.clone(),
            block_size: self.block_size,
            state_dir: absolute(&self.state_dir),
            control: absolute(&self.control),
            metrics: self.metrics.clone(),
            log_format: self.log_format.clone(),
            target_name: self.target_name.clone(),
            lun: self.lun.clone(),
            acl: self.acl.clone(),
            chap,
            chap_file,
            mutual_chap,
            mutual_chap_file,
            ..ConfigFile::default()
        })
    }
}

fn main() {
    let args = Args::parse();
    riser::cli::exit_on_error(start(args));
}

fn start(args: Args) -> Result<(), String> {
    let source = Source { path: args.config.clone(), overrides: args.overrides()? };
    // The log format is known before anything is logged.
    let format = source.read()?.log_format.as_deref().map(riser::cli::LogFormat::parse).transpose()?.unwrap_or_default();
    riser::cli::init_logging("info", format);
    if matches!(&source.overrides.chap, Some(CredentialText::Line(_))) && args.chap.is_none() {
        tracing::debug!("CHAP credentials from RISER_CHAP");
    }
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(run(source))
}

async fn run(source: Source) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup()).map_err(|e| e.to_string())?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let svc = Service::start(source).await?;
    let settings = svc.settings().clone();
    let _control = match &settings.control {
        Some(path) => Some(control::listen(svc.clone(), path).await?),
        None => None,
    };
    let _metrics = match settings.metrics {
        Some(addr) => Some(metrics::serve(svc.target().clone(), addr).await.map_err(|e| format!("metrics at {addr}: {e}"))?),
        None => None,
    };
    let portals: Vec<String> = svc
        .listening()
        .await
        .iter()
        .map(|p| format!("{} ({})", p.portal.address, riser::service::views::transport_name(p.portal.transport)))
        .collect();
    tracing::info!(portals = %portals.join(", "), "serving");
    notify::tell(&format!("READY=1\nSTATUS=serving on {}", portals.join(", ")));
    loop {
        tokio::select! {
            _ = hup.recv() => {
                notify::tell(&notify::reloading());
                match svc.reload().await {
                    Ok(notes) if notes.is_empty() => tracing::info!("configuration reloaded"),
                    Ok(notes) => tracing::warn!("configuration reloaded: {}", notes.join("; ")),
                    Err(e) => tracing::error!("configuration not reloaded: {e}"),
                }
                notify::tell("READY=1\nSTATUS=serving");
            }
            _ = term.recv() => break,
            _ = int.recv() => break,
        }
    }
    notify::tell("STOPPING=1\nSTATUS=draining");
    tracing::info!(timeout = ?settings.drain_timeout, "stopping: asking initiators to log out");
    let dropped = svc.shutdown().await;
    if dropped > 0 {
        tracing::warn!(dropped, "sessions that did not log out in time were dropped");
    }
    tracing::info!("stopped");
    Ok(())
}
