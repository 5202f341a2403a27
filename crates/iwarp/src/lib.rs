//! riser-iwarp: a software RNIC. The iWARP protocol suite — MPA (RFC 5044, with the RFC 6581
//! enhanced connection setup), DDP (RFC 5041) and RDMAP (RFC 5040) — in user space over
//! ordinary TCP sockets, implementing the `riser-verbs` provider traits. It speaks the same
//! wire protocol as Linux's soft-iWARP (siw) and iWARP hardware, so riser's iSER runs on any
//! machine and interoperates with kernel peers.
//!
//! Each connected queue pair runs one task on the tokio runtime current when it connects (or,
//! outside any runtime, on a runtime the RNIC starts once for all such queue pairs), which
//! drives its two engines in turn: a receiver that parses FPDUs from the socket and places tagged data straight from the socket
//! into registered memory after checking the STag, protection domain, access rights and bounds
//! (a violation gets a Terminate and error completions, never a write outside a region), and a
//! transmitter that segments work requests and Read Responses into FPDUs written with vectored
//! writes from registered memory.
//!
//! ## Main types
//!
//! [`SoftRnic`] is the device, a `riser_verbs::Provider` (clone it freely: clones share one
//! device); [`RnicConfig`] sets it up (MPA revision and CRC, segment size, handshake limits,
//! busy polling). What it hands out — [`SoftPd`], [`SoftMr`], [`SoftCq`], [`SoftQp`],
//! [`SoftListener`], [`SoftRequest`] — are used through the riser-verbs traits, so code written
//! for it (riser-iser, riser-target's iSER portal) runs unchanged on rdma-core devices. [`wire`]
//! holds the MPA/DDP/RDMAP codecs, [`Term`] the Terminate messages a peer's violation gets.
//!
//! ## Example
//!
//! Two software RNICs in one process, connected over loopback: the passive side posts a
//! receive and accepts, the active side connects and sends one message into it; both
//! completions are polled.
//!
//! ```rust
//! use riser_iwarp::{RnicConfig, SoftRnic};
//! use riser_verbs::{
//!     Access, CompletionQueue, ConnParam, ConnectionRequest, Listener, MemoryRegion, ProtectionDomain,
//!     Provider, QpCaps, QueuePair, RecvWr, SendOp, SendWr, SgList, Sge, Wc, WcOpcode, WcStatus,
//! };
//! use std::time::Duration;
//!
//! /// Wait for the next completion on `cq` (the RNIC's tasks complete the work).
//! fn next(cq: &impl CompletionQueue) -> Wc {
//!     loop {
//!         if let Some(wc) = cq.poll(1).pop() {
//!             return wc;
//!         }
//!         assert!(cq.wait_blocking(Duration::from_secs(5)), "no completion");
//!     }
//! }
//!
//! // Passive side: listen on a port the OS picks, accept on another thread (accepting blocks).
//! let server = SoftRnic::new(RnicConfig::default());
//! let listener = server.listen("127.0.0.1:0".parse().unwrap()).unwrap();
//! let addr = listener.local_addr().unwrap();
//! let accepted = std::thread::spawn(move || {
//!     let (pd, cq) = (server.alloc_pd().unwrap(), server.create_cq(16).unwrap());
//!     let mut request = listener.get_request().unwrap();
//!     assert_eq!(request.private_data(), b"hi");
//!     let qp = request.create_qp(&pd, &cq, &cq, QpCaps::default()).unwrap();
//!     // Receives are posted before the connection is established, so no Send can miss one.
//!     let inbox = pd.register(vec![0; 64], Access::LOCAL_WRITE).unwrap();
//!     let sge = Sge { addr: inbox.addr(), length: 64, lkey: inbox.lkey() };
//!     qp.post_recv(RecvWr { wr_id: 1, sg_list: SgList::from_slice(&[sge]) }).unwrap();
//!     request.accept(&ConnParam { responder_resources: 1, initiator_depth: 1, ..ConnParam::default() }).unwrap();
//!     (server, qp, cq, inbox) // keep the device and queue pair alive while the message arrives
//! });
//!
//! // Active side: a queue pair for the address, connect (blocks until established), Send.
//! let client = SoftRnic::new(RnicConfig::default());
//! let (pd, cq) = (client.alloc_pd().unwrap(), client.create_cq(16).unwrap());
//! let qp = client.create_qp(addr, &pd, &cq, &cq, QpCaps::default()).unwrap();
//! let param = ConnParam { private_data: b"hi".to_vec(), responder_resources: 1, initiator_depth: 1 };
//! let established = client.connect(&qp, &param).unwrap();
//! println!("connected: {}", established.description); // MPA revision, CRC, IRD/ORD
//! let msg = pd.register(b"hello over iWARP".to_vec(), Access::empty()).unwrap();
//! let sge = Sge { addr: msg.addr(), length: msg.len() as u32, lkey: msg.lkey() };
//! qp.post_send(SendWr { wr_id: 2, op: SendOp::Send, sg_list: SgList::from_slice(&[sge]), unregistered: None, signaled: true }).unwrap();
//! let sent = next(&*cq);
//! assert_eq!((sent.wr_id, sent.opcode, sent.status), (2, WcOpcode::Send, WcStatus::Success));
//!
//! // The message landed in the posted receive.
//! let (_server, server_qp, server_cq, inbox) = accepted.join().unwrap();
//! let got = next(&*server_cq);
//! assert_eq!((got.wr_id, got.opcode, got.status), (1, WcOpcode::Recv, WcStatus::Success));
//! let mut text = Vec::new();
//! inbox.read(&mut |b| text = b[..got.byte_len as usize].to_vec());
//! assert_eq!(text, b"hello over iWARP");
//! qp.disconnect();
//! server_qp.disconnect();
//! ```

#![warn(missing_docs)]

mod rnic;
pub mod wire;

pub use rnic::{MAX_IRD_ORD, RnicConfig, SoftCq, SoftListener, SoftMr, SoftPd, SoftQp, SoftRequest, SoftRnic};
pub use wire::Term;

#[doc(hidden)]
pub mod fuzzing {
    //! Entry points for the fuzz targets.
    pub use crate::rnic::{detached_qp, fuzz_receive};
}
