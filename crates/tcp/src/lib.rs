//! # riser-tcp — the iSCSI/TCP datamover
//!
//! PDU framing on a TCP stream (RFC 7143 §11.2): BHS, AHS, optional CRC32C header digest, data
//! segment, zero padding to 4 bytes, optional CRC32C data digest. Receiving reads the header
//! first and then the data segment straight into its final buffer (for write data, the task
//! buffer); sending writes header, data segment and padding with vectored writes, never copying
//! the payload (also when several PDUs are gathered into one write).
//!
//! The crate holds the whole iSCSI/TCP datamover:
//! * [`PduDatamover`] — the data semantics of iSCSI over a byte stream (RFC 7143): Data-In
//!   segmentation under MaxRecvDataSegmentLength and MaxBurstLength, R2T issue and Data-Out
//!   collection with DataSN/offset checks on the target; immediate and unsolicited data, R2T
//!   service and Data-In placement on the initiator — over any [`link`];
//! * the socket link ([`TcpRx`], [`TcpTx`], [`datamover`]);
//! * [`loopback`], an in-memory link for tests and fuzzing.
//!
//! ```no_run
//! # async fn f() -> std::io::Result<()> {
//! use riser_iscsi::keys::Role;
//! let stream = tokio::net::TcpStream::connect("127.0.0.1:3260").await?;
//! let (dm, driver) = riser_tcp::datamover(stream, Role::Initiator);
//! tokio::spawn(driver);
//! # drop(dm); Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod link;
pub mod loopback;
mod pdu;
mod socket;

pub use pdu::{DEFAULT_SEGMENT_TIMEOUT, LINGER, PduDatamover};
pub use socket::{SocketOptions, TcpRx, TcpTx, datamover, datamover_with};
