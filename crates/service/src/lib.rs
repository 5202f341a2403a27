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
