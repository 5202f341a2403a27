//! Integration tests of riser-service: a `Service` in-process, driven through its control socket
//! (JSON-RPC 2.0), its configuration file and its metrics endpoint, with sessions of the riser
//! initiator checking what initiators see.

mod alua;
mod control_input;
mod live_io;
mod methods;
mod metrics;
mod reload;
mod restart;
mod secrets;
mod socket;
mod support;
