//! The software RNIC's receive engine fed an arbitrary byte stream (FPDUs after MPA) on a
//! connected queue pair with registered regions and posted receives: no panic, no placement
//! outside a region, bounded work. The first byte's low bit turns MPA CRC on.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&ctl, rest)) = data.split_first() {
        riser_iwarp::fuzzing::fuzz_receive(rest, ctl & 1 == 1);
    }
});
