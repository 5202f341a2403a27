//! The in-memory pair: a `TargetSession` and an `InitiatorSession` after a login, wired to each
//! other with a fake clock, and the helpers the topic modules share.

use bytes::Bytes;
use core::time::Duration;
use riser_iscsi::keys::NegotiatedParams;
use riser_iscsi::session::{InitiatorEvent, InitiatorSession, Reset, Residual, TargetEvent, TargetSession, TargetSessionConfig, TaskId};
use riser_iscsi::wire::{Header, RESERVED_TAG, ScsiCommand};
use riser_scsi::lun::Lun;
use riser_scsi::sense::Status;

pub(crate) const LUN0: Lun = Lun::ZERO;

pub(crate) fn lun(n: u16) -> Lun {
    Lun::from_number(n).unwrap()
}

/// A target and an initiator session after a login that left ExpCmdSN `cmd_sn`, StatSN
/// `stat_sn` and a window of `depth`.
pub(crate) struct Pair {
    pub(crate) t: TargetSession,
    pub(crate) i: InitiatorSession,
    pub(crate) now: Duration,
    /// Target events not consumed by the harness.
    pub(crate) t_events: Vec<TargetEvent>,
    /// Initiator events.
    pub(crate) i_events: Vec<InitiatorEvent>,
    /// Every PDU the target sent, in order.
    pub(crate) t_sent: Vec<Header>,
    /// The target's tasks by tag, as its Command events named them.
    pub(crate) ids: std::collections::HashMap<u32, TaskId>,
}

impl Pair {
    pub(crate) fn with(cfg: TargetSessionConfig, params: &NegotiatedParams, cmd_sn: u32, stat_sn: u32) -> Self {
        let depth = cfg.queue_depth.max(1);
        let t = TargetSession::with_params(cfg, params, cmd_sn, stat_sn, Duration::ZERO);
        let i = InitiatorSession::with_numbers(cmd_sn, cmd_sn.wrapping_add(depth - 1), stat_sn);
        Self { t, i, now: Duration::ZERO, t_events: Vec::new(), i_events: Vec::new(), t_sent: Vec::new(), ids: Default::default() }
    }

    pub(crate) fn new(depth: u32) -> Self {
        Self::with(TargetSessionConfig::new(depth).luns([lun(0), lun(1)]), &NegotiatedParams::default(), 1, 100)
    }

    /// Move every queued PDU across until both sides are quiet.
    pub(crate) fn pump(&mut self) {
        loop {
            let mut moved = false;
            while let Some(p) = self.i.poll_transmit() {
                self.t.handle_pdu(self.now, &p.header, Bytes::new(), p.data, 0);
                moved = true;
            }
            while let Some(e) = self.t.poll_event() {
                if let TargetEvent::Command { task, .. } = &e {
                    self.ids.insert(task.itt, *task);
                }
                self.t_events.push(e);
            }
            while let Some(p) = self.t.poll_transmit() {
                self.t_sent.push(p.header);
                self.i.handle_pdu(&p.header, p.data);
                moved = true;
            }
            while let Some(e) = self.i.poll_event() {
                self.i_events.push(e);
            }
            if !moved {
                return;
            }
        }
    }

    /// Send a SCSI command as a datamover would (straight to the target); its tag.
    pub(crate) fn command(&mut self, l: Lun, read_len: u32) -> u32 {
        let c = self.i.start_command(l, &[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0], read_len, 0).expect("window open");
        self.deliver_command(c);
        c.itt
    }

    pub(crate) fn deliver_command(&mut self, c: ScsiCommand) {
        self.t.handle_pdu(self.now, &Header::ScsiCommand(c), Bytes::new(), Bytes::new(), 0);
        self.pump();
    }

    /// The target's task with tag `itt`.
    pub(crate) fn task(&self, itt: u32) -> TaskId {
        self.ids[&itt]
    }

    /// The target finishes task `itt` with GOOD.
    pub(crate) fn finish(&mut self, itt: u32) -> bool {
        let sent = self.t.finish_command(self.task(itt), Status::GOOD, None, Residual::None, 0);
        self.pump();
        sent
    }

    pub(crate) fn commands_seen(&mut self) -> Vec<u32> {
        let mut out = Vec::new();
        self.t_events.retain(|e| match e {
            TargetEvent::Command { cmd, .. } => {
                out.push(cmd.itt);
                false
            }
            _ => true,
        });
        out
    }

    pub(crate) fn take_t_events(&mut self) -> Vec<TargetEvent> {
        std::mem::take(&mut self.t_events)
    }

    pub(crate) fn take_i_events(&mut self) -> Vec<InitiatorEvent> {
        std::mem::take(&mut self.i_events).into_iter().filter(|e| *e != InitiatorEvent::WindowOpen).collect()
    }

    pub(crate) fn stat_sns(&self) -> Vec<u32> {
        self.t_sent
            .iter()
            .filter_map(|h| match h {
                Header::ScsiResponse(r) => Some(r.stat_sn),
                Header::TaskMgmtResponse(r) => Some(r.stat_sn),
                Header::TextResponse(r) => Some(r.stat_sn),
                Header::NopIn(n) if n.itt != RESERVED_TAG => Some(n.stat_sn),
                Header::Reject(r) => Some(r.stat_sn),
                Header::LogoutResponse(r) => Some(r.stat_sn),
                _ => None,
            })
            .collect()
    }
}

/// The task management event the target raised: its tag, the tasks it aborted, the reset it asks for.
pub(crate) fn tmf_done(p: &mut Pair) -> (u32, Vec<u32>, Reset) {
    let ev = p.take_t_events();
    let Some(TargetEvent::TaskManagement { itt, aborted, reset }) =
        ev.into_iter().find(|e| matches!(e, TargetEvent::TaskManagement { .. }))
    else {
        panic!("no task management event")
    };
    (itt, aborted, reset)
}

/// A pair whose target pings an idle initiator after 5 s and gives up 10 s later.
pub(crate) fn keepalive_pair() -> Pair {
    let cfg = TargetSessionConfig::new(4).keepalive(Some(Duration::from_secs(5)), Duration::from_secs(10));
    Pair::with(cfg, &NegotiatedParams::default(), 1, 1)
}
