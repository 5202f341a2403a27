//! Data-transfer limits of one connection and the split of a write's data (RFC 7143 §13.10,
//! §13.11, §13.12, §13.13, §13.14; RFC 7145 §6.1–6.2 for the iSER directions).

use crate::keys::{NegotiatedParams, Role};
use riser_scsi::lun::Lun;

/// The negotiated values that govern data transfer on one connection, seen from one side.
/// `Copy` and small: a datamover keeps one and reads it per command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TransferLimits {
    /// Largest data segment this side may send in one PDU (the peer's receive limit).
    pub max_send_segment: u32,
    /// Largest data segment this side accepts in one PDU (its own receive limit).
    pub max_recv_segment: u32,
    /// MaxBurstLength: the most data one R2T (or one Data-In sequence) moves.
    pub max_burst: u32,
    /// FirstBurstLength: the most unsolicited data (immediate and Data-Out) per command.
    pub first_burst: u32,
    /// ImmediateData: whether the command PDU may carry write data.
    pub immediate_data: bool,
    /// InitialR2T: whether every Data-Out beyond the immediate data must be solicited.
    pub initial_r2t: bool,
}

impl Default for TransferLimits {
    /// RFC 7143's defaults, which hold until login negotiates others.
    fn default() -> Self {
        Self::of(&NegotiatedParams::default(), Role::Target)
    }
}

/// How a write's data travels: `[0, immediate)` in the SCSI Command PDU, `[immediate,
/// unsolicited_end)` in unsolicited Data-Out (Target Transfer Tag 0xffffffff), and
/// `[unsolicited_end, len)` solicited (R2Ts over TCP, RDMA Reads over iSER).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WriteSplit {
    /// Bytes in the command PDU.
    pub immediate: u32,
    /// End of the unsolicited data (at least `immediate`).
    pub unsolicited_end: u32,
    /// The whole transfer (Expected Data Transfer Length).
    pub len: u32,
}

impl WriteSplit {
    /// Bytes of unsolicited Data-Out (after the immediate data).
    pub const fn unsolicited_data_out(&self) -> u32 {
        self.unsolicited_end - self.immediate
    }

    /// Bytes the target must solicit.
    pub const fn solicited(&self) -> u32 {
        self.len.saturating_sub(self.unsolicited_end)
    }

    /// Whether the SCSI Command PDU ends the unsolicited data (its F bit): no unsolicited
    /// Data-Out follows it.
    pub const fn command_is_final(&self) -> bool {
        self.unsolicited_end == self.immediate
    }
}

impl TransferLimits {
    /// The limits `role` works under after negotiating `p`.
    pub fn of(p: &NegotiatedParams, role: Role) -> Self {
        Self {
            max_send_segment: p.max_send_data_segment_length(role),
            max_recv_segment: p.max_recv_data_segment_length(role),
            max_burst: p.max_burst_length,
            first_burst: p.first_burst_length,
            immediate_data: p.immediate_data,
            initial_r2t: p.initial_r2t,
        }
    }

    /// The largest segment to send, never below 512 bytes (the smallest legal
    /// MaxRecvDataSegmentLength), so a segmenting loop always makes progress.
    pub fn send_segment(&self) -> usize {
        self.max_send_segment.max(512) as usize
    }

    /// The burst to solicit or send per sequence, never below 512 bytes.
    pub fn burst(&self) -> usize {
        self.max_burst.max(512) as usize
    }

    /// Initiator: how to send a write of `len` bytes. Immediate data takes what ImmediateData,
    /// FirstBurstLength and the target's receive limit allow; without InitialR2T unsolicited
    /// Data-Out continues up to FirstBurstLength (when `unsolicited_data_out` permits it: an
    /// iSER initiator may choose to send none, RFC 7145 §6.1).
    pub fn outgoing_write(&self, len: u32, unsolicited_data_out: bool) -> WriteSplit {
        let first_burst = self.first_burst.min(len);
        let immediate = if self.immediate_data { first_burst.min(self.max_send_segment) } else { 0 };
        let unsolicited_end = if self.initial_r2t || !unsolicited_data_out { immediate } else { first_burst.max(immediate) };
        WriteSplit { immediate, unsolicited_end, len }
    }

    /// Target: what a received SCSI Command announces about its write of `edtl` bytes, given
    /// the `immediate` bytes it carried and its F bit. Unsolicited Data-Out is due only when
    /// the command is not final and InitialR2T is No, and then up to FirstBurstLength.
    pub fn incoming_write(&self, edtl: u32, immediate: u32, final_: bool) -> WriteSplit {
        let unsolicited_end = if final_ || self.initial_r2t { immediate } else { self.first_burst.min(edtl).max(immediate) };
        WriteSplit { immediate, unsolicited_end, len: edtl }
    }
}

impl NegotiatedParams {
    /// The largest data segment `role` accepts in one PDU (its own receive limit).
    pub fn max_recv_data_segment_length(&self, role: Role) -> u32 {
        match role {
            Role::Initiator => self.initiator_recv_data_segment_length,
            Role::Target => self.target_recv_data_segment_length,
        }
    }

    /// [`TransferLimits`] for `role`.
    pub fn transfer_limits(&self, role: Role) -> TransferLimits {
        TransferLimits::of(self, role)
    }
}

/// Contents of one R2T (Get_Data), as an [`R2tPlan`] generates them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2tDesc {
    /// Task.
    pub itt: u32,
    /// LUN.
    pub lun: Lun,
    /// Target Transfer Tag.
    pub ttt: u32,
    /// R2TSN.
    pub r2t_sn: u32,
    /// Buffer offset.
    pub offset: u32,
    /// Desired data transfer length (≤ MaxBurstLength).
    pub len: u32,
    /// StatSN (not advanced), ExpCmdSN, MaxCmdSN to stamp.
    pub stat_sn: u32,
    /// ExpCmdSN.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN.
    pub max_cmd_sn: u32,
}

/// What Get_Data collects of a write: a buffer of `end` bytes whose first `start` bytes come
/// unsolicited (immediate data and unsolicited Data-Out), and whose rest `[start, end)` is
/// solicited in pieces of at most `max_burst` bytes — R2Ts numbered from 0 with the Target
/// Transfer Tags `first_ttt`, `first_ttt + 1`, … over TCP, RDMA Reads over iSER. The pieces are
/// made as they are needed, so a tiny MaxBurstLength costs no memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2tPlan {
    /// Task.
    pub itt: u32,
    /// LUN.
    pub lun: Lun,
    /// Bytes that arrive unsolicited (the solicited range starts here).
    pub start: u32,
    /// The whole buffer's length.
    pub end: u32,
    /// MaxBurstLength (at least 512).
    pub max_burst: u32,
    /// Target Transfer Tag of the first R2T; the following ones count up (below 0x8000_0000).
    pub first_ttt: u32,
    /// StatSN (not advanced) to stamp the R2Ts with.
    pub stat_sn: u32,
    /// ExpCmdSN to stamp.
    pub exp_cmd_sn: u32,
    /// MaxCmdSN to stamp.
    pub max_cmd_sn: u32,
}

impl R2tPlan {
    /// How many R2Ts the solicited range takes.
    pub fn count(&self) -> u32 {
        self.end.saturating_sub(self.start).div_ceil(self.max_burst.max(512))
    }

    /// The `n`th R2T (from 0), if there is one.
    pub fn nth(&self, n: u32) -> Option<R2tDesc> {
        let burst = self.max_burst.max(512);
        let offset = self.start.checked_add(n.checked_mul(burst)?)?;
        (offset < self.end).then(|| R2tDesc {
            itt: self.itt,
            lun: self.lun,
            ttt: self.first_ttt.wrapping_add(n) & 0x7fff_ffff,
            r2t_sn: n,
            offset,
            len: (self.end - offset).min(burst),
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.exp_cmd_sn,
            max_cmd_sn: self.max_cmd_sn,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(immediate_data: bool, initial_r2t: bool) -> TransferLimits {
        TransferLimits {
            max_send_segment: 8192,
            max_recv_segment: 65536,
            max_burst: 262_144,
            first_burst: 65_536,
            immediate_data,
            initial_r2t,
        }
    }

    #[test]
    fn each_side_sends_within_the_others_receive_limit() {
        let p =
            NegotiatedParams { initiator_recv_data_segment_length: 4096, target_recv_data_segment_length: 131_072, ..Default::default() };
        let i = p.transfer_limits(Role::Initiator);
        let t = p.transfer_limits(Role::Target);
        assert_eq!((i.max_send_segment, i.max_recv_segment), (131_072, 4096));
        assert_eq!((t.max_send_segment, t.max_recv_segment), (4096, 131_072));
    }

    #[test]
    fn the_defaults_are_the_rfcs() {
        let d = TransferLimits::default();
        assert_eq!((d.max_send_segment, d.max_recv_segment), (8192, 8192));
        assert_eq!((d.max_burst, d.first_burst, d.immediate_data, d.initial_r2t), (262_144, 65_536, true, true));
    }

    #[test]
    fn immediate_data_is_bounded_by_first_burst_segment_and_length() {
        let l = limits(true, true);
        assert_eq!(l.outgoing_write(100_000, true), WriteSplit { immediate: 8192, unsolicited_end: 8192, len: 100_000 });
        assert_eq!(l.outgoing_write(1000, true), WriteSplit { immediate: 1000, unsolicited_end: 1000, len: 1000 });
        let small_burst = TransferLimits { first_burst: 4096, ..l };
        assert_eq!(small_burst.outgoing_write(100_000, true).immediate, 4096);
        assert_eq!(limits(false, true).outgoing_write(100_000, true).immediate, 0);
    }

    #[test]
    fn without_initial_r2t_unsolicited_data_out_runs_to_first_burst() {
        let s = limits(true, false).outgoing_write(1 << 20, true);
        assert_eq!((s.immediate, s.unsolicited_end, s.unsolicited_data_out(), s.solicited()), (8192, 65_536, 57_344, (1 << 20) - 65_536));
        assert!(!s.command_is_final());
        let s = limits(false, false).outgoing_write(30_000, true);
        assert_eq!((s.immediate, s.unsolicited_end, s.solicited()), (0, 30_000, 0));
        // An initiator that sends no unsolicited Data-Out (iSER's choice) stops at the immediate data.
        let s = limits(true, false).outgoing_write(1 << 20, false);
        assert_eq!(s.unsolicited_end, 8192);
        assert!(s.command_is_final());
    }

    #[test]
    fn the_target_expects_what_the_initiator_sends() {
        for (imm, r2t) in [(true, true), (true, false), (false, true), (false, false)] {
            let l = limits(imm, r2t);
            for len in [0, 1, 512, 8191, 8192, 8193, 65_536, 65_537, 1 << 20] {
                let sent = l.outgoing_write(len, true);
                let seen = l.incoming_write(len, sent.immediate, sent.command_is_final());
                assert_eq!(seen, sent, "ImmediateData={imm} InitialR2T={r2t} len={len}");
            }
        }
    }

    #[test]
    fn a_final_command_announces_no_unsolicited_data_out() {
        let l = limits(true, false);
        assert_eq!(l.incoming_write(1 << 20, 8192, true).unsolicited_end, 8192);
        assert_eq!(l.incoming_write(1 << 20, 0, false).unsolicited_end, 65_536);
        // Immediate data beyond FirstBurstLength is the command's problem, not a negative range.
        assert_eq!(l.incoming_write(1 << 20, 100_000, false).unsolicited_end, 100_000);
    }

    #[test]
    fn segmenting_never_stalls_on_a_zero_limit() {
        let l = TransferLimits { max_send_segment: 0, max_burst: 0, ..limits(true, true) };
        assert_eq!((l.send_segment(), l.burst()), (512, 512));
    }
}
