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
//! ```rust
//! use riser_datamover::{ControlPdu, Datamover, DmEvent};
//! use riser_iscsi::keys::Role;
//! use riser_iscsi::wire::{Header, NopOut, RESERVED_TAG};
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! // Both ends of one connection, on 127.0.0.1 (a real initiator connects to a target's portal).
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
//! let stream = tokio::net::TcpStream::connect(listener.local_addr()?).await?;
//! let (accepted, _) = listener.accept().await?;
//! let (initiator, driver) = riser_tcp::datamover(stream, Role::Initiator);
//! tokio::spawn(driver);
//! let (target, driver) = riser_tcp::datamover(accepted, Role::Target);
//! tokio::spawn(driver);
//! // Login PDUs would go first; here both ends skip straight to full feature phase.
//! initiator.enable();
//! target.enable();
//! let ping = NopOut { immediate: true, itt: 1, ttt: RESERVED_TAG, ..NopOut::default() };
//! initiator.send_control(ControlPdu::new(Header::NopOut(ping), bytes::Bytes::from_static(b"ping"))).await.unwrap();
//! match target.next_event().await {
//!     DmEvent::Control(pdu) => assert_eq!((&pdu.header, &pdu.data[..]), (&Header::NopOut(ping), &b"ping"[..])),
//!     other => panic!("{other:?}"),
//! }
//! # Ok(()) }
//! ```
#![warn(missing_docs)]

pub mod link;
pub mod loopback;
mod pdu;
mod socket;

pub use pdu::{DEFAULT_SEGMENT_TIMEOUT, LINGER, PduDatamover};
pub use socket::{SocketOptions, TcpRx, TcpTx, datamover, datamover_with};
