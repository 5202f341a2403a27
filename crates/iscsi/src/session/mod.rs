//! The full feature phase, sans IO: what both roles decide about a session once login is over.
//!
//! * [`TargetSession`] and [`InitiatorSession`]: the two roles' session machines, in the login
//!   machines' style (`handle_*` inputs, application calls, `poll_*` outputs; no I/O, no
//!   clock, no runtime). Tested against each other in memory (`tests/session_pair/`).
//! * [`window`]: CmdSN numbering — the target's window, the initiator's view of it.
//! * [`transfer`]: the data-transfer arithmetic of RFC 7143 §13 as one value per connection
//!   ([`TransferLimits`]: whose MaxRecvDataSegmentLength bounds whose PDUs, how a write splits
//!   into immediate, unsolicited and solicited data), the R2T plan of a write ([`R2tPlan`]),
//!   the target's checks of the Data-Out it receives ([`UnsolicitedIn`], [`SolicitedIn`]) and
//!   the Data-In PDUs of read data ([`TransferLimits::data_in`]) and the Data-Out PDUs of write
//!   data ([`TransferLimits::data_out`]).
//! * The initiator's checks of the data a target moves for its commands: a read's Data-In
//!   ([`ReadIn`]) and a write's R2Ts ([`R2tIn`]).
//! * [`Residual`]: a command's residual, named.
//!
//! The TCP and iSER datamovers and both drivers ask these, so each rule is written once.

pub mod initiator;
mod read_in;
mod residual;
pub mod target_session;
pub mod transfer;
pub mod window;

pub use initiator::{Busy, IMMEDIATE_BEYOND_LIMIT, InitiatorEvent, InitiatorSession, MAX_TEXT_ANSWER};
pub use read_in::{DataInError, R2tIn, ReadIn};
pub use residual::Residual;
pub use target_session::{CloseReason, Reset, Stamp, TargetEvent, TargetSession, TargetSessionConfig, TaskId, Transmit};
pub use transfer::{
    Burst, DataInSegments, DataOutSegments, DataOutTo, Placement, R2tDesc, R2tPlan, SequenceError, SolicitedIn, TransferLimits,
    UnsolicitedIn, WriteIn, WriteProgress, WriteSplit,
};
pub use window::{CommandWindow, InitiatorWindow};
