//! The whole target side of a connection — login machine, session (CmdSN window, tasks, TMF,
//! text, logout), datamover (Data-Out placement, R2T) and SCSI core — fed an arbitrary
//! sequence of initiator PDUs over the in-memory link. Seeds are the initiator halves of the
//! captured libiscsi sessions, so inputs get past login. Time is virtual (paused runtime).
#![no_main]
use libfuzzer_sys::fuzz_target;
use riser_tcp::PduDatamover;
use riser_tcp::loopback::{RawEnd, pair};
use riser_iscsi::keys::Role;
use riser_iscsi::wire::Pdu;
use riser_target::backend::RamBackend;
use riser_target::lu::{LogicalUnit, LuIdentity};
use riser_target::server::{Node, Target, TargetConfig};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

fn target() -> Arc<Target> {
    static T: OnceLock<Arc<Target>> = OnceLock::new();
    T.get_or_init(|| {
        let lun = |_| Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), LuIdentity::random()));
        let node = Node::new("iqn.2026-11.io.riser.test:capture").lun(lun(0)).lun(lun(1));
        Target::new(TargetConfig::default().node(node))
    })
    .clone()
}

fuzz_target!(|data: &[u8]| {
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap();
    rt.block_on(async {
        let ((trx, ttx), (irx, itx)) = pair();
        let (dm, driver) = PduDatamover::new(Role::Target, Box::new(trx), Box::new(ttx));
        tokio::spawn(driver);
        let addr = "127.0.0.1:3260".parse().unwrap();
        let conn = tokio::spawn(target().connection(std::sync::Arc::new(dm), riser_iscsi::keys::Transport::Tcp, addr, addr));
        let mut raw = RawEnd { rx: irx, tx: itx };
        let mut rest = data;
        while let Ok((pdu, used)) = Pdu::parse(rest) {
            if raw.send(pdu.header, pdu.data.to_vec()).is_err() {
                break;
            }
            rest = &rest[used..];
            // Let the target work, draining what it sends.
            tokio::time::sleep(Duration::from_millis(1)).await;
            while let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(1), raw.recv()).await {}
        }
        drop(raw);
        let _ = tokio::time::timeout(Duration::from_secs(30), conn).await;
    });
});
