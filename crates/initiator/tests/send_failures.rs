//! A command the datamover could not send (an iSER registration refused, say) while the
//! connection stays up: its CmdSN was taken, so the target would wait for it for ever.
#![cfg(feature = "tcp")]

use bytes::{Bytes, BytesMut};
use riser_datamover::{
    BoxFuture, ConnectionResources, ControlPdu, DataInDesc, Datamover, DmError, DmEvent, PutDataDone, R2tPlan, SharedDatamover, TaskBuffer,
};
use riser_initiator::{Connector, Error, Lun, Session, SessionConfig, TcpConnector};
use riser_iscsi::keys::{NegotiatedParams, Transport};
use riser_iscsi::wire::{ScsiCommand, TmfFunction};
use riser_target::backend::RamBackend;
use riser_target::lu::LogicalUnit;
use riser_target::server::{Node, Target, TargetConfig};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

/// TCP, except that the next `fail` SCSI commands are refused locally, connection intact.
#[derive(Debug)]
struct Flaky {
    inner: SharedDatamover,
    fail: Arc<AtomicU32>,
}

impl Datamover for Flaky {
    fn send_control(&self, pdu: ControlPdu) -> BoxFuture<'_, Result<(), DmError>> {
        self.inner.send_control(pdu)
    }
    fn put_data(&self, desc: DataInDesc, data: Bytes) -> BoxFuture<'_, Result<PutDataDone, DmError>> {
        self.inner.put_data(desc, data)
    }
    fn get_data(&self, plan: R2tPlan) -> BoxFuture<'_, Result<TaskBuffer, DmError>> {
        self.inner.get_data(plan)
    }
    fn notice_key_values(&self, params: &NegotiatedParams) {
        self.inner.notice_key_values(params)
    }
    fn allocate_connection_resources(&self, res: ConnectionResources) -> Result<(), DmError> {
        self.inner.allocate_connection_resources(res)
    }
    fn deallocate_connection_resources(&self) {
        self.inner.deallocate_connection_resources()
    }
    fn enable(&self) {
        self.inner.enable()
    }
    fn deallocate_task_resources(&self, itt: u32) {
        self.inner.deallocate_task_resources(itt)
    }
    fn terminate(&self) {
        self.inner.terminate()
    }
    fn next_event(&self) -> BoxFuture<'_, DmEvent> {
        self.inner.next_event()
    }
    fn send_command(&self, cmd: ScsiCommand, ahs: Bytes, read_len: u32, write: Option<Bytes>) -> BoxFuture<'_, Result<(), DmError>> {
        if self.fail.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1)).is_ok() {
            return Box::pin(async { Err(DmError::Resources { what: "a registration (test)" }) });
        }
        self.inner.send_command(cmd, ahs, read_len, write)
    }
    fn take_read_data(&self, itt: u32) -> Option<BytesMut> {
        self.inner.take_read_data(itt)
    }
}

#[derive(Debug)]
struct FlakyConnector {
    fail: Arc<AtomicU32>,
}

impl Connector for FlakyConnector {
    fn connect(&self, addr: std::net::SocketAddr) -> BoxFuture<'_, Result<SharedDatamover, Error>> {
        Box::pin(async move {
            let inner = TcpConnector::default().connect(addr).await?;
            Ok(Arc::new(Flaky { inner, fail: self.fail.clone() }) as SharedDatamover)
        })
    }
    fn transport(&self) -> Transport {
        Transport::Tcp
    }
}

const TARGET: &str = "iqn.2026-11.io.riser:send-failures";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_command_that_could_not_be_sent_leaves_no_cmdsn_gap() {
    let lu = Arc::new(LogicalUnit::new(Arc::new(RamBackend::new(1 << 20, 512)), riser_target::lu::LuIdentity::random()));
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(Target::new(TargetConfig::default().node(Node::new(TARGET).lun(lu))).serve(l));

    let fail = Arc::new(AtomicU32::new(0));
    let cfg = SessionConfig::new("iqn.2026-11.io.riser:me", TARGET)
        .connector(FlakyConnector { fail: fail.clone() })
        .timeout(Duration::from_secs(5));
    let s = Session::connect(addr, cfg).await.unwrap();
    s.write(Lun::ZERO, 0, Bytes::from(vec![7; 512]), 512).await.unwrap();
    // Refused twice: the command and its one retry on a new connection fail.
    fail.store(2, Ordering::Release);
    assert!(matches!(s.write(Lun::ZERO, 1, Bytes::from(vec![8; 512]), 512).await, Err(Error::ConnectionLost)));
    // The session goes on; an ABORT TASK SET waits for every command numbered before it, so
    // with a CmdSN taken and never sent on the connection it would never be answered.
    s.read(Lun::ZERO, 0, 1, 512).await.unwrap();
    let tmf = tokio::time::timeout(Duration::from_secs(10), s.task_management(Lun::ZERO, TmfFunction::ABORT_TASK_SET, 0)).await;
    assert!(matches!(tmf, Ok(Ok(()))), "ABORT TASK SET: {tmf:?}");
    assert_eq!(&s.read(Lun::ZERO, 0, 1, 512).await.unwrap()[..], &[7; 512][..]);
}
