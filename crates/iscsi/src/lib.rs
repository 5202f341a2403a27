//! # riser-iscsi — the sans-IO iSCSI core
//!
//! Everything of iSCSI (RFC 7143) that does not touch a socket, a runtime or a clock:
//!
//! * [`wire`] — the PDU codec: a zero-copy [`wire::Bhs`] view, an owned value per opcode
//!   ([`wire::Header`]), AHS, and [`wire::Pdu`] whose data segment stays a slice of the receive
//!   buffer.
//! * [`serial`] — RFC 1982 arithmetic for CmdSN/StatSN/DataSN.
//! * [`text`] — `key=value\0` text with C-bit reassembly, limits, numeric and binary values.
//! * [`keys`] — the key table (RFC 7143 §13 and the iSER keys of RFC 7145), the per-kind
//!   resolvers, and the typed [`keys::NegotiatedParams`].
//! * [`chap`] — CHAP with MD5, SHA-1, SHA-256 and SHA3-256.
//! * [`login`] — the login state machines for both roles ([`login::InitiatorLogin`],
//!   [`login::TargetLogin`]).
//! * [`session`] — the full-feature phase: [`session::TransferLimits`] (whose segment limit
//!   bounds whose PDUs, how a write splits into immediate, unsolicited and solicited data).
//! * [`entropy`] (feature `std`) — the OS generator, the one source of unpredictable values.
//! * [`digest`] (feature `std`) — CRC32C header and data digests.
//!
//! ## Driving a state machine
//! The login machines follow quinn-proto's shape. Inputs: `handle_*` with the current time
//! (a [`core::time::Duration`] since any fixed epoch the caller chooses). Outputs, drained by the
//! caller in this order after every input: `poll_transmit` (PDUs to send, in order), then
//! `poll_event`, then `poll_timeout` (when to call `handle_timeout`). Nothing is ever sent or read
//! by the machines themselves, and randomness (CHAP challenges) comes in as an argument.
//!
//! ```
//! use riser_iscsi::wire::{Header, NopOut, Pdu};
//! let nop = Pdu::new(Header::NopOut(NopOut { immediate: true, itt: 7, ttt: 0xffff_ffff, ..Default::default() }), &[][..], &b"ping"[..]);
//! let mut bytes = Vec::new();
//! nop.encode(&mut bytes);
//! assert_eq!(bytes.len(), 48 + 4);
//! let (parsed, used) = Pdu::parse(&bytes).unwrap();
//! assert_eq!((parsed, used), (nop, 52));
//! ```
#![cfg_attr(not(any(test, feature = "std")), no_std)]
#![warn(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]

extern crate alloc;

pub mod chap;
#[cfg(feature = "std")]
#[cfg_attr(docsrs, doc(cfg(feature = "std")))]
pub mod digest;
#[cfg(feature = "std")]
#[cfg_attr(docsrs, doc(cfg(feature = "std")))]
pub mod entropy;
pub mod keys;
pub mod login;
pub mod serial;
pub mod session;
pub mod text;
pub mod wire;
