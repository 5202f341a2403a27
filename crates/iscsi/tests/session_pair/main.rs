//! The full-feature session machines against each other, in memory, with a fake clock: what
//! RFC 7143 asks of the CmdSN window, StatSN, task management, text continuation, keepalive
//! and rejects, seen from both ends. The harness stands in for the datamovers: a SCSI
//! command goes from `InitiatorSession::start_command` straight to the target.

mod harness;

mod data_transfer;
mod edges;
mod fuzz_regressions;
mod keepalive;
mod requests;
mod task_management;
mod window;
