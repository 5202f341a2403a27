//! Both full-feature session machines (`riser_iscsi::session`) against each other, with the
//! input read as a script of operations: the initiator starts commands, pings, task management
//! (unknown functions included), text and logout; a "network" of two queues (initiator → target,
//! target → initiator) delivers any queued PDU, drops or duplicates one; the target application
//! finishes, drops or phase-collapses live tasks, answers text, task management and logout, and
//! plans writes; the clock runs the keepalive; raw 48-byte headers reach either side.
//!
//! Whatever happens: no panic; the target's StatSNs are consecutive, its ExpCmdSN and MaxCmdSN
//! never move back and ExpCmdSN ≤ MaxCmdSN + 1; it never holds more tasks than the window and the
//! immediate allowance; a task ends at most once (finish_command / take_status succeed exactly
//! while the task is live); after it closes it sends nothing; an initiator task gets at most one
//! terminal event; every SCSI command the open target receives is taken or discarded. At the
//! end everything is delivered and answered: if every CmdSN the initiator took reached the target,
//! the target holds no task and its window is whole again; if moreover nothing was lost,
//! duplicated or given up, the initiator is idle too and agrees on every number. Delivered in
//! order, the initiator is never surprised by an answer.
//!
//! Input: 10 bytes of configuration (queue depth mod 9; flags: 0..=1 immediate allowance, 0x04
//! keepalive, 0x18 both set a discovery session, 0x20 a 512-byte initiator receive limit, 0x40 no
//! ImmediateData, 0x80 InitialR2T; first CmdSN and StatSN, big-endian), then at most [`MAX_OPS`]
//! operations, an opcode byte (mod 21) and its arguments, missing bytes reading as zero:
//! 0–1 command, 2 ping, 3 task management, 4 text, 5 logout, 6–7 deliver to the target, 8–9
//! deliver to the initiator, 10 duplicate or drop, 11 finish, 12 drop task, 13 take status (phase
//! collapse), 14 answer text, 15 complete task management, 16 answer logout, 17 plan a write
//! (R2Ts), 18 clock, 19 raw header to either side, 20 a request from outside the initiator
//! session. `cargo xtask fuzz-seeds` writes scripts in this encoding.
#![no_main]
#[path = "session_pair/actions.rs"]
mod actions;
#[path = "session_pair/checks.rs"]
mod checks;
#[path = "session_pair/driver.rs"]
mod driver;
#[path = "session_pair/input.rs"]
mod input;
#[path = "session_pair/model.rs"]
mod model;

use crate::input::Input;
use crate::model::Pair;
use libfuzzer_sys::fuzz_target;

const MAX_OPS: usize = 512;

fuzz_target!(|data: &[u8]| {
    let mut r = Input(data);
    let mut p = Pair::new(&mut r);
    for _ in 0..MAX_OPS {
        if r.0.is_empty() {
            break;
        }
        let was_closed = p.t.is_closed();
        p.op(&mut r);
        p.drain(was_closed);
    }
    if p.gapless {
        p.settle();
    }
});
