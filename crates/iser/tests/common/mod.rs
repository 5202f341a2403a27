//! What the iSER integration tests share: a connected target and initiator over the software
//! RNIC.

use bytes::Bytes;
use riser_datamover::{ConnectionResources, ControlPdu, Datamover, DmEvent};
use riser_iscsi::wire::{Header, NopOut, RESERVED_TAG};
use riser_iser::{IserConfig, IserDatamover, accept, connect};
use riser_iwarp::SoftRnic;
use riser_verbs::{Listener, Provider};
use std::time::Duration;

pub(crate) type Dm = IserDatamover<SoftRnic>;

/// A connected target and initiator, their receives posted, drivers running, and the
/// initiator's first message in (the target may send only after it).
pub(crate) async fn pair(rnic: &SoftRnic) -> (Dm, Dm) {
    let listener = rnic.listen("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = listener.local_addr().unwrap();
    let r = rnic.clone();
    let target = tokio::task::spawn_blocking(move || accept(&r, listener.get_request().unwrap(), IserConfig::default()).unwrap().0);
    let r = rnic.clone();
    let initiator = tokio::task::spawn_blocking(move || connect(&r, addr, IserConfig::default()).unwrap()).await.unwrap();
    let target = target.await.unwrap();
    for dm in [&target, &initiator] {
        tokio::spawn(dm.driver());
        dm.allocate_connection_resources(ConnectionResources::default()).unwrap();
        dm.enable();
    }
    let ping = NopOut { immediate: true, itt: 1, ttt: RESERVED_TAG, ..NopOut::default() };
    initiator.send_control(ControlPdu::new(Header::NopOut(ping), Bytes::new())).await.unwrap();
    let first = tokio::time::timeout(Duration::from_secs(5), target.next_event()).await.unwrap();
    assert!(matches!(first, DmEvent::Control(ControlPdu { header: Header::NopOut(_), .. })), "{first:?}");
    (target, initiator)
}
