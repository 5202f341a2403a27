//! # riser — iSCSI (RFC 7143) with iSER (RFC 7145), as layered crates
//!
//! This facade re-exports the layers so an embedder depends on one crate:
//!
//! | module | crate | layer |
//! |---|---|---|
//! | [`scsi`] | `riser-scsi` | SCSI CDBs, sense, payloads (no_std + alloc) |
//! | [`iscsi`] | `riser-iscsi` | sans-IO iSCSI: PDU codec, text keys, negotiation, login with CHAP |
//! | `datamover` | `riser-datamover` | RFC 5047 Datamover Interface (feature `target`) |
//! | `tcp` | `riser-tcp` | iSCSI/TCP datamover (feature `target`) |
//! | `target` | `riser-target` | SCSI block target core and iSCSI target server (feature `target`) |
//! | `initiator` | `riser-initiator` | async iSCSI initiator (feature `target`) |
//! | `verbs` | `riser-verbs` | RDMA provider interface (feature `rdma`) |
//! | `iwarp` | `riser-iwarp` | software iWARP RNIC over TCP (feature `rdma`) |
//! | `iser` | `riser-iser` | iSER datamover over `verbs` (feature `rdma`) |
//!
//! The datamover seam, the TCP and iSER datamovers, the target and the initiator join as their
//! crates land (see `docs/ARCHITECTURE.md`).
//!
//! Features: `std` (default) — standard-library support in the layers (CRC32C digests with
//! hardware acceleration, `std::error::Error`); `target` and `rdma` (default) — the tokio-based
//! layers; `rdma-core` — the rdma-core provider in `verbs::rdma_core` (real RDMA devices, rxe,
//! siw).
#![cfg_attr(not(feature = "std"), no_std)]
#![warn(missing_docs)]

#[cfg(feature = "target")]
pub use riser_datamover as datamover;
#[cfg(feature = "target")]
pub use riser_initiator as initiator;
pub use riser_iscsi as iscsi;
#[cfg(feature = "rdma")]
pub use riser_iser as iser;
#[cfg(feature = "rdma")]
pub use riser_iwarp as iwarp;
pub use riser_scsi as scsi;
#[cfg(feature = "target")]
pub use riser_target as target;
#[cfg(feature = "target")]
pub use riser_tcp as tcp;
#[cfg(feature = "rdma")]
pub use riser_verbs as verbs;

/// Helpers shared by the example programs and scripts.
pub mod cli {
    /// Parse a size with an optional binary suffix: `512`, `4KiB`, `256MiB`, `1GiB`, `2TiB`
    /// (`K`/`KB`, `M`/`MB`, … mean the same binary units).
    pub fn parse_size(s: &str) -> Result<u64, String> {
        let s = s.trim();
        let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (n, unit) = s.split_at(split);
        let n: u64 = n.parse().map_err(|_| format!("bad size {s:?}"))?;
        let shift = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 0,
            "k" | "kib" | "kb" => 10,
            "m" | "mib" | "mb" => 20,
            "g" | "gib" | "gb" => 30,
            "t" | "tib" | "tb" => 40,
            _ => return Err(format!("bad size unit in {s:?}")),
        };
        n.checked_mul(1 << shift).ok_or_else(|| format!("size {s:?} too large"))
    }

    /// Which RDMA provider iSER runs on (the examples' `--rdma-provider`).
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum RdmaProvider {
        /// riser's software iWARP RNIC (user space, over TCP; no RDMA device needed).
        Soft,
        /// rdma-core: an RDMA device of the machine (an RNIC, rxe or siw).
        RdmaCore,
    }

    impl RdmaProvider {
        /// Parse `soft` or `rdma-core`.
        pub fn parse(s: &str) -> Result<Self, String> {
            match s {
                "soft" => Ok(Self::Soft),
                "rdma-core" => Ok(Self::RdmaCore),
                _ => Err(format!("unknown RDMA provider {s:?} (soft, rdma-core)")),
            }
        }

        /// The port an iSER portal uses when none is given: 3260 on an RDMA device (as Linux;
        /// the connection manager's port space is apart from TCP's, except on iWARP), 3262 on
        /// the software RNIC (a TCP listen of its own beside the TCP portal's 3260).
        pub fn default_port(self) -> u16 {
            match self {
                Self::Soft => 3262,
                Self::RdmaCore => 3260,
            }
        }
    }

    /// Parse `--rdma-keys`: `auto`, `windows`, `per-region` or `fixed-pool`.
    #[cfg(feature = "rdma-core")]
    pub fn parse_key_mode(s: &str) -> Result<riser_verbs::rdma_core::KeyMode, String> {
        use riser_verbs::rdma_core::KeyMode;
        match s {
            "auto" => Ok(KeyMode::Auto),
            "windows" => Ok(KeyMode::MemoryWindows),
            "per-region" => Ok(KeyMode::PerRegion),
            "fixed-pool" => Ok(KeyMode::FixedPool),
            _ => Err(format!("unknown key mode {s:?} (auto, windows, per-region, fixed-pool)")),
        }
    }

    /// `HOST[:PORT]` with `default_port` when none is given (IPv6 literals in brackets).
    pub fn with_default_port(host: &str, default_port: u16) -> String {
        if host.rsplit_once(':').is_some_and(|(h, p)| p.parse::<u16>().is_ok() && (!h.contains(':') || h.ends_with(']'))) {
            host.to_string()
        } else {
            format!("{host}:{default_port}")
        }
    }

    #[cfg(test)]
    mod tests {
        #[test]
        fn default_ports() {
            assert_eq!(super::with_default_port("10.0.0.1", 3260), "10.0.0.1:3260");
            assert_eq!(super::with_default_port("10.0.0.1:3262", 3260), "10.0.0.1:3262");
            assert_eq!(super::with_default_port("[::1]:99", 3260), "[::1]:99");
            assert_eq!(super::with_default_port("[::1]", 3260), "[::1]:3260");
            assert_eq!(super::RdmaProvider::parse("rdma-core"), Ok(super::RdmaProvider::RdmaCore));
            assert!(super::RdmaProvider::parse("ib").is_err());
        }

        #[test]
        fn sizes() {
            assert_eq!(super::parse_size("4KiB"), Ok(4096));
            assert_eq!(super::parse_size("1GiB"), Ok(1 << 30));
            assert_eq!(super::parse_size("512"), Ok(512));
            assert!(super::parse_size("1XB").is_err());
            assert!(super::parse_size("99999999999TiB").is_err());
        }
    }
}
