//! riser's example iSCSI target: RAM, file or block-device LUNs behind one portal.
//!
//! ```text
//! cargo run --release --example target -- [--portal 127.0.0.1:3260] [--target-name IQN]
//!     [--lun ram:1GiB | --lun file:PATH[:SIZE] | --lun blk:DEVICE]... [--chap USER:SECRET]
//!     [--mutual-chap USER:SECRET] [--acl INITIATOR_IQN]...
//! ```

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
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:3260")]
    portal: Vec<String>,
    /// Target name.
    #[arg(long, default_value = "iqn.2026-11.io.riser:target0")]
    target_name: String,
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
    /// Logical block size.
    #[arg(long, default_value_t = 512)]
    block_size: u32,
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

#[tokio::main]
async fn main() -> Result<(), String> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .with_target(false)
        .init();
    let args = Args::parse();
    let specs = if args.lun.is_empty() { vec!["ram:1GiB".to_string()] } else { args.lun.clone() };
    let mut luns = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let b = backend(spec, args.block_size)?;
        let lun = Lun::from_number(i as u16).ok_or("too many LUNs")?;
        luns.push(Arc::new(LogicalUnit::new(b, lun, i as u64 + 1)));
    }
    let chap = args.chap.as_deref().map(creds).transpose()?;
    let mutual_chap = args.mutual_chap.as_deref().map(creds).transpose()?;
    if mutual_chap.is_some() && chap.is_none() {
        return Err("--mutual-chap needs --chap".into());
    }
    let node = Node { name: args.target_name.clone(), alias: None, luns, acl: args.acl.clone(), chap, mutual_chap };
    let target = Target::new(TargetConfig { nodes: vec![node], ..TargetConfig::default() });
    let mut servers = Vec::new();
    for p in &args.portal {
        let listener = tokio::net::TcpListener::bind(p).await.map_err(|e| format!("cannot listen on {p}: {e}"))?;
        tracing::info!("listening on {} for {}", listener.local_addr().map_err(|e| e.to_string())?, args.target_name);
        servers.push(tokio::spawn(target.clone().serve(listener)));
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
