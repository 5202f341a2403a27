//! # riser-service — riser's target as an operable storage service
//!
//! What an operator runs, and what a storage product embedding riser can run inside its own
//! process:
//!
//! * [`config`]: the configuration file (TOML): storage objects apart from their exports,
//!   targets with portal groups, LUN maps and ACL entries with CHAP credentials of their own;
//!   the command line's single-target form; `config_save` writes the same format.
//! * [`store`]: a backing spec (`ram:SIZE`, `file:PATH[:SIZE]`, `blk:DEVICE`) opened as a
//!   logical unit with a stable identity (a UUID given, derived or fresh).
//! * [`service`]: [`Service`], a running target made to match a configuration (at start and on
//!   SIGHUP) and changed one operation at a time, live.
//! * [`control`]: the control plane, JSON-RPC 2.0 over a unix socket, and its client.
//! * [`metrics`]: the statistics as Prometheus text at `GET /metrics`.
//! * [`notify`]: systemd's readiness protocol.
//! * [`cli`]: what the programs share (sizes, portals, credentials, logging).
//!
//! ## How it fits
//!
//! This is the top of the stack: it builds riser-target's [`Target`](riser_target::server::Target)
//! (nodes, LUNs, portals over TCP and over iSER through riser-iser on the software iWARP RNIC
//! or, with feature `rdma-core`, real RDMA devices) from a configuration, and keeps it matching
//! that configuration. A configuration goes through three steps: [`config::parse`] (or
//! [`config::read`], which also refuses a file with a secret that others can read) gives the
//! file as written, a [`config::ConfigFile`]; [`config::ConfigFile::resolve`] checks it and
//! applies the defaults, giving [`config::Resolved`] — the settings only a restart changes, the
//! stores and the targets; [`Service`] then opens the stores ([`store::open`]) and serves.
//! `riser-target` (the program) is a thin shell around this; a product embedding riser can run
//! the same [`Service`] in its own process, or build the target directly with riser-target.
//!
//! ## Example
//!
//! A configuration with a `[limits]` table, one store and one target exporting it, parsed and
//! resolved (nothing is opened or served: the store is only described).
//!
//! ```rust
//! use riser_service::config;
//! use std::path::Path;
//! use std::time::Duration;
//!
//! let text = r#"
//!     [limits]
//!     queue_depth = 64
//!     max_session_bytes = "256MiB"
//!     data_timeout = 2.5
//!
//!     [[store]]
//!     name = "scratch"
//!     backing = "ram:64MiB"
//!
//!     [[target]]
//!     name = "iqn.2026-11.io.example:disk"
//!     [[target.portal_group]]
//!     tag = 1
//!     portals = ["127.0.0.1:3260", { address = "127.0.0.1:3262", transport = "iser" }]
//!     [[target.lun]]
//!     lun = 0
//!     store = "scratch"
//! "#;
//! let file = config::parse(text, "riser.toml").unwrap();
//!
//! // The [limits] table alone: what it sets in the target's configuration.
//! let tuning = file.limits.resolve().unwrap();
//! assert_eq!(tuning.target.queue_depth, 64);
//! assert_eq!(tuning.target.max_session_bytes, 256 << 20);
//! assert_eq!(tuning.target.data_timeout, Duration::from_millis(2500));
//!
//! // The whole file, checked (credential files would be taken relative to the given directory).
//! let resolved = file.resolve(Path::new(".")).unwrap();
//! assert_eq!(resolved.settings.target.queue_depth, 64);
//! assert_eq!((resolved.stores[0].name.as_str(), resolved.stores[0].backing.as_str()), ("scratch", "ram:64MiB"));
//! let target = &resolved.targets[0];
//! assert_eq!(target.luns.get(&0).map(String::as_str), Some("scratch"));
//! assert_eq!(target.portal_groups[0].portals.len(), 2);
//!
//! // Errors name what is wrong.
//! let err = config::parse("[limits]\nqueue_depth = 0\n", "bad.toml").unwrap().limits.resolve().unwrap_err();
//! assert!(err.contains("queue_depth"), "{err}");
//! ```
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod cli;
pub mod config;
pub mod control;
pub mod metrics;
pub mod notify;
pub mod service;
pub mod store;
pub mod views;

pub use service::{OpError, Service, Source};
