//! End to end, in process: the riser target on a portal of each transport, driven by the riser
//! initiator and by raw PDUs. A test that holds on every transport is written once, as
//! `async fn name(t: Transport)`, and instantiated per transport by [`on_every_transport!`]
//! (`name::tcp`, `name::iser`); what only one transport has (TCP framing and digests, the RNIC's
//! memory protection, peers that misnumber their login) is in its transport's modules.
#![cfg(feature = "target")]

/// Instantiate each `async fn case(t: Transport)` named as a test module `case` holding one
/// `#[tokio::test]` per transport.
macro_rules! on_every_transport {
    ($($case:ident),* $(,)?) => {$(
        mod $case {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn tcp() {
                super::$case(crate::support::Transport::Tcp).await
            }
            #[cfg(feature = "rdma")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn iser() {
                super::$case(crate::support::Transport::Iser).await
            }
            // rdma-core: `rdma_core()` with `Transport::RdmaCore` (feature `rdma-core`) goes
            // here once that variant exists (see `support::Transport`).
        }
    )*};
}

mod support;

mod async_store;
mod bad_input;
mod discovery;
mod io;
#[cfg(feature = "rdma")]
mod iser;
mod limits;
mod live;
mod login;
mod task_management;
mod tcp;
mod tcp_limits;
