//! REPORT SUPPORTED OPERATION CODES: the table of the commands the LU implements.

use super::{LogicalUnit, Outcome, R, bad_field, truncate};
use riser_scsi::cdb::op;
use riser_scsi::report::{CommandDescriptor, all_commands_to_bytes, one_command_to_bytes};

impl LogicalUnit {
    fn supported(&self) -> Vec<CommandDescriptor> {
        let plain = |opcode: u8, len: u16| CommandDescriptor { opcode, service_action: 0, service_action_valid: false, cdb_len: len };
        let sa = |opcode: u8, s: u16, len: u16| CommandDescriptor { opcode, service_action: s, service_action_valid: true, cdb_len: len };
        use op::*;
        let mut v = vec![
            plain(TEST_UNIT_READY, 6),
            plain(REQUEST_SENSE, 6),
            plain(INQUIRY, 6),
            plain(READ_6, 6),
            plain(WRITE_6, 6),
            plain(MODE_SELECT_6, 6),
            plain(RESERVE_6, 6),
            plain(RELEASE_6, 6),
            plain(MODE_SENSE_6, 6),
            plain(START_STOP_UNIT, 6),
            plain(PREVENT_ALLOW_MEDIUM_REMOVAL, 6),
            plain(READ_CAPACITY_10, 10),
            plain(READ_10, 10),
            plain(WRITE_10, 10),
            plain(WRITE_AND_VERIFY_10, 10),
            plain(VERIFY_10, 10),
            plain(SYNCHRONIZE_CACHE_10, 10),
            plain(WRITE_SAME_10, 10),
            plain(MODE_SELECT_10, 10),
            plain(RESERVE_10, 10),
            plain(RELEASE_10, 10),
            plain(MODE_SENSE_10, 10),
            sa(PERSISTENT_RESERVE_IN, 0, 10),
            sa(PERSISTENT_RESERVE_IN, 1, 10),
            sa(PERSISTENT_RESERVE_IN, 2, 10),
            sa(PERSISTENT_RESERVE_IN, 3, 10),
            sa(PERSISTENT_RESERVE_OUT, 0, 10),
            sa(PERSISTENT_RESERVE_OUT, 1, 10),
            sa(PERSISTENT_RESERVE_OUT, 2, 10),
            sa(PERSISTENT_RESERVE_OUT, 3, 10),
            sa(PERSISTENT_RESERVE_OUT, 4, 10),
            sa(PERSISTENT_RESERVE_OUT, 6, 10),
            plain(READ_16, 16),
            plain(COMPARE_AND_WRITE, 16),
            plain(WRITE_16, 16),
            plain(WRITE_AND_VERIFY_16, 16),
            plain(VERIFY_16, 16),
            plain(SYNCHRONIZE_CACHE_16, 16),
            plain(WRITE_SAME_16, 16),
            sa(SERVICE_ACTION_IN_16, u16::from(SA_READ_CAPACITY_16), 16),
            sa(SERVICE_ACTION_IN_16, u16::from(SA_GET_LBA_STATUS), 16),
            plain(REPORT_LUNS, 12),
            plain(PRE_FETCH_10, 10),
            plain(PRE_FETCH_16, 16),
            plain(ORWRITE_16, 16),
            sa(SANITIZE, 0x01, 10),
            plain(WRITE_ATOMIC_16, 16),
            plain(READ_DEFECT_DATA_10, 10),
            plain(READ_DEFECT_DATA_12, 12),
            sa(MAINTENANCE_IN, u16::from(SA_REPORT_SUPPORTED_OPCODES), 12),
            sa(MAINTENANCE_IN, u16::from(SA_REPORT_TARGET_PORT_GROUPS), 12),
            plain(READ_12, 12),
            plain(WRITE_12, 12),
            plain(WRITE_AND_VERIFY_12, 12),
            plain(VERIFY_12, 12),
            sa(EXTENDED_COPY, 0x00, 16),
            sa(RECEIVE_COPY_RESULTS, 0x00, 16),
            sa(RECEIVE_COPY_RESULTS, 0x03, 16),
        ];
        if self.backend.thin() {
            v.push(plain(UNMAP, 10));
        }
        if self.compare_and_write_blocks() == 0 {
            v.retain(|c| c.opcode != COMPARE_AND_WRITE);
        }
        if !self.offers_or_write() {
            v.retain(|c| c.opcode != ORWRITE_16);
        }
        if !self.backend.atomic_writes() {
            v.retain(|c| c.opcode != WRITE_ATOMIC_16);
        }
        if self.gateways.load(std::sync::atomic::Ordering::Relaxed) {
            v.retain(|c| ![RESERVE_6, RELEASE_6, RESERVE_10, RELEASE_10].contains(&c.opcode));
            if self.shared_pr.get().is_none() {
                v.retain(|c| ![PERSISTENT_RESERVE_IN, PERSISTENT_RESERVE_OUT].contains(&c.opcode));
            }
        }
        v
    }

    pub(super) fn rsoc(&self, rctd: bool, options: u8, opcode: u8, sa: u16, alloc: u32) -> R {
        let cmds = self.supported();
        let data = match options {
            0 => all_commands_to_bytes(&cmds, rctd),
            1..=3 => {
                let found = cmds.iter().find(|c| c.opcode == opcode && (options == 1 || !c.service_action_valid || c.service_action == sa));
                let needs_sa = cmds.iter().any(|c| c.opcode == opcode && c.service_action_valid);
                if options == 1 && needs_sa {
                    return Err(bad_field(2, None));
                }
                if options == 2 && cmds.iter().any(|c| c.opcode == opcode && !c.service_action_valid) {
                    return Err(bad_field(2, None));
                }
                match found {
                    Some(c) => {
                        let mut usage = vec![0xffu8; usize::from(c.cdb_len)];
                        usage[0] = c.opcode;
                        one_command_to_bytes(3, &usage, rctd)
                    }
                    None => one_command_to_bytes(1, &[], rctd),
                }
            }
            _ => return Err(bad_field(2, None)),
        };
        Ok(Outcome::good(truncate(data, alloc)))
    }
}
