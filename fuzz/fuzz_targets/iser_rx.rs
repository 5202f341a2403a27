//! The iSER receive path (riser-iser's handling of each received Send, target and initiator
//! side) fed arbitrary messages on an unconnected software-RNIC queue pair: no panic, write
//! data placed only inside its task buffer, remote invalidation only of the command's own keys.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let (_rnic, pd, cq, qp) = riser_iwarp::fuzzing::detached_qp();
    riser_iser::fuzzing::fuzz_receive::<riser_iwarp::SoftRnic>(pd, cq, qp, data);
});
