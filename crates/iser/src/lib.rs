//! riser-iser: the iSER datamover (RFC 7145) for initiator and target, over any riser-verbs
//! provider (the software iWARP RNIC, or rdma-core).
//!
//! Every iSCSI PDU travels as one RDMA Send — `[iSER header 28 B | BHS 48 B | data]` — from the
//! first Login Request on; Data-In, R2T and solicited Data-Out never appear. The target's
//! Put_Data is an RDMA Write to the read STag and VA the initiator advertised in the command's
//! iSER header, Get_Data an RDMA Read from the write STag and VA; the initiator registers each
//! command's buffers afresh (a new key per command and direction) and revokes them when the
//! command ends. The iSCSI layer above is the same as over TCP: it sees only the
//! `riser_datamover::Datamover` trait.

#![warn(missing_docs)]

pub mod header;
mod mover;

pub use mover::{DEFAULT_SIGNAL_EVERY, IserConfig, IserDatamover, accept, connect};

#[doc(hidden)]
pub mod fuzzing {
    //! Entry points for the fuzz targets.
    pub use crate::mover::fuzz_receive;
}

/// Largest write a target accepts in one command (its task buffer).
pub const MAX_TASK_BUFFER: usize = riser_datamover::MAX_TASK_BUFFER as usize;
