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
//! hardware acceleration, `std::error::Error`).
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

    #[cfg(test)]
    mod tests {
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
