//! Inputs the fuzz targets found, replayed on every `cargo test`: each one failed an assertion
//! of its target before the fix named beside it.
#![cfg(feature = "rdma")]

use riser::iser::fuzzing::fuzz_receive;
use riser::iwarp::{SoftRnic, fuzzing::detached_qp};

fn iser_receive(input: &[u8]) {
    let (_rnic, pd, cq, qp) = detached_qp();
    fuzz_receive::<SoftRnic>(pd, cq, qp, input);
}

/// An initiator received a Send that invalidated a key of no task of its own, carrying a PDU
/// whose header the session rejects (a Login Response with a bad field in full feature): the
/// datamover passed the header on as `Malformed` before it checked the invalidation, so the
/// foreign invalidation went unnoticed. It must end the connection whatever the PDU holds.
#[test]
fn a_foreign_invalidation_with_a_malformed_pdu_ends_the_connection() {
    let mut input = vec![0x03, 0x23, 0x78, 0x01];
    input.extend_from_slice(&[
        0x10, 0, 0, 0, 0, 0x02, 0, 0, 0, 0, 0, 0, 0x6d, 0xf1, 0x6e, 0x63, 0, 0x39, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, //
        0x23, 0xe7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa6, 0xa6, 0xa6, 0xa6, 0xa6, 0x9d, 0, 0, 0x08, 0xa6, 0xb6, 0xa6, 0xa6, 0xa6,
        0xa6, 0xa6, 0xa6, 0xa6, 0xae, 0xa6, 0xa6, 0xa6, 0xa6, 0x66, 0x61, 0, 0, 0, 0xa6, 0xa6, 0x89, 0x89, 0x89, 0x89, 0x89, 0x89, 0x89, 0,
    ]);
    iser_receive(&input);
}
